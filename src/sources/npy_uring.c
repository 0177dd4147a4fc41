/* io=uring for the npy source: one io_uring per worker keeps up to STOKE_NPY_URING_DEPTH reads
 * in flight, each straight into the batch's slots (one read per run of consecutive rows).
 *
 * Rings: ds->rings[worker % STOKE__NPY_RINGS], created by the worker's first get_batch()
 * (published with a compare-and-swap: a loser frees its own) and freed by the dataset's close.
 * Each ring has a mutex held for a whole batch: a ring is one thread's at a time (two loaders
 * sharing a dataset, or worker ids past the table, only serialise).  A ring is its process's:
 * a forked child shares the parent's rings' queues (MAP_SHARED) and must never submit to them
 * (the parent's next batch found its queue moved under it and crashed).  The dataset's
 * fork_child hook drops them in a worker process before it reads (stoke__npy_rings_forked);
 * a process forked by anything else finds the ring another process's (its pid) and makes its
 * own in its place.
 *
 * Errors: a read that fails (res < 0) or ends early (res 0: end of file, the file shrank) is
 * the error of the sample its missing bytes belong to, with the messages of io=pread; short
 * reads are continued.  Once a read failed nothing new is queued, the reads in flight are
 * reaped (they write into the caller's slots) and the error of the lowest batch position is
 * returned.  A ring that cannot be created, or fails as a ring (io_uring_submit), is dropped
 * for that worker with one warning, and the batch (reads are idempotent) is read with pread. */
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/npy_internal.h"
#include "stoke/sources.h"

#ifdef STOKE_HAVE_LIBURING
#include <liburing.h>

/* One request: a run and how much of it has arrived. */
typedef struct req {
    stoke__npy_run run;
    size_t done;
    int next; /* free list / redo list */
} req;

struct stoke__npy_ring {
    pthread_mutex_t mu; /* guards everything below; held by get_batch() for a whole batch */
    pid_t pid;          /* the process that made it (set once, before it is published) */
    int ok;             /* ring is usable */
    struct io_uring ring;
    req reqs[STOKE_NPY_URING_DEPTH];
};

/* A read request of at most 1 GiB (the rest of a longer run follows as a continuation). */
#define READ_MAX (1u << 30)

int stoke__npy_uring_built(void)
{
    return 1;
}

int stoke__npy_uring_probe(char *why, size_t why_len)
{
    struct io_uring r;
    int e = io_uring_queue_init(4, &r, 0);
    if (e < 0) {
        stoke__fmt(why, why_len,
                   "io_uring_queue_init failed: %s (the kernel refuses io_uring here: seccomp, "
                   "kernel.io_uring_disabled or a kernel without it)",
                   strerror(-e));
        return e;
    }
    io_uring_queue_exit(&r);
    return 0;
}

static struct stoke__npy_ring *get_ring(stoke__npy_ds *ds, int worker)
{
    size_t slot = (unsigned)worker % STOKE__NPY_RINGS;
    pid_t self = getpid();
    struct stoke__npy_ring *had = atomic_load_explicit(&ds->rings[slot], memory_order_acquire);
    if (had && had->pid == self)
        return had;
    /* none yet, or one a process forked outside the loader's hooks inherited: the parent's
     * (left as it is, not freed: another thread of this process may be reading its pid) */
    struct stoke__npy_ring *r = calloc(1, sizeof(*r));
    if (!r)
        return NULL;
    pthread_mutex_init(&r->mu, NULL);
    r->pid = self;
    int e = io_uring_queue_init(STOKE_NPY_URING_DEPTH, &r->ring, 0);
    r->ok = e == 0;
    if (e && !atomic_exchange(&ds->ring_warned, 1))
        stoke__log(STOKE_LOG_WARN,
                   "npy %s: worker %d: io_uring_queue_init failed (%s): reading with pread",
                   ds->f[0].path, worker, strerror(-e));
    if (!atomic_compare_exchange_strong_explicit(&ds->rings[slot], &had, r, memory_order_acq_rel,
                                                 memory_order_acquire)) {
        if (r->ok)
            io_uring_queue_exit(&r->ring);
        pthread_mutex_destroy(&r->mu);
        free(r);
        r = had; /* another thread's of this process, made meanwhile */
    }
    return r;
}

/* State of one batch on a ring. */
typedef struct ubatch {
    struct stoke__npy_ring *r;
    const stoke__npy_ds *ds;
    stoke__npy_runs it;
    int free_head, redo_head;
    unsigned inflight;    /* requests queued or in the kernel */
    unsigned unsubmitted; /* of those, prepared but not yet submitted */
    int more;             /* runs left to queue */
    int fatal;            /* -errno of a failed io_uring_submit/wait */
    int failed;           /* a read failed: fr, fgot, ferr hold the first (lowest position) */
    stoke__npy_run fr;
    size_t fgot;
    int ferr;
} ubatch;

static void prep(ubatch *b, int slot)
{
    req *q = &b->r->reqs[slot];
    struct io_uring_sqe *sqe = io_uring_get_sqe(&b->r->ring); /* space checked by the caller */
    size_t left = q->run.len - q->done;
    unsigned n = left > READ_MAX ? READ_MAX : (unsigned)left;
    io_uring_prep_read(sqe, b->ds->f[q->run.k].fd, q->run.dst + q->done, n, q->run.at + q->done);
    io_uring_sqe_set_data(sqe, (void *)(uintptr_t)slot);
    b->unsubmitted++;
}

/* Queues continuations, then new runs, while the submission queue has room. */
static void fill(ubatch *b)
{
    while (b->redo_head >= 0 && io_uring_sq_space_left(&b->r->ring) > 0) {
        int s = b->redo_head;
        b->redo_head = b->r->reqs[s].next;
        prep(b, s);
    }
    while (b->more && !b->failed && b->free_head >= 0 && io_uring_sq_space_left(&b->r->ring) > 0) {
        int s = b->free_head;
        req *q = &b->r->reqs[s];
        if (!stoke__npy_runs_next(&b->it, &q->run)) {
            b->more = 0;
            break;
        }
        b->free_head = q->next;
        q->done = 0;
        b->inflight++;
        prep(b, s);
    }
}

static void release(ubatch *b, int s)
{
    b->r->reqs[s].next = b->free_head;
    b->free_head = s;
    b->inflight--;
}

/* Handles one completion. */
static void complete(ubatch *b, int s, int res)
{
    req *q = &b->r->reqs[s];
    if (res > 0)
        q->done += (size_t)res;
    if ((res > 0 && q->done < q->run.len) || res == -EINTR || res == -EAGAIN) {
        if (b->failed) { /* no point finishing it */
            release(b, s);
            return;
        }
        q->next = b->redo_head;
        b->redo_head = s;
        return;
    }
    if (res <= 0) {
        size_t rb = b->ds->f[q->run.k].row_bytes;
        size_t pos = q->run.pos + q->done / rb;
        if (!b->failed || pos < b->fr.pos + b->fgot / b->ds->f[b->fr.k].row_bytes) {
            b->failed = 1;
            b->fr = q->run;
            b->fgot = q->done;
            b->ferr = res;
        }
    }
    release(b, s);
}

/* Reaps what has completed, waiting for at least one completion. */
static void reap(ubatch *b)
{
    struct io_uring_cqe *cqe;
    int e = io_uring_wait_cqe(&b->r->ring, &cqe);
    if (e == -EINTR || e == -EAGAIN)
        return;
    if (e < 0) {
        b->fatal = e;
        return;
    }
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&b->r->ring, head, cqe)
    {
        complete(b, (int)(uintptr_t)io_uring_cqe_get_data(cqe), cqe->res);
        seen++;
    }
    io_uring_cq_advance(&b->r->ring, seen);
}

/* Reads the batch on ring r (held).  Returns STOKE_OK, a read's error, or 1 when the ring
 * failed as a ring (b->fatal): the caller drops it and reads the batch with pread. */
static int run_batch(ubatch *b, const uint64_t *idx, char *msg, size_t msg_len, uint64_t *err_index)
{
    b->free_head = 0;
    for (int s = 0; s < STOKE_NPY_URING_DEPTH; s++)
        b->r->reqs[s].next = s + 1 < STOKE_NPY_URING_DEPTH ? s + 1 : -1;
    b->redo_head = -1;
    for (;;) {
        if (!b->fatal)
            fill(b);
        if (b->unsubmitted && !b->fatal) {
            int n = io_uring_submit(&b->r->ring);
            if (n >= 0)
                b->unsubmitted -= (unsigned)n < b->unsubmitted ? (unsigned)n : b->unsubmitted;
            else if ((n != -EINTR && n != -EAGAIN && n != -EBUSY) || b->inflight == b->unsubmitted)
                b->fatal = n;
        }
        if (b->inflight == b->unsubmitted) /* nothing in the kernel */
            break;
        reap(b);
        if (b->fatal) /* the ring is closed next, which cancels what is left in it */
            break;
    }
    if (b->fatal)
        return 1;
    if (b->failed)
        return stoke__npy_run_failed(b->ds, idx, &b->fr, b->fgot, b->ferr, msg, msg_len, err_index);
    return STOKE_OK;
}

int stoke__npy_batch_uring(stoke__npy_ds *ds, const uint64_t *idx, size_t count, void *const dst[],
                           int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    struct stoke__npy_ring *r = get_ring(ds, worker < 0 ? 0 : worker);
    if (r)
        pthread_mutex_lock(&r->mu);
    if (!r || !r->ok) {
        if (r)
            pthread_mutex_unlock(&r->mu);
        return stoke__npy_batch_pread(ds, idx, count, dst, msg, msg_len, err_index);
    }
    ubatch b;
    memset(&b, 0, sizeof(b));
    b.r = r;
    b.ds = ds;
    b.more = 1;
    stoke__npy_runs_init(&b.it, ds, idx, count, dst);
    int rc = run_batch(&b, idx, msg, msg_len, err_index);
    if (rc == 1) {
        /* The ring itself failed: requests still queued in it are dropped with it. */
        io_uring_queue_exit(&r->ring);
        r->ok = 0;
        if (!atomic_exchange(&ds->ring_warned, 1))
            stoke__log(STOKE_LOG_WARN,
                       "npy %s: worker %d: io_uring failed (%s): reading with pread", ds->f[0].path,
                       worker, strerror(-b.fatal));
    }
    pthread_mutex_unlock(&r->mu);
    if (rc == 1)
        rc = stoke__npy_batch_pread(ds, idx, count, dst, msg, msg_len, err_index);
    return rc;
}

/* Empties ds's ring table.  A ring this process made has its mutex destroyed; of one a fork
 * inherited (forked: every ring), this process's copies of the mappings and descriptor go,
 * the ring stays the parent's, and the mutex is left as it is (a parent thread may have held it
 * at the fork; no thread of this process waits on it). */
static void drop_rings(stoke__npy_ds *ds, int forked)
{
    pid_t self = getpid();
    for (int i = 0; i < STOKE__NPY_RINGS; i++) {
        struct stoke__npy_ring *r = atomic_exchange(&ds->rings[i], NULL);
        if (!r)
            continue;
        if (r->ok)
            io_uring_queue_exit(&r->ring);
        if (!forked && r->pid == self)
            pthread_mutex_destroy(&r->mu);
        free(r);
    }
}

void stoke__npy_rings_free(stoke__npy_ds *ds)
{
    drop_rings(ds, 0);
}

void stoke__npy_rings_forked(stoke__npy_ds *ds)
{
    drop_rings(ds, 1);
}

#else /* !STOKE_HAVE_LIBURING */

int stoke__npy_uring_built(void)
{
    return 0;
}

int stoke__npy_uring_probe(char *why, size_t why_len)
{
    stoke__fmt(why, why_len, "stoke was built without liburing");
    return -ENOSYS;
}

int stoke__npy_batch_uring(stoke__npy_ds *ds, const uint64_t *idx, size_t count, void *const dst[],
                           int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    (void)worker; /* not reached: open refuses io=uring in this build */
    return stoke__npy_batch_pread(ds, idx, count, dst, msg, msg_len, err_index);
}

void stoke__npy_rings_free(stoke__npy_ds *ds)
{
    (void)ds;
}

void stoke__npy_rings_forked(stoke__npy_ds *ds)
{
    (void)ds;
}

#endif
