/* The batch handle: accessors, device reads, and release. */
#include <inttypes.h>
#include <pthread.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/loader.h"

/* ---- batches ------------------------------------------------------------------------------ */

size_t stoke_batch_count(const stoke_batch *b)
{
    return b ? b->count : 0;
}

const uint64_t *stoke_batch_indices(const stoke_batch *b)
{
    return b ? b->indices : NULL;
}

uint64_t stoke_batch_seq(const stoke_batch *b)
{
    return b ? b->seq : 0;
}

uint64_t stoke_batch_epoch(const stoke_batch *b)
{
    return b ? b->epoch : 0;
}

int stoke_batch_num_fields(const stoke_batch *b)
{
    return b ? b->l->ds.nfields : 0;
}

static int field_ok(const stoke_batch *b, int f)
{
    return b && f >= 0 && f < b->l->ds.nfields;
}

void *stoke_batch_data(const stoke_batch *b, int field)
{
    if (!field_ok(b, field) || b->l->o.device || !b->host)
        return NULL;
    return b->host->mem + b->l->off[field];
}

size_t stoke__batch_field_bytes(const stoke_batch *b, int f)
{
    const stoke_loader *l = b->l;
    int r = l->rix[f];
    if (r < 0 || !b->count)
        return b->count * l->fields[f].bytes;
    const stoke_field *fd = &l->fields[f];
    size_t units =
        (size_t)stoke__ragged_meta(b, r)[0] * (fd->collate == STOKE_COLLATE_PACK ? 1 : b->count);
    return units * (fd->bytes / (size_t)fd->max_len); /* the bytes of a unit */
}

size_t stoke_batch_field_bytes(const stoke_batch *b, int field)
{
    return field_ok(b, field) ? stoke__batch_field_bytes(b, field) : 0;
}

const int64_t *stoke_batch_lengths(const stoke_batch *b, int field)
{
    if (!field_ok(b, field) || b->l->rix[field] < 0)
        return NULL;
    return stoke__ragged_meta(b, b->l->rix[field]) + 1;
}

const int64_t *stoke_batch_offsets(const stoke_batch *b, int field)
{
    const int64_t *len = stoke_batch_lengths(b, field); /* the offsets follow the lengths */
    return len && b->l->fields[field].collate == STOKE_COLLATE_PACK ? len + b->l->cap : NULL;
}

int stoke_batch_ndim(const stoke_batch *b, int field)
{
    if (!field_ok(b, field))
        return -1;
    const stoke_field *fd = &b->l->fields[field];
    int pack = b->l->rix[field] >= 0 && fd->collate == STOKE_COLLATE_PACK;
    return pack ? fd->ndim : fd->ndim + 1;
}

const stoke_field *stoke_batch_field(const stoke_batch *b, int field)
{
    return field_ok(b, field) ? &b->l->fields[field] : NULL;
}

/* STOKE_OK, or STOKE_EINVAL with the reason in the thread's last error. */
static int check_field(const stoke_batch *b, int field, const void *out, const char *fn)
{
    if (!b || !out)
        return stoke__fail(STOKE_EINVAL, "%s: NULL argument", fn);
    if (field < 0 || field >= b->l->ds.nfields)
        return stoke__fail(STOKE_EINVAL, "%s: no field %d (the batch has %d)", fn, field,
                           b->l->ds.nfields);
    return STOKE_OK;
}

int stoke_batch_shape(const stoke_batch *b, int field, int64_t *shape, int max, int *ndim)
{
    int rc = check_field(b, field, ndim ? shape : NULL, "stoke_batch_shape");
    if (rc != STOKE_OK)
        return rc;
    const stoke_loader *l = b->l;
    const stoke_field *fd = &l->fields[field];
    int r = l->rix[field], n = stoke_batch_ndim(b, field);
    if (max < n) {
        *ndim = n;
        return stoke__fail(STOKE_ERANGE,
                           "stoke_batch_shape: field '%s' has %d dimensions, the "
                           "array %d",
                           fd->name, n, max);
    }
    int64_t ext = r >= 0 && b->count ? stoke__ragged_meta(b, r)[0] : 0;
    int d0 = 0;
    if (r < 0 || fd->collate == STOKE_COLLATE_PAD)
        shape[d0++] = (int64_t)b->count;
    for (int d = 0; d < fd->ndim; d++)
        shape[d0 + d] = d == 0 && r >= 0 ? ext : fd->shape[d];
    *ndim = n;
    return STOKE_OK;
}

int stoke_batch_dtype(const stoke_batch *b, int field, int *dtype)
{
    int rc = check_field(b, field, dtype, "stoke_batch_dtype");
    if (rc != STOKE_OK)
        return rc;
    *dtype = b->l->fields[field].dtype;
    return STOKE_OK;
}

int stoke_batch_is_pinned(const stoke_batch *b)
{
    return b ? b->pinned : 0;
}

int stoke_batch_pin(stoke_batch *b, size_t nbytes)
{
    if (!b || !nbytes)
        return stoke__fail(STOKE_EINVAL, "stoke_batch_pin: %s", b ? "0 bytes" : "NULL batch");
    stoke_loader *l = b->l;
    if (stoke__loader_foreign(l))
        return stoke__loader_forked_fail(l);
    if (nbytes > l->buf_bytes)
        return stoke__fail(STOKE_ERANGE, "stoke_batch_pin: %zu bytes; the batch's buffer holds %zu",
                           nbytes, l->buf_bytes);
    if (l->pin_lazy)
        return stoke__proc_pin(l, b, nbytes);
    if (b->pinned)
        return STOKE_OK;
    return stoke__fail(STOKE_ENOTSUP, "stoke_batch_pin: the loader's batches are not pinned (%s)",
                       l->alloc_kind == STOKE__ALLOC_PAGEABLE ? "no accelerator, or pin_memory 0"
                       : l->proc ? "the shared buffers were not registered, or pinning is off"
                                 : "past the pinned allocator's cap, or pinning is off");
}

stoke_device_buffer *stoke_batch_device_buffer(const stoke_batch *b)
{
    return b && b->l->o.device ? b->dbuf : NULL;
}

size_t stoke_batch_device_offset(const stoke_batch *b, int field)
{
    return field_ok(b, field) ? b->l->off[field] : 0;
}

stoke_event *stoke_batch_device_event(const stoke_batch *b)
{
    return b && b->l->o.device ? b->ev : NULL;
}

/* A device wait or read of b failed with `rc`: sets the loader's last error ("loader: <op>
 * batch 2 of epoch 0 (sample indices 20..29) <prep> device simdev failed: ...") and counts the
 * batch once in device_errors; returns rc. */
static int device_failed(stoke_loader *l, stoke_batch *b, int rc, const char *op, const char *prep)
{
    char what[160], detail[512]; /* the backend's whole reason (an asynchronous copy's, too) */
    stoke__loader_batch_desc(l, b, what, sizeof(what));
    stoke__shorten(detail, sizeof(detail), stoke_last_error());
    stoke__loader_lock(l);
    if (!b->dev_failed) {
        b->dev_failed = 1;
        l->st.device_errors++;
    }
    stoke__loader_unlock(l);
    return stoke__loader_fail(l, rc, "loader: %s %s %s device %s failed: %s (%s)", op, what, prep,
                              l->o.device, detail[0] ? detail : stoke_strerror(rc),
                              stoke_err_name(rc));
}

int stoke_batch_device_wait(stoke_batch *b)
{
    if (!b)
        return stoke__fail(STOKE_EINVAL, "stoke_batch_device_wait: NULL batch");
    if (!b->l->o.device)
        return stoke__fail(STOKE_ESTATE, "batch: device transfer is off");
    int rc = stoke_event_synchronize(b->ev);
    if (rc != STOKE_OK)
        return device_failed(b->l, b, rc, "the copy of", "to");
    return STOKE_OK;
}

int stoke_batch_device_read(stoke_batch *b, int field, void *dst)
{
    int rc = check_field(b, field, dst, "stoke_batch_device_read");
    if (rc != STOKE_OK)
        return rc;
    stoke_loader *l = b->l;
    if (!l->o.device)
        return stoke__fail(STOKE_ESTATE, "batch: device transfer is off");
    size_t n = stoke_batch_field_bytes(b, field);
    if (!n)
        return STOKE_OK;
    pthread_mutex_lock(&l->stream_mu);
    rc = stoke_copy_d2h_async(dst, b->dbuf, l->off[field], n, l->stream);
    if (rc == STOKE_OK)
        rc = stoke_event_record(l->read_ev, l->stream);
    if (rc == STOKE_OK)
        rc = stoke_event_synchronize(l->read_ev);
    pthread_mutex_unlock(&l->stream_mu);
    if (rc != STOKE_OK) {
        char op[64];
        stoke__fmt(op, sizeof(op), "reading field %d of", field);
        return device_failed(l, b, rc, op, "from");
    }
    return STOKE_OK;
}

void stoke_batch_release(stoke_batch *b)
{
    if (!b)
        return;
    stoke_loader *l = b->l;
    /* Checked in every build (one exchange on a line this release writes anyway): a second
     * release of a batch pushed it on the stack twice, and the loader then crashed or hung. */
    unsigned char held = STOKE__B_HELD;
    if (!atomic_compare_exchange_strong_explicit(&b->state, &held, STOKE__B_RELEASED,
                                                 memory_order_relaxed, memory_order_relaxed)) {
        stoke__fail_at(STOKE_LOG_ERROR, STOKE_ESTATE,
                       "stoke_batch_release: batch %" PRIu64 " is not held (released twice?); "
                       "ignored",
                       b->seq);
        return;
    }
    /* without `mu`: a batch of one small row spent a lock round trip, and two atomics on lines
     * the spinning threads read, on its release (loader_internal.h, `released`) */
    stoke_batch *top = atomic_load_explicit(&l->released, memory_order_relaxed);
    do
        b->next = top;
    while (!atomic_compare_exchange_weak_explicit(&l->released, &top, b, memory_order_seq_cst,
                                                  memory_order_relaxed));
    if (atomic_load_explicit(&l->stopped, memory_order_seq_cst)) { /* its buffer goes now */
        if (!stoke__loader_forked(l)) /* (a fork's copy: the buffers are the creator's) */
            stoke__loader_free_idle(l);
        return;
    }
    if (atomic_load_explicit(&l->rel_sleepers, memory_order_seq_cst) == 0)
        return;
    if (stoke__loader_foreign(l)) /* the sleepers are the creator's; its `mu` maybe held */
        return;
    stoke__loader_lock(l); /* somebody sleeps for lack of free batches */
    stoke__loader_reclaim(l);
    stoke__loader_notify(l);
    stoke__loader_unlock(l);
}

int stoke__loader_reclaim(stoke_loader *l)
{
    STOKE__LOADER_ASSERT_MU(l);
    /* a load first: next() calls this every time, and the stack is often empty (a locked
     * exchange is not free); sequentially consistent, for sleep_begin's side of the pairing */
    if (!atomic_load_explicit(&l->released, memory_order_seq_cst))
        return 0;
    stoke_batch *b = atomic_exchange_explicit(&l->released, NULL, memory_order_seq_cst);
    STOKE__LOADER_ASSERT(b != NULL); /* only this, under `mu`, takes from the stack */
    int none_free = !l->nfree, n = 0;
    while (b) {
        stoke_batch *next = b->next;
        l->held--;
        stoke__loader_recycle(l, b);
        b = next;
        n++;
    }
    stoke__loader_wake_workers(l, none_free); /* workers out of buffers: wake them now */
    return n;
}

int stoke__loader_sleep_begin(stoke_loader *l, int *counted)
{
    *counted = 0;
    if (l->nfree) /* not for lack of free batches: a release changes nothing */
        return 0;
    atomic_fetch_add_explicit(&l->rel_sleepers, 1, memory_order_seq_cst);
    if (stoke__loader_reclaim(l)) {
        atomic_fetch_sub_explicit(&l->rel_sleepers, 1, memory_order_relaxed);
        return 1;
    }
    *counted = 1;
    return 0;
}

void stoke__loader_sleep_done(stoke_loader *l, int counted)
{
    if (counted)
        atomic_fetch_sub_explicit(&l->rel_sleepers, 1, memory_order_relaxed);
}
