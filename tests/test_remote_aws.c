/* The AWS credentials and config files as S3 reads them (src/sources/remote_aws.c,
 * stoke__remote_ini_get): sections, comments, white space, and lines of any length -- the case
 * tests/fuzz/fuzz_remote_aws.c found.  Skipped without libcurl. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"

#ifdef STOKE_HAVE_LIBCURL
#include "sources/remote_internal.h"

/* text written to a file in the tests' scratch directory; its path into path. */
static void put(char *path, size_t n, const char *name, const char *text)
{
    tu_tmp_path(name, path, n);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    assert_int_equal(fputs(text, f) >= 0, 1);
    assert_int_equal(fclose(f), 0);
}

static void want(const char *path, const char *sec, const char *key, const char *value)
{
    char *v = stoke__remote_ini_get(path, sec, key);
    if (!value) {
        assert_null(v);
        return;
    }
    assert_non_null(v);
    if (strcmp(v, value) != 0)
        fail_msg("[%s] %s: '%.60s' (%zu bytes), expected '%.60s' (%zu bytes)", sec, key, v,
                 strlen(v), value, strlen(value));
    free(v);
}

static void test_sections(void **state)
{
    (void)state;
    char path[512];
    put(path, sizeof(path), "aws_sections.ini",
        "# comment\n[default]\naws_access_key_id = AKIA1  \n; x = y\n"
        "[ profile dev ]\n\taws_access_key_id=AKIA2\nregion = eu-west-1\n[other]\n"
        "aws_access_key_id = AKIA3\n");
    want(path, "default", "aws_access_key_id", "AKIA1");
    want(path, "profile dev", "aws_access_key_id", "AKIA2");
    want(path, "profile dev", "region", "eu-west-1");
    want(path, "default", "region", NULL);
    want(path, "dev", "aws_access_key_id", NULL);
    unlink(path);
}

/* A line longer than 4095 bytes: a session token of 5000 bytes was cut there (read in 4096-byte
 * pieces), and the rest of a long comment line was read as a line of its own, a key. */
static void test_long_lines(void **state)
{
    (void)state;
    size_t n = 5000;
    char *token = malloc(n + 1), *text = malloc(3 * n);
    assert_non_null(token);
    assert_non_null(text);
    for (size_t i = 0; i < n; i++)
        token[i] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i % 64];
    token[n] = 0;
    char comment[4200];
    memset(comment, 'x', sizeof(comment));
    memcpy(comment, "# ", 2);
    snprintf(comment + 4095, sizeof(comment) - 4095, "aws_access_key_id = FROM_A_COMMENT");
    snprintf(text, 3 * n, "[default]\n%s\naws_access_key_id = AKIA1\naws_session_token = %s\n",
             comment, token);
    char path[512];
    put(path, sizeof(path), "aws_long.ini", text);
    want(path, "default", "aws_access_key_id", "AKIA1");
    want(path, "default", "aws_session_token", token);
    unlink(path);
    free(token);
    free(text);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sections),
        cmocka_unit_test(test_long_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
#else
int main(void)
{
    return 77; /* built without libcurl: no S3 */
}
#endif
