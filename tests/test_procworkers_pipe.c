/* Process workers' requests in flight (docs/loader.md, "Process workers"): with prefetch_factor 2
 * a child has its next batch's request queued on its socket while it makes the current one (one
 * worker; two with round_robin, the drop-in's setting); with prefetch_factor 1 it never has; a
 * child that crashes on the first of two requests in flight loses no sample and repeats none
 * (on_error skip: the second request is sent again to the replacement) or names the sample
 * (on_error error), and the batches after it are made with read() again; bad samples' messages are
 * all counted; destroy with two requests in flight, the child busy or stuck in a sample, neither
 * hangs nor leaves a process or a descriptor; a reposition makes no batch of the abandoned run
 * after the ones under way (a crash there is not run again); a read() that crashes on every batch
 * costs one restart a worker. The child looks at its own socket: the one SOCK_SEQPACKET descriptor
 * it has. Every test runs under alarm(): a hang fails. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "loader/proc_internal.h" /* wreq: what __wrap_send recognizes */
#include "stoke/stoke.h"
#include "testutil.h"

#define N     96
#define BS    8
#define NB    (N / BS)
#define SB    12 /* data bytes per sample */
#define Q_NO  1  /* queued[k]: batch k's child saw no next request within wait_ms */
#define Q_YES 2  /* queued[k]: it saw one */

/* Shared with the worker processes (an anonymous MAP_SHARED page made before any loader). */
typedef struct shared {
    pid_t parent;
    int wait_ms;            /* at a batch's first sample: the longest wait for the next request */
    int last_from;          /* batches from here on look without waiting (none comes after them) */
    uint64_t crash;         /* raise(SIGSEGV) here once the next request is queued (or not) */
    uint64_t slow_from;     /* epoch 0's samples from here on take 20 ms each */
    uint64_t hang;          /* publish the pid and wait to be killed here */
    uint64_t hold, hold2;   /* epoch 0: wait here until `destroying`, then until abandoned */
    _Atomic int destroying; /* the test is about to destroy (or reposition) the loader */
    int bad_mod;            /* samples with index % bad_mod == 3 fail (STOKE_EDATA); 0: none */
    int read_crash;         /* every read() in a child raises SIGSEGV (get() does not) */
    _Atomic int crash_held; /* `hold` raises SIGSEGV once released (once) */
    _Atomic int hang_pid;   /* the child hanging at `hang` */
    _Atomic int crash_q;    /* Q_YES / Q_NO: at the crash, the next request was queued or not */
    _Atomic int socks_bad;  /* a child that had not exactly one SOCK_SEQPACKET descriptor */
    _Atomic int queued[NB];
    /* test_send_fails_reply_queued: __wrap_send's trap on the request of batch 2 */
    _Atomic int trap_armed, trap_in, trap_fired, b1_done, victim, reply_queued, peer_closed;
    _Atomic int trap_late;    /* the child waited for the trap in vain */
    _Atomic int made[N];      /* get() calls of each sample in the children */
    _Atomic int made_e[2][N]; /* the same, by the epoch the child's dataset copy was set to */
    _Atomic int reads[NB];    /* read() calls in the children, by the batch of their first index */
} shared;

static shared *sh;

typedef struct pds {
    stoke_dataset inner;
    uint64_t epoch; /* set_epoch's (each process its copy) */
} pds;

static uint64_t pds_length(void *user)
{
    (void)user;
    return N;
}

/* In a child: its socket to the parent, the one SOCK_SEQPACKET descriptor (-1: not exactly
 * one). */
static int own_socket(void)
{
    int found = -1, n = 0;
    for (int fd = 0; fd < 256; fd++) {
        int type = 0;
        socklen_t len = sizeof(type);
        if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) == 0 && type == SOCK_SEQPACKET) {
            found = fd;
            n++;
        }
    }
    return n == 1 ? found : -1;
}

/* In a child: Q_YES when a request is waiting on its socket within wait_ms (0 ms in the last
 * batches), else Q_NO. */
static int next_queued(uint64_t batch)
{
    int fd = own_socket();
    if (fd < 0) {
        atomic_store(&sh->socks_bad, 1);
        return Q_NO;
    }
    struct pollfd p = {.fd = fd, .events = POLLIN};
    int r;
    do
        r = poll(&p, 1, batch >= (uint64_t)sh->last_from ? 0 : sh->wait_ms);
    while (r < 0 && errno == EINTR);
    return r == 1 && (p.revents & POLLIN) ? Q_YES : Q_NO;
}

static int pds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    pds *p = user;
    if (getpid() != sh->parent) {
        atomic_fetch_add(&sh->made[index], 1);
        if (p->epoch < 2)
            atomic_fetch_add(&sh->made_e[p->epoch][index], 1);
        if (atomic_load(&sh->trap_armed) && index == BS) { /* batch 1 waits for the trap */
            int ms = 0;
            while (!atomic_load(&sh->trap_in) && ms++ < 5000)
                tu_sleep_ms(1);
            atomic_store(&sh->trap_late, !atomic_load(&sh->trap_in));
        }
        if (atomic_load(&sh->trap_armed) && index == 2 * BS - 1) {
            atomic_store(&sh->victim, (int)getpid());
            atomic_store(&sh->b1_done, 1);
        }
        if (index % BS == 0 && index / BS < NB)
            atomic_store(&sh->queued[index / BS], next_queued(index / BS));
        if (index == sh->crash) {
            atomic_store(&sh->crash_q, next_queued(index / BS));
            signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: the plain crash */
            raise(SIGSEGV);
        }
        if (index == sh->hang) {
            atomic_store(&sh->hang_pid, (int)getpid());
            for (;;)
                tu_sleep_ms(10); /* until destroy kills this process */
        }
        if ((index == sh->hold || index == sh->hold2) && p->epoch == 0) {
            while (!atomic_load(&sh->destroying))
                tu_sleep_ms(1);
            /* until destroy or the reposition has begun (it slept 300 ms, which a parent
             * descheduled that long outlasts); at most 20 s */
            for (int ms = 0; !stoke_dataset_abandoned() && ms < 20000; ms++)
                tu_sleep_ms(1);
            if (index == sh->hold && atomic_exchange(&sh->crash_held, 0)) {
                signal(SIGSEGV, SIG_DFL);
                raise(SIGSEGV);
            }
        }
        if (index >= sh->slow_from && p->epoch == 0)
            tu_sleep_ms(20);
        if (sh->bad_mod && index % (uint64_t)sh->bad_mod == 3) {
            snprintf(msg, msg_len, "bad sample %" PRIu64, index);
            return STOKE_EDATA;
        }
    }
    return p->inner.get(p->inner.user, index, dst, lens, worker, msg, msg_len);
}

static int pds_read(void *user, const uint64_t *idx, size_t count, const stoke_slots *dst,
                    int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    pds *p = user;
    if (getpid() != sh->parent && count && idx[0] / BS < NB)
        atomic_fetch_add(&sh->reads[idx[0] / BS], 1);
    if (getpid() != sh->parent && sh->read_crash) {
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
    }
    for (size_t j = 0; j < count; j++) {
        void *d[TU_FIELDS];
        stoke_slots_sample(dst, p->inner.nfields, p->inner.fields, j, d);
        int rc = pds_get(user, idx[j], d, NULL, worker, msg, msg_len);
        if (rc) {
            *err_index = idx[j];
            return rc;
        }
    }
    return STOKE_OK;
}

static int pds_set_epoch(void *user, uint64_t epoch)
{
    ((pds *)user)->epoch = epoch;
    return STOKE_OK;
}

static void pds_open(pds *p, int with_read, stoke_dataset *ds)
{
    memset(p, 0, sizeof(*p));
    stoke_synthetic_opts so;
    stoke_synthetic_opts_init(&so);
    so.length = N;
    so.ndim = 1;
    so.shape[0] = SB;
    so.classes = 1u << 30; /* label = index */
    assert_int_equal(stoke_synthetic_open(&so, &p->inner), STOKE_OK);
    stoke_dataset_init(ds);
    ds->kind = STOKE_DATASET_MAP;
    snprintf(ds->name, sizeof(ds->name), "pds");
    ds->user = p;
    ds->nfields = p->inner.nfields;
    ds->fields = p->inner.fields;
    ds->length = pds_length;
    ds->get = pds_get;
    ds->set_epoch = pds_set_epoch;
    if (with_read)
        ds->read = pds_read;
}

static void pds_close(pds *p, stoke_dataset *ds)
{
    stoke_dataset_close(ds);
    stoke_dataset_close(&p->inner);
}

static void reset_shared(int wait_ms)
{
    memset(sh, 0, sizeof(*sh));
    sh->parent = getpid();
    sh->wait_ms = wait_ms;
    sh->last_from = NB;
    sh->crash = UINT64_MAX;
    sh->slow_from = UINT64_MAX;
    sh->hang = UINT64_MAX;
    sh->hold = UINT64_MAX;
    sh->hold2 = UINT64_MAX;
}

typedef struct run {
    int rc;
    char err[1024];
    uint64_t n, nbatches;
    int seen[N]; /* deliveries of each sample */
    stoke_loader_stats st;
    int pids[64];
    int npids;
} run;

/* Takes up to `stop_after` batches; checks every slot's bytes against its index. */
static void take(stoke_loader *l, int workers, run *r, uint64_t stop_after)
{
    stoke_batch *bt;
    while (r->nbatches < stop_after && (r->rc = stoke_loader_next(l, &bt)) == STOKE_OK) {
        tu_note_worker_pids(l, workers, r->pids, &r->npids, 64);
        size_t c = stoke_batch_count(bt);
        const unsigned char *data = stoke_batch_data(bt, 0);
        const int64_t *label = stoke_batch_data(bt, 1);
        for (size_t j = 0; j < c; j++) {
            uint64_t i = stoke_batch_indices(bt)[j];
            assert_true(i < N);
            assert_int_equal(label[j], (int64_t)i);
            unsigned char want[SB];
            stoke_synthetic_fill(0, i, want, sizeof(want));
            assert_memory_equal(data + j * SB, want, SB);
            r->seen[i]++;
            r->n++;
        }
        r->nbatches++;
        stoke_batch_release(bt);
    }
    snprintf(r->err, sizeof(r->err), "%s", stoke_loader_last_error(l));
    r->st.size = sizeof(r->st);
    assert_int_equal(stoke_loader_get_stats(l, &r->st), STOKE_OK);
}

static void opts(stoke_loader_opts *o, const char *policy, int workers, int prefetch, int rr)
{
    stoke_loader_opts_init(o);
    assert_int_equal(stoke_on_error_parse(policy, o), STOKE_OK);
    o->batch_size = BS;
    o->num_workers = workers;
    o->prefetch_factor = prefetch;
    o->round_robin = rr;
    o->seed = 3;
    o->pin_memory = 0;
    o->worker_mode = STOKE_WORKER_PROCESSES;
}

/* One epoch from a new loader; destroy; no process and no descriptor left. */
static void run_epoch(const char *policy, int workers, int prefetch, int rr, int with_read, run *r)
{
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, with_read, &ds);
    stoke_loader_opts o;
    opts(&o, policy, workers, prefetch, rr);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    memset(r, 0, sizeof(*r));
    take(l, workers, r, UINT64_MAX);
    stoke_loader_destroy(l);
    pds_close(&p, &ds);
    for (int k = 0; k < r->npids; k++)
        assert_true(tu_pid_gone(r->pids[k]));
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* prefetch_factor 2: every batch but each worker's last has its child's next request queued
 * while the child makes it.  One worker, and two with round_robin (batch k is worker k % 2's:
 * a worker waiting on its child is woken when its turn to dispatch comes). */
static void test_second_request_queued(void **state)
{
    (void)state;
    for (int workers = 1; workers <= 2; workers++)
        for (int rd = 0; rd <= 1; rd++) {
            reset_shared(5000);
            sh->last_from = NB - workers;
            static run r;
            run_epoch("error", workers, 2, workers == 2, rd, &r);
            assert_int_equal(r.rc, STOKE_EEND);
            assert_int_equal(r.n, N);
            assert_int_equal(r.st.worker_restarts, 0);
            assert_int_equal(atomic_load(&sh->socks_bad), 0);
            for (int k = 0; k < NB - workers; k++)
                if (atomic_load(&sh->queued[k]) != Q_YES)
                    fail_msg("workers %d, read %d: batch %d's child had no next request "
                             "queued (%d)",
                             workers, rd, k, atomic_load(&sh->queued[k]));
            for (int k = NB - workers; k < NB; k++) /* each worker's last: nothing after it */
                assert_int_equal(atomic_load(&sh->queued[k]), Q_NO);
        }
}

/* prefetch_factor 1: one request in flight; the child never has another queued. */
static void test_prefetch_one(void **state)
{
    (void)state;
    for (int workers = 1; workers <= 2; workers++) {
        reset_shared(100);
        static run r;
        run_epoch("error", workers, 1, workers == 2, 0, &r);
        assert_int_equal(r.rc, STOKE_EEND);
        assert_int_equal(r.n, N);
        assert_int_equal(atomic_load(&sh->socks_bad), 0);
        for (int k = 0; k < NB; k++)
            assert_int_equal(atomic_load(&sh->queued[k]), Q_NO);
    }
}

/* A crash in the first of two requests in flight (the child waits for the second before it
 * crashes): with skip, every other sample exactly once, in order, and the second request's
 * batch made by the replacement; with error, the sample named and the batches before it
 * delivered. */
static void test_crash_first_of_two(void **state)
{
    (void)state;
    for (int workers = 1; workers <= 2; workers++)
        for (int rd = 0; rd <= 1; rd++) {
            reset_shared(5000);
            sh->crash = 21; /* batch 2 */
            sh->last_from = NB - workers;
            static run r;
            run_epoch("skip", workers, 2, workers == 2, rd, &r);
            assert_int_equal(atomic_load(&sh->crash_q), Q_YES);
            assert_int_equal(r.rc, STOKE_EEND);
            assert_int_equal(r.n, N - 1);
            for (int i = 0; i < N; i++)
                assert_int_equal(r.seen[i], i == 21 ? 0 : 1);
            assert_int_equal(r.nbatches, NB);
            /* read(): the crash is in a batch call; a second child finds the sample */
            assert_int_equal(r.st.worker_restarts, rd ? 2 : 1);
            assert_int_equal(r.st.skipped_samples, 1);
            /* with read(): one call a batch, the crashed one's included (its reruns make it one
             * get() at a time); the replacement makes the batches after it with read() again */
            for (int k = 0; k < NB; k++)
                if (atomic_load(&sh->reads[k]) != rd)
                    fail_msg("workers %d, read %d: batch %d made with %d read() calls", workers, rd,
                             k, atomic_load(&sh->reads[k]));

            reset_shared(5000);
            sh->crash = 21;
            sh->last_from = NB - workers;
            run_epoch("error", workers, 2, workers == 2, rd, &r);
            assert_int_equal(atomic_load(&sh->crash_q), Q_YES);
            assert_int_equal(r.rc, STOKE_EDATA);
            if (!strstr(r.err, "sample 21 of pds: worker process ") ||
                !strstr(r.err, "killed by SIGSEGV"))
                fail_msg("workers %d, read %d: '%s'", workers, rd, r.err);
            assert_int_equal(r.n, 16); /* batches 0 and 1 */
            for (int i = 0; i < 16; i++)
                assert_int_equal(r.seen[i], 1);
        }
}

/* Bad samples (a failing get(), not a crash) with two requests in flight: each batch's BAD
 * messages come before its DONE, and every one is counted, in each worker layout. */
static void test_bad_samples_in_flight(void **state)
{
    (void)state;
    for (int workers = 1; workers <= 2; workers++)
        for (int rr = 0; rr <= 1; rr++) {
            reset_shared(0);
            sh->bad_mod = 5;
            static run r;
            run_epoch("skip", workers, 2, rr, 0, &r);
            assert_int_equal(r.rc, STOKE_EEND);
            uint64_t bad = 0;
            for (int i = 0; i < N; i++) {
                assert_int_equal(r.seen[i], i % 5 == 3 ? 0 : 1);
                bad += i % 5 == 3;
            }
            assert_int_equal(r.n, N - bad);
            assert_int_equal(r.st.bad_samples, bad);
            assert_int_equal(r.st.skipped_samples, bad);
            assert_int_equal(r.st.worker_restarts, 0);
        }
}

/* A loader of prefetch_factor 2 (round_robin with two workers) over a new pds, once two batches
 * were taken into r and the children of batch 2 (worker 0's) and, with two workers, batch 3
 * (worker 1's) have their next request queued. */
static stoke_loader *two_then_queued(pds *p, stoke_dataset *ds, const char *policy, int workers,
                                     int persistent, run *r)
{
    pds_open(p, 0, ds);
    stoke_loader_opts o;
    opts(&o, policy, workers, 2, workers == 2);
    o.persistent_workers = persistent;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, ds, &l), STOKE_OK);
    memset(r, 0, sizeof(*r));
    take(l, workers, r, 2);
    assert_int_equal(r->nbatches, 2);
    for (int k = 2; k < 2 + workers; k++) { /* (two workers: batch 3's child too, worker 1's) */
        while (atomic_load(&sh->queued[k]) == 0)
            tu_sleep_ms(1);
        assert_int_equal(atomic_load(&sh->queued[k]), Q_YES);
    }
    return l;
}

/* Destroy after two batches, with two requests in flight to batch 2's child (2 and the next),
 * busy (20 ms samples; batch 2 held until destroy began) or stuck in batch 2 (killed after the
 * grace).  Returns; no process, no descriptor left; a busy child does not start the batch queued
 * behind its current one. */
static void test_destroy_two_in_flight(void **state)
{
    (void)state;
    int fds = tu_count_fds_to("");
    for (int hang = 0; hang <= 1; hang++)
        for (int workers = 1; workers <= 2; workers++) {
            reset_shared(5000);
            sh->slow_from = 2 * BS;
            sh->hang = hang ? 2 * BS + 1 : UINT64_MAX; /* in batch 2 */
            sh->hold = hang ? UINT64_MAX : 2 * BS;
            pds p;
            stoke_dataset ds;
            static run r;
            stoke_loader *l = two_then_queued(&p, &ds, "skip", workers, 0, &r);
            while (hang && atomic_load(&sh->hang_pid) == 0)
                tu_sleep_ms(1);
            tu_note_worker_pids(l, workers, r.pids, &r.npids, 64);
            assert_true(r.npids >= 1);
            atomic_store(&sh->destroying, 1);
            stoke_loader_destroy(l);
            /* the request queued behind batch 2 (worker 0's next) was answered, not made */
            if (!hang)
                assert_int_equal(atomic_load(&sh->queued[2 + workers]), 0);
            pds_close(&p, &ds);
            for (int k = 0; k < r.npids; k++)
                assert_true(tu_pid_gone(r.pids[k]));
            if (hang)
                assert_true(tu_pid_gone(atomic_load(&sh->hang_pid)));
            tu_assert_no_children();
            assert_int_equal(tu_count_fds_to(""), fds);
        }
}

/* A reposition (set_epoch) after two batches, with two requests in flight to batch 2's child
 * (batches 2 and 3 held in their first sample until the reposition began, 20 ms samples of epoch 0
 * from there on), with and without persistent workers: each child stops after the sample it is in,
 * the request queued behind it is answered, not made, and the next epoch has every sample, made
 * once. */
static void test_reposition_two_in_flight(void **state)
{
    (void)state;
    for (int v = 0; v < 8; v++) {
        int persistent = v & 1, workers = 1 + (v >> 1 & 1), crash = v >> 2;
        reset_shared(5000);
        sh->last_from = NB - workers; /* the epochs' last batches: no 5 s wait for a request */
        sh->slow_from = 2 * BS;
        sh->hold = 2 * BS;
        sh->hold2 = 3 * BS; /* two workers: the other child's next (batch 5) waits too */
        sh->crash_held = crash;
        pds p;
        stoke_dataset ds;
        static run r;
        stoke_loader *l = two_then_queued(&p, &ds, "error", workers, persistent, &r);
        atomic_store(&sh->destroying, 1);
        assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
        /* epoch 0 after the reposition: batch 2 and, with two workers, batch 3 stopped after
         * the sample each child was held in (16, 24), between two samples; nothing after */
        for (int i = 2 * BS; i < N; i++)
            if (atomic_load(&sh->made_e[0][i]) != (i == 2 * BS || (workers == 2 && i == 3 * BS)))
                fail_msg("persistent %d, workers %d, crash %d: sample %d (batch %d) of the "
                         "abandoned epoch was made %d times",
                         persistent, workers, crash, i, i / BS, atomic_load(&sh->made_e[0][i]));
        memset(&r, 0, sizeof(r));
        take(l, workers, &r, UINT64_MAX);
        assert_int_equal(r.rc, STOKE_EEND);
        assert_int_equal(r.n, N);
        for (int i = 0; i < N; i++) {
            assert_int_equal(r.seen[i], 1);
            assert_int_equal(atomic_load(&sh->made_e[1][i]), 1);
        }
        /* a crash on the abandoned batch is not run again: no restart, no sample blamed */
        assert_int_equal(r.st.worker_restarts, 0);
        assert_int_equal(r.st.bad_samples, 0);
        stoke_loader_destroy(l);
        pds_close(&p, &ds);
        for (int k = 0; k < r.npids; k++)
            assert_true(tu_pid_gone(r.pids[k]));
        tu_assert_no_children();
    }
}

/* A dataset whose read() crashes on every batch in the children (not a sample's fault: get()
 * one sample at a time makes each batch): each worker's first batch finds it out (one restart),
 * and its batches are then made with get(), queued ones included: one restart a worker, no
 * sample blamed, every sample delivered once. */
static void test_read_always_crashes(void **state)
{
    (void)state;
    for (int workers = 1; workers <= 2; workers++) {
        reset_shared(0);
        sh->read_crash = 1;
        static run r;
        run_epoch("skip", workers, 2, workers == 2, 1, &r);
        assert_int_equal(r.rc, STOKE_EEND);
        assert_int_equal(r.n, N);
        for (int i = 0; i < N; i++)
            assert_int_equal(r.seen[i], 1);
        assert_int_equal(r.st.bad_samples, 0);
        if (r.st.worker_restarts != (uint64_t)workers)
            fail_msg("workers %d: %" PRIu64 " restarts, not one a worker", workers,
                     r.st.worker_restarts);
        int reads = 0;
        for (int k = 0; k < NB; k++)
            reads += atomic_load(&sh->reads[k]);
        assert_int_equal(reads, workers); /* each worker's first batch */
    }
}

/* Linked with -Wl,--wrap=send (test_procworkers_pipe.cmake): the library's send() comes here.
 * Armed, the parent's request for batch 2 is held until the child has made batch 1 (its reply
 * queued on the socket, unread) and was killed, its end closed: the send then fails (EPIPE)
 * with a reply waiting, the case a failed send must not be taken for the child's death in. */
ssize_t __real_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags);
ssize_t __wrap_send(int fd, const void *buf, size_t len, int flags)
{
    if (sh && getpid() == sh->parent && len == sizeof(wreq) && atomic_load(&sh->trap_armed) &&
        ((const wreq *)buf)->seq == 2 && !atomic_exchange(&sh->trap_fired, 1)) {
        atomic_store(&sh->trap_in, 1); /* batch 1 goes on */
        for (int ms = 0; !atomic_load(&sh->b1_done) && ms < 5000; ms++)
            tu_sleep_ms(1);
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        atomic_store(&sh->reply_queued, poll(&pf, 1, 5000) == 1 && (pf.revents & POLLIN));
        if (atomic_load(&sh->victim) > 0)
            kill(atomic_load(&sh->victim), SIGKILL);
        for (int ms = 0; ms < 5000 && !atomic_load(&sh->peer_closed); ms++) {
            pf.revents = 0; /* (POLLIN stays set: the queued reply) */
            atomic_store(&sh->peer_closed, poll(&pf, 1, 0) == 1 && (pf.revents & POLLHUP));
            tu_sleep_ms(1);
        }
    }
    return __real_send(fd, buf, len, flags);
}

/* A send that fails while the child's reply to an older request waits on the socket (the child
 * made batch 1, then died idle, before the worker thread read the reply; the send of batch 2
 * fails): batch 1 comes from that reply, not made again by the replacement; batch 2 goes to the
 * replacement; every sample made once, delivered once, nothing blamed. */
static void test_send_fails_reply_queued(void **state)
{
    (void)state;
    reset_shared(0);
    atomic_store(&sh->trap_armed, 1);
    run *r = calloc(1, sizeof(*r));
    assert_non_null(r);
    run_epoch("error", 1, 2, 0, 0, r);
    assert_int_equal(atomic_load(&sh->trap_fired), 1);
    assert_int_equal(atomic_load(&sh->trap_late), 0);
    assert_int_equal(atomic_load(&sh->reply_queued), 1); /* the reply to batch 1 waited */
    assert_int_equal(atomic_load(&sh->peer_closed), 1);  /* the send met a closed end */
    assert_int_equal(r->rc, STOKE_EEND);
    assert_int_equal(r->n, N);
    for (int i = 0; i < N; i++) {
        if (r->seen[i] != 1 || atomic_load(&sh->made[i]) != 1)
            fail_msg("sample %d delivered %d times, made %d times (batch 1 made again: its "
                     "queued reply was dropped when the send failed)",
                     i, r->seen[i], atomic_load(&sh->made[i]));
    }
    assert_int_equal(r->st.worker_restarts, 1);
    assert_int_equal(r->st.bad_samples, 0);
    free(r);
}

static int setup(void **state)
{
    (void)state;
    alarm(120); /* per test: a hang fails the run */
    return 0;
}

int main(void)
{
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore); /* the crashing children leave no core files */
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED)
        return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_second_request_queued, setup),
        cmocka_unit_test_setup(test_prefetch_one, setup),
        cmocka_unit_test_setup(test_crash_first_of_two, setup),
        cmocka_unit_test_setup(test_bad_samples_in_flight, setup),
        cmocka_unit_test_setup(test_destroy_two_in_flight, setup),
        cmocka_unit_test_setup(test_reposition_two_in_flight, setup),
        cmocka_unit_test_setup(test_read_always_crashes, setup),
        cmocka_unit_test_setup(test_send_fails_reply_queued, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    munmap(sh, sizeof(*sh));
    return tu_exit_status(rc);
}
