# The images test writes its JPEGs with libjpeg's compressor and decodes a reference with it.
if(STOKE_HAVE_JPEG)
  target_compile_definitions(${TEST_TARGET} PRIVATE STOKE_TEST_HAVE_JPEG)
  target_include_directories(${TEST_TARGET} SYSTEM PRIVATE ${LIBJPEG_INCLUDE_DIRS})
  target_link_libraries(${TEST_TARGET} PRIVATE ${LIBJPEG_LINK_LIBRARIES})
endif()
