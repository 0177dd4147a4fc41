/* The loader's bad-sample policy (opts.on_error): error, skip within a budget, replace; the
 * quarantine and its counts; datasets with get_batch; the CLI's --on-error and JSON. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/stoke.h"
#include "testutil.h"

#define N  100
#define BS 8

/* A synthetic dataset (label = index) whose samples in bad[] fail with a message in the
 * "SOURCE: REASON" form the built-in sources use. */
typedef struct bds {
    stoke_dataset inner;
    uint64_t bad[8];
    int nbad;
    atomic_int batch_calls;
} bds;

static int is_bad(const bds *b, uint64_t i)
{
    for (int k = 0; k < b->nbad; k++)
        if (b->bad[k] == i)
            return 1;
    return 0;
}

static uint64_t bds_length(void *user)
{
    (void)user;
    return N;
}

/* The index whose get() answers STOKE_ECANCELED, as a Python dataset interrupted by Ctrl-C
 * does (test_canceled_is_not_bad); UINT64_MAX: none. */
static uint64_t g_cancel = UINT64_MAX;

static int bds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    bds *b = user;
    if (index == g_cancel) {
        snprintf(msg, msg_len, "interrupted at sample %" PRIu64, index);
        return STOKE_ECANCELED;
    }
    if (is_bad(b, index)) {
        snprintf(msg, msg_len, "shard-%" PRIu64 ".bin@%" PRIu64 ": corrupt sample %" PRIu64,
                 index / 10, index * 512, index);
        return STOKE_EFORMAT;
    }
    return b->inner.get(b->inner.user, index, dst, lens, worker, msg, msg_len);
}

static int bds_get_batch(void *user, const uint64_t *idx, size_t count, const stoke_slots *dst,
                         int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    bds *b = user;
    atomic_fetch_add(&b->batch_calls, 1);
    for (size_t j = 0; j < count; j++) {
        void *d[TU_FIELDS];
        stoke_slots_sample(dst, b->inner.nfields, b->inner.fields, j, d);
        int rc = bds_get(user, idx[j], d, NULL, worker, msg, msg_len);
        if (rc) {
            *err_index = idx[j];
            return rc;
        }
    }
    return STOKE_OK;
}

static void bds_open(bds *b, int with_batch, const uint64_t *bad, int nbad, stoke_dataset *ds)
{
    memset(b, 0, sizeof(*b));
    stoke_synthetic_opts so;
    stoke_synthetic_opts_init(&so);
    so.length = N;
    so.ndim = 1;
    so.shape[0] = 12;
    so.classes = 1u << 30; /* label = index */
    assert_int_equal(stoke_synthetic_open(&so, &b->inner), STOKE_OK);
    if (nbad)
        memcpy(b->bad, bad, sizeof(uint64_t) * (size_t)nbad);
    b->nbad = nbad;
    stoke_dataset_init(ds);
    ds->kind = STOKE_DATASET_MAP;
    snprintf(ds->name, sizeof(ds->name), "bds");
    ds->user = b;
    ds->nfields = b->inner.nfields;
    ds->fields = b->inner.fields;
    ds->length = bds_length;
    ds->get = bds_get;
    if (with_batch)
        ds->read = bds_get_batch;
}

/* opts.errors_go_on, and in_order 0, for run_epoch */
static int g_go_on, g_unordered;

typedef struct run {
    int rc;
    int nerr, errs[8]; /* the errors an epoch went on after (g_go_on) */
    char err[1024];
    uint64_t n, nbatches;
    uint64_t idx[2 * N];
    size_t counts[2 * N];
    stoke_loader_stats st;
    uint64_t nq;
    stoke_bad_sample q[8];
} run;

/* One epoch under `policy` (stoke_on_error_parse syntax); checks every delivered slot holds the
 * sample its index names (label = index, data = synthetic bytes). */
static void run_epoch(const char *policy, int workers, int shuffle, int with_batch,
                      const uint64_t *bad, int nbad, run *r)
{
    bds b;
    stoke_dataset ds;
    bds_open(&b, with_batch, bad, nbad, &ds);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    assert_int_equal(stoke_on_error_parse(policy, &o), STOKE_OK);
    o.batch_size = BS;
    o.num_workers = workers;
    o.shuffle = shuffle;
    o.seed = 5;
    o.pin_memory = 0;
    o.errors_go_on = g_go_on;
    o.in_order = !g_unordered;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    memset(r, 0, sizeof(*r));
    stoke_batch *bt;
    for (;;) {
        r->rc = stoke_loader_next(l, &bt);
        if (r->rc != STOKE_OK && r->rc != STOKE_EEND && g_go_on && r->nerr < 8) {
            r->errs[r->nerr++] = r->rc;
            continue;
        }
        if (r->rc != STOKE_OK)
            break;
        size_t c = stoke_batch_count(bt);
        const unsigned char *data = stoke_batch_data(bt, 0);
        const int64_t *label = stoke_batch_data(bt, 1);
        for (size_t j = 0; j < c; j++) {
            uint64_t i = stoke_batch_indices(bt)[j];
            assert_false(is_bad(&b, i));
            assert_int_equal(label[j], (int64_t)i);
            unsigned char want[12];
            stoke_synthetic_fill(0, i, want, sizeof(want));
            assert_memory_equal(data + j * 12, want, 12);
            r->idx[r->n++] = i;
        }
        r->counts[r->nbatches++] = c;
        stoke_batch_release(bt);
    }
    snprintf(r->err, sizeof(r->err), "%s", stoke_loader_last_error(l));
    r->st.size = sizeof(r->st);
    assert_int_equal(stoke_loader_get_stats(l, &r->st), STOKE_OK);
    r->nq = r->st.quarantined;
    for (uint64_t k = 0; k < r->nq && k < 8; k++)
        assert_int_equal(stoke_loader_quarantine(l, (size_t)k, &r->q[k]), STOKE_OK);
    stoke_bad_sample extra;
    assert_int_equal(stoke_loader_quarantine(l, (size_t)r->nq, &extra), STOKE_ERANGE);
    if (with_batch)
        assert_true(atomic_load(&b.batch_calls) > 0);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&b.inner);
}

static const uint64_t BAD[] = {13, 14, 50};

static void test_error_policy(void **state)
{
    (void)state;
    for (int w = 0; w <= 2; w += 2) {
        run r;
        run_epoch("error", w, 0, 0, BAD, 1, &r);
        assert_int_equal(r.rc, STOKE_EFORMAT);
        /* the worker, the dataset and the sample, each once */
        if (strncmp(r.err, "worker ", 7) != 0 ||
            !strstr(r.err, ": bds: shard-1.bin@6656: corrupt sample 13") ||
            strstr(r.err, "sample 13 of"))
            fail_msg("%s", r.err);
        assert_int_equal(r.n, 8); /* the first batch only */
        assert_int_equal(r.st.bad_samples, 1);
        assert_int_equal(r.st.skipped_samples, 0);
        assert_int_equal(r.nq, 1);
        assert_int_equal(r.q[0].index, 13);
        assert_int_equal(r.q[0].code, STOKE_EFORMAT);
        assert_int_equal(r.q[0].action, STOKE_ON_ERROR_ERROR);
        assert_string_equal(r.q[0].source, "shard-1.bin@6656");
        assert_string_equal(r.q[0].reason, "corrupt sample 13");
    }
}

/* errors_go_on: each failed batch is an error of stoke_loader_next, and the epoch goes on
 * with the next batch (torch's iterator); every other batch delivered once, in order when
 * in_order.  An interrupt (STOKE_ECANCELED) still ends the epoch. */
static void test_errors_go_on(void **state)
{
    (void)state;
    static run clean, r;
    const bds bad3 = {.bad = {BAD[0], BAD[1], BAD[2]}, .nbad = 3}; /* (is_bad's) */
    g_go_on = 1;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        run_epoch("error", 0, shuffle, 0, NULL, 0, &clean);
        assert_int_equal(clean.rc, STOKE_EEND);
        assert_int_equal(clean.nerr, 0);
        /* the clean epoch's order without the batches holding 13, 14 or 50 */
        uint64_t want[N], nw = 0;
        int nfail = 0;
        for (uint64_t k = 0; k < N; k += BS) {
            int bad = 0;
            for (uint64_t j = k; j < k + BS && j < N; j++)
                bad |= is_bad(&bad3, clean.idx[j]);
            nfail += bad;
            for (uint64_t j = k; j < k + BS && j < N && !bad; j++)
                want[nw++] = clean.idx[j];
        }
        if (!shuffle)
            assert_int_equal(nfail, 2); /* 8..15, 48..55 */
        for (int w = 0; w <= 3; w++)
            for (int gb = 0; gb < 2; gb++)
                for (g_unordered = 0; g_unordered < 2; g_unordered++) {
                    run_epoch("error", w, shuffle, gb, BAD, 3, &r);
                    assert_int_equal(r.rc, STOKE_EEND);
                    assert_int_equal(r.nerr, nfail);
                    for (int k = 0; k < r.nerr; k++)
                        assert_int_equal(r.errs[k], STOKE_EFORMAT);
                    assert_int_equal(r.n, nw);
                    assert_int_equal(r.nbatches, (N + BS - 1) / BS - (uint64_t)nfail);
                    assert_int_equal(r.st.bad_samples, nfail);
                    assert_int_equal(r.nq, nfail);
                    if (!g_unordered) {
                        assert_memory_equal(r.idx, want, sizeof(uint64_t) * nw);
                        continue;
                    }
                    unsigned char seen[N] = {0}; /* as completed: the same samples, once */
                    for (uint64_t k = 0; k < r.n; k++) {
                        assert_true(r.idx[k] < N && !seen[r.idx[k]]);
                        seen[r.idx[k]] = 1;
                    }
                    for (uint64_t k = 0; k < nw; k++)
                        assert_true(seen[want[k]]);
                }
    }
    g_unordered = 0;
    /* an interrupt is no bad batch: it still ends the epoch */
    g_cancel = 20;
    for (int w = 0; w <= 2; w += 2) {
        run_epoch("error", w, 0, 0, NULL, 0, &r);
        assert_int_equal(r.nerr, 1); /* (run_epoch went on: the end came) */
        assert_int_equal(r.errs[0], STOKE_ECANCELED);
        assert_int_equal(r.rc, STOKE_EEND);
        assert_int_equal(r.n, 16);
    }
    g_cancel = UINT64_MAX;
    g_go_on = 0;
}

/* skip: the bad samples leave their batches, the rest keep their order, whatever the workers,
 * with or without get_batch, shuffled or not. */
static void test_skip(void **state)
{
    (void)state;
    static run clean, r;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        run_epoch("error", 0, shuffle, 0, NULL, 0, &clean);
        assert_int_equal(clean.rc, STOKE_EEND);
        assert_int_equal(clean.n, N);
        uint64_t want[N], nw = 0;
        for (uint64_t k = 0; k < N; k++)
            if (clean.idx[k] != 13 && clean.idx[k] != 14 && clean.idx[k] != 50)
                want[nw++] = clean.idx[k];
        for (int w = 0; w <= 3; w++)
            for (int gb = 0; gb < 2; gb++) {
                run_epoch("skip", w, shuffle, gb, BAD, 3, &r);
                assert_int_equal(r.rc, STOKE_EEND);
                assert_int_equal(r.n, N - 3);
                assert_memory_equal(r.idx, want, sizeof(uint64_t) * nw);
                assert_int_equal(r.nbatches, (N + BS - 1) / BS); /* no batch lost */
                assert_int_equal(r.st.samples, N - 3);
                assert_int_equal(r.st.bad_samples, 3);
                assert_int_equal(r.st.skipped_samples, 3);
                assert_int_equal(r.nq, 3);
                uint64_t qs = 0;
                for (int k = 0; k < 3; k++) {
                    assert_int_equal(r.q[k].action, STOKE_ON_ERROR_SKIP);
                    assert_int_equal(r.q[k].replacement, UINT64_MAX);
                    qs += r.q[k].index;
                    char s[64];
                    snprintf(s, sizeof(s), "corrupt sample %" PRIu64, r.q[k].index);
                    assert_string_equal(r.q[k].reason, s);
                }
                assert_int_equal(qs, 13 + 14 + 50);
                if (!shuffle) {
                    assert_int_equal(r.counts[1], BS - 2); /* 8..15 without 13, 14 */
                    assert_int_equal(r.counts[6], BS - 1); /* 48..55 without 50 */
                    assert_int_equal(r.q[0].index, 13);
                    assert_int_equal(r.q[2].index, 50);
                }
            }
    }
}

/* A get() that answers STOKE_ECANCELED while its batch is still wanted (an interrupt) is no
 * bad sample: skip and replace end the epoch with it, nothing quarantined. */
static void test_canceled_is_not_bad(void **state)
{
    (void)state;
    static run r;
    g_cancel = 20;
    const char *policies[] = {"skip", "replace", "error"};
    for (size_t p = 0; p < 3; p++)
        for (int w = 0; w <= 2; w += 2)
            for (int gb = 0; gb < 2; gb++) {
                /* (under error, no bad sample: 13 would end the epoch first) */
                run_epoch(policies[p], w, 0, gb, BAD, p == 2 ? 0 : 3, &r);
                assert_int_equal(r.rc, STOKE_ECANCELED);
                assert_non_null(strstr(r.err, "interrupted at sample 20"));
                /* the batches before 16..23, none after: 13 and 14 skipped or replaced */
                assert_int_equal(r.n, p == 0 ? 14 : 16);
                assert_int_equal(r.st.bad_samples, p == 2 ? 0 : 2);
                assert_int_equal(r.nq, p == 2 ? 0 : 2);
            }
    g_cancel = UINT64_MAX;
}

/* Past the budget (a count, a share of the epoch): the error, at the batch that crosses it. */
static void test_skip_budget(void **state)
{
    (void)state;
    static run r;
    const char *over[] = {"skip:2", "skip:2%", "skip:2.5%", "replace:1"};
    for (size_t k = 0; k < 4; k++)
        for (int w = 0; w <= 2; w += 2) {
            run_epoch(over[k], w, 0, 0, BAD, 3, &r);
            assert_int_equal(r.rc, STOKE_EFORMAT);
            if (!strstr(r.err, "too many bad samples"))
                fail_msg("%s: %s", over[k], r.err);
            uint64_t at = k == 3 ? 14 : 50;
            char want[64];
            snprintf(want, sizeof(want), "corrupt sample %" PRIu64, at);
            assert_non_null(strstr(r.err, want));
            assert_non_null(strstr(r.err, k == 3 ? "too many bad samples: 2 this epoch"
                                                 : "too many bad samples: 3 this epoch"));
            assert_non_null(strstr(r.err, "; the one past it: "));
            /* every batch before the failing one was delivered */
            assert_int_equal(r.nbatches, k == 3 ? 1 : 6);
            assert_int_equal(r.st.bad_samples, k == 3 ? 2 : 3);
            /* the one past the budget is quarantined as the error that ended the epoch, not
             * as skipped or replaced: it was never delivered */
            assert_int_equal(r.st.skipped_samples, k == 3 ? 0 : 2);
            assert_int_equal(r.st.replaced_samples, k == 3 ? 1 : 0);
            assert_int_equal(r.nq, k == 3 ? 2 : 3);
            assert_int_equal(r.q[r.nq - 1].index, at);
            assert_int_equal(r.q[r.nq - 1].action, STOKE_ON_ERROR_ERROR);
            assert_int_equal(r.q[r.nq - 1].replacement, UINT64_MAX);
            assert_int_equal(r.q[0].action, k == 3 ? STOKE_ON_ERROR_REPLACE : STOKE_ON_ERROR_SKIP);
        }
    /* a budget of 0: the first bad sample (13) ends the epoch; 14, after it in the same batch,
     * is not reached: neither counted nor listed (it was listed as skipped, and counted in the
     * message's "2 this epoch") */
    for (int w = 0; w <= 2; w += 2) {
        run_epoch("skip:0", w, 0, 0, BAD, 3, &r);
        assert_int_equal(r.rc, STOKE_EFORMAT);
        assert_non_null(strstr(r.err, "too many bad samples: 1 this epoch, the budget is 0; "
                                      "the one past it: "));
        assert_non_null(strstr(r.err, "corrupt sample 13"));
        assert_int_equal(r.nbatches, 1);
        assert_int_equal(r.st.bad_samples, 1);
        assert_int_equal(r.st.skipped_samples, 0);
        assert_int_equal(r.nq, 1);
        assert_int_equal(r.q[0].index, 13);
        assert_int_equal(r.q[0].action, STOKE_ON_ERROR_ERROR);
    }
    const char *enough[] = {"skip:3", "skip:3%", "skip:100%", "skip"};
    for (size_t k = 0; k < 4; k++) {
        run_epoch(enough[k], 1, 0, 0, BAD, 3, &r);
        assert_int_equal(r.rc, STOKE_EEND);
        assert_int_equal(r.n, N - 3);
    }
}

/* A percent budget is of the epoch's positions, which a weighted sampler draws (1,000 here from a
 * dataset of 100), not of the dataset's length: 8 bad indices (about 80 bad draws) within 10% of
 * 1,000.  (The budget counted min(length, positions) for every sampler once: 10 of 100.) */
static void test_skip_budget_of_draws(void **state)
{
    (void)state;
    static const uint64_t bad8[] = {3, 11, 25, 38, 47, 59, 72, 96};
    static double w[N];
    for (int i = 0; i < N; i++)
        w[i] = 1.0;
    for (int workers = 0; workers <= 2; workers += 2) {
        bds b;
        stoke_dataset ds;
        bds_open(&b, 0, bad8, 8, &ds);
        stoke_loader_opts o;
        stoke_loader_opts_init(&o);
        assert_int_equal(stoke_on_error_parse("skip:10%", &o), STOKE_OK);
        o.batch_size = BS;
        o.num_workers = workers;
        o.seed = 5;
        o.pin_memory = 0;
        o.sampler.kind = STOKE_SAMPLER_WEIGHTED;
        o.sampler.weights = w;
        o.sampler.num_weights = N;
        o.sampler.num_samples = 10 * N;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *bt;
        int rc;
        uint64_t n = 0;
        while ((rc = stoke_loader_next(l, &bt)) == STOKE_OK) {
            n += stoke_batch_count(bt);
            stoke_batch_release(bt);
        }
        if (rc != STOKE_EEND)
            fail_msg("%d workers: %s", workers, stoke_last_error());
        stoke_loader_stats st = {.size = sizeof(st)};
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        assert_true(st.bad_samples > 10 && st.bad_samples <= 100); /* (93) */
        assert_int_equal(n + st.bad_samples, 10 * N);
        stoke_loader_destroy(l);
        stoke_dataset_close(&ds);
        stoke_dataset_close(&b.inner);
    }
}

/* replace: full batches, the bad slots filled by a function of (seed, index) that is the same
 * for every run and worker count; the quarantine names the replacement. */
static void test_replace(void **state)
{
    (void)state;
    static run a, r;
    run_epoch("replace", 0, 0, 0, BAD, 3, &a);
    assert_int_equal(a.rc, STOKE_EEND);
    assert_int_equal(a.n, N);
    for (uint64_t b = 0; b < a.nbatches; b++)
        assert_int_equal(a.counts[b], b + 1 < a.nbatches ? BS : N % BS);
    for (uint64_t k = 0; k < N; k++)
        if (k != 13 && k != 14 && k != 50)
            assert_int_equal(a.idx[k], k);
    assert_int_equal(a.st.replaced_samples, 3);
    assert_int_equal(a.nq, 3);
    for (int k = 0; k < 3; k++) {
        assert_int_equal(a.q[k].index, BAD[k]);
        assert_int_equal(a.q[k].action, STOKE_ON_ERROR_REPLACE);
        assert_int_equal(a.q[k].replacement, a.idx[BAD[k]]);
        assert_true(a.idx[BAD[k]] < N);
        assert_int_not_equal(a.idx[BAD[k]], BAD[k]);
    }
    for (int w = 0; w <= 3; w++)
        for (int gb = 0; gb < 2; gb++) {
            run_epoch("replace", w, 0, gb, BAD, 3, &r);
            assert_int_equal(r.rc, STOKE_EEND);
            assert_int_equal(r.n, N);
            assert_memory_equal(r.idx, a.idx, sizeof(uint64_t) * N);
        }
    /* shuffled: the same replacement for the same bad index */
    run_epoch("replace", 2, 1, 0, BAD, 3, &r);
    assert_int_equal(r.n, N);
    assert_int_equal(r.nq, 3);
    for (int q = 0; q < 3; q++) {
        int k = 0;
        while (k < 3 && BAD[k] != r.q[q].index)
            k++;
        assert_true(k < 3);
        assert_int_equal(r.q[q].replacement, a.q[k].replacement);
    }
}

/* ITERABLE: a failing next() is dropped and the stream goes on (REPLACE does the same); the
 * batches stay full. */
typedef struct ids {
    uint64_t pos[4];
    int nw;
} ids;

static int ids_next(void *user, int worker, int num_workers, void *const dst[], int64_t lens[],
                    uint64_t *index, char *msg, size_t msg_len)
{
    ids *s = user;
    int w1 = num_workers > 0 ? num_workers : 1;
    uint64_t i = s->pos[worker] * (uint64_t)w1 + (uint64_t)worker;
    if (i >= 40)
        return STOKE_EEND;
    s->pos[worker]++;
    *index = i;
    if (i % 7 == 3) {
        snprintf(msg, msg_len, "stream: item %" PRIu64 " is bad", i);
        return STOKE_EDATA;
    }
    int64_t v = (int64_t)i;
    memcpy(dst[0], &v, 8);
    return STOKE_OK;
}

static int ids_reset(void *user, uint64_t epoch)
{
    (void)epoch;
    memset(((ids *)user)->pos, 0, sizeof(((ids *)user)->pos));
    return STOKE_OK;
}

static void test_iterable(void **state)
{
    (void)state;
    const char *pol[] = {"skip", "replace", "error"};
    for (size_t p = 0; p < 3; p++)
        for (int w = 0; w <= 2; w += 2) {
            ids s;
            memset(&s, 0, sizeof(s));
            stoke_dataset ds;
            stoke_dataset_init(&ds);
            ds.kind = STOKE_DATASET_ITERABLE;
            snprintf(ds.name, sizeof(ds.name), "ids");
            ds.user = &s;
            ds.nfields = 1;
            snprintf(TU_F(&ds)[0].name, sizeof(TU_F(&ds)[0].name), "v");
            TU_F(&ds)[0].dtype = STOKE_DTYPE_I64;
            assert_int_equal(stoke_field_finish(&TU_F(&ds)[0]), STOKE_OK);
            ds.next = ids_next;
            ds.set_epoch = ids_reset;
            stoke_loader_opts o;
            stoke_loader_opts_init(&o);
            assert_int_equal(stoke_on_error_parse(pol[p], &o), STOKE_OK);
            o.batch_size = 4;
            o.num_workers = w;
            o.pin_memory = 0;
            o.errors_go_on = 1; /* (MAP datasets only: the error below still ends the epoch) */
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            stoke_batch *b;
            int rc;
            uint64_t sum = 0, n = 0, full = 0, nb = 0;
            while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                const int64_t *v = stoke_batch_data(b, 0);
                for (size_t j = 0; j < stoke_batch_count(b); j++) {
                    assert_int_equal(v[j], (int64_t)stoke_batch_indices(b)[j]);
                    assert_int_not_equal(v[j] % 7, 3);
                    sum += (uint64_t)v[j];
                    n++;
                }
                full += stoke_batch_count(b) == 4;
                nb++;
                stoke_batch_release(b);
            }
            stoke_loader_stats st = {.size = sizeof(st)};
            assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
            if (p == 2) {
                assert_int_equal(rc, STOKE_EDATA);
                assert_non_null(strstr(stoke_loader_last_error(l), "stream: item 3 is bad"));
                assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
            } else {
                /* 3, 10, 17, 24, 31, 38 are bad: 34 good items, sum 780 - 123 */
                assert_int_equal(rc, STOKE_EEND);
                assert_int_equal(n, 34);
                assert_int_equal(sum, 780 - 123);
                assert_int_equal(st.bad_samples, 6);
                assert_int_equal(st.skipped_samples, 6);
                assert_true(full >= nb - (uint64_t)(w ? w : 1)); /* only each share's last */
            }
            stoke_loader_destroy(l);
        }
}

/* A batch whose every sample fails is delivered with count 0 (its position kept). */
static void test_all_bad_batch(void **state)
{
    (void)state;
    static run r;
    const uint64_t bad[] = {8, 9, 10, 11, 12, 13, 14, 15};
    run_epoch("skip", 2, 0, 1, bad, 8, &r);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.nbatches, (N + BS - 1) / BS);
    assert_int_equal(r.counts[0], BS);
    assert_int_equal(r.counts[1], 0);
    assert_int_equal(r.counts[2], BS);
    assert_int_equal(r.n, N - 8);
    assert_int_equal(r.st.skipped_samples, 8);
    /* REPLACE keeps the batch full */
    run_epoch("replace", 2, 0, 0, bad, 8, &r);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.counts[1], BS);
    assert_int_equal(r.n, N);
}

static void test_parse_and_validate(void **state)
{
    (void)state;
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    assert_int_equal(o.on_error, STOKE_ON_ERROR_ERROR);
    assert_int_equal(o.max_bad, UINT64_MAX);
    assert_true(o.max_bad_fraction == 1.0);
    assert_int_equal(stoke_on_error_parse("skip:7", &o), STOKE_OK);
    assert_int_equal(o.on_error, STOKE_ON_ERROR_SKIP);
    assert_int_equal(o.max_bad, 7);
    assert_int_equal(stoke_on_error_parse("replace:0.5%", &o), STOKE_OK);
    assert_int_equal(o.on_error, STOKE_ON_ERROR_REPLACE);
    assert_int_equal(o.max_bad, UINT64_MAX);
    assert_true(o.max_bad_fraction == 0.005);
    const char *bad[] = {"",      "skip:",  "skip:x", "skip:-1%",  "skip:101%",
                         "skipx", "ignore", "skip:%", "replace:1x"};
    for (size_t k = 0; k < sizeof(bad) / sizeof(bad[0]); k++) {
        stoke_loader_opts_init(&o);
        if (stoke_on_error_parse(bad[k], &o) != STOKE_EINVAL)
            fail_msg("'%s' accepted", bad[k]);
        assert_int_equal(o.on_error, STOKE_ON_ERROR_ERROR);
    }
    bds b;
    stoke_dataset ds;
    bds_open(&b, 0, NULL, 0, &ds);
    stoke_loader *l = NULL;
    stoke_loader_opts_init(&o);
    o.pin_memory = 0;
    o.on_error = 7;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "unknown on_error 7"));
    o.on_error = STOKE_ON_ERROR_SKIP;
    o.max_bad_fraction = 1.5;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_null(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&b.inner);
}

/* ---- the CLI ----------------------------------------------------------------------------- */

static void tar_member(FILE *f, const char *name, const char *data)
{
    unsigned char h[512];
    memset(h, 0, sizeof(h));
    size_t n = strlen(data);
    memcpy(h, name, strlen(name));
    snprintf((char *)h + 100, 8, "%07o", 0644);
    snprintf((char *)h + 124, 12, "%011o", (unsigned)(n & 0777));
    h[156] = '0';
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    memset(h + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += h[i];
    snprintf((char *)h + 148, 8, "%06o", sum);
    fwrite(h, 1, 512, f);
    unsigned char blk[512];
    memset(blk, 0, sizeof(blk));
    memcpy(blk, data, n);
    fwrite(blk, 1, 512, f);
}

static void test_cli_on_error(void **state)
{
    (void)state;
    char path[1024], src[1100], out[16384], err[4096];
    tu_tmp_path("badsample.tar", path, sizeof(path));
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    for (int i = 0; i < 6; i++) {
        char name[32], v[8];
        snprintf(name, sizeof(name), "s%d.bin", i);
        snprintf(v, sizeof(v), "bin%d", i);
        tar_member(f, name, v);
        if (i != 3) { /* s3 has no label */
            snprintf(name, sizeof(name), "s%d.cls", i);
            snprintf(v, sizeof(v), "%d", i);
            tar_member(f, name, v);
        }
    }
    static const unsigned char zero[1024];
    fwrite(zero, 1, sizeof(zero), f);
    assert_int_equal(fclose(f), 0);
    snprintf(src, sizeof(src), "tar:%s", path);
    const char *env[] = {"STOKE_PLUGIN_PATH=", NULL};

    const char *skip[] = {src, "--on-error=skip", "--batch-size", "4", "--json", NULL};
    assert_int_equal(tu_run_cli(env, "load", skip, out, sizeof(out), err, sizeof(err)), 0);
    char want[2048];
    /* s3.bin's header is the 7th member header: 6 * 1024 bytes in */
    snprintf(
        want, sizeof(want),
        "\"on_error\": \"skip\", \"bad_samples\": 1, \"skipped_samples\": 1, "
        "\"replaced_samples\": 0, \"quarantine\": [{\"index\": 3, \"source\": \"tar %s@6144\", "
        "\"reason\": \"sample 's3' field 'cls': the sample has no 'cls' member\", "
        "\"action\": \"skip\"}]",
        path);
    if (!strstr(out, want))
        fail_msg("%s\nwanted %s", out, want);
    assert_non_null(strstr(out, "\"samples\": 5,"));
    assert_non_null(strstr(out, "\"index_sum\": 12,"));

    const char *repl[] = {src, "--on-error=replace", "--workers", "0", "--json", NULL};
    assert_int_equal(tu_run_cli(env, "load", repl, out, sizeof(out), err, sizeof(err)), 0);
    assert_non_null(strstr(out, "\"samples\": 6,"));
    assert_non_null(
        strstr(out, "\"bad_samples\": 1, \"skipped_samples\": 0, \"replaced_samples\": 1"));
    assert_non_null(strstr(out, "\"action\": \"replace\", \"replacement\": "));

    const char *dflt[] = {src, "--json", NULL};
    assert_int_equal(tu_run_cli(env, "load", dflt, out, sizeof(out), err, sizeof(err)), 1);
    assert_non_null(strstr(out, "{\"ok\": false"));
    assert_non_null(strstr(out, "\"on_error\": \"error\", \"bad_samples\": 1"));
    assert_non_null(strstr(out, "\"action\": \"error\""));

    const char *text[] = {src, "--on-error=skip:1", NULL};
    assert_int_equal(tu_run_cli(env, "load", text, out, sizeof(out), err, sizeof(err)), 0);
    assert_non_null(strstr(out, "  bad samples: 1 (1 skipped, 0 replaced; on-error skip:1)\n"));

    const char *bad[] = {src, "--on-error=sometimes", NULL};
    assert_int_equal(tu_run_cli(env, "load", bad, out, sizeof(out), err, sizeof(err)), 2);
    assert_non_null(strstr(err, "--on-error=sometimes: expected error, skip"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_error_policy),  cmocka_unit_test(test_skip),
        cmocka_unit_test(test_skip_budget),   cmocka_unit_test(test_skip_budget_of_draws),
        cmocka_unit_test(test_replace),       cmocka_unit_test(test_parse_and_validate),
        cmocka_unit_test(test_cli_on_error),  cmocka_unit_test(test_iterable),
        cmocka_unit_test(test_all_bad_batch), cmocka_unit_test(test_canceled_is_not_bad),
        cmocka_unit_test(test_errors_go_on),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
