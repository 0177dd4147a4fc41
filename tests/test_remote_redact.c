/* Credentials kept out of messages (src/sources/remote_redact.c, stoke__remote_redact): the
 * text a URL or a spec is shown as, for user:password@ of every spelling libcurl may be given
 * (a password holding '@', or a raw '/', '?' or '#'), secret query values, and what is kept
 * (a URL without user info, an '@' in its path).  Built without libcurl too. */
#include <string.h>

#include "sources/remote.h"
#include "testutil.h"

static void check(const char *in, const char *want)
{
    char out[512];
    size_t n = stoke__remote_redact(out, sizeof(out), in);
    if (strcmp(out, want) != 0)
        fail_msg("redact(\"%s\"): \"%s\", expected \"%s\"", in, out, want);
    assert_int_equal(n, strlen(want));
}

static void test_user_info(void **state)
{
    (void)state;
    check("tar:http://bob:pw@h/x.tar,fields=bin", "tar:http://h/x.tar,fields=bin");
    check("http://bob:p@ssS3CRET@h:80/x.tar", "http://h:80/x.tar"); /* '@' in the password */
    check("http://bob@h/x.tar", "http://h/x.tar");
    /* a raw '/', '?' or '#' in the password (libcurl fails on the URL): up to the last '@' */
    check("tar:http://user:pa/SECRET@127.0.0.1:1/x.tar,fields=bin",
          "tar:http://127.0.0.1:1/x.tar,fields=bin");
    check("http://user:pa?SECRET@h/x.tar", "http://h/x.tar");
    check("http://user:pa#SECRET@h/x.tar", "http://h/x.tar");
    check("http://user:pa/x@y?SECRET@h/x.tar", "http://h/x.tar");
    /* a raw '@' in the user (an e-mail address) and a raw '/' in the password: the '@'
     * before the ':' is the user's, the password still ends at the URL's last '@' (it was
     * shown: "http://example.com:pa/SECRET@h/x.tar") */
    check("http://me@example.com:pa/SECRET@h/x.tar", "http://h/x.tar");
    check("tar:http://a@b:c?SECRET@h/x.tar,fields=bin", "tar:http://h/x.tar,fields=bin");
    /* two URLs of a spec, each its own: the first's end (',' or white space) bounds it */
    check("http://a:b/c@h/1.tar http://d:e?f@g/2.tar", "http://h/1.tar http://g/2.tar");
}

static void test_kept(void **state)
{
    (void)state;
    /* no ':' before a '/': an '@' in the path is the path's */
    check("tar:http://h/a@b.tar,fields=bin", "tar:http://h/a@b.tar,fields=bin");
    check("https://h/dir/x@2x.tar?v=1@2", "https://h/dir/x@2x.tar?v=1@2");
    check("s3://bucket/a@b.tar", "s3://bucket/a@b.tar");
    check("no url: a@b c:d", "no url: a@b c:d");
    /* a port then an '@' in the path reads as a password holding '/': hidden, not shown */
    check("http://h:8080/a@b.tar", "http://b.tar");
}

static void test_query(void **state)
{
    (void)state;
    check("https://h/x.tar?X-Amz-Signature=dead&X-Amz-Date=1&sig=S&x-api-key=K",
          "https://h/x.tar?X-Amz-Signature=***&X-Amz-Date=1&sig=***&x-api-key=***");
    check("http://u:p/w@h/x.tar?token=T#frag", "http://h/x.tar?token=***#frag");
    /* a URL right after '?' or '&' whose text up to an '=' ends like a secret's name: it was
     * copied whole as that name, password and all ("?http://u:SECRET@h2/x/token=***") */
    check("https://h/?http://u:SECRET@h2/x/token=zz", "https://h/?http://h2/x/token=zz");
    check("https://h/x?a&http://u:SECRET@h2/api_key=1", "https://h/x?a&http://h2/api_key=1");
    /* a secret parameter's value that is a URL whose password holds a '#' or '&': the value
     * ended at that '#', and the rest of the password was shown ("key=***#w@h"; the fuzzer
     * found it: corpus_spec/secret_param_nested_url) */
    check("https://h/x?key=a://u:p#w@h2/y&b=1", "https://h/x?key=***&b=1");
    check("https://h/x?token=a://:p&w@h2#f", "https://h/x?token=***#f");
    check("https://h/x?key=plain#frag", "https://h/x?key=***#frag");
    /* ... the second URL of the value, the first without user info */
    check("https://h/x?key=a://h1/?b://:p#w@h2&c=1", "https://h/x?key=***&c=1");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_user_info),
        cmocka_unit_test(test_kept),
        cmocka_unit_test(test_query),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
