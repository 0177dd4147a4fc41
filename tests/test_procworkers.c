/* Process workers (opts.worker_mode = STOKE_WORKER_PROCESSES): the same bytes and order as
 * worker threads; a sample that crashes its worker process (SIGSEGV; SIGKILL from outside twice:
 * once, the batch is made again) under each on_error policy; no process, zombie or descriptor left
 * after destroy, also mid-epoch; the dataset's set_epoch reaches the children; the zygote and
 * children die with the loader's process (also when a fork of it lives on); a stopped zygote is a
 * bounded error; a forked child's use of the loader fails at once; loaders destroyed one by one do
 * not wait for each other; stoke_loader_stop ends the workers and keeps the batches held.  Every
 * test runs under alarm(): a hang fails instead of blocking CI. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stoke/stoke.h"
#include "testutil.h"

#define N  100
#define BS 8
#define SB 12 /* data bytes per sample */

/* Shared with the worker processes (an anonymous MAP_SHARED page made before any loader). */
typedef struct shared {
    pid_t parent;
    uint64_t crash;           /* in a child: raise(SIGSEGV) at this sample (UINT64_MAX: none) */
    int crash_even;           /* in a child: raise(SIGSEGV) at every even sample too */
    uint64_t hang;            /* in a child: publish the pid and wait to be killed here */
    _Atomic int hang_pid;     /* the child hanging at `hang` */
    _Atomic int init_calls;   /* worker_init calls (children) */
    _Atomic int init_workers; /* bit w: worker_init(w) was called in a child */
    int init_fail;            /* in a child: worker_init returns STOKE_EIO */
    uint64_t slow;            /* in a child: publish pids, wait for p_killed, 3 s, orphan_wrote */
    _Atomic int w_pid, z_pid; /* the child at `slow` and its parent (the zygote) */
    _Atomic int s_pid;        /* the sleeping fork of the loader's process (orphans test) */
    _Atomic int p_killed;     /* the loader's process was SIGKILLed and reaped */
    _Atomic int orphan_wrote; /* the child at `slow` outlived its loader by 3 s */
} shared;

static shared *sh;

typedef struct pds {
    stoke_dataset inner;
    uint64_t n; /* samples: sample i holds the inner one's i % N */
} pds;

static uint64_t pds_length(void *user)
{
    return ((const pds *)user)->n;
}

static int pds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    pds *p = user;
    if (getpid() != sh->parent) {
        if (index == sh->crash || (sh->crash_even && index % 2 == 0)) {
            signal(SIGSEGV, SIG_DFL); /* not a sanitizer's report: the plain crash */
            raise(SIGSEGV);
        }
        if (index == sh->hang) {
            atomic_store(&sh->hang_pid, (int)getpid());
            for (;;)
                tu_sleep_ms(10); /* until the test kills this process */
        }
        if (index == sh->slow) {
            atomic_store(&sh->z_pid, (int)getppid());
            atomic_store(&sh->w_pid, (int)getpid());
            while (!atomic_load(&sh->p_killed))
                tu_sleep_ms(1);
            tu_sleep_ms(3000);                  /* as long as the test waits for its death */
            atomic_store(&sh->orphan_wrote, 1); /* would write into the dead loader's buffer */
        }
    }
    return p->inner.get(p->inner.user, index % N, dst, lens, worker, msg, msg_len);
}

static int pds_get_batch(void *user, const uint64_t *idx, size_t count, const stoke_slots *dst,
                         int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    pds *p = user;
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

static int pds_worker_init(void *user, int worker, int num_workers)
{
    (void)user;
    (void)num_workers;
    if (getpid() != sh->parent) {
        atomic_fetch_add(&sh->init_calls, 1);
        atomic_fetch_or(&sh->init_workers, 1 << worker);
        if (sh->init_fail)
            return STOKE_EIO;
    }
    return STOKE_OK;
}

static int pds_next(void *user, int worker, int num_workers, void *const dst[], int64_t lens[],
                    uint64_t *index, char *msg, size_t msg_len)
{
    (void)user, (void)worker, (void)num_workers, (void)dst, (void)index, (void)msg, (void)msg_len;
    return STOKE_EEND;
}

static void pds_open(pds *p, int with_batch, int with_init, stoke_dataset *ds)
{
    memset(p, 0, sizeof(*p));
    p->n = N;
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
    if (with_batch)
        ds->read = pds_get_batch;
    if (with_init)
        ds->worker_init = pds_worker_init;
}

static void reset_shared(void)
{
    sh->parent = getpid();
    sh->crash = UINT64_MAX;
    sh->crash_even = 0;
    sh->hang = UINT64_MAX;
    sh->slow = UINT64_MAX;
    atomic_store(&sh->hang_pid, 0);
    atomic_store(&sh->w_pid, 0);
    atomic_store(&sh->z_pid, 0);
    atomic_store(&sh->s_pid, 0);
    atomic_store(&sh->p_killed, 0);
    atomic_store(&sh->orphan_wrote, 0);
    atomic_store(&sh->init_calls, 0);
    sh->init_fail = 0;
    atomic_store(&sh->init_workers, 0);
}

typedef struct run {
    int rc;
    char err[1024];
    uint64_t n, nbatches;
    uint64_t idx[2 * N];
    size_t counts[2 * N];
    unsigned char data[2 * N][SB];
    stoke_loader_stats st;
    stoke_bad_sample q[4];
    int pids[64];
    int npids;
} run;

/* Takes batches until next() stops (or `stop_after` batches); checks every slot against the
 * synthetic sample its index names. */
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
            assert_int_equal(label[j], (int64_t)i);
            unsigned char want[SB];
            stoke_synthetic_fill(0, i, want, sizeof(want));
            assert_memory_equal(data + j * SB, want, SB);
            memcpy(r->data[r->n], data + j * SB, SB);
            r->idx[r->n++] = i;
        }
        r->counts[r->nbatches++] = c;
        stoke_batch_release(bt);
    }
    snprintf(r->err, sizeof(r->err), "%s", stoke_loader_last_error(l));
}

static void finish(stoke_loader *l, run *r)
{
    r->st.size = sizeof(r->st);
    assert_int_equal(stoke_loader_get_stats(l, &r->st), STOKE_OK);
    for (uint64_t k = 0; k < r->st.quarantined && k < 4; k++)
        assert_int_equal(stoke_loader_quarantine(l, (size_t)k, &r->q[k]), STOKE_OK);
}

static void opts(stoke_loader_opts *o, const char *policy, int mode, int workers, int shuffle)
{
    stoke_loader_opts_init(o);
    assert_int_equal(stoke_on_error_parse(policy, o), STOKE_OK);
    o->batch_size = BS;
    o->num_workers = workers;
    o->shuffle = shuffle;
    o->seed = 9;
    o->pin_memory = 0;
    o->worker_mode = mode;
}

/* A loader of `workers` worker processes over a new pds (with its worker_init when with_init),
 * on_error error, in order. */
static stoke_loader *proc_loader(pds *p, stoke_dataset *ds, int with_init, int workers)
{
    pds_open(p, 0, with_init, ds);
    stoke_loader_opts o;
    opts(&o, "error", STOKE_WORKER_PROCESSES, workers, 0);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, ds, &l), STOKE_OK);
    return l;
}

/* Destroys l and closes ds and p, then checks that every child r saw, and `also` (0: none), is
 * gone, no child is left, and the process has `fds` descriptors again. */
static void end_loader(stoke_loader *l, stoke_dataset *ds, pds *p, const run *r, int also, int fds)
{
    stoke_loader_destroy(l);
    stoke_dataset_close(ds);
    stoke_dataset_close(&p->inner);
    if (also)
        assert_true(tu_pid_gone(also));
    for (int k = 0; k < r->npids; k++)
        assert_true(tu_pid_gone(r->pids[k]));
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* One epoch; then destroy and check no process and no descriptor is left. */
static void run_epoch(const char *policy, int mode, int workers, int shuffle, int with_batch,
                      run *r)
{
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, with_batch, 0, &ds);
    stoke_loader_opts o;
    opts(&o, policy, mode, workers, shuffle);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    memset(r, 0, sizeof(*r));
    take(l, workers, r, UINT64_MAX);
    finish(l, r);
    end_loader(l, &ds, &p, r, 0, fds);
}

static void test_same_as_threads(void **state)
{
    (void)state;
    reset_shared();
    static run t, pr;
    for (int w = 1; w <= 2; w++)
        for (int shuffle = 0; shuffle <= 1; shuffle++)
            for (int wb = 0; wb <= 1; wb++) {
                run_epoch("error", STOKE_WORKER_THREADS, w, shuffle, wb, &t);
                run_epoch("error", STOKE_WORKER_PROCESSES, w, shuffle, wb, &pr);
                assert_int_equal(t.rc, STOKE_EEND);
                assert_int_equal(pr.rc, STOKE_EEND);
                assert_int_equal(pr.n, N);
                assert_int_equal(pr.nbatches, t.nbatches);
                assert_memory_equal(pr.idx, t.idx, sizeof(t.idx));
                assert_memory_equal(pr.counts, t.counts, sizeof(t.counts));
                assert_memory_equal(pr.data, t.data, sizeof(t.data));
                assert_true(pr.npids >= 1 && pr.npids <= w);
                assert_int_equal(pr.st.worker_restarts, 0);
                assert_int_equal(t.npids, 0); /* threads: no worker pids */
            }
}

/* The message names the worker process's pid: it must be one of the pids seen, and gone. */
static void check_crash_msg(const char *msg, const char *sig, uint64_t idx)
{
    char want[64];
    snprintf(want, sizeof(want), "sample %" PRIu64 " of pds: worker process ", idx);
    const char *at = strstr(msg, want);
    if (!at)
        fail_msg("no '%s' in '%s'", want, msg);
    int pid = atoi(at + strlen(want));
    assert_true(pid > 0);
    assert_true(tu_pid_gone(pid));
    char killed[64];
    snprintf(killed, sizeof(killed), "%d killed by %s (", pid, sig);
    assert_non_null(strstr(msg, killed));
}

/* A worker_init failing in a worker process ends the epoch with its code, named once, and a
 * message naming the worker and the dataset, not a sample (it was "sample 18446744073709551615
 * of pds: ... (STOKE_EIO) (STOKE_EIO)"). */
static void test_worker_init_fails(void **state)
{
    (void)state;
    reset_shared();
    sh->init_fail = 1;
    pds p;
    stoke_dataset ds;
    stoke_loader *l = proc_loader(&p, &ds, 1, 2);
    static run r;
    memset(&r, 0, sizeof(r));
    take(l, 2, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EIO);
    const char *e = stoke_loader_last_error(l);
    assert_non_null(strstr(e, "worker "));
    assert_non_null(strstr(e, "worker_init of dataset pds failed in worker process "));
    assert_null(strstr(e, "sample "));
    const char *code = strstr(e, "(STOKE_EIO)");
    assert_non_null(code);
    assert_null(strstr(code + 1, "(STOKE_EIO)")); /* once */
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&p.inner);
    sh->init_fail = 0;
    tu_assert_no_children();
}

static void test_crash_error(void **state)
{
    (void)state;
    for (int wb = 0; wb <= 1; wb++) {
        reset_shared();
        sh->crash = 21;
        run r;
        run_epoch("error", STOKE_WORKER_PROCESSES, 2, 0, wb, &r);
        assert_int_equal(r.rc, STOKE_EDATA);
        assert_non_null(strstr(r.err, "worker "));
        check_crash_msg(r.err, "SIGSEGV", 21);
        assert_int_equal(r.n, 16);                          /* batches 0 and 1 */
        assert_int_equal(r.st.worker_restarts, wb ? 2 : 1); /* get_batch: found in a rerun */
        assert_int_equal(r.st.quarantined, 1);
        assert_int_equal(r.q[0].index, 21);
        assert_int_equal(r.q[0].action, STOKE_ON_ERROR_ERROR);
        assert_non_null(strstr(r.q[0].reason, "killed by SIGSEGV"));
    }
}

static void test_crash_skip(void **state)
{
    (void)state;
    for (int w = 1; w <= 2; w++)
        for (int wb = 0; wb <= 1; wb++) {
            reset_shared();
            sh->crash = 21;
            run r;
            run_epoch("skip", STOKE_WORKER_PROCESSES, w, 0, wb, &r);
            assert_int_equal(r.rc, STOKE_EEND);
            assert_int_equal(r.n, N - 1);
            for (uint64_t k = 0; k < r.n; k++)
                assert_int_equal(r.idx[k], k < 21 ? k : k + 1);
            assert_int_equal(r.counts[2], BS - 1);
            /* get_batch: the crash is in a batch call; a second child finds the sample */
            assert_int_equal(r.st.worker_restarts, wb ? 2 : 1);
            assert_int_equal(r.st.skipped_samples, 1);
            assert_int_equal(r.st.quarantined, 1);
            assert_int_equal(r.q[0].index, 21);
            assert_int_equal(r.q[0].action, STOKE_ON_ERROR_SKIP);
            assert_non_null(strstr(r.q[0].reason, "worker process "));
            assert_non_null(strstr(r.q[0].reason, "killed by SIGSEGV"));
        }
}

static void test_crash_replace(void **state)
{
    (void)state;
    reset_shared();
    sh->crash = 21;
    run r;
    run_epoch("replace", STOKE_WORKER_PROCESSES, 2, 1, 0, &r);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N);
    for (uint64_t k = 0; k + 1 < r.nbatches; k++)
        assert_int_equal(r.counts[k], BS);
    for (uint64_t k = 0; k < r.n; k++)
        assert_int_not_equal(r.idx[k], 21);
    assert_int_equal(r.st.replaced_samples, 1);
    assert_int_equal(r.st.quarantined, 1);
    assert_int_equal(r.q[0].index, 21);
    assert_int_equal(r.q[0].action, STOKE_ON_ERROR_REPLACE);
    assert_true(r.q[0].replacement < N && r.q[0].replacement != 21);
    assert_non_null(strstr(r.q[0].reason, "killed by SIGSEGV"));
}

/* Kills the child hanging at sh->hang with SIGKILL, as `kill -9` would. */
/* Kills the child hanging at sh->hang `*arg` times (each time the next child there); with
 * *arg == 1 the sample hangs no more once killed (a kill from outside, not the sample's). */
static void *killer(void *arg)
{
    int times = *(const int *)arg, last = 0;
    for (int k = 0; k < times; k++) {
        int pid;
        while ((pid = atomic_load(&sh->hang_pid)) == 0 || pid == last)
            tu_sleep_ms(1);
        if (times == 1)
            sh->hang = UINT64_MAX;
        kill(pid, SIGKILL);
        last = pid;
    }
    return NULL;
}

static void kill9_epoch(const char *policy, int times, run *r, int *hung)
{
    int fds = tu_count_fds_to("");
    reset_shared();
    sh->hang = 37;
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 0, &ds);
    stoke_loader_opts o;
    opts(&o, policy, STOKE_WORKER_PROCESSES, 1, 0);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, killer, &times), 0);
    memset(r, 0, sizeof(*r));
    take(l, 1, r, UINT64_MAX);
    pthread_join(th, NULL);
    *hung = atomic_load(&sh->hang_pid);
    finish(l, r);
    end_loader(l, &ds, &p, r, *hung, fds);
}

static void test_kill9(void **state)
{
    (void)state;
    run r;
    int hung;
    /* killed once in sample 37's get() (the OOM killer for another process): the batch made
     * again, nothing blamed, under either policy (the sample was a bad sample, and with "error"
     * the epoch failed) */
    for (int p = 0; p < 2; p++) {
        kill9_epoch(p ? "error" : "skip", 1, &r, &hung);
        assert_int_equal(r.rc, STOKE_EEND);
        assert_int_equal(r.n, N);
        for (uint64_t k = 0; k < r.n; k++)
            assert_int_equal(r.idx[k], k);
        assert_int_equal(r.st.worker_restarts, 1);
        assert_int_equal(r.st.bad_samples, 0);
    }
    /* killed again in it: the sample is what draws the kill */
    kill9_epoch("skip", 2, &r, &hung);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N - 1);
    for (uint64_t k = 0; k < r.n; k++)
        assert_int_equal(r.idx[k], k < 37 ? k : k + 1);
    assert_int_equal(r.st.worker_restarts, 2);
    assert_int_equal(r.q[0].index, 37);
    char want[64];
    snprintf(want, sizeof(want), "worker process %d killed by SIGKILL", hung);
    assert_non_null(strstr(r.q[0].reason, want));

    kill9_epoch("error", 2, &r, &hung);
    assert_int_equal(r.rc, STOKE_EDATA);
    assert_int_equal(r.n, 32);
    check_crash_msg(r.err, "SIGKILL", 37);
}

static void kill_idle(int workers)
{
    reset_shared();
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 1, &ds);
    stoke_loader_opts o;
    opts(&o, "error", STOKE_WORKER_PROCESSES, workers, 1);
    o.persistent_workers = 1;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(stoke_loader_worker_pid(l, 0), -1); /* started at its first batch */
    assert_int_equal(stoke_loader_worker_pid(l, workers), -1);
    assert_int_equal(stoke_loader_worker_pid(NULL, 0), -1);
    static run r;
    memset(&r, 0, sizeof(r));
    take(l, workers, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EEND);
    int w = 0, old = -1;
    for (; w < workers && old <= 0; w++) /* a worker that got work */
        old = stoke_loader_worker_pid(l, w);
    assert_true(old > 0);
    assert_int_equal(kill(old, SIGKILL), 0);
    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
    memset(&r, 0, sizeof(r));
    take(l, workers, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N); /* nothing lost, nothing blamed */
    finish(l, &r);
    assert_int_equal(r.st.bad_samples, 0);
    assert_true(r.st.worker_restarts <= 1);
    int init = atomic_load(&sh->init_workers);
    assert_int_equal(init & ~((1 << workers) - 1), 0); /* worker_init got worker ids */
    if (workers == 1) { /* the only worker made epoch 1: it was replaced, worker_init again */
        assert_int_equal(r.st.worker_restarts, 1);
        assert_true(stoke_loader_worker_pid(l, 0) > 0);
        assert_int_not_equal(stoke_loader_worker_pid(l, 0), old);
        assert_int_equal(init, 1);
        assert_int_equal(atomic_load(&sh->init_calls), 2);
    }
    tu_note_worker_pids(l, workers, r.pids, &r.npids, 64);
    end_loader(l, &ds, &p, &r, old, fds);
}

/* A child killed while idle (between batches): the next batch goes to a replacement, nothing is
 * lost. */
static void test_kill_idle(void **state)
{
    (void)state;
    kill_idle(1);
    kill_idle(2);
}

static void test_destroy_mid_epoch(void **state)
{
    (void)state;
    reset_shared();
    int fds = tu_count_fds_to("");
    for (int hang = 0; hang <= 1; hang++) {
        pds p;
        stoke_dataset ds;
        pds_open(&p, 0, 0, &ds);
        sh->hang = hang ? 30 : UINT64_MAX; /* hang: a child stuck in a sample at destroy */
        atomic_store(&sh->hang_pid, 0);
        stoke_loader_opts o;
        opts(&o, "skip", STOKE_WORKER_PROCESSES, 2, 0);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        static run r;
        memset(&r, 0, sizeof(r));
        take(l, 2, &r, 2);
        assert_int_equal(r.nbatches, 2);
        while (hang && atomic_load(&sh->hang_pid) == 0)
            tu_sleep_ms(1);
        tu_note_worker_pids(l, 2, r.pids, &r.npids, 64);
        assert_true(r.npids >= 1);
        end_loader(l, &ds, &p, &r, hang ? atomic_load(&sh->hang_pid) : 0, fds);
    }
}

/* stoke_loader_interrupt (the caller is ending: a Ctrl-C), then the run abandoned while a child
 * is stuck in a sample: set_epoch kills it at once instead of waiting for its batch (it waited
 * for ever here); the next epoch is whole and right, made by a replacement.  Without the mark, a
 * destroy after an interrupted next() does not wait the 2 s grace either (test_destroy_mid_epoch
 * waits it). */
static void test_interrupt_abandon(void **state)
{
    (void)state;
    reset_shared();
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    stoke_loader *l = proc_loader(&p, &ds, 0, 2);
    sh->hang = 30; /* a child stuck in sample 30 (batch 3) until it is killed */
    static run r;
    memset(&r, 0, sizeof(r));
    take(l, 2, &r, 2);
    assert_int_equal(r.nbatches, 2);
    while (atomic_load(&sh->hang_pid) == 0)
        tu_sleep_ms(1);
    int stuck = atomic_load(&sh->hang_pid);
    stoke_loader_interrupt(l);
    assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_OK);
    assert_true(tu_pid_gone(stuck));
    sh->hang = UINT64_MAX;
    memset(&r, 0, sizeof(r));
    take(l, 2, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N);
    for (uint64_t i = 0; i < N; i++)
        assert_int_equal(r.idx[i], i);
    finish(l, &r);
    assert_true(r.st.worker_restarts >= 1);
    stoke_loader_interrupt(NULL);
    end_loader(l, &ds, &p, &r, stuck, fds);
}

/* The threads of this process (entries of /proc/self/task). */
static int count_threads(void)
{
    DIR *d = opendir("/proc/self/task");
    assert_non_null(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* Whether the page at p is in memory (mincore: for a shared mapping, in the page cache). */
static int resident(const void *p)
{
    unsigned char v = 0;
    assert_int_equal(mincore((void *)((uintptr_t)p & ~(uintptr_t)4095), 1, &v), 0);
    return v & 1;
}

/* n bytes of field f of batch b into out: from its host memory, or from its device copy. */
static void read_field(stoke_batch *b, int f, int dev, void *out, size_t n)
{
    if (dev)
        assert_int_equal(stoke_batch_device_read(b, f, out), STOKE_OK);
    else
        memcpy(out, stoke_batch_data(b, f), n);
}

static uint64_t pinned_in_use(void)
{
    stoke_pinned_stats ps = {.size = sizeof(ps)};
    assert_int_equal(stoke_pinned_stats_get(&ps), STOKE_OK);
    return ps.bytes_in_use;
}

/* stoke_loader_stop with two batches held: every worker thread and process is gone at once (a
 * child stuck in a sample too), the dataset is closed before the batches go, and the batches
 * keep their bytes until released; the buffers of the batches not held go at once (a process
 * worker's pages leave memory; pinned buffers go back to the pool), and so does each released
 * after it (device mode: their device buffers, and every staging buffer); next() and set_epoch
 * fail with ECANCELED, saying why; a second stop does nothing; destroy then leaves no
 * descriptor.  Threads (pageable, pinned by simdev, copied to simdev) and processes. */
static void test_stop_keeps_held(void **state)
{
    (void)state;
    for (int c = 0; c < 5; c++) {
        int mode = c == 1 || c == 2 ? STOKE_WORKER_PROCESSES : STOKE_WORKER_THREADS;
        int hang = c == 2, pinned = c >= 3, dev = c == 4;
        reset_shared();
        int fds = tu_count_fds_to("");
        if (pinned)
            tu_use_simdev();
        uint64_t pool0 = pinned ? pinned_in_use() : 0;
        uint64_t dev0 = dev ? tu_simdev_counters().live_device_bytes : 0;
        pds p;
        stoke_dataset ds;
        pds_open(&p, 0, 0, &ds);
        sh->hang = hang ? 50 : UINT64_MAX; /* a child stuck in batch 6's sample at stop */
        stoke_loader_opts o;
        opts(&o, "error", mode, 2, 0);
        o.pin_memory = pinned;
        o.device = dev ? "simdev" : NULL;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        int threads = count_threads(); /* (workers start at the first next; simdev's stream has
                                          one of its own) */
        stoke_loader_stats st = {.size = sizeof(st)};
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        uint64_t one = pinned ? (pinned_in_use() - pool0) / st.buffers : 0;
        assert_true(!pinned || (one > 0 && pinned_in_use() - pool0 == one * st.buffers));
        uint64_t one_dev = dev ? (tu_simdev_counters().live_device_bytes - dev0) / st.buffers : 0;
        assert_true(!dev || one_dev >= BS * SB);
        stoke_batch *held[2];
        unsigned char copy[2][BS * SB];
        const unsigned char *gone[2]; /* batches 2 and 3, released before the stop */
        for (int k = 0; k < 4; k++) {
            stoke_batch *b;
            assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
            assert_int_equal(stoke_batch_count(b), BS);
            if (k < 2) {
                held[k] = b;
                read_field(b, 0, dev, copy[k], sizeof(copy[k]));
            } else {
                gone[k - 2] = stoke_batch_data(b, 0);
                stoke_batch_release(b);
            }
        }
        while (hang && atomic_load(&sh->hang_pid) == 0)
            tu_sleep_ms(1);
        static run r;
        memset(&r, 0, sizeof(r));
        tu_note_worker_pids(l, 2, r.pids, &r.npids, 64);
        assert_true(count_threads() > threads);
        assert_true(mode == STOKE_WORKER_THREADS || r.npids >= 1);
        if (mode == STOKE_WORKER_PROCESSES) /* (the children wrote them) */
            assert_true(resident(gone[0]) && resident(gone[1]));

        stoke_loader_stop(l);
        for (int k = 0; k < r.npids; k++)
            assert_true(tu_pid_gone(r.pids[k]));
        if (hang)
            assert_true(tu_pid_gone(atomic_load(&sh->hang_pid)));
        tu_assert_no_children();
        /* (a joined thread's task may leave /proc a moment after pthread_join returns) */
        for (int t = 0; t < 5000 && count_threads() != threads; t++)
            tu_sleep_ms(1);
        assert_int_equal(count_threads(), threads);
        if (mode == STOKE_WORKER_PROCESSES) {
            assert_false(resident(gone[0]) || resident(gone[1]));
            assert_true(resident(stoke_batch_data(held[0], 0)));
        }
        if (pinned) /* (device mode: a delivered batch's staging buffer went after its copy) */
            assert_int_equal(pinned_in_use() - pool0, dev ? 0 : 2 * one);
        if (dev)
            assert_int_equal(tu_simdev_counters().live_device_bytes - dev0, 2 * one_dev);
        stoke_dataset_close(&ds); /* nothing calls it any more */
        stoke_dataset_close(&p.inner);
        for (int k = 0; k < 2; k++) {
            unsigned char data[BS * SB];
            int64_t label[BS];
            read_field(held[k], 0, dev, data, sizeof(data));
            read_field(held[k], 1, dev, label, sizeof(label));
            assert_memory_equal(data, copy[k], sizeof(copy[k]));
            for (size_t j = 0; j < BS; j++) {
                uint64_t i = stoke_batch_indices(held[k])[j];
                unsigned char want[SB];
                stoke_synthetic_fill(0, i % N, want, sizeof(want));
                assert_int_equal(i, (uint64_t)(k * BS) + j);
                assert_int_equal(label[j], (int64_t)(i % N));
                assert_memory_equal(data + j * SB, want, SB);
            }
        }
        stoke_batch *b = (stoke_batch *)1;
        assert_int_equal(stoke_loader_next(l, &b), STOKE_ECANCELED);
        assert_null(b);
        assert_non_null(strstr(stoke_loader_last_error(l), "was stopped (stoke_loader_stop)"));
        assert_non_null(strstr(stoke_loader_last_error(l), "pds"));
        assert_int_equal(stoke_loader_set_epoch(l, 1), STOKE_ECANCELED);
        assert_non_null(strstr(stoke_loader_last_error(l), "stoke_loader_set_epoch: the loader"));
        assert_int_equal(stoke_loader_next_epoch(l), STOKE_ECANCELED);
        stoke_loader_state saved;
        assert_int_equal(stoke_loader_save_state(l, &saved), STOKE_OK);
        assert_int_equal(stoke_loader_restore_state(l, &saved), STOKE_ECANCELED);
        assert_non_null(strstr(stoke_loader_last_error(l), "stoke_loader_restore_state:"));
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        assert_int_equal(st.batches, 4);
        stoke_loader_stop(l); /* again: nothing */
        const unsigned char *h1 = stoke_batch_data(held[1], 0);
        stoke_batch_release(held[1]); /* its buffer goes at once */
        if (pinned)
            assert_int_equal(pinned_in_use() - pool0, dev ? 0 : one);
        if (dev)
            assert_int_equal(tu_simdev_counters().live_device_bytes - dev0, one_dev);
        if (mode == STOKE_WORKER_PROCESSES)
            assert_false(resident(h1));
        stoke_batch_release(held[0]);
        if (pinned)
            assert_int_equal(pinned_in_use(), pool0);
        if (dev)
            assert_int_equal(tu_simdev_counters().live_device_bytes, dev0);
        stoke_loader_destroy(l);
        if (pinned)
            tu_use_none();
        assert_int_equal(tu_count_fds_to(""), fds);
    }
    stoke_loader_stop(NULL);
}

static void test_invalid(void **state)
{
    (void)state;
    reset_shared();
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 0, &ds);
    stoke_loader_opts o;
    stoke_loader *l;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 0, 0);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "worker_mode processes needs num_workers >= 1"));
    opts(&o, "error", 7, 1, 0);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "unknown worker_mode 7"));
    stoke_dataset it = ds;
    it.kind = STOKE_DATASET_ITERABLE;
    it.get = NULL;
    it.read = NULL;
    it.length = NULL;
    it.next = pds_next;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 1, 0);
    assert_int_equal(stoke_loader_create(&o, &it, &l), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "MAP datasets only"));
    opts(&o, "error", STOKE_WORKER_THREADS, 1, 0); /* the same dataset is fine with threads */
    assert_int_equal(stoke_loader_create(&o, &it, &l), STOKE_OK);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&p.inner);
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* Pinned through stoke_pin_register of the shared mapping (simdev), and device mode: the
 * children's bytes reach the device buffer. */
static void test_pinned_device(void **state)
{
    (void)state;
    reset_shared();
    tu_use_simdev();
    int fds = tu_count_fds_to("");
    for (int dev = 0; dev <= 1; dev++) {
        pds p;
        stoke_dataset ds;
        pds_open(&p, 0, 0, &ds);
        stoke_loader_opts o;
        opts(&o, "error", STOKE_WORKER_PROCESSES, 2, 1);
        o.pin_memory = 1;
        o.device = dev ? "simdev" : NULL;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        assert_non_null(stoke_loader_pinned_backend(l));
        stoke_batch *bt;
        uint64_t n = 0;
        int rc;
        while ((rc = stoke_loader_next(l, &bt)) == STOKE_OK) {
            size_t c = stoke_batch_count(bt);
            unsigned char got[BS * SB];
            if (dev)
                assert_int_equal(stoke_batch_device_read(bt, 0, got), STOKE_OK);
            else
                memcpy(got, stoke_batch_data(bt, 0), c * SB);
            assert_int_equal(stoke_batch_is_pinned(bt), 1);
            for (size_t j = 0; j < c; j++) {
                unsigned char want[SB];
                stoke_synthetic_fill(0, stoke_batch_indices(bt)[j], want, sizeof(want));
                assert_memory_equal(got + j * SB, want, SB);
            }
            n += c;
            stoke_batch_release(bt);
        }
        assert_int_equal(rc, STOKE_EEND);
        assert_int_equal(n, N);
        stoke_loader_destroy(l);
        stoke_dataset_close(&ds);
        stoke_dataset_close(&p.inner);
        tu_assert_no_children();
    }
    tu_use_none();
    assert_int_equal(tu_count_fds_to(""), fds);
}

static stoke_pinned_stats pin_stats(void)
{
    stoke_pinned_stats ps = {.size = sizeof(ps)};
    assert_int_equal(stoke_pinned_stats_get(&ps), STOKE_OK);
    return ps;
}

/* opts.pin_on_use (simdev): nothing is registered at create; stoke_batch_pin registers the part
 * of its buffer a batch used, in steps of 2 MiB with an eighth to spare, one registration a
 * buffer (grown by registering it again, never a second one beside it), kept for the buffer's
 * later batches; the batch is then pinned (and counted so).  A registration that fails (the
 * simdev allocation it is) leaves the batch unpinned and readable, with the reason.  Stopping
 * the loader unregisters the idle buffers, destroying it every one.  Misuse: threads, device
 * mode, a count past the buffer, a loader that pins nothing. */
static void test_pin_on_use(void **state)
{
    (void)state;
    reset_shared();
    tu_use_simdev();
    const size_t sample = (size_t)3 << 20; /* batches of 2: 6 MiB buffers */
    stoke_synthetic_opts so;
    stoke_synthetic_opts_init(&so);
    so.length = 12;
    so.ndim = 1;
    so.shape[0] = (int64_t)sample;
    stoke_dataset ds;
    assert_int_equal(stoke_synthetic_open(&so, &ds), STOKE_OK);
    stoke_loader_opts o;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 1, 0);
    o.batch_size = 2;
    o.prefetch_factor = 1;
    o.pin_memory = 1;
    o.pin_on_use = 1;
    stoke_pinned_stats ps0 = pin_stats();
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_string_equal(stoke_loader_pinned_backend(l), "simdev");
    assert_int_equal(pin_stats().registered_count, ps0.registered_count); /* none yet */
    /* each batch asks for more: 100 B (a 2 MiB registration), 3 MiB (4), then the whole
     * (6 MiB and its labels' bytes: the buffer, to its page), then 100 B again (kept) */
    const size_t ask[6] = {100, (size_t)3 << 20, 0, 100, 100, 100};
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_true(st.buffer_bytes >= 2 * sample);
    stoke_batch *bt;
    int rc, k = 0, nbuf = 0;
    void *seen[8] = {0};
    while ((rc = stoke_loader_next(l, &bt)) == STOKE_OK) {
        unsigned char *d = stoke_batch_data(bt, 0);
        int fresh = 1;
        for (int i = 0; i < nbuf; i++)
            fresh &= seen[i] != d;
        if (fresh)
            seen[nbuf++] = d;
        assert_int_equal(stoke_batch_is_pinned(bt), 0); /* until pinned */
        assert_int_equal(stoke_is_pinned(d), fresh ? 0 : 1);
        size_t n = ask[k] ? ask[k] : (size_t)st.buffer_bytes;
        stoke_pinned_stats before = pin_stats();
        assert_int_equal(stoke_batch_pin(bt, n), STOKE_OK);
        stoke_pinned_stats after = pin_stats();
        assert_int_equal(stoke_batch_is_pinned(bt), 1);
        assert_int_equal(stoke_is_pinned(d), 1);
        assert_int_equal(stoke_is_pinned(d + n - 1), 1);
        if (k == 0) { /* the first registration of this buffer: 100 B -> 2 MiB */
            assert_int_equal(after.registered_count, before.registered_count + 1);
            assert_int_equal(after.registered_bytes - before.registered_bytes, (size_t)2 << 20);
            assert_int_equal(stoke_is_pinned(d + ((size_t)2 << 20)), 0);
        }
        if (k == 1 && !fresh) /* grown to 4 MiB, still one registration */
            assert_int_equal(after.registered_count, before.registered_count);
        if (k == 1)
            assert_int_equal(stoke_is_pinned(d + ((size_t)4 << 20) - 1), 1);
        /* never more than one registration a buffer */
        assert_true(after.registered_count - ps0.registered_count <= (uint64_t)nbuf);
        assert_int_equal(stoke_batch_pin(bt, n), STOKE_OK); /* again: nothing to do */
        assert_int_equal(pin_stats().registered_bytes, after.registered_bytes);
        if (k == 0) { /* more of a pinned batch: its registration stays (a copy may read it) */
            assert_int_equal(stoke_batch_pin(bt, (size_t)3 << 20), STOKE_ESTATE);
            assert_non_null(strstr(stoke_last_error(), "is pinned already, to 2097152 bytes"));
            assert_int_equal(pin_stats().registered_bytes, after.registered_bytes);
            assert_int_equal(stoke_batch_pin(bt, 0), STOKE_EINVAL);
        }
        assert_int_equal(stoke_batch_pin(bt, (size_t)1 << 30), STOKE_ERANGE);
        assert_non_null(strstr(stoke_last_error(), "the batch's buffer holds"));
        for (size_t j = 0; j < stoke_batch_count(bt); j++) { /* the bytes are the samples' */
            unsigned char want[64];
            stoke_synthetic_fill(0, stoke_batch_indices(bt)[j], want, sizeof(want));
            assert_memory_equal(d + j * sample, want, sizeof(want));
        }
        stoke_batch_release(bt);
        k++;
    }
    assert_int_equal(rc, STOKE_EEND);
    assert_int_equal(k, 6);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.pinned_batches, 6);
    assert_int_equal(st.pageable_batches, 0);
    assert_true(pin_stats().registered_count > ps0.registered_count);
    stoke_loader_stop(l); /* the idle buffers' pages go, and their registrations first */
    assert_int_equal(pin_stats().registered_count, ps0.registered_count);
    assert_int_equal(pin_stats().registered_bytes, ps0.registered_bytes);
    stoke_loader_destroy(l);

    /* a registration that fails: simdev's second allocation since the probe (the first is
     * batch 0's buffer, A: 2 MiB).  Batch 1 fails with simdev's reason (in A, growing to
     * 4 MiB: A gets its 2 MiB back; elsewhere a first registration), and later batches that
     * need a registration fail at once without asking simdev; those that fit A's are pinned */
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", "2");
    tu_use_simdev();
    uint64_t refused0 = pin_stats().register_failures;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    unsigned char *a = NULL;
    int in_a = 0;
    for (k = 0; (rc = stoke_loader_next(l, &bt)) == STOKE_OK; k++) {
        unsigned char *d = stoke_batch_data(bt, 0);
        if (k == 0)
            a = d;
        size_t n = k == 1 && d == a ? (size_t)3 << 20 : 100;
        rc = stoke_batch_pin(bt, n);
        if (k == 0 || (k > 1 && d == a)) {
            assert_int_equal(rc, STOKE_OK);
            assert_int_equal(stoke_batch_is_pinned(bt), 1);
            in_a += k > 1;
        } else {
            assert_int_equal(rc, STOKE_ENOMEM);
            assert_non_null(strstr(stoke_last_error(),
                                   k == 1 ? "simdev could not pin"
                                          : "a registration of the loader's buffers failed "));
            assert_int_equal(stoke_batch_is_pinned(bt), 0);
            assert_int_equal(stoke_is_pinned(d), d == a); /* (A's 2 MiB back) */
        }
        unsigned char want[64];
        stoke_synthetic_fill(0, stoke_batch_indices(bt)[0], want, sizeof(want));
        assert_memory_equal(d, want, sizeof(want));
        stoke_batch_release(bt);
    }
    assert_int_equal(rc, STOKE_EEND);
    /* simdev was asked once and refused: the later failures did not ask it */
    assert_int_equal(pin_stats().register_failures, refused0 + 1);
    print_message("pin_on_use after a failure: %d later batches in the registered buffer\n",
                  in_a);
    stoke_loader_destroy(l); /* with a registered buffer: unregistered */
    assert_int_equal(pin_stats().registered_count, ps0.registered_count);

    /* after a failure, registrations are tried again 64 batches later: the first one fails
     * (simdev's first allocation), batches 1..63 fail at once, 64.. are pinned */
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", "1");
    tu_use_simdev();
    stoke_synthetic_opts so2 = so;
    so2.length = 140;
    so2.shape[0] = 4096;
    stoke_dataset ds2;
    assert_int_equal(stoke_synthetic_open(&so2, &ds2), STOKE_OK);
    assert_int_equal(stoke_loader_create(&o, &ds2, &l), STOKE_OK);
    for (k = 0; (rc = stoke_loader_next(l, &bt)) == STOKE_OK; k++) {
        rc = stoke_batch_pin(bt, 100);
        assert_int_equal(rc, k < 64 ? STOKE_ENOMEM : STOKE_OK);
        if (k > 0 && k < 64)
            assert_non_null(strstr(stoke_last_error(), "failed"));
        stoke_batch_release(bt);
    }
    assert_int_equal(rc, STOKE_EEND);
    assert_int_equal(k, 70);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.pinned_batches, 6);
    assert_int_equal(st.pageable_batches, 64);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds2);
    assert_int_equal(pin_stats().registered_count, ps0.registered_count);
    tu_env("STOKE_SIMDEV_FAIL_ALLOC", NULL);
    tu_use_simdev();

    /* misuse */
    o.worker_mode = STOKE_WORKER_THREADS;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "pin_on_use is for worker_mode processes"));
    o.worker_mode = STOKE_WORKER_PROCESSES;
    o.device = "simdev";
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "pin_on_use is for host batches"));
    o.device = NULL;
    o.pin_on_use = 0; /* a loader pinned whole: its batches are pinned already */
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(stoke_loader_next(l, &bt), STOKE_OK);
    assert_int_equal(stoke_batch_is_pinned(bt), 1);
    assert_int_equal(stoke_batch_pin(bt, 100), STOKE_OK);
    stoke_batch_release(bt);
    stoke_loader_destroy(l);
    o.pin_on_use = 1; /* pinning turned off: no effect, and the batches cannot be pinned */
    tu_env("STOKE_PINNED", "0");
    tu_use_simdev();
    stoke_pinned_stats off0 = pin_stats();
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_null(stoke_loader_pinned_backend(l));
    assert_int_equal(pin_stats().registered_count, off0.registered_count); /* (nor whole) */
    assert_int_equal(pin_stats().registered_bytes, off0.registered_bytes);
    assert_int_equal(stoke_loader_next(l, &bt), STOKE_OK);
    assert_int_equal(stoke_batch_pin(bt, 100), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "not registered, or pinning is off"));
    assert_int_equal(stoke_batch_is_pinned(bt), 0);
    stoke_batch_release(bt);
    stoke_loader_destroy(l);
    tu_env("STOKE_PINNED", NULL);
    tu_use_none();
    o.pin_memory = 0; /* nothing pins */
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(stoke_loader_next(l, &bt), STOKE_OK);
    assert_int_equal(stoke_batch_pin(bt, 100), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "not pinned (no accelerator, or pin_memory 0)"));
    assert_int_equal(stoke_batch_pin(NULL, 1), STOKE_EINVAL);
    stoke_batch_release(bt);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    tu_assert_no_children();
}

/* stoke load --worker-mode: the JSON fields; the same content and order as threads. */
static void test_cli(void **state)
{
    (void)state;
    const char *env[] = {"STOKE_PLUGIN_PATH=", NULL};
    static char out[8192], err[4096], thr[8192];
    const char *procs[] = {"synthetic:500",
                           "--workers",
                           "2",
                           "--batch-size",
                           "16",
                           "--shuffle",
                           "--worker-mode=processes",
                           "--no-pin-memory",
                           "--json",
                           NULL};
    assert_int_equal(tu_run_cli(env, "load", procs, out, sizeof(out), err, sizeof(err)), 0);
    assert_non_null(strstr(out, "\"worker_mode\": \"processes\", \"worker_restarts\": 0"));
    const char *threads[] = {"synthetic:500",   "--workers", "2", "--batch-size", "16", "--shuffle",
                             "--no-pin-memory", "--json",    NULL};
    assert_int_equal(tu_run_cli(env, "load", threads, thr, sizeof(thr), err, sizeof(err)), 0);
    assert_non_null(strstr(thr, "\"worker_mode\": \"threads\", \"worker_restarts\": 0"));
    const char *keys[] = {"\"content_hash\": ", "\"order_hash\": ", "\"samples\": "};
    for (size_t k = 0; k < 3; k++) {
        const char *a = strstr(out, keys[k]), *b = strstr(thr, keys[k]);
        assert_non_null(a);
        assert_non_null(b);
        assert_memory_equal(a, b, strlen(keys[k]) + 20);
    }
    const char *bad[] = {"synthetic:10", "--worker-mode=forks", NULL};
    assert_int_equal(tu_run_cli(env, "load", bad, out, sizeof(out), err, sizeof(err)), 2);
    assert_non_null(strstr(err, "--worker-mode=forks: expected threads or processes"));
}

/* A ragged field, packed: sample i is (i % 17) + 1 bytes (i * 31 + k) & 0xff; sh->crash applies
 * too. */
typedef struct vds {
    unsigned char buf[32];
} vds;

static uint64_t vds_length(void *user)
{
    (void)user;
    return N;
}

static int vds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    (void)worker, (void)msg, (void)msg_len, (void)user;
    if (getpid() != sh->parent && index == sh->crash) {
        signal(SIGSEGV, SIG_DFL);
        raise(SIGSEGV);
    }
    lens[0] = (int64_t)(index % 17) + 1;
    for (int64_t k = 0; k < lens[0]; k++)
        ((unsigned char *)dst[0])[k] = (unsigned char)((index * 31 + (uint64_t)k) & 0xff);
    return STOKE_OK;
}

/* One epoch of a ragged field packed: the bytes of every batch, concatenated, and the indices. */
static size_t var_epoch(int mode, const char *policy, int workers, unsigned char *out,
                        uint64_t *idx, size_t *nidx)
{
    vds v; /* one buffer: each worker process has its own copy; threads: none (0 workers) */
    stoke_dataset ds;
    stoke_dataset_init(&ds);
    ds.kind = STOKE_DATASET_MAP;
    snprintf(ds.name, sizeof(ds.name), "vds");
    ds.user = &v;
    ds.nfields = 1;
    TU_F(&ds)[0].dtype = STOKE_DTYPE_U8;
    TU_F(&ds)[0].ndim = 1;
    TU_SHAPE(&ds, 0)[0] = STOKE_DIM_VAR;
    TU_F(&ds)[0].max_len = 17;
    TU_F(&ds)[0].collate = STOKE_COLLATE_PACK;
    snprintf(TU_F(&ds)[0].name, sizeof(TU_F(&ds)[0].name), "data");
    ds.length = vds_length;
    ds.get = vds_get;
    stoke_loader_opts o;
    opts(&o, policy, mode, workers, 1);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    size_t used = 0;
    *nidx = 0;
    stoke_batch *bt;
    int rc;
    while ((rc = stoke_loader_next(l, &bt)) == STOKE_OK) {
        size_t c = stoke_batch_count(bt);
        const int64_t *off = stoke_batch_offsets(bt, 0);
        const unsigned char *d = stoke_batch_data(bt, 0);
        for (size_t j = 0; j < c; j++) {
            uint64_t i = stoke_batch_indices(bt)[j];
            assert_int_equal(off[j + 1] - off[j], (i % 17) + 1);
            for (int64_t k = off[j]; k < off[j + 1]; k++)
                assert_int_equal(d[k], (unsigned char)((i * 31 + (k - off[j])) & 0xff));
            idx[(*nidx)++] = i;
        }
        memcpy(out + used, d, (size_t)off[c]);
        used += (size_t)off[c];
        stoke_batch_release(bt);
    }
    assert_int_equal(rc, STOKE_EEND);
    stoke_loader_destroy(l);
    tu_assert_no_children();
    return used;
}

static void test_map_var(void **state)
{
    (void)state;
    reset_shared();
    static unsigned char a[N * 17], b[N * 17];
    static uint64_t ia[N], ib[N];
    size_t na, nb;
    size_t la = var_epoch(STOKE_WORKER_THREADS, "error", 0, a, ia, &na); /* no threads: one buf */
    size_t lb = var_epoch(STOKE_WORKER_PROCESSES, "error", 2, b, ib, &nb);
    assert_int_equal(la, lb);
    assert_int_equal(na, N);
    assert_int_equal(nb, N);
    assert_memory_equal(a, b, la);
    assert_memory_equal(ia, ib, sizeof(ia));
    sh->crash = ia[40]; /* shuffled: the 41st sample delivered */
    lb = var_epoch(STOKE_WORKER_PROCESSES, "skip", 2, b, ib, &nb);
    assert_int_equal(nb, N - 1);
    for (size_t k = 0; k < nb; k++)
        assert_int_equal(ib[k], ia[k < 40 ? k : k + 1]);
}

/* timeout_ms: a sample hanging in a child times out as with threads (the parent watches the
 * child's busy mark); destroy then SIGKILLs the stuck child. */
static void test_timeout(void **state)
{
    (void)state;
    reset_shared();
    sh->hang = 30;
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 0, &ds);
    stoke_loader_opts o;
    opts(&o, "skip", STOKE_WORKER_PROCESSES, 1, 0);
    o.timeout_ms = 1000; /* (100 ms: a child preempted in a trivial sample, under ASan beside
                          * other tests, could time out before sample 30) */
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    static run r;
    memset(&r, 0, sizeof(r));
    take(l, 1, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_ETIMEDOUT);
    assert_int_equal(r.n, 24);
    assert_non_null(
        strstr(r.err, "worker 0: sample 30 of pds took longer than the timeout of 1000 ms"));
    int hung = atomic_load(&sh->hang_pid);
    assert_true(hung > 0);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&p.inner);
    assert_true(tu_pid_gone(hung));
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* ---- issue 25: epochs, death of the loader, a stopped zygote, forks, several loaders ---- */

static uint64_t ms_since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)(t.tv_sec - t0->tv_sec) * 1000u + (uint64_t)(t.tv_nsec / 1000000) -
           (uint64_t)(t0->tv_nsec / 1000000);
}

/* Gone, or a zombie (its parent, maybe an init that does not reap, has yet to): it runs no more. */
static int dead(int pid)
{
    if (tu_pid_gone(pid))
        return 1;
    char path[64], buf[256];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return 1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *rp = strrchr(buf, ')');
    return !rp || rp[1] == '\0' || rp[2] == 'Z' || rp[2] == 'X';
}

static int wait_dead(int pid, int ms)
{
    for (int t = 0; t < ms && !dead(pid); t += 5)
        tu_sleep_ms(5);
    return dead(pid);
}

/* The pids whose parent is `ppid` (from /proc/PID/stat). */
static int children_of(int ppid, int *out, int max)
{
    DIR *d = opendir("/proc");
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < max) {
        int pid = atoi(e->d_name);
        if (pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%d/stat", pid);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t len = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *rp = strrchr(buf, ')');
        char st;
        int pp;
        if (rp && sscanf(rp + 1, " %c %d", &st, &pp) == 2 && pp == ppid)
            out[n++] = pid;
    }
    closedir(d);
    return n;
}

/* A dataset whose bytes depend on the epoch its set_epoch was given. */
typedef struct eds {
    pds p;
    stoke_dataset pd;
    uint64_t epoch;
} eds;

static int eds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    eds *e = user;
    int rc = pds_get(&e->p, index, dst, lens, worker, msg, msg_len);
    for (int k = 0; rc == STOKE_OK && k < SB; k++)
        ((unsigned char *)dst[0])[k] ^= (unsigned char)(0x5a + 13 * e->epoch);
    return rc;
}

static int eds_set_epoch(void *user, uint64_t epoch)
{
    ((eds *)user)->epoch = epoch;
    return STOKE_OK;
}

/* Two epochs from `first` on; out[e][i]: sample i's bytes in epoch first + e. */
static void epoch_run(int mode, int persistent, uint64_t first, unsigned char out[2][N][SB])
{
    static eds e;
    stoke_dataset ds;
    memset(&e, 0, sizeof(e));
    pds_open(&e.p, 0, 0, &ds);
    e.epoch = 1000; /* not an epoch of the run: each one must be set */
    ds.user = &e;
    ds.get = eds_get;
    ds.set_epoch = eds_set_epoch;
    stoke_loader_opts o;
    opts(&o, "error", mode, 2, 1);
    o.epoch = first;
    o.persistent_workers = persistent;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    memset(out, 0, 2 * N * SB);
    for (int ep = 0; ep < 2; ep++) {
        if (ep)
            assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
        stoke_batch *b;
        uint64_t n = 0;
        int rc;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            const unsigned char *data = stoke_batch_data(b, 0);
            for (size_t j = 0; j < stoke_batch_count(b); j++, n++)
                memcpy(out[ep][stoke_batch_indices(b)[j]], data + j * SB, SB);
            stoke_batch_release(b);
        }
        assert_int_equal(rc, STOKE_EEND);
        assert_int_equal(n, N);
    }
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&e.p.inner);
}

/* The dataset's set_epoch reaches the children: each epoch's bytes are those threads deliver,
 * and the second epoch's differ from the first's (issue 25 item 3). */
static void test_epoch(void **state)
{
    (void)state;
    reset_shared();
    static unsigned char t[2][N][SB], p[2][N][SB];
    for (int persistent = 0; persistent <= 1; persistent++)
        for (uint64_t first = 0; first <= 5; first += 5) {
            epoch_run(STOKE_WORKER_THREADS, persistent, first, t);
            epoch_run(STOKE_WORKER_PROCESSES, persistent, first, p);
            assert_memory_equal(p, t, sizeof(t));
            for (int i = 0; i < N; i++)
                assert_memory_not_equal(p[1][i], p[0][i], SB);
        }
    tu_assert_no_children();
}

/* The loader's process (a fork of the test) is SIGKILLed while its worker child is in a sample
 * (`slow`); with `with_fork` it has forked a sleeping child first, which holds copies of
 * whatever it inherited.  The zygote and the worker must die with it (within 3 s), and the
 * worker must not finish its sample (issue 25 items 4 and 12). */
static void orphan_case(int with_fork)
{
    reset_shared();
    sh->slow = 20;
    pid_t lp = fork();
    assert_true(lp >= 0);
    if (lp == 0) {
        sh->parent = getpid();
        pds p;
        stoke_dataset ds;
        pds_open(&p, 0, 0, &ds);
        stoke_loader_opts o;
        opts(&o, "error", STOKE_WORKER_PROCESSES, 1, 0);
        stoke_loader *l;
        if (stoke_loader_create(&o, &ds, &l) != STOKE_OK)
            _exit(2);
        stoke_batch *b;
        if (stoke_loader_next(l, &b) != STOKE_OK) /* the worker exists */
            _exit(3);
        stoke_batch_release(b);
        if (with_fork) {
            pid_t s = fork();
            if (s == 0)
                for (;;)
                    pause(); /* until the test kills it */
            atomic_store(&sh->s_pid, (int)s);
        }
        while (stoke_loader_next(l, &b) == STOKE_OK) /* blocks at sample 20 */
            stoke_batch_release(b);
        _exit(4);
    }
    int z = 0, w = 0, s = 0;
    for (int t = 0; t < 20000 && (!z || !w || (with_fork && !s)); t += 5) {
        tu_sleep_ms(5);
        z = atomic_load(&sh->z_pid);
        w = atomic_load(&sh->w_pid);
        s = atomic_load(&sh->s_pid);
    }
    int st = 0;
    assert_int_equal(kill(lp, SIGKILL), 0);
    assert_int_equal(waitpid(lp, &st, 0), lp);
    atomic_store(&sh->p_killed, 1);
    int zd = z && wait_dead(z, 3000), wd = w && wait_dead(w, 3000);
    int s_alive = with_fork && s > 0 && !dead(s);
    if (s > 0)
        kill(s, SIGKILL);
    if (!zd && z > 0)
        kill(z, SIGKILL);
    if (!wd && w > 0)
        kill(w, SIGKILL);
    assert_true(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
    assert_true(z > 0 && w > 0 && z != lp);
    assert_true(zd); /* the zygote died with the loader's process */
    assert_true(wd); /* and so did its worker */
    assert_int_equal(atomic_load(&sh->orphan_wrote), 0);
    if (with_fork)
        assert_true(s_alive); /* although the fork was still alive */
    tu_assert_no_children();
}

static void test_dies_with_loader(void **state)
{
    (void)state;
    orphan_case(0);
    orphan_case(1);
}

/* A stopped zygote: starting a worker fails with STOKE_ETIMEDOUT naming it, within a bound,
 * instead of hanging; once it runs again the loader works (its late reply is dropped) (issue 25
 * item 10). */
static void test_zygote_stopped(void **state)
{
    (void)state;
    reset_shared();
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 0, &ds);
    stoke_loader_opts o;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 1, 0);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    int kids[4];
    assert_int_equal(children_of(getpid(), kids, 4), 1); /* the zygote; no worker yet */
    int z = kids[0];
    assert_int_equal(kill(z, SIGSTOP), 0);
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stoke_batch *b;
    int rc = stoke_loader_next(l, &b);
    uint64_t took = ms_since(&t0);
    char want[128];
    snprintf(want, sizeof(want), "the worker zygote (pid %d) did not answer in 5 s", z);
    char err[1024];
    snprintf(err, sizeof(err), "%s", stoke_last_error());
    kill(z, SIGCONT);
    assert_int_equal(rc, STOKE_ETIMEDOUT);
    if (!strstr(err, want))
        fail_msg("no '%s' in '%s'", want, err);
    assert_true(took < 30000);
    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
    static run r;
    memset(&r, 0, sizeof(r));
    take(l, 1, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N);
    /* the child forked for the request that timed out was killed and reaped (zreq FORGET),
     * not left a zombie of the zygote: the worker alone remains */
    int nk = 0;
    for (int t = 0; t < 600 && (nk = children_of(z, kids, 4)) != 1; t++)
        tu_sleep_ms(5);
    assert_int_equal(nk, 1);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&p.inner);
    assert_true(dead(z));
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* fork() after iterating: the child's calls fail at once, its destroy leaves the parent's
 * processes alone, and the parent goes on (issue 25 item 11). */
static void test_fork_child(void **state)
{
    (void)state;
    reset_shared();
    int fds = tu_count_fds_to("");
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 0, &ds);
    stoke_loader_opts o;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 2, 1);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    static run r;
    memset(&r, 0, sizeof(r));
    take(l, 2, &r, 3);
    assert_int_equal(r.nbatches, 3);
    char want[128];
    snprintf(want, sizeof(want), "loader was created in process %d; a forked child cannot use it",
             (int)getpid());
    pid_t c = fork();
    assert_true(c >= 0);
    if (c == 0) {
        alarm(20);
        stoke_batch *b = NULL;
        int bad = 0;
        if (stoke_loader_next(l, &b) != STOKE_ESTATE || b || !strstr(stoke_last_error(), want))
            bad |= 1;
        if (stoke_loader_set_epoch(l, 1) != STOKE_ESTATE)
            bad |= 2;
        if (stoke_loader_next_epoch(l) != STOKE_ESTATE)
            bad |= 2;
        stoke_loader_state ls;
        memset(&ls, 0, sizeof(ls));
        ls.version = STOKE_LOADER_STATE_VERSION;
        if (stoke_loader_restore_state(l, &ls) != STOKE_ESTATE)
            bad |= 4;
        stoke_loader_stats s;
        memset(&s, 0, sizeof(s));
        s.size = sizeof(s);
        if (stoke_loader_get_stats(l, &s) != STOKE_ESTATE ||
            stoke_loader_save_state(l, &ls) != STOKE_ESTATE)
            bad |= 8; /* they would take the parent's mutex, maybe held */
        stoke_loader_destroy(l);
        _exit(bad);
    }
    int st = 0;
    assert_int_equal(waitpid(c, &st, 0), c);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("forked child: %s %d", WIFEXITED(st) ? "exit status" : "signal",
                 WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
    for (int k = 0; k < r.npids; k++)
        assert_false(tu_pid_gone(r.pids[k])); /* the child's destroy left them alone */
    take(l, 2, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&p.inner);
    for (int k = 0; k < r.npids; k++)
        assert_true(tu_pid_gone(r.pids[k]));
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* Several live loaders destroyed in creation order: none waits for a later one's zygote to let
 * go of its sockets (5 s each before; issue 25 item 16). */
static void test_several_loaders(void **state)
{
    (void)state;
    reset_shared();
    int fds = tu_count_fds_to("");
    enum { NL = 4 };
    static pds p[NL];
    stoke_dataset ds[NL];
    stoke_loader *l[NL];
    for (int i = 0; i < NL; i++) {
        pds_open(&p[i], 0, 0, &ds[i]);
        stoke_loader_opts o;
        opts(&o, "error", STOKE_WORKER_PROCESSES, 1, 0);
        assert_int_equal(stoke_loader_create(&o, &ds[i], &l[i]), STOKE_OK);
        stoke_batch *b;
        assert_int_equal(stoke_loader_next(l[i], &b), STOKE_OK); /* its worker exists */
        stoke_batch_release(b);
    }
    for (int i = 0; i < NL; i++) {
        struct timespec t0;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        stoke_loader_destroy(l[i]);
        uint64_t took = ms_since(&t0);
        if (took >= 2500)
            fail_msg("destroying loader %d of %d took %" PRIu64 " ms", i + 1, NL, took);
        stoke_dataset_close(&ds[i]);
        stoke_dataset_close(&p[i].inner);
    }
    tu_assert_no_children();
    assert_int_equal(tu_count_fds_to(""), fds);
}

/* A process forked without the fork handlers (the raw system call) holds every socket of the
 * loader: destroy still ends the zygote at once (zreq EXIT), not after waiting 5 s for an EOF
 * that the fork's copy of the socket prevents. */
static void test_destroy_socket_held(void **state)
{
    (void)state;
    reset_shared();
    pds p;
    stoke_dataset ds;
    stoke_loader *l = proc_loader(&p, &ds, 0, 1);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* its worker exists */
    stoke_batch_release(b);
    fflush(NULL);
    long c = syscall(SYS_fork);
    assert_true(c >= 0);
    if (c == 0) {
        for (;;)
            pause(); /* until the test kills it */
    }
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    stoke_loader_destroy(l);
    uint64_t took = ms_since(&t0);
    kill((pid_t)c, SIGKILL);
    assert_int_equal(waitpid((pid_t)c, NULL, 0), (pid_t)c);
    if (took >= 2500)
        fail_msg("destroy took %" PRIu64 " ms with the sockets held by a fork", took);
    stoke_dataset_close(&ds);
    stoke_dataset_close(&p.inner);
    tu_assert_no_children();
}

/* opts.errors_go_on with worker processes: a crash's batch is an error and the epoch goes on
 * (the child replaced) with every other batch; but past 100 restarts in the epoch the cap's
 * STOKE_ELIMIT ends it, going on or not (it went on, restarting a child for every later crash:
 * the cap stopped nothing). */
static void test_crash_go_on(void **state)
{
    (void)state;
    int fds = tu_count_fds_to("");
    reset_shared();
    sh->crash = 21;
    pds p;
    stoke_dataset ds;
    pds_open(&p, 0, 0, &ds);
    stoke_loader_opts o;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 2, 0);
    o.errors_go_on = 1;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    run r;
    memset(&r, 0, sizeof(r));
    take(l, 2, &r, UINT64_MAX);
    assert_int_equal(r.rc, STOKE_EDATA);
    check_crash_msg(r.err, "SIGSEGV", 21);
    take(l, 2, &r, UINT64_MAX); /* the rest: batch 2 (16..23) is the only one missing */
    assert_int_equal(r.rc, STOKE_EEND);
    assert_int_equal(r.n, N - BS);
    for (uint64_t k = 0; k < r.n; k++)
        assert_int_equal(r.idx[k], k < 2 * BS ? k : k + BS);
    finish(l, &r);
    assert_int_equal(r.st.worker_restarts, 1);
    end_loader(l, &ds, &p, &r, 0, fds);

    /* the cap: 100 crashes go on, the 101st (sample 200) ends the epoch */
    pds_open(&p, 0, 0, &ds);
    p.n = 300; /* its even samples crash their worker */
    sh->crash = UINT64_MAX;
    sh->crash_even = 1;
    opts(&o, "error", STOKE_WORKER_PROCESSES, 2, 0);
    o.batch_size = 1;
    o.errors_go_on = 1;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    int nok = 0, nerr = 0, nlimit = 0, rc, last_rc = 0;
    stoke_batch *b;
    while ((rc = stoke_loader_next(l, &b)) != STOKE_EEND) {
        if (rc == STOKE_OK) {
            assert_int_equal(stoke_batch_indices(b)[0], 2 * (uint64_t)nok + 1);
            nok++;
            stoke_batch_release(b);
            continue;
        }
        nerr++;
        last_rc = rc;
        if (rc == STOKE_ELIMIT) {
            nlimit++;
            assert_non_null(strstr(stoke_loader_last_error(l), "restarted more than 100 times"));
        }
        if (nerr > 101)
            fail_msg("error %d: rc %d: %s", nerr, rc, stoke_loader_last_error(l));
    }
    /* The 101st restart is counted when it happens: with two workers running ahead, at sample
     * 198 or 200 (or a later one). The epoch ends at its batch: each batch before it delivered
     * (odd) or failed (even) once */
    assert_int_equal(nlimit, 1);
    assert_int_equal(last_rc, STOKE_ELIMIT);
    assert_int_equal(nerr, nok + 1);
    assert_true(nerr >= 90 && nerr <= 101);
    memset(&r, 0, sizeof(r));
    end_loader(l, &ds, &p, &r, 0, fds);
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
        cmocka_unit_test_setup(test_same_as_threads, setup),
        cmocka_unit_test_setup(test_worker_init_fails, setup),
        cmocka_unit_test_setup(test_crash_error, setup),
        cmocka_unit_test_setup(test_crash_skip, setup),
        cmocka_unit_test_setup(test_crash_replace, setup),
        cmocka_unit_test_setup(test_kill9, setup),
        cmocka_unit_test_setup(test_kill_idle, setup),
        cmocka_unit_test_setup(test_destroy_mid_epoch, setup),
        cmocka_unit_test_setup(test_interrupt_abandon, setup),
        cmocka_unit_test_setup(test_stop_keeps_held, setup),
        cmocka_unit_test_setup(test_invalid, setup),
        cmocka_unit_test_setup(test_pinned_device, setup),
        cmocka_unit_test_setup(test_pin_on_use, setup),
        cmocka_unit_test_setup(test_cli, setup),
        cmocka_unit_test_setup(test_map_var, setup),
        cmocka_unit_test_setup(test_timeout, setup),
        cmocka_unit_test_setup(test_epoch, setup),
        cmocka_unit_test_setup(test_dies_with_loader, setup),
        cmocka_unit_test_setup(test_zygote_stopped, setup),
        cmocka_unit_test_setup(test_fork_child, setup),
        cmocka_unit_test_setup(test_several_loaders, setup),
        cmocka_unit_test_setup(test_destroy_socket_held, setup),
        cmocka_unit_test_setup(test_crash_go_on, setup),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    munmap(sh, sizeof(*sh));
    return tu_exit_status(rc);
}
