/* Loader pinning and device transfer: the pinned / not pinned / warning matrix, async copies to
 * simdev (with a copy delay) that must never read a staging buffer already reused, and the CLI's
 * --device --verify path. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "test_loader_ds.h"

#define NO_ACCEL_WARNING                                                                           \
    "pin_memory is set but no accelerator was found; batches will not be pinned"

/* Runs a whole epoch; returns batches; *pinned counts those pinned (by both the batch flag and
 * stoke_is_pinned on the data). */
static uint64_t drain(stoke_loader *l, uint64_t *pinned)
{
    stoke_batch *b;
    uint64_t nb = 0;
    *pinned = 0;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        int flag = stoke_batch_is_pinned(b);
        assert_int_equal(flag, stoke_is_pinned(stoke_batch_data(b, 0)));
        *pinned += (uint64_t)flag;
        nb++;
        stoke_batch_release(b);
    }
    return nb;
}

typedef struct pin_case {
    const char *name;
    int simdev; /* accelerator present */
    int pin_memory;
    const char *pin_device;
    int expect_pinned;
    int expect_warns;    /* WARN lines in all */
    const char *warning; /* substring of the warning, or NULL */
} pin_case;

static void test_pin_matrix(void **state)
{
    static const pin_case cases[] = {
        {"simdev, default", 1, 1, NULL, 1, 0, NULL},
        {"no accelerator", 0, 1, NULL, 0, 1, NO_ACCEL_WARNING},
        {"pin_memory off", 1, 0, NULL, 0, 0, NULL},
        {"pin_memory_device alone", 1, 0, "simdev", 0, 1, "has no effect"},
        {"pin_memory_device simdev", 1, 1, "simdev", 1, 0, NULL},
        {"pin_memory_device absent, simdev", 1, 1, "nosuch", 1, 1, "'nosuch' is not available"},
        {"pin_memory_device absent, none", 0, 1, "nosuch", 0, 1, "'nosuch' is not available"},
        /* the cpu fallback pins nothing: warned like an unavailable backend */
        {"pin_memory_device cpu, simdev", 1, 1, "cpu", 1, 1,
         "'cpu' is not available (the cpu backend pins nothing); pinning for the current "
         "accelerator simdev instead"},
        {"pin_memory_device cpu, none", 0, 1, "cpu", 0, 1,
         "'cpu' is not available (the cpu backend pins nothing); batches will not be pinned"},
        {"pin_memory_device simdev:1", 1, 1, "simdev:1", 1, 0, NULL},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const pin_case *c = &cases[i];
        if (c->simdev)
            tu_use_simdev();
        else
            tu_use_none();
        tu_log_capture();
        tu_log_clear();
        for (int workers = 0; workers <= 2; workers += 2) {
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, 50);
            stoke_loader_opts o;
            stoke_loader_opts_init(&o);
            o.batch_size = 8;
            o.num_workers = workers;
            o.pin_memory = c->pin_memory;
            o.pin_memory_device = c->pin_device;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            uint64_t pinned;
            uint64_t nb = drain(l, &pinned);
            assert_int_equal(nb, 7);
            if (pinned != (c->expect_pinned ? nb : 0)) {
                tu_log_dump();
                fail_msg("case '%s': %llu of %llu batches pinned", c->name,
                         (unsigned long long)pinned, (unsigned long long)nb);
            }
            stoke_loader_stats st = {.size = sizeof(st)};
            stoke_loader_get_stats(l, &st);
            assert_int_equal(st.pinned_batches, pinned);
            assert_int_equal(st.pageable_batches, nb - pinned);
            if (c->expect_pinned)
                assert_string_equal(stoke_loader_pinned_backend(l), "simdev");
            else
                assert_null(stoke_loader_pinned_backend(l));
            stoke_loader_destroy(l);
            tds_free(&t);
            /* "no accelerator" is said once a process: the case's second loader is silent */
            int once = c->warning && strcmp(c->warning, NO_ACCEL_WARNING) == 0 && workers > 0;
            int warns = tu_log_count(STOKE_LOG_WARN, NULL);
            if (warns != (once ? 0 : c->expect_warns) ||
                (c->warning && tu_log_count(STOKE_LOG_WARN, c->warning) != !once)) {
                tu_log_dump();
                fail_msg("case '%s' (%d workers): %d warnings", c->name, workers, warns);
            }
            tu_log_clear();
        }
    }
    stoke_log_set_callback(NULL, NULL);
    tu_use_none();
}

/* With no accelerator, "nothing is pinned" is said once a process, whichever of the allocator
 * (stoke_pinned_alloc) and a loader with pin_memory comes first: the README's "says so once"
 * (each said it in its own words: two warnings). */
static void test_no_accelerator_said_once(void **state)
{
    (void)state;
    for (int loader_first = 0; loader_first <= 1; loader_first++) {
        tu_use_none(); /* (a registry reset: the process's warnings are forgotten) */
        tu_log_capture();
        tu_log_clear();
        for (int k = 0; k < 2; k++) {
            if (k == loader_first) {
                void *p = NULL;
                assert_int_equal(stoke_pinned_alloc(4096, &p), STOKE_OK);
                assert_int_equal(stoke_is_pinned(p), 0);
                assert_int_equal(stoke_pinned_free(p), STOKE_OK);
            } else {
                tds t;
                stoke_dataset ds;
                tds_make(&t, &ds, 16);
                stoke_loader_opts o;
                stoke_loader_opts_init(&o);
                o.batch_size = 8;
                stoke_loader *l;
                assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
                uint64_t pinned;
                assert_int_equal(drain(l, &pinned), 2);
                assert_int_equal(pinned, 0);
                stoke_loader_destroy(l);
                tds_free(&t);
            }
        }
        int warns = tu_log_count(STOKE_LOG_WARN, NULL);
        int said = tu_log_count(STOKE_LOG_WARN, loader_first ? NO_ACCEL_WARNING
                                                            : "pinning is not in effect");
        if (warns != 1 || said != 1) {
            tu_log_dump();
            fail_msg("%s first: %d warnings", loader_first ? "the loader" : "the allocator",
                     warns);
        }
    }
    stoke_log_set_callback(NULL, NULL);
}

/* With a slow copy engine, the consumer releases two batches of every three at once, without
 * waiting for their copies (so workers keep recycling staging buffers while copies are queued),
 * and keeps the third until two more kept batches arrived, then reads it back from the device:
 * a staging buffer reused before its copy ran would show up as wrong bytes. */
static void device_run(int workers, int in_order)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 480);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 8;
    o.num_workers = workers;
    o.in_order = in_order;
    o.shuffle = 1;
    o.device = "simdev";
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    tds_keeper keep = {0};
    tu_seen seen;
    tu_seen_init(&seen, 480);
    stoke_batch *b;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        assert_null(stoke_batch_data(b, 0)); /* device transfer: the device buffer is the batch */
        assert_non_null(stoke_batch_device_buffer(b));
        assert_true(stoke_batch_is_pinned(b));
        assert_int_equal(stoke_batch_device_offset(b, 0), 0);
        for (size_t j = 0; j < stoke_batch_count(b); j++)
            tu_seen_add(&seen, stoke_batch_indices(b)[j]);
        tds_keeper_add(&keep, b);
    }
    tds_keeper_finish(&keep);
    assert_int_equal(keep.nb, 60);
    tu_seen_check_all(&seen);
    tu_seen_free(&seen);
    stoke_loader_stats st = {.size = sizeof(st)};
    stoke_loader_get_stats(l, &st);
    assert_int_equal(st.device_copies, 60);
    assert_int_equal(st.pinned_batches, 60);
    assert_int_equal(st.device_bytes, 480 * (DS_BYTES + 8));
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_device_transfer(void **state)
{
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", "1500");
    tu_use_simdev();
    device_run(2, 1);
    device_run(3, 0);
    device_run(0, 1);
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", NULL);
    tu_use_none();
}

static void test_device_early_destroy(void **state)
{
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", "3000");
    tu_use_simdev();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 400);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.num_workers = 2;
    char spec[16] = "simdev:1";
    o.device = spec;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    memset(spec, 'x', sizeof(spec) - 1); /* the loader keeps its own copy of the string */
    tds_skip(l, 5);                      /* released before their copies completed */
    stoke_loader_destroy(l);             /* copies in flight: destroy waits for them */
    tds_free(&t);
    tu_env("STOKE_SIMDEV_COPY_DELAY_US", NULL);
    tu_use_none();
}

static void test_device_errors(void **state)
{
    tu_use_simdev();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 40);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.device = "nosuch";
    stoke_loader *l = NULL;
    assert_int_not_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_null(l);
    assert_non_null(strstr(stoke_last_error(), "nosuch"));
    o.device = "simdev:99";
    assert_int_not_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    /* a host loader has no device side */
    o.device = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    assert_null(stoke_batch_device_buffer(b));
    assert_null(stoke_batch_device_event(b));
    assert_int_equal(stoke_batch_device_wait(b), STOKE_ESTATE);
    stoke_batch_release(b);
    stoke_loader_destroy(l);
    tds_free(&t);
    tu_use_none();
}

/* A create that fails in the device setup keeps the backend's reason: destroying the partly
 * built loader (stream synchronize, frees) must not wipe it.  Batches of 4 x 32 bytes, 2 workers
 * x prefetch 2 + 2 = 6 buffers: allocations 1..6 pin the host buffers, 7..12 are the device
 * buffers. */
static void test_device_setup_failure_keeps_reason(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 400);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.num_workers = 2;
    o.device = "simdev";
    for (int n = 7; n <= 12; n++) {
        char v[8], want[512];
        snprintf(v, sizeof(v), "%d", n);
        tu_env("STOKE_SIMDEV_FAIL_ALLOC", v);
        tu_use_simdev();
        stoke_loader *l = (stoke_loader *)&t;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_ENOMEM);
        assert_null(l);
        snprintf(want, sizeof(want),
                 "loader: device 'simdev': batch buffer %d of 6: simdev: allocating 4096 bytes on "
                 "device 0 failed: injected allocation failure: device_alloc of 4096 bytes on "
                 "device 0 is allocation #%d (STOKE_SIMDEV_FAIL_ALLOC=%d)",
                 n - 6, n, n);
        assert_string_equal(stoke_last_error(), want);
    }
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", NULL);
    tu_env("STOKE_SIMDEV_MEMORY", "1K");
    tu_use_simdev();
    stoke_loader *l = (stoke_loader *)&t;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_ENOMEM);
    assert_null(l);
    assert_string_equal(stoke_last_error(),
                        "loader: device 'simdev': batch buffer 1 of 6: simdev: allocating 4096 "
                        "bytes on device 0 failed: device_alloc: out of memory on device 0: 4096 "
                        "bytes asked, 0 of 1024 in use (STOKE_SIMDEV_MEMORY)");
    tu_env("STOKE_SIMDEV_MEMORY", NULL);
    tds_free(&t);
    tu_use_none();
}

static stoke_pinned_stats pinned_stats(void)
{
    stoke_pinned_stats s = {.size = sizeof(s)};
    assert_int_equal(stoke_pinned_stats_get(&s), STOKE_OK);
    return s;
}

/* Batches pinned for another device than the current one (pin_memory_device simdev:1 while
 * simdev:0 is current) are the pinned allocator's blocks like the others: its statistics count
 * every buffer (in use while the loader lives, cached after it), a second loader takes them
 * from its cache without pinning anything, and its cap applies (FAIL: create fails with
 * STOKE_ELIMIT; FALLBACK: the buffers past it are pageable, and batches say so). */
static void test_other_device_through_pinned_layer(void **state)
{
    tu_use_simdev();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 50);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 8;
    o.num_workers = 2;
    o.pin_memory = 1;
    o.pin_memory_device = "simdev:1";
    stoke_pinned_stats p0 = pinned_stats();
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    uint64_t nbuf = st.buffers, per = stoke_pinned_round_size(st.buffer_bytes);
    assert_true(nbuf > 0 && per >= st.buffer_bytes);
    stoke_pinned_stats p1 = pinned_stats();
    assert_int_equal(p1.total_allocs - p0.total_allocs, nbuf);
    assert_int_equal(p1.count_in_use - p0.count_in_use, nbuf);
    assert_int_equal(p1.bytes_in_use - p0.bytes_in_use, nbuf * per);
    assert_int_equal(p1.bytes_requested - p0.bytes_requested, nbuf * st.buffer_bytes);
    uint64_t pinned;
    assert_int_equal(drain(l, &pinned), 7);
    assert_int_equal(pinned, 7);
    assert_string_equal(stoke_loader_pinned_backend(l), "simdev");
    stoke_loader_destroy(l);
    stoke_pinned_stats p2 = pinned_stats();
    assert_int_equal(p2.total_frees - p0.total_frees, nbuf);
    assert_int_equal(p2.count_in_use, p0.count_in_use);
    assert_int_equal(p2.bytes_in_use, p0.bytes_in_use);
    assert_true(p2.bytes_cached >= nbuf * per);

    /* the cache: a second loader pins nothing */
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_pinned_stats p3 = pinned_stats();
    assert_int_equal(p3.cache_hits - p2.cache_hits, nbuf);
    assert_int_equal(p3.pin_calls, p2.pin_calls);
    assert_int_equal(drain(l, &pinned), 7);
    assert_int_equal(pinned, 7);
    stoke_loader_destroy(l);

    /* the cap, with room for two buffers */
    assert_int_equal(stoke_pinned_empty_cache(), STOKE_OK);
    uint64_t held = pinned_stats().bytes_reserved;
    assert_int_equal(stoke_pinned_set_limit(held + 2 * per, STOKE_PINNED_LIMIT_FAIL), STOKE_OK);
    stoke_pinned_stats p4 = pinned_stats();
    l = (stoke_loader *)&t;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_ELIMIT);
    assert_null(l);
    stoke_pinned_stats p5 = pinned_stats();
    assert_int_equal(p5.limit_failures - p4.limit_failures, 1);
    assert_int_equal(p5.bytes_in_use, p0.bytes_in_use);
    assert_int_equal(stoke_pinned_set_limit(held + 2 * per, STOKE_PINNED_LIMIT_FALLBACK), STOKE_OK);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_pinned_stats p6 = pinned_stats();
    assert_int_equal(p6.pageable_fallbacks - p5.pageable_fallbacks, nbuf - 2);
    assert_int_equal(drain(l, &pinned), 7); /* each batch's flag checked against its memory */
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.pinned_batches, pinned);
    assert_int_equal(st.pageable_batches, 7 - pinned);
    stoke_loader_destroy(l);
    assert_int_equal(stoke_pinned_set_limit(0, STOKE_PINNED_LIMIT_FALLBACK), STOKE_OK);
    assert_int_equal(pinned_stats().bytes_in_use, p0.bytes_in_use);
    tds_free(&t);
    tu_use_none();
    (void)state;
}

/* Device specs are checked at create: a device index the backend does not have is
 * STOKE_ERANGE, a malformed spec STOKE_EINVAL, before any batch memory is allocated. */
static void test_spec_errors(void **state)
{
    tu_use_simdev();
    tu_log_capture();
    tu_log_clear();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 40);
    typedef struct {
        int device; /* 1: opts.device, 0: opts.pin_memory_device */
        int pin_memory;
        const char *spec;
        int rc;
        const char *msg;
    } spec_case;
    static const spec_case cases[] = {
        {0, 1, "simdev:7", STOKE_ERANGE,
         "pin_memory_device 'simdev:7': simdev has 2 device(s), no device 7"},
        {1, 1, "simdev:7", STOKE_ERANGE, "device 'simdev:7': simdev has 2 device(s), no device 7"},
        {1, 0, "simdev:2", STOKE_ERANGE, "simdev has 2 device(s), no device 2"},
        {0, 1, "simdev:", STOKE_EINVAL, "'simdev:' is not of the form name[:index]"},
        {0, 1, "simdev:-1", STOKE_EINVAL, "'simdev:-1' is not of the form name[:index]"},
        {0, 0, "simdev:x", STOKE_EINVAL, "'simdev:x' is not of the form name[:index]"},
        {1, 1, "simdev:", STOKE_EINVAL, "device 'simdev:' is not of the form name[:index]"},
        {1, 0, ":1", STOKE_EINVAL, "device ':1' is not of the form name[:index]"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        const spec_case *c = &cases[i];
        stoke_loader_opts o;
        stoke_loader_opts_init(&o);
        o.batch_size = 4;
        o.pin_memory = c->pin_memory;
        if (c->device)
            o.device = c->spec;
        else
            o.pin_memory_device = c->spec;
        stoke_loader *l = (stoke_loader *)&t;
        int rc = stoke_loader_create(&o, &ds, &l);
        if (rc != c->rc || !strstr(stoke_last_error(), c->msg))
            fail_msg("case %zu (%s): %s (%s)", i, c->spec, stoke_err_name(rc), stoke_last_error());
        assert_null(l);
    }
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "pinned allocation"), 0);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "is not available ()"), 0);
    stoke_log_set_callback(NULL, NULL);
    tds_free(&t);
    tu_use_none();
}

/* A copy that fails asynchronously (simdev's 3rd copy: field 0 of batch 1) is reported by
 * stoke_batch_device_wait; the loader's last error names the batch, its epoch and its sample
 * indices; counters agree. */
static void test_device_copy_failure(void **state)
{
    tu_env("STOKE_SIMDEV_FAIL_COPY", "3");
    tu_use_simdev();
    tu_log_capture();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 40);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.num_workers = 0; /* copies queued one batch per next(), two fields each */
    o.device = "simdev";
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    if (stoke_batch_device_wait(b) != STOKE_OK) {
        tu_log_dump();
        fail_msg("batch 0: %s", stoke_loader_last_error(l));
    }
    stoke_batch_release(b);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    assert_int_equal(stoke_batch_device_wait(b), STOKE_EBACKEND);
    const char *want = "the copy of batch 1 of epoch 0 (sample indices 4..7) to device simdev "
                       "failed";
    if (!strstr(stoke_loader_last_error(l), want))
        fail_msg("last error: %s", stoke_loader_last_error(l));
    assert_non_null(strstr(stoke_last_error(), want));
    assert_non_null(strstr(stoke_loader_last_error(l), "STOKE_EBACKEND"));
    assert_int_equal(stoke_batch_device_wait(b), STOKE_EBACKEND); /* again: counted once */
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.batches, 2);
    assert_int_equal(st.pinned_batches, 2);
    assert_int_equal(st.device_copies, 2);
    assert_int_equal(st.device_errors, 1);
    stoke_batch_release(b);
    /* the loader goes on: later batches copy fine */
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    assert_int_equal(stoke_batch_device_wait(b), STOKE_OK);
    tds_check_device_batch(b);
    stoke_batch_release(b);
    stoke_loader_destroy(l);
    tds_free(&t);
    stoke_log_set_callback(NULL, NULL);
    tu_env("STOKE_SIMDEV_FAIL_COPY", NULL);
    tu_use_none();
}

/* The loader's error for an asynchronous copy failure carries the backend's reason (which copy
 * failed and why), not only "work before the event failed". */
static void test_device_copy_failure_keeps_backend_reason(void **state)
{
    tu_env("STOKE_SIMDEV_FAIL_COPY", "3");
    tu_use_simdev();
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 40);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.num_workers = 0;
    o.device = "simdev";
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    for (int i = 0; i < 2; i++) {
        assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
        assert_int_equal(stoke_batch_device_wait(b), i == 0 ? STOKE_OK : STOKE_EBACKEND);
        if (i == 0)
            stoke_batch_release(b);
    }
    const char *want = "failed: simdev: work before the event on device 0 failed: injected copy "
                       "failure: copy #3 (h2d, ";
    if (!strstr(stoke_loader_last_error(l), want))
        fail_msg("loader error: %s", stoke_loader_last_error(l));
    assert_non_null(
        strstr(stoke_loader_last_error(l), "(STOKE_SIMDEV_FAIL_COPY=3) (STOKE_EBACKEND)"));
    stoke_batch_release(b);
    stoke_loader_destroy(l);
    tds_free(&t);
    tu_env("STOKE_SIMDEV_FAIL_COPY", NULL);
    tu_use_none();
}

/* A JSON value of `key` (number or string, as text) in `json`. */
static const char *json_val(const char *json, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (!p)
        return NULL;
    p += strlen(pat);
    size_t n = strcspn(p, ",}");
    snprintf(buf, len, "%.*s", (int)n, p);
    return buf;
}

static void test_cli(void **state)
{
    static char out1[8192], out2[8192], err[8192];
    char plug[1024];
    snprintf(plug, sizeof(plug), "STOKE_PLUGIN_PATH=%s", tu_simdev_path());
    const char *env_sim[] = {plug, "STOKE_SIMDEV_COPY_DELAY_US=200", NULL};
    const char *env_none[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    const char *host[] = {tu_cli_path(), "load", "synthetic:3000", "--batch-size", "64",
                          "--workers",   "2",    "--shuffle",      "--seed",       "5",
                          "--json",      NULL};
    const char *dev[] = {tu_cli_path(), "load",   "synthetic:3000", "--batch-size", "64",
                         "--workers",   "3",      "--shuffle",      "--seed",       "5",
                         "--device",    "simdev", "--verify",       "--json",       NULL};
    assert_int_equal(tu_run(host, env_sim, out1, sizeof(out1), err, sizeof(err)), 0);
    assert_int_equal(tu_run(dev, env_sim, out2, sizeof(out2), err, sizeof(err)), 0);
    char a[128], b[128];
    assert_non_null(json_val(out1, "content_hash", a, sizeof(a)));
    assert_non_null(json_val(out2, "content_hash", b, sizeof(b)));
    assert_true(a[0] == '"' && a[1] == '0' && a[2] == 'x');
    assert_string_equal(a, b);
    assert_string_equal(json_val(out1, "order_hash", a, sizeof(a)),
                        json_val(out2, "order_hash", b, sizeof(b)));
    assert_string_equal(json_val(out1, "samples", a, sizeof(a)), "3000");
    assert_string_equal(json_val(out1, "batches", a, sizeof(a)), "47");
    assert_string_equal(json_val(out1, "pinned_batches", a, sizeof(a)), "47");
    assert_string_equal(json_val(out2, "device_copies", a, sizeof(a)), "47");
    assert_string_equal(json_val(out1, "accelerator", a, sizeof(a)), "\"simdev\"");
    assert_string_equal(json_val(out1, "index_sum", a, sizeof(a)), "4498500");
    static const char *keys[] = {"seconds", "samples_per_s", "bytes_per_s", "pageable_batches",
                                 "data_wait_s"};
    for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++)
        assert_non_null(json_val(out1, keys[i], a, sizeof(a)));

    /* no accelerator: one warning, pageable batches, the same content */
    const char *host0[] = {
        tu_cli_path(), "load", "synthetic:3000", "--batch-size", "64", "--workers", "0",
        "--json",      NULL};
    assert_int_equal(tu_run(host0, env_none, out2, sizeof(out2), err, sizeof(err)), 0);
    assert_string_equal(json_val(out2, "accelerator", a, sizeof(a)), "null");
    assert_string_equal(json_val(out2, "pageable_batches", a, sizeof(a)), "47");
    assert_string_equal(json_val(out1, "content_hash", a, sizeof(a)),
                        json_val(out2, "content_hash", b, sizeof(b)));
    assert_non_null(strstr(err, NO_ACCEL_WARNING));
    assert_null(strstr(strstr(err, NO_ACCEL_WARNING) + 1, "warn")); /* only one warning */
    assert_null(strchr(err, '\r'));                                 /* no progress bar */

    /* human text, limit, usage errors */
    const char *lim[] = {tu_cli_path(), "load", "synthetic:3000", "--limit", "5", NULL};
    assert_int_equal(tu_run(lim, env_none, out2, sizeof(out2), err, sizeof(err)), 0);
    assert_non_null(strstr(out2, "in 5 batches"));
    const char *bad[] = {tu_cli_path(), "load", "--bogus", NULL};
    assert_int_equal(tu_run(bad, env_none, out2, sizeof(out2), err, sizeof(err)), 2);
    const char *badsrc[] = {tu_cli_path(), "load", "nosuchsource:1", NULL};
    assert_int_equal(tu_run(badsrc, env_none, out2, sizeof(out2), err, sizeof(err)), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_pin_matrix),
        cmocka_unit_test(test_no_accelerator_said_once),
        cmocka_unit_test(test_device_transfer),
        cmocka_unit_test(test_device_early_destroy),
        cmocka_unit_test(test_device_errors),
        cmocka_unit_test(test_other_device_through_pinned_layer),
        cmocka_unit_test(test_spec_errors),
        cmocka_unit_test(test_device_setup_failure_keeps_reason),
        cmocka_unit_test(test_device_copy_failure),
        cmocka_unit_test(test_device_copy_failure_keeps_backend_reason),
        cmocka_unit_test(test_cli),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
