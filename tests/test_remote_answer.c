/* One HTTP answer of the remote request engine (src/sources/remote_answer.c): header lines
 * through stoke__remote_on_header and the body through stoke__remote_on_body, called as libcurl
 * calls them, into a buffer, without a connection (the transfer has no handle: the status is
 * the xfer's own, as libcurl would have said it).  What is taken of an answer and what is
 * refused; the cases tests/fuzz/fuzz_remote_answer.c found.  Skipped without libcurl. */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#include "testutil.h"

#ifdef STOKE_HAVE_LIBCURL
#include "sources/remote_internal.h"

/* x reading n bytes from file offset off into buf, after the headers of `head` (lines ending in
 * "\r\n", the last one empty); status: the answer's. */
static void answer(xfer *x, long status, char *buf, size_t n, uint64_t off, const char *head)
{
    memset(x, 0, sizeof(*x));
    x->fd = -1;
    x->buf = buf;
    x->n = n;
    x->off = off;
    x->retry_after = -1;
    for (const char *p = head; *p;) {
        const char *e = strstr(p, "\r\n");
        size_t len = e ? (size_t)(e - p) + 2 : strlen(p);
        char line[512];
        assert_true(len < sizeof(line));
        memcpy(line, p, len);
        assert_int_equal(stoke__remote_on_header(line, 1, len, x), len);
        p += len;
    }
    x->status = status; /* (curl_easy_getinfo of no handle leaves it) */
}

/* A 206 that says its range and carries it: taken, at the range's offset. */
static void test_range_taken(void **state)
{
    (void)state;
    xfer x;
    char buf[10];
    answer(&x, 206, buf, sizeof(buf), 10,
           "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/100\r\n"
           "Content-Length: 10\r\n\r\n");
    char body[] = "0123456789";
    assert_int_equal(stoke__remote_on_body(body, 1, 10, &x), 10);
    assert_int_equal(x.got, 10);
    assert_memory_equal(buf, "0123456789", 10);
    assert_false(x.bad_cr);
    assert_true(x.has_total && x.total == 100);
}

/* A chunked 206 (no Content-Length: nothing bounds its body) that goes on past its range's
 * last byte: "bytes 0-9/100" and 20 bytes.  Its bytes 10-19 were taken as the file's (the read
 * of bytes 0-19 succeeded with them); none is, the answer refused as a 206 whose Content-Range
 * does not say its bytes. */
static void test_range_body_too_long(void **state)
{
    (void)state;
    xfer x;
    char buf[20];
    memset(buf, 0, sizeof(buf));
    answer(&x, 206, buf, sizeof(buf), 0,
           "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/100\r\n"
           "Transfer-Encoding: chunked\r\n\r\n");
    char body[] = "0123456789abcdefghij";
    assert_int_equal(stoke__remote_on_body(body, 1, 20, &x), 0);
    assert_int_equal(x.got, 0);
    assert_true(x.bad_cr);
    /* in two chunks: the first (inside the range) taken, the second refused */
    answer(&x, 206, buf, sizeof(buf), 0,
           "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-9/*\r\n\r\n");
    assert_int_equal(stoke__remote_on_body(body, 1, 10, &x), 10);
    assert_int_equal(stoke__remote_on_body(body + 10, 1, 10, &x), 0);
    assert_int_equal(x.got, 10);
    assert_true(x.bad_cr);
}

/* A 206 whose range ends past the size it says (RFC 9110: an invalid Content-Range): "bytes
 * 10-59/10" with its 50 bytes.  Its bytes were taken and its size, 10, said (the fetch's seen
 * raised to it) for a file it had sent 60 bytes of; none is taken, and no size said. */
static void test_range_past_size(void **state)
{
    (void)state;
    xfer x;
    char buf[50];
    _Atomic uint64_t seen = 0;
    answer(&x, 206, buf, sizeof(buf), 10,
           "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-59/10\r\n"
           "Content-Length: 50\r\n\r\n");
    x.seen = &seen;
    char body[50];
    memset(body, 'b', sizeof(body));
    assert_int_equal(stoke__remote_on_body(body, 1, sizeof(body), &x), 0);
    assert_int_equal(x.got, 0);
    assert_true(x.bad_cr);
    assert_int_equal(atomic_load(&seen), 0);
    /* the last byte of the size is inside it: taken */
    answer(&x, 206, buf, sizeof(buf), 10,
           "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-59/60\r\n"
           "Content-Length: 50\r\n\r\n");
    x.seen = &seen;
    assert_int_equal(stoke__remote_on_body(body, 1, sizeof(body), &x), sizeof(body));
    assert_int_equal(x.got, 50);
    assert_int_equal(atomic_load(&seen), 60);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_range_past_size),
        cmocka_unit_test(test_range_taken),
        cmocka_unit_test(test_range_body_too_long),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    return 77; /* built without libcurl: no remote answers */
}
#endif
