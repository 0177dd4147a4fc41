/* The loader's worker threads and sample production: dispatching batches, filling them from the
 * dataset, and handing them to the done list. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
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

/* Busy marks, only where the plan has them (timeout_ms, process workers): publishes that
 * producer p is in a dataset call for index `idx` (UINT64_MAX: an ITERABLE sample; in_batch:
 * read(), idx its first) since now (stoke__busy); returns the start time.  0 without marks: no
 * clock read, no store. */
static inline uint64_t busy_begin(const stoke_loader *l, stoke__producer *p, uint64_t idx,
                                  int in_batch)
{
    if (!l->plan.marks)
        return 0;
    uint64_t t0 = stoke__now_ns();
    if (p->busy) {
        atomic_store_explicit(&p->busy->index, idx, memory_order_relaxed);
        atomic_store_explicit(&p->busy->in_batch, in_batch, memory_order_relaxed);
        atomic_store_explicit(&p->busy->since, t0, memory_order_release);
    }
    return t0;
}

/* Ends what busy_begin started: clears p's busy mark, or, in the caller's thread (no marks),
 * turns a success that took longer than the timeout into STOKE_ETIMEDOUT (with the message in
 * msg).  Returns the status. */
static inline int busy_end(const stoke_loader *l, stoke__producer *p, uint64_t t0, int rc,
                           char *msg, size_t msg_len)
{
    if (!l->plan.marks)
        return rc;
    if (p->busy) {
        atomic_store_explicit(&p->busy->since, 0, memory_order_release);
    } else if (rc == STOKE_OK && stoke__now_ns() - t0 > (uint64_t)l->o.timeout_ms * 1000000u) {
        rc = STOKE_ETIMEDOUT;
        stoke__fmt(msg, msg_len, "took longer than the timeout of %u ms", l->o.timeout_ms);
    }
    return rc;
}

void stoke__batch_failed(stoke_batch *b, int rc, uint64_t where, const char *msg)
{
    b->status = rc > 0 ? STOKE_EDATA : rc;
    b->err_index = where;
    stoke__strlcpy(b->err_msg, msg[0] ? msg : stoke_strerror(b->status), sizeof(b->err_msg));
    b->count = 0;
    b->bytes = 0;
}

/* The keys of (seed, epoch) for this thread, with the permutation's table where it has one
 * (stoke__sampler_epoch_tabulate), derived again only when they change (a zeroed
 * context names no sampler; the init fails only for a NULL argument, and a fill from a context
 * it did not make is STOKE_EINVAL). */
static const stoke__sampler_epoch *ahead_epoch(const stoke_loader *l, stoke__producer *p)
{
    stoke__ahead *a = &p->ahead;
    stoke__sampler_epoch *ep = &a->ep;
    if (ep->s != l->sampler || ep->seed != p->seed || ep->epoch != p->epoch) {
        a->n = 0; /* the run was of the old keys */
        (void)stoke__sampler_epoch_init(ep, l->sampler, p->seed, p->epoch);
        (void)stoke__sampler_epoch_tabulate(ep, a->tab, STOKE__ARRAY_LEN(a->tab));
    }
    return ep;
}

_Atomic uint64_t stoke__ahead_fills;

/* The indices of batch seq (n samples, at most STOKE__AHEAD_RUN) from this thread's run,
 * filling a new run from its first position when the run does not hold them (see
 * stoke__ahead).  NULL when the sampler refuses: the caller computes them alone and reports the
 * error. */
static const uint64_t *ahead_indices(const stoke_loader *l, stoke__producer *p, uint64_t seq,
                                     size_t n)
{
    uint64_t pos = seq * l->o.batch_size;
    stoke__ahead *a = &p->ahead;
    if (a->n >= n && a->ep.seed == p->seed && a->ep.epoch == p->epoch && pos >= a->pos0 &&
        pos - a->pos0 <= a->n - n) /* (a run is of ep's sampler: ahead_epoch made both) */
        return a->idx + (pos - a->pos0);
    /* a new run, over the batches this thread makes in a row */
    uint64_t end = a->seq_end > seq ? a->seq_end : seq + 1;
    uint64_t last = end < l->nbatches ? end * l->o.batch_size : l->nsamples;
    uint64_t m = last - pos < STOKE__AHEAD_RUN ? last - pos : STOKE__AHEAD_RUN;
    const stoke__sampler_epoch *ep = ahead_epoch(l, p);
    a->n = 0;
    if (m < n || stoke__sampler_fill(l->sampler, ep, pos, (size_t)m, a->idx) != STOKE_OK)
        return NULL;
    a->pos0 = pos;
    a->n = (size_t)m;
    atomic_fetch_add_explicit(&stoke__ahead_fills, 1, memory_order_relaxed);
    return a->idx;
}

/* MAP: the dataset indices of batch b->seq's b->count samples into b->indices, all at
 * once, from this thread's runs (see stoke__ahead) for small batches.  Returns STOKE_OK, or
 * fails the batch when the sampler refuses. */
static int batch_indices(stoke_loader *l, stoke_batch *b, stoke__producer *p)
{
    const uint64_t *run =
        b->count <= STOKE__AHEAD_RUN ? ahead_indices(l, p, b->seq, b->count) : NULL;
    if (run) {
        memcpy(b->indices, run, b->count * sizeof(*run));
        return STOKE_OK;
    }
    const stoke__sampler_epoch *ep = ahead_epoch(l, p);
    uint64_t pos0 = b->seq * l->o.batch_size;
    int rc = stoke__sampler_fill(l->sampler, ep, pos0, b->count, b->indices);
    if (rc != STOKE_OK) /* (never: an epoch's batches lie within the sampler's length) */
        stoke__batch_failed(b, rc, pos0, "sampler position out of range");
    return rc;
}

/* Points dst[f] at slot j of batch b, each field's (a sample's slots; with j 0, the base of the
 * batch's run of slots), and presets the ragged lengths of n samples there, len[k * nfields +
 * f], to max_len (the room). */
static inline void point_slots(const stoke_loader *l, const stoke_batch *b, size_t j, void **dst,
                               int64_t *len, size_t n)
{
    const size_t nf = (size_t)l->ds.nfields;
    unsigned char *mem = b->host->mem;
    for (size_t f = 0; f < nf; f++)
        dst[f] = mem + l->off[f] + j * l->step[f];
    for (int r = 0; r < l->nragged; r++)
        for (size_t k = 0, f = (size_t)l->rg[r]; k < n; k++)
            len[k * nf + f] = l->fields[f].max_len;
}

/* "WHERE: " for the loader's own message about sample idx, as the dataset's messages begin
 * (its describe), or "" without one. */
static const char *where_of(const stoke_loader *l, uint64_t idx, char *buf, size_t n)
{
    buf[0] = '\0';
    int ok = l->ds.describe && l->ds.describe(l->ds.user, idx, buf, n - 2) == STOKE_OK;
    buf[n - 3] = '\0'; /* (a describe that filled buf without a terminator) */
    if (ok && buf[0])
        strcat(buf, ": ");
    else
        buf[0] = '\0';
    return buf;
}

/* Sample idx's ragged lengths (len[f]) into slot j of b: STOKE_OK; a length below 0, or past
 * max_len without truncate, STOKE_ELIMIT / STOKE_EDATA with msg set (a bad sample). */
static int take_lengths(const stoke_loader *l, stoke_batch *b, size_t j, uint64_t idx,
                        const int64_t *len, char *msg, size_t msg_len)
{
    int cut = 0;
    char at[STOKE__MSG_MAX / 2];
    for (int r = 0; r < l->nragged; r++) {
        const stoke_field *fd = &l->fields[l->rg[r]];
        int64_t n = len[l->rg[r]];
        if (n < 0) {
            stoke__fmt(msg, msg_len, "%sfield '%s': the sample reported length %lld",
                       where_of(l, idx, at, sizeof(at)), fd->name, (long long)n);
            return STOKE_EDATA;
        }
        if (n > fd->max_len && !fd->truncate) {
            stoke__fmt(msg, msg_len,
                       "%sfield '%s': %lld units, more than its max_len %lld (set truncate to "
                       "cut such samples)",
                       where_of(l, idx, at, sizeof(at)), fd->name, (long long)n,
                       (long long)fd->max_len);
            return STOKE_ELIMIT;
        }
        cut |= n > fd->max_len;
        stoke__ragged_meta(b, r)[1 + j] = n < fd->max_len ? n : fd->max_len;
    }
    b->truncated += (uint32_t)cut;
    return STOKE_OK;
}

/* Calls the dataset for one sample into slot j of b, with the timeout bookkeeping and the ragged
 * lengths.  MAP: `*idx` is the sample; ITERABLE: *idx receives it.  Returns the status. */
int stoke__loader_one_sample(stoke_loader *l, stoke_batch *b, stoke__producer *p, size_t j,
                             uint64_t *idx, char *msg, size_t msg_len)
{
    stoke__ahead *a = &p->ahead;
    point_slots(l, b, j, a->dst, a->len, 1);
    msg[0] = '\0';
    uint64_t t0 = busy_begin(l, p, l->iterable ? UINT64_MAX : *idx, 0);
    int rc = l->iterable
                 ? l->ds.next(l->ds.user, p->wid, l->nworkers, a->dst, a->len, idx, msg, msg_len)
                 : l->ds.get(l->ds.user, *idx, a->dst, a->len, p->wid, msg, msg_len);
    rc = busy_end(l, p, t0, rc, msg, msg_len);
    if (rc == STOKE_OK && l->nragged)
        rc = take_lengths(l, b, j, *idx, a->len, msg, msg_len);
    return rc;
}

/* MAP and ITERABLE, one dataset call per sample.  A failing sample goes through the bad-sample
 * policy (badsample.c): skipped ones leave no slot (the rest move up), replaced ones change
 * their index.  MAP reads b->indices; ITERABLE fills them, and sets b->end when the worker's
 * share ended.  Sets b->count to the samples written. */
static void fill_samples(stoke_loader *l, stoke_batch *b, stoke__producer *p)
{
    uint64_t *idx = b->indices;
    char msg[STOKE__MSG_MAX];
    size_t out = 0; /* the slot; pos: the batch position read (they differ after a skip) */
    for (size_t pos = 0; l->iterable ? out < b->count : pos < b->count; pos++) {
        /* a batch of an abandoned run stops here (recycled, never delivered) */
        if (stoke__producer_abandoned(p, b)) {
            stoke__batch_failed(b, STOKE_ECANCELED, l->iterable ? UINT64_MAX : idx[pos],
                                "its run was abandoned");
            return;
        }
        uint64_t got = l->iterable ? 0 : idx[pos];
        int rc = stoke__loader_one_sample(l, b, p, out, &got, msg, sizeof(msg));
        if (rc == STOKE_EEND && l->iterable) {
            b->end = 1;
            break;
        }
        if (rc != STOKE_OK)
            rc = stoke__bad_sample(l, b, p, out, &got, rc, msg, sizeof(msg));
        if (rc == STOKE__BAD_SKIPPED)
            continue;
        if (rc != STOKE_OK) {
            stoke__batch_failed(b, rc, got, msg);
            return;
        }
        idx[out++] = got;
    }
    b->count = out;
}

/* MAP datasets with read() (dataset.h): one call for the whole batch (its indices already in
 * b->indices), so the dataset can queue its reads; the busy/timeout bookkeeping is per batch
 * (the busy index is the batch's first sample).  On an error under a policy other than ERROR,
 * the samples are read again one by one (fill_samples), which finds the bad ones. */
static void fill_read(stoke_loader *l, stoke_batch *b, stoke__producer *p)
{
    size_t n = b->count;
    if (!n)
        return;
    stoke__ahead *a = &p->ahead;
    point_slots(l, b, 0, a->dst, a->len, n); /* one run: the batch's slots */
    size_t start[2] = {0, n};
    stoke_slots slots = {1, start, a->dst, l->nragged ? a->len : NULL};
    char msg[STOKE__MSG_MAX];
    msg[0] = '\0';
    uint64_t err_index = b->indices[0];
    uint64_t t0 = busy_begin(l, p, b->indices[0], 1);
    int rc = l->ds.read(l->ds.user, b->indices, n, &slots, p->wid, msg, sizeof(msg), &err_index);
    rc = busy_end(l, p, t0, rc, msg, sizeof(msg));
    const int nf = l->ds.nfields;
    for (size_t j = 0; rc == STOKE_OK && l->nragged && j < n; j++)
        if ((rc = take_lengths(l, b, j, b->indices[j], a->len + j * (size_t)nf, msg,
                               sizeof(msg))) != STOKE_OK)
            err_index = b->indices[j];
    /* (STOKE_ECANCELED: a batch nobody wants, or an interrupt; no sample's fault) */
    if (rc != STOKE_OK && l->o.on_error != STOKE_ON_ERROR_ERROR && rc != STOKE_ETIMEDOUT &&
        rc != STOKE_ECANCELED) {
        b->truncated = 0;      /* counted again, sample by sample */
        fill_samples(l, b, p); /* find the bad samples one by one */
        return;
    }
    if (rc != STOKE_OK) {
        if (rc != STOKE_ECANCELED)
            stoke__bad_note(b, err_index, rc, msg);
        stoke__batch_failed(b, rc, err_index, msg);
    }
}

/* Writes pad_value, converted to dtype, into n elements at p. */
static void fill_pad(unsigned char *p, size_t n, const stoke_field *fd)
{
    unsigned char one[16];
    double v = fd->pad_value;
    size_t is = fd->itemsize;
    memset(one, 0, sizeof(one));
    /* integers through int64 (a negative pad in an unsigned type wraps, as numpy's astype) */
    uint64_t u = (uint64_t)(int64_t)v;
    uint8_t u1 = (uint8_t)u;
    uint16_t u2 = (uint16_t)u;
    uint32_t u4 = (uint32_t)u;
    float x = (float)v;
    switch (fd->dtype) {
    case STOKE_DTYPE_BOOL: one[0] = v != 0.0; break;
    case STOKE_DTYPE_F32:
    case STOKE_DTYPE_C64: memcpy(one, &x, 4); break; /* complex: the real part */
    case STOKE_DTYPE_F64:
    case STOKE_DTYPE_C128: memcpy(one, &v, 8); break;
    case STOKE_DTYPE_F16:
    case STOKE_DTYPE_BF16: { /* bf16: the float's top half; f16: exact for small integers */
        uint32_t w;
        memcpy(&w, &x, 4);
        uint32_t e = (w >> 23) & 0xff, m = w & 0x7fffff, sgn = (w >> 16) & 0x8000;
        u2 = fd->dtype == STOKE_DTYPE_BF16 ? (uint16_t)(w >> 16)
             : e < 113                     ? (uint16_t)sgn
             : e > 142                     ? (uint16_t)(sgn | 0x7c00)
                                           : (uint16_t)(sgn | ((e - 112) << 10) | (m >> 13));
        memcpy(one, &u2, 2);
    } break;
    case STOKE_DTYPE_RAW: /* bytes */
        one[0] = (unsigned char)u;
        n *= is;
        is = 1;
        break;
    default: /* the integers (dtypes are checked at create) */
        memcpy(one, is == 1 ? (void *)&u1 : is == 2 ? (void *)&u2 : is == 4 ? (void *)&u4 : &u, is);
        break;
    }
    int zero = 1;
    for (size_t i = 0; i < is; i++)
        zero &= one[i] == 0;
    if (zero) {
        memset(p, 0, n * is);
        return;
    }
    for (size_t i = 0; i < n; i++)
        memcpy(p + i * is, one, is);
}

/* Collates ragged field r of a full batch (samples at the stride of max_len units): PAD moves
 * them to the stride of L, the batch's longest rounded up to multiple_of (at most max_len),
 * and pads each; PACK moves them end to end and writes the offsets.  Moves only downwards
 * (slot j's new place is at or below its old), in slot order: memmove is enough. */
static size_t collate_ragged(const stoke_loader *l, stoke_batch *b, int r)
{
    const stoke_field *fd = &l->fields[l->rg[r]];
    unsigned char *base = b->host->mem + l->off[l->rg[r]];
    int64_t *aux = stoke__ragged_meta(b, r), *len = aux + 1;
    size_t n = b->count, stride = fd->bytes, unit = stride / (size_t)fd->max_len;
    if (fd->collate == STOKE_COLLATE_PACK) {
        int64_t *offs = aux + 1 + l->cap;
        int64_t at = 0;
        for (size_t j = 0; j < n; j++) {
            offs[j] = at;
            if (len[j] && (size_t)at * unit != j * stride)
                memmove(base + (size_t)at * unit, base + j * stride, (size_t)len[j] * unit);
            at += len[j];
        }
        offs[n] = at;
        aux[0] = at;
        return (size_t)at * unit;
    }
    int64_t longest = 0;
    for (size_t j = 0; j < n; j++)
        longest = len[j] > longest ? len[j] : longest;
    if (fd->multiple_of > 1 && longest % fd->multiple_of)
        longest += fd->multiple_of - longest % fd->multiple_of;
    if (longest > fd->max_len)
        longest = fd->max_len;
    size_t row = (size_t)longest * unit, elems = unit / fd->itemsize;
    for (size_t j = 0; j < n; j++) {
        if (len[j] && j * row != j * stride)
            memmove(base + j * row, base + j * stride, (size_t)len[j] * unit);
        fill_pad(base + j * row + (size_t)len[j] * unit, (size_t)(longest - len[j]) * elems, fd);
    }
    aux[0] = longest;
    return n * row;
}

/* The one point where a batch is full: collates its ragged fields (padding or packing, lengths
 * and offsets), sets b->bytes.  Runs in the producer (a child process for process workers),
 * before any device copy. */
static inline void finish_batch(stoke_loader *l, stoke_batch *b)
{
    if (!l->nragged || b->status != STOKE_OK) {
        b->bytes = b->count * l->sample_bytes;
        return;
    }
    size_t bytes = 0;
    for (int f = 0; f < l->ds.nfields; f++)
        if (l->rix[f] < 0)
            bytes += b->count * l->fields[f].bytes;
    for (int r = 0; r < l->nragged; r++)
        bytes += collate_ragged(l, b, r);
    b->bytes = bytes;
}

void stoke__loader_batch_start(stoke_loader *l, stoke_batch *b, const stoke__producer *p)
{
    if (b->epoch != p->epoch) /* (the batch's first cache line only is written for every batch) */
        b->epoch = p->epoch;
    b->count = l->iterable ? l->o.batch_size : batch_count(l, b->seq);
    b->status = STOKE_OK;
    b->worker = p->wid;
    if (b->copied)
        b->copied = 0;
    if (b->dev_failed)
        b->dev_failed = 0;
    b->end = 0;
    if (b->bad.n)
        b->bad.n = 0;
    if (b->truncated)
        b->truncated = 0;
    if (b->ends_epoch)
        b->ends_epoch = 0;
    b->pinned = b->host->pinned;
}

/* Producer, once batch seq - 1's indices are taken: when batches are small and the dataset has
 * a hint, computes the indices of batch `seq` (the one this thread makes next, within the
 * batches it makes in a row) into its look-ahead and names them to the dataset.  Does nothing
 * otherwise (a process worker's child: it makes one batch per request). */
static void look_ahead(stoke_loader *l, stoke__producer *p, uint64_t seq)
{
    if (!l->plan.hint_next || seq >= p->ahead.seq_end)
        return;
    size_t n = batch_count(l, seq);
    const uint64_t *idx = n ? ahead_indices(l, p, seq, n) : NULL;
    if (idx) { /* else fill_batch computes them again and reports what failed */
        stoke_hint h = {.kind = STOKE_HINT_NEXT, .indices = idx, .count = n};
        l->ds.hint(l->ds.user, &h);
    }
}

/* The batch this thread is making, for stoke_dataset_abandoned: its producer's busy marks (NULL:
 * none is being made, or the caller's thread makes it) and its run. */
typedef struct making_t {
    stoke__busy *marks;
    uint64_t gen;
} making_t;
static _Thread_local making_t making;

int stoke_dataset_abandoned(void)
{
    return making.marks && stoke__run_abandoned(making.marks, making.gen);
}

/* Sets this thread's `making` to run gen by marks (a producer's busy marks), around a dataset
 * call that makes a batch; returns what it was, for making_end (a dataset that runs a loader of
 * its own inside its call). */
static inline making_t making_begin(stoke__busy *marks, uint64_t gen)
{
    making_t outer = making;
    making = (making_t){marks, gen};
    return outer;
}

static inline void making_end(making_t outer)
{
    making = outer;
}

/* The fill pipeline: indices, the dataset's reads (read() for the batch, else get()/next() per
 * sample, bad samples through the policy), then finish_batch.  A batch of an abandoned run is
 * not started (one dispatched just before the abandon, or a group's given up by its read():
 * make_group makes its batches here again), nor continued after a sample (fill_samples). */
void stoke__loader_fill_batch(stoke_loader *l, stoke_batch *b, stoke__producer *p)
{
    stoke__loader_batch_start(l, b, p);
    if (stoke__producer_abandoned(p, b)) {
        stoke__batch_failed(b, STOKE_ECANCELED, UINT64_MAX, "its run was abandoned");
        return;
    }
    if (!l->iterable && batch_indices(l, b, p) != STOKE_OK)
        return;
    look_ahead(l, p, b->seq + 1); /* (after b's indices left the run) */
    making_t outer = making_begin(p->busy, b->gen);
    if (!l->iterable && l->ds.read)
        fill_read(l, b, p);
    else
        fill_samples(l, b, p);
    making_end(outer);
    finish_batch(l, b);
}

/* (mu) Hands a finished batch to the consumer, or recycles it if its epoch was abandoned.  In
 * device mode the staging slot leaves the batch here: it waits in the copy FIFO until its copy's
 * event completes, whatever the consumer does with the batch.  Bumps `events`; the caller
 * signals done_cv (stoke__loader_notify, or once for a group: worker_main). */
static void complete_quiet(stoke_loader *l, stoke_batch *b, uint64_t busy_ns)
{
    STOKE__LOADER_ASSERT_MU(l);
    STOKE__LOADER_ASSERT(l->filling > 0);
    l->st_busy_ns += busy_ns;
    if (b->gen == l->gen) /* (an abandoned run's may have been answered without being made) */
        l->busy_avg = l->busy_avg ? (l->busy_avg * 7 + busy_ns) / 8 : busy_ns;
    l->filling--;
    atomic_fetch_add_explicit(&l->events, 1, memory_order_release);
    if (l->o.device && b->copied)
        stoke__loader_drop_slot(l, b);
    int drop = b->gen != l->gen; /* (dispatch gave it the run's gen) */
    if (!drop && l->iterable) {
        stoke__worker *w = &l->w[b->worker];
        int keep = stoke__loader_iter_keeps(l, b);
        /* a share's last batch that is not delivered but holds bad samples goes to the
         * consumer all the same, which counts them in order (budget, quarantine) and drops it
         * (stoke_loader_next): dropped here, they vanished, the budget unasked */
        int carry =
            b->status == STOKE_OK && b->end && !keep && b->bad.n && b->seq >= l->start_cursor;
        if (b->status == STOKE_OK && b->end) /* its number in the share, past it if taken */
            w->end_at = b->seq / (uint64_t)l->nw1 + (uint64_t)(keep || carry);
        /* nothing to deliver: the share ended on a batch boundary or was dropped, or the batch
         * was delivered before a restored cursor (made again only to skip its samples; one
         * that failed is delivered: its error ends the epoch, see take_done) */
        if (b->status == STOKE_OK && ((b->end && !keep && !carry) || b->seq < l->start_cursor)) {
            w->outstanding--;
            l->outstanding--;
            drop = 1;
        }
    }
    if (drop) {
        stoke__loader_recycle(l, b);
        stoke__loader_wake_workers(l, 1);
        return;
    }
    stoke__batch_move(b, STOKE__B_FILLING, STOKE__B_DONE);
    if (l->ready) { /* (no two seqs in flight share a slot: see `ready`) */
        STOKE__LOADER_ASSERT(!l->ready[b->seq & l->ready_mask]);
        l->ready[b->seq & l->ready_mask] = b;
        return;
    }
    b->next = NULL;
    *l->done_tail = b;
    l->done_tail = &b->next;
}

int stoke__loader_can_dispatch(const stoke_loader *l, const stoke__worker *w)
{
    if (l->ended || l->init_failed || !l->nfree || l->quiesce)
        return 0;
    if (l->iterable)
        return w->end_at == UINT64_MAX && w->outstanding < l->prefetch;
    if (l->next_dispatch >= l->nbatches || l->outstanding >= l->window)
        return 0;
    if (l->o.round_robin) /* batch k is worker k % nact's; never the caller's */
        return w && l->next_dispatch % (uint64_t)l->nact == (uint64_t)w->p.wid;
    return !w || w->p.wid < l->nact;
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
    if (l->proc) /* those waiting on their child, with room for another request */
        stoke__proc_wake(l);
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

/* (mu) Takes the next batch for producer p (it could dispatch).  May drop `mu` briefly. */
static stoke_batch *dispatch(stoke_loader *l, stoke__producer *p)
{
    stoke__worker *w = p->w ? p->w : &l->w[0]; /* ITERABLE: the share it makes (0 workers: one) */
    STOKE__LOADER_ASSERT_MU(l);
    STOKE__LOADER_ASSERT(l->nfree > 0);
    stoke_batch *b = l->free_v[--l->nfree];
    stoke__batch_move(b, STOKE__B_FREE, STOKE__B_FILLING);
    if (b->gen != l->gen) /* its run: the check counts it in `outstanding` while it is current */
        b->gen = l->gen;
    if (l->iterable) {
        b->seq = w->k_next++ * (uint64_t)l->nw1 + (uint64_t)w->p.wid;
        w->outstanding++;
    } else {
        b->seq = l->next_dispatch++;
    }
    p->seed = l->seed;
    p->epoch = l->epoch;
    l->outstanding++;
    l->filling++;
    if (l->o.device) /* drops `mu` when it waits for a copy: make_group counts on 1 */
        stoke__loader_take_slot(l, b);
    return b;
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

void stoke__loader_spin(stoke_loader *l, _Atomic uint64_t *counter)
{
    uint64_t budget = 2 * l->busy_avg < 20000u ? 2 * l->busy_avg : 20000u;
    if (budget < 200u)
        return;
    uint64_t seen = atomic_load_explicit(counter, memory_order_relaxed);
    int crowded = l->nact + 1 > l->ncpu;
    stoke__loader_unlock(l);
    uint64_t t0 = stoke__now_ns();
    for (unsigned i = 1;; i++) {
        /* a pause, or sched_yield when the loader's threads outnumber the cores it may run on
         * (the thread waited for may be waiting for this core: a pause would hold it for
         * nothing).  On 2 cores with 2 workers and the consumer, yielding took batch size 1
         * from about 0.83x to 1.03x of 0 workers (4 alternating runs; docs/loader.md,
         * "Hand-off"). */
        if (crowded)
            sched_yield();
        else
            cpu_relax();
        if (atomic_load_explicit(counter, memory_order_acquire) != seen)
            break;
        if ((i & 31) == 0 && stoke__now_ns() - t0 > budget)
            break;
    }
    stoke__loader_lock(l);
}

/* How many batches a worker thread (or the caller's thread making batches in next()) takes
 * under one hold of `mu`: batches of a few microseconds (batch size 1) are taken and handed
 * back up to CLAIM_MAX at a time, so such a thread takes the lock twice per group rather than
 * twice per batch; about CLAIM_NS of work, at most a quarter of the reorder window per worker
 * given work (the others and the consumer's in-order wait keep their share); a group of 8 or
 * more is made 16, so that the group's indices (stoke__ahead) come from one fill of the sampler
 * rather than a walk per batch.  One at a time where the plan has no `group` (process workers,
 * ITERABLE datasets, device copies) and for batches over CLAIM_NS / 2.
 * Batch size 1, 50k rows of 3 KB, 2 workers on 2 cores: about 4% more batches per second (4
 * alternating runs: median 0.372 vs 0.360 M/s; auto 0.305 vs 0.289). */
#define CLAIM_MAX 16
#define CLAIM_NS  20000u
static int claim_size(const stoke_loader *l)
{
    if (!l->plan.group || !l->busy_avg || l->busy_avg >= CLAIM_NS / 2)
        return 1;
    uint64_t n = CLAIM_NS / l->busy_avg;
    if (n >= CLAIM_MAX / 2) /* a whole group: one fill of the sampler for its indices */
        n = CLAIM_MAX;
    uint64_t share = l->window / (4 * (uint64_t)(l->nact > 0 ? l->nact : 1));
    if (n > share) /* (n is CLAIM_MAX at most already) */
        n = share;
    return n ? (int)n : 1;
}

/* Makes the n > 1 dispatched batches b[] of a group with one read() call (docs/loader.md,
 * "Hand-off"), their indices taken from the group's run: STOKE_OK, or not (the run or the call
 * failed), and the caller makes them one by one, which reports the failing sample as a batch of
 * its own would and applies on_error.  Only where l->plan.scatter says (no timeout_ms: a timeout
 * names the sample in progress) and the group's samples fit one run. */
static int make_scattered(stoke_loader *l, stoke_batch *const *b, int n, stoke__producer *p)
{
    size_t total = 0;
    for (int i = 0; i < n; i++)
        total += batch_count(l, b[i]->seq);
    const uint64_t *run = total <= STOKE__AHEAD_RUN ? ahead_indices(l, p, b[0]->seq, total) : NULL;
    if (!run)
        return STOKE_ERANGE;
    void **base = p->ahead.dst; /* a run per batch: n <= CLAIM_MAX <= STOKE__AHEAD_RUN */
    size_t start[CLAIM_MAX + 1], j = 0;
    for (int i = 0; i < n; i++) {
        stoke_batch *x = b[i];
        stoke__loader_batch_start(l, x, p);
        memcpy(x->indices, run + j, x->count * sizeof(*run));
        point_slots(l, x, 0, base + (size_t)i * (size_t)l->ds.nfields, NULL, 0);
        start[i] = j;
        j += x->count;
        finish_batch(l, x); /* (no ragged field here, plan.scatter: no lengths, no collation) */
    }
    start[n] = j;
    stoke_slots slots = {(size_t)n, start, base, NULL};
    char msg[STOKE__MSG_MAX];
    msg[0] = '\0';
    uint64_t err_index = run[0];
    /* (one run for the group: dispatched under one hold of `mu`) */
    making_t outer = making_begin(p->busy, b[0]->gen);
    int rc = l->ds.read(l->ds.user, run, total, &slots, p->wid, msg, sizeof(msg), &err_index);
    making_end(outer);
    return rc;
}

int stoke__loader_make_group(stoke_loader *l, stoke__producer *p, uint64_t *clock)
{
    stoke_batch *b[CLAIM_MAX];
    stoke__worker *w = p->w;
    int want = claim_size(l), n = 0;
    STOKE__LOADER_ASSERT_MU(l);
    /* `mu` is held throughout the group only because a group in device mode is one batch:
     * dispatch may drop it there (take_slot, waiting for an old copy) */
    STOKE__LOADER_ASSERT(want == 1 || !l->o.device);
    do /* one gen, seed and epoch for all: `mu` is held throughout */
        b[n++] = dispatch(l, p);
    while (n < want && stoke__loader_can_dispatch(l, w)); /* (a group: MAP) */
    stoke__loader_unlock(l);
    /* the batches it makes in a row: the group's (their seqs follow each other), or every one
     * when the caller's thread makes them all (0 workers) */
    p->ahead.seq_end = l->plan.caller_all && !w ? l->nbatches : b[n - 1]->seq + 1;
    /* the clock is read around the group, not after each batch (a read is about 30 ns here, a
     * tenth of a batch of one 3 KB row): each batch is counted the group's average */
    uint64_t t0 = clock && *clock ? *clock : stoke__now_ns();
    int one_call = n > 1 && l->plan.scatter && make_scattered(l, b, n, p) == STOKE_OK;
    STOKE__LOADER_ASSERT(!l->proc); /* (make_piped) */
    for (int i = 0; i < n && !one_call; i++) {
        stoke__loader_fill_batch(l, b[i], p);
        if (l->o.device && b[i]->status == STOKE_OK && b[i]->count)
            stoke__loader_copy_batch(l, b[i]);
    }
    uint64_t t1 = stoke__now_ns(), took = t1 - t0;
    if (clock)
        *clock = t1;
    stoke__loader_lock(l);
    if (n == 1) { /* (no division for the common case) */
        complete_quiet(l, b[0], took);
        return 1;
    }
    for (int i = 0; i < n; i++) /* the last takes the division's remainder */
        complete_quiet(l, b[i], took / (uint64_t)n + (i == n - 1 ? took % (uint64_t)n : 0));
    return n;
}

/* (mu) Process workers: worker w sends its child a request for each batch it may dispatch, up
 * to prefetch_factor in flight, then completes the oldest when its reply came (the child has
 * the next one queued meanwhile, where the window allowed it: it does not wait for this thread
 * between two batches).  While it waits with room for another request, it is `polling`:
 * stoke__proc_wake (from wake_workers: the consumer's, or a worker's whose dispatch made it w's
 * turn) sends it back to dispatch.  Returns the batches completed: 1, or 0 when none was in
 * flight and none could be dispatched. */
static int make_piped(stoke_loader *l, stoke__worker *w)
{
    stoke__producer *p = &w->p;
    for (;;) {
        int sent = 0;
        while (!l->quit && stoke__proc_room(l, p->wid) > 0 && stoke__loader_can_dispatch(l, w)) {
            stoke_batch *b = dispatch(l, p);
            stoke__loader_unlock(l);
            stoke__proc_send(l, b, p); /* in worker p->wid's child process */
            stoke__loader_lock(l);
            sent = 1;
        }
        if (sent && l->o.round_robin) /* the next batch may be a waiting worker's */
            stoke__loader_wake_workers(l, 1);
        if (!stoke__proc_in_flight(l, p->wid))
            return 0;
        w->polling = !l->quit && stoke__proc_room(l, p->wid) > 0;
        int wakeable = w->polling;
        stoke__loader_unlock(l);
        uint64_t took = 0;
        stoke_batch *b = stoke__proc_take(l, p, wakeable, &took);
        stoke__loader_lock(l);
        w->polling = 0;
        if (b) {
            complete_quiet(l, b, took);
            return 1;
        }
    }
}

static void *worker_main(void *arg)
{
    stoke__worker *w = arg;
    stoke_loader *l = w->l;
    char name[16];
    snprintf(name, sizeof(name), "stoke-w%d", w->p.wid);
    stoke__thread_name(name);
    if (l->ds.worker_init && !l->proc) { /* process mode: in the child */
        /* timed as a sample (timeout_ms): the consumer waits for every worker_init before
         * its first batch, and a hung one would hang it */
        uint64_t t0 = busy_begin(l, &w->p, UINT64_MAX, STOKE__BUSY_INIT);
        int rc = l->ds.worker_init(l->ds.user, w->p.wid, l->nworkers);
        char unused[8];
        busy_end(l, &w->p, t0, STOKE_OK, unused, sizeof(unused));
        stoke__loader_lock(l);
        l->inits_pending--;
        if (rc != STOKE_OK && !l->init_failed) {
            l->init_failed = rc < 0 ? rc : STOKE_EDATA;
            l->init_failed_worker = w->p.wid;
        }
        stoke__loader_notify(l);
        if (rc != STOKE_OK) {
            stoke__loader_unlock(l);
            stoke__log(STOKE_LOG_DEBUG, "loader: worker_init of worker %d failed (%s)", w->p.wid,
                       stoke_err_name(rc));
            return NULL;
        }
    } else {
        stoke__loader_lock(l);
    }
    for (;;) {
        int spun = 0;
        while (!l->quit && !stoke__loader_can_dispatch(l, w) &&
               !(l->proc && stoke__proc_in_flight(l, w->p.wid))) {
            if (!spun++) { /* then look again: a change may come just after the spin */
                /* for the consumer to take a batch, when this worker is given work */
                if (!l->iterable && w->p.wid < l->nact && !l->ended && !l->quiesce &&
                    l->next_dispatch < l->nbatches)
                    stoke__loader_spin(l, &l->work_events);
                continue;
            }
            int counted;
            if (stoke__loader_sleep_begin(l, &counted))
                continue;
            l->work_sleepers++;
            w->sleeping = 1;
            stoke__loader_wait(l, &l->work_cv, NULL);
            stoke__loader_sleep_done(l, counted);
            if (w->sleeping) { /* not woken by wake_workers (another broadcast, spurious) */
                w->sleeping = 0;
                l->work_sleepers--;
            }
        }
        if (l->quit && !(l->proc && stoke__proc_in_flight(l, w->p.wid)))
            break; /* (a process worker's requests in flight are completed first) */
        if (l->proc)
            make_piped(l, w);
        else
            stoke__loader_make_group(l, &w->p, NULL);
        /* one wake-up for the group, after `mu` is free: a consumer woken while this thread
         * still holds it would only sleep again on the mutex */
        stoke__loader_unlock(l);
        pthread_cond_signal(&l->done_cv);
        stoke__loader_lock(l);
    }
    stoke__loader_unlock(l);
    return NULL;
}

/* Consumer, without `mu`: asks the workers to exit and joins the first n. */
static void join_workers(stoke_loader *l, int n)
{
    stoke__loader_lock(l);
    l->quit = 1;
    pthread_cond_broadcast(&l->work_cv);
    stoke__loader_unlock(l);
    for (int i = 0; i < n; i++) {
        /* a loader destroyed from inside its own dataset call (a garbage collector running a
         * finalizer on a worker) would free the slot this thread is filling: stop here instead */
        if (pthread_equal(l->w[i].th, pthread_self())) {
            fprintf(stderr, "stoke: loader destroyed on its own worker thread %d; aborting\n", i);
            abort();
        }
        pthread_join(l->w[i].th, NULL);
    }
    stoke__loader_lock(l);
    l->quit = 0;
    l->running = 0;
    l->init_failed = 0;
    stoke__loader_unlock(l);
}

/* Consumer: starts the worker threads if they are not running; with 0 workers, calls the
 * dataset's worker_init in the caller's thread (which makes every batch) instead. */
int stoke__loader_start_workers(stoke_loader *l)
{
    if (l->running)
        return STOKE_OK;
    int rc = l->nworkers || !l->ds.worker_init ? STOKE_OK : l->ds.worker_init(l->ds.user, 0, 0);
    if (rc != STOKE_OK)
        return stoke__loader_fail(l, rc < 0 ? rc : STOKE_EDATA, "loader: worker_init failed (%s)",
                                  stoke_err_name(rc));
    /* worker threads run worker_init (process workers: their child); no thread runs yet,
     * none reads it before its pthread_create */
    int inits = l->ds.worker_init && !l->proc;
    l->inits_pending = inits ? l->nworkers : 0;
    for (int i = 0; i < l->nworkers; i++) {
        stoke__worker *w = &l->w[i];
        atomic_store(&w->p.busy->since, 0);
        int e = pthread_create(&w->th, NULL, worker_main, w);
        if (e) {
            stoke__loader_lock(l); /* (the started ones count theirs down meanwhile) */
            l->inits_pending -= inits ? l->nworkers - i : 0;
            stoke__loader_unlock(l);
            join_workers(l, i);
            return stoke__loader_fail(l, STOKE_ENOMEM, "loader: cannot start worker %d: %s", i,
                                      strerror(e));
        }
    }
    l->running = 1;
    return STOKE_OK;
}

void stoke__loader_stop_workers(stoke_loader *l)
{
    if (l->running)
        join_workers(l, l->nworkers);
}
