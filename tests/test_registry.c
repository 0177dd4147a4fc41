/* The registry: the selection rule, plugin loading and rejection, current device per thread. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/registry.h"
#include "stoke/stoke.h"
#include "testutil.h"

static char pbuf[4][1024];

static const char *plug(int slot, const char *file)
{
    return tu_test_plugin(file, pbuf[slot], sizeof(pbuf[slot]));
}

static int setup(void **state)
{
    tu_log_capture();
    tu_log_clear();
    tu_use_none();
    return 0;
}

static int find_backend(const char *name, stoke_backend_info *out)
{
    int n = stoke_backend_count();
    for (int i = 0; i < n; i++) {
        assert_int_equal(stoke_backend_get_info(i, out), STOKE_OK);
        if (strcmp(out->name, name) == 0)
            return i;
    }
    return -1;
}

/* A CPU-only machine: no accelerator, every built-in listed with a reason. */
static void test_cpu_only_gives_no_accelerator(void **state)
{
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_string_equal(acc.backend, "");
    assert_non_null(strstr(acc.reason, "no accelerator"));
    int dev;
    assert_int_equal(stoke_device_get(&dev), STOKE_ENODEV);
    assert_int_equal(stoke_device_set(0), STOKE_ENODEV);

    const char *order[] = {"cuda", "hip", "opencl", "cpu"};
    assert_int_equal(stoke_backend_count(), 4);
    for (int i = 0; i < 4; i++) {
        stoke_backend_info b;
        assert_int_equal(stoke_backend_get_info(i, &b), STOKE_OK);
        assert_string_equal(b.name, order[i]);
        assert_int_equal(b.origin, STOKE_ORIGIN_BUILTIN);
        assert_true(strlen(b.reason) > 0);
    }
    stoke_backend_info b;
    assert_int_equal(stoke_backend_get_info(4, &b), STOKE_ERANGE);
    assert_int_equal(find_backend("cuda", &b), 0);
    assert_false(b.available); /* no driver on the test machines: libcuda.so.1 is absent */
}

static void test_plugin_beats_builtins(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", plug(0, "alpha.so"));
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(acc.device_count, 2);
    assert_int_equal(acc.current_device, 0);
    assert_non_null(strstr(acc.reason, "plugin"));
    stoke_backend_info b;
    assert_int_equal(find_backend("alpha", &b), 0); /* plugins are listed first */
    assert_int_equal(b.origin, STOKE_ORIGIN_PLUGIN);
    assert_string_equal(b.path, plug(0, "alpha.so"));
}

static void test_first_loaded_plugin_wins(void **state)
{
    char path[2200];
    snprintf(path, sizeof(path), "%s:%s", plug(0, "beta.so"), plug(1, "alpha.so"));
    tu_env("STOKE_PLUGIN_PATH", path);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
    assert_int_equal(acc.device_count, 3);
}

/* A directory contributes its .so files in name order; the broken ones in it are rejected
 * without stopping the others. */
static void test_plugin_directory_is_sorted_and_survives_broken_plugins(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", getenv("STOKE_TEST_PLUGIN_DIR"));
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha"); /* alpha.so sorts first */
    stoke_backend_info b;
    assert_true(find_backend("beta", &b) > find_backend("alpha", &b));
    assert_true(b.available);
    assert_true(tu_log_count(STOKE_LOG_WARN, "rejected") >= 6);
}

static void test_explicit_beats_plugin(void **state)
{
    char path[2200];
    snprintf(path, sizeof(path), "%s:%s", plug(0, "alpha.so"), plug(1, "beta.so"));
    setenv("STOKE_PLUGIN_PATH", path, 1);
    tu_env("STOKE_ACCELERATOR", "beta:2");
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
    assert_int_equal(acc.current_device, 2);
    assert_non_null(strstr(acc.reason, "explicit"));

    /* The API beats the environment. */
    assert_int_equal(stoke_accelerator_select("ALPHA:1"), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(acc.current_device, 1);
    /* A failed select keeps the previous choice. */
    assert_int_equal(stoke_accelerator_select("alpha:7"), STOKE_ERANGE);
    assert_int_equal(stoke_accelerator_select("nosuch"), STOKE_ENOENT);
    assert_int_equal(stoke_accelerator_select("bad name!"), STOKE_EINVAL);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    /* NULL returns to the environment's choice. */
    assert_int_equal(stoke_accelerator_select(NULL), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
}

static void test_unknown_explicit_lists_known_backends(void **state)
{
    setenv("STOKE_PLUGIN_PATH", plug(0, "alpha.so"), 1);
    tu_env("STOKE_ACCELERATOR", "bogus");
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENOENT);
    const char *err = stoke_last_error();
    assert_non_null(strstr(err, "bogus"));
    assert_non_null(strstr(err, "alpha, cuda, hip, opencl, cpu"));

    tu_env("STOKE_ACCELERATOR", "alpha:2");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ERANGE);
    assert_non_null(strstr(stoke_last_error(), "2 device(s)"));

    tu_env("STOKE_ACCELERATOR", "alpha:x");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_EINVAL);

    /* Explicitly asking for an unavailable backend: no accelerator, and the reason says why. */
    tu_env("STOKE_ACCELERATOR", "cuda");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_non_null(strstr(acc.reason, "cuda is unavailable"));

    /* The cpu fallback is never an accelerator, even when named. */
    tu_env("STOKE_ACCELERATOR", "cpu");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
}

/* Each broken plugin: its status from stoke_plugin_load, its listed reason, a warning. */
static void test_broken_plugin_matrix(void **state)
{
    static const struct {
        const char *file;
        int rc;
        const char *reason;
    } cases[] = {
        {"bad_abi.so", STOKE_EABI, "ABI version 99 outside"},
        {"old_abi.so", STOKE_EABI, "ABI version 0 outside"},
        {"small_table.so", STOKE_EABI, "smaller than ABI v1"},
        {"missing_func.so", STOKE_EABI, "required function host_alloc is missing"},
        {"no_entry.so", STOKE_EABI, "no entry point stoke_backend_entry"},
        {"entry_fail.so", STOKE_EBACKEND, "entry point failed"},
        {"probe_fail.so", STOKE_ENODEV, "fake device is switched off"},
        {"not_a_plugin.so", STOKE_EIO, "dlopen failed"},
        {"does_not_exist.so", STOKE_ENOENT, "file not found"},
        {"dup_cuda.so", STOKE_EABI, "already registered"},
        {"half_events.so", STOKE_EABI, "function event_destroy is missing"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_log_clear();
        const char *path = plug(0, cases[i].file);
        int rc = stoke_plugin_load(path);
        if (rc != cases[i].rc)
            fail_msg("%s: got %s, want %s", cases[i].file, stoke_err_name(rc),
                     stoke_err_name(cases[i].rc));
        assert_int_equal(tu_log_count(STOKE_LOG_WARN, path), 1);
        /* Listed, unavailable, with its reason. */
        int found = 0, n = stoke_backend_count();
        for (int j = 0; j < n; j++) {
            stoke_backend_info b;
            assert_int_equal(stoke_backend_get_info(j, &b), STOKE_OK);
            if (strcmp(b.path, path) != 0)
                continue;
            found = 1;
            assert_false(b.available);
            if (!strstr(b.reason, cases[i].reason))
                fail_msg("%s: reason '%s' lacks '%s'", cases[i].file, b.reason, cases[i].reason);
        }
        assert_true(found);
    }
    /* None of that was fatal: a good plugin still loads and wins. */
    assert_int_equal(stoke_plugin_load(plug(0, "alpha.so")), STOKE_OK);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
}

static void test_api_load_after_selection_reselects(void **state)
{
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_int_equal(stoke_plugin_load(plug(0, "beta.so")), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
    /* Loading the same backend twice is rejected, the first stays. */
    assert_int_equal(stoke_plugin_load(plug(0, "beta.so")), STOKE_EABI);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
}

typedef struct {
    int set_to;
    int seen_before, seen_after;
} dev_job;

static pthread_barrier_t barrier;

static void *device_thread(void *arg)
{
    dev_job *j = arg;
    stoke_device_get(&j->seen_before);
    pthread_barrier_wait(&barrier);
    if (j->set_to >= 0)
        stoke_device_set(j->set_to);
    pthread_barrier_wait(&barrier);
    stoke_device_get(&j->seen_after);
    return NULL;
}

static void test_current_device_is_per_thread(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", plug(0, "beta.so"));
    assert_int_equal(stoke_device_set(3), STOKE_ERANGE);
    assert_int_equal(stoke_device_set(-1), STOKE_ERANGE);
    assert_int_equal(stoke_device_set(2), STOKE_OK);
    pthread_barrier_init(&barrier, NULL, 3);
    dev_job a = {.set_to = 1}, b = {.set_to = -1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, device_thread, &a);
    pthread_create(&tb, NULL, device_thread, &b);
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&barrier);
    assert_int_equal(a.seen_before, 0);
    assert_int_equal(a.seen_after, 1);
    assert_int_equal(b.seen_before, 0);
    assert_int_equal(b.seen_after, 0);
    int dev;
    assert_int_equal(stoke_device_get(&dev), STOKE_OK);
    assert_int_equal(dev, 2);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_int_equal(acc.current_device, 2);
}

/* The explicit index is every new thread's default device. */
static void *default_device_thread(void *arg)
{
    stoke_device_get(arg);
    return NULL;
}

static void test_explicit_index_is_default_for_new_threads(void **state)
{
    setenv("STOKE_PLUGIN_PATH", plug(0, "beta.so"), 1);
    tu_env("STOKE_ACCELERATOR", "beta:1");
    int dev = -1;
    pthread_t t;
    pthread_create(&t, NULL, default_device_thread, &dev);
    pthread_join(t, NULL);
    assert_int_equal(dev, 1);
}

static void test_device_props(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", plug(0, "alpha.so"));
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props(NULL, 1, &p), STOKE_OK);
    assert_string_equal(p.name, "alpha device");
    assert_int_equal(stoke_device_get_props(NULL, 2, &p), STOKE_ERANGE);
    assert_int_equal(stoke_device_get_props("cpu", 0, &p), STOKE_OK);
    assert_string_equal(p.name, "host CPU");
    assert_int_equal(stoke_device_get_props("nosuch", 0, &p), STOKE_ENOENT);
    p.size = 0;
    assert_int_equal(stoke_device_get_props(NULL, 0, &p), STOKE_EINVAL);
}

static void test_status_codes(void **state)
{
    assert_string_equal(stoke_err_name(STOKE_OK), "STOKE_OK");
    assert_string_equal(stoke_err_name(STOKE_ETIMEDOUT), "STOKE_ETIMEDOUT");
    assert_string_equal(stoke_strerror(STOKE_ENOMEM), "out of memory");
    assert_string_equal(stoke_err_name(-999), "STOKE_UNKNOWN");
    assert_string_equal(stoke_strerror(-999), "unknown status");
    /* Codes are distinct and every one has a name and message. */
#define CHECK(name, value, msg)                                  \
    assert_string_equal(stoke_err_name(value), "STOKE_" #name); \
    assert_string_equal(stoke_strerror(value), msg);
    STOKE_STATUS_MAP(CHECK)
#undef CHECK
    assert_int_equal(stoke_version(), STOKE_VERSION_NUMBER);
    assert_string_equal(stoke_version_string(), STOKE_VERSION_STRING);
}

static int teardown(void **state)
{
    tu_use_none();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cpu_only_gives_no_accelerator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_beats_builtins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_loaded_plugin_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_directory_is_sorted_and_survives_broken_plugins,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_beats_plugin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_explicit_lists_known_backends, setup, teardown),
        cmocka_unit_test_setup_teardown(test_broken_plugin_matrix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_load_after_selection_reselects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_current_device_is_per_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_index_is_default_for_new_threads, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_device_props, setup, teardown),
        cmocka_unit_test(test_status_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
