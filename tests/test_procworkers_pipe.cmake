# The library's send() goes through the test's __wrap_send (test_send_fails_reply_queued holds
# one request until the child's end is closed).
target_link_options(${TEST_TARGET} PRIVATE -Wl,--wrap=send)
