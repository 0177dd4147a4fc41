# The default library name is checked alone, as its own test: SKIP (77) where a driver is
# installed, since "libcuda.so.1 not found" cannot be forced there.
add_test(NAME ${TEST_NAME}_default_library COMMAND ${TEST_TARGET} default-library)
set_tests_properties(${TEST_NAME}_default_library PROPERTIES ENVIRONMENT "${STOKE_TEST_ENV}"
                     TIMEOUT 300 SKIP_RETURN_CODE 77)
