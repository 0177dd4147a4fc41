/* The loader's worker threads and sample production: dispatching batches, filling them from the
 * dataset, and handing them to the done list. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/loader.h"

/* ---- producing batches -------------------------------------------------------------------- */

static size_t batch_count(const stoke_loader *l, uint64_t seq)
{
    uint64_t first = seq * l->o.batch_size;
    uint64_t left = l->nsamples - first;
    return left < l->o.batch_size ? (size_t)left : l->o.batch_size;
}

/* Timeout bookkeeping, only when a timeout is set (o.timeout_ms): with workers, publishes that
 * worker w is busy with dataset index `idx` (UINT64_MAX: an ITERABLE sample) since now, for
 * the consumer's check (loader.c, timed_out_worker: it reads busy_since, then busy_index);
 * returns the start time.  0 without a timeout: no clock read, no store. */
static inline uint64_t busy_begin(const stoke_loader *l, stoke__worker *w, uint64_t idx)
{
    if (!l->o.timeout_ms)
        return 0;
    uint64_t t0 = stoke__now_ns();
    if (w) {
        atomic_store_explicit(&w->busy_index, idx, memory_order_relaxed);
        atomic_store_explicit(&w->busy_since, t0, memory_order_release);
    }
    return t0;
}

/* Ends what busy_begin started: clears the worker's busy mark, or, in the caller's thread
 * (w NULL), turns a success that took longer than the timeout into STOKE_ETIMEDOUT (with the
 * message in msg).  Returns the status. */
static inline int busy_end(const stoke_loader *l, stoke__worker *w, uint64_t t0, int rc, char *msg,
                           size_t msg_len)
{
    if (!l->o.timeout_ms)
        return rc;
    if (w) {
        atomic_store_explicit(&w->busy_since, 0, memory_order_release);
    } else if (rc == STOKE_OK && stoke__now_ns() - t0 > (uint64_t)l->o.timeout_ms * 1000000u) {
        rc = STOKE_ETIMEDOUT;
        stoke__fmt(msg, msg_len, "took longer than the timeout of %u ms", l->o.timeout_ms);
    }
    return rc;
}

/* Records the failure of batch b (status rc, a positive one as STOKE_EDATA) at dataset index
 * or sampler position `where`, with msg (or the code's text when msg is empty). */
static void batch_failed(stoke_batch *b, int rc, uint64_t where, const char *msg)
{
    b->status = rc > 0 ? STOKE_EDATA : rc;
    b->err_index = where;
    stoke__strlcpy(b->err_msg, msg[0] ? msg : stoke_strerror(b->status), sizeof(b->err_msg));
}

/* The keys of (seed, epoch) for this thread, with the permutation's table where it has one
 * (stoke__sampler_epoch_tabulate), derived again only when they change (a zeroed
 * context names no sampler; the init fails only for a NULL argument, and a fill from a context
 * it did not make is STOKE_EINVAL). */
static const stoke__sampler_epoch *ahead_epoch(const stoke_loader *l, stoke__ahead *a,
                                               uint64_t seed, uint64_t epoch)
{
    stoke__sampler_epoch *ep = &a->ep;
    if (ep->s != l->sampler || ep->seed != seed || ep->epoch != epoch) {
        (void)stoke__sampler_epoch_init(ep, l->sampler, seed, epoch);
        (void)stoke__sampler_epoch_tabulate(ep, a->tab, STOKE__ARRAY_LEN(a->tab));
    }
    return ep;
}

_Atomic uint64_t stoke__ahead_fills;

/* The indices of batch seq (n samples, at most STOKE__AHEAD_RUN) from this thread's runs,
 * filling a new run from its first position when neither holds them (see stoke__ahead).  NULL
 * when the sampler refuses: the caller computes them alone and reports the error. */
static const uint64_t *ahead_indices(const stoke_loader *l, stoke__ahead *a, uint64_t seq,
                                     size_t n, uint64_t seed, uint64_t epoch)
{
    uint64_t pos = seq * l->o.batch_size;
    for (int i = 0; i < 2; i++) {
        const stoke__ahead_run *r = &a->run[i];
        if (r->n >= n && r->seed == seed && r->epoch == epoch && pos >= r->pos0 &&
            pos - r->pos0 <= r->n - n)
            return r->idx + (pos - r->pos0);
    }
    /* a new run, over the batches this thread makes in a row, in place of the run that does not
     * hold the position before (the batch the thread makes now, when the look-ahead asks for
     * the next one), else of the run that ends first */
    uint64_t end = a->seq_end > seq ? a->seq_end : seq + 1;
    uint64_t last = end < l->nbatches ? end * l->o.batch_size : l->nsamples;
    uint64_t m = last - pos < STOKE__AHEAD_RUN ? last - pos : STOKE__AHEAD_RUN;
    int hold[2];
    uint64_t ends[2];
    for (int i = 0; i < 2; i++) {
        const stoke__ahead_run *q = &a->run[i];
        int valid = q->n && q->seed == seed && q->epoch == epoch;
        hold[i] = valid && pos > q->pos0 && pos - q->pos0 <= q->n;
        ends[i] = valid ? q->pos0 + q->n : 0;
    }
    int drop = hold[0] != hold[1] ? hold[0] : ends[0] > ends[1];
    stoke__ahead_run *r = &a->run[drop];
    const stoke__sampler_epoch *ep = ahead_epoch(l, a, seed, epoch);
    r->n = 0;
    if (m < n || stoke__sampler_fill(l->sampler, ep, pos, (size_t)m, r->idx) != STOKE_OK)
        return NULL;
    r->seed = seed;
    r->epoch = epoch;
    r->pos0 = pos;
    r->n = (size_t)m;
    atomic_fetch_add_explicit(&stoke__ahead_fills, 1, memory_order_relaxed);
    return r->idx;
}

/* MAP / MAP_VAR: the dataset indices of batch seq's b->count samples into b->indices, all at
 * once, from this thread's runs (see stoke__ahead) for small batches.  Returns STOKE_OK, or
 * fails the batch (count 0) at the first position the sampler refuses, with the message
 * "sampler position out of range" as per-sample indexing did. */
static int batch_indices(stoke_loader *l, stoke_batch *b, stoke__ahead *a, uint64_t seed,
                         uint64_t epoch, uint64_t seq)
{
    const uint64_t *run = b->count <= STOKE__AHEAD_RUN
                              ? ahead_indices(l, a, seq, b->count, seed, epoch)
                              : NULL;
    if (run) {
        memcpy(b->indices, run, b->count * sizeof(*run));
        return STOKE_OK;
    }
    const stoke__sampler_epoch *ep = ahead_epoch(l, a, seed, epoch);
    uint64_t pos0 = seq * l->o.batch_size;
    int rc = stoke__sampler_fill(l->sampler, ep, pos0, b->count, b->indices);
    if (rc == STOKE_OK)
        return STOKE_OK;
    size_t j = 0; /* the failing position: the first one stoke_sampler_index refuses */
    int prc = STOKE_OK;
    for (; j < b->count; j++)
        if ((prc = stoke_sampler_index(l->sampler, seed, epoch, pos0 + j, &b->indices[j])) != 0)
            break;
    batch_failed(b, prc != STOKE_OK ? prc : rc, pos0 + (j < b->count ? j : 0),
                 "sampler position out of range");
    b->count = 0;
    return b->status;
}

/* MAP_VAR: sample idx packed into slot j of b.  Returns the status (msg set on an error). */
static int var_sample(stoke_loader *l, stoke_batch *b, int wid, size_t j, uint64_t idx, char *msg,
                      size_t msg_len)
{
    const void *data = NULL;
    size_t len = 0;
    void *token = NULL;
    int rc = l->ds.get_var(l->ds.user, idx, &data, &len, &token, wid, msg, msg_len);
    if (rc != STOKE_OK)
        return rc;
    uint64_t used = b->offsets[j];
    if (len > l->cap * l->fields[0].bytes - used) {
        rc = STOKE_ELIMIT;
        stoke__fmt(msg, msg_len,
                   "variable-size sample of %zu bytes does not fit: a batch holds %zu "
                   "(min(batch_size, samples per epoch) x fields[0].bytes)",
                   len, l->cap * l->fields[0].bytes);
    } else {
        if (len)
            memcpy(b->host->mem + used, data, len);
        b->offsets[j + 1] = used + len;
    }
    if (l->ds.release_var)
        l->ds.release_var(l->ds.user, token);
    return rc;
}

/* Calls the dataset for one sample of batch b (slot j), with the timeout bookkeeping.
 * MAP / MAP_VAR: `idx` is the sample; ITERABLE: *idx receives it.  Returns the status. */
int stoke__loader_one_sample(stoke_loader *l, stoke_batch *b, stoke__worker *w, int wid, size_t j,
                             uint64_t *idx, char *msg, size_t msg_len)
{
    msg[0] = '\0';
    uint64_t t0 = busy_begin(l, w, l->iterable ? UINT64_MAX : *idx);
    int rc;
    if (l->var) {
        rc = var_sample(l, b, wid, j, *idx, msg, msg_len);
    } else {
        unsigned char *mem = b->host->mem;
        void *dst[STOKE_MAX_FIELDS];
        for (int f = 0; f < l->ds.nfields; f++)
            dst[f] = mem + l->off[f] + j * l->fields[f].bytes;
        rc = l->iterable ? l->ds.next(l->ds.user, wid, l->nworkers, dst, idx, msg, msg_len)
                         : l->ds.get(l->ds.user, *idx, dst, wid, msg, msg_len);
    }
    return busy_end(l, w, t0, rc, msg, msg_len);
}

/* MAP without get_batch: one get() per sample from the indices computed up front; without a
 * timeout the loop does nothing else.  A failing sample goes through the bad-sample policy
 * (badsample.c): skipped ones leave no slot (the rest move up), replaced ones change their
 * index.  Sets b->count to the samples written. */
static void fill_map_samples(stoke_loader *l, stoke_batch *b, stoke__worker *w, int wid)
{
    const int nf = l->ds.nfields;
    const size_t n = b->count;
    uint64_t *idx = b->indices;
    unsigned char *mem = b->host->mem;
    void *dst[STOKE_MAX_FIELDS];
    char msg[256];
    size_t out = 0;
    for (size_t j = 0; j < n; j++) {
        for (int f = 0; f < nf; f++)
            dst[f] = mem + l->off[f] + out * l->fields[f].bytes;
        msg[0] = '\0';
        uint64_t got = idx[j];
        uint64_t t0 = busy_begin(l, w, got);
        int rc = l->ds.get(l->ds.user, got, dst, wid, msg, sizeof(msg));
        rc = busy_end(l, w, t0, rc, msg, sizeof(msg));
        if (rc != STOKE_OK)
            rc = stoke__bad_sample(l, b, w, wid, out, &got, rc, msg, sizeof(msg));
        if (rc == STOKE__BAD_SKIPPED)
            continue;
        if (rc != STOKE_OK) {
            batch_failed(b, rc, got, msg);
            b->count = out;
            return;
        }
        idx[out++] = got;
    }
    b->count = out;
}

/* MAP datasets with get_batch (dataset.h): one call for the whole batch (its indices already
 * in b->indices), so the dataset can queue its reads; the busy/timeout bookkeeping is per
 * batch (the busy index is the batch's first sample).  Sets status and error fields. */
static void fill_map_batch(stoke_loader *l, stoke_batch *b, stoke__worker *w, int wid)
{
    size_t n = b->count;
    if (!n)
        return;
    unsigned char *mem = b->host->mem;
    void *dst[STOKE_MAX_FIELDS];
    for (int f = 0; f < l->ds.nfields; f++)
        dst[f] = mem + l->off[f];
    char msg[256];
    msg[0] = '\0';
    uint64_t err_index = b->indices[0];
    uint64_t t0 = busy_begin(l, w, b->indices[0]);
    int rc = l->ds.get_batch(l->ds.user, b->indices, n, dst, wid, msg, sizeof(msg), &err_index);
    rc = busy_end(l, w, t0, rc, msg, sizeof(msg));
    if (rc != STOKE_OK && l->o.on_error != STOKE_ON_ERROR_ERROR && rc != STOKE_ETIMEDOUT) {
        fill_map_samples(l, b, w, wid); /* find the bad samples one by one */
        return;
    }
    if (rc != STOKE_OK) {
        stoke__bad_note(b, err_index, rc, msg);
        batch_failed(b, rc, err_index, msg);
        b->count = 0;
    }
}

/* Writes batch `seq` into b->host; the caller owns b.  Sets b->status and the error fields
 * (ITERABLE: b->end when the worker's share ended). */
void stoke__loader_batch_start(stoke_loader *l, stoke_batch *b, int wid, uint64_t epoch)
{
    if (b->epoch != epoch) /* (the batch's first cache line only is written for every batch) */
        b->epoch = epoch;
    b->count = l->iterable ? l->o.batch_size : batch_count(l, b->seq);
    b->status = STOKE_OK;
    b->worker = wid;
    if (b->copied)
        b->copied = 0;
    if (b->dev_failed)
        b->dev_failed = 0;
    b->end = 0;
    if (b->bad.n)
        b->bad.n = 0;
    b->pinned = b->host->pinned;
}

void stoke__loader_fill_batch(stoke_loader *l, stoke_batch *b, stoke__worker *w, int wid,
                              uint64_t seed, uint64_t epoch, uint64_t seq)
{
    b->seq = seq;
    stoke__loader_batch_start(l, b, wid, epoch);
    if (b->offsets)
        b->offsets[0] = 0;
    if (!l->iterable &&
        batch_indices(l, b, w ? &w->ahead : &l->caller_ahead, seed, epoch, seq) != STOKE_OK) {
        b->bytes = 0;
        return;
    }
    if (!l->iterable && !l->var) {
        if (STOKE_DATASET_HAS(&l->ds, get_batch))
            fill_map_batch(l, b, w, wid);
        else
            fill_map_samples(l, b, w, wid);
        b->bytes = b->count * l->sample_bytes;
        return;
    }
    char msg[256];
    size_t j = 0; /* the slot; pos: the batch position read (they differ after a skip) */
    for (size_t pos = 0; l->iterable ? j < b->count : pos < b->count; pos++) {
        uint64_t idx = l->iterable ? 0 : b->indices[pos];
        int rc = stoke__loader_one_sample(l, b, w, wid, j, &idx, msg, sizeof(msg));
        if (rc == STOKE_EEND && l->iterable) {
            b->end = 1;
            break;
        }
        if (rc != STOKE_OK)
            rc = stoke__bad_sample(l, b, w, wid, j, &idx, rc, msg, sizeof(msg));
        if (rc == STOKE__BAD_SKIPPED)
            continue;
        if (rc != STOKE_OK) {
            batch_failed(b, rc, idx, msg);
            break;
        }
        b->indices[j++] = idx;
    }
    b->count = j;
    b->bytes = l->var ? (size_t)b->offsets[j] : j * l->sample_bytes;
}

/* (mu) Hands a finished batch to the consumer, or recycles it if its epoch was abandoned.  In
 * device mode the staging slot leaves the batch here: it waits in the copy FIFO until its copy's
 * event completes, whatever the consumer does with the batch.  Bumps `events`; the caller
 * signals done_cv (stoke__loader_notify, or once for a group: worker_main). */
static void complete_quiet(stoke_loader *l, stoke_batch *b, uint64_t gen, uint64_t busy_ns)
{
    l->st_busy_ns += busy_ns;
    l->busy_avg = l->busy_avg ? (l->busy_avg * 7 + busy_ns) / 8 : busy_ns;
    l->filling--;
    if (b->gen != gen)
        b->gen = gen;
    atomic_fetch_add_explicit(&l->events, 1, memory_order_release);
    if (l->device_mode && b->host && b->copied) {
        stoke__slot *s = b->host;
        b->host = NULL;
        s->next = NULL;
        if (l->copy_tail)
            l->copy_tail->next = s;
        else
            l->copy_head = s;
        l->copy_tail = s;
    }
    if (gen != l->gen) {
        stoke__loader_recycle(l, b);
        stoke__loader_wake_workers(l, 1);
        return;
    }
    if (l->iterable && b->status == STOKE_OK && b->end) {
        stoke__worker *w = &l->w[b->worker];
        int keep = b->count && !(l->o.drop_last && b->count < l->o.batch_size);
        w->exhausted = 1;
        w->end_at = keep ? b->k + 1 : b->k;
        if (!keep) { /* nothing to deliver: the share ended on a batch boundary or was dropped */
            w->outstanding--;
            l->outstanding--;
            stoke__loader_recycle(l, b);
            stoke__loader_wake_workers(l, 1);
            return;
        }
    }
    stoke_batch **slot = l->ready ? &l->ready[b->seq & l->ready_mask] : NULL;
    if (slot && !*slot) {
        *slot = b;
        return;
    }
    b->next = NULL;
    *l->done_tail = b;
    l->done_tail = &b->next;
}

void stoke__loader_complete(stoke_loader *l, stoke_batch *b, uint64_t gen, uint64_t busy_ns)
{
    complete_quiet(l, b, gen, busy_ns);
    pthread_cond_signal(&l->done_cv); /* also wakes a consumer quiescing for set_epoch */
}

static int can_dispatch(const stoke_loader *l, const stoke__worker *w)
{
    if (l->ended || l->init_failed || !l->nfree || l->quiesce)
        return 0;
    if (l->iterable)
        return !w->exhausted && w->outstanding < l->o.prefetch_factor;
    return l->next_dispatch < l->nbatches && l->outstanding < l->window && w->id < l->nact;
}

/* (mu) Wakes the workers waiting for work when one of them could take some.  Unless `force`,
 * MAP workers are woken only once the reorder window is half empty: a consumer faster than the
 * workers then wakes them once per few batches rather than once per batch (a wake-up costs
 * microseconds, more than a small batch).  The consumer forces it before it sleeps, so no work
 * is ever left waiting with everybody asleep.  Only workers given work (ids below nact) are
 * woken for it: with auto at 0 active, each delivery woke every idle worker to find nothing to
 * do (two system calls and two context switches per batch at batch size 1; 0.6 vs 1.2 M/s).
 * A broadcast marks the sleepers woken: until one sleeps again, the next calls cost no system
 * call (a woken worker that had not run yet was broadcast to again on every release: batch
 * size 1, 2 workers, 50k batches: about 59,000 broadcasts in a run, now about 10). */
void stoke__loader_wake_workers(stoke_loader *l, int force)
{
    atomic_fetch_add_explicit(&l->work_events, 1, memory_order_release);
    if (!l->work_sleepers)
        return;
    if (!force && !l->iterable && l->outstanding > l->window / 2)
        return;
    int any = l->nact >= l->nworkers;
    for (int i = 0; !any && i < l->nact; i++)
        any = l->w[i].sleeping;
    if (any) {
        l->st_work_wakes++;
        for (int i = 0; i < l->nworkers; i++)
            l->w[i].sleeping = 0; /* woken: they wake no sooner for another broadcast */
        l->work_sleepers = 0;
        pthread_cond_broadcast(&l->work_cv);
    }
}

void stoke__loader_notify(stoke_loader *l)
{
    atomic_fetch_add_explicit(&l->events, 1, memory_order_release);
    pthread_cond_signal(&l->done_cv);
}

/* (mu) Takes the next batch for worker w (can_dispatch was true).  May drop `mu` briefly. */
stoke_batch *stoke__loader_dispatch(stoke_loader *l, stoke__worker *w, uint64_t *gen,
                                    uint64_t *seed, uint64_t *epoch)
{
    stoke_batch *b = l->free_v[--l->nfree];
    if (l->iterable) {
        b->k = w->k_next++;
        b->seq = b->k * (uint64_t)l->nw1 + (uint64_t)w->id;
        w->outstanding++;
    } else {
        b->seq = l->next_dispatch++;
    }
    *gen = l->gen;
    *seed = l->seed;
    *epoch = l->epoch;
    l->outstanding++;
    l->filling++;
    if (l->device_mode)
        b->host = stoke__loader_take_slot(l);
    return b;
}

void stoke__loader_look_ahead(stoke_loader *l, stoke__ahead *a, uint64_t seq, uint64_t seed,
                              uint64_t epoch)
{
    if (l->iterable || l->o.batch_size > STOKE_DATASET_PREFETCH_MAX ||
        !STOKE_DATASET_HAS(&l->ds, prefetch) || seq >= l->nbatches)
        return;
    size_t n = batch_count(l, seq);
    const uint64_t *idx = n ? ahead_indices(l, a, seq, n, seed, epoch) : NULL;
    if (idx) /* else fill_batch computes them again and reports what failed */
        l->ds.prefetch(l->ds.user, idx, n);
}

/* Makes a dispatched batch, without `mu` and without a clock read. */
static void make_batch(stoke_loader *l, stoke_batch *b, stoke__worker *w, int wid, uint64_t seed,
                       uint64_t epoch)
{
    if (l->proc)
        stoke__proc_fill(l, b, w, wid, seed, epoch); /* in worker wid's child process */
    else
        stoke__loader_fill_batch(l, b, w, wid, seed, epoch, b->seq);
    if (l->device_mode && b->status == STOKE_OK && b->count)
        stoke__loader_copy_batch(l, b);
}

uint64_t stoke__loader_produce(stoke_loader *l, stoke_batch *b, stoke__worker *w, int wid,
                               uint64_t seed, uint64_t epoch, uint64_t *clock)
{
    uint64_t t0 = *clock;
    make_batch(l, b, w, wid, seed, epoch);
    *clock = stoke__now_ns();
    return *clock - t0;
}

/* A pause for spin loops. */
static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* One turn of a spin loop that waits for another loader thread: a pause, or sched_yield when
 * `crowded` (the loader's threads outnumber the cores it may run on, so the thread waited for
 * may be waiting for this core: a pause would hold it for nothing).  On 2 cores with 2 workers
 * and the consumer, yielding took batch size 1 from about 0.83x to 1.03x of 0 workers (4
 * alternating runs; docs/loader.md, "Hand-off"). */
static inline void spin_turn(int crowded)
{
    if (crowded)
        sched_yield();
    else
        cpu_relax();
}

void stoke__loader_spin(stoke_loader *l, _Atomic uint64_t *counter, uint64_t budget)
{
    uint64_t seen = atomic_load_explicit(counter, memory_order_relaxed);
    int crowded = l->nact + 1 > l->ncpu;
    pthread_mutex_unlock(&l->mu);
    uint64_t t0 = stoke__now_ns();
    for (unsigned i = 1;; i++) {
        spin_turn(crowded);
        if (atomic_load_explicit(counter, memory_order_acquire) != seen)
            break;
        if ((i & 31) == 0 && stoke__now_ns() - t0 > budget)
            break;
    }
    pthread_mutex_lock(&l->mu);
}

/* (mu) Before a worker sleeps for lack of work: when batches take only microseconds and this
 * worker is given work, spins (without `mu`) up to twice a batch's time (at most 20 us) for the
 * consumer to take a batch, so that it does not have to wake the worker.  Returns with `mu`
 * held; the caller must look at the state again before sleeping (a change made after the spin
 * ended and before `mu` was taken again wakes nobody). */
static void spin_for_work(stoke_loader *l, const stoke__worker *w)
{
    uint64_t budget = 2 * l->busy_avg;
    if (budget > 20000u)
        budget = 20000u;
    if (l->iterable || w->id >= l->nact || l->ended || l->quiesce || budget < 200u ||
        l->next_dispatch >= l->nbatches)
        return;
    stoke__loader_spin(l, &l->work_events, budget);
}

/* How many batches a worker thread (or the caller's thread making batches in next()) takes
 * under one hold of `mu`: batches of a few microseconds (batch size 1) are taken and handed
 * back up to CLAIM_MAX at a time, so such a thread takes the lock twice per group rather than
 * twice per batch; about CLAIM_NS of work, at most a quarter of the reorder window per worker
 * given work (the others and the consumer's in-order wait keep their share); a group of 8 or
 * more is made 16, so that the group's run of indices (stoke__ahead) fills the sampler's 16
 * lanes at once instead of the scalar walk.  One at a time for process workers, ITERABLE
 * datasets, device copies and batches over CLAIM_NS / 2.
 * Batch size 1, 50k rows of 3 KB, 2 workers on 2 cores: about 4% more batches per second (4
 * alternating runs: median 0.372 vs 0.360 M/s; auto 0.305 vs 0.289). */
#define CLAIM_MAX 16
#define CLAIM_NS  20000u
static int claim_size(const stoke_loader *l)
{
    if (l->proc || l->iterable || l->device_mode || !l->busy_avg || l->busy_avg >= CLAIM_NS / 2)
        return 1;
    uint64_t n = CLAIM_NS / l->busy_avg;
    if (n >= CLAIM_MAX / 2) /* a whole group: its run of indices fills the sampler's 16 lanes */
        n = CLAIM_MAX;
    uint64_t share = l->window / (4 * (uint64_t)(l->nact > 0 ? l->nact : 1));
    if (n > share)
        n = share;
    if (n > CLAIM_MAX)
        n = CLAIM_MAX;
    return n ? (int)n : 1;
}

/* (mu) The caller's thread may take one more batch for its group (next.c, assist_wanted's
 * conditions less the reason). */
static int consumer_can_dispatch(const stoke_loader *l)
{
    return !l->ended && !l->init_failed && l->nfree && !l->quiesce &&
           l->next_dispatch < l->nbatches && l->outstanding < l->window;
}

/* Makes the n > 1 dispatched batches b[] of a group with one get_scattered call (docs/loader.md,
 * "Hand-off"), their indices taken from the group's run: STOKE_OK, or not (the run or the call
 * failed), and the caller makes them one by one, which reports the failing sample as a batch of
 * its own would and applies on_error.  Only where l->scatter says (no timeout_ms: a timeout
 * names the sample in progress) and the group's samples fit one run. */
static int make_scattered(stoke_loader *l, stoke_batch *const *b, int n, int wid, uint64_t seed,
                          uint64_t epoch, stoke__ahead *a)
{
    const int nf = l->ds.nfields;
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += batch_count(l, b[i]->seq);
    const uint64_t *run =
        total <= STOKE__AHEAD_RUN ? ahead_indices(l, a, b[0]->seq, total, seed, epoch) : NULL;
    if (!run)
        return STOKE_ERANGE;
    void *dst[STOKE__AHEAD_RUN * STOKE_MAX_FIELDS];
    size_t j = 0;
    for (int i = 0; i < n; i++) {
        stoke_batch *x = b[i];
        stoke__loader_batch_start(l, x, wid, epoch);
        unsigned char *mem = x->host->mem;
        memcpy(x->indices, run + j, x->count * sizeof(*run));
        for (size_t s = 0; s < x->count; s++, j++)
            for (int f = 0; f < nf; f++)
                dst[j * (size_t)nf + (size_t)f] = mem + l->off[f] + s * l->fields[f].bytes;
        x->bytes = x->count * l->sample_bytes;
    }
    char msg[256];
    msg[0] = '\0';
    uint64_t err_index = run[0];
    return l->ds.get_scattered(l->ds.user, run, total, dst, wid, msg, sizeof(msg), &err_index);
}

int stoke__loader_make_group(stoke_loader *l, stoke__worker *w)
{
    uint64_t gen, seed, epoch;
    stoke_batch *b[CLAIM_MAX];
    stoke__ahead *a = w ? &w->ahead : &l->caller_ahead;
    int wid = w ? w->id : l->nworkers, want = claim_size(l), n = 0;
    do /* one gen, seed and epoch for all: `mu` is held throughout */
        b[n++] = stoke__loader_dispatch(l, w ? w : &l->w[0], &gen, &seed, &epoch);
    while (n < want && (w ? can_dispatch(l, w) : consumer_can_dispatch(l)));
    pthread_mutex_unlock(&l->mu);
    a->seq_end = b[n - 1]->seq + 1; /* the group's seqs follow each other */
    if (n > 1 && !l->iterable && l->o.batch_size <= STOKE__AHEAD_RUN) /* one run for all */
        (void)ahead_indices(l, a, b[0]->seq, batch_count(l, b[0]->seq), seed, epoch);
    /* the clock is read around the group, not after each batch (a read is about 30 ns here, a
     * tenth of a batch of one 3 KB row): each batch is counted the group's average */
    uint64_t t0 = stoke__now_ns();
    int one_call = n > 1 && l->scatter &&
                   make_scattered(l, b, n, wid, seed, epoch, a) == STOKE_OK;
    for (int i = 0; i < n && !one_call; i++) {
        if (i + 1 < n)
            stoke__loader_look_ahead(l, a, b[i + 1]->seq, seed, epoch);
        make_batch(l, b[i], w, wid, seed, epoch);
    }
    uint64_t took = stoke__now_ns() - t0;
    pthread_mutex_lock(&l->mu);
    for (int i = 0; i < n; i++) /* the last takes the division's remainder */
        complete_quiet(l, b[i], gen, took / (uint64_t)n + (i == n - 1 ? took % (uint64_t)n : 0));
    return n;
}

static void *worker_main(void *arg)
{
    stoke__worker *w = arg;
    stoke_loader *l = w->l;
    char name[16];
    snprintf(name, sizeof(name), "stoke-w%d", w->id);
    stoke__thread_name(name);
    if (l->ds.worker_init && !l->proc) { /* process mode: in the child */
        int rc = l->ds.worker_init(l->ds.user, w->id, l->nworkers);
        if (rc != STOKE_OK) {
            pthread_mutex_lock(&l->mu);
            if (!l->init_failed)
                l->init_failed = rc < 0 ? rc : STOKE_EDATA;
            stoke__loader_notify(l);
            pthread_mutex_unlock(&l->mu);
            stoke__log(STOKE_LOG_DEBUG, "loader: worker_init of worker %d failed (%s)", w->id,
                       stoke_err_name(rc));
            return NULL;
        }
    }
    pthread_mutex_lock(&l->mu);
    for (;;) {
        int spun = 0;
        while (!l->quit && !can_dispatch(l, w)) {
            if (!spun++) { /* then look again: a change may come just after the spin */
                spin_for_work(l, w);
                continue;
            }
            int counted;
            if (stoke__loader_sleep_begin(l, &counted))
                continue;
            l->work_sleepers++;
            w->sleeping = 1;
            pthread_cond_wait(&l->work_cv, &l->mu);
            stoke__loader_sleep_done(l, counted);
            if (w->sleeping) { /* not woken by wake_workers (another broadcast, spurious) */
                w->sleeping = 0;
                l->work_sleepers--;
            }
        }
        if (l->quit)
            break;
        stoke__loader_make_group(l, w);
        /* one wake-up for the group, after `mu` is free: a consumer woken while this thread
         * still holds it would only sleep again on the mutex */
        pthread_mutex_unlock(&l->mu);
        pthread_cond_signal(&l->done_cv);
        pthread_mutex_lock(&l->mu);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Consumer: starts the worker threads if they are not running. */
int stoke__loader_start_workers(stoke_loader *l)
{
    if (l->running || l->nworkers == 0)
        return STOKE_OK;
    l->quit = 0;
    for (int i = 0; i < l->nworkers; i++) {
        stoke__worker *w = &l->w[i];
        atomic_store(&w->busy_since, 0);
        int e = pthread_create(&w->th, NULL, worker_main, w);
        if (e) {
            pthread_mutex_lock(&l->mu);
            l->quit = 1;
            pthread_cond_broadcast(&l->work_cv);
            pthread_mutex_unlock(&l->mu);
            for (int j = 0; j < i; j++)
                pthread_join(l->w[j].th, NULL);
            l->quit = 0;
            return stoke__loader_fail(l, STOKE_ENOMEM, "loader: cannot start worker %d: %s", i,
                                      strerror(e));
        }
    }
    l->running = 1;
    return STOKE_OK;
}

/* Consumer, without `mu`: asks the workers to exit and joins them. */
void stoke__loader_stop_workers(stoke_loader *l)
{
    if (!l->running)
        return;
    pthread_mutex_lock(&l->mu);
    l->quit = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nworkers; i++)
        pthread_join(l->w[i].th, NULL);
    pthread_mutex_lock(&l->mu);
    l->quit = 0;
    l->running = 0;
    l->init_failed = 0;
    pthread_mutex_unlock(&l->mu);
}
