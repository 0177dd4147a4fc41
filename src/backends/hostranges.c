/* Host range table (see hostranges.h). */
#include "backends/hostranges.h"

#include <stdlib.h>
#include <string.h>

#include "stoke/status.h"

/* Index of the first range whose base is > p (under the lock). */
static size_t upper_bound(const stoke__hostranges *t, uintptr_t p)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

int stoke__hostranges_add(stoke__hostranges *t, const stoke__hostrange *r)
{
    int rc = STOKE_OK;
    pthread_rwlock_wrlock(&t->lock);
    size_t i = upper_bound(t, r->base);
    size_t size = r->size ? r->size : 1;
    if ((i > 0 && t->v[i - 1].base + (t->v[i - 1].size ? t->v[i - 1].size : 1) > r->base) ||
        (i < t->n && r->base + size > t->v[i].base)) {
        rc = STOKE_EINVAL;
        goto out;
    }
    if (t->n == t->cap) {
        size_t cap = t->cap ? t->cap * 2 : 16;
        stoke__hostrange *v = realloc(t->v, cap * sizeof(*v));
        if (!v) {
            rc = STOKE_ENOMEM;
            goto out;
        }
        t->v = v;
        t->cap = cap;
    }
    memmove(&t->v[i + 1], &t->v[i], (t->n - i) * sizeof(*t->v));
    t->v[i] = *r;
    t->n++;
out:
    pthread_rwlock_unlock(&t->lock);
    return rc;
}

int stoke__hostranges_remove(stoke__hostranges *t, const void *base, stoke__hostrange *out)
{
    uintptr_t p = (uintptr_t)base;
    int rc = STOKE_ENOENT;
    pthread_rwlock_wrlock(&t->lock);
    size_t i = upper_bound(t, p);
    if (i > 0 && t->v[i - 1].base == p) {
        if (out)
            *out = t->v[i - 1];
        memmove(&t->v[i - 1], &t->v[i], (t->n - i) * sizeof(*t->v));
        t->n--;
        rc = STOKE_OK;
    }
    pthread_rwlock_unlock(&t->lock);
    return rc;
}

int stoke__hostranges_find(stoke__hostranges *t, const void *ptr, stoke__hostrange *out)
{
    uintptr_t p = (uintptr_t)ptr;
    int found = 0;
    pthread_rwlock_rdlock(&t->lock);
    size_t i = upper_bound(t, p);
    if (i > 0) {
        const stoke__hostrange *r = &t->v[i - 1];
        if (p - r->base < (r->size ? r->size : 1)) {
            found = 1;
            if (out)
                *out = *r;
        }
    }
    pthread_rwlock_unlock(&t->lock);
    return found;
}

void stoke__hostranges_take_all(stoke__hostranges *t, stoke__hostrange **v, size_t *n)
{
    pthread_rwlock_wrlock(&t->lock);
    *v = t->v;
    *n = t->n;
    t->v = NULL;
    t->n = t->cap = 0;
    pthread_rwlock_unlock(&t->lock);
}

size_t stoke__hostranges_count(stoke__hostranges *t)
{
    pthread_rwlock_rdlock(&t->lock);
    size_t n = t->n;
    pthread_rwlock_unlock(&t->lock);
    return n;
}
