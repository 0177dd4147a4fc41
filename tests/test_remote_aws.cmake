# remote_aws.c is built with libcurl only (its headers and STOKE_HAVE_LIBCURL).
if(STOKE_HAVE_CURL)
  target_compile_definitions(test_remote_aws PRIVATE STOKE_HAVE_LIBCURL)
  target_include_directories(test_remote_aws SYSTEM PRIVATE ${LIBCURL_INCLUDE_DIRS})
endif()
