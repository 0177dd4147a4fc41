# The golden outputs of `stoke load` (tests/golden/): one executable, two CTest tests.
# test_load_golden: synthetic, npy, tar; test_load_golden_images (argument `images`): images: and
# tar .jpg members, skipped (77) in a build without libjpeg-turbo.  STOKE_GOLDEN_UPDATE=1 in
# ctest's environment rewrites the files instead of comparing (docs/loader.md, "Golden outputs").
# Label `golden` (ctest -L golden); not `stress`: each run is a few hundred CLI runs.
set_property(TEST ${TEST_NAME} APPEND PROPERTY ENVIRONMENT
             "STOKE_GOLDEN_DIR=${CMAKE_CURRENT_SOURCE_DIR}/golden")
set_property(TEST ${TEST_NAME} APPEND PROPERTY LABELS golden)
add_test(NAME ${TEST_NAME}_images COMMAND ${TEST_TARGET} images)
set_tests_properties(${TEST_NAME}_images PROPERTIES
                     ENVIRONMENT "${STOKE_TEST_ENV};STOKE_GOLDEN_DIR=${CMAKE_CURRENT_SOURCE_DIR}/golden"
                     TIMEOUT 300 SKIP_RETURN_CODE 77 LABELS golden)
if(STOKE_HAVE_JPEG)
  target_compile_definitions(${TEST_TARGET} PRIVATE STOKE_TEST_HAVE_JPEG)
  target_include_directories(${TEST_TARGET} SYSTEM PRIVATE ${LIBJPEG_INCLUDE_DIRS})
  target_link_libraries(${TEST_TARGET} PRIVATE ${LIBJPEG_LINK_LIBRARIES})
endif()
