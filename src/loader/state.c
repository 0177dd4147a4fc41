/* The loader's position: abandoning a run, epochs, save/restore, and the statistics and other
 * queries of a loader. */
#include <inttypes.h>
#include <pthread.h>
#include <string.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/loader.h"

/* (mu) Abandons the current run: every batch not yet delivered goes back to the pools. */
void stoke__loader_abandon(stoke_loader *l)
{
    STOKE__LOADER_ASSERT_MU(l);
    stoke__loader_reclaim(l);
    l->gen++;
    /* into every worker's busy marks (a process worker's are its child's, shared): a batch of
     * the old run stops between two samples, and a child answers the requests of the old run
     * it has not started without making them.  The marks, not a field of the loader: each
     * producer reads its own line between samples, which nothing else writes per sample. */
    for (int i = 0; l->w && i < l->nw1; i++)
        if (l->w[i].p.busy)
            atomic_store_explicit(&l->w[i].p.busy->gen, l->gen, memory_order_relaxed);
    while (l->done) {
        stoke_batch *b = l->done;
        l->done = b->next;
        stoke__loader_recycle(l, b);
    }
    l->done_tail = &l->done;
    for (uint64_t i = 0; l->ready && i <= l->ready_mask; i++) {
        if (l->ready[i])
            stoke__loader_recycle(l, l->ready[i]);
        l->ready[i] = NULL;
    }
    l->outstanding = 0;
    for (int i = 0; l->iterable && l->w && i < l->nw1; i++) /* w: NULL if create failed */
        l->w[i].outstanding = 0;
    pthread_cond_broadcast(&l->work_cv);
}

/* (mu) Moves to (epoch, cursor). */
void stoke__loader_set_position(stoke_loader *l, uint64_t epoch, uint64_t cursor)
{
    stoke__loader_abandon(l);
    l->epoch = epoch;
    l->start_cursor = cursor;
    l->next_dispatch = cursor;
    l->prefix = cursor;
    l->ndelivered = 0;
    l->ended = 0;
    l->overran = 0;
    for (int i = 0; l->iterable && i < l->nw1; i++) {
        l->w[i].k_next = 0;
        l->w[i].end_at = UINT64_MAX;
    }
    if (l->bits)
        memset(l->bits, 0, (size_t)((l->nbatches + 7) / 8));
}

/* Consumer: moves to (seed, epoch, cursor); the dataset's set_epoch is told (an ITERABLE one
 * restarts there). */
static int reposition(stoke_loader *l, const char *call, uint64_t seed, uint64_t epoch,
                      uint64_t cursor)
{
    if (stoke__loader_foreign(l))
        return stoke__loader_forked_fail(l);
    if (l->stopped)
        return stoke__loader_stopped_fail(l, call);
    /* stop dispatching, abandon the run, wait until no batch is being produced: nothing calls
     * the dataset */
    stoke__loader_lock(l);
    l->quiesce = 1;
    stoke__loader_abandon(l);
    while (l->filling > 0)
        stoke__loader_wait(l, &l->done_cv, NULL);
    stoke__loader_unlock(l);
    /* after stoke_loader_interrupt (the caller is ending: the Python exit hook, for a loader
     * whose batches are still alive) persistent workers are joined too: a thread still
     * starting, whose worker_init then fails at once (the interpreter is exiting), would
     * otherwise end on its own and never be joined (a leak ThreadSanitizer reports at exit) */
    if (!l->o.persistent_workers || atomic_load(&l->interrupted) == 2)
        stoke__loader_stop_workers(l);
    l->err[0] = '\0';
    int rc = stoke__loader_dataset_epoch(l, epoch);
    stoke__loader_lock(l);
    l->seed = seed;
    stoke__loader_set_position(l, epoch, cursor);
    l->quiesce = 0;
    pthread_cond_broadcast(&l->work_cv);
    stoke__loader_unlock(l);
    return rc;
}

/* Tells the dataset's set_epoch, if any: STOKE_OK, or its failure (l->err says so). */
int stoke__loader_dataset_epoch(stoke_loader *l, uint64_t epoch)
{
    int rc = l->ds.set_epoch ? l->ds.set_epoch(l->ds.user, epoch) : STOKE_OK;
    if (rc == STOKE_OK)
        return STOKE_OK;
    rc = rc < 0 ? rc : STOKE_EDATA;
    return stoke__loader_fail(l, rc, "loader: set_epoch(%" PRIu64 ") of dataset %s failed (%s)",
                              epoch, l->ds.name, stoke_err_name(rc));
}

/* The seed and the epoch change only in the consumer's calls (reposition), under `mu`: the
 * consumer reads them without it. */
int stoke_loader_set_epoch(stoke_loader *l, uint64_t epoch)
{
    return l ? reposition(l, "stoke_loader_set_epoch", l->seed, epoch, 0)
             : stoke__fail(STOKE_EINVAL, "stoke_loader_set_epoch: NULL loader");
}

int stoke_loader_next_epoch(stoke_loader *l)
{
    return l ? reposition(l, "stoke_loader_next_epoch", l->seed, l->epoch + 1, 0)
             : stoke__fail(STOKE_EINVAL, "stoke_loader_next_epoch: NULL loader");
}

uint64_t stoke_loader_epoch(const stoke_loader *l)
{
    if (!l)
        return 0;
    stoke_loader *m = (stoke_loader *)l; /* under `mu`: Python's `epoch` reads it from any thread */
    stoke__loader_lock(m);
    uint64_t e = m->epoch;
    stoke__loader_unlock(m);
    return e;
}

uint64_t stoke_loader_num_batches(const stoke_loader *l)
{
    return l ? l->nbatches : 0;
}

int stoke_loader_save_state(const stoke_loader *l, stoke_loader_state *out)
{
    if (!l || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_save_state: NULL argument");
    memset(out, 0, sizeof(*out));
    if (l->iterable && !l->o.in_order && l->ndelivered)
        return stoke__fail(STOKE_ENOTSUP, "loader: an iterable dataset's position mid-epoch is "
                                          "restorable with in_order only");
    if (stoke__loader_foreign(l))
        return stoke__loader_forked_fail((stoke_loader *)l);
    out->version = STOKE_LOADER_STATE_VERSION;
    out->workers = l->iterable ? (uint32_t)l->nworkers + 1 : 0; /* (fixed after create) */
    out->seed = l->seed; /* all three change only in the consumer's calls: read without `mu` */
    out->epoch = l->epoch;
    out->cursor = l->prefix;
    return STOKE_OK;
}

int stoke_loader_restore_state(stoke_loader *l, const stoke_loader_state *st)
{
    if (!l || !st)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_restore_state: NULL argument");
    if (st->version != STOKE_LOADER_STATE_VERSION)
        return stoke__loader_fail(l, STOKE_EINVAL, "loader state: version %u, expected %u",
                                  st->version, STOKE_LOADER_STATE_VERSION);
    if (l->iterable && st->workers != (uint32_t)l->nworkers + 1)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader state: saved by a loader with %d workers over %s, this "
                                  "one has %d (an iterable dataset's split depends on them)",
                                  (int)st->workers - 1, l->ds.name, l->nworkers);
    if (!l->iterable && st->cursor > l->nbatches)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader state: cursor %" PRIu64 " is past the %" PRIu64
                                  " batches of an epoch",
                                  st->cursor, l->nbatches);
    return reposition(l, "stoke_loader_restore_state", st->seed, st->epoch, st->cursor);
}

int stoke_loader_get_stats(const stoke_loader *l, stoke_loader_stats *out)
{
    if (!l || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_get_stats: NULL argument");
    if (out->size == 0)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_get_stats: out->size is 0 (set it to "
                                         "sizeof(stoke_loader_stats))");
    stoke_loader *m = (stoke_loader *)l;
    if (stoke__loader_foreign(l)) /* before mu: a fork's copy may hold it locked */
        return stoke__loader_forked_fail(m);
    stoke__loader_lock(m);
    stoke_loader_stats s = m->st; /* the counts (size: the caller's, below); the rest here */
    s.pageable_batches = s.batches - s.pinned_batches; /* every delivered batch is one of two */
    s.device_copies = m->o.device ? s.batches : 0;     /* device mode copies every batch */
    s.device_bytes = m->o.device ? s.bytes : 0;
    s.wait_s = (double)m->st_wait_ns / 1e9;
    s.wait_p50_s = (double)stoke__hist_quantile(&m->wait_hist, 0.50) / 1e9;
    s.wait_p99_s = (double)stoke__hist_quantile(&m->wait_hist, 0.99) / 1e9;
    s.worker_busy_s = (double)m->st_busy_ns / 1e9;
    s.workers = (uint64_t)m->nworkers;
    s.workers_auto = m->o.num_workers == STOKE_LOADER_WORKERS_AUTO;
    s.workers_active = (uint64_t)m->nact;
    s.workers_active_min = (uint64_t)m->autotune.lo;
    s.workers_active_max = (uint64_t)m->autotune.hi;
    s.workers_changes = m->autotune.changes;
    s.quarantined = m->nquar;
    stoke__loader_unlock(m);
    s.buffers = (uint64_t)l->nbuf;
    s.buffer_bytes = l->buf_bytes;
    s.size = out->size; /* the caller's, and as much of s as it has room for */
    memcpy(out, &s, out->size < sizeof(s) ? out->size : sizeof(s));
    return STOKE_OK;
}

const char *stoke_loader_last_error(const stoke_loader *l)
{
    return l ? l->err : "";
}

const char *stoke_loader_pinned_backend(const stoke_loader *l)
{
    return l && l->pin_backend[0] && l->slots && (l->slots[0].pinned || l->pin_lazy)
               ? l->pin_backend
               : NULL;
}
