/* The pinned host memory caching allocator: reuse, size classes, event-guarded reuse on simdev,
 * the cap and its policies, no accelerator / STOKE_PINNED=0, register/unregister, injected
 * failures, per-device caches, thread caches, stats and JSON, and a multi-threaded stress. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../plugins/simdev/simdev.h"
#include "common/internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static const char *const vars[] = {"STOKE_SIMDEV_COPY_DELAY_US",
                                   "STOKE_SIMDEV_FAIL_ALLOC",
                                   "STOKE_SIMDEV_FAIL_COPY",
                                   "STOKE_SIMDEV_DEVICES",
                                   "STOKE_PINNED",
                                   "STOKE_PINNED_LIMIT"};

static void clear_vars(void)
{
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        unsetenv(vars[i]);
}

static int setup_none(void **state)
{
    stoke__pinned_reset();
    clear_vars();
    tu_log_capture();
    tu_log_clear();
    tu_use_none();
    return 0;
}

static int setup_simdev(void **state)
{
    stoke__pinned_reset();
    clear_vars();
    tu_log_capture();
    tu_log_clear();
    tu_use_simdev();
    return 0;
}

static int teardown(void **state)
{
    stoke__pinned_reset(); /* before the registry unloads the backends the blocks belong to */
    clear_vars();
    tu_use_none();
    return 0;
}

static stoke_pinned_stats stats(void)
{
    stoke_pinned_stats s;
    memset(&s, 0, sizeof(s));
    s.size = sizeof(s);
    assert_int_equal(stoke_pinned_stats_get(&s), STOKE_OK);
    assert_int_equal(s.version, STOKE_PINNED_STATS_VERSION);
    return s;
}

static void *alloc_ok(size_t n)
{
    void *p = NULL;
    int rc = stoke_pinned_alloc(n, &p);
    if (rc != STOKE_OK) {
        tu_log_dump();
        fail_msg("stoke_pinned_alloc(%zu): %s (%s)", n, stoke_err_name(rc), stoke_last_error());
    }
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % 4096, 0);
    return p;
}

static void fill(void *p, size_t n, unsigned seed)
{
    unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        b[i] = (unsigned char)(seed + i * 31u + (i >> 9));
}

static int check(const void *p, size_t n, unsigned seed)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        if (b[i] != (unsigned char)(seed + i * 31u + (i >> 9)))
            return 0;
    return 1;
}

/* ---- size classes ---------------------------------------------------------------------------- */

static void test_pinned_round_size_table(void **state)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t small = page > 4096 ? page : 4096;
    assert_int_equal(stoke_pinned_round_size(0), small);
    assert_int_equal(stoke_pinned_round_size(1), small);
    assert_int_equal(stoke_pinned_round_size(4096), small);
    if (page <= 4096) {
        assert_int_equal(stoke_pinned_round_size(4097), 8192);
        assert_int_equal(stoke_pinned_round_size(100 * KiB), 128 * KiB);
    }
    assert_int_equal(stoke_pinned_round_size(MiB), MiB);
    assert_int_equal(stoke_pinned_round_size(MiB + 1), MiB + MiB / 4);
    assert_int_equal(stoke_pinned_round_size(MiB + MiB / 4), MiB + MiB / 4);
    assert_int_equal(stoke_pinned_round_size(MiB + MiB / 4 + 1), MiB + MiB / 2);
    assert_int_equal(stoke_pinned_round_size(2 * MiB), 2 * MiB);
    assert_int_equal(stoke_pinned_round_size(2 * MiB + 1), 2 * MiB + MiB / 2);
    assert_int_equal(stoke_pinned_round_size(3 * MiB + 1), 3 * MiB + MiB / 2);
    assert_int_equal(stoke_pinned_round_size(100 * MiB), 112 * MiB);
    assert_int_equal(stoke_pinned_round_size((size_t)1 << 46), (size_t)1 << 46);
    assert_int_equal(stoke_pinned_round_size(((size_t)1 << 46) + 1), 0);
    /* The thread caches keep classes up to 4 MiB. */
    assert_int_equal(stoke__pinned_class(4 * MiB), PN_TC_NCLASS - 1);
    assert_int_equal(stoke__pinned_class_size(PN_TC_NCLASS - 1), 4 * MiB);
    /* Above the 1 MiB threshold no request wastes 25 % or more; classes never shrink. */
    size_t prev = 0;
    for (size_t s = MiB + 1; s < 64 * MiB; s += 4093 * 7) {
        size_t r = stoke_pinned_round_size(s);
        assert_true(r >= s);
        assert_true((double)(r - s) < 0.25 * (double)s);
        assert_true(r >= prev);
        prev = r;
    }
}

/* ---- no accelerator -------------------------------------------------------------------------- */

static void test_pinned_no_accelerator_warns_once(void **state)
{
    void *p[64];
    for (int i = 0; i < 64; i++) {
        p[i] = alloc_ok((size_t)(i + 1) * 3000);
        memset(p[i], 0xa5, (size_t)(i + 1) * 3000); /* usable */
        assert_int_equal(stoke_is_pinned(p[i]), 0);
    }
    for (int i = 0; i < 64; i++)
        assert_int_equal(stoke_pinned_free(p[i]), STOKE_OK);
    for (int i = 0; i < 64; i++)
        stoke_pinned_free(alloc_ok(MiB)); /* and cached pairs */
    if (tu_log_count(STOKE_LOG_WARN, "pinning is not in effect") != 1)
        tu_log_dump();
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "pinning is not in effect"), 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "no accelerator"), 1);
    stoke_pinned_stats s = stats();
    assert_string_equal(s.backend, "none");
    assert_int_equal(s.count_in_use, 0);
    assert_int_equal(s.total_allocs, 128);
    assert_int_equal(s.total_frees, 128);
    assert_true(s.standin_allocs >= 1);
    assert_int_equal(s.pin_calls, 0);
}

/* Pages of [p, p + n) in memory (mincore), of all of them. */
static void resident_pages(const void *p, size_t n, size_t *in, size_t *all)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)p / pg * pg, hi = ((uintptr_t)p + n + pg - 1) / pg * pg;
    size_t np = (hi - lo) / pg;
    unsigned char *vec = malloc(np);
    assert_non_null(vec);
    assert_int_equal(mincore((void *)lo, hi - lo, vec), 0);
    *in = 0;
    for (size_t i = 0; i < np; i++)
        *in += vec[i] & 1;
    *all = np;
    free(vec);
}

/* Without an accelerator a block is resident as soon as it is handed out, as pinned memory
 * would be (stoke__resident_alloc: the first epoch pays no page fault per 4 KiB of its batch
 * buffers), and zeroed; the loader's pageable buffers come from the same allocation. */
static void test_pinned_standin_is_resident(void **state)
{
    (void)state;
    const size_t sizes[] = {5000, MiB + 123, 3 * MiB};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        unsigned char *p = alloc_ok(sizes[k]);
        size_t in, all;
        resident_pages(p, sizes[k], &in, &all);
        if (in != all)
            fail_msg("stand-in of %zu bytes: %zu of %zu pages resident before any write", sizes[k],
                     in, all);
        for (size_t i = 0; i < sizes[k]; i += 4093)
            assert_int_equal(p[i], 0);
        memset(p, 0x5a, sizes[k]);
        assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    }
    assert_int_equal(stoke_pinned_empty_cache(), STOKE_OK);
    unsigned char *q = stoke__resident_alloc(3 * MiB);
    assert_non_null(q);
    size_t in, all;
    resident_pages(q, 3 * MiB, &in, &all);
    assert_int_equal(in, all);
    assert_int_equal(q[3 * MiB - 1], 0);
    stoke__resident_free(q, 3 * MiB);
    assert_true(stats().standin_allocs >= 3);
}

static void test_pinned_disabled_by_env(void **state)
{
    stoke__pinned_reset();
    setenv("STOKE_PINNED", "0", 1);
    tu_use_simdev();
    for (int i = 0; i < 20; i++) {
        void *p = alloc_ok(64 * KiB);
        assert_int_equal(stoke_is_pinned(p), 0);
        memset(p, 1, 64 * KiB);
        assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    }
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "(STOKE_PINNED turns it off)"), 1);
    stoke_pinned_stats s = stats();
    assert_string_equal(s.backend, "none");
    assert_int_equal(s.pin_calls, 0);
    assert_int_equal(tu_simdev_counters().host_allocs, 0);
}

/* ---- reuse -------------------------------------------------------------------------------------
 */

static void test_pinned_free_then_alloc_returns_same_block(void **state)
{
    void *a = alloc_ok(MiB);
    assert_int_equal(stoke_is_pinned(a), 1);
    assert_int_equal(stoke_is_pinned((char *)a + MiB - 1), 1); /* interior */
    char local[64];
    assert_int_equal(stoke_is_pinned(local), 0);
    assert_int_equal(stoke_is_pinned(NULL), 0);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    void *b = alloc_ok(MiB);
    assert_ptr_equal(a, b);
    /* A request that rounds to the same class is served by the same block too. */
    assert_int_equal(stoke_pinned_free(b), STOKE_OK);
    void *c = alloc_ok(MiB - 100);
    assert_ptr_equal(a, c);
    assert_int_equal(stoke_pinned_free(c), STOKE_OK);
    stoke_pinned_stats s = stats();
    assert_string_equal(s.backend, "simdev");
    assert_int_equal(s.pin_calls, 1);
    assert_int_equal(s.cache_hits, 2);
    assert_int_equal(s.cache_misses, 1);
    assert_int_equal(tu_simdev_counters().host_allocs, 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "not in effect"), 0);
}

/* A live block recorded on again and again (a loader's staging slot) does not accumulate
 * events: completed ones go back to the pool at the next record. */
static void test_pinned_rerecording_a_live_block_reuses_events(void **state)
{
    void *a = alloc_ok(MiB);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    for (int i = 0; i < 500; i++) {
        assert_int_equal(stoke_pinned_record_stream(a, s), STOKE_OK);
        assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    }
    stoke_pinned_stats st = stats();
    assert_int_equal(st.events_recorded, 500);
    assert_true(st.events_created <= 2);
    assert_true(tu_simdev_counters().live_events <= 2);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    stoke_stream_destroy(s);
}

static void test_pinned_bad_pointers(void **state)
{
    assert_int_equal(stoke_pinned_free(NULL), STOKE_OK);
    assert_int_equal(stoke_pinned_alloc(16, NULL), STOKE_EINVAL);
    char *p = alloc_ok(8 * KiB);
    assert_int_equal(stoke_pinned_free(p + 4096), STOKE_EINVAL); /* interior */
    void *m = malloc(100);
    assert_int_equal(stoke_pinned_free(m), STOKE_EINVAL); /* foreign */
    free(m);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    assert_int_equal(stoke_pinned_free(p), STOKE_EINVAL); /* twice */
    assert_non_null(strstr(stoke_last_error(), "not a live block"));
    void *big = NULL;
    assert_int_equal(stoke_pinned_alloc(((size_t)1 << 46) + 1, &big), STOKE_ENOMEM);
    assert_null(big);
}

/* ---- event-guarded reuse ------------------------------------------------------------------------
 */

/* A block freed while a delayed copy from it is queued, and the same size allocated again. */
typedef struct {
    stoke_stream *s;
    stoke_device_buffer *dbuf;
    stoke_event *probe; /* recorded right after the copy: done once the copy is */
    void *a, *b;
} pending_free;

/* Queues a copy from a new block `a` (simdev delays it by `delay_us`), records the probe event
 * and `a`'s stream use, frees `a`, reads the stats and allocates the same size as `b`.  When the
 * probe is still pending after that, the stats and the allocation both ran while the copy was
 * queued, so they must have seen `a` waiting: asserts that and returns 1.  Otherwise (this
 * machine was too slow to make both checks inside the delay) undoes everything and returns 0. */
static int free_during_copy(pending_free *p, size_t n, const char *delay_us)
{
    stoke__pinned_reset();
    setenv("STOKE_SIMDEV_COPY_DELAY_US", delay_us, 1);
    tu_use_simdev();
    memset(p, 0, sizeof(*p));
    assert_int_equal(stoke_stream_create(NULL, &p->s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(p->s, n, &p->dbuf), STOKE_OK);
    assert_int_equal(stoke_event_create(p->s, &p->probe), STOKE_OK);

    p->a = alloc_ok(n);
    fill(p->a, n, 7);
    assert_int_equal(stoke_copy_h2d_async(p->dbuf, 0, p->a, n, p->s), STOKE_OK);
    assert_int_equal(stoke_event_record(p->probe, p->s), STOKE_OK);
    assert_int_equal(stoke_pinned_record_stream(p->a, p->s), STOKE_OK);
    assert_int_equal(stoke_pinned_free(p->a), STOKE_OK);
    stoke_pinned_stats st = stats();
    p->b = alloc_ok(n);
    int queued = stoke_event_query(p->probe);
    if (queued == STOKE_EBUSY) {
        assert_int_equal(st.count_waiting, 1);
        assert_ptr_not_equal(p->a, p->b); /* the copy still reads `a` */
        memset(p->b, 0xee, n);            /* would corrupt the copy if it were `a` */
        return 1;
    }
    assert_int_equal(queued, STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(p->s), STOKE_OK);
    assert_int_equal(stoke_pinned_free(p->b), STOKE_OK);
    stoke_event_destroy(p->probe);
    stoke_device_buffer_destroy(p->dbuf);
    stoke_stream_destroy(p->s);
    return 0;
}

static void test_pinned_pending_copy_blocks_reuse(void **state)
{
    /* A longer delay each time the machine was too slow; a skip if even 10 s were not enough. */
    static const char *const delays[] = {"400000", "2000000", "10000000"};
    const size_t n = MiB;
    pending_free pf;
    size_t tries = 0;
    while (!free_during_copy(&pf, n, delays[tries]))
        if (++tries == sizeof(delays) / sizeof(delays[0]))
            tu_skip("the delayed copy completed before the checks, even with a %s us delay",
                    delays[tries - 1]);
    stoke_stream *s = pf.s;
    stoke_device_buffer *dbuf = pf.dbuf;
    void *a = pf.a, *b = pf.b;
    stoke_pinned_stats st;
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_int_equal(stoke_event_query(pf.probe), STOKE_OK);
    stoke_event_destroy(pf.probe);

    /* The copied data arrived intact. */
    unsigned char *back = malloc(n);
    assert_non_null(back);
    assert_int_equal(stoke_copy_d2h_async(back, dbuf, 0, n, s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_true(check(back, n, 7));
    free(back);

    /* Its event completed: the next allocation of that size reuses `a`. */
    void *c = alloc_ok(n);
    assert_ptr_equal(c, a);
    st = stats();
    assert_int_equal(st.count_waiting, 0);
    assert_int_equal(st.events_recorded, 1);
    assert_int_equal(st.events_created, 1);
    assert_int_equal(stoke_pinned_free(b), STOKE_OK);
    assert_int_equal(stoke_pinned_free(c), STOKE_OK);

    /* The event is pooled: recording again does not create another. */
    void *d = alloc_ok(n);
    assert_int_equal(stoke_pinned_record_stream(d, s), STOKE_OK);
    assert_int_equal(stoke_pinned_free(d), STOKE_OK);
    assert_int_equal(stats().events_created, 1);
    assert_int_equal(stoke_pinned_record_stream(d, s), STOKE_EINVAL); /* freed */
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    stoke_device_buffer_destroy(dbuf);
    stoke_stream_destroy(s);
}

/* A copy that fails still ends: its event reports the error, and the block is reusable. */
static void test_pinned_failed_copy_releases_block(void **state)
{
    stoke__pinned_reset();
    setenv("STOKE_SIMDEV_FAIL_COPY", "1", 1);
    setenv("STOKE_SIMDEV_COPY_DELAY_US", "20000", 1);
    tu_use_simdev();
    stoke_stream *s = NULL;
    stoke_device_buffer *dbuf = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 64 * KiB, &dbuf), STOKE_OK);
    void *a = alloc_ok(64 * KiB);
    assert_int_equal(stoke_copy_h2d_async(dbuf, 0, a, 64 * KiB, s), STOKE_OK);
    assert_int_equal(stoke_pinned_record_stream(a, s), STOKE_OK);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    /* The injected failure is delivered to the block's event (the first marker after it). */
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_int_equal(tu_simdev_counters().copies_failed, 1);
    void *b = alloc_ok(64 * KiB);
    assert_ptr_equal(a, b);
    assert_int_equal(stats().count_waiting, 0);
    assert_int_equal(stoke_pinned_free(b), STOKE_OK);
    stoke_device_buffer_destroy(dbuf);
    stoke_stream_destroy(s);
    unsetenv("STOKE_SIMDEV_FAIL_COPY");
}

/* ---- stats and empty_cache
 * ----------------------------------------------------------------------- */

static void test_pinned_stats_match_rounding_and_empty_cache_keeps_live(void **state)
{
    const size_t sizes[] = {1, 5000, 300 * KiB, MiB, MiB + 1, 3 * MiB + 5, 40 * MiB};
    const int k = (int)(sizeof(sizes) / sizeof(sizes[0]));
    void *p[16];
    uint64_t rounded = 0, requested = 0;
    for (int i = 0; i < k; i++) {
        p[i] = alloc_ok(sizes[i]);
        fill(p[i], sizes[i], (unsigned)i);
        rounded += stoke_pinned_round_size(sizes[i]);
        requested += sizes[i];
    }
    stoke_pinned_stats s = stats();
    assert_int_equal(s.bytes_in_use, rounded);
    assert_int_equal(s.count_in_use, k);
    assert_int_equal(s.bytes_requested, requested);
    assert_int_equal(s.bytes_reserved, rounded);
    assert_int_equal(s.peak_bytes_reserved, rounded);
    assert_int_equal(s.pin_calls, k);
    assert_int_equal(s.cache_misses, k);
    assert_true(s.peak_bytes_in_use >= rounded);
    assert_true(s.pin_ns > 0);

    /* Free the first four: cached, not released. */
    uint64_t freed = 0;
    for (int i = 0; i < 4; i++) {
        freed += stoke_pinned_round_size(sizes[i]);
        assert_int_equal(stoke_pinned_free(p[i]), STOKE_OK);
    }
    s = stats();
    assert_int_equal(s.bytes_cached, freed);
    assert_int_equal(s.count_cached, 4);
    assert_int_equal(s.bytes_in_use, rounded - freed);
    assert_int_equal(s.bytes_reserved, rounded);

    assert_int_equal(stoke_pinned_empty_cache(), STOKE_OK);
    s = stats();
    assert_int_equal(s.bytes_cached, 0);
    assert_int_equal(s.count_cached, 0);
    assert_int_equal(s.bytes_reserved, rounded - freed);
    assert_int_equal(s.unpin_calls, 4);
    assert_int_equal(tu_simdev_counters().live_host_blocks, (uint64_t)(k - 4));
    /* The live blocks are intact, still pinned, and still usable. */
    for (int i = 4; i < k; i++) {
        assert_true(check(p[i], sizes[i], (unsigned)i));
        assert_int_equal(stoke_is_pinned(p[i]), 1);
        memset(p[i], 0, sizes[i]);
        assert_int_equal(stoke_pinned_free(p[i]), STOKE_OK);
    }
    assert_int_equal(stoke_pinned_empty_cache(), STOKE_OK);
    s = stats();
    assert_int_equal(s.bytes_reserved, 0);
    assert_int_equal(s.count_in_use, 0);
    assert_int_equal(tu_simdev_counters().live_host_blocks, 0);
}

static void test_pinned_stats_json(void **state)
{
    void *p = alloc_ok(MiB);
    char buf[4096];
    size_t need = 0;
    assert_int_equal(stoke_pinned_stats_json(buf, sizeof(buf), &need), STOKE_OK);
    assert_int_equal(strlen(buf), need);
    assert_true(buf[0] == '{' && buf[need - 1] == '}');
    assert_non_null(strstr(buf, "\"version\":2"));
    assert_non_null(strstr(buf, "\"backend\":\"simdev\""));
    assert_non_null(strstr(buf, "\"bytes_in_use\":1048576,"));
    assert_non_null(strstr(buf, "\"pin_calls\":1,"));
    assert_non_null(strstr(buf, "\"registered_bytes\":0,"));
    assert_non_null(strstr(buf, "\"register_failures\":0}"));
    char small[16];
    size_t need2 = 0;
    assert_int_equal(stoke_pinned_stats_json(small, sizeof(small), &need2), STOKE_ERANGE);
    assert_int_equal(need2, need);
    assert_int_equal(strlen(small), sizeof(small) - 1);
    assert_int_equal(stoke_pinned_stats_json(NULL, 0, &need2), STOKE_ERANGE);
    stoke_pinned_stats old;
    memset(&old, 0, sizeof(old));
    old.size = offsetof(stoke_pinned_stats, bytes_in_use); /* an older, smaller struct */
    assert_int_equal(stoke_pinned_stats_get(&old), STOKE_OK);
    assert_int_equal(old.size, offsetof(stoke_pinned_stats, bytes_in_use));
    assert_int_equal(old.bytes_in_use, 0); /* not written */
    /* a caller built against version 1 (no register_failures): told version 1, the member
     * past its struct not written */
    stoke_pinned_stats v1;
    memset(&v1, 0xab, sizeof(v1));
    v1.size = offsetof(stoke_pinned_stats, register_failures);
    assert_int_equal(stoke_pinned_stats_get(&v1), STOKE_OK);
    assert_int_equal(v1.size, offsetof(stoke_pinned_stats, register_failures));
    assert_int_equal(v1.version, 1);
    assert_int_equal(v1.registered_bytes, 0);
    assert_true(v1.register_failures == 0xababababababababull);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
}

/* ---- the cap -----------------------------------------------------------------------------------
 */

static void test_pinned_cap_releases_idle_then_fails(void **state)
{
    assert_int_equal(stoke_pinned_set_limit(3 * MiB, STOKE_PINNED_LIMIT_FAIL), STOKE_OK);
    void *a = alloc_ok(MiB);
    void *b = alloc_ok(MiB);
    assert_int_equal(stoke_pinned_free(b), STOKE_OK); /* idle: 2 MiB held */
    /* 2 MiB more would pass 3 MiB: the idle block is released first. */
    void *c = alloc_ok(2 * MiB);
    stoke_pinned_stats s = stats();
    assert_int_equal(s.limit_releases, 1);
    assert_int_equal(s.bytes_reserved, 3 * MiB);
    assert_int_equal(s.limit_failures, 0);
    /* Nothing idle is left: the policy says fail. */
    void *d = (void *)1;
    assert_int_equal(stoke_pinned_alloc(MiB, &d), STOKE_ELIMIT);
    assert_null(d);
    assert_non_null(strstr(stoke_last_error(), "cap"));
    s = stats();
    assert_int_equal(s.limit_failures, 1);
    assert_int_equal(s.bytes_reserved, 3 * MiB);
    /* Policy fallback: pageable memory, counted, one warning. */
    assert_int_equal(stoke_pinned_set_limit(3 * MiB, STOKE_PINNED_LIMIT_FALLBACK), STOKE_OK);
    void *e = alloc_ok(MiB);
    void *f = alloc_ok(MiB);
    assert_int_equal(stoke_is_pinned(e), 0);
    memset(e, 3, MiB);
    s = stats();
    assert_int_equal(s.pageable_fallbacks, 2);
    assert_int_equal(s.pageable_fallback_bytes, 2 * MiB);
    assert_int_equal(s.bytes_reserved, 3 * MiB);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "cap"), 1);
    assert_int_equal(stoke_pinned_free(e), STOKE_OK);
    assert_int_equal(stoke_pinned_free(f), STOKE_OK);
    /* Freeing a pinned block makes room again: the next request is pinned. */
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    void *g = alloc_ok(MiB);
    assert_ptr_equal(g, a);
    assert_int_equal(stoke_is_pinned(g), 1);
    assert_int_equal(stoke_pinned_free(g), STOKE_OK);
    assert_int_equal(stoke_pinned_free(c), STOKE_OK);
    uint64_t lim = 0;
    int pol = -1;
    assert_int_equal(stoke_pinned_get_limit(&lim, &pol), STOKE_OK);
    assert_int_equal(lim, 3 * MiB);
    assert_int_equal(pol, STOKE_PINNED_LIMIT_FALLBACK);
    assert_int_equal(stoke_pinned_set_limit(0, 7), STOKE_EINVAL);
}

static void test_pinned_cap_from_env(void **state)
{
    stoke__pinned_reset();
    setenv("STOKE_PINNED_LIMIT", "2M", 1);
    tu_use_simdev();
    uint64_t lim = 0;
    int pol = -1;
    assert_int_equal(stoke_pinned_get_limit(&lim, &pol), STOKE_OK);
    assert_int_equal(lim, 2 * MiB);
    assert_int_equal(pol, STOKE_PINNED_LIMIT_FALLBACK);
    void *a = alloc_ok(2 * MiB);
    void *b = alloc_ok(4096); /* over the cap: pageable */
    assert_int_equal(stoke_is_pinned(a), 1);
    assert_int_equal(stoke_is_pinned(b), 0);
    assert_int_equal(stats().pageable_fallbacks, 1);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    assert_int_equal(stoke_pinned_free(b), STOKE_OK);
}

/* ---- register ----------------------------------------------------------------------------------
 */

/* Memory pinned for one accelerator stays "pinned" for every address inside it after the
 * process chooses another one. */
static void test_pinned_is_pinned_survives_accelerator_change(void **state)
{
    void *a = alloc_ok(MiB);
    void *buf = NULL;
    assert_int_equal(posix_memalign(&buf, 4096, 64 * KiB), 0);
    assert_int_equal(stoke_pin_register(buf, 64 * KiB), STOKE_OK);
    char path[1024];
    assert_int_equal(stoke_plugin_load(tu_test_plugin("alpha.so", path, sizeof(path))), STOKE_OK);
    assert_int_equal(stoke_accelerator_select("alpha"), STOKE_OK);
    assert_int_equal(stoke_is_pinned(a), 1);
    assert_int_equal(stoke_is_pinned((char *)a + 4096 + 7), 1);   /* interior: simdev's */
    assert_int_equal(stoke_is_pinned((char *)buf + 1000), 1);     /* registered range */
    assert_int_equal(stoke_is_pinned((char *)buf + 64 * KiB), 0); /* one past its end */
    char local[16];
    assert_int_equal(stoke_is_pinned(local), 0);
    assert_int_equal(stoke_accelerator_select("simdev"), STOKE_OK);
    assert_int_equal(stoke_pin_unregister(buf), STOKE_OK);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    free(buf);
}

static void test_pinned_register_flips_is_pinned(void **state)
{
    void *buf = NULL;
    assert_int_equal(posix_memalign(&buf, 4096, 64 * KiB), 0);
    assert_int_equal(stoke_is_pinned(buf), 0);
    assert_int_equal(stoke_pin_register(buf, 64 * KiB), STOKE_OK);
    assert_int_equal(stoke_is_pinned(buf), 1);
    assert_int_equal(stoke_is_pinned((char *)buf + 1000), 1);
    assert_int_equal(stoke_pin_register(buf, 64 * KiB), STOKE_EINVAL); /* twice */
    stoke_pinned_stats s = stats();
    assert_int_equal(s.registered_count, 1);
    assert_int_equal(s.registered_bytes, 64 * KiB);
    assert_int_equal(stoke_pin_unregister(buf), STOKE_OK);
    assert_int_equal(stoke_is_pinned(buf), 0);
    assert_int_equal(stoke_pin_unregister(buf), STOKE_EINVAL);
    assert_int_equal(stoke_pin_register(NULL, 10), STOKE_EINVAL);
    assert_int_equal(stoke_pin_register(buf, 0), STOKE_EINVAL);
    s = stats();
    assert_int_equal(s.registered_count, 0);
    assert_int_equal(tu_simdev_counters().live_registered, 0);
    free(buf);
}

static void test_pinned_register_without_accelerator(void **state)
{
    char buf[8192];
    assert_int_equal(stoke_pin_register(buf, sizeof(buf)), STOKE_OK);
    assert_int_equal(stoke_is_pinned(buf), 0);
    assert_int_equal(stoke_pin_unregister(buf), STOKE_OK);
    void *p = alloc_ok(100);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "pinning is not in effect"), 1);
}

/* ---- injected failure
 * ----------------------------------------------------------------------------- */

static void test_pinned_injected_alloc_failure(void **state)
{
    stoke__pinned_reset();
    setenv("STOKE_SIMDEV_FAIL_ALLOC", "2", 1);
    tu_use_simdev();
    void *a = alloc_ok(MiB); /* allocation #1 */
    void *b = (void *)1;
    int rc = stoke_pinned_alloc(2 * MiB, &b); /* #2 fails */
    assert_int_equal(rc, STOKE_ENOMEM);
    assert_null(b);
    assert_non_null(strstr(stoke_last_error(), "could not pin"));
    /* An injected fault is not the memory-lock limit: the hint would point at the wrong cause. */
    assert_null(strstr(stoke_last_error(), "RLIMIT_MEMLOCK"));
    /* The backend's own reason reaches the caller, not only the log. */
    assert_non_null(strstr(stoke_last_error(), "simdev: injected allocation failure"));
    assert_true(tu_log_count(STOKE_LOG_WARN, "injected allocation failure") >= 1);
    stoke_pinned_stats s = stats();
    assert_int_equal(s.pin_failures, 1);
    assert_int_equal(s.bytes_reserved, MiB);
    assert_int_equal(s.peak_bytes_reserved, MiB); /* the failed 2 MiB never existed */
    assert_int_equal(s.count_reserved, 1);
    assert_int_equal(s.count_in_use, 1);
    struct stoke_simdev_counters c = tu_simdev_counters();
    assert_int_equal(c.live_host_blocks, 1);
    assert_int_equal(c.allocs_failed, 1);
    /* The next one works; then everything goes back. */
    void *d = alloc_ok(2 * MiB);
    assert_int_equal(stoke_pinned_free(d), STOKE_OK);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK);
    assert_int_equal(stoke_pinned_empty_cache(), STOKE_OK);
    assert_int_equal(tu_simdev_counters().live_host_blocks, 0);
    assert_int_equal(stats().bytes_reserved, 0);
}

/* A registration the backend refuses is counted in register_failures (version 2), not in
 * pin_failures (allocations), and leaves nothing registered; the next one works. */
static void test_pinned_injected_register_failure(void **state)
{
    stoke__pinned_reset();
    setenv("STOKE_SIMDEV_FAIL_ALLOC", "1", 1); /* simdev counts a registration as one */
    tu_use_simdev();
    void *buf = NULL;
    assert_int_equal(posix_memalign(&buf, 4096, 64 * KiB), 0);
    assert_int_equal(stoke_pin_register(buf, 64 * KiB), STOKE_ENOMEM);
    assert_non_null(strstr(stoke_last_error(), "could not pin 65536 bytes"));
    assert_int_equal(stoke_is_pinned(buf), 0);
    stoke_pinned_stats s = stats();
    assert_int_equal(s.version, 2);
    assert_int_equal(s.register_failures, 1);
    assert_int_equal(s.pin_failures, 0);
    assert_int_equal(s.registered_count, 0);
    assert_int_equal(s.registered_bytes, 0);
    assert_int_equal(stoke_pin_register(buf, 64 * KiB), STOKE_OK);
    s = stats();
    assert_int_equal(s.register_failures, 1);
    assert_int_equal(s.registered_count, 1);
    assert_int_equal(stoke_pin_unregister(buf), STOKE_OK);
    free(buf);
}

/* A backend's host_alloc that returns a positive code (a plugin's mistake) fails the
 * allocation with STOKE_EBACKEND: a caller testing rc < 0 must not take it for success. */
static void test_pinned_positive_backend_code_is_an_error(void **state)
{
    char path[1024];
    assert_int_equal(stoke_plugin_load(tu_test_plugin("zz_alloc_positive.so", path, sizeof(path))),
                     STOKE_OK);
    assert_int_equal(stoke_accelerator_select("allocpositive"), STOKE_OK);
    void *p = (void *)1;
    assert_int_equal(stoke_pinned_alloc(MiB, &p), STOKE_EBACKEND);
    assert_null(p);
    assert_non_null(strstr(stoke_last_error(), "allocpositive could not pin"));
    assert_int_equal(stats().bytes_reserved, 0);
}

/* ---- fork ---------------------------------------------------------------------------------------
 */

/* Runs `fn` in a forked child and returns its exit status (0: every check passed there; the
 * child leaves with _exit, never through cmocka). */
static int in_child(int (*fn)(void *), void *arg)
{
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fn(arg));
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    return WEXITSTATUS(status);
}

typedef struct {
    void *cached, *live; /* the parent's: freed into its cache before the fork, still in use */
    int pipe_go[2], pipe_done[2];
} fork_job;

/* The child: a new block (never the parent's cached one, nor its live one), written 'C' and
 * still 'C' after the parent wrote 'P' into its own; the parent's live block is not freed
 * here; what the child allocates it frees. */
static int fork_child_allocates_afresh(void *arg)
{
    fork_job *j = arg;
    void *mine = NULL;
    if (stoke_pinned_alloc(MiB, &mine) != STOKE_OK || !mine)
        return 10;
    if (mine == j->cached || mine == j->live)
        return 11;
    memset(mine, 'C', MiB);
    char c = 0;
    if (write(j->pipe_go[1], "g", 1) != 1 || read(j->pipe_done[0], &c, 1) != 1)
        return 12;
    for (size_t i = 0; i < MiB; i += 4096)
        if (((char *)mine)[i] != 'C')
            return 13; /* the parent's write reached the child's block */
    if (stoke_pinned_free(j->live) != STOKE_EINVAL ||
        !strstr(stoke_last_error(), "forked this one"))
        return 14;
    if (stoke_pinned_free(mine) != STOKE_OK)
        return 15;
    stoke_pinned_stats s = {.size = sizeof(s)};
    if (stoke_pinned_stats_get(&s) != STOKE_OK || s.count_in_use != 0)
        return 16; /* the parent's live block is not counted here */
    return 0;
}

/* After fork() the child never gets a block of the parent's (simdev maps its blocks shared: the
 * two processes wrote each other's memory) and never frees one of them. */
static void test_pinned_fork_child_never_shares_a_block(void **state)
{
    fork_job j;
    j.cached = alloc_ok(MiB);
    j.live = alloc_ok(MiB);
    assert_int_equal(stoke_pinned_free(j.cached), STOKE_OK); /* in this thread's cache */
    assert_int_equal(pipe(j.pipe_go), 0);
    assert_int_equal(pipe(j.pipe_done), 0);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0)
        _exit(fork_child_allocates_afresh(&j));
    char c = 0;
    assert_int_equal(read(j.pipe_go[0], &c, 1), 1);
    void *again = alloc_ok(MiB);
    assert_ptr_equal(again, j.cached); /* the parent's cache is its own still */
    memset(again, 'P', MiB);
    assert_int_equal(write(j.pipe_done[1], "d", 1), 1);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    for (int i = 0; i < 2; i++) {
        close(j.pipe_go[i]);
        close(j.pipe_done[i]);
    }
    assert_int_equal(stoke_pinned_free(again), STOKE_OK);
    assert_int_equal(stoke_pinned_free(j.live), STOKE_OK); /* the parent frees its own */
}

/* A backend without STOKE_CAP_FORK_SAFE that the parent probed is unavailable in a forked child
 * (a driver's threads are gone: PoCL hung there); the child's pinned memory is ordinary. */
static int fork_child_has_no_accelerator(void *arg)
{
    (void)arg;
    stoke_accelerator_info acc;
    if (stoke_accelerator_get(&acc) != STOKE_ENODEV)
        return 20;
    if (!strstr(acc.reason, "forked from") || !strstr(acc.reason, "does not survive fork"))
        return 21;
    void *p = NULL;
    if (stoke_pinned_alloc(MiB, &p) != STOKE_OK || !p || stoke_is_pinned(p))
        return 22;
    memset(p, 1, MiB);
    return stoke_pinned_free(p) == STOKE_OK ? 0 : 23;
}

static void test_pinned_fork_child_drops_an_unsafe_backend(void **state)
{
    char path[1024];
    assert_int_equal(stoke_plugin_load(tu_test_plugin("alpha.so", path, sizeof(path))), STOKE_OK);
    assert_int_equal(stoke_accelerator_select("alpha"), STOKE_OK);
    void *p = alloc_ok(MiB);
    assert_int_equal(in_child(fork_child_has_no_accelerator, NULL), 0);
    stoke_accelerator_info acc; /* the parent keeps it */
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
}

/* A thread of the parent in the registry (it takes the registry's lock again and again) while
 * the main thread forks: each child's first pinned allocation selects again under that lock,
 * which the child makes anew (it waited for ever on a lock held by a thread that is not there,
 * within a few forks). */
static atomic_int spin_stop;

static void *registry_spinner(void *arg)
{
    (void)arg;
    while (!atomic_load(&spin_stop))
        (void)stoke_backend_count();
    return NULL;
}

static int fork_child_allocates(void *arg)
{
    (void)arg;
    alarm(10); /* a hang dies of SIGALRM: the parent sees a signal, not exit 0 */
    /* the test's log capture has a lock of its own, which the spinner may have held at the
     * fork (its lines are the parent's anyway): the library's own sink from here */
    stoke_log_set_callback(NULL, NULL);
    stoke_log_set_level(STOKE_LOG_ERROR);
    void *p = NULL;
    if (stoke_pinned_alloc(64 * 1024, &p) != STOKE_OK || !p)
        return 30;
    return stoke_pinned_free(p) == STOKE_OK ? 0 : 31;
}

static void test_pinned_fork_while_registry_busy(void **state)
{
    /* Every backend probed first: the spinner then only takes the registry's lock, never
     * dlopen()s a driver.  A fork while another thread is inside dlopen() leaves
     * ThreadSanitizer's own library-list mutex held in the child, whose dlopen() then waits for
     * ever in the sanitizer's interceptor (glibc makes its own loader lock anew in the child;
     * the sanitizer does not).  That is the sanitizer's limit, not the library's: this test is
     * about the registry's lock. */
    (void)stoke_backend_count();
    pthread_t t;
    atomic_store(&spin_stop, 0);
    assert_int_equal(pthread_create(&t, NULL, registry_spinner, NULL), 0);
    for (int i = 0; i < 40; i++)
        assert_int_equal(in_child(fork_child_allocates, NULL), 0);
    atomic_store(&spin_stop, 1);
    pthread_join(t, NULL);
}

/* ---- devices and threads ------------------------------------------------------------------------
 */

static void test_pinned_cache_is_per_device(void **state)
{
    assert_int_equal(stoke_device_set(1), STOKE_OK);
    void *on1 = alloc_ok(MiB);
    assert_int_equal(stoke_device_set(0), STOKE_OK);
    assert_int_equal(stoke_pinned_free(on1), STOKE_OK); /* back to device 1's cache */
    void *on0 = alloc_ok(MiB);
    assert_ptr_not_equal(on0, on1); /* never served from another device's cache */
    assert_int_equal(stoke_device_set(1), STOKE_OK);
    void *again = alloc_ok(MiB);
    assert_ptr_equal(again, on1);
    assert_int_equal(stoke_pinned_free(again), STOKE_OK);
    assert_int_equal(stoke_device_set(0), STOKE_OK);
    assert_int_equal(stoke_pinned_free(on0), STOKE_OK);
    assert_int_equal(stats().pin_calls, 2);
}

static void *alloc_free_and_exit(void *arg)
{
    void **out = arg;
    void *p = NULL;
    if (stoke_pinned_alloc(256 * KiB, &p) == STOKE_OK) {
        *out = p;
        stoke_pinned_free(p); /* stays in this thread's cache until it exits */
    }
    return NULL;
}

static void test_pinned_thread_exit_returns_its_cache(void **state)
{
    void *p = NULL;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, alloc_free_and_exit, &p), 0);
    pthread_join(t, NULL);
    assert_non_null(p);
    assert_int_equal(stats().count_cached, 1);
    void *q = alloc_ok(256 * KiB);
    assert_ptr_equal(p, q);
    assert_int_equal(stoke_pinned_free(q), STOKE_OK);
    stoke_pinned_stats s = stats();
    assert_int_equal(s.total_allocs, 2);
    assert_int_equal(s.total_frees, 2);
    assert_int_equal(s.pin_calls, 1);
}

static void *steal_from_other_thread(void *arg)
{
    void **p = arg;
    if (stoke_pinned_alloc(256 * KiB, p) != STOKE_OK)
        *p = NULL;
    return NULL;
}

static void test_pinned_idle_block_of_another_thread_is_used(void **state)
{
    void *a = alloc_ok(256 * KiB);
    assert_int_equal(stoke_pinned_free(a), STOKE_OK); /* in this thread's cache */
    void *b = NULL;
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, steal_from_other_thread, &b), 0);
    pthread_join(t, NULL);
    assert_ptr_equal(a, b); /* not a second pin */
    assert_int_equal(stats().pin_calls, 1);
    assert_int_equal(stoke_pinned_free(b), STOKE_OK);
}

#define STRESS_THREADS 4
#define STRESS_ITERS   3000

typedef struct {
    int id;
    int failures;
    pthread_mutex_t *lock;
    void **handoff; /* one shared slot: blocks freed by a thread that did not allocate them */
} stress_arg;

static void *stress_thread(void *argp)
{
    stress_arg *a = argp;
    stoke_stream *s = NULL;
    stoke_device_buffer *dbuf = NULL;
    if (stoke_stream_create(NULL, &s) != STOKE_OK ||
        stoke_device_buffer_create(s, 64 * KiB, &dbuf) != STOKE_OK) {
        a->failures++;
        stoke_stream_destroy(s);
        return NULL;
    }
    static const size_t sizes[] = {4096, 10000, 64 * KiB, 300 * KiB, MiB, MiB + 7, 3 * MiB};
    void *live[8] = {0};
    unsigned seed = (unsigned)a->id * 2654435761u + 1;
    for (int i = 0; i < STRESS_ITERS; i++) {
        seed = seed * 1103515245u + 12345u;
        int slot = (int)((seed >> 8) % 8);
        if (live[slot]) {
            if (!check(live[slot], 64, (unsigned)(uintptr_t)live[slot]))
                a->failures++;
            if ((seed >> 20) % 4 == 0) {
                if (stoke_copy_h2d_async(dbuf, 0, live[slot], 4096, s) != STOKE_OK ||
                    stoke_pinned_record_stream(live[slot], s) != STOKE_OK)
                    a->failures++;
            }
            if ((seed >> 22) % 5 == 0) { /* hand it to whoever comes next */
                pthread_mutex_lock(a->lock);
                void *other = *a->handoff;
                *a->handoff = live[slot];
                pthread_mutex_unlock(a->lock);
                live[slot] = NULL;
                if (other && stoke_pinned_free(other) != STOKE_OK)
                    a->failures++;
            } else {
                if (stoke_pinned_free(live[slot]) != STOKE_OK)
                    a->failures++;
                live[slot] = NULL;
            }
        } else {
            size_t n = sizes[(seed >> 12) % 7];
            if (stoke_pinned_alloc(n, &live[slot]) != STOKE_OK) {
                a->failures++;
                continue;
            }
            fill(live[slot], 64, (unsigned)(uintptr_t)live[slot]);
        }
        if (i % 500 == 0)
            stoke_pinned_stats_get(&(stoke_pinned_stats){.size = sizeof(stoke_pinned_stats)});
        if (i % 1000 == 999 && a->id == 0)
            stoke_pinned_empty_cache();
    }
    for (int k = 0; k < 8; k++)
        if (live[k] && stoke_pinned_free(live[k]) != STOKE_OK)
            a->failures++;
    stoke_stream_synchronize(s);
    stoke_device_buffer_destroy(dbuf);
    stoke_stream_destroy(s);
    return NULL;
}

static void test_pinned_threads_stress(void **state)
{
    pthread_t t[STRESS_THREADS];
    stress_arg args[STRESS_THREADS];
    pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    void *handoff = NULL;
    for (int i = 0; i < STRESS_THREADS; i++) {
        args[i] = (stress_arg){.id = i, .lock = &lock, .handoff = &handoff};
        assert_int_equal(pthread_create(&t[i], NULL, stress_thread, &args[i]), 0);
    }
    for (int i = 0; i < STRESS_THREADS; i++) {
        pthread_join(t[i], NULL);
        assert_int_equal(args[i].failures, 0);
    }
    if (handoff)
        assert_int_equal(stoke_pinned_free(handoff), STOKE_OK);
    stoke_pinned_stats s = stats();
    assert_int_equal(s.count_in_use, 0);
    assert_int_equal(s.bytes_in_use, 0);
    assert_int_equal(s.total_allocs, s.total_frees);
    assert_int_equal(s.cache_hits + s.cache_misses, s.total_allocs);
    assert_int_equal(s.bytes_reserved, s.bytes_cached + s.bytes_waiting);
    assert_true(s.cache_hits > s.cache_misses);
    /* Every event recorded has completed: empty_cache (after one allocation processes the
     * waiting list) leaves nothing pinned. */
    stoke_pinned_free(alloc_ok(4096));
    assert_int_equal(stoke_pinned_empty_cache(), STOKE_OK);
    s = stats();
    assert_int_equal(s.count_waiting, 0);
    assert_int_equal(s.bytes_reserved, 0);
    assert_int_equal(tu_simdev_counters().live_host_blocks, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pinned_round_size_table, setup_none, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_no_accelerator_warns_once, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_standin_is_resident, setup_none, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_disabled_by_env, setup_none, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_free_then_alloc_returns_same_block,
                                        setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_bad_pointers, setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_rerecording_a_live_block_reuses_events,
                                        setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_pending_copy_blocks_reuse, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_failed_copy_releases_block, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_stats_match_rounding_and_empty_cache_keeps_live,
                                        setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_stats_json, setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_cap_releases_idle_then_fails, setup_simdev,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_cap_from_env, setup_none, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_is_pinned_survives_accelerator_change,
                                        setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_register_flips_is_pinned, setup_simdev,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_register_without_accelerator, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_injected_alloc_failure, setup_none, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_injected_register_failure, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_positive_backend_code_is_an_error, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_fork_child_never_shares_a_block, setup_simdev,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_fork_child_drops_an_unsafe_backend, setup_none,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_fork_while_registry_busy, setup_simdev,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_cache_is_per_device, setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_thread_exit_returns_its_cache, setup_simdev,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_pinned_idle_block_of_another_thread_is_used,
                                        setup_simdev, teardown),
        cmocka_unit_test_setup_teardown(test_pinned_threads_stress, setup_simdev, teardown),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
