/* Loader core: order, shuffle, determinism across worker counts, drop_last, out-of-order
 * delivery, timeout, sample errors, early destroy, persistent workers, save/restore, stats. */
#include "testutil.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "test_loader_ds.h"

static stoke_loader_opts base_opts(size_t bs, int workers)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = bs;
    o.num_workers = workers;
    o.pin_memory = 0; /* pinning is test_loader_pin's subject */
    return o;
}

/* Runs one epoch; stores the delivered indices in order (up to cap) and returns the count of
 * samples.  Checks every batch's bytes. */
static uint64_t run_epoch(stoke_loader *l, uint64_t *out, uint64_t cap, uint64_t *nbatches)
{
    stoke_batch *b;
    uint64_t n = 0, nb = 0;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        const uint64_t *idx = stoke_batch_indices(b);
        for (size_t j = 0; j < stoke_batch_count(b); j++, n++)
            if (out && n < cap)
                out[n] = idx[j];
        nb++;
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND); /* sticky */
    if (nbatches)
        *nbatches = nb;
    return n;
}

static void test_sequential_order(void **state)
{
    tu_use_none();
    static const int workers[] = {0, 1, 3};
    for (size_t w = 0; w < 3; w++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 100);
        stoke_loader_opts o = base_opts(8, workers[w]);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        assert_int_equal(stoke_loader_num_batches(l), 13);
        stoke_batch *b;
        uint64_t expect = 0, seq = 0;
        while (stoke_loader_next(l, &b) == STOKE_OK) {
            assert_int_equal(stoke_batch_seq(b), seq++);
            assert_int_equal(stoke_batch_count(b), seq == 13 ? 4 : 8);
            for (size_t j = 0; j < stoke_batch_count(b); j++)
                assert_int_equal(stoke_batch_indices(b)[j], expect++);
            assert_true(tds_batch_ok(b));
            int64_t shape[TU_DIMS + 1];
            int ndim = -7, dtype = -7;
            assert_int_equal(stoke_batch_shape(b, 0, shape, TU_DIMS + 1, &ndim), STOKE_OK);
            assert_int_equal(ndim, 2);
            assert_int_equal(shape[0], (int64_t)stoke_batch_count(b));
            assert_int_equal(shape[1], DS_BYTES);
            assert_int_equal(stoke_batch_shape(b, 1, shape, TU_DIMS + 1, &ndim), STOKE_OK);
            assert_int_equal(ndim, 1);
            assert_int_equal(stoke_batch_dtype(b, 1, &dtype), STOKE_OK);
            assert_int_equal(dtype, STOKE_DTYPE_I64);
            /* a bad field or NULL is a status code with a reason, the outputs untouched */
            ndim = dtype = -7;
            assert_int_equal(stoke_batch_shape(b, 2, shape, TU_DIMS + 1, &ndim), STOKE_EINVAL);
            assert_string_equal(stoke_last_error(),
                                "stoke_batch_shape: no field 2 (the batch has 2)");
            assert_int_equal(stoke_batch_shape(b, 0, NULL, TU_DIMS + 1, &ndim), STOKE_EINVAL);
            assert_int_equal(stoke_batch_shape(b, 0, shape, 1, &ndim), STOKE_ERANGE);
            assert_int_equal(ndim, 2); /* the room it needs */
            assert_int_equal(stoke_batch_ndim(b, 0), 2);
            ndim = -7;
            assert_int_equal(stoke_batch_shape(b, 0, shape, TU_DIMS + 1, NULL), STOKE_EINVAL);
            assert_int_equal(stoke_batch_shape(NULL, 0, shape, TU_DIMS + 1, &ndim), STOKE_EINVAL);
            assert_int_equal(stoke_batch_dtype(b, -1, &dtype), STOKE_EINVAL);
            assert_string_equal(stoke_last_error(),
                                "stoke_batch_dtype: no field -1 (the batch has 2)");
            assert_int_equal(stoke_batch_dtype(NULL, 0, &dtype), STOKE_EINVAL);
            assert_int_equal(stoke_batch_dtype(b, 0, NULL), STOKE_EINVAL);
            assert_int_equal(ndim, -7);
            assert_int_equal(dtype, -7);
            assert_int_equal(stoke_batch_field_bytes(b, 1), 8 * stoke_batch_count(b));
            assert_string_equal(stoke_batch_field(b, 1)->name, "label");
            assert_null(stoke_batch_data(b, 2));
            assert_false(stoke_batch_is_pinned(b));
            assert_null(stoke_batch_device_buffer(b));
            stoke_batch_release(b);
        }
        assert_int_equal(expect, 100);
        stoke_loader_stats st = {.size = sizeof(st)};
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        assert_int_equal(st.samples, 100);
        assert_int_equal(st.batches, 13);
        assert_int_equal(st.bytes, 100 * (DS_BYTES + 8));
        assert_int_equal(st.pageable_batches, 13);
        assert_int_equal(st.pinned_batches, 0);
        assert_true(st.wait_p99_s >= st.wait_p50_s);
        if (!workers[w]) { /* the caller made every batch: its wait holds every batch's time */
            assert_true(st.worker_busy_s > 0);
            assert_true(st.wait_s >= st.worker_busy_s);
            assert_true(st.wait_p50_s > 0);
        }
        assert_true(st.buffers <= (uint64_t)(2 * (workers[w] ? workers[w] : 1) + 2));
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

static void test_shuffle_epochs(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 1000);
    stoke_loader_opts o = base_opts(10, 2);
    o.shuffle = 1;
    o.seed = 77;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    uint64_t *a = calloc(1000, 8), *b = calloc(1000, 8);
    assert_int_equal(run_epoch(l, a, 1000, NULL), 1000);
    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
    assert_int_equal(stoke_loader_epoch(l), 1);
    assert_int_equal(run_epoch(l, b, 1000, NULL), 1000);
    tu_seen sa, sb;
    tu_seen_init(&sa, 1000);
    tu_seen_init(&sb, 1000);
    int same = 0, sorted = 0;
    for (int i = 0; i < 1000; i++) {
        tu_seen_add(&sa, a[i]);
        tu_seen_add(&sb, b[i]);
        same += a[i] == b[i];
        sorted += a[i] == (uint64_t)i;
    }
    tu_seen_check_all(&sa);
    tu_seen_check_all(&sb);
    assert_true(same < 100);
    assert_true(sorted < 100);
    free(a);
    free(b);
    tu_seen_free(&sa);
    tu_seen_free(&sb);
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_same_seed_any_workers(void **state)
{
    uint64_t *ref = NULL;
    static const int workers[] = {0, 1, 4};
    for (size_t w = 0; w < 3; w++) {
        for (int in_order = 1; in_order >= 0; in_order--) {
            if (!in_order && workers[w] == 0)
                continue;
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, 500);
            stoke_loader_opts o = base_opts(16, workers[w]);
            o.shuffle = 1;
            o.seed = 1234;
            o.epoch = 3;
            o.in_order = in_order;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            uint64_t *got = calloc(500, 8);
            assert_int_equal(run_epoch(l, got, 500, NULL), 500);
            if (!ref) {
                ref = got;
            } else if (in_order) {
                assert_memory_equal(ref, got, 500 * 8);
                free(got);
            } else { /* as completed: every sample exactly once */
                tu_seen seen;
                tu_seen_init(&seen, 500);
                for (int i = 0; i < 500; i++)
                    tu_seen_add(&seen, got[i]);
                tu_seen_check_all(&seen);
                tu_seen_free(&seen);
                free(got);
            }
            stoke_loader_destroy(l);
            tds_free(&t);
        }
    }
    free(ref);
}

static void test_drop_last(void **state)
{
    for (int drop = 0; drop < 2; drop++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 103);
        stoke_loader_opts o = base_opts(10, 2);
        o.drop_last = drop;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        uint64_t nb;
        uint64_t n = run_epoch(l, NULL, 0, &nb);
        assert_int_equal(nb, drop ? 10 : 11);
        assert_int_equal(n, drop ? 100 : 103);
        assert_int_equal(stoke_loader_num_batches(l), nb);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* Sample 5 (batch 1) blocks until the consumer has received a later batch: with in_order = 0
 * the later batches come first, deterministically. */
static void test_out_of_order(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 64);
    t.slow_index = 5;
    stoke_loader_opts o = base_opts(4, 2);
    o.in_order = 0;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    unsigned char seen[16] = {0};
    int pos = 0, pos_of_1 = -1, later_before_1 = 0;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        uint64_t s = stoke_batch_seq(b);
        assert_true(s < 16);
        assert_int_equal(seen[s]++, 0);
        assert_true(tds_batch_ok(b));
        if (s == 1)
            pos_of_1 = pos;
        else if (s > 1 && pos_of_1 < 0) {
            later_before_1++;
            tds_open_gate(&t);
        }
        pos++;
        stoke_batch_release(b);
    }
    assert_int_equal(pos, 16);
    assert_true(later_before_1 >= 1);
    assert_true(pos_of_1 > 0);
    stoke_loader_state st;
    stoke_loader_save_state(l, &st);
    assert_int_equal(st.cursor, 16);
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_timeout(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 64);
    t.slow_index = 5;
    /* One worker: batch 0 is complete before sample 5 (batch 1) starts, so the first next()
     * cannot time out on sample 5 however slowly threads start on a busy machine; with two, the
     * other worker could sit in sample 5 for the whole timeout before batch 0 was made.  The
     * timeout is long against one trivial sample (a preempted get() must not trip it). */
    stoke_loader_opts o = base_opts(4, 1);
    o.timeout_ms = 1000; /* (not 300: a loaded machine may preempt a trivial sample that long) */
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* batch 0 */
    assert_int_equal(stoke_batch_seq(b), 0);
    stoke_batch_release(b);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_ETIMEDOUT);
    const char *e = stoke_loader_last_error(l);
    assert_non_null(strstr(e, "sample 5 "));
    assert_non_null(strstr(e, "timeout"));
    assert_non_null(strstr(e, "worker"));
    assert_non_null(strstr(stoke_last_error(), "sample 5 "));
    /* At once, while sample 5 is still stuck: the EEND does not join its worker (it joined it,
     * and returned only when get() gave up after its 20 s). */
    time_t t0 = time(NULL);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
    assert_true(time(NULL) - t0 < 10);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
    tds_open_gate(&t); /* the stuck sample finishes; destroy joins its thread */
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* A stuck sample in the batch next() waits for times out with 1 and 2 workers: the caller's
 * thread does not make that batch itself (it blocked inside get() until the sample returned,
 * for ever if it never did). */
static void test_timeout_first_batch(void **state)
{
    for (int workers = 1; workers <= 2; workers++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 64);
        ds.worker_init = NULL; /* (with one the caller's thread never makes a batch) */
        t.slow_index = 0;
        stoke_loader_opts o = base_opts(4, workers);
        o.timeout_ms = 1000;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b;
        assert_int_equal(stoke_loader_next(l, &b), STOKE_ETIMEDOUT);
        const char *e = stoke_loader_last_error(l);
        assert_non_null(strstr(e, "sample 0 "));
        assert_null(strstr(e, "caller's thread")); /* a worker's sample, timed out while stuck */
        tds_open_gate(&t);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* opts.interrupted is asked while next() waits also when a timeout is set (the wait's slices
 * end at the earlier of 100 ms and the samples' deadline): nonzero returns STOKE_ECANCELED, and
 * the epoch goes on at the next call. */
static int interrupted_calls, interrupt_armed;
static int interrupt_now(void *user)
{
    (void)user;
    interrupted_calls += interrupt_armed;
    return interrupt_armed;
}

static void test_interrupted_with_timeout(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 64);
    t.slow_index = 5;
    stoke_loader_opts o = base_opts(4, 1);
    o.timeout_ms = 60000; /* never reached: the gate opens first */
    o.interrupted = interrupt_now;
    interrupted_calls = interrupt_armed = 0;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* batch 0 */
    stoke_batch_release(b);
    interrupt_armed = 1;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_ECANCELED); /* sample 5 waits */
    assert_true(interrupted_calls >= 1);
    interrupt_armed = 0;
    tds_open_gate(&t);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* the epoch went on */
    assert_int_equal(stoke_batch_seq(b), 1);
    assert_true(tds_batch_ok(b));
    stoke_batch_release(b);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* With opts.interrupted set, the caller's thread stops making batches itself once they take 50
 * ms or more on average: a batch it made put off the hook's next call by the batch's time (1 s
 * with 200 ms samples, where the hook is promised every 100 ms). */
static int interrupt_never(void *user)
{
    (void)user;
    return 0;
}

static void test_interrupted_slow_batches_not_made_by_the_caller(void **state)
{
    for (int hook = 0; hook <= 1; hook++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 48);
        ds.worker_init = NULL; /* (with one the caller's thread never makes a batch) */
        t.sleep_us = 15000;    /* 4 a batch: 60 ms */
        stoke_loader_opts o = base_opts(4, 1);
        o.interrupted = hook ? interrupt_never : NULL;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b;
        int n = 0;
        while (stoke_loader_next(l, &b) == STOKE_OK) {
            assert_true(tds_batch_ok(b));
            stoke_batch_release(b);
            n++;
        }
        assert_int_equal(n, 12);
        stoke_loader_stats st = {.size = sizeof(st)};
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        /* without the hook the caller makes about half; with it, at most the batches before
         * their average time was known (the first the worker finished) */
        if (hook)
            assert_true(st.assisted_batches <= 2);
        else
            assert_true(st.assisted_batches >= 3);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A batch released twice: the second release is ignored, with an error naming the batch (it
 * went on the released stack twice: a crash or a hang later), and the epoch goes on whole. */
static void test_double_release_is_ignored(void **state)
{
    for (int workers = 0; workers <= 2; workers += 2) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 64);
        stoke_loader_opts o = base_opts(8, workers);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        tu_log_capture();
        tu_log_clear();
        stoke_batch *b;
        int n = 0;
        while (stoke_loader_next(l, &b) == STOKE_OK) {
            assert_true(tds_batch_ok(b));
            uint64_t seq = stoke_batch_seq(b);
            stoke_batch_release(b);
            if (seq == 2) {
                stoke_batch_release(b);
                assert_non_null(strstr(stoke_last_error(), "batch 2 is not held"));
            }
            n++;
        }
        assert_int_equal(n, 8);
        assert_int_equal(tu_log_count(STOKE_LOG_ERROR, "released twice"), 1);
        stoke_log_set_callback(NULL, NULL);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

static void test_sample_error(void **state)
{
    static const int workers[] = {0, 3};
    for (size_t w = 0; w < 2; w++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 100);
        t.fail_index = 37; /* batch 4 */
        stoke_loader_opts o = base_opts(8, workers[w]);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b;
        for (uint64_t i = 0; i < 4; i++) {
            assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
            assert_int_equal(stoke_batch_seq(b), i);
            stoke_batch_release(b);
        }
        assert_int_equal(stoke_loader_next(l, &b), STOKE_EDATA);
        const char *e = stoke_loader_last_error(l);
        assert_non_null(strstr(e, "sample 37 "));
        assert_non_null(strstr(e, "row 37 is corrupt"));
        assert_non_null(strstr(e, "worker "));
        assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
        /* A new epoch starts again from the beginning. */
        assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
        assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
        assert_int_equal(stoke_batch_seq(b), 0);
        stoke_batch_release(b);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A worker thread's failing worker_init ends the epoch before its first batch, whichever
 * worker it is and however late it fails: worker 1 of 3 fails 100 ms in, after the others could
 * have made every batch (before, the epoch then ended STOKE_EEND and the failure was never
 * said: 5 runs in 40 without the sleep).  The message names the worker and the dataset; every
 * later epoch fails the same way, with persistent workers or with new ones. */
static void test_worker_init_fails_threads(void **state)
{
    (void)state;
    for (int persistent = 0; persistent <= 1; persistent++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 64);
        t.init_fail = 2;
        t.init_fail_us = 100000;
        stoke_loader_opts o = base_opts(8, 3);
        o.persistent_workers = persistent;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        for (uint64_t epoch = 0; epoch < 2; epoch++) {
            if (epoch)
                assert_int_equal(stoke_loader_set_epoch(l, epoch), STOKE_OK);
            stoke_batch *b = (stoke_batch *)&t;
            assert_int_equal(stoke_loader_next(l, &b), STOKE_EIO);
            assert_null(b);
            const char *e = stoke_loader_last_error(l);
            if (!strstr(e, "loader: worker 1: the worker_init of dataset ") ||
                !strstr(e, ds.name) || !strstr(e, "(STOKE_EIO)"))
                fail_msg("persistent %d, epoch %d: %s", persistent, (int)epoch, e);
            assert_string_equal(stoke_last_error(), e);
            assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
        }
        stoke_loader_destroy(l);
        assert_int_equal(atomic_load(&t.inits), persistent ? 3 : 6);
        tds_free(&t);
    }
}

/* A worker thread's worker_init is timed as a sample (timeout_ms): the consumer waits for every
 * worker_init before its first batch, so a hung one hung next() past its timeout (the review of
 * test_worker_init_fails_threads's change found it). */
static void test_worker_init_timeout(void **state)
{
    (void)state;
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 64);
    t.init_fail = 2;
    t.init_fail_us = 1500000; /* worker 1's worker_init sleeps 1.5 s and succeeds */
    t.init_slow_only = 1;
    stoke_loader_opts o = base_opts(8, 2);
    o.timeout_ms = 100;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_ETIMEDOUT);
    const char *e = stoke_loader_last_error(l);
    if (!strstr(e, "worker 1: its worker_init of testds took longer than the timeout of 100 ms"))
        fail_msg("the message: %s", e);
    stoke_loader_destroy(l); /* (joins worker 1 once its worker_init returned) */
    tds_free(&t);
}

/* A NULL argument is STOKE_EINVAL with stoke_last_error() naming the call: the loader's state,
 * epoch and stats calls, the device and event calls, the registry's getters.  Before, these
 * left whatever message an earlier call had set (status.h: the detail of a failure is in
 * stoke_last_error()). */
static void test_null_arguments_say_so(void **state)
{
    (void)state;
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 16);
    stoke_loader_opts o = base_opts(4, 0);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_stats stats;
    memset(&stats, 0, sizeof(stats)); /* (size 0) */
    uint64_t idx;
    static const char *const names[] = {
        "stoke_loader_set_epoch", "stoke_loader_next_epoch", "stoke_loader_save_state",
        "stoke_loader_restore_state", "stoke_loader_get_stats",
        "stoke_loader_get_stats: out->size is 0", "stoke_stream_create",
        "stoke_stream_synchronize", "stoke_event_create", "stoke_event_record",
        "stoke_event_query", "stoke_event_synchronize", "stoke_device_buffer_create",
        "stoke_accelerator_get", "stoke_backend_get_info", "stoke_device_get",
        "stoke_sampler_index"};
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        /* another message first: the call's own replaces it */
        stoke_dataset other;
        assert_int_not_equal(stoke_source_open("nosuchscheme:x", &other), STOKE_OK);
        char before[256];
        snprintf(before, sizeof(before), "%s", stoke_last_error());
        assert_true(before[0] != 0);
        int rc = 0;
        switch (i) {
        case 0: rc = stoke_loader_set_epoch(NULL, 1); break;
        case 1: rc = stoke_loader_next_epoch(NULL); break;
        case 2: rc = stoke_loader_save_state(l, NULL); break;
        case 3: rc = stoke_loader_restore_state(l, NULL); break;
        case 4: rc = stoke_loader_get_stats(NULL, &stats); break;
        case 5: rc = stoke_loader_get_stats(l, &stats); break;
        case 6: rc = stoke_stream_create(NULL, NULL); break;
        case 7: rc = stoke_stream_synchronize(NULL); break;
        case 8: rc = stoke_event_create(NULL, NULL); break;
        case 9: rc = stoke_event_record(NULL, NULL); break;
        case 10: rc = stoke_event_query(NULL); break;
        case 11: rc = stoke_event_synchronize(NULL); break;
        case 12: rc = stoke_device_buffer_create(NULL, 16, NULL); break;
        case 13: rc = stoke_accelerator_get(NULL); break;
        case 14: rc = stoke_backend_get_info(0, NULL); break;
        case 15: rc = stoke_device_get(NULL); break;
        default: rc = stoke_sampler_index(NULL, 0, 0, 0, &idx); break;
        }
        assert_int_equal(rc, STOKE_EINVAL);
        if (!strstr(stoke_last_error(), names[i]) || strcmp(before, stoke_last_error()) == 0)
            fail_msg("%s: the last error is '%s'", names[i], stoke_last_error());
    }
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_early_destroy(void **state)
{
    for (int round = 0; round < 6; round++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 5000);
        stoke_loader_opts o = base_opts(4, 1 + round % 4);
        o.shuffle = round & 1;
        o.in_order = round % 3 != 0;
        o.persistent_workers = round & 1;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b, *held = NULL;
        for (int i = 0; i < 3 + round; i++) {
            assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
            if (i == 1)
                held = b; /* still held at destroy: freed with the loader */
            else
                stoke_batch_release(b);
        }
        (void)held;
        stoke_loader_destroy(l);
        tds_free(&t);
    }
    stoke_loader_destroy(NULL);
    /* created and destroyed without a single next() */
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 10);
    stoke_loader_opts o = base_opts(4, 2);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_persistent_workers(void **state)
{
    static const int workers[] = {0, 3};
    for (size_t w = 0; w < 2; w++) {
        for (int persistent = 0; persistent < 2; persistent++) {
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, 40);
            stoke_loader_opts o = base_opts(4, workers[w]);
            o.persistent_workers = persistent;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            for (int e = 0; e < 3; e++) {
                if (e)
                    stoke_loader_next_epoch(l);
                assert_int_equal(run_epoch(l, NULL, 0, NULL), 40);
            }
            /* Counted after destroy: a persistent worker may not have run its worker_init yet
             * when the others already delivered every batch; destroy joins it. */
            stoke_loader_destroy(l);
            int per_start = workers[w] ? workers[w] : 1;
            assert_int_equal(atomic_load(&t.inits), persistent ? per_start : 3 * per_start);
            tds_free(&t);
        }
    }
}

/* This process's threads (the loader's workers are counted from the moment they are created;
 * their names come a little later). */
static int threads_now(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* threads_now() once it is `want`, or after 5 s whatever it is (a joined thread leaves
 * /proc/self/task a moment after pthread_join returned). */
static int threads_reach(int want)
{
    int n = threads_now();
    for (int i = 0; i < 5000 && n != want; i++) {
        tu_sleep_ms(1);
        n = threads_now();
    }
    return n;
}

/* threads_now() once it held still for 20 ms (the threads of the tests before still leaving). */
static int threads_settled(void)
{
    int n = threads_now();
    for (int same = 0, i = 0; same < 20 && i < 5000; i++) {
        tu_sleep_ms(1);
        int m = threads_now();
        same = m == n ? same + 1 : 0;
        n = m;
    }
    return n;
}

/* stoke_loader_interrupt (the caller is ending) and then the run abandoned with a batch still
 * held (the Python exit hook, for a loader whose batch outlives it): the persistent workers
 * are joined, not left idle, nor left finished and unjoined when one was still starting; the
 * next epoch starts them again (worker_init once more each) and is whole. */
static void test_interrupt_joins_persistent_workers(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 40);
    stoke_loader_opts o = base_opts(4, 2);
    o.persistent_workers = 1;
    int before = threads_settled();
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    assert_int_equal(threads_now(), before + 2);
    assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK); /* not interrupted: they stay */
    assert_int_equal(threads_now(), before + 2);
    stoke_loader_interrupt(l);
    assert_int_equal(stoke_loader_set_epoch(l, 2), STOKE_OK);
    assert_int_equal(threads_reach(before), before);
    assert_int_equal(atomic_load(&t.inits), 2);
    stoke_batch_release(b);
    assert_int_equal(run_epoch(l, NULL, 0, NULL), 40);
    stoke_loader_destroy(l);
    assert_int_equal(atomic_load(&t.inits), 4);
    tds_free(&t);
}

static void test_save_restore(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 200);
    stoke_loader_opts o = base_opts(7, 2);
    o.shuffle = 1;
    o.seed = 9;
    o.epoch = 2;
    stoke_loader *a;
    assert_int_equal(stoke_loader_create(&o, &ds, &a), STOKE_OK);
    tds_skip(a, 5);
    stoke_batch *b;
    stoke_loader_state st;
    assert_int_equal(stoke_loader_save_state(a, &st), STOKE_OK);
    assert_int_equal(st.seed, 9);
    assert_int_equal(st.epoch, 2);
    assert_int_equal(st.cursor, 5);
    uint64_t want[200], got[200];
    uint64_t nw = 0, ng = 0;
    while (stoke_loader_next(a, &b) == STOKE_OK) {
        for (size_t j = 0; j < stoke_batch_count(b); j++)
            want[nw++] = stoke_batch_indices(b)[j];
        stoke_batch_release(b);
    }
    assert_int_equal(nw, 200 - 35);
    /* A different loader (other worker count, other seed and epoch) restored from the state. */
    stoke_loader_opts o2 = base_opts(7, 3);
    o2.shuffle = 1;
    o2.seed = 1;
    stoke_loader *c;
    assert_int_equal(stoke_loader_create(&o2, &ds, &c), STOKE_OK);
    assert_int_equal(stoke_loader_next(c, &b), STOKE_OK); /* already running: restore moves it */
    stoke_batch_release(b);
    assert_int_equal(stoke_loader_restore_state(c, &st), STOKE_OK);
    while (stoke_loader_next(c, &b) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        for (size_t j = 0; j < stoke_batch_count(b); j++)
            got[ng++] = stoke_batch_indices(b)[j];
        stoke_batch_release(b);
    }
    assert_int_equal(ng, nw);
    assert_memory_equal(want, got, nw * 8);
    /* bad states */
    stoke_loader_state bad = st;
    bad.version = 99;
    assert_int_equal(stoke_loader_restore_state(c, &bad), STOKE_EINVAL);
    bad = st;
    bad.cursor = 1000;
    assert_int_equal(stoke_loader_restore_state(c, &bad), STOKE_EINVAL);
    /* at the end of the epoch: restoring gives EEND at once */
    bad = st;
    bad.cursor = stoke_loader_num_batches(c);
    assert_int_equal(stoke_loader_restore_state(c, &bad), STOKE_OK);
    assert_int_equal(stoke_loader_next(c, &b), STOKE_EEND);
    stoke_loader_destroy(a);
    stoke_loader_destroy(c);
    tds_free(&t);
}

/* prefetch_factor 1 and held_buffers h (default 2): 1 + h buffers, all of which the caller may
 * hold; one more next() is STOKE_ELIMIT until one is released. */
static void test_held_buffers_limit(void **state)
{
    static const int workers[] = {0, 1};
    for (int h = 1; h <= 2; h++) {
        for (size_t w = 0; w < 2; w++) {
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, 100);
            stoke_loader_opts o = base_opts(2, workers[w]);
            o.prefetch_factor = 1;
            if (h != 2)
                o.held_buffers = h;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            stoke_loader_stats st = {.size = sizeof(st)};
            assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
            assert_int_equal(st.buffers, 1 + h);
            stoke_batch *held[3];
            for (int i = 0; i <= h; i++)
                assert_int_equal(stoke_loader_next(l, &held[i]), STOKE_OK);
            stoke_batch *b;
            assert_int_equal(stoke_loader_next(l, &b), STOKE_ELIMIT);
            stoke_batch_release(held[0]);
            assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
            assert_int_equal(stoke_batch_seq(b), h + 1);
            assert_true(tds_batch_ok(b));
            stoke_batch_release(b);
            for (int i = 1; i <= h; i++) {
                assert_true(tds_batch_ok(held[i]));
                stoke_batch_release(held[i]);
            }
            stoke_loader_destroy(l);
            tds_free(&t);
        }
    }
}

static void test_set_epoch_mid_epoch(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 300);
    stoke_loader_opts o = base_opts(5, 3);
    o.shuffle = 1;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *kept;
    assert_int_equal(stoke_loader_next(l, &kept), STOKE_OK);
    tds_skip(l, 4);
    assert_int_equal(stoke_loader_set_epoch(l, 5), STOKE_OK);
    uint64_t got[300];
    assert_int_equal(run_epoch(l, got, 300, NULL), 300);
    assert_true(tds_batch_ok(kept)); /* a batch of the abandoned run stays valid */
    assert_int_equal(stoke_batch_epoch(kept), 0);
    stoke_batch_release(kept);
    /* identical to a fresh loader at epoch 5 */
    o.epoch = 5;
    o.num_workers = 0;
    stoke_loader *f;
    assert_int_equal(stoke_loader_create(&o, &ds, &f), STOKE_OK);
    uint64_t ref[300];
    assert_int_equal(run_epoch(f, ref, 300, NULL), 300);
    assert_memory_equal(ref, got, sizeof(ref));
    stoke_loader_destroy(f);
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_bad_options(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 10);
    stoke_loader *l = (stoke_loader *)&t;
    stoke_loader_opts o = base_opts(0, 0);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_null(l);
    /* each bad option is named with its value (the message listed every bound at once) */
    assert_non_null(strstr(stoke_last_error(), "loader: batch_size is 0; it must be >= 1"));
    o = base_opts(4, -1);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "loader: num_workers is -1; it must be in 0..1024"));
    o = base_opts(4, 1);
    o.size = 0;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    /* A huge prefetch_factor would overflow the reorder window (and hang next()). */
    o = base_opts(4, 4);
    o.prefetch_factor = 1 << 30;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(),
                           "loader: prefetch_factor is 1073741824; it must be in 1..4096"));
    o = base_opts(4, 1);
    o.held_buffers = 0;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "loader: held_buffers is 0; it must be in 1..4096"));
    o.held_buffers = 4097;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "held_buffers is 4097"));
    o = base_opts(4, 1);
    ds.get = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "get()"));
    /* next() of no loader: *out NULL too, as on every error (it was left as it was) */
    stoke_batch *b = (stoke_batch *)&t;
    assert_int_equal(stoke_loader_next(NULL, &b), STOKE_EINVAL);
    assert_null(b);
    /* distributed options reach the sampler */
    tds_make(&t, &ds, 10);
    o.sampler.distributed = 1;
    o.sampler.rank = 1;
    o.sampler.world_size = 3;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    uint64_t got[10];
    assert_int_equal(run_epoch(l, got, 10, NULL), 4);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[1], 4);
    assert_int_equal(got[2], 7);
    assert_int_equal(got[3], 0); /* padded from the start */
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* Buffers hold min(batch_size, samples per epoch for this rank) samples of a map dataset; a
 * batch_size whose nominal batch overflows size_t is STOKE_ERANGE, not an allocation failure. */
static void test_buffer_sizing(void **state)
{
    tu_use_none();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 10);
    stoke_loader_opts o = base_opts(100000, 2);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.buffer_bytes, 4096); /* 10 x 24 and 10 x 8 bytes, aligned */
    assert_int_equal(st.buffers, 3);         /* one batch + 2 */
    assert_int_equal(stoke_loader_num_batches(l), 1);
    uint64_t got[10], nb;
    assert_int_equal(run_epoch(l, got, 10, &nb), 10);
    assert_int_equal(nb, 1);
    for (uint64_t i = 0; i < 10; i++)
        assert_int_equal(got[i], i);
    stoke_loader_destroy(l);

    /* distributed: rank 1 of 4 sees 3 samples, so 3 per buffer */
    o.sampler.distributed = 1;
    o.sampler.rank = 1;
    o.sampler.world_size = 4;
    o.batch_size = (size_t)1 << 40;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.buffer_bytes, 4096);
    assert_int_equal(run_epoch(l, got, 10, NULL), 3);
    assert_int_equal(got[0], 1);
    assert_int_equal(got[2], 9);
    stoke_loader_destroy(l);

    /* overflowing sizes */
    static const size_t huge[] = {SIZE_MAX, SIZE_MAX / 8, SIZE_MAX / 24 + 1};
    for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
        o = base_opts(huge[i], 0);
        l = (stoke_loader *)&t;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_ERANGE);
        assert_null(l);
        assert_non_null(strstr(stoke_last_error(), "batch_size"));
        assert_non_null(strstr(stoke_last_error(), "is too large"));
    }
    tds_free(&t);
}

/* The batch buffers are allocated at create: more than physical memory in all is refused up
 * front, naming the total and the options behind it (here 1024 x 1024 + 2 buffers of 64 samples
 * of 1 MiB: 64 TiB).  The same options on a dataset of a few batches create a few buffers. */
static void test_upfront_bytes_bounded(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, (uint64_t)1 << 32);
    TU_SHAPE(&ds, 0)[0] = 1 << 20;
    TU_F(&ds)[0].bytes = 1 << 20;
    stoke_loader_opts o = base_opts(64, 1024);
    o.prefetch_factor = 1024;
    stoke_loader *l = (stoke_loader *)&t;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_ENOMEM);
    assert_null(l);
    const char *e = stoke_last_error();
    const char *head = "loader: 1048578 batch buffers of 67112960 bytes (70373173370880 bytes in "
                       "all) exceed the ";
    const char *tail = " bytes of physical memory: buffers = num_workers 1024 x prefetch_factor "
                       "1024 + 2 (at most batches per epoch + 2), each holding batch_size 64 "
                       "samples of 1048584 bytes; lower num_workers, prefetch_factor or batch_size";
    if (strncmp(e, head, strlen(head)) != 0 || strlen(e) < strlen(tail) ||
        strcmp(e + strlen(e) - strlen(tail), tail) != 0)
        fail_msg("unexpected message: %s", e);
    assert_int_equal(atomic_load(&t.gets), 0);
    /* 3 batches in the epoch: 5 buffers, whatever the workers and prefetch */
    t.n = 3 * 64;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.buffers, 5);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* Each layer adds its prefix once, and a long path is cut in the middle, never the reason. */
static void test_error_message_shape(void **state)
{
    static char err[4096], out[256];
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    const char *a1[] = {tu_cli_path(), "load", "npy:/nonexistent-dir/x.npy,io=foo", NULL};
    assert_int_equal(tu_run(a1, env, out, sizeof(out), err, sizeof(err)), 1);
    assert_string_equal(err, "stoke load: source 'npy:/nonexistent-dir/x.npy,io=foo': bad option "
                             "'io=foo' (io=auto, io=mmap, io=pread, io=uring, io=remote, "
                             "direct=auto, direct=on or direct=off)\n");
    const char *a2[] = {tu_cli_path(), "load", "npy:/nonexistent-dir/x.npy", NULL};
    assert_int_equal(tu_run(a2, env, out, sizeof(out), err, sizeof(err)), 1);
    assert_string_equal(err, "stoke load: npy /nonexistent-dir/x.npy: cannot open: No such file "
                             "or directory\n");

    /* a path of 3000 characters: the message is cut in the path, the reason stays */
    static char spec[5200];
    memcpy(spec, "npy:/", 5);
    memset(spec + 5, 'p', 3000);
    strcpy(spec + 3005, ",io=foo");
    const char *a3[] = {tu_cli_path(), "load", spec, NULL};
    assert_int_equal(tu_run(a3, env, out, sizeof(out), err, sizeof(err)), 1);
    const char *tail = "pp,io=foo': bad option 'io=foo' (io=auto, io=mmap, io=pread, io=uring, "
                       "io=remote, direct=auto, direct=on or direct=off)\n";
    assert_true(strlen(err) < 1100);
    assert_memory_equal(err, "stoke load: source 'npy:/ppp", 28);
    assert_string_equal(err + strlen(err) - strlen(tail), tail);
    const char *cut = strstr(err, "p ... p");
    assert_non_null(cut);
    assert_null(strstr(cut + 5, " ... "));
    assert_null(strstr(err + 13, "source '")); /* the prefix once */

    /* a spec past the sources' limit of 4096 characters */
    memset(spec + 5, 'p', 5000);
    spec[5005] = '\0';
    assert_int_equal(tu_run(a3, env, out, sizeof(out), err, sizeof(err)), 1);
    assert_string_equal(err, "stoke load: source: spec longer than 4096 characters\n");

    /* the loader's own prefix once, a long option value cut */
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 10);
    stoke_loader_opts o = base_opts(4, 0);
    memset(spec, 'd', 100);
    spec[100] = '\0';
    o.device = spec;
    stoke_loader *l = (stoke_loader *)&t;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_null(l);
    assert_string_equal(
        stoke_last_error(),
        "loader: device 'dddddddddddddd ... dddddddddddddddddddddddddddd' is longer "
        "than 63 characters");
    o = base_opts(4, 0);
    o.sampler.kind = 99;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_string_equal(stoke_last_error(), "loader: sampler: unknown kind 99");
    tds_free(&t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sequential_order),
        cmocka_unit_test(test_shuffle_epochs),
        cmocka_unit_test(test_same_seed_any_workers),
        cmocka_unit_test(test_drop_last),
        cmocka_unit_test(test_out_of_order),
        cmocka_unit_test(test_timeout),
        cmocka_unit_test(test_timeout_first_batch),
        cmocka_unit_test(test_interrupted_with_timeout),
        cmocka_unit_test(test_interrupted_slow_batches_not_made_by_the_caller),
        cmocka_unit_test(test_double_release_is_ignored),
        cmocka_unit_test(test_sample_error),
        cmocka_unit_test(test_worker_init_fails_threads),
        cmocka_unit_test(test_worker_init_timeout),
        cmocka_unit_test(test_null_arguments_say_so),
        cmocka_unit_test(test_early_destroy),
        cmocka_unit_test(test_persistent_workers),
        cmocka_unit_test(test_interrupt_joins_persistent_workers),
        cmocka_unit_test(test_save_restore),
        cmocka_unit_test(test_held_buffers_limit),
        cmocka_unit_test(test_set_epoch_mid_epoch),
        cmocka_unit_test(test_bad_options),
        cmocka_unit_test(test_buffer_sizing),
        cmocka_unit_test(test_error_message_shape),
        cmocka_unit_test(test_upfront_bytes_bounded),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
