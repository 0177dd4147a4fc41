/* The CLI's promises about its output: a lost write to stdout is exit status 1 with a message
 * (every command, stdout on /dev/full); every option that takes a value says so when it has
 * none; with --json every failure of `bench copy` / `bench pinned` prints one JSON object, and so
 * do no command, an unknown command or benchmark, and `version`. */
#include "stoke/stoke.h"
#include "testutil.h"

#include <ctype.h>
#include <stdio.h>
#include <string.h>

static char out[65536], err[16384];

/* Runs `stoke ARGS...` with extra environment `env`; stdout in out, stderr in err. */
static int run(const char *const env[], const char *const args[])
{
    return tu_run_cli(env, NULL, args, out, sizeof(out), err, sizeof(err));
}

/* ---- a tiny JSON checker: is a text exactly one JSON value? ---------------------------- */

static const char *json_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')
        p++;
    return p;
}

/* The end of the JSON value at p, or NULL if there is none.  depth bounds the nesting. */
static const char *json_value(const char *p, int depth)
{
    p = json_ws(p);
    if (depth > 64)
        return NULL;
    if (*p == '"') {
        for (p++; *p != '"'; p++) {
            if ((unsigned char)*p < 0x20)
                return NULL;
            if (*p == '\\') {
                p++;
                if (*p == 'u') {
                    for (int k = 1; k <= 4; k++)
                        if (!isxdigit((unsigned char)p[k]))
                            return NULL;
                    p += 4;
                } else if (!*p || !strchr("\"\\/bfnrt", *p)) {
                    return NULL;
                }
            }
        }
        return p + 1;
    }
    if (*p == '{' || *p == '[') {
        char close = *p == '{' ? '}' : ']';
        p = json_ws(p + 1);
        if (*p == close)
            return p + 1;
        for (;;) {
            if (close == '}') {
                if (*json_ws(p) != '"' || !(p = json_value(p, depth + 1)))
                    return NULL;
                p = json_ws(p);
                if (*p++ != ':')
                    return NULL;
            }
            if (!(p = json_value(p, depth + 1)))
                return NULL;
            p = json_ws(p);
            if (*p == close)
                return p + 1;
            if (*p++ != ',')
                return NULL;
        }
    }
    static const char *const words[] = {"true", "false", "null"};
    for (size_t k = 0; k < 3; k++)
        if (strncmp(p, words[k], strlen(words[k])) == 0)
            return p + strlen(words[k]);
    const char *q = p;
    if (*q == '-')
        q++;
    if (!isdigit((unsigned char)*q))
        return NULL;
    while (isdigit((unsigned char)*q) || strchr(".eE+-", *q))
        q++;
    return q;
}

/* Fails unless `s` is one JSON object on one line: "{...}\n". */
static void expect_one_json_object(const char *what, const char *s)
{
    const char *end = *s == '{' ? json_value(s, 0) : NULL;
    if (!end || strcmp(end, "\n") != 0)
        fail_msg("%s: stdout is not one JSON object on one line: [%s]", what, s);
}

/* Every command that writes to stdout, on /dev/full: exit 1 and the reason on stderr. */
static void test_lost_output_fails(void **state)
{
    const char *env[] = {tu_simdev_env(), "STOKE_ACCELERATOR=", "STOKE_SIMDEV_FAIL_ALLOC=",
                         "STOKE_SIMDEV_FAIL_COPY=", NULL};
    static const char *const cmds[][8] = {
        {"version"},
        {"--help"},
        {"devices"},
        {"devices", "--json"},
        {"load", "synthetic:100", "--batch-size", "10"},
        {"load", "synthetic:100", "--batch-size", "10", "--json"},
        {"load", "--help"},
        {"bench", "pinned", "--quick", "--json"},
        {"bench", "copy", "--quick", "--json"},
    };
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        int st = tu_run_cli_full(env, NULL, cmds[i], err, sizeof(err));
        if (st != 1 || !strstr(err, "stoke: error writing output: No space left on device"))
            fail_msg("stoke %s %s > /dev/full: exit %d (expected 1), stderr: %s", cmds[i][0],
                     cmds[i][1] ? cmds[i][1] : "", st, err);
    }
    /* and with stdout that works, the same commands succeed */
    const char *ok[] = {"load", "synthetic:100", "--batch-size", "10", "--json", NULL};
    assert_int_equal(run(env, ok), 0);
    assert_null(strstr(err, "error writing output"));
}

/* An option that takes a value, given none (at the end, before another option, or "NAME="):
 * "NAME needs a value", exit 2, in every command. */
static void test_option_needs_value(void **state)
{
    const char *env[] = {tu_simdev_env(), "STOKE_ACCELERATOR=", NULL};
    static const struct {
        const char *args[6];
        const char *opt;
    } cases[] = {
        {{"devices", "--accelerator"}, "--accelerator"},
        {{"devices", "--accelerator", "--json"}, "--accelerator"},
        {{"devices", "--accelerator="}, "--accelerator"},
        {{"bench", "pinned", "--size"}, "--size"},
        {{"bench", "pinned", "--quick", "--size="}, "--size"},
        {{"load", "--batch-size"}, "--batch-size"},
        {{"load", "--workers", "--json"}, "--workers"},
        {{"load", "--prefetch"}, "--prefetch"},
        {{"load", "--seed"}, "--seed"},
        {{"load", "--epochs"}, "--epochs"},
        {{"load", "--limit"}, "--limit"},
        {{"load", "--device"}, "--device"},
        {{"load", "--pin-memory-device"}, "--pin-memory-device"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        int st = run(env, cases[i].args);
        char want[128];
        snprintf(want, sizeof(want), ": %s needs a value\n", cases[i].opt);
        if (st != 2 || !strstr(err, want) || strstr(err, "unknown option"))
            fail_msg("case %zu (%s %s): exit %d, stderr: %s", i, cases[i].args[0],
                     cases[i].args[1], st, err);
    }
    /* with --json, the error is the one JSON object */
    const char *j[] = {"devices", "--json", "--accelerator", NULL};
    assert_int_equal(run(env, j), 2);
    assert_string_equal(out, "{\"ok\": false, \"error\": \"--accelerator needs a value\"}\n");
    /* the value given as NAME=VALUE works */
    const char *eq[] = {"devices", "--accelerator=simdev:1", NULL};
    assert_int_equal(run(env, eq), 0);
    assert_non_null(strstr(out, "current device 1"));
    const char *leq[] = {"load", "synthetic:20", "--batch-size=5", "--json", NULL};
    assert_int_equal(run(env, leq), 0);
    assert_non_null(strstr(out, "\"batches\": 4,"));
}

/* stdout is exactly {"ok": false, "error": "..."} on one line, the error containing `msg`, and
 * stderr says the same. */
static void expect_json_error(const char *what, const char *msg)
{
    const char *pre = "{\"ok\": false, \"error\": \"";
    expect_one_json_object(what, out);
    size_t n = strlen(out);
    if (strncmp(out, pre, strlen(pre)) != 0 || n < 3 || strcmp(out + n - 3, "\"}\n") != 0 ||
        strchr(out, '\n') != out + n - 1 || !strstr(out, msg))
        fail_msg("%s: stdout is not one JSON error naming \"%s\": [%s]", what, msg, out);
    if (!strstr(err, msg))
        fail_msg("%s: stderr lacks \"%s\": [%s]", what, msg, err);
}

/* bench copy / pinned --json: allocation and copy failures injected into simdev. */
static void test_bench_json_failures(void **state)
{
    const char *plug = tu_simdev_env();
    static const struct {
        const char *fault, *bench, *msg;
    } cases[] = {
        {"STOKE_SIMDEV_FAIL_ALLOC=1", "copy", "allocating device memory: "},
        {"STOKE_SIMDEV_FAIL_ALLOC=2", "copy", "allocating pinned memory: "},
        {"STOKE_SIMDEV_FAIL_COPY=1", "copy", "waiting for the copies: simdev: "},
        {"STOKE_SIMDEV_FAIL_COPY=5", "copy", "waiting for the copies: "},
        {"STOKE_SIMDEV_FAIL_ALLOC=1", "pinned", "stoke_pinned_alloc: "},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const char *env[] = {plug, "STOKE_ACCELERATOR=", "STOKE_SIMDEV_FAIL_ALLOC=",
                             "STOKE_SIMDEV_FAIL_COPY=", cases[i].fault, NULL};
        const char *args[] = {"bench", cases[i].bench, "--quick", "--json", NULL};
        int st = run(env, args);
        char what[128];
        snprintf(what, sizeof(what), "bench %s with %s", cases[i].bench, cases[i].fault);
        if (st != 1)
            fail_msg("%s: exit %d, stdout %s, stderr %s", what, st, out, err);
        expect_json_error(what, cases[i].msg);
    }
    /* no accelerator: bench copy cannot run */
    const char *none[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    const char *args[] = {"bench", "copy", "--quick", "--json", NULL};
    assert_int_equal(run(none, args), 1);
    expect_json_error("bench copy without an accelerator", "needs an accelerator: ");
    /* usage errors too */
    const char *bad[] = {"bench", "pinned", "--json", "--bogus", NULL};
    assert_int_equal(run(none, bad), 2);
    expect_json_error("bench pinned --bogus", "unknown option '--bogus'");
    const char *badsize[] = {"bench", "pinned", "--json", "--size", "12x", NULL};
    assert_int_equal(run(none, badsize), 2);
    expect_json_error("bench pinned --size 12x", "--size: '12x' is not a non-negative integer");
}

/* An asynchronous copy failure in bench copy ends with the backend's reason (which copy, why). */
static void test_bench_copy_failure_keeps_reason(void **state)
{
    const char *env[] = {tu_simdev_env(), "STOKE_ACCELERATOR=", "STOKE_SIMDEV_FAIL_ALLOC=",
                         "STOKE_SIMDEV_FAIL_COPY=2", NULL};
    const char *args[] = {"bench", "copy", "--quick", "--json", NULL};
    assert_int_equal(run(env, args), 1);
    expect_json_error("bench copy with STOKE_SIMDEV_FAIL_COPY=2",
                      "waiting for the copies: simdev: work before the event on device 0 failed: "
                      "injected copy failure: copy #2 (h2d, 65536 bytes) on stream simdev-s0 "
                      "failed (STOKE_SIMDEV_FAIL_COPY=2)");
}

/* Text-mode errors escape control characters of the names they quote (JSON escapes them too). */
static void test_text_errors_escape_control_characters(void **state)
{
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    const char *args[] = {"load", "npy:/nonexistent-stoke/a\nb\x1b[31m\t", NULL};
    assert_int_equal(run(env, args), 1);
    if (!strstr(err, "/nonexistent-stoke/a\\nb\\x1b[31m\\t"))
        fail_msg("stderr: [%s]", err);
    assert_null(strchr(err, '\x1b'));
    assert_null(strchr(err, '\t'));
    assert_non_null(strchr(err, '\n'));
    assert_ptr_equal(strchr(err, '\n'), err + strlen(err) - 1); /* one line */
}

/* `bench --help` behaves like every other --help: usage on stdout, exit 0; no benchmark named
 * is still a usage error. */
static void test_bench_help(void **state)
{
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    static const char *const helps[][3] = {
        {"bench", "--help", NULL}, {"bench", "-h", NULL},
        {"bench", "copy", "--help"}, {"bench", "pinned", "--help"}};
    for (size_t i = 0; i < sizeof(helps) / sizeof(helps[0]); i++) {
        const char *args[4] = {helps[i][0], helps[i][1], helps[i][2], NULL};
        assert_int_equal(run(env, args), 0);
        assert_true(strncmp(out, "usage: stoke bench ", 19) == 0);
        assert_string_equal(err, "");
    }
    const char *none[] = {"bench", NULL};
    assert_int_equal(run(env, none), 2);
    assert_string_equal(out, "");
    assert_true(strncmp(err, "usage: stoke bench ", 19) == 0);
}

/* With --json, no command, an unknown command or benchmark print one JSON error object (and the
 * message on stderr, exit 2); `version --json` prints {"version": ...}; a --json given before
 * the command counts as the command's. */
static void test_json_everywhere(void **state)
{
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    static const struct {
        const char *args[4];
        const char *msg;
    } errs[] = {
        {{"--json"}, "no command given"},
        {{"--json", "--json"}, "no command given"},
        {{"frobnicate", "--json"}, "unknown command 'frobnicate'"},
        {{"--json", "frobnicate"}, "unknown command 'frobnicate'"},
        {{"bench", "X", "--json"}, "unknown benchmark 'X'"},
        {{"bench", "--json"}, "no benchmark named"},
        {{"version", "--bogus", "--json"}, "unknown option '--bogus'"},
    };
    for (size_t i = 0; i < sizeof(errs) / sizeof(errs[0]); i++) {
        char what[128];
        snprintf(what, sizeof(what), "stoke %s %s %s", errs[i].args[0],
                 errs[i].args[1] ? errs[i].args[1] : "", errs[i].args[2] ? errs[i].args[2] : "");
        int st = run(env, errs[i].args);
        if (st != 2)
            fail_msg("%s: exit %d (expected 2), stdout [%s], stderr [%s]", what, st, out, err);
        expect_one_json_object(what, out);
        expect_json_error(what, errs[i].msg);
        if (strstr(err, "usage:"))
            fail_msg("%s: usage text with --json: [%s]", what, err);
    }
    /* without --json: the usage and the message on stderr, nothing on stdout */
    const char *plain[] = {"bench", "X", NULL};
    assert_int_equal(run(env, plain), 2);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "usage: stoke bench "));
    assert_non_null(strstr(err, "stoke bench: unknown benchmark 'X' (pinned or copy)\n"));
    const char *nocmd[] = {"frobnicate", NULL};
    assert_int_equal(run(env, nocmd), 2);
    assert_string_equal(out, "");
    assert_non_null(strstr(err, "stoke: unknown command 'frobnicate'"));
    assert_int_equal(run(env, (const char *[]){NULL}), 2);
    assert_string_equal(out, "");
    assert_true(strncmp(err, "usage: stoke COMMAND", 20) == 0);

    char want[128];
    snprintf(want, sizeof(want), "{\"version\": \"%s\"}\n", stoke_version_string());
    static const char *const versions[][3] = {
        {"version", "--json"}, {"--version", "--json"}, {"--json", "version"}};
    for (size_t i = 0; i < sizeof(versions) / sizeof(versions[0]); i++) {
        const char *args[3] = {versions[i][0], versions[i][1], NULL};
        assert_int_equal(run(env, args), 0);
        expect_one_json_object("stoke version --json", out);
        assert_string_equal(out, want);
    }
    const char *text[] = {"version", NULL};
    assert_int_equal(run(env, text), 0);
    snprintf(want, sizeof(want), "stoke %s\n", stoke_version_string());
    assert_string_equal(out, want);
    /* a --json before the command is the command's */
    const char *dev[] = {"--json", "devices", NULL};
    assert_int_equal(run(env, dev), 0);
    expect_one_json_object("stoke --json devices", out);
    assert_non_null(strstr(out, "{\"accelerator\": null"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_output_fails),
        cmocka_unit_test(test_option_needs_value),
        cmocka_unit_test(test_bench_json_failures),
        cmocka_unit_test(test_bench_copy_failure_keeps_reason),
        cmocka_unit_test(test_text_errors_escape_control_characters),
        cmocka_unit_test(test_bench_help),
        cmocka_unit_test(test_json_everywhere),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
