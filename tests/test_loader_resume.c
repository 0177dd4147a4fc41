/* Mid-epoch save/restore of a loader over an ITERABLE dataset: a loader restored at any cursor
 * delivers, byte for byte, the batches an uninterrupted run delivers after it (in_order); a
 * restore with another worker count is refused; without in_order a mid-epoch save is refused. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "test_loader_ds.h"

#define MAXB 64 /* batches of an epoch the tests record */

/* The dataset of test_loader_ds.h with the last worker's share cut to `cap` samples (when 2
 * workers or more), so that share ends batches before the others. */
typedef struct capds {
    itds it;
    uint64_t cap;
    uint64_t fail;    /* this sample fails (DS_NONE: none) */
    atomic_int reads; /* samples given */
    int persistent;   /* the loaders' persistent_workers */
} capds;

static int cap_next(void *user, int worker, int num_workers, void *const dst[], int64_t lens[],
                    uint64_t *index, char *msg, size_t msg_len)
{
    capds *c = user;
    if (num_workers > 1 && worker == num_workers - 1 && c->it.cursor[worker] >= c->cap)
        return STOKE_EEND;
    uint64_t shards = num_workers ? (uint64_t)num_workers : 1;
    if ((uint64_t)worker + c->it.cursor[worker] * shards == c->fail) {
        c->it.cursor[worker]++; /* (once: the worker's next call goes on after it) */
        snprintf(msg, msg_len, "sample %llu went bad", (unsigned long long)c->fail);
        return STOKE_EDATA;
    }
    int rc = it_next(&c->it, worker, num_workers, dst, lens, index, msg, msg_len);
    if (rc == STOKE_OK)
        atomic_fetch_add(&c->reads, 1);
    return rc;
}

/* cd and ds: an ITERABLE dataset of n samples through cap_next (share cap, no failure). */
static void cap_make(capds *cd, stoke_dataset *ds, uint64_t n, uint64_t cap, int persistent)
{
    it_make(&cd->it, ds, n);
    cd->cap = cap;
    cd->fail = DS_NONE;
    cd->persistent = persistent;
    ds->user = cd;
    ds->next = cap_next;
}

/* What a run delivered: each batch's seq, count and bytes (indices then both fields). */
typedef struct run {
    size_t nb;
    uint64_t seq[MAXB];
    size_t count[MAXB];
    unsigned char bytes[MAXB][8 * (8 + DS_BYTES + 8)];
} run;

static stoke_loader *make(capds *c, stoke_dataset *ds, int workers, size_t bs, int drop,
                          int in_order)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.pin_memory = 0;
    o.batch_size = bs;
    o.num_workers = workers;
    o.drop_last = drop;
    o.in_order = in_order;
    o.prefetch_factor = 3;
    o.persistent_workers = c->persistent;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, ds, &l), STOKE_OK);
    return l;
}

/* Takes up to `max` batches (SIZE_MAX: to the epoch's end) into r. */
static void take(stoke_loader *l, run *r, size_t max)
{
    stoke_batch *b;
    int rc = STOKE_OK;
    while (r->nb < max && (rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(r->nb < MAXB);
        assert_true(tds_batch_ok(b));
        size_t n = stoke_batch_count(b);
        assert_true(n <= 8);
        unsigned char *p = r->bytes[r->nb];
        memset(p, 0, sizeof(r->bytes[0]));
        memcpy(p, stoke_batch_indices(b), n * 8);
        memcpy(p + n * 8, stoke_batch_data(b, 0), n * DS_BYTES);
        memcpy(p + n * (8 + DS_BYTES), stoke_batch_data(b, 1), n * 8);
        r->seq[r->nb] = stoke_batch_seq(b);
        r->count[r->nb++] = n;
        stoke_batch_release(b);
    }
    if (max == SIZE_MAX)
        assert_int_equal(rc, STOKE_EEND);
}

/* rest's batches are full's from batch k on; `all`: to full's end. */
static void same_tail(const run *full, size_t k, const run *rest, int all)
{
    if (all)
        assert_int_equal(rest->nb, full->nb - k);
    assert_true(k + rest->nb <= full->nb);
    for (size_t i = 0; i < rest->nb; i++) {
        assert_int_equal(rest->seq[i], full->seq[k + i]);
        assert_int_equal(rest->count[i], full->count[k + i]);
        assert_memory_equal(rest->bytes[i], full->bytes[k + i], sizeof(rest->bytes[0]));
    }
}

/* For every k from 0 to the epoch's batches: a loader stopped after k batches of epoch 1 saves
 * its state; a new loader restored from it delivers the rest of the uninterrupted epoch. */
static void test_resume_every_cursor(void **state)
{
    static const struct {
        uint64_t n, cap;
        int workers;
        size_t bs;
    } cases[] = {
        {40, 4, 2, 3},  /* worker 1's share (4: a full batch and a short one) ends early */
        {21, 99, 2, 2}, /* worker 0's last batch is short, worker 1 ends on a boundary */
        {9, 99, 2, 4},  /* worker 1 ends on a boundary after one batch */
        {23, 2, 3, 4},  /* 3 workers, the last one's share a single short batch */
        {17, 99, 1, 5}, /* 1 worker: a short last batch */
        {17, 99, 0, 5}, /* 0 workers: the caller's thread makes every batch */
        {12, 99, 0, 4}, /* 0 workers, the share ends on a boundary */
    };
    (void)state;
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int drop = 0; drop < 2; drop++) {
            capds cd;
            stoke_dataset ds;
            /* persistent_workers alternates (so the read count below holds for both) */
            cap_make(&cd, &ds, cases[c].n, cases[c].cap, (int)(c & 1));
            int W = cases[c].workers;
            size_t bs = cases[c].bs;
            static run full, part, rest;
            memset(&full, 0, sizeof(full));
            stoke_loader *l = make(&cd, &ds, W, bs, drop, 1);
            assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
            atomic_store(&cd.reads, 0);
            take(l, &full, SIZE_MAX);
            int epoch_reads = atomic_load(&cd.reads);
            stoke_loader_destroy(l);
            assert_true(full.nb >= 2);
            for (size_t k = 0; k <= full.nb; k++) {
                memset(&part, 0, sizeof(part));
                memset(&rest, 0, sizeof(rest));
                l = make(&cd, &ds, W, bs, drop, 1);
                assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
                take(l, &part, k);
                same_tail(&full, 0, &part, 0);
                assert_int_equal(part.nb, k);
                stoke_loader_state st;
                assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
                assert_int_equal(st.epoch, 1);
                assert_int_equal(st.workers, (uint32_t)W + 1);
                assert_int_equal(st.cursor, k ? full.seq[k - 1] + 1 : 0);
                stoke_loader_destroy(l);
                l = make(&cd, &ds, W, bs, drop, 1);
                take(l, &rest, 1); /* epoch 0 under way: the restore abandons it */
                memset(&rest, 0, sizeof(rest));
                assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_OK);
                take(l, &rest, SIZE_MAX);
                same_tail(&full, k, &rest, 1);
                /* the same loader restored again: the same batches */
                memset(&rest, 0, sizeof(rest));
                atomic_store(&cd.reads, 0); /* (the epoch ended: no worker reads) */
                assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_OK);
                take(l, &rest, SIZE_MAX);
                same_tail(&full, k, &rest, 1);
                /* the cost: the skipped samples read again, so an epoch's reads in all */
                assert_int_equal(atomic_load(&cd.reads), epoch_reads);
                stoke_loader_destroy(l);
            }
        }
    }
}

/* A state saved with W workers restored into a loader with another count: EINVAL, the message
 * names both counts; the position is unchanged. */
static void test_resume_other_workers(void **state)
{
    (void)state;
    capds cd;
    stoke_dataset ds;
    cap_make(&cd, &ds, 30, 99, 0);
    static run a;
    memset(&a, 0, sizeof(a));
    stoke_loader *l = make(&cd, &ds, 2, 3, 0, 1);
    take(l, &a, 3);
    stoke_loader_state st;
    assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
    stoke_loader_destroy(l);
    for (int w = 0; w <= 3; w += 1) {
        if (w == 2)
            continue;
        l = make(&cd, &ds, w, 3, 0, 1);
        assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_EINVAL);
        char want[160];
        snprintf(want, sizeof(want), "with 2 workers over %s, this one has %d", ds.name, w);
        assert_non_null(strstr(stoke_loader_last_error(l), want));
        stoke_loader_destroy(l);
    }
    /* a MAP state (workers 0) into an ITERABLE loader: refused too */
    st.workers = 0;
    l = make(&cd, &ds, 2, 3, 0, 1);
    assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_EINVAL);
    stoke_loader_destroy(l);
}

/* Without in_order the delivered batches are not a prefix of the seqs: a save after a delivery
 * in the epoch is refused (ENOTSUP); before any, it saves the start. */
static void test_resume_needs_in_order(void **state)
{
    (void)state;
    capds cd;
    stoke_dataset ds;
    cap_make(&cd, &ds, 30, 99, 0);
    static run a;
    memset(&a, 0, sizeof(a));
    stoke_loader *l = make(&cd, &ds, 2, 3, 0, 0);
    stoke_loader_state st;
    assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
    assert_int_equal(st.cursor, 0);
    take(l, &a, 1);
    assert_int_equal(stoke_loader_save_state(l, &st), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "in_order"));
    stoke_loader_destroy(l);
}

/* A skipped batch (below the restored cursor) that fails when made again: its error is
 * delivered (the epoch ends), not dropped: the batches after it would not be the saved run's. */
static void test_resume_skipped_fails(void **state)
{
    (void)state;
    for (int w = 0; w <= 2; w++) {
        capds cd;
        stoke_dataset ds;
        cap_make(&cd, &ds, 30, 99, 0);
        static run a;
        memset(&a, 0, sizeof(a));
        stoke_loader *l = make(&cd, &ds, w, 3, 0, 1);
        take(l, &a, 4);
        stoke_loader_state st;
        assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
        stoke_loader_destroy(l);
        cd.fail = 2; /* in batch 0 (worker 0's first) */
        l = make(&cd, &ds, w, 3, 0, 1);
        assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_OK);
        stoke_batch *b;
        assert_int_equal(stoke_loader_next(l, &b), STOKE_EDATA);
        assert_non_null(strstr(stoke_loader_last_error(l), "sample 2 went bad"));
        assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
        stoke_loader_destroy(l);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_resume_every_cursor),
        cmocka_unit_test(test_resume_other_workers),
        cmocka_unit_test(test_resume_needs_in_order),
        cmocka_unit_test(test_resume_skipped_fails),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
