# remote_answer.c's callbacks are built with libcurl only (its headers and STOKE_HAVE_LIBCURL).
if(STOKE_HAVE_CURL)
  target_compile_definitions(test_remote_answer PRIVATE STOKE_HAVE_LIBCURL)
  target_include_directories(test_remote_answer SYSTEM PRIVATE ${LIBCURL_INCLUDE_DIRS})
endif()
