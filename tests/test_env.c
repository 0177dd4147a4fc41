/* Environment parsing: sizes, booleans, integers, accelerator specs, invalid values. */
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"
#include "testutil.h"

static void test_parse_size(void **state)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {{"0", 0},          {"4096", 4096},     {"1K", 1024},         {"1k", 1024},
              {"2M", 2u << 20},  {"3G", 3ull << 30}, {"1T", 1ull << 40},   {"8KiB", 8192},
              {"8KB", 8192},     {"5B", 5},          {"64MiB", 64u << 20}};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        uint64_t v = 1234567;
        assert_int_equal(stoke__parse_size(ok[i].s, &v), 0);
        assert_true(v == ok[i].v);
    }
    static const char *const bad[] = {"", "K", "-1", "1X", "1.5G", "1 G", "1GG",
                                      "99999999999999999999", "20000000000T"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        uint64_t v = 7;
        if (stoke__parse_size(bad[i], &v) != -1)
            fail_msg("'%s' parsed as a size", bad[i]);
        assert_true(v == 7);
    }
}

static void test_parse_bool(void **state)
{
    static const char *const yes[] = {"1", "true", "TRUE", "yes", "On"};
    static const char *const no[] = {"0", "false", "No", "off"};
    int v;
    for (size_t i = 0; i < sizeof(yes) / sizeof(yes[0]); i++) {
        v = -1;
        assert_int_equal(stoke__parse_bool(yes[i], &v), 0);
        assert_int_equal(v, 1);
    }
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++) {
        v = -1;
        assert_int_equal(stoke__parse_bool(no[i], &v), 0);
        assert_int_equal(v, 0);
    }
    assert_int_equal(stoke__parse_bool("2", &v), -1);
    assert_int_equal(stoke__parse_bool("", &v), -1);
    assert_int_equal(stoke__parse_bool("yess", &v), -1);
}

static void test_env_invalid_values_warn_and_fall_back(void **state)
{
    tu_log_capture();
    tu_log_clear();
    setenv("STOKE_PINNED_LIMIT", "lots", 1);
    uint64_t v = 99;
    assert_int_equal(stoke__env_size(STOKE_ENV_PINNED_LIMIT, &v), 0);
    assert_true(v == 99);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_PINNED_LIMIT=lots"), 1);
    /* read again (another loader, the cache beside the pool): said once a process */
    assert_int_equal(stoke__env_size(STOKE_ENV_PINNED_LIMIT, &v), 0);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_PINNED_LIMIT=lots"), 1);
    setenv("STOKE_PINNED_LIMIT", "512M", 1);
    assert_int_equal(stoke__env_size(STOKE_ENV_PINNED_LIMIT, &v), 1);
    assert_true(v == 512ull << 20);
    unsetenv("STOKE_PINNED_LIMIT");
    assert_int_equal(stoke__env_size(STOKE_ENV_PINNED_LIMIT, &v), 0);

    setenv("STOKE_PINNED", "maybe", 1);
    int b = 5;
    assert_int_equal(stoke__env_bool(STOKE_ENV_PINNED, &b), 0);
    assert_int_equal(b, 5);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_PINNED=maybe"), 1);
    setenv("STOKE_PINNED", "off", 1);
    assert_int_equal(stoke__env_bool(STOKE_ENV_PINNED, &b), 1);
    assert_int_equal(b, 0);
    /* Empty counts as unset. */
    setenv("STOKE_PINNED", "", 1);
    assert_null(stoke__env_str(STOKE_ENV_PINNED));
    unsetenv("STOKE_PINNED");

    setenv("RANK", "3", 1);
    assert_int_equal(stoke__env_u64(STOKE_ENV_RANK, &v), 1);
    assert_true(v == 3);
    setenv("RANK", "-3", 1);
    assert_int_equal(stoke__env_u64(STOKE_ENV_RANK, &v), 0);
    unsetenv("RANK");
    assert_string_equal(stoke__env_name(STOKE_ENV_ACCELERATOR), "STOKE_ACCELERATOR");
}

static void test_parse_accel_spec(void **state)
{
    char name[32];
    int index = 99;
    assert_int_equal(stoke__parse_accel_spec("simdev", name, sizeof(name), &index), STOKE_OK);
    assert_string_equal(name, "simdev");
    assert_int_equal(index, -1);
    assert_int_equal(stoke__parse_accel_spec("CUDA:3", name, sizeof(name), &index), STOKE_OK);
    assert_string_equal(name, "cuda");
    assert_int_equal(index, 3);
    static const char *const bad[] = {"", ":1", "cuda:", "cuda:-1", "cuda:x", "a b",
                                      "waytoolongnameforanybackendatallreally"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        if (stoke__parse_accel_spec(bad[i], name, sizeof(name), &index) != STOKE_EINVAL)
            fail_msg("'%s' parsed as an accelerator spec", bad[i]);
}

static void test_log_level_from_env_and_api(void **state)
{
    stoke_log_set_level(STOKE_LOG_WARN);
    assert_int_equal(stoke_log_get_level(), STOKE_LOG_WARN);
    stoke_log_set_level(100);
    assert_int_equal(stoke_log_get_level(), STOKE_LOG_TRACE);
    stoke_log_set_level(-5);
    assert_int_equal(stoke_log_get_level(), STOKE_LOG_ERROR);
    assert_string_equal(stoke_log_level_name(STOKE_LOG_DEBUG), "debug");
    assert_string_equal(stoke_log_level_name(42), "?");
}

/* A message longer than the last-error string keeps its head and its reason (the tail), joined
 * by " ... "; a message built from the last error itself is not garbled; a saved error survives
 * a cleanup that clears or replaces it. */
static void test_long_error_keeps_reason(void **state)
{
    char path[5001];
    memset(path, 'a', sizeof(path) - 1);
    path[0] = '/';
    path[sizeof(path) - 1] = '\0';
    assert_int_equal(stoke__fail(STOKE_EIO, "npy %s: header truncated at byte 61", path),
                     STOKE_EIO);
    const char *e = stoke_last_error();
    assert_int_equal(strlen(e), 1023);
    assert_memory_equal(e, "npy /aaa", 8);
    const char *cut = strstr(e, "a ... a");
    assert_non_null(cut);
    assert_null(strstr(cut + 5, " ... ")); /* one cut */
    const char *reason = "aaa: header truncated at byte 61";
    assert_string_equal(e + strlen(e) - strlen(reason), reason);

    /* the last error as an argument of the next message */
    stoke__fail(STOKE_EIO, "inner reason");
    stoke__fail(STOKE_EIO, "outer: %s", stoke_last_error());
    assert_string_equal(stoke_last_error(), "outer: inner reason");
    stoke__fail(STOKE_EIO, "%s: %s", path, stoke_last_error());
    reason = "aaa: outer: inner reason";
    assert_string_equal(stoke_last_error() + 1023 - strlen(reason), reason);

    /* short messages are untouched; shorten keeps short strings */
    char small[16];
    assert_string_equal(stoke__shorten(small, sizeof(small), "0123456789abcd"), "0123456789abcd");
    assert_string_equal(stoke__shorten(small, sizeof(small), "0123456789abcdef"), "012 ... 9abcdef");

    stoke__saved_error saved;
    stoke__fail(STOKE_ENOMEM, "the reason");
    stoke__error_save(&saved);
    stoke__clear_error();
    stoke__fail(STOKE_EIO, "cleanup noise");
    stoke__error_restore(&saved);
    assert_string_equal(stoke_last_error(), "the reason");
}

/* STOKE_PINNED_LIMIT=0 is no cap (as documented): blocks past any size stay pinned. */
static void test_pinned_limit_zero_is_no_cap(void **state)
{
    tu_env("STOKE_PINNED_LIMIT", "0");
    tu_use_simdev();
    void *p[4];
    for (int i = 0; i < 4; i++) {
        assert_int_equal(stoke_pinned_alloc((size_t)8 << 20, &p[i]), STOKE_OK);
        assert_true(stoke_is_pinned(p[i]));
    }
    uint64_t bytes = 1;
    int policy = -1;
    assert_int_equal(stoke_pinned_get_limit(&bytes, &policy), STOKE_OK);
    assert_int_equal(bytes, 0);
    stoke_pinned_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_pinned_stats_get(&st), STOKE_OK);
    assert_int_equal(st.pageable_fallbacks, 0);
    assert_int_equal(st.limit_failures, 0);
    for (int i = 0; i < 4; i++)
        stoke_pinned_free(p[i]);
    tu_env("STOKE_PINNED_LIMIT", NULL);
    tu_use_none();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_size),
        cmocka_unit_test(test_parse_bool),
        cmocka_unit_test(test_env_invalid_values_warn_and_fall_back),
        cmocka_unit_test(test_parse_accel_spec),
        cmocka_unit_test(test_log_level_from_env_and_api),
        cmocka_unit_test(test_long_error_keeps_reason),
        cmocka_unit_test(test_pinned_limit_zero_is_no_cap),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
