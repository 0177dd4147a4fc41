/* simdev, the simulated accelerator plugin: devices and probe, device memory the CPU cannot
 * touch, the pinned-range table, pinned/pageable accounting, asynchronous copies ordered by
 * events, fault injection, and use from several threads. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../plugins/simdev/simdev.h"
#include "common/internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"
#include "testutil.h"

static const char *const simdev_vars[] = {"STOKE_SIMDEV_DEVICES",   "STOKE_SIMDEV_COPY_DELAY_US",
                                          "STOKE_SIMDEV_MEMORY",    "STOKE_SIMDEV_FAIL_ALLOC",
                                          "STOKE_SIMDEV_FAIL_COPY", "STOKE_SIMDEV_PROBE_FAIL"};

static int setup(void **state)
{
    tu_log_capture();
    tu_log_clear();
    for (size_t i = 0; i < sizeof(simdev_vars) / sizeof(simdev_vars[0]); i++)
        unsetenv(simdev_vars[i]);
    tu_use_simdev();
    return 0;
}

static int teardown(void **state)
{
    tu_use_none(); /* shuts simdev down and unloads it */
    for (size_t i = 0; i < sizeof(simdev_vars) / sizeof(simdev_vars[0]); i++)
        unsetenv(simdev_vars[i]);
    return 0;
}

/* The simdev table, loading it (and probing it) if needed. */
static const stoke_backend *sd(void)
{
    const stoke_backend *vt = NULL;
    int rc = stoke__backend_lookup("simdev", &vt);
    if (rc != STOKE_OK) {
        tu_log_dump();
        fail_msg("simdev lookup: %s (%s)", stoke_err_name(rc), stoke_last_error());
    }
    return vt;
}

/* Everything the test made was freed. */
static void assert_nothing_live(void)
{
    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.live_host_blocks, 0);
    assert_int_equal(c.live_host_bytes, 0);
    assert_int_equal(c.live_registered, 0);
    assert_int_equal(c.live_registered_bytes, 0);
    assert_int_equal(c.live_device_buffers, 0);
    assert_int_equal(c.live_device_bytes, 0);
    assert_int_equal(c.live_streams, 0);
    assert_int_equal(c.live_events, 0);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed * 7u + (i >> 8));
}

static int check(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31u + seed * 7u + (i >> 8)))
            return 0;
    return 1;
}

/* ---- devices and probe ------------------------------------------------------------------ */

static void test_simdev_is_the_accelerator(void **state)
{
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "simdev");
    assert_int_equal(acc.device_count, 2);
    for (int d = 0; d < 2; d++) {
        stoke_device_props p;
        memset(&p, 0, sizeof(p));
        p.size = sizeof(p);
        assert_int_equal(stoke_device_get_props(NULL, d, &p), STOKE_OK);
        char name[32];
        snprintf(name, sizeof(name), "simdev %d", d);
        assert_string_equal(p.name, name);
        assert_int_equal(p.kind, STOKE_DEVICE_SIMULATED);
        assert_true(p.total_memory == 4ull << 30);
    }
    const stoke_backend *vt = sd();
    uint64_t want = STOKE_CAP_PINNED_ALLOC | STOKE_CAP_HOST_REGISTER | STOKE_CAP_DEVICE_MEMORY |
                    STOKE_CAP_ASYNC_COPY | STOKE_CAP_EVENTS | STOKE_CAP_IPC | STOKE_CAP_FORK_SAFE;
    assert_true(vt->caps == want);
    assert_int_equal(vt->abi_version, 2); /* ABI v2: the IPC group */
    assert_true(vt->size >= STOKE_BACKEND_V2_SIZE);

    /* An older host's shorter props struct is filled only up to its size. */
    unsigned char raw[sizeof(stoke_device_props) + 16];
    memset(raw, 0xAB, sizeof(raw));
    stoke_device_props *short_p = (stoke_device_props *)(void *)raw;
    short_p->size = (uint32_t)offsetof(stoke_device_props, vendor);
    assert_int_equal(vt->device_props(1, short_p), STOKE_OK);
    assert_int_equal(short_p->size, offsetof(stoke_device_props, vendor));
    assert_string_equal(short_p->name, "simdev 1");
    assert_int_equal(raw[offsetof(stoke_device_props, vendor)], 0xAB);
    assert_int_equal(vt->device_props(2, short_p), STOKE_ERANGE);

    /* STOKE_SIMDEV_DEVICES is read at probe, after the registry reloads the plugin. */
    tu_env("STOKE_SIMDEV_DEVICES", "3");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "simdev");
    assert_int_equal(acc.device_count, 3);
    assert_int_equal(stoke_device_set(2), STOKE_OK);

    tu_env("STOKE_SIMDEV_MEMORY", "512M");
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props("simdev", 1, &p), STOKE_OK);
    assert_true(p.total_memory == 512ull << 20);
    assert_int_equal(stoke_device_get_props("simdev", 3, &p), STOKE_ERANGE);
}

static void test_simdev_bad_env_warns_and_falls_back(void **state)
{
    tu_env("STOKE_SIMDEV_DEVICES", "lots");
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", "-5");
    tu_env("STOKE_SIMDEV_MEMORY", "4Q");
    tu_env("STOKE_SIMDEV_PROBE_FAIL", "maybe");
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_int_equal(acc.device_count, 2);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_SIMDEV_DEVICES='lots'"), 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_SIMDEV_COPY_DELAY_US='-5'"), 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_SIMDEV_MEMORY='4Q'"), 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_SIMDEV_PROBE_FAIL='maybe'"), 1);
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props(NULL, 0, &p), STOKE_OK);
    assert_true(p.total_memory == 4ull << 30);
    tu_env("STOKE_SIMDEV_DEVICES", "65");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_int_equal(acc.device_count, 2);
}

/* Zero devices and an injected probe failure make simdev unavailable, with a precise reason. */
static void test_simdev_probe_failures_name_their_cause(void **state)
{
    static const struct {
        const char *var, *value, *reason;
    } cases[] = {{"STOKE_SIMDEV_DEVICES", "0", "no device"},
                 {"STOKE_SIMDEV_PROBE_FAIL", "1", "injected (STOKE_SIMDEV_PROBE_FAIL=1)"}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_use_simdev();
        tu_env(cases[i].var, cases[i].value);
        stoke_accelerator_info acc;
        assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
        /* the plugin loaded: the reason does not say none did */
        if (!strstr(acc.reason, "no loaded plugin is available (1 loaded)") ||
            strstr(acc.reason, "no plugin loaded"))
            fail_msg("the accelerator's reason: '%s'", acc.reason);
        stoke_backend_info b;
        int found = 0;
        for (int k = 0; k < stoke_backend_count(); k++) {
            assert_int_equal(stoke_backend_get_info(k, &b), STOKE_OK);
            if (strcmp(b.name, "simdev") == 0) {
                found = 1;
                break;
            }
        }
        assert_true(found);
        assert_int_equal(b.available, 0);
        if (!strstr(b.reason, cases[i].reason))
            fail_msg("reason '%s' lacks '%s'", b.reason, cases[i].reason);
        unsetenv(cases[i].var);
    }
}

/* The entry point honours the host's version window, and the counters query its size tag. */
static void test_simdev_entry_point_and_counters_abi(void **state)
{
    void *h = dlopen(tu_simdev_path(), RTLD_NOW | RTLD_LOCAL);
    assert_non_null(h);
    stoke_backend_entry_fn entry;
    *(void **)&entry = dlsym(h, STOKE_BACKEND_ENTRY_SYMBOL);
    assert_non_null(entry);
    const stoke_backend *vt = NULL;
    stoke_backend_host future = {
        .abi_version = 4, .size = sizeof(future), .abi_min = 3, .log = NULL};
    assert_int_equal(entry(&future, &vt), STOKE_EABI);
    assert_null(vt);
    /* A host that speaks only ABI v1 cannot take simdev's v2 table. */
    stoke_backend_host old = {.abi_version = 1, .size = sizeof(old), .abi_min = 1, .log = NULL};
    assert_int_equal(entry(&old, &vt), STOKE_EABI);
    assert_null(vt);
    stoke_backend_host host = {.abi_version = STOKE_BACKEND_ABI_VERSION,
                               .size = sizeof(host),
                               .abi_min = STOKE_BACKEND_ABI_MIN};
    assert_int_equal(entry(&host, &vt), STOKE_OK);
    assert_non_null(vt);
    assert_string_equal(vt->name, "simdev");

    stoke_simdev_counters_fn fn;
    *(void **)&fn = dlsym(h, STOKE_SIMDEV_COUNTERS_SYMBOL);
    assert_non_null(fn);
    assert_int_equal(fn(NULL), STOKE_EINVAL);
    struct stoke_simdev_counters c;
    memset(&c, 0x5A, sizeof(c));
    c.size = 4;
    assert_int_equal(fn(&c), STOKE_EINVAL);
    c.size = (uint32_t)offsetof(struct stoke_simdev_counters, h2d_pinned);
    assert_int_equal(fn(&c), STOKE_OK);
    assert_int_equal(c.size, offsetof(struct stoke_simdev_counters, h2d_pinned));
    assert_int_equal(c.version, STOKE_SIMDEV_COUNTERS_VERSION);
    assert_true(c.h2d_pinned == 0x5A5A5A5A5A5A5A5Aull); /* beyond the size: untouched */
    /* Only the two documented symbols are exported. */
    assert_null(dlsym(h, "simdev__log"));
    assert_null(dlsym(h, "simdev__lock"));
    dlclose(h);
}

/* ---- memory ------------------------------------------------------------------------------- */

/* A CPU access to device memory faults: checked in a child process. */
static void test_simdev_device_memory_faults_on_cpu_access(void **state)
{
    const stoke_backend *vt = sd();
    void *handle = NULL;
    assert_int_equal(vt->device_alloc(0, 8192, &handle), STOKE_OK);
    assert_non_null(handle);
    int pinned = 1;
    assert_int_equal(vt->is_pinned(handle, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);

    for (int write = 0; write < 2; write++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            /* Restore the default action (sanitizers install their own SIGSEGV handlers). */
            struct sigaction sa;
            memset(&sa, 0, sizeof(sa));
            sa.sa_handler = SIG_DFL;
            sigaction(SIGSEGV, &sa, NULL);
            sigaction(SIGBUS, &sa, NULL);
            volatile unsigned char *p = handle;
            if (write)
                p[100] = 1;
            else
                (void)p[100];
            _exit(0); /* reached only if the access did not fault */
        }
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFSIGNALED(st))
            fail_msg("the child's %s of device memory did not fault (status %d)",
                     write ? "write" : "read", st);
        assert_true(WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS);
    }
    assert_int_equal(vt->device_free(0, handle), STOKE_OK);
    assert_int_equal(vt->device_free(0, handle), STOKE_EINVAL); /* twice */
    int stack;
    assert_int_equal(vt->device_free(0, &stack), STOKE_EINVAL);
    assert_nothing_live();
}

static void test_simdev_is_pinned_exact_bounds(void **state)
{
    const stoke_backend *vt = sd();
    int on = -1;
    const size_t n = 10000; /* not a multiple of the page size: the mapping is longer */
    unsigned char *blk = NULL;
    assert_int_equal(vt->host_alloc(1, n, (void **)&blk), STOKE_OK);
    assert_non_null(blk);
    assert_int_equal((uintptr_t)blk % (uintptr_t)sysconf(_SC_PAGESIZE), 0);
    memset(blk, 0x11, n); /* CPU-accessible */
    const size_t inside[] = {0, 1, 4095, 4096, n / 2, n - 1};
    for (size_t i = 0; i < sizeof(inside) / sizeof(inside[0]); i++) {
        assert_int_equal(vt->is_pinned(blk + inside[i], &on), STOKE_OK);
        assert_int_equal(on, 1);
    }
    assert_int_equal(vt->is_pinned(blk + n, &on), STOKE_OK); /* one past the end */
    assert_int_equal(on, 0);
    assert_int_equal(vt->is_pinned(blk - 1, &on), STOKE_OK);
    assert_int_equal(on, 0);
    assert_int_equal(vt->is_pinned(NULL, &on), STOKE_OK);
    assert_int_equal(on, 0);

    /* A registered range of caller memory: exactly [p, p+len). */
    unsigned char *heap = malloc(1000);
    assert_non_null(heap);
    assert_int_equal(vt->host_register(0, heap + 100, 500), STOKE_OK);
    assert_int_equal(vt->is_pinned(heap + 99, &on), STOKE_OK);
    assert_int_equal(on, 0);
    assert_int_equal(vt->is_pinned(heap + 100, &on), STOKE_OK);
    assert_int_equal(on, 1);
    assert_int_equal(vt->is_pinned(heap + 599, &on), STOKE_OK);
    assert_int_equal(on, 1);
    assert_int_equal(vt->is_pinned(heap + 600, &on), STOKE_OK);
    assert_int_equal(on, 0);
    /* Overlaps are refused, on either side, and inside a pinned block. */
    assert_int_equal(vt->host_register(0, heap + 50, 51), STOKE_EBUSY);
    assert_int_equal(vt->host_register(0, heap + 599, 10), STOKE_EBUSY);
    assert_int_equal(vt->host_register(0, heap + 200, 10), STOKE_EBUSY);
    assert_int_equal(vt->host_register(0, blk + 10, 10), STOKE_EBUSY);
    assert_true(tu_log_count(STOKE_LOG_WARN, "overlaps") >= 4);
    /* Adjacent ranges are fine. */
    assert_int_equal(vt->host_register(0, heap + 600, 400), STOKE_OK);
    assert_int_equal(vt->host_register(0, heap, 100), STOKE_OK);
    assert_int_equal(vt->is_pinned(heap + 999, &on), STOKE_OK);
    assert_int_equal(on, 1);
    /* Bad arguments. */
    assert_int_equal(vt->host_register(0, NULL, 10), STOKE_EINVAL);
    assert_int_equal(vt->host_register(0, heap, 0), STOKE_EINVAL);
    assert_int_equal(vt->host_register(7, heap, 10), STOKE_ERANGE);
    assert_int_equal(vt->host_unregister(0, heap + 101), STOKE_EINVAL);
    assert_int_equal(vt->host_unregister(0, blk), STOKE_EINVAL);  /* allocated, not registered */
    assert_int_equal(vt->host_free(0, heap + 100), STOKE_EINVAL); /* registered, not allocated */
    assert_int_equal(vt->host_free(0, blk + 1), STOKE_EINVAL);
    void *none = (void *)1;
    assert_int_equal(vt->host_alloc(0, 0, &none), STOKE_EINVAL);
    assert_null(none);
    assert_int_equal(vt->host_alloc(2, 64, &none), STOKE_ERANGE);

    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.host_allocs, 1);
    assert_int_equal(c.host_registers, 3);
    assert_int_equal(c.live_host_bytes, n);
    assert_int_equal(c.live_registered_bytes, 1000);

    assert_int_equal(vt->host_unregister(0, heap + 100), STOKE_OK);
    assert_int_equal(vt->is_pinned(heap + 100, &on), STOKE_OK);
    assert_int_equal(on, 0);
    assert_int_equal(vt->host_unregister(0, heap + 100), STOKE_EINVAL); /* twice */
    assert_int_equal(vt->host_unregister(0, heap), STOKE_OK);
    assert_int_equal(vt->host_unregister(0, heap + 600), STOKE_OK);
    assert_int_equal(vt->host_free(1, blk), STOKE_OK);
    assert_int_equal(vt->is_pinned(blk, &on), STOKE_OK);
    assert_int_equal(on, 0);
    assert_int_equal(vt->host_free(1, NULL), STOKE_OK);
    free(heap);
    c = tu_simdev_counters();
    assert_int_equal(c.host_frees, 1);
    assert_int_equal(c.host_unregisters, 3);
    assert_nothing_live();
}

/* ---- copies ------------------------------------------------------------------------------- */

/* Copies from pinned and from pageable host memory are counted apart, with their bytes. */
static void test_simdev_pinned_and_pageable_accounting(void **state)
{
    stoke_stream *s;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *buf;
    assert_int_equal(stoke_device_buffer_create(s, 1 << 16, &buf), STOKE_OK);
    const stoke_backend *vt = sd();
    const size_t bn = 5000; /* its mapping runs to 8192: bytes past 5000 are not pinned */
    unsigned char *pin = NULL;
    assert_int_equal(vt->host_alloc(0, bn, (void **)&pin), STOKE_OK);
    unsigned char *pageable = malloc(4096);
    assert_non_null(pageable);
    fill(pin, bn, 1);
    fill(pageable, 4096, 2);

    assert_int_equal(stoke_copy_h2d_async(buf, 0, NULL, 16, s), STOKE_EINVAL);
    assert_int_equal(stoke_copy_d2h_async(NULL, buf, 0, 16, s), STOKE_EINVAL);
    assert_int_equal(stoke_copy_h2d_async(buf, 0, pin, 4000, s), STOKE_OK);      /* pinned */
    assert_int_equal(stoke_copy_h2d_async(buf, 4000, pin, bn, s), STOKE_OK);     /* pinned */
    assert_int_equal(stoke_copy_h2d_async(buf, 0, pin + 4990, 20, s), STOKE_OK); /* straddles */
    assert_int_equal(stoke_copy_h2d_async(buf, 9000, pageable, 3000, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(pin, buf, 4000, 1000, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(pageable, buf, 9000, 100, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(pageable, buf, 0, 0, s), STOKE_OK); /* nothing moves */
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);

    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.h2d_copies, 4);
    assert_int_equal(c.h2d_pinned, 2);
    assert_int_equal(c.h2d_pageable, 2);
    assert_int_equal(c.h2d_bytes, 4000 + bn + 20 + 3000);
    assert_int_equal(c.d2h_copies, 2);
    assert_int_equal(c.d2h_pinned, 1);
    assert_int_equal(c.d2h_pageable, 1);
    assert_int_equal(c.d2h_bytes, 1100);
    assert_int_equal(c.copies_completed, 6);
    assert_int_equal(c.copies_failed, 0);
    assert_int_equal(c.device_allocs, 1);
    assert_int_equal(c.live_device_bytes, 1 << 16);
    /* pin[0..1000) now holds the device bytes at 4000, which came from pin[0..1000). */
    assert_true(check(pin, 1000, 1));

    stoke_device_buffer_destroy(buf);
    stoke_stream_destroy(s);
    assert_int_equal(vt->host_free(0, pin), STOKE_OK);
    free(pageable);
    assert_nothing_live();
}

/* With a copy delay the copy is still pending when copy_*_async returns; events order copies.
 * The EBUSY checks assume this thread is not stalled for two delays (300 ms) between queuing
 * and querying: they assert that copies are asynchronous, not how fast anything is. */
static void test_simdev_delayed_copies_are_async_and_ordered(void **state)
{
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", "150000"); /* 150 ms per copy */
    tu_use_simdev();
    stoke_stream *s;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *buf;
    assert_int_equal(stoke_device_buffer_create(s, 4096, &buf), STOKE_OK);
    stoke_event *e1, *e2;
    assert_int_equal(stoke_event_create(s, &e1), STOKE_OK);
    assert_int_equal(stoke_event_create(s, &e2), STOKE_OK);
    assert_int_equal(stoke_event_query(e1), STOKE_OK); /* never recorded */

    const stoke_backend *vt = sd();
    unsigned char *in = NULL, *out1 = NULL, *out2 = NULL;
    assert_int_equal(vt->host_alloc(0, 4096, (void **)&in), STOKE_OK);
    assert_int_equal(vt->host_alloc(0, 4096, (void **)&out1), STOKE_OK);
    assert_int_equal(vt->host_alloc(0, 4096, (void **)&out2), STOKE_OK);
    fill(in, 4096, 3);
    memset(out1, 0xEE, 4096);
    memset(out2, 0xEE, 4096);

    assert_int_equal(stoke_copy_h2d_async(buf, 0, in, 4096, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(out1, buf, 0, 4096, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e1, s), STOKE_OK);
    /* Queued, not run: e1 follows two delayed copies. */
    assert_int_equal(stoke_event_query(e1), STOKE_EBUSY);
    assert_int_equal(out1[0], 0xEE);

    /* The h2d below is queued after e1, so the d2h before e1 cannot see its bytes. */
    assert_int_equal(stoke_copy_h2d_async(buf, 0, out2 /* 0xEE */, 2048, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(out2 + 2048, buf, 0, 2048, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e2, s), STOKE_OK);
    assert_int_equal(stoke_event_query(e2), STOKE_EBUSY);

    assert_int_equal(stoke_event_synchronize(e2), STOKE_OK);
    assert_int_equal(stoke_event_query(e1), STOKE_OK); /* e2 completes after e1 */
    assert_int_equal(stoke_event_query(e2), STOKE_OK);
    assert_true(check(out1, 4096, 3)); /* the d2h saw the h2d queued before it */
    for (size_t i = 2048; i < 4096; i++)
        assert_int_equal(out2[i], 0xEE);

    /* Re-recording moves the marker: pending again until the new work ran. */
    assert_int_equal(stoke_copy_h2d_async(buf, 0, in, 16, s), STOKE_OK);
    assert_int_equal(stoke_copy_h2d_async(buf, 16, in, 16, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e1, s), STOKE_OK);
    assert_int_equal(stoke_event_query(e1), STOKE_EBUSY);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_int_equal(stoke_event_query(e1), STOKE_OK);

    stoke_event_destroy(e1);
    stoke_event_destroy(e2);
    stoke_device_buffer_destroy(buf);
    stoke_stream_destroy(s);
    assert_int_equal(vt->host_free(0, in), STOKE_OK);
    assert_int_equal(vt->host_free(0, out1), STOKE_OK);
    assert_int_equal(vt->host_free(0, out2), STOKE_OK);
    assert_nothing_live();
}

/* Without a delay, many alternating copies on one stream still run strictly in order. */
static void test_simdev_stream_order_without_delay(void **state)
{
    const stoke_backend *vt = sd();
    stoke_backend_stream *s;
    assert_int_equal(vt->stream_create(1, &s), STOKE_OK);
    void *dbuf;
    assert_int_equal(vt->device_alloc(1, 256, &dbuf), STOKE_OK);
    enum { N = 300 };
    static unsigned char in[N][256], out[N][256];
    for (int i = 0; i < N; i++) {
        fill(in[i], 256, (unsigned)i);
        assert_int_equal(vt->copy_h2d_async(dbuf, 0, in[i], 256, s), STOKE_OK);
        assert_int_equal(vt->copy_d2h_async(out[i], dbuf, 0, 256, s), STOKE_OK);
    }
    assert_int_equal(vt->stream_synchronize(s), STOKE_OK);
    for (int i = 0; i < N; i++)
        if (!check(out[i], 256, (unsigned)i))
            fail_msg("round trip %d saw another copy's bytes", i);

    /* Argument errors are reported at submission. */
    int stack;
    assert_int_equal(vt->copy_h2d_async(dbuf, 255, in[0], 2, s), STOKE_ERANGE);
    assert_int_equal(vt->copy_h2d_async(dbuf, 257, in[0], 0, s), STOKE_ERANGE);
    assert_int_equal(vt->copy_d2h_async(out[0], dbuf, 0, 257, s), STOKE_ERANGE);
    assert_int_equal(vt->copy_h2d_async(&stack, 0, in[0], 1, s), STOKE_EINVAL);
    assert_int_equal(vt->copy_d2h_async(NULL, dbuf, 0, 1, s), STOKE_EINVAL);
    void *other;
    assert_int_equal(vt->device_alloc(0, 256, &other), STOKE_OK);
    assert_int_equal(vt->copy_h2d_async(other, 0, in[0], 1, s), STOKE_EINVAL); /* device 0 */
    assert_int_equal(vt->device_free(1, other), STOKE_EINVAL);                 /* wrong device */
    assert_int_equal(vt->device_free(0, other), STOKE_OK);
    stoke_backend_event *e;
    assert_int_equal(vt->event_create(0, &e), STOKE_OK);
    assert_int_equal(vt->event_record(e, s), STOKE_EINVAL); /* event of device 0 */
    assert_int_equal(vt->event_destroy(e), STOKE_OK);
    stoke_backend_stream *none = NULL;
    assert_int_equal(vt->stream_create(2, &none), STOKE_ERANGE);
    assert_null(none);

    /* A buffer freed while a copy on it is still queued stays mapped until the copy ran. */
    assert_int_equal(vt->copy_h2d_async(dbuf, 0, in[1], 256, s), STOKE_OK);
    assert_int_equal(vt->device_free(1, dbuf), STOKE_OK);
    assert_int_equal(vt->stream_synchronize(s), STOKE_OK);
    assert_int_equal(vt->stream_destroy(s), STOKE_OK);
    assert_nothing_live();
}

/* ---- fault injection ---------------------------------------------------------------------- */

static void test_simdev_fail_alloc_names_the_injected_allocation(void **state)
{
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", "3");
    tu_use_simdev();
    const stoke_backend *vt = sd();
    void *a = NULL, *b = NULL;
    unsigned char heap[64];
    assert_int_equal(vt->host_alloc(0, 4096, &a), STOKE_OK);              /* #1 */
    assert_int_equal(vt->host_register(0, heap, sizeof(heap)), STOKE_OK); /* #2 */
    stoke_stream *s;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *buf = (stoke_device_buffer *)1;
    assert_int_equal(stoke_device_buffer_create(s, 1024, &buf), STOKE_ENOMEM); /* #3 */
    assert_null(buf);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "injected allocation failure"), 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_SIMDEV_FAIL_ALLOC=3"), 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "device_alloc of 1024 bytes"), 1);
    /* The backend's reason follows the host's message once, without its "simdev: " again. */
    assert_string_equal(stoke_last_error(),
                        "simdev: allocating 1024 bytes on device 0 failed: injected allocation "
                        "failure: device_alloc of 1024 bytes on device 0 is allocation #3 "
                        "(STOKE_SIMDEV_FAIL_ALLOC=3)");
    /* Only the third fails. */
    assert_int_equal(stoke_device_buffer_create(s, 1024, &buf), STOKE_OK); /* #4 */
    assert_int_equal(vt->host_alloc(0, 4096, &b), STOKE_OK);               /* #5 */
    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.allocs_failed, 1);
    assert_int_equal(c.device_allocs, 1);
    assert_int_equal(c.host_allocs, 2);
    assert_int_equal(c.live_device_buffers, 1);
    stoke_device_buffer_destroy(buf);
    stoke_stream_destroy(s);
    assert_int_equal(vt->host_free(0, a), STOKE_OK);
    assert_int_equal(vt->host_free(0, b), STOKE_OK);
    assert_int_equal(vt->host_unregister(0, heap), STOKE_OK);
    assert_nothing_live();

    /* The first allocation can be the one, and a host_register counts. */
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", "1");
    vt = sd();
    assert_int_equal(vt->host_register(0, heap, sizeof(heap)), STOKE_ENOMEM);
    int on = 1;
    assert_int_equal(vt->is_pinned(heap, &on), STOKE_OK);
    assert_int_equal(on, 0);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "host_register of 64 bytes on device 0 is "
                                                  "allocation #1"),
                     1);
    assert_nothing_live();

    /* Device memory runs out like a real device's. */
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", NULL);
    tu_env("STOKE_SIMDEV_MEMORY", "64K");
    vt = sd();
    void *d1, *d2;
    assert_int_equal(vt->device_alloc(0, 40 << 10, &d1), STOKE_OK);
    assert_int_equal(vt->device_alloc(0, 40 << 10, &d2), STOKE_ENOMEM);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "out of memory on device 0"), 1);
    assert_int_equal(vt->device_alloc(1, 40 << 10, &d2), STOKE_OK); /* the other device */
    assert_int_equal(vt->device_free(0, d1), STOKE_OK);
    assert_int_equal(vt->device_free(1, d2), STOKE_OK);
    assert_nothing_live();
}

/* The N-th copy fails asynchronously: its submission succeeds, the next marker reports it. */
static void test_simdev_fail_copy_is_reported_by_the_next_marker(void **state)
{
    tu_env("STOKE_SIMDEV_FAIL_COPY", "2");
    tu_use_simdev();
    stoke_stream *s;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *buf;
    assert_int_equal(stoke_device_buffer_create(s, 3 * 256, &buf), STOKE_OK);
    stoke_event *e[3];
    unsigned char in[3][256], out[3 * 256];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(stoke_event_create(s, &e[i]), STOKE_OK);
        fill(in[i], 256, 10u + (unsigned)i);
    }
    for (int i = 0; i < 3; i++) {
        assert_int_equal(stoke_copy_h2d_async(buf, (size_t)i * 256, in[i], 256, s), STOKE_OK);
        assert_int_equal(stoke_event_record(e[i], s), STOKE_OK);
    }
    assert_int_equal(stoke_event_synchronize(e[2]), STOKE_OK);
    assert_int_equal(stoke_event_synchronize(e[0]), STOKE_OK);
    /* The failure's reason reaches the caller's error, not only the log, each time it is
     * reported. */
    const char *want = "simdev: work before the event on device 0 failed: injected copy failure: "
                       "copy #2 (h2d, 256 bytes) on stream simdev-s0 failed "
                       "(STOKE_SIMDEV_FAIL_COPY=2)";
    assert_int_equal(stoke_event_synchronize(e[1]), STOKE_EBACKEND);
    assert_string_equal(stoke_last_error(), want);
    assert_int_equal(stoke_event_query(e[1]), STOKE_EBACKEND); /* as often as asked */
    assert_string_equal(stoke_last_error(), want);
    assert_int_equal(stoke_event_query(e[2]), STOKE_OK); /* delivered once */
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "injected copy failure: copy #2"), 2);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "STOKE_SIMDEV_FAIL_COPY=2"), 2);

    /* The failed copy left its destination untouched; the others landed. */
    memset(out, 0, sizeof(out));
    assert_int_equal(stoke_copy_d2h_async(out, buf, 0, sizeof(out), s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_true(check(out, 256, 10));
    for (int i = 256; i < 512; i++)
        assert_int_equal(out[i], 0);
    assert_true(check(out + 512, 256, 12));
    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.copies_failed, 1);
    assert_int_equal(c.copies_completed, 3);
    for (int i = 0; i < 3; i++)
        stoke_event_destroy(e[i]);
    stoke_device_buffer_destroy(buf);
    stoke_stream_destroy(s);

    /* With no event after it, the next stream synchronize reports it, once. */
    tu_env("STOKE_SIMDEV_FAIL_COPY", "1");
    const stoke_backend *vt = sd();
    stoke_backend_stream *bs;
    void *d;
    assert_int_equal(vt->stream_create(0, &bs), STOKE_OK);
    assert_int_equal(vt->device_alloc(0, 256, &d), STOKE_OK);
    assert_int_equal(vt->copy_h2d_async(d, 0, in[0], 256, bs), STOKE_OK);
    assert_int_equal(vt->copy_h2d_async(d, 0, in[1], 256, bs), STOKE_OK);
    stoke__clear_error();
    assert_int_equal(vt->stream_synchronize(bs), STOKE_EBACKEND);
    assert_non_null(strstr(stoke_last_error(), "simdev: injected copy failure: copy #1 (h2d, 256 "
                                               "bytes)"));
    stoke__clear_error();
    assert_int_equal(vt->stream_synchronize(bs), STOKE_OK);
    assert_string_equal(stoke_last_error(), "");
    assert_int_equal(vt->copy_d2h_async(out, d, 0, 256, bs), STOKE_OK);
    assert_int_equal(vt->stream_synchronize(bs), STOKE_OK);
    assert_true(check(out, 256, 11));
    assert_int_equal(vt->device_free(0, d), STOKE_OK);
    assert_int_equal(vt->stream_destroy(bs), STOKE_OK);
    assert_nothing_live();
}

/* ---- threads ------------------------------------------------------------------------------ */

typedef struct dev_job {
    int dev;
    int rounds;
    int ok;
    char err[128];
} dev_job;

static void *dev_worker(void *arg)
{
    dev_job *j = arg;
    stoke_stream *s = NULL;
    stoke_device_buffer *buf = NULL;
    stoke_event *e = NULL;
    unsigned char in[1024], out[1024];
    if (stoke_device_set(j->dev) != STOKE_OK || stoke_stream_create(NULL, &s) != STOKE_OK ||
        stoke_stream_device(s) != j->dev || stoke_device_buffer_create(s, 1024, &buf) != STOKE_OK ||
        stoke_event_create(s, &e) != STOKE_OK) {
        snprintf(j->err, sizeof(j->err), "setup on device %d: %s", j->dev, stoke_last_error());
        goto out;
    }
    for (int r = 0; r < j->rounds; r++) {
        unsigned seed = (unsigned)(j->dev * 1000 + r);
        fill(in, sizeof(in), seed);
        if (stoke_copy_h2d_async(buf, 0, in, sizeof(in), s) != STOKE_OK ||
            stoke_copy_d2h_async(out, buf, 0, sizeof(out), s) != STOKE_OK ||
            stoke_event_record(e, s) != STOKE_OK || stoke_event_synchronize(e) != STOKE_OK) {
            snprintf(j->err, sizeof(j->err), "round %d: %s", r, stoke_last_error());
            goto out;
        }
        if (!check(out, sizeof(out), seed)) {
            snprintf(j->err, sizeof(j->err), "round %d on device %d: wrong bytes", r, j->dev);
            goto out;
        }
    }
    j->ok = 1;
out:
    stoke_event_destroy(e);
    stoke_device_buffer_destroy(buf);
    stoke_stream_destroy(s);
    return NULL;
}

static void test_simdev_two_devices_from_two_threads(void **state)
{
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    dev_job jobs[2] = {{.dev = 0, .rounds = 100}, {.dev = 1, .rounds = 100}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        assert_int_equal(pthread_create(&t[i], NULL, dev_worker, &jobs[i]), 0);
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < 2; i++)
        if (!jobs[i].ok)
            fail_msg("%s", jobs[i].err);
    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.h2d_copies, 200);
    assert_int_equal(c.d2h_copies, 200);
    assert_int_equal(c.h2d_pageable, 200); /* stack buffers */
    assert_nothing_live();
}

typedef struct pin_job {
    const stoke_backend *vt;
    int ok;
} pin_job;

/* Allocations, registrations and queries from several threads at once (for TSan). */
static void *pin_worker(void *arg)
{
    pin_job *j = arg;
    const stoke_backend *vt = j->vt;
    unsigned char *heap = malloc(4096);
    if (!heap)
        return NULL;
    for (int r = 0; r < 50; r++) {
        void *p = NULL;
        int a, b, c;
        if (vt->host_alloc(r & 1, 4096 * (size_t)(1 + r % 3), &p) != STOKE_OK ||
            vt->host_register(0, heap, 4096) != STOKE_OK || vt->is_pinned(p, &a) != STOKE_OK ||
            vt->is_pinned(heap + 4095, &b) != STOKE_OK || !a || !b ||
            vt->host_unregister(0, heap) != STOKE_OK || vt->is_pinned(heap, &c) != STOKE_OK || c ||
            vt->host_free(r & 1, p) != STOKE_OK)
            goto out;
    }
    j->ok = 1;
out:
    free(heap);
    return NULL;
}

static void test_simdev_pinned_table_from_many_threads(void **state)
{
    const stoke_backend *vt = sd();
    enum { T = 4 };
    pin_job jobs[T];
    pthread_t t[T];
    for (int i = 0; i < T; i++) {
        jobs[i] = (pin_job){.vt = vt};
        assert_int_equal(pthread_create(&t[i], NULL, pin_worker, &jobs[i]), 0);
    }
    for (int i = 0; i < T; i++)
        pthread_join(t[i], NULL);
    for (int i = 0; i < T; i++)
        assert_true(jobs[i].ok);
    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.host_allocs, 50 * T);
    assert_int_equal(c.host_registers, 50 * T);
    assert_nothing_live();
}

/* Shutdown with work still queued cancels it, joins every thread and frees everything. */
static void test_simdev_shutdown_with_work_queued(void **state)
{
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", "5000000"); /* 5 s: shutdown must not wait for it */
    const stoke_backend *vt = sd();
    stoke_backend_stream *s[2];
    void *d[2];
    static unsigned char host[2][512];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(vt->stream_create(i, &s[i]), STOKE_OK);
        assert_int_equal(vt->device_alloc(i, 512, &d[i]), STOKE_OK);
        stoke_backend_event *e;
        assert_int_equal(vt->event_create(i, &e), STOKE_OK);
        for (int k = 0; k < 5; k++)
            assert_int_equal(vt->copy_h2d_async(d[i], 0, host[i], 512, s[i]), STOKE_OK);
        assert_int_equal(vt->event_record(e, s[i]), STOKE_OK);
        assert_int_equal(vt->event_query(e), STOKE_EBUSY);
        if (i == 1)
            assert_int_equal(vt->event_destroy(e), STOKE_OK); /* destroyed while pending */
    }
    void *h;
    assert_int_equal(vt->host_alloc(0, 4096, &h), STOKE_OK);
    /* Streams, a buffer each, one event left, a pinned block: all left for shutdown. */
    tu_use_none(); /* registry reset: simdev shutdown, then dlclose */
    /* Leak checkers (ASan) and TSan see any thread or block shutdown missed. */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_simdev_is_the_accelerator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simdev_bad_env_warns_and_falls_back, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simdev_probe_failures_name_their_cause, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_entry_point_and_counters_abi, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simdev_device_memory_faults_on_cpu_access, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_is_pinned_exact_bounds, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simdev_pinned_and_pageable_accounting, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_delayed_copies_are_async_and_ordered, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_stream_order_without_delay, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simdev_fail_alloc_names_the_injected_allocation, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_fail_copy_is_reported_by_the_next_marker, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_two_devices_from_two_threads, setup, teardown),
        cmocka_unit_test_setup_teardown(test_simdev_pinned_table_from_many_threads, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_simdev_shutdown_with_work_queued, setup, teardown),
    };
    return cmocka_run_group_tests_name("simdev", tests, NULL, NULL);
}
