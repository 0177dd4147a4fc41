/* Pinned host memory, first simple version: one mutex, a list of blocks, exact-size reuse.
 * (Replaced by the sharded caching allocator; the public semantics stay the same.) */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/pinned.h"

typedef struct evnode {
    stoke_event *ev;
    struct evnode *next;
} evnode;

typedef struct sblock {
    void *ptr;
    size_t size;
    const stoke_backend *vt; /* NULL: ordinary memory */
    int dev;
    int live;
    evnode *events;
    struct sblock *next;
} sblock;

typedef struct sreg {
    void *ptr;
    const stoke_backend *vt;
    int dev;
    struct sreg *next;
} sreg;

static pthread_mutex_t s_lock = PTHREAD_MUTEX_INITIALIZER;
static sblock *s_blocks;
static sreg *s_regs;
static int s_warned;

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static size_t round_size(size_t n)
{
    size_t r = page_size();
    while (r < n)
        r <<= 1;
    return r;
}

/* Current target; vt NULL for ordinary memory (warns once). */
static int target(const stoke_backend **vt, int *dev)
{
    const char *why = NULL;
    int rc = stoke__accel_current(vt, dev, &why);
    int on = 1;
    if (rc == STOKE_OK && stoke__env_bool(STOKE_ENV_PINNED, &on) && !on) {
        *vt = NULL;
        why = "STOKE_PINNED=0";
        rc = STOKE_ENODEV;
    }
    if (rc == STOKE_ENODEV) {
        *vt = NULL;
        *dev = -1;
        pthread_mutex_lock(&s_lock);
        int warn = !s_warned;
        s_warned = 1;
        pthread_mutex_unlock(&s_lock);
        if (warn)
            stoke__log(STOKE_LOG_WARN, "pinned memory: pinning is not in effect (%s); using "
                       "ordinary memory", why ? why : "no accelerator");
        return STOKE_OK;
    }
    return rc;
}

static int events_done(sblock *b)
{
    for (evnode *n = b->events; n; n = n->next)
        if (stoke_event_query(n->ev) == STOKE_EBUSY)
            return 0;
    return 1;
}

static void events_clear(sblock *b)
{
    while (b->events) {
        evnode *n = b->events;
        b->events = n->next;
        stoke_event_destroy(n->ev);
        free(n);
    }
}

int stoke_pinned_alloc(size_t size, void **out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_alloc: out is NULL");
    *out = NULL;
    const stoke_backend *vt;
    int dev;
    int rc = target(&vt, &dev);
    if (rc != STOKE_OK)
        return rc;
    size_t rs = round_size(size ? size : 1);
    pthread_mutex_lock(&s_lock);
    for (sblock *b = s_blocks; b; b = b->next) {
        if (!b->live && b->vt == vt && b->dev == dev && b->size == rs && events_done(b)) {
            events_clear(b);
            b->live = 1;
            *out = b->ptr;
            pthread_mutex_unlock(&s_lock);
            return STOKE_OK;
        }
    }
    pthread_mutex_unlock(&s_lock);
    sblock *b = calloc(1, sizeof(*b));
    if (!b)
        return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for a block descriptor");
    void *p = NULL;
    if (vt)
        rc = vt->host_alloc(dev, rs, &p);
    else
        rc = posix_memalign(&p, page_size(), rs) ? STOKE_ENOMEM : STOKE_OK;
    if (rc != STOKE_OK) {
        free(b);
        return stoke__fail(rc, "pinned: allocating %zu bytes for %s device %d failed", rs,
                           vt ? vt->name : "host", dev);
    }
    b->ptr = p;
    b->size = rs;
    b->vt = vt;
    b->dev = dev;
    b->live = 1;
    pthread_mutex_lock(&s_lock);
    b->next = s_blocks;
    s_blocks = b;
    pthread_mutex_unlock(&s_lock);
    *out = p;
    return STOKE_OK;
}

static sblock *find_locked(const void *ptr)
{
    for (sblock *b = s_blocks; b; b = b->next)
        if (b->ptr == ptr)
            return b;
    return NULL;
}

int stoke_pinned_free(void *ptr)
{
    if (!ptr)
        return STOKE_OK;
    pthread_mutex_lock(&s_lock);
    sblock *b = find_locked(ptr);
    if (!b || !b->live) {
        pthread_mutex_unlock(&s_lock);
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_free(%p): not a live pinned block", ptr);
    }
    b->live = 0;
    pthread_mutex_unlock(&s_lock);
    return STOKE_OK;
}

int stoke_pinned_record_stream(void *ptr, stoke_stream *s)
{
    if (!ptr || !s)
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_record_stream: NULL argument");
    evnode *n = calloc(1, sizeof(*n));
    if (!n)
        return STOKE_ENOMEM;
    int rc = stoke_event_create(s, &n->ev);
    if (rc == STOKE_OK)
        rc = stoke_event_record(n->ev, s);
    if (rc != STOKE_OK) {
        stoke_event_destroy(n->ev);
        free(n);
        return rc;
    }
    pthread_mutex_lock(&s_lock);
    sblock *b = find_locked(ptr);
    if (!b || !b->live) {
        pthread_mutex_unlock(&s_lock);
        stoke_event_destroy(n->ev);
        free(n);
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_record_stream(%p): not a live pinned "
                           "block", ptr);
    }
    n->next = b->events;
    b->events = n;
    pthread_mutex_unlock(&s_lock);
    return STOKE_OK;
}

int stoke_is_pinned(const void *ptr)
{
    if (!ptr)
        return 0;
    const stoke_backend *vt;
    int dev;
    if (stoke__accel_current(&vt, &dev, NULL) != STOKE_OK || !vt)
        return 0;
    int on = 1;
    if (stoke__env_bool(STOKE_ENV_PINNED, &on) && !on)
        return 0;
    int r = 0;
    if (vt->is_pinned(ptr, &r) != STOKE_OK)
        return 0;
    return r != 0;
}

int stoke_pin_register(void *ptr, size_t len)
{
    if (!ptr || !len)
        return stoke__fail(STOKE_EINVAL, "stoke_pin_register: empty range");
    const stoke_backend *vt;
    int dev;
    int rc = target(&vt, &dev);
    if (rc != STOKE_OK)
        return rc;
    if (vt) {
        if (!vt->host_register)
            return stoke__fail(STOKE_ENOTSUP, "%s cannot register host memory", vt->name);
        rc = vt->host_register(dev, ptr, len);
        if (rc != STOKE_OK)
            return stoke__fail(rc, "%s: registering %zu bytes at %p failed", vt->name, len, ptr);
    }
    sreg *r = calloc(1, sizeof(*r));
    if (!r) {
        if (vt)
            vt->host_unregister(dev, ptr);
        return STOKE_ENOMEM;
    }
    r->ptr = ptr;
    r->vt = vt;
    r->dev = dev;
    pthread_mutex_lock(&s_lock);
    r->next = s_regs;
    s_regs = r;
    pthread_mutex_unlock(&s_lock);
    return STOKE_OK;
}

int stoke_pin_unregister(void *ptr)
{
    pthread_mutex_lock(&s_lock);
    sreg **pp = &s_regs;
    while (*pp && (*pp)->ptr != ptr)
        pp = &(*pp)->next;
    sreg *r = *pp;
    if (r)
        *pp = r->next;
    pthread_mutex_unlock(&s_lock);
    if (!r)
        return stoke__fail(STOKE_EINVAL, "stoke_pin_unregister(%p): not registered", ptr);
    int rc = r->vt && r->vt->host_unregister ? r->vt->host_unregister(r->dev, ptr) : STOKE_OK;
    free(r);
    return rc;
}

void stoke__pinned_reset(void)
{
    pthread_mutex_lock(&s_lock);
    sblock *b = s_blocks;
    s_blocks = NULL;
    sreg *r = s_regs;
    s_regs = NULL;
    s_warned = 0;
    pthread_mutex_unlock(&s_lock);
    while (b) {
        sblock *next = b->next;
        for (evnode *n = b->events; n; n = n->next)
            stoke_event_synchronize(n->ev);
        events_clear(b);
        if (b->vt)
            b->vt->host_free(b->dev, b->ptr);
        else
            free(b->ptr);
        free(b);
        b = next;
    }
    while (r) {
        sreg *next = r->next;
        if (r->vt && r->vt->host_unregister)
            r->vt->host_unregister(r->dev, r->ptr);
        free(r);
        r = next;
    }
}
