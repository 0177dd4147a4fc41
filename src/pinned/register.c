/* Caller memory pinned in place (stoke_pin_register) and the is-pinned query. */
#include <pthread.h>
#include <stdlib.h>

#include "common/internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"

int stoke_pin_register(void *ptr, size_t len)
{
    if (!ptr || !len)
        return stoke__fail(STOKE_EINVAL, "stoke_pin_register: %s", ptr ? "length 0" : "NULL");
    stoke__pn_ensure_init();
    const stoke_backend *vt;
    int dev;
    int rc = stoke__pn_target(&vt, &dev);
    if (rc != STOKE_OK)
        return rc;
    if (vt && !vt->host_register)
        return stoke__fail(STOKE_ENOTSUP, "stoke_pin_register: %s cannot pin caller memory",
                           vt->name);
    pn_reg *r = calloc(1, sizeof(*r));
    if (!r)
        return stoke__fail(STOKE_ENOMEM, "stoke_pin_register: out of memory");
    r->ptr = ptr;
    r->len = len;
    r->vt = vt;
    r->dev = dev;
    /* Claim the address first (ready = 0) so that two racing registrations cannot both pin. */
    pthread_mutex_lock(&stoke__pinned.reglock);
    for (pn_reg *o = stoke__pinned.regs; o; o = o->next) {
        if (o->ptr == ptr) {
            pthread_mutex_unlock(&stoke__pinned.reglock);
            free(r);
            return stoke__fail(STOKE_EINVAL, "stoke_pin_register(%p): already registered", ptr);
        }
    }
    r->next = stoke__pinned.regs;
    stoke__pinned.regs = r;
    pthread_mutex_unlock(&stoke__pinned.reglock);
    rc = vt ? stoke__backend_rc(vt->host_register(dev, ptr, len)) : STOKE_OK;
    pthread_mutex_lock(&stoke__pinned.reglock);
    if (rc == STOKE_OK) {
        r->ready = 1;
    } else {
        pn_reg **pp = &stoke__pinned.regs;
        while (*pp != r)
            pp = &(*pp)->next;
        *pp = r->next;
    }
    pthread_mutex_unlock(&stoke__pinned.reglock);
    if (rc != STOKE_OK) {
        free(r);
        PN_ADD(register_failures, 1);
        return stoke__fail(rc,
                           "stoke_pin_register: %s could not pin %zu bytes at %p for "
                           "device %d",
                           vt->name, len, ptr, dev);
    }
    PN_ADD(registered_count, 1);
    PN_ADD(registered_bytes, len);
    return STOKE_OK;
}

int stoke_pin_unregister(void *ptr)
{
    pthread_mutex_lock(&stoke__pinned.reglock);
    pn_reg **pp = &stoke__pinned.regs;
    while (*pp && ((*pp)->ptr != ptr || !(*pp)->ready))
        pp = &(*pp)->next;
    pn_reg *r = *pp;
    if (r)
        *pp = r->next;
    pthread_mutex_unlock(&stoke__pinned.reglock);
    if (!r)
        return stoke__fail(STOKE_EINVAL, "stoke_pin_unregister(%p): not registered", ptr);
    stoke__clear_error();
    int rc = r->vt && r->vt->host_unregister
                 ? stoke__backend_rc(r->vt->host_unregister(r->dev, ptr))
                 : STOKE_OK;
    if (rc != STOKE_OK) {
        /* Still pinned as far as anyone knows: keep tracking it (and counting it). */
        char detail[512];
        stoke__strlcpy(detail, stoke_last_error(), sizeof(detail));
        pthread_mutex_lock(&stoke__pinned.reglock);
        r->next = stoke__pinned.regs;
        stoke__pinned.regs = r;
        pthread_mutex_unlock(&stoke__pinned.reglock);
        return stoke__fail(rc, "stoke_pin_unregister(%p): %s failed to unpin it%s%s", ptr,
                           r->vt->name, detail[0] ? ": " : "", detail);
    }
    PN_SUB(registered_count, 1);
    PN_SUB(registered_bytes, r->len);
    free(r);
    return STOKE_OK;
}

void stoke__pn_reg_reset(void)
{
    pthread_mutex_lock(&stoke__pinned.reglock);
    pn_reg *r = stoke__pinned.regs;
    stoke__pinned.regs = NULL;
    pthread_mutex_unlock(&stoke__pinned.reglock);
    while (r) {
        pn_reg *next = r->next;
        if (r->vt && r->vt->host_unregister && r->ready)
            r->vt->host_unregister(r->dev, r->ptr);
        free(r);
        r = next;
    }
}

int stoke_is_pinned(const void *ptr)
{
    if (!ptr)
        return 0;
    stoke__pn_ensure_init();
    pn_block *b = stoke__pn_map_get(ptr);
    const stoke_backend *vt = NULL;
    if (b) {
        int kind = b->kind;
        pn_pool *p = b->pool;
        int state = atomic_load_explicit(&b->state, memory_order_acquire);
        if (atomic_load_explicit(&b->addr, memory_order_acquire) == (uintptr_t)ptr &&
            state != PN_FREE_DESC) {
            if (kind != PN_PINNED || !p || !p->vt || state == PN_FOREIGN)
                return 0;
            if (p->vt->caps & STOKE_CAP_PINNED_ALLOC)
                return 1;
            vt = p->vt;
        }
    }
    if (vt) {
        int r = 0;
        return vt->is_pinned(ptr, &r) == STOKE_OK && r != 0;
    }
    /* An interior address: ask the current accelerator first, then (memory pinned before the
     * accelerator changed) the registered ranges and every other backend that pinned blocks. */
    int dev, r = 0;
    const stoke_backend *cur = NULL;
    if (stoke__accel_current(&cur, &dev, NULL) == STOKE_OK && cur &&
        cur->is_pinned(ptr, &r) == STOKE_OK && r)
        return 1;
    pthread_mutex_lock(&stoke__pinned.reglock);
    for (const pn_reg *reg = stoke__pinned.regs; reg && !r; reg = reg->next)
        r = reg->ready && reg->vt && (const char *)ptr >= (const char *)reg->ptr &&
            (const char *)ptr < (const char *)reg->ptr + reg->len;
    pthread_mutex_unlock(&stoke__pinned.reglock);
    if (r)
        return 1;
    const stoke_backend *asked[PN_MAX_POOLS];
    int nasked = 0;
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_load_explicit(&stoke__pinned.pools[i], memory_order_acquire);
        if (!p)
            break;
        if (!p->vt || p->vt == cur)
            continue;
        int seen = 0;
        for (int k = 0; k < nasked && !seen; k++)
            seen = asked[k] == p->vt;
        if (seen)
            continue;
        asked[nasked++] = p->vt;
        if (p->vt->is_pinned(ptr, &r) == STOKE_OK && r)
            return 1;
    }
    return 0;
}
