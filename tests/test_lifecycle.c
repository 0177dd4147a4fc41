/* The batch lifecycle (loader_internal.h, above struct stoke_batch; docs/loader.md, "Batch
 * lifecycle") with its check on: this executable links a copy of the loader built with
 * STOKE_CHECK_INVARIANTS, so every release of the loader's lock walks every batch and aborts on
 * a broken invariant.  Loaders run with 0 and 2 workers, in and out of order, batch sizes 1 and
 * 64, to the device (simdev), ITERABLE, with batches held and released early, late, in reverse
 * and all at once, with set_epoch in the middle of an epoch and a failing sample; each delivers
 * every sample exactly once, and the states move as the table says.  Then the check itself:
 * this copy of the loader can skip counting a delivered batch in `held`
 * (STOKE_TEST_BREAK_TRANSITION, stoke__test_break), and a child that does so dies of SIGABRT
 * with the check's message.  (A batch released twice is the caller's error, ignored and said:
 * test_loader.c, with this check on.) */
#include "testutil.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "loader/loader_internal.h"
#include "test_loader_ds.h"

/* check.c, built into this executable's loader (this file is compiled without the define). */
void stoke__loader_check(stoke_loader *l);
extern _Atomic uint64_t stoke__loader_checks;
extern int stoke__test_break;

#define N 500 /* samples: not a multiple of 64 */

static int state_of(const stoke_batch *b)
{
    return atomic_load_explicit(&b->state, memory_order_relaxed);
}

/* Runs the check once more from here, under the loader's lock. */
static void check_now(stoke_loader *l)
{
    pthread_mutex_lock(&l->mu);
    stoke__loader_check(l);
    pthread_mutex_unlock(&l->mu);
}

static stoke_loader_opts opts(int workers, int in_order, size_t bs)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = bs;
    o.num_workers = workers;
    o.in_order = in_order;
    o.shuffle = 1;
    o.seed = 7;
    return o;
}

/* How the consumer gives batches back. */
enum { REL_AT_ONCE, REL_LATE, REL_REVERSE, REL_ALL_HELD, REL_MODES };
static const char *const REL_NAMES[] = {"at once", "two later", "in reverse, by fours",
                                        "all buffers held"};

/* One epoch of l: every sample once with its bytes, the batches held and released as `rel`
 * says; a delivered batch is HELD and the check passes with it held. */
static void run_epoch(stoke_loader *l, int rel, uint64_t nsamples, int in_order)
{
    tu_seen seen;
    tu_seen_init(&seen, nsamples);
    stoke_batch *held[4096];
    int nheld = 0, rc;
    uint64_t last_seq = 0, nb = 0;
    stoke_batch *b;
    for (;;) {
        rc = stoke_loader_next(l, &b);
        if (rc == STOKE_ELIMIT && rel == REL_ALL_HELD) {
            /* every buffer is out: exactly nbuf of them, all HELD */
            assert_int_equal(nheld, l->nbuf);
            for (int i = 0; i < nheld; i++)
                assert_int_equal(state_of(held[i]), STOKE__B_HELD);
            check_now(l);
            while (nheld)
                stoke_batch_release(held[--nheld]);
            continue;
        }
        if (rc != STOKE_OK)
            break;
        assert_int_equal(state_of(b), STOKE__B_HELD);
        assert_true(tds_batch_ok(b));
        if (in_order && nb)
            assert_int_equal(stoke_batch_seq(b), last_seq + 1);
        last_seq = stoke_batch_seq(b);
        nb++;
        for (size_t j = 0; j < stoke_batch_count(b); j++)
            tu_seen_add(&seen, stoke_batch_indices(b)[j]);
        held[nheld++] = b;
        if (rel == REL_AT_ONCE || (rel == REL_LATE && nheld > 2) ||
            (rel == REL_REVERSE && nheld == 4)) {
            while (nheld) {
                stoke_batch *x = rel == REL_LATE ? held[0] : held[nheld - 1];
                if (rel == REL_LATE)
                    memmove(held, held + 1, (size_t)(nheld - 1) * sizeof(*held));
                nheld--;
                stoke_batch_release(x);
                if (l->nworkers == 0) /* else a worker may reclaim it at once */
                    assert_int_equal(state_of(x), STOKE__B_RELEASED);
                if (rel == REL_LATE)
                    break;
            }
        }
    }
    assert_int_equal(rc, STOKE_EEND);
    while (nheld)
        stoke_batch_release(held[--nheld]);
    tu_seen_check_all(&seen);
    tu_seen_free(&seen);
    check_now(l);
}

/* 0 and 2 workers, in and out of order, batch sizes 1 and 64, every release pattern. */
static void test_map_modes(void **state)
{
    (void)state;
    static const int workers[] = {0, 2};
    static const int in_order[] = {1, 0};
    static const size_t bss[] = {1, 64};
    for (size_t w = 0; w < 2; w++)
        for (size_t o = 0; o < 2; o++)
            for (size_t s = 0; s < 2; s++)
                for (int rel = 0; rel < REL_MODES; rel++) {
                    tds t;
                    stoke_dataset ds;
                    tds_make(&t, &ds, N);
                    stoke_loader_opts op = opts(workers[w], in_order[o], bss[s]);
                    stoke_loader *l;
                    assert_int_equal(stoke_loader_create(&op, &ds, &l), STOKE_OK);
                    uint64_t checks0 = atomic_load(&stoke__loader_checks);
                    print_message("workers %d, in_order %d, batch %zu, release %s\n", workers[w],
                                  in_order[o], bss[s], REL_NAMES[rel]);
                    run_epoch(l, rel, N, in_order[o]);
                    /* the check ran: at least once per batch (next() unlocks `mu`) */
                    uint64_t nb = (N + bss[s] - 1) / bss[s];
                    assert_true(atomic_load(&stoke__loader_checks) - checks0 >= nb);
                    /* a second epoch over the recycled batches */
                    assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
                    run_epoch(l, rel, N, in_order[o]);
                    for (int i = 0; i < l->nbuf; i++)
                        assert_int_not_equal(state_of(&l->bat[i]), STOKE__B_HELD);
                    stoke_loader_destroy(l);
                    tds_free(&t);
                }
}

/* The states one batch goes through, seen from the caller's thread (0 workers: nothing else
 * moves them). */
static void test_states(void **state)
{
    (void)state;
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, N);
    stoke_loader_opts o = opts(0, 1, 8);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    for (int i = 0; i < l->nbuf; i++)
        assert_int_equal(state_of(&l->bat[i]), STOKE__B_FREE);
    stoke_batch *a, *b;
    assert_int_equal(stoke_loader_next(l, &a), STOKE_OK);
    assert_int_equal(state_of(a), STOKE__B_HELD);
    assert_int_equal(l->held, 1);
    stoke_batch_release(a);
    assert_int_equal(state_of(a), STOKE__B_RELEASED);
    assert_int_equal(l->held, 1); /* on the released stack, not reclaimed yet */
    check_now(l);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* reclaims a, then takes it again */
    assert_ptr_equal(b, a);
    assert_int_equal(state_of(b), STOKE__B_HELD);
    assert_int_equal(l->held, 1);
    /* set_epoch with b held: b stays HELD (the caller's), its release is counted as any */
    assert_int_equal(stoke_loader_set_epoch(l, 3), STOKE_OK);
    assert_int_equal(state_of(b), STOKE__B_HELD);
    stoke_batch_release(b);
    check_now(l);
    run_epoch(l, REL_AT_ONCE, N, 1);
    assert_int_equal(l->held, 0);
    assert_int_equal(l->nfree, l->nbuf);
    stoke_loader_destroy(l);
    tds_free(&t);
}

/* set_epoch in the middle of an epoch while two workers are filling batches of it (abandoned:
 * FILLING batches of an older gen are recycled when they complete), batches held across it;
 * restore_state to a later cursor; then whole epochs. */
static void test_set_epoch_mid_epoch(void **state)
{
    (void)state;
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, N);
    for (int in_order = 0; in_order < 2; in_order++) {
        for (size_t bs = 1; bs <= 64; bs += 63) {
            stoke_loader_opts o = opts(2, in_order, bs);
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            for (int round = 0; round < 5; round++) {
                stoke_batch *keep[2];
                for (int i = 0; i < 2; i++)
                    assert_int_equal(stoke_loader_next(l, &keep[i]), STOKE_OK);
                tds_skip(l, round); /* then the workers fill batches ahead */
                assert_int_equal(stoke_loader_set_epoch(l, (uint64_t)round + 1), STOKE_OK);
                /* nothing of the abandoned run is left in production or undelivered (the
                 * workers may have started on the new epoch already) */
                pthread_mutex_lock(&l->mu);
                stoke__loader_check(l);
                int stale = 0;
                for (int i = 0; i < l->nbuf; i++) {
                    int st = state_of(&l->bat[i]);
                    stale +=
                        (st == STOKE__B_FILLING || st == STOKE__B_DONE) && l->bat[i].gen != l->gen;
                }
                pthread_mutex_unlock(&l->mu);
                assert_int_equal(stale, 0);
                assert_int_equal(state_of(keep[0]), STOKE__B_HELD);
                stoke_batch_release(keep[1]);
                stoke_batch_release(keep[0]);
            }
            run_epoch(l, REL_LATE, N, in_order);
            stoke_loader_state st;
            assert_int_equal(stoke_loader_set_epoch(l, 9), STOKE_OK);
            tds_skip(l, 3);
            assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
            tds_skip(l, 2);
            assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_OK);
            stoke_batch *b;
            int rc;
            uint64_t n = 0;
            while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                assert_true(tds_batch_ok(b));
                n += stoke_batch_count(b);
                stoke_batch_release(b);
            }
            assert_int_equal(rc, STOKE_EEND);
            /* the saved position is the lowest batch not delivered: batch 3 in order; out of
             * order a later batch may have come before an earlier one (then that one again) */
            if (in_order)
                assert_int_equal(st.cursor, 3);
            assert_true(st.cursor <= 3);
            assert_int_equal(n, N - st.cursor * bs);
            stoke_loader_destroy(l);
        }
    }
    tds_free(&t);
}

/* A reposition stops the batches of the run it abandons between two samples: the worker held
 * in sample 16 (batch 2 of 8) by the gate, opened once set_epoch has abandoned the run (its
 * worker's busy marks show a new run), makes no sample after it (nor batch 3, which its group
 * may hold); the new epoch runs whole.  (The gate opened 300 ms after the thread started,
 * which a set_epoch descheduled that long would outlast.) */
static _Atomic int gets_at_set_epoch;
static int record_gets(void *user, uint64_t epoch)
{
    (void)epoch;
    atomic_store(&gets_at_set_epoch, atomic_load(&((tds *)user)->gets));
    return STOKE_OK;
}

typedef struct gate_later {
    tds *t;
    stoke__busy *marks; /* the held worker's */
    uint64_t gen;       /* its run before set_epoch */
} gate_later;

static void *open_gate_later(void *arg)
{
    gate_later *g = arg;
    for (int ms = 0; atomic_load(&g->marks->gen) == g->gen && ms < 20000; ms++)
        tu_sleep_ms(1);
    tds_open_gate(g->t);
    return NULL;
}

static void test_set_epoch_stops_between_samples(void **state)
{
    (void)state;
    for (int persistent = 0; persistent <= 1; persistent++) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 64);
        t.slow_index = 16;
        ds.set_epoch = record_gets;
        stoke_loader_opts o = opts(1, 1, 8);
        o.shuffle = 0;
        o.persistent_workers = persistent;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        tds_skip(l, 2);
        while (atomic_load(&t.gets) < 17) /* the worker is in sample 16 */
            tu_sleep_ms(1);
        gate_later g = {&t, l->w[0].p.busy, 0};
        g.gen = atomic_load(&g.marks->gen);
        pthread_t th;
        assert_int_equal(pthread_create(&th, NULL, open_gate_later, &g), 0);
        assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
        pthread_join(th, NULL);
        /* samples 0..16 (the reposition's wait ends after 16), not 17.. */
        assert_int_equal(atomic_load(&gets_at_set_epoch), 17);
        run_epoch(l, REL_AT_ONCE, 64, 1);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A dataset that gives a sample up when its batch is no longer wanted: sample give_up_at waits
 * (20 s at most) until stoke_dataset_abandoned says so; get_gives_up then returns give_up_rc
 * (STOKE_ECANCELED; STOKE_EDATA: a sample that fails by itself just then), read_gives_up
 * finishes that sample and gives up before the next. */
static _Atomic uint64_t give_up_at = DS_NONE;
static _Atomic int give_up_rc = STOKE_ECANCELED;
static _Atomic int saw_abandoned;
static int wait_abandoned(uint64_t index)
{
    if (index != atomic_load(&give_up_at))
        return 0;
    for (int k = 0; k < 20000 && !stoke_dataset_abandoned(); k++)
        tu_sleep_ms(1);
    atomic_store(&saw_abandoned, stoke_dataset_abandoned());
    return 1;
}

static int get_gives_up(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                        char *msg, size_t msg_len)
{
    int rc = tds_get(user, index, dst, lens, worker, msg, msg_len);
    if (rc == STOKE_OK && wait_abandoned(index)) {
        snprintf(msg, msg_len, "gave sample %llu up", (unsigned long long)index);
        return atomic_load(&give_up_rc);
    }
    return rc;
}

static int read_gives_up(void *user, const uint64_t *idx, size_t count, const stoke_slots *dst,
                         int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    tds *t = user;
    for (size_t j = 0; j < count; j++) {
        if (stoke_dataset_abandoned()) {
            snprintf(msg, msg_len, "gave the batch up before sample %llu",
                     (unsigned long long)idx[j]);
            *err_index = idx[j];
            return STOKE_ECANCELED;
        }
        void *d[2];
        stoke_slots_sample(dst, 2, t->fields, j, d);
        int rc = tds_get(user, idx[j], d, NULL, worker, msg, msg_len);
        if (rc != STOKE_OK) {
            *err_index = idx[j];
            return rc;
        }
        wait_abandoned(idx[j]);
    }
    return STOKE_OK;
}

/* A dataset's get() or read() that gives its batch up once stoke_dataset_abandoned says the run
 * was abandoned (set_epoch, with a worker in sample 16 of batch 2): set_epoch returns when it
 * did, the sample is not a bad one (on_error replace: no replacement read), nothing of the
 * batch is read again, and the next epoch runs whole; a sample that fails by itself in a batch
 * nobody wants gets no replacement candidates read either.  Outside a dataset call the answer
 * is 0. */
static void test_dataset_gives_up(void **state)
{
    (void)state;
    assert_int_equal(stoke_dataset_abandoned(), 0);
    for (int variant = 0; variant < 3; variant++) {
        int use_read = variant == 1;
        atomic_store(&give_up_rc, variant == 2 ? STOKE_EDATA : STOKE_ECANCELED);
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, 64);
        atomic_store(&give_up_at, 16);
        ds.get = get_gives_up;
        ds.read = use_read ? read_gives_up : NULL;
        ds.set_epoch = record_gets;
        stoke_loader_opts o = opts(1, 1, 8);
        o.shuffle = 0;
        assert_int_equal(stoke_on_error_parse("replace", &o), STOKE_OK);
        atomic_store(&saw_abandoned, 0);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        tds_skip(l, 2);
        while (atomic_load(&t.gets) < 17) /* the worker is in sample 16 */
            tu_sleep_ms(1);
        assert_int_equal(stoke_dataset_abandoned(), 0); /* (this thread makes no batch) */
        assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
        assert_int_equal(atomic_load(&saw_abandoned), 1);
        assert_int_equal(atomic_load(&gets_at_set_epoch), 17); /* 0..16: no 17.., no replacement */
        atomic_store(&give_up_at, DS_NONE);
        run_epoch(l, REL_AT_ONCE, 64, 1);
        stoke_loader_stats st;
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        assert_int_equal(st.bad_samples, 0);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* A failing sample ends the epoch (the batch goes DONE -> FREE, the run is abandoned); the next
 * epoch runs whole. */
static void test_failed_batch(void **state)
{
    (void)state;
    for (int workers = 0; workers <= 2; workers += 2) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, N);
        t.fail_index = 123;
        stoke_loader_opts o = opts(workers, 1, 16);
        o.shuffle = 0;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b;
        int rc;
        uint64_t n = 0;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            n += stoke_batch_count(b);
            stoke_batch_release(b);
        }
        assert_int_equal(rc, STOKE_EDATA);
        assert_int_equal(n, 123 / 16 * 16); /* the batches before the failing one */
        pthread_mutex_lock(&l->mu);
        stoke__loader_check(l);
        int held = l->held;
        pthread_mutex_unlock(&l->mu);
        assert_int_equal(held, 0);
        /* after set_epoch: it joins the workers, one of which may still be reading a sample */
        assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
        t.fail_index = DS_NONE;
        run_epoch(l, REL_REVERSE, N, 1);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
}

/* Device mode (simdev): staging slots move between free_s, the batches and the copy FIFO while
 * batches are held with copies in flight; the check counts them at every unlock. */
static void test_device(void **state)
{
    (void)state;
    tu_use_simdev();
    for (int workers = 0; workers <= 2; workers += 2) {
        for (size_t bs = 1; bs <= 64; bs += 63) {
            tds t;
            stoke_dataset ds;
            tds_make(&t, &ds, N);
            stoke_loader_opts o = opts(workers, workers == 0, bs);
            o.pin_memory = 1;
            o.device = "simdev";
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            assert_non_null(l->stream); /* device mode: the copies' stream was made */
            for (int epoch = 0; epoch < 2; epoch++) {
                tu_seen seen;
                tu_seen_init(&seen, N);
                tds_keeper k;
                memset(&k, 0, sizeof(k));
                stoke_batch *b;
                int rc;
                while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                    for (size_t j = 0; j < stoke_batch_count(b); j++)
                        tu_seen_add(&seen, stoke_batch_indices(b)[j]);
                    tds_keeper_add(&k, b);
                }
                assert_int_equal(rc, STOKE_EEND);
                tds_keeper_finish(&k);
                tu_seen_check_all(&seen);
                tu_seen_free(&seen);
                check_now(l);
                assert_int_equal(stoke_loader_set_epoch(l, (uint64_t)epoch + 1), STOKE_OK);
            }
            stoke_loader_destroy(l);
            tds_free(&t);
        }
    }
    tu_use_none();
}

/* ITERABLE (test_loader_ds.h, itds): a share that ends on a batch boundary completes an empty
 * batch (FILLING -> FREE). */
static void test_iterable(void **state)
{
    (void)state;
    for (int workers = 0; workers <= 2; workers += 2) {
        for (int in_order = 0; in_order < 2; in_order++) {
            itds t;
            stoke_dataset ds;
            it_make(&t, &ds, 128); /* shares of 64 (2 workers): a multiple of the batch size */
            stoke_loader_opts o = opts(workers, in_order, 8);
            o.shuffle = 0;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            for (int epoch = 0; epoch < 2; epoch++) {
                run_epoch(l, epoch ? REL_LATE : REL_AT_ONCE, t.n, 0);
                assert_int_equal(stoke_loader_set_epoch(l, (uint64_t)epoch + 1), STOKE_OK);
            }
            stoke_loader_destroy(l);
        }
    }
}

/* ---- the check catches a broken transition (children) ------------------------------------ */

/* Child: with stoke__test_break set (`broken`), delivering a batch skips counting it in `held`;
 * the unlock at the end of next() must abort.  Without it, the same run exits 0. */
static int child_held(int broken)
{
    tds t;
    stoke_dataset ds;
    tds_make(&t, &ds, N);
    stoke_loader_opts o = opts(0, 1, 8);
    stoke_loader *l;
    if (stoke_loader_create(&o, &ds, &l) != STOKE_OK)
        return 2;
    stoke__test_break = broken;
    stoke_batch *b;
    for (int i = 0; i < 3; i++) {
        if (stoke_loader_next(l, &b) != STOKE_OK)
            return 3;
        stoke_batch_release(b);
    }
    stoke__test_break = 0;
    stoke_loader_destroy(l);
    tds_free(&t);
    return 0;
}

static int run_child(const char *what, char *err, size_t err_len)
{
    const char *argv[] = {"/proc/self/exe", what, NULL};
    char out[256];
    return tu_run(argv, NULL, out, sizeof(out), err, err_len);
}

static void test_check_catches_broken_transition(void **state)
{
    (void)state;
    char err[8192];
    assert_int_equal(run_child("held-ok", err, sizeof(err)), 0);
    assert_null(strstr(err, "invariant broken"));
    int rc = run_child("held-broken", err, sizeof(err));
    if (rc != 128 + SIGABRT)
        fail_msg("the broken child exited with %d, not SIGABRT; stderr:\n%s", rc, err);
    if (!strstr(err, "held is 0, but 1 batches are HELD or RELEASED"))
        fail_msg("the check did not name `held`; stderr:\n%s", err);
    if (!strstr(err, "see above (stoke__loader_check)"))
        fail_msg("the abort was not the check's; stderr:\n%s", err);
}

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "held-ok") == 0)
        return child_held(0);
    if (argc > 1 && strcmp(argv[1], "held-broken") == 0)
        return child_held(1);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_states),
        cmocka_unit_test(test_map_modes),
        cmocka_unit_test(test_set_epoch_mid_epoch),
        cmocka_unit_test(test_set_epoch_stops_between_samples),
        cmocka_unit_test(test_dataset_gives_up),
        cmocka_unit_test(test_failed_batch),
        cmocka_unit_test(test_device),
        cmocka_unit_test(test_iterable),
        cmocka_unit_test(test_check_catches_broken_transition),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
