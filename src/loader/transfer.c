/* The loader's device transfer: the stream, device buffers and events, the asynchronous copy of a
 * filled batch, and the return of staging slots (the copy FIFO) to the pools. */
#include <pthread.h>
#include <stdlib.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "registry/registry.h"
#include "stoke/accelerator.h"
#include "stoke/loader.h"
#include "stoke/pinned.h"

/* Creates the stream, events and device buffers of device transfer. */
int stoke__loader_setup_device(stoke_loader *l)
{
    int index = -1;
    const stoke_backend *vt = NULL, *cur = NULL;
    int cdev = 0;
    int rc = stoke__loader_resolve_spec(l, "device", l->o.device, &vt, &index);
    if (rc == STOKE_EINVAL || rc == STOKE_ERANGE)
        return rc;
    if (rc != STOKE_OK)
        goto fail;
    int chosen = stoke__accel_current(&cur, &cdev, NULL) == STOKE_OK && cur == vt;
    int other = index >= 0 && index != (chosen ? cdev : 0); /* the stream on device `index` */
    if (other && !chosen)
        return stoke__loader_fail(
            l, STOKE_ENOTSUP,
            "loader: device '%s': a device index other than 0 needs %s to be the chosen "
            "accelerator",
            l->o.device, vt->name);
    if (other && (rc = stoke_device_set(index)) != STOKE_OK)
        goto fail;
    rc = stoke_stream_create(vt->name, &l->stream);
    if (other)
        stoke_device_set(cdev);
    if (rc == STOKE_OK)
        rc = stoke_event_create(l->stream, &l->read_ev);
    if (rc != STOKE_OK)
        goto fail;
    for (int i = 0; i < l->nbuf; i++) {
        rc = stoke_device_buffer_create(l->stream, l->buf_bytes, &l->bat[i].dbuf);
        if (rc == STOKE_OK)
            rc = stoke_event_create(l->stream, &l->bat[i].ev);
        if (rc == STOKE_OK)
            rc = stoke_event_create(l->stream, &l->slots[i].ev);
        if (rc != STOKE_OK)
            return stoke__loader_fail(l, rc, "loader: device '%s': batch buffer %d of %d: %s",
                                      l->o.device, i + 1, l->nbuf, stoke_last_error());
    }
    return STOKE_OK;
fail:
    return stoke__loader_fail(l, rc, "loader: device '%s': %s", l->o.device, stoke_last_error());
}

/* Device mode: queues the copy of a filled batch; the slot's event marks when it may be reused. */
void stoke__loader_copy_batch(stoke_loader *l, stoke_batch *b)
{
    stoke__slot *s = b->host;
    int rc = STOKE_OK;
    pthread_mutex_lock(&l->stream_mu);
    for (int f = 0; rc == STOKE_OK && f < l->ds.nfields; f++) {
        size_t n = stoke__batch_field_bytes(b, f);
        if (n)
            rc = stoke_copy_h2d_async(b->dbuf, l->off[f], s->mem + l->off[f], n, l->stream);
    }
    if (rc == STOKE_OK)
        rc = stoke_event_record(b->ev, l->stream);
    if (rc == STOKE_OK)
        rc = stoke_event_record(s->ev, l->stream);
    if (rc == STOKE_OK && l->alloc_kind == STOKE__ALLOC_POOL)
        stoke_pinned_record_stream(s->mem, l->stream);
    pthread_mutex_unlock(&l->stream_mu);
    b->copied = 1; /* something may have been queued: the slot waits for its event */
    if (rc != STOKE_OK) {
        char what[160];
        stoke__loader_batch_desc(l, b, what, sizeof(what));
        b->status = rc;
        b->err_index = b->count ? b->indices[0] : 0;
        stoke__fmt(b->err_msg, sizeof(b->err_msg), "queuing the copy of %s to device %s failed: %s",
                   what, l->o.device, stoke_last_error());
    }
}

void stoke__loader_drop_slot(stoke_loader *l, stoke_batch *b)
{
    stoke__slot *s = b->host;
    if (!s)
        return;
    b->host = NULL;
    s->next = NULL;
    if (b->copied) {
        if (l->copy_tail)
            l->copy_tail->next = s;
        else
            l->copy_head = s;
        l->copy_tail = s;
    } else {
        s->next = l->free_s;
        l->free_s = s;
    }
}

/* (mu) Gives b (and in device mode its slot) back to the pools. */
void stoke__loader_recycle(stoke_loader *l, stoke_batch *b)
{
    STOKE__LOADER_ASSERT_MU(l);
    int st = atomic_load_explicit(&b->state, memory_order_relaxed);
    STOKE__LOADER_ASSERT(st == STOKE__B_FILLING || st == STOKE__B_DONE || st == STOKE__B_RELEASED);
    stoke__batch_move(b, st, STOKE__B_FREE);
    if (l->o.device)
        stoke__loader_drop_slot(l, b);
    l->free_v[l->nfree++] = b;
}

void stoke__loader_take_slot(stoke_loader *l, stoke_batch *b)
{
    STOKE__LOADER_ASSERT_MU(l);
    STOKE__LOADER_ASSERT(!b->host);
    stoke__slot *s = l->free_s;
    if (s) {
        l->free_s = s->next;
        b->host = s;
        return;
    }
    s = l->copy_head; /* never NULL: fewer batches are being filled than there are slots */
    STOKE__LOADER_ASSERT(s != NULL);
    l->copy_head = s->next;
    if (!l->copy_head)
        l->copy_tail = NULL;
    b->host = s; /* before `mu` drops: the slot is accounted for (b's) while it waits */
    stoke__loader_unlock(l);
    stoke_event_synchronize(s->ev); /* the pinned memory is reused only after its copy */
    stoke__loader_lock(l);
}
