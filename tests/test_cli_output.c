/* The CLI's promises about its output: a lost write to stdout is exit status 1 with a message
 * (every command, stdout on /dev/full); every option that takes a value says so when it has
 * none; with --json every failure of `bench copy` / `bench pinned` prints one JSON object. */
#include "testutil.h"

#include <stdio.h>
#include <string.h>

static char out[65536], err[16384];

/* Runs `stoke ARGS...` with extra environment `env`; stdout in out, stderr in err. */
static int run(const char *const env[], const char *const args[])
{
    return tu_run_cli(env, NULL, args, out, sizeof(out), err, sizeof(err));
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_lost_output_fails),
        cmocka_unit_test(test_option_needs_value),
        cmocka_unit_test(test_bench_json_failures),
        cmocka_unit_test(test_bench_copy_failure_keeps_reason),
        cmocka_unit_test(test_text_errors_escape_control_characters),
        cmocka_unit_test(test_bench_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
