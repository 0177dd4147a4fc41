/* The worker -> consumer hand-off with batches of one sample (workers spinning before they
 * sleep, the caller's thread making batches itself when the one it needs is not being made), and
 * num_workers = STOKE_LOADER_WORKERS_AUTO: every sample exactly once and in order for 0/1/2/4
 * workers, out of order too, with and without worker_init (without it the caller's thread may
 * make batches, as worker num_workers), set_epoch and destroy with batches in flight, errors
 * from a worker or the caller's thread, the auto count's bounds and its report. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include <sched.h>

#include "testutil.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "loader/loader_internal.h"
#include "test_loader_ds.h"

#define N 3000

static stoke_loader_opts opts(size_t bs, int workers)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = bs;
    o.num_workers = workers;
    o.pin_memory = 0;
    return o;
}

/* A loader of batch size 1 over n samples of *t (made here): `workers`, prefetch_factor
 * `prefetch`, the dataset's worker_init kept when `init` (without it the caller's thread may
 * make batches). */
static stoke_loader *bs1_loader(tds *t, stoke_dataset *ds, uint64_t n, int init, int workers,
                                int prefetch)
{
    tds_make(t, ds, n);
    if (!init)
        ds->worker_init = NULL;
    stoke_loader_opts o = opts(1, workers);
    o.prefetch_factor = prefetch;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, ds, &l), STOKE_OK);
    return l;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* One epoch: checks every batch's bytes and that each index comes exactly once; in order, that
 * batch k has seq k and (no shuffle) index k.  Stores the order in out (n entries).  Optionally
 * sleeps `consumer_us` per batch (a slow consumer). */
static void epoch(stoke_loader *l, uint64_t n, int in_order, uint64_t *out, long consumer_us)
{
    tu_seen seen;
    tu_seen_init(&seen, n);
    stoke_batch *b;
    uint64_t k = 0;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        assert_int_equal(stoke_batch_count(b), 1);
        uint64_t idx = stoke_batch_indices(b)[0];
        if (in_order)
            assert_int_equal(stoke_batch_seq(b), k);
        tu_seen_add(&seen, idx);
        assert_true(k < n);
        if (out)
            out[k] = idx;
        k++;
        stoke_batch_release(b);
        if (consumer_us)
            sleep_us(consumer_us);
    }
    assert_int_equal(rc, STOKE_EEND);
    assert_int_equal(k, n);
    tu_seen_check_all(&seen);
    tu_seen_free(&seen);
}

/* Which worker ids get() was called with (ids 0..63). */
static atomic_ulong ids_seen;

static int id_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                  char *msg, size_t msg_len)
{
    if (worker >= 0 && worker < 64)
        atomic_fetch_or(&ids_seen, 1ul << worker);
    else
        atomic_fetch_or(&ids_seen, 1ul << 63);
    return tds_get(user, index, dst, lens, worker, msg, msg_len);
}

/* get() saw only the workers' ids, and the caller's thread's (num_workers) only when the
 * dataset has no worker_init; the caller's batches are counted in assisted_batches. */
static void check_ids(const stoke_loader *l, int workers, int has_init)
{
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    unsigned long seen = atomic_exchange(&ids_seen, 0);
    unsigned long workers_mask = workers ? (1ul << workers) - 1 : 0;
    unsigned long caller = 1ul << workers;
    assert_int_equal(seen & ~(workers_mask | caller), 0);
    if (workers == 0) {
        assert_int_equal(seen, caller); /* num_workers 0: the caller's thread, worker 0 */
        assert_int_equal(st.assisted_batches, 0);
    } else if (has_init) {
        assert_int_equal(seen & caller, 0);
        assert_int_equal(st.assisted_batches, 0);
    } else {
        assert_int_equal((seen & caller) != 0, st.assisted_batches != 0);
        assert_true(st.assisted_batches <= st.batches);
    }
}

static void check_stats_bounds(const stoke_loader *l, uint64_t want_workers)
{
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.workers, want_workers);
    assert_true(st.workers_active_min <= st.workers_active);
    assert_true(st.workers_active <= st.workers_active_max);
    assert_true(st.workers_active_max <= st.workers);
    if (!st.workers_auto) {
        assert_int_equal(st.workers_active, st.workers);
        assert_int_equal(st.workers_active_min, st.workers);
        assert_int_equal(st.workers_changes, 0);
    }
    if (st.workers_active_min < st.workers_active_max)
        assert_true(st.workers_changes >= 1);
}

/* Batch size 1, in order and out of order, 0/1/2/4 workers, shuffled and not: every sample once,
 * in order the same order for every worker count (and 0..n-1 unshuffled), over two epochs. */
static void test_bs1_every_sample_once(void **state)
{
    static const int workers[] = {0, 1, 2, 4};
    uint64_t *ref = malloc(N * sizeof(uint64_t)), *got = malloc(N * sizeof(uint64_t));
    assert_non_null(ref);
    assert_non_null(got);
    for (int cfg = 0; cfg < 8; cfg++) {
        int shuffle = cfg & 1, in_order = !(cfg & 2), init = !(cfg & 4);
        for (size_t wi = 0; wi < sizeof(workers) / sizeof(workers[0]); wi++) {
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, N);
            ds.get = id_get;
            if (!init)
                ds.worker_init = NULL;
            atomic_store(&ids_seen, 0);
            stoke_loader_opts o = opts(1, workers[wi]);
            o.in_order = in_order;
            o.shuffle = shuffle;
            o.seed = 7;
            o.persistent_workers = (int)(wi & 1);
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            for (int e = 0; e < 2; e++) {
                if (e)
                    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                epoch(l, N, in_order, got, 0);
                if (in_order && !shuffle)
                    for (uint64_t k = 0; k < N; k++)
                        assert_int_equal(got[k], k);
                if (in_order && shuffle && e == 0) {
                    if (wi == 0)
                        memcpy(ref, got, N * sizeof(uint64_t));
                    else
                        assert_memory_equal(ref, got, N * sizeof(uint64_t));
                }
            }
            check_stats_bounds(l, (uint64_t)workers[wi]);
            check_ids(l, workers[wi], init);
            stoke_loader_destroy(l);
            tds_free(&t);
        }
    }
    free(ref);
    free(got);
}

/* set_epoch in the middle of an epoch, with batches queued and finished in the rings: the next
 * epoch starts clean (every sample once, in order), and nothing of the old one shows up. */
static void test_set_epoch_mid_epoch(void **state)
{
    static const int workers[] = {1, 2, 4};
    for (size_t wi = 0; wi < sizeof(workers) / sizeof(workers[0]); wi++) {
        for (int persistent = 0; persistent < 2; persistent++) {
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, 400);
            stoke_loader_opts o = opts(1, workers[wi]);
            o.prefetch_factor = 8;
            o.persistent_workers = persistent;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            for (int cut = 1; cut < 60; cut += 29) {
                stoke_batch *b;
                for (int k = 0; k < cut; k++) {
                    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
                    assert_int_equal(stoke_batch_seq(b), (uint64_t)k);
                    stoke_batch_release(b);
                }
                assert_int_equal(stoke_loader_set_epoch(l, 5), STOKE_OK);
                assert_int_equal(stoke_loader_epoch(l), 5);
                epoch(l, 400, 1, NULL, 0);
                assert_int_equal(stoke_loader_set_epoch(l, 0), STOKE_OK);
            }
            stoke_loader_destroy(l);
            tds_free(&t);
        }
    }
}

/* destroy in the middle of an epoch, with the rings full (a batch held, others queued and made)
 * and right after create: joins the workers, leaks nothing (ASan), races nothing (TSan). */
static void test_destroy_mid_epoch(void **state)
{
    for (int round = 0; round < 40; round++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 1000);
        stoke_loader_opts o = opts(1, 1 + round % 4);
        o.prefetch_factor = 1 + round % 6;
        o.in_order = round % 3 != 0;
        o.persistent_workers = round & 1;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b = NULL;
        if (round % 5) {
            for (int k = 0; k < round % 7; k++) {
                assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
                stoke_batch_release(b);
            }
            assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* held through destroy */
            assert_true(tds_batch_ok(b));
        }
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A sample fails in a worker: every earlier batch is delivered in order, then the error names
 * the worker and the sample, the epoch is over, and the next epoch fails the same way. */
static void test_worker_error(void **state)
{
    static const int workers[] = {1, 2, 4, -1, -2, -4}; /* negative: without worker_init */
    for (size_t wi = 0; wi < sizeof(workers) / sizeof(workers[0]); wi++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 500);
        t.fail_index = 77;
        if (workers[wi] < 0)
            ds.worker_init = NULL;
        int nw = abs(workers[wi]);
        stoke_loader_opts o = opts(1, nw);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        for (int e = 0; e < 2; e++) {
            stoke_batch *b;
            int rc;
            uint64_t k = 0;
            while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                assert_int_equal(stoke_batch_indices(b)[0], k);
                k++;
                stoke_batch_release(b);
            }
            assert_int_equal(rc, STOKE_EDATA);
            assert_int_equal(k, 77);
            const char *msg = stoke_loader_last_error(l);
            assert_non_null(strstr(msg, "worker "));
            /* "worker N (the caller's thread): ..." when the caller made it */
            char caller[64];
            snprintf(caller, sizeof(caller), "worker %d (the caller's thread): ", nw);
            if (strstr(msg, caller) == NULL) {
                int id = -1;
                assert_int_equal(sscanf(strstr(msg, "worker "), "worker %d:", &id), 1);
                assert_true(id >= 0 && id < nw);
            }
            assert_non_null(strstr(msg, "sample 77 of testds: row 77 is corrupt"));
            assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
            assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
        }
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A loader of batch size 1 over *t (n samples, shuffled) whose dataset has read() (when
 * `scattered`), without worker_init; o adjusted by the caller first. */
static stoke_loader *scatter_loader(tds *t, stoke_dataset *ds, uint64_t n, int scattered,
                                    stoke_loader_opts o)
{
    tds_make(t, ds, n);
    ds->worker_init = NULL;
    if (scattered)
        ds->read = tds_get_scattered;
    o.shuffle = 1;
    o.seed = 5;
    o.prefetch_factor = STOKE_LOADER_PREFETCH_AUTO; /* a deep window: threads take groups */
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, ds, &l), STOKE_OK);
    return l;
}

/* One epoch's deliveries: (count << 32 | first index) per batch into out (at most n), the
 * status that ended it into *rc.  Returns the batches. */
static uint64_t deliveries(stoke_loader *l, uint64_t *out, uint64_t n, int *rc)
{
    stoke_batch *b;
    uint64_t k = 0;
    while ((*rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        size_t c = stoke_batch_count(b);
        assert_true(k < n);
        out[k++] = (uint64_t)c << 32 | (c ? stoke_batch_indices(b)[0] : 0xffffffffu);
        stoke_batch_release(b);
    }
    return k;
}

/* Groups of one-sample batches made with one get_scattered call (worker.c, make_scattered):
 * with 1 and 2 workers and auto, every sample once, in the order of 0 workers, the bytes right,
 * in calls of 2 to 64 samples (epochs are repeated until a thread took a group: it needs a
 * measured batch time); a failing sample ends the epoch at its batch and is named as without
 * get_scattered (the group is made again batch by batch); on_error=skip delivers the same
 * batches as without; with a timeout the loader never calls it. */
static void test_groups_one_call(void **state)
{
    (void)state;
    enum { GN = 2000 };
    static uint64_t ref[GN], got[GN];
    tds t;
    stoke_dataset ds;
    stoke_loader *l = scatter_loader(&t, &ds, GN, 1, opts(1, 0));
    epoch(l, GN, 1, ref, 0);
    assert_int_equal(atomic_load(&t.scatter_calls), 0); /* 0 workers: one batch per next() */
    stoke_loader_destroy(l);
    tds_free(&t);
    static const int workers[] = {1, 2, STOKE_LOADER_WORKERS_AUTO};
    for (int wi = 0; wi < 3; wi++) {
        l = scatter_loader(&t, &ds, GN, 1, opts(1, workers[wi]));
        for (int e = 0; e < 50 && (e < 2 || atomic_load(&t.scatter_calls) == 0); e++) {
            if (e)
                assert_int_equal(stoke_loader_set_epoch(l, 0), STOKE_OK);
            epoch(l, GN, 1, got, 0);
            assert_memory_equal(ref, got, sizeof(got));
        }
        int calls = atomic_load(&t.scatter_calls);
        if (calls == 0)
            fail_msg("%d workers: no group made with get_scattered in 50 epochs", workers[wi]);
        assert_true(atomic_load(&t.scatter_samples) >= 2 * calls);
        assert_true(atomic_load(&t.scatter_max) <= STOKE__AHEAD_RUN);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
    /* a failing sample, then on_error=skip: with and without get_scattered alike */
    static uint64_t with[GN], without[GN];
    for (int skip = 0; skip < 2; skip++) {
        uint64_t nk[2] = {0, 0};
        for (int sc = 0; sc < 2; sc++) {
            stoke_loader_opts o = opts(1, 2);
            if (skip)
                o.on_error = STOKE_ON_ERROR_SKIP;
            l = scatter_loader(&t, &ds, GN, sc, o);
            t.fail_index = ref[1500];
            int rc = STOKE_OK;
            for (int e = 0; e < 20 && (e < 2 || (sc && atomic_load(&t.scatter_calls) == 0)); e++) {
                if (e)
                    assert_int_equal(stoke_loader_set_epoch(l, 0), STOKE_OK);
                nk[sc] = deliveries(l, sc ? with : without, GN, &rc);
                assert_int_equal(rc, skip ? STOKE_EEND : STOKE_EDATA);
                if (!skip) {
                    char want[96];
                    snprintf(want, sizeof(want), "sample %llu of testds: row %llu is corrupt",
                             (unsigned long long)ref[1500], (unsigned long long)ref[1500]);
                    assert_non_null(strstr(stoke_loader_last_error(l), want));
                }
            }
            stoke_loader_destroy(l);
            tds_free(&t);
        }
        assert_int_equal(nk[0], skip ? GN : 1500);
        assert_int_equal(nk[1], nk[0]);
        assert_memory_equal(with, without, nk[0] * sizeof(uint64_t));
    }
    /* a timeout: every batch by itself */
    stoke_loader_opts o = opts(1, 2);
    o.timeout_ms = 60000;
    l = scatter_loader(&t, &ds, GN, 1, o);
    epoch(l, GN, 1, got, 0);
    assert_memory_equal(ref, got, sizeof(got));
    assert_int_equal(atomic_load(&t.scatter_calls), 0);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* The auto worker count: one per CPU this process may run on (its affinity), up to the cap. */
static uint64_t auto_cap(void)
{
    cpu_set_t set;
    long c = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 0;
    if (c < 1)
        c = sysconf(_SC_NPROCESSORS_ONLN);
    if (c < 1)
        c = 1;
    return c < STOKE_LOADER_WORKERS_AUTO_MAX ? (uint64_t)c : STOKE_LOADER_WORKERS_AUTO_MAX;
}

static uint64_t buffers_of(const stoke_loader *l, uint64_t *bytes)
{
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    *bytes = st.buffer_bytes;
    return st.buffers;
}

/* prefetch_factor = STOKE_LOADER_PREFETCH_AUTO: small batches on worker threads get a window of
 * 1 MiB of buffers (at most 256 batches), large ones and 0 workers keep 2 per worker; an
 * explicit prefetch_factor is kept; the order is the same as with an explicit 2 (and the
 * consumer may hold that many batches); a negative prefetch_factor is refused. */
static void test_prefetch_auto(void **state)
{
    (void)state;
    static const struct {
        size_t bs;
        int workers, prefetch;
        uint64_t want; /* buffers; 0: 1 MiB / buffer_bytes (at most 256) + 2 */
    } cases[] = {
        {1, 2, STOKE_LOADER_PREFETCH_AUTO, 0},
        {1, 1, STOKE_LOADER_PREFETCH_AUTO, 0},
        {1, 2, 2, 2 * 2 + 2},
        {1, 0, STOKE_LOADER_PREFETCH_AUTO, 2 * 1 + 2},
        {(256 << 10) / DS_BYTES + 1, 2, STOKE_LOADER_PREFETCH_AUTO, 2 * 2 + 2},
    };
    uint64_t *ref = malloc(N * sizeof(uint64_t)), *got = malloc(N * sizeof(uint64_t));
    assert_non_null(ref);
    assert_non_null(got);
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, cases[c].bs == 1 ? N : 100000); /* 10 large batches */
        stoke_loader_opts o = opts(cases[c].bs, cases[c].workers);
        o.prefetch_factor = cases[c].prefetch;
        o.shuffle = 1;
        o.seed = 11;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        uint64_t bytes, nbuf = buffers_of(l, &bytes);
        uint64_t want = cases[c].want;
        if (!want)
            want = ((1u << 20) / bytes > 256 ? 256 : (1u << 20) / bytes) + 2;
        if (nbuf != want)
            fail_msg("case %zu: %llu buffers of %llu bytes, want %llu", c, (unsigned long long)nbuf,
                     (unsigned long long)bytes, (unsigned long long)want);
        if (cases[c].bs == 1) {
            assert_true(want > 6 || cases[c].prefetch || !cases[c].workers);
            epoch(l, N, 1, got, 0);
            if (c == 0)
                memcpy(ref, got, N * sizeof(uint64_t));
            else
                assert_memory_equal(ref, got, N * sizeof(uint64_t));
            /* the caller may hold every buffer but one before the loader says so */
            assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
            stoke_batch **held = calloc(nbuf, sizeof(*held));
            assert_non_null(held);
            uint64_t k = 0;
            while (k < nbuf && stoke_loader_next(l, &held[k]) == STOKE_OK)
                k++;
            assert_int_equal(k, nbuf);
            for (uint64_t i = 0; i < k; i++)
                stoke_batch_release(held[i]);
            free(held);
        }
        stoke_loader_destroy(l);
        tds_free(&t);
    }
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, N);
    stoke_loader_opts o = opts(1, 2);
    o.prefetch_factor = -1;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "STOKE_LOADER_PREFETCH_AUTO"));
    tds_free(&t);
    free(ref);
    free(got);
}

/* The dataset's prefetch hook, recorded: every call's indices, in call order. */
typedef struct pf_log {
    pthread_mutex_t mu;
    uint64_t idx[16384];
    size_t len[8192], ncalls, nidx;
} pf_log;
static pf_log g_pf;

static void pf_record(void *user, const stoke_hint *h)
{
    (void)user;
    if (h->kind != STOKE_HINT_NEXT)
        return;
    const uint64_t *idx = h->indices;
    size_t count = h->count;
    pthread_mutex_lock(&g_pf.mu);
    if (g_pf.ncalls < 8192 && g_pf.nidx + count <= 16384) {
        memcpy(&g_pf.idx[g_pf.nidx], idx, count * sizeof(*idx));
        g_pf.len[g_pf.ncalls++] = count;
        g_pf.nidx += count;
    }
    pthread_mutex_unlock(&g_pf.mu);
}

/* One epoch of batches of `bs` (the last one shorter); the indices in delivery order into
 * out[], each checked against the bytes.  Returns the samples. */
static size_t pf_epoch(stoke_loader *l, uint64_t *out)
{
    stoke_batch *b;
    size_t k = 0;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        for (size_t j = 0; j < stoke_batch_count(b); j++)
            out[k++] = stoke_batch_indices(b)[j];
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    return k;
}

/* Small batches (3 samples, 1000 of them: the last has 1) with a dataset that has prefetch:
 * with 0 workers the hook gets, before batch k is made, exactly the indices of batch k + 1 (so
 * 999 calls an epoch), and nothing past the epoch's end; with 1 and 2 workers every call names
 * the indices of one batch of the epoch, in its order.  The order and bytes are those of the
 * same loader without the hook (the indices computed ahead are the ones used).  Batches over
 * STOKE_DATASET_PREFETCH_MAX samples get no call. */
static void test_prefetch_next_batch(void **state)
{
    (void)state;
    enum { PN = 2998, BS = 3 };
    static uint64_t ref[2][PN], got[PN];
    pthread_mutex_init(&g_pf.mu, NULL);
    for (int w = -1; w <= 2; w++) { /* -1: no hook, the reference order */
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, PN);
        if (w >= 0)
            ds.hint = pf_record;
        g_pf.ncalls = g_pf.nidx = 0;
        stoke_loader_opts o = opts(BS, w < 0 ? 0 : w);
        o.shuffle = 1;
        o.seed = 11;
        o.prefetch_factor = STOKE_LOADER_PREFETCH_AUTO; /* a deep window: workers take groups */
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        for (int e = 0; e < 2; e++) {
            if (e)
                assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
            size_t calls0 = g_pf.ncalls, idx0 = g_pf.nidx;
            uint64_t fills0 = atomic_load(&stoke__ahead_fills);
            assert_int_equal(pf_epoch(l, w < 0 ? ref[e] : got), PN);
            uint64_t fills = atomic_load(&stoke__ahead_fills) - fills0;
            /* 0 workers: the indices come in runs of 64 positions (21 batches of 3), not one
             * fill per batch (1000), nor two (the look-ahead's and the batch's) */
            if (w <= 0 && fills > PN / (STOKE__AHEAD_RUN - BS) + 2)
                fail_msg("0 workers (hook %d), epoch %d: %llu runs of indices filled for 1000 "
                         "batches of 3",
                         w == 0, e, (unsigned long long)fills);
            if (w < 0)
                continue;
            assert_memory_equal(ref[e], got, sizeof(got));
            /* every call: the indices of one batch, as delivered */
            size_t at = idx0;
            for (size_t c = calls0; c < g_pf.ncalls; c++) {
                size_t n = g_pf.len[c], k = 0;
                while (k < PN && got[k] != g_pf.idx[at])
                    k++;
                if (k % BS != 0 || k >= PN || n != (PN - k < BS ? PN - k : (size_t)BS) ||
                    memcmp(&got[k], &g_pf.idx[at], n * sizeof(uint64_t)) != 0)
                    fail_msg("%d workers: prefetch call %zu is not a batch of the epoch", w,
                             c - calls0);
                if (w == 0 && k != (c - calls0 + 1) * BS)
                    fail_msg("0 workers: call %zu names batch %zu, not the next one", c - calls0,
                             k / BS);
                at += n;
            }
            if (w == 0)
                assert_int_equal(g_pf.ncalls - calls0, PN / BS); /* 1000 batches: 999 calls */
        }
        stoke_loader_destroy(l);
        tds_free(&t);
    }
    /* too large a batch: no call, the same samples */
    {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, PN);
        ds.hint = pf_record;
        g_pf.ncalls = 0;
        stoke_loader_opts o = opts(STOKE_DATASET_PREFETCH_MAX + 1, 0);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        assert_int_equal(pf_epoch(l, got), PN);
        for (uint64_t k = 0; k < PN; k++)
            assert_int_equal(got[k], k);
        assert_int_equal(g_pf.ncalls, 0);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
    pthread_mutex_destroy(&g_pf.mu);
}

/* Workers that are not given work are not woken for it: an auto loader whose active count is
 * 0 (the caller's thread makes every batch) wakes its sleeping workers a few times at most in
 * an epoch of 3000 batches, not once per delivery; the epoch is whole and in order. */
static void test_idle_workers_left_asleep(void **state)
{
    (void)state;
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, N);
    ds.worker_init = NULL; /* the caller's thread may make batches */
    stoke_loader_opts o = opts(1, 2);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* the workers run */
    stoke_batch_release(b);
    pthread_mutex_lock(&l->mu);
    l->nact = 0; /* what auto sets at its floor (the hill climb itself is off: not auto) */
    pthread_mutex_unlock(&l->mu);
    sleep_us(20000); /* the workers finish what they took and go to sleep */
    pthread_mutex_lock(&l->mu);
    uint64_t wakes0 = l->st_work_wakes;
    pthread_mutex_unlock(&l->mu);
    uint64_t k = 1;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        assert_int_equal(stoke_batch_seq(b), k);
        k++;
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    assert_int_equal(k, N);
    pthread_mutex_lock(&l->mu);
    uint64_t wakes = l->st_work_wakes - wakes0, assisted = l->st.assisted_batches;
    pthread_mutex_unlock(&l->mu);
    if (wakes > 10)
        fail_msg("%llu wake-ups of idle workers in %llu batches (%llu made by the caller)",
                 (unsigned long long)wakes, (unsigned long long)(k - 1),
                 (unsigned long long)assisted);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* The loader's side of the auto hill climb (autotune.c): the active count and its bounds. */
typedef struct climb {
    stoke__autotune a;
    int nact, nact_min, nworkers;
} climb;

/* One period of the climb as stoke_loader_next runs it (stoke__autotune_delivered): the step,
 * then the new active count. */
static int period_solo(climb *l, double tput, double wait, double assisted, double cpu, double solo)
{
    stoke__autotune_period p = {tput, wait, assisted, cpu, solo};
    int n = stoke__autotune_step(&l->a, l->nact, l->nact_min, l->nworkers, &p);
    assert_true(n >= l->nact_min && n <= l->nworkers);
    l->nact = n;
    return n;
}

static int period_cpu(climb *l, double tput, double wait, double assisted, double cpu)
{
    return period_solo(l, tput, wait, assisted, cpu, 0.0); /* solo unknown */
}

/* A period in which the process got all the CPU it could use. */
static int period(climb *l, double tput, double wait, double assisted)
{
    return period_cpu(l, tput, wait, assisted, 1.0);
}

/* The auto rule, driven with made-up periods (deterministic; the loader tests above only check
 * bounds because real periods depend on timing): the caller's thread making most batches means
 * one fewer; a removal that lost throughput is undone and held for 2 periods; a consumer that
 * waits gets one more; an addition that did not gain is undone, and next time the count goes
 * the other way; a consumer that never waits gets one fewer; with every worker given work and
 * the consumer still waiting, one fewer only when the process did not get its CPUs (another
 * process holds some); never outside [nact_min, nworkers]. */
static void test_auto_rule(void **state)
{
    (void)state;
    climb c;
    climb *l = &c;
    stoke__autotune_init(&l->a, 2);
    l->nworkers = 2;
    l->nact = 2;
    l->nact_min = 0;
    assert_int_equal(period(l, 100, 0.08, 0.0), 2); /* waits 8%: between the rules, no move */
    assert_int_equal(period(l, 100, 0.08, 0.7), 1); /* the caller made 70%: one fewer */
    assert_int_equal(period(l, 80, 0.08, 0.7), 2);  /* lost 20%: undone ... */
    assert_int_equal(period(l, 100, 0.08, 0.7), 2); /* ... and held for 2 periods */
    assert_int_equal(period(l, 100, 0.08, 0.7), 2);
    assert_int_equal(period(l, 100, 0.08, 0.7), 1); /* then the rule again */
    assert_int_equal(period(l, 100, 0.08, 0.7), 0); /* no loss: it pays, down to 0 workers */
    assert_int_equal(period(l, 100, 0.08, 0.9), 0); /* never below nact_min */
    assert_int_equal(period(l, 100, 0.30, 0.0), 1); /* the consumer waits 30%: one more */
    assert_int_equal(period(l, 120, 0.30, 0.0), 2); /* gained 20%: kept, and one more */
    assert_int_equal(period(l, 121, 0.30, 0.0), 1); /* gained < 5%: undone, held 2 */
    assert_int_equal(period(l, 121, 0.30, 0.0), 1);
    assert_int_equal(period(l, 121, 0.30, 0.0), 1);
    assert_int_equal(period(l, 121, 0.30, 0.0), 0); /* adding failed last: the other way */
    assert_int_equal(period(l, 100, 0.30, 0.0), 1); /* lost: undone */
    l->a.hold = 0;
    assert_int_equal(period(l, 100, 0.01, 0.0), 0); /* never waits: one fewer */
    l->a.hold = 0;
    l->a.last = 0;
    l->nact = 2;
    l->a.failed = 0;
    /* at nworkers and still waiting, the process getting its CPUs: never above, no move */
    assert_int_equal(period_cpu(l, 100, 0.50, 0.0, 0.95), 2);
    assert_int_equal(period_cpu(l, 100, 0.50, 0.0, 0.86), 2);
    /* the same on a busy machine (the process got 60% of what it could use): one fewer */
    assert_int_equal(period_cpu(l, 100, 0.50, 0.0, 0.60), 1);

    /* solo: the consumer waits and the loader delivers under 3/4 of what one thread makes back
     * to back (hand-offs cost more than the batches): straight to nact_min */
    l->nworkers = 4;
    l->nact = 4;
    l->nact_min = 0;
    l->a.hold = 0;
    l->a.last = 0;
    l->a.failed = 0;
    l->a.backoff = 0;
    assert_int_equal(period_solo(l, 100, 0.50, 0.0, 1.0, 0.80), 4); /* 0.80: no move */
    assert_int_equal(period_solo(l, 100, 0.08, 0.0, 1.0, 0.40), 4); /* no wait: the consumer's */
    assert_int_equal(period_solo(l, 100, 0.50, 0.0, 1.0, 0.40), 0); /* 0.40: all the way */
    /* gained: kept; the caller's thread makes every batch (waits 90%): one more to try */
    assert_int_equal(period_solo(l, 150, 0.90, 1.0, 1.0, 0.0), 1);
    assert_int_equal(period_solo(l, 100, 0.90, 0.5, 1.0, 0.50), 0); /* lost: undone, held 2 */
    assert_int_equal(period_solo(l, 150, 0.90, 1.0, 1.0, 0.0), 0);
    assert_int_equal(period_solo(l, 150, 0.90, 1.0, 1.0, 0.0), 0);
    l->nact = 4;
    l->a.hold = 0;
    l->a.last = 0;
    assert_int_equal(period_solo(l, 100, 0.50, 0.0, 1.0, 0.40), 0);
    assert_int_equal(period_solo(l, 50, 0.90, 1.0, 1.0, 0.0), 4); /* the drop lost: undone */
    l->a.hold = 0;
    /* and not tried again while it is the move that failed last (held, then no move) */
    assert_int_equal(period_solo(l, 100, 0.50, 0.0, 1.0, 0.40), 4);
    l->nact_min = 1; /* threads that need a worker_init: never below 1 */
    l->a.failed = 0;
    assert_int_equal(period_solo(l, 100, 0.50, 0.0, 1.0, 0.40), 1);
}

/* num_workers = auto: one worker per online core up to the cap, reported; the active count stays
 * within its bounds; order and contents as with a fixed count; other negative values are still
 * rejected. */
static void test_auto_cap_and_report(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, N);
    stoke_loader *l = NULL;
    stoke_loader_opts o = opts(1, -1);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    o = opts(1, -3);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    o = opts(1, STOKE_LOADER_WORKERS_AUTO);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.workers_auto, 1);
    assert_int_equal(st.workers, auto_cap());
    assert_true(st.workers <= STOKE_LOADER_WORKERS_AUTO_MAX);
    assert_int_equal(st.workers_active, st.workers); /* all of them at first */
    /* a buffer per batch in flight for the cap: prefetch_factor x workers + 2 */
    assert_int_equal(st.buffers, 2 * st.workers + 2);
    for (int e = 0; e < 3; e++) {
        if (e)
            assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
        epoch(l, N, 1, NULL, 0);
    }
    check_stats_bounds(l, auto_cap());
    /* an older caller's shorter struct gets its prefix and no more */
    stoke_loader_stats old;
    memset(&old, 0xab, sizeof(old));
    old.size = (uint32_t)offsetof(stoke_loader_stats, workers);
    assert_int_equal(stoke_loader_get_stats(l, &old), STOKE_OK);
    assert_int_equal(old.workers, 0xababababababababull);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* A get() that takes ~300 us per sample (a sleep: no CPU) against a consumer that waits: the
 * workers are the bottleneck and auto never gives fewer than one work (tds has worker_init, so
 * the caller's thread never makes batches itself). */
static int slow_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                    char *msg, size_t msg_len)
{
    sleep_us(300);
    return tds_get(user, index, dst, lens, worker, msg, msg_len);
}

static void test_auto_slow_get(void **state)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 400);
    ds.get = slow_get;
    stoke_loader_opts o = opts(1, STOKE_LOADER_WORKERS_AUTO);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    epoch(l, 400, 1, NULL, 0);
    check_stats_bounds(l, auto_cap());
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_true(st.workers_active_min >= 1);
    assert_int_equal(st.workers_active_max, st.workers);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* A fast get() against a consumer that sleeps 1 ms per batch: it rarely needs to wait, so auto
 * tends to give work to fewer workers; without worker_init it may go down to none (the caller's
 * thread makes the batches), with worker_init never below one.  Whatever the count does, every
 * sample comes once and in order and the reported bounds hold. */
static void test_auto_fast_get_slow_consumer(void **state)
{
    for (int init = 1; init >= 0; init--) {
        tds t;
        stoke_dataset ds;
        stoke_loader *l = bs1_loader(&t, &ds, 600, init, STOKE_LOADER_WORKERS_AUTO, 4);
        epoch(l, 600, 1, NULL, 1000);
        check_stats_bounds(l, auto_cap());
        stoke_loader_stats st;
        memset(&st, 0, sizeof(st));
        st.size = sizeof(st);
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        /* Whether and how far the count moved depends on timing (not asserted: no timed
         * assertions); where it may go is not: never below one worker with worker_init. */
        assert_true(st.workers_active_min >= (init ? 1u : 0u));
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A consumer waiting for a batch that a worker is making makes a later batch itself, however
 * short batches are (docs/loader.md, "Hand-off": help; a sample here takes well under a
 * microsecond).  The consumer takes batch 0, then stays out of next() until the worker blocks
 * in the first sample past 50 it makes, p, which it does until the caller's thread makes a
 * sample after p (3 s at most).  The caller's thread does not start a sample past 50 before
 * the worker blocks (should it get there first, it waits for the block inside the sample), and
 * the window holds the whole epoch, so the consumer can always help.  Without the help the
 * consumer only waits for p (the batches it makes because nobody makes them are never after p),
 * the worker gives up after 3 s and the test fails; so it did when only batches of 20 us or
 * more were helped.  With it every sample still comes once and in order.  With a timeout set
 * the consumer never helps (it stays free to watch the workers' samples): the worker gives up
 * after 300 ms and no sample after p came from the caller's thread meanwhile. */
static atomic_int help_blocked, help_seen, help_done, help_wait_ms;
static atomic_ulong help_p;

static void help_wait_block(void)
{
    for (int i = 0; i < 3000 && !atomic_load(&help_done); i++)
        sleep_us(1000);
}

static int help_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                    char *msg, size_t msg_len)
{
    if (worker == 1 && index >= 50)
        help_wait_block();
    if (worker == 1 && atomic_load(&help_blocked) && index > atomic_load(&help_p))
        atomic_store(&help_seen, 1);
    if (worker == 0 && index >= 50 && !atomic_load(&help_done)) {
        atomic_store(&help_p, index);
        atomic_store(&help_blocked, 1);
        atomic_store(&help_done, 1);
        for (int i = 0; i < atomic_load(&help_wait_ms) && !atomic_load(&help_seen); i++)
            sleep_us(1000);
        atomic_store(&help_blocked, 0);
    }
    return tds_get(user, index, dst, lens, worker, msg, msg_len);
}

static void help_epoch(unsigned timeout_ms, int wait_ms, int want_seen)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 200);
    ds.worker_init = NULL; /* the caller's thread may make batches (worker id 1) */
    ds.get = help_get;
    atomic_store(&help_blocked, 0);
    atomic_store(&help_seen, 0);
    atomic_store(&help_done, 0);
    atomic_store(&help_wait_ms, wait_ms);
    atomic_store(&help_p, 0);
    stoke_loader_opts o = opts(1, 1);
    o.prefetch_factor = 256; /* a window over the whole epoch */
    o.timeout_ms = timeout_ms;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    for (uint64_t k = 0; k < 200; k++) { /* sequential: sample k in batch k */
        assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
        assert_true(tds_batch_ok(b));
        assert_int_equal(stoke_batch_seq(b), k);
        assert_int_equal(stoke_batch_indices(b)[0], k);
        stoke_batch_release(b);
        if (k == 0)
            help_wait_block(); /* the worker makes 1.. alone, up to p */
    }
    assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
    assert_int_equal(atomic_load(&help_done), 1);
    if (want_seen && !atomic_load(&help_seen))
        fail_msg("the consumer waited for the blocked worker's batch without making one itself");
    if (!want_seen && atomic_load(&help_seen))
        fail_msg("the consumer made a batch while a worker was blocked, with timeout_ms %u",
                 timeout_ms);
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    if (want_seen)
        assert_true(st.assisted_batches >= 1);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* Batches released by another thread than the consumer, which releases without `mu`
 * (loader_internal.h, `released`): the consumer hands each batch to a releaser thread that
 * gives it back 20 us later, and keeps at most two in its queue, so that with 3 or 4 buffers
 * the workers often find none free.  Every sample comes once and in order, for 1 and 2
 * workers, with and without worker_init, and the next epoch finds every buffer back. */
typedef struct rel_queue {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    stoke_batch *q[8];
    int n, done;
} rel_queue;

static void *releaser_main(void *arg)
{
    rel_queue *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->n && !r->done)
            pthread_cond_wait(&r->cv, &r->mu);
        if (!r->n)
            break;
        stoke_batch *b = r->q[0];
        memmove(r->q, r->q + 1, (size_t)(--r->n) * sizeof(r->q[0]));
        pthread_mutex_unlock(&r->mu);
        sleep_us(20);
        stoke_batch_release(b);
        pthread_mutex_lock(&r->mu);
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void test_release_from_another_thread(void **state)
{
    (void)state;
    for (int workers = 1; workers <= 2; workers++) {
        for (int init = 0; init < 2; init++) {
            tds t;
            stoke_dataset ds;
            stoke_loader *l = bs1_loader(&t, &ds, 400, init, workers, 1);
            rel_queue r = {.n = 0, .done = 0};
            pthread_mutex_init(&r.mu, NULL);
            pthread_cond_init(&r.cv, NULL);
            pthread_t th;
            assert_int_equal(pthread_create(&th, NULL, releaser_main, &r), 0);
            stoke_batch *b;
            uint64_t k = 0;
            int rc;
            for (;;) {
                pthread_mutex_lock(&r.mu);
                while (r.n >= 2)
                    pthread_cond_wait(&r.cv, &r.mu);
                pthread_mutex_unlock(&r.mu);
                if ((rc = stoke_loader_next(l, &b)) != STOKE_OK)
                    break;
                assert_true(tds_batch_ok(b));
                assert_int_equal(stoke_batch_seq(b), k);
                assert_int_equal(stoke_batch_indices(b)[0], k);
                k++;
                pthread_mutex_lock(&r.mu);
                r.q[r.n++] = b;
                pthread_cond_broadcast(&r.cv);
                pthread_mutex_unlock(&r.mu);
            }
            assert_int_equal(rc, STOKE_EEND);
            assert_int_equal(k, 400);
            pthread_mutex_lock(&r.mu);
            r.done = 1;
            pthread_cond_broadcast(&r.cv);
            pthread_mutex_unlock(&r.mu);
            pthread_join(th, NULL);
            assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK); /* every buffer back */
            for (uint64_t j = 0; j < 400; j++) {
                assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
                stoke_batch_release(b);
            }
            assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
            stoke_loader_destroy(l);
            pthread_cond_destroy(&r.cv);
            pthread_mutex_destroy(&r.mu);
            tds_free(&t);
        }
    }
}

/* A worker that sleeps because the consumer holds every buffer is woken by a release from
 * another thread, while the consumer stays out of next(): the consumer takes all 3 buffers of
 * 1 worker with a window of 1, waits 50 ms (the worker has long gone to sleep for one), then
 * another thread releases one, and the worker must start on sample 3 within 10 s.  A release
 * that only put the batch back for the next next() would leave it asleep. */
static atomic_ulong starve_high; /* 1 + the highest index get() was asked for */

static int starve_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                      char *msg, size_t msg_len)
{
    uint64_t seen = atomic_load(&starve_high);
    while (index + 1 > seen && !atomic_compare_exchange_weak(&starve_high, &seen, index + 1))
        ;
    return tds_get(user, index, dst, lens, worker, msg, msg_len);
}

static void *release_one(void *arg)
{
    stoke_batch_release(arg);
    return NULL;
}

static void test_release_wakes_starved_worker(void **state)
{
    (void)state;
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, 100);
    ds.get = starve_get;
    atomic_store(&starve_high, 0);
    stoke_loader_opts o = opts(1, 1);
    o.prefetch_factor = 1; /* a window of 1: 3 buffers */
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(stoke_loader_next(l, &b[i]), STOKE_OK);
        assert_int_equal(stoke_batch_indices(b[i])[0], (uint64_t)i);
    }
    sleep_us(50000);
    assert_int_equal(atomic_load(&starve_high), 3); /* no buffer: sample 3 not started */
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, release_one, b[0]), 0);
    pthread_join(th, NULL);
    for (int i = 0; i < 10000 && atomic_load(&starve_high) < 4; i++)
        sleep_us(1000);
    if (atomic_load(&starve_high) < 4)
        fail_msg("the worker still sleeps 10 s after another thread released a buffer");
    stoke_batch_release(b[1]);
    stoke_batch_release(b[2]);
    stoke_batch *x;
    for (uint64_t k = 3; k < 100; k++) {
        assert_int_equal(stoke_loader_next(l, &x), STOKE_OK);
        assert_int_equal(stoke_batch_indices(x)[0], k);
        stoke_batch_release(x);
    }
    assert_int_equal(stoke_loader_next(l, &x), STOKE_EEND);
    stoke_loader_destroy(l);
    tds_free(&t);
}

static void test_consumer_helps_while_waiting(void **state)
{
    (void)state;
    help_epoch(0, 3000, 1);
    help_epoch(60000, 300, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bs1_every_sample_once),
        cmocka_unit_test(test_set_epoch_mid_epoch),
        cmocka_unit_test(test_destroy_mid_epoch),
        cmocka_unit_test(test_worker_error),
        cmocka_unit_test(test_groups_one_call),
        cmocka_unit_test(test_auto_cap_and_report),
        cmocka_unit_test(test_auto_slow_get),
        cmocka_unit_test(test_auto_fast_get_slow_consumer),
        cmocka_unit_test(test_prefetch_auto),
        cmocka_unit_test(test_auto_rule),
        cmocka_unit_test(test_prefetch_next_batch),
        cmocka_unit_test(test_idle_workers_left_asleep),
        cmocka_unit_test(test_consumer_helps_while_waiting),
        cmocka_unit_test(test_release_from_another_thread),
        cmocka_unit_test(test_release_wakes_starved_worker),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
