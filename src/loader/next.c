/* The consumer side of the loader: stoke_loader_next, the reorder stage (in order or as
 * completed), errors and the timeout, and the hand-off (the caller's thread making a batch
 * itself, spinning before sleeping; docs/loader.md, "Hand-off").  The hill climb of num_workers
 * = auto is autotune.c's; the locking rules are in loader_internal.h. */
#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/loader.h"

/* ---- the consumer ------------------------------------------------------------------------- */

/* (mu) Counts batch b (taken from the done list) as consumed: the cursor moves past it. */
static void consumed(stoke_loader *l, const stoke_batch *b)
{
    l->outstanding--;
    l->ndelivered++;
    if (l->iterable)
        l->w[b->worker].outstanding--;
    if (l->o.in_order) {
        l->prefix = b->seq + 1;
    } else if (l->bits) {
        l->bits[b->seq / 8] |= (unsigned char)(1u << (b->seq % 8));
        while (l->prefix < l->nbatches && (l->bits[l->prefix / 8] >> (l->prefix % 8)) & 1u)
            l->prefix++;
    }
}

/* (mu) Records a delivered batch. */
static void delivered(stoke_loader *l, stoke_batch *b)
{
    STOKE__LOADER_ASSERT_MU(l);
    stoke__batch_move(b, STOKE__B_DONE, STOKE__B_HELD);
    if (!STOKE__TEST_BROKEN()) /* tests/test_lifecycle.c breaks this one */
        l->held++;
    consumed(l, b);
    l->st.batches++;
    l->st.samples += b->count;
    l->st.truncated_samples += b->truncated;
    l->st.bytes += b->bytes;
    l->st.pinned_batches += b->pinned; /* (pageable and device counts: get_stats) */
    stoke__loader_wake_workers(l, 0);
}

/* (mu) 1 when the current epoch has nothing more to deliver. */
static int epoch_over(const stoke_loader *l)
{
    if (l->ended)
        return 1;
    if (!l->iterable)
        return l->ndelivered >= l->nbatches - l->start_cursor;
    for (int i = 0; i < l->nw1; i++)
        if (l->w[i].end_at == UINT64_MAX)
            return 0;
    return l->outstanding == 0;
}

/* (mu) The batch the consumer may take now, removed from the done list, or NULL. */
static stoke_batch *take_done(stoke_loader *l)
{
    /* ITERABLE in order: skip the seqs of workers whose share ended before them. */
    while (l->iterable && l->o.in_order && !epoch_over(l)) {
        const stoke__worker *w = &l->w[l->prefix % (uint64_t)l->nw1];
        if (l->prefix / (uint64_t)l->nw1 < w->end_at)
            break;
        l->prefix++;
    }
    if (l->ready) { /* MAP in order: batch prefix, if it came */
        stoke_batch **slot = &l->ready[l->prefix & l->ready_mask], *b = *slot;
        STOKE__LOADER_ASSERT(!b || b->seq == l->prefix);
        *slot = NULL;
        return b;
    }
    for (stoke_batch **pp = &l->done; *pp; pp = &(*pp)->next) {
        stoke_batch *b = *pp;
        if (l->o.in_order && b->seq != l->prefix && b->seq >= l->start_cursor)
            continue; /* (below start_cursor: an ITERABLE batch skipped after a restore failed) */
        *pp = b->next;
        if (l->done_tail == &b->next)
            l->done_tail = pp;
        return b; /* (its next: written again before it is read, by release or complete) */
    }
    return NULL;
}

/* 1 if msg names "sample IDX" (not a longer number), as the sources' own messages do. */
static int names_sample(const char *msg, uint64_t idx)
{
    char want[40];
    int n = snprintf(want, sizeof(want), "sample %" PRIu64, idx);
    for (const char *p = msg; (p = strstr(p, want)) != NULL; p += n)
        if (!isdigit((unsigned char)p[n]))
            return 1;
    return 0;
}

/* 1 if msg names the dataset: its name, or what follows the source's "kind:" (a path). */
static int names_dataset(const char *msg, const char *name)
{
    const char *colon = strchr(name, ':');
    const char *what = colon && colon[1] ? colon + 1 : name;
    return *what && strstr(msg, what) != NULL;
}

/* (mu) Ends the run on failure rc (l->err says why): abandons it; returns rc. */
static int end_failed(stoke_loader *l, int rc)
{
    stoke__loader_abandon(l);
    l->ended = 1;
    return rc;
}

/* (mu) Returns the error of batch b (recycled): the worker, the sample and the dataset, each
 * named once.  It ends the epoch, unless opts.errors_go_on lets a MAP epoch go on past b. */
static int batch_error(stoke_loader *l, stoke_batch *b)
{
    int rc = b->status;
    const char *who = l->nworkers && b->worker == l->nworkers ? " (the caller's thread)" : "";
    char ctx[sizeof(l->ds.name) + 64] = ""; /* what the message does not name */
    char at[STOKE__MSG_MAX / 2] = "", merged[STOKE__MSG_MAX + sizeof(at)];
    const char *msg = b->err_msg;
    /* An ITERABLE dataset's index is its own (tar's mode=stream packs the shard and the
     * position into it): with describe, the sample is said by where it is instead */
    int own = l->iterable && l->ds.describe && b->err_index != UINT64_MAX &&
              l->ds.describe(l->ds.user, b->err_index, at, sizeof(at) - 1) == STOKE_OK;
    at[sizeof(at) - 2] = '\0'; /* (buf[n - 1] of describe's n, as where_of) */
    own = own && at[0];
    if (own && !strstr(msg, at)) {
        /* "FILE: PLACE" and a message "FILE: why": "FILE: PLACE: why", FILE said once */
        const char *c = strstr(at, ": ");
        size_t k = c ? (size_t)(c - at) : 0;
        if (k && strncmp(msg, at, k) == 0 && strncmp(msg + k, ": ", 2) == 0)
            stoke__fmt_short(merged, sizeof(merged), "%s: %s", at, msg + k + 2);
        else
            stoke__fmt_short(merged, sizeof(merged), "%s: %s", at, msg);
        msg = merged;
    }
    /* (UINT64_MAX: no sample's, as a worker_init's or a set_epoch's) */
    if (!own && b->err_index != UINT64_MAX && !names_sample(msg, b->err_index))
        stoke__fmt(ctx, sizeof(ctx), "sample %" PRIu64 " of %s: ", b->err_index, l->ds.name);
    else if (!names_dataset(msg, l->ds.name))
        stoke__fmt(ctx, sizeof(ctx), "%s: ", l->ds.name);
    stoke__loader_fail(l, rc, "worker %d%s: %s%s (%s)", b->worker, who, ctx, msg,
                       stoke_err_name(rc));
    /* (not past the on_error budget, whose error is the end the caller asked for; not an
     * interrupt's or a timeout's: no sample's fault, the batch is not lost for them) */
    if (l->o.errors_go_on && !l->iterable && l->o.on_error == STOKE_ON_ERROR_ERROR &&
        rc != STOKE_ECANCELED && rc != STOKE_ETIMEDOUT && !b->ends_epoch) {
        consumed(l, b);
        stoke__loader_recycle(l, b);
        stoke__loader_wake_workers(l, 0);
        return rc;
    }
    stoke__loader_recycle(l, b);
    l->outstanding--;
    return end_failed(l, rc);
}

/* (mu) The status that stops the wait for a batch, or STOKE_OK to keep waiting. */
static int wait_status(stoke_loader *l)
{
    if (l->ended)
        return STOKE_EEND;
    if (l->init_failed)
        return end_failed(l, stoke__loader_fail(l, l->init_failed,
                                                "loader: worker %d: the worker_init of dataset "
                                                "%s failed (%s)",
                                                l->init_failed_worker, l->ds.name,
                                                stoke_err_name(l->init_failed)));
    return STOKE_OK;
}

/* (mu) Workers: waits for a completion (with opts.interrupted, at most 100 ms, then asks it), or
 * fails the epoch when a sample passed the timeout.  Returns STOKE_OK after a wake-up,
 * STOKE_ETIMEDOUT, STOKE_ECANCELED (interrupted). */
static int wait_done(stoke_loader *l)
{
    uint64_t lim = (uint64_t)l->o.timeout_ms * 1000000u, now = stoke__now_ns();
    uint64_t deadline = lim ? now + lim : 0; /* 0: none */
    int w = -1; /* a worker whose sample has run longer than the timeout */
    for (int i = 0; lim && w < 0 && i < l->nworkers; i++) {
        uint64_t t = atomic_load(&l->w[i].p.busy->since);
        if (t && now > t && now - t > lim)
            w = i;
        else if (t && t + lim + 1000000u < deadline)
            deadline = t + lim + 1000000u;
    }
    if (w >= 0) {
        char what[48] = "its next sample";
        uint64_t idx = atomic_load(&l->w[w].p.busy->index);
        if (atomic_load(&l->w[w].p.busy->in_batch) == STOKE__BUSY_INIT)
            stoke__fmt(what, sizeof(what), "its worker_init");
        else if (!l->iterable)
            stoke__fmt(what, sizeof(what), "sample %" PRIu64, idx);
        l->overran = 1;
        return end_failed(l, stoke__loader_fail(l, STOKE_ETIMEDOUT,
                                                "worker %d: %s of %s took longer than the timeout "
                                                "of %u ms (STOKE_ETIMEDOUT)",
                                                w, what, l->ds.name, l->o.timeout_ms));
    }
    if (l->o.interrupted && (!deadline || deadline > now + 100000000u))
        deadline = now + 100000000u; /* a slice, then the consumer's own check */
    struct timespec ts = {(time_t)(deadline / 1000000000u), (long)(deadline % 1000000000u)};
    stoke__loader_wait(l, &l->done_cv, deadline ? &ts : NULL);
    if (!l->o.interrupted)
        return STOKE_OK;
    stoke__loader_unlock(l);
    int stop = l->o.interrupted(l->o.interrupted_user);
    stoke__loader_lock(l);
    int none = 0;
    if (stop) /* (stoke_loader_interrupt's 2 stays) */
        atomic_compare_exchange_strong(&l->interrupted, &none, 1);
    return stop ? STOKE_ECANCELED : STOKE_OK;
}

#define STOKE__ASSIST_INTERRUPTIBLE_NS 50000000u

/* (mu) 1 with 0 workers: the caller's thread makes every batch (the wait loop saw that the epoch
 * goes on and a batch is free).  With workers, MAP: 1 when the caller's thread should make a
 * batch itself rather than wait: the batch it needs next is not being made by anybody (in order:
 * the next batch to deliver has not been handed out; out of order: no batch is being made at all),
 * so waiting would cost a worker's wake-up and the whole batch.  2 ("help") when a worker is making
 * the batch it needs: it makes the next batch not handed out yet (within the reorder window)
 * instead of spinning or sleeping, so a consumer starved for data adds its own core to the
 * workers'.  It may take the batch it waited for up to one batch (a group of tiny ones, see assist)
 * later than a sleeper would have; a consumer that is not starved never waits, so never helps.  Not
 * with a timeout (timeout_ms): the consumer stays free to watch the workers' samples.  3 KB rows,
 * batch 256, 2 workers on 2 cores, 6 alternating runs: median 2.8 -> 3.85 M samples/s.  Batches
 * under 20 us were first left to the consumer's spin: on 2 cores that spin is a sched_yield loop
 * beside two busy workers, and helping instead took batch size 1 with 1 worker from 1.36 to 2.67
 * M/s, with 2 from 2.1 to 2.6, batch 4 with 2 workers from 2.2 to 3.9, batch 16 from 3.6 to 5.1 (3
 * KB rows, medians of 3 alternating runs; batch 64 the same).  Such batches are made with worker id
 * nworkers. */
static int assist_wanted(const stoke_loader *l)
{
    if (l->plan.caller_all)
        return 1;
    if (!l->plan.assist || !stoke__loader_can_dispatch(l, NULL))
        return 0;
    /* A batch the caller's thread makes puts off opts.interrupted's next call by its time: with
     * the hook, not once batches take 50 ms on average (its call every 100 ms holds). */
    if (l->o.interrupted && l->busy_avg >= STOKE__ASSIST_INTERRUPTIBLE_NS)
        return 0;
    if (l->o.in_order ? l->next_dispatch == l->prefix : l->filling == 0)
        return 1;
    /* no help under a timeout: the consumer stays free to see a worker's sample overrun it */
    return l->plan.help ? 2 : 0;
}

/* Waits for the next deliverable batch, or makes it in the caller's thread (every batch with 0
 * workers).  Returns STOKE_OK with `mu` held and *bp taken from the done list, or a status
 * (EEND, an error) without `mu`.  *t0: 0 on entry; set to the time the wait began when the
 * batch was not there at once (a batch that was ready costs no clock read).  *made: the time
 * the caller's thread finished making a batch, when nothing happened after it (the delivery's
 * time without a clock read), else 0. */
static int next_batch(stoke_loader *l, stoke_batch **bp, uint64_t *t0, uint64_t *made)
{
    stoke__loader_lock(l);
    int rc;
    if (!l->running && !l->ended) { /* (the caller's own state) starting them is waited for */
        stoke__loader_unlock(l);
        *t0 = l->nworkers ? stoke__now_ns() : 0; /* (worker_init is not a batch's time) */
        if ((rc = stoke__loader_start_workers(l)) != STOKE_OK)
            return rc;
        stoke__loader_lock(l);
    }
    stoke__loader_reclaim(l);
    int spun = 0;
    while ((rc = wait_status(l)) == STOKE_OK) {
        if (l->inits_pending) {
            /* no batch before every worker thread's worker_init has returned: one that fails
             * ends the epoch before its first batch, whichever worker's it is (a batch
             * another worker made meanwhile was not delivered alone, nor an epoch's END) */
            if ((rc = wait_done(l)) != STOKE_OK)
                break;
            continue;
        }
        /* (with 0 workers a batch is done only just after the caller's thread made it, below) */
        if (!l->plan.caller_all && (*bp = take_done(l)) != NULL)
            return STOKE_OK;
        if (!*t0)
            *t0 = *made = stoke__now_ns();
        if (epoch_over(l)) {
            l->ended = 1;
            rc = STOKE_EEND;
            break;
        }
        if (l->held >= l->nbuf || (!l->nfree && l->filling == 0)) {
            if (stoke__loader_reclaim(l))
                continue;
            rc = stoke__loader_fail(l, STOKE_ELIMIT,
                                    "loader: all %d batch buffers are held by the caller; release "
                                    "batches",
                                    l->nbuf);
            break;
        }
        int why = assist_wanted(l);
        if (why) { /* a group when batches are tiny, as a worker takes (make_group) */
            int n = stoke__loader_make_group(l, &l->caller, made);
            l->st.assisted_batches += l->plan.caller_all ? 0 : (uint64_t)n;
            l->st_helped += why == 2 ? (uint64_t)n : 0;
            if (l->plan.caller_all && (*bp = take_done(l)) != NULL)
                return STOKE_OK; /* (none: an ITERABLE share ended on a batch boundary) */
            spun = 0;
            continue;
        }
        *made = 0;   /* a spin or a wait: the time is read again */
        if (!spun) { /* then look again: the spin may have missed a change made under mu */
            spun = 1;
            if (l->filling) /* while a batch is being made */
                stoke__loader_spin(l, &l->events);
            continue;
        }
        stoke__loader_wake_workers(l, 1); /* nobody may sleep while work waits */
        int counted;
        if (stoke__loader_sleep_begin(l, &counted))
            continue;
        rc = wait_done(l);
        stoke__loader_sleep_done(l, counted);
        if (rc != STOKE_OK)
            break;
        spun = 0;
    }
    int overran = l->overran;
    stoke__loader_unlock(l);
    /* (not after a timeout: a later call returns EEND at once, as loader.h says) */
    if (rc == STOKE_EEND && !l->o.persistent_workers && !overran)
        stoke__loader_stop_workers(l);
    return rc;
}

int stoke_loader_next(stoke_loader *l, stoke_batch **out)
{
    if (out)
        *out = NULL; /* (on every error, as loader.h says: a NULL loader's too) */
    if (!l || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_next: NULL argument");
    if (stoke__loader_foreign(l))
        return stoke__loader_forked_fail(l);
    if (l->stopped)
        return stoke__loader_stopped_fail(l, "stoke_loader_next");
    /* the wait: from the moment the batch was not there (a ready batch costs no clock read) to
     * its delivery, or to the end of the caller's thread's making it */
    uint64_t t0 = 0, made = 0;
    stoke_batch *b = NULL;
    int rc;
    for (;;) {
        if ((rc = next_batch(l, &b, &t0, &made)) != STOKE_OK)
            return rc;
        /* (mu) held, b taken from the done list */
        stoke__bad_account(l, b); /* the quarantine; may fail b (past the budget) */
        if (b->status != STOKE_OK || !l->iterable || !b->end || stoke__loader_iter_keeps(l, b))
            break;
        /* a share's last batch that only brought its bad samples (complete_quiet): counted,
         * not delivered */
        consumed(l, b);
        stoke__loader_recycle(l, b);
        stoke__loader_wake_workers(l, 0);
        stoke__loader_unlock(l);
    }
    if (b->status != STOKE_OK) {
        rc = batch_error(l, b);
        stoke__loader_unlock(l);
        return rc;
    }
    delivered(l, b);
    if (atomic_load_explicit(&l->interrupted, memory_order_relaxed)) /* (no store a batch) */
        atomic_store_explicit(&l->interrupted, 0, memory_order_relaxed);
    uint64_t now = made ? made : t0 ? stoke__now_ns() : 0;
    uint64_t waited = t0 ? now - t0 : 0;
    l->st_wait_ns += waited;
    stoke__hist_add(&l->wait_hist, waited);
    if (l->o.num_workers == STOKE_LOADER_WORKERS_AUTO && !l->iterable)
        stoke__autotune_delivered(l, now, waited);
    stoke__loader_unlock(l);
    *out = b;
    return STOKE_OK;
}
