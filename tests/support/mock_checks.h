/* Checks the cuda and hip mock tests both run against a mock GPU (mock_gpu.h), through the
 * public API and the backend table: queued copies and events, registration refused by the
 * driver, and the loader's device path with a slow copy engine, where every staging slot and
 * batch buffer must stay untouched until its copy has run (which only correct event record /
 * query / synchronize calls in the backend guarantee).  Header-only (static), like
 * test_loader_ds.h; include it in one test file. */
#ifndef STOKE_TEST_MOCK_CHECKS_H
#define STOKE_TEST_MOCK_CHECKS_H

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../test_loader_ds.h"
#include "mock_gpu.h"
#include "stoke/backend.h"
#include "testutil.h"

#define MC_SAMPLES 480
#define MC_BATCH   8

/* Makes `backend` the explicitly chosen accelerator (STOKE_ACCELERATOR) and probes it; returns
 * the status and copies the reason. */
static int mc_select(const char *backend, char *reason, size_t len)
{
    tu_env("STOKE_ACCELERATOR", backend);
    stoke_accelerator_info ai;
    int rc = stoke_accelerator_get(&ai);
    snprintf(reason, len, "%s", ai.reason);
    return rc;
}

/* mc_select, failing the test (with the reason) unless `backend` is available. */
static void mc_use(const char *backend)
{
    char reason[256];
    if (mc_select(backend, reason, sizeof(reason)) != STOKE_OK)
        fail_msg("%s is not available: %s", backend, reason);
}

/* One shuffled epoch of 480 samples in batches of 8 with `device` ("cuda", "hip") as the
 * loader's device and a copy engine sleeping `delay_us` before each copy.  The first batch is
 * delivered while the engine is held: its event must say not-ready.  Then two batches of every
 * three are released at once without waiting (their staging slots and buffers go back while
 * copies are queued) and the third is kept until two more kept ones arrived, then checked
 * byte by byte on the device.  Every sample is delivered exactly once, and no memory is freed
 * while a copy still uses it. */
static void mc_device_run(const char *device, int workers, int in_order, unsigned delay_us)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, MC_SAMPLES);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = MC_BATCH;
    o.num_workers = workers;
    o.in_order = in_order;
    o.shuffle = 1;
    o.seed = 11;
    o.device = device;
    stoke_loader *l = NULL;
    if (stoke_loader_create(&o, &ds, &l) != STOKE_OK)
        fail_msg("loader on %s: %s", device, stoke_last_error());
    unsigned long copies_before = mg_copies_run();
    mg_set_delay_us(delay_us);

    stoke_batch *b = NULL;
    mg_hold(1);
    int rc = stoke_loader_next(l, &b);
    int query = rc == STOKE_OK ? stoke_event_query(stoke_batch_device_event(b)) : rc;
    mg_hold(0); /* before any assertion: a failed test must not leave the engine held */
    assert_int_equal(rc, STOKE_OK);
    if (query != STOKE_EBUSY)
        fail_msg("the first batch's copy cannot have run, yet its event says %s",
                 stoke_err_name(query));

    unsigned char seen[MC_SAMPLES] = {0};
    tds_keeper keep = {0};
    do {
        assert_null(stoke_batch_data(b, 0)); /* the device buffer is the batch */
        assert_true(stoke_batch_is_pinned(b));
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            uint64_t i = stoke_batch_indices(b)[j];
            assert_true(i < MC_SAMPLES);
            if (seen[i]++)
                fail_msg("sample %llu delivered twice", (unsigned long long)i);
        }
        tds_keeper_add(&keep, b);
    } while ((rc = stoke_loader_next(l, &b)) == STOKE_OK);
    if (rc != STOKE_EEND)
        fail_msg("batch %llu: %s: %s", (unsigned long long)keep.nb, stoke_err_name(rc),
                 stoke_loader_last_error(l));
    tds_keeper_finish(&keep);
    uint64_t nb = keep.nb;
    assert_int_equal(nb, MC_SAMPLES / MC_BATCH);
    for (size_t i = 0; i < MC_SAMPLES; i++)
        if (seen[i] != 1)
            fail_msg("sample %zu delivered %d times", i, seen[i]);
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.device_copies, nb);
    assert_int_equal(st.device_errors, 0);
    stoke_loader_destroy(l);
    tds_free(&t);
    mg_set_delay_us(0);
    /* Two fields per batch went through the engine, and one read back per field checked. */
    assert_true(mg_copies_run() - copies_before >= 2u * nb);
    assert_int_equal(mg_hazards(), 0);
}

/* Copies run later, on the engine: stream and event synchronization must wait for them, and an
 * event is not done before the work recorded ahead of it ran.  The backend is the current
 * accelerator, with nothing else going on. */
static void mc_async_copies(void)
{
    size_t n = 65536;
    unsigned char *src = NULL, *back = NULL;
    assert_int_equal(stoke_pinned_alloc(n, (void **)&src), STOKE_OK);
    assert_int_equal(stoke_pinned_alloc(n, (void **)&back), STOKE_OK);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, n, &d), STOKE_OK);
    stoke_event *e = NULL;
    assert_int_equal(stoke_event_create(s, &e), STOKE_OK);
    unsigned long ran = mg_copies_run();
    mg_set_delay_us(20000); /* a synchronize that did not wait would find `back` unchanged */

    memset(src, 0x5a, n);
    memset(back, 0, n);
    assert_int_equal(stoke_copy_h2d_async(d, 0, src, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, 0, n, s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(back, src, n);

    memset(src, 0xa5, n);
    assert_int_equal(stoke_copy_h2d_async(d, 0, src, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, 0, n, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e, s), STOKE_OK);
    assert_int_equal(stoke_event_synchronize(e), STOKE_OK);
    assert_memory_equal(back, src, n);

    /* Recorded again behind more work: not done until that work ran. */
    mg_hold(1);
    int rc = stoke_copy_h2d_async(d, 0, src, n, s);
    if (rc == STOKE_OK)
        rc = stoke_event_record(e, s);
    int query = rc == STOKE_OK ? stoke_event_query(e) : rc;
    mg_hold(0); /* before any assertion: a failed test must not leave the engine held */
    assert_int_equal(rc, STOKE_OK);
    assert_int_equal(query, STOKE_EBUSY);
    assert_int_equal(stoke_event_synchronize(e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK);
    assert_int_equal(mg_copies_run() - ran, 5);
    mg_set_delay_us(0);

    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(stoke_pinned_free(src), STOKE_OK);
    assert_int_equal(stoke_pinned_free(back), STOKE_OK);
    assert_int_equal(mg_hazards(), 0);
}

/* Registration through backend `vt` (device 0) of memory already page-locked by someone else
 * in the process, in part or whole, registered or allocated: the driver refuses, and the
 * backend says STOKE_EINVAL with the driver's words (`refusal`, for a 65536-byte request) and
 * tracks nothing.  Then one registration of the same memory, once free, and a second one
 * overlapping it, refused by the backend itself: the driver sees one register, one
 * unregister. */
static void mc_register_refusals(const stoke_backend *vt, const char *refusal)
{
    char *mem = NULL;
    assert_int_equal(posix_memalign((void **)&mem, 4096, 65536), 0);
    assert_int_equal(mg_pin_add(mem + 8192, 4096, MG_PIN_REGISTERED), 0); /* by someone else */
    assert_int_equal(vt->host_register(0, mem, 65536), STOKE_EINVAL);
    if (!strstr(stoke_last_error(), refusal))
        fail_msg("last error: %s", stoke_last_error());
    assert_int_equal(vt->host_register(0, mem + 8192, 4096), STOKE_EINVAL); /* the same range */
    assert_int_equal(vt->host_unregister(0, mem + 8192), STOKE_EINVAL);     /* never ours */
    assert_int_equal(mg_pin_remove(mem + 8192, MG_PIN_REGISTERED), 0);
    assert_int_equal(mg_pin_add(mem, 4096, MG_PIN_ALLOC), 0); /* allocated pinned elsewhere */
    assert_int_equal(vt->host_register(0, mem, 4096), STOKE_EINVAL);
    assert_int_equal(mg_pin_remove(mem, MG_PIN_ALLOC), 0);

    assert_int_equal(vt->host_register(0, mem, 65536), STOKE_OK);
    assert_int_equal(mg_pin_kind(mem + 65535), MG_PIN_REGISTERED);
    assert_int_equal(vt->host_register(0, mem + 4096, 4096), STOKE_EINVAL);
    assert_int_equal(vt->host_unregister(0, mem), STOKE_OK);
    assert_int_equal(mg_pin_kind(mem), 0);
    free(mem);
}

/* CTest's SKIP_RETURN_CODE (tests/test_cuda_mock.cmake, tests/test_hip_mock.cmake). */
#define MC_SKIP_RETURN_CODE 77

/* Runs `test` alone, the check of a backend's reason when none of its `count` default library
 * `names` can be loaded; where one loads, that outcome cannot be forced: reports SKIP. */
static int mc_run_default_library_test(const char *const *names, size_t count,
                                       const struct CMUnitTest *test)
{
    for (size_t i = 0; i < count; i++) {
        void *h = dlopen(names[i], RTLD_LAZY);
        if (h) {
            dlclose(h);
            printf("[  SKIPPED ] %s: %s is installed here\n", test->name, names[i]);
            return MC_SKIP_RETURN_CODE;
        }
    }
    return _cmocka_run_group_tests("default library", test, 1, NULL, NULL);
}

#endif
