/* The loader's device path against a mock GPU (mock_gpu.h) whose copy engine is slow, for the
 * cuda and hip mock tests: every staging slot and batch buffer must stay untouched until its
 * copy has run, which only correct event record / query / synchronize calls in the backend
 * guarantee.  Header-only (static), like test_loader_ds.h; include it in one test file. */
#ifndef STOKE_TEST_MOCK_LOADER_H
#define STOKE_TEST_MOCK_LOADER_H

#include "../test_loader_ds.h"
#include "mock_gpu.h"
#include "testutil.h"

#define ML_SAMPLES 480
#define ML_BATCH 8

/* Waits for batch b's copy, then reads both fields back from the device and compares them with
 * the samples its indices name. */
static void ml_check_batch(stoke_batch *b)
{
    unsigned char data[ML_BATCH * DS_BYTES];
    int64_t labels[ML_BATCH];
    size_t n = stoke_batch_count(b);
    assert_true(n <= ML_BATCH);
    assert_int_equal(stoke_batch_device_wait(b), STOKE_OK);
    assert_int_equal(stoke_event_query(stoke_batch_device_event(b)), STOKE_OK);
    assert_int_equal(stoke_batch_device_read(b, 0, data), STOKE_OK);
    assert_int_equal(stoke_batch_device_read(b, 1, labels), STOKE_OK);
    const uint64_t *idx = stoke_batch_indices(b);
    for (size_t j = 0; j < n; j++) {
        if ((uint64_t)labels[j] != idx[j])
            fail_msg("batch %llu, sample %zu: label %lld on the device, %llu expected",
                     (unsigned long long)stoke_batch_seq(b), j, (long long)labels[j],
                     (unsigned long long)idx[j]);
        for (size_t k = 0; k < DS_BYTES; k++)
            if (data[j * DS_BYTES + k] != tds_byte(idx[j], k))
                fail_msg("batch %llu, sample %llu: byte %zu differs on the device",
                         (unsigned long long)stoke_batch_seq(b), (unsigned long long)idx[j], k);
    }
}

/* One shuffled epoch of 480 samples in batches of 8 with `device` ("cuda", "hip") as the
 * loader's device and a copy engine sleeping `delay_us` before each copy.  The first batch is
 * delivered while the engine is held: its event must say not-ready.  Then two batches of every
 * three are released at once without waiting (their staging slots and buffers go back while
 * copies are queued) and the third is kept until two more kept ones arrived, then checked
 * byte by byte on the device.  Every sample is delivered exactly once, and no memory is freed
 * while a copy still uses it. */
static void ml_device_run(const char *device, int workers, int in_order, unsigned delay_us)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, ML_SAMPLES);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = ML_BATCH;
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

    unsigned char seen[ML_SAMPLES] = {0};
    stoke_batch *kept[2] = {NULL, NULL};
    unsigned nb = 0, nkept = 0;
    do {
        assert_null(stoke_batch_data(b, 0)); /* the device buffer is the batch */
        assert_true(stoke_batch_is_pinned(b));
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            uint64_t i = stoke_batch_indices(b)[j];
            assert_true(i < ML_SAMPLES);
            if (seen[i]++)
                fail_msg("sample %llu delivered twice", (unsigned long long)i);
        }
        if (nb++ % 3) {
            stoke_batch_release(b);
            continue;
        }
        stoke_batch *old = kept[nkept % 2];
        if (old) {
            ml_check_batch(old);
            stoke_batch_release(old);
        }
        kept[nkept++ % 2] = b;
    } while (stoke_loader_next(l, &b) == STOKE_OK);
    for (int i = 0; i < 2; i++)
        if (kept[i]) {
            ml_check_batch(kept[i]);
            stoke_batch_release(kept[i]);
        }
    assert_int_equal(nb, ML_SAMPLES / ML_BATCH);
    for (size_t i = 0; i < ML_SAMPLES; i++)
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

#endif
