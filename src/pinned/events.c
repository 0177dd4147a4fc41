/* Event-guarded reuse: the pool of events, recording a stream's work on a block, and dropping
 * completed events.  Locking: a block's event list is protected by its stripe lock
 * (stoke__pn_stripe_of), taken before stoke__pinned.evlock, which guards the event pool and is a
 * leaf (docs/pinned.md). */
#include <stdlib.h>

#include "common/internal.h"
#include "pinned/pinned_internal.h"

#define EV_POOL_MAX 256 /* pooled events kept at most; more are destroyed when returned */

/* Destroys a list of pooled events (taken off the pool first, outside stoke__pinned.evlock). */
void stoke__pn_destroy_events(pn_evnode *n)
{
    while (n) {
        pn_evnode *next = n->next;
        stoke_event_destroy(n->ev);
        free(n);
        n = next;
    }
}

pthread_mutex_t *stoke__pn_stripe_of(const pn_block *b)
{
    uintptr_t a = (uintptr_t)b;
    return &stoke__pinned.stripes[(a / sizeof(pn_block)) % PN_STRIPES];
}

void stoke__pn_ev_put_list(pn_evnode *n)
{
    pn_evnode *drop = NULL;
    pthread_mutex_lock(&stoke__pinned.evlock);
    while (n) {
        pn_evnode *next = n->next;
        if (stoke__pinned.nevfree < EV_POOL_MAX) {
            n->next = stoke__pinned.evfree;
            stoke__pinned.evfree = n;
            stoke__pinned.nevfree++;
        } else {
            n->next = drop;
            drop = n;
        }
        n = next;
    }
    pthread_mutex_unlock(&stoke__pinned.evlock);
    stoke__pn_destroy_events(drop);
}

/* A pooled event usable on stream `s` (same backend and device), or a new one. */
static int ev_get(stoke_stream *s, pn_evnode **out)
{
    const char *backend = stoke_stream_backend(s);
    int dev = stoke_stream_device(s);
    pthread_mutex_lock(&stoke__pinned.evlock);
    pn_evnode **pp = &stoke__pinned.evfree;
    while (*pp && ((*pp)->backend != backend || (*pp)->dev != dev))
        pp = &(*pp)->next;
    pn_evnode *n = *pp;
    if (n) {
        *pp = n->next;
        stoke__pinned.nevfree--;
    }
    pthread_mutex_unlock(&stoke__pinned.evlock);
    if (!n) {
        n = calloc(1, sizeof(*n));
        if (!n)
            return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for an event");
        int rc = stoke_event_create(s, &n->ev);
        if (rc != STOKE_OK) {
            free(n);
            return rc;
        }
        n->backend = backend;
        n->dev = dev;
        PN_ADD(events_created, 1);
    }
    n->next = NULL;
    *out = n;
    return STOKE_OK;
}

/* Queries each event without blocking; completed ones (or failed: their work is over) go back
 * to the event pool.  Returns the still pending ones. */
pn_evnode *stoke__pn_drop_completed(pn_evnode *list)
{
    pn_evnode *pending = NULL, *done = NULL;
    while (list) {
        pn_evnode *next = list->next;
        int rc = stoke_event_query(list->ev);
        if (rc == STOKE_EBUSY) {
            list->next = pending;
            pending = list;
        } else {
            if (rc != STOKE_OK)
                stoke__log(STOKE_LOG_DEBUG,
                           "pinned: work recorded on a block failed (%s); "
                           "the block is reusable",
                           stoke_err_name(rc));
            list->next = done;
            done = list;
        }
        list = next;
    }
    if (done)
        stoke__pn_ev_put_list(done);
    return pending;
}

int stoke_pinned_record_stream(void *ptr, stoke_stream *s)
{
    if (!ptr || !s)
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_record_stream: NULL %s",
                           ptr ? "stream" : "pointer");
    pn_block *b = stoke__pn_map_get(ptr);
    if (!b || atomic_load_explicit(&b->state, memory_order_acquire) != PN_LIVE)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_pinned_record_stream(%p): not the start of a "
                           "live block from stoke_pinned_alloc",
                           ptr);
    pn_evnode *n = NULL;
    int rc = ev_get(s, &n);
    if (rc != STOKE_OK)
        return rc;
    rc = stoke_event_record(n->ev, s);
    if (rc != STOKE_OK) {
        stoke_event_destroy(n->ev);
        free(n);
        return rc;
    }
    pthread_mutex_t *m = stoke__pn_stripe_of(b);
    pthread_mutex_lock(m);
    /* Flag first, then check the state (both seq_cst): a racing free either sees the flag and
     * takes the lock, or this sees the block freed. */
    atomic_store(&b->has_events, 1);
    if (atomic_load(&b->state) != PN_LIVE) {
        if (!b->events)
            atomic_store(&b->has_events, 0);
        pthread_mutex_unlock(m);
        stoke__pn_ev_put_list(n);
        return stoke__fail(STOKE_EINVAL,
                           "stoke_pinned_record_stream(%p): the block was freed "
                           "meanwhile",
                           ptr);
    }
    /* A live block recorded on again and again (a loader's staging slot) keeps only the events
     * still pending: completed ones go back to the pool here (queries never block). */
    n->next = stoke__pn_drop_completed(b->events);
    b->events = n;
    pthread_mutex_unlock(m);
    PN_ADD(events_recorded, 1);
    return STOKE_OK;
}
