/* Block descriptors and the map from a block's start address to its descriptor.
 *
 * The map is a 3-level radix tree over the page number of the start address (bits 12..51):
 * 16 + 12 + 12 bits.  Lookups are three acquire loads and take no lock; interior nodes are
 * installed with compare-and-swap and are never freed before stoke__pn_map_reset, so a reader
 * never follows a dangling node.  Only the owner of a block (the thread that pins it, frees it
 * for good) writes its slot.
 *
 * Descriptors come from chunks and are recycled through a locked free list but never returned
 * to the system before reset: a lookup racing with the release of a block (a caller error such
 * as freeing twice) reads a valid descriptor whose address no longer matches, never freed
 * memory.
 */
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "pinned/pinned_internal.h"

#define L1_BITS    16
#define L2_BITS    12
#define L3_BITS    12
#define PAGE_SHIFT 12

typedef struct leaf {
    _Atomic(pn_block *) slot[1u << L3_BITS];
} leaf;
typedef struct mid {
    _Atomic(leaf *) slot[1u << L2_BITS];
} mid;

static _Atomic(mid *) root[1u << L1_BITS];

static int split(uintptr_t addr, unsigned *i1, unsigned *i2, unsigned *i3)
{
    uint64_t key = (uint64_t)addr >> PAGE_SHIFT;
    if (key >> (L1_BITS + L2_BITS + L3_BITS))
        return -1;
    *i1 = (unsigned)(key >> (L2_BITS + L3_BITS));
    *i2 = (unsigned)(key >> L3_BITS) & ((1u << L2_BITS) - 1);
    *i3 = (unsigned)key & ((1u << L3_BITS) - 1);
    return 0;
}

pn_block *stoke__pn_map_get(const void *ptr)
{
    unsigned i1, i2, i3;
    uintptr_t a = (uintptr_t)ptr;
    if ((a & ((1u << PAGE_SHIFT) - 1)) || split(a, &i1, &i2, &i3))
        return NULL;
    mid *m = atomic_load_explicit(&root[i1], memory_order_acquire);
    if (!m)
        return NULL;
    leaf *l = atomic_load_explicit(&m->slot[i2], memory_order_acquire);
    if (!l)
        return NULL;
    pn_block *b = atomic_load_explicit(&l->slot[i3], memory_order_acquire);
    if (!b || atomic_load_explicit(&b->addr, memory_order_acquire) != a)
        return NULL;
    return b;
}

int stoke__pn_map_put(pn_block *b)
{
    unsigned i1, i2, i3;
    uintptr_t a = atomic_load_explicit(&b->addr, memory_order_relaxed);
    if ((a & ((1u << PAGE_SHIFT) - 1)) || split(a, &i1, &i2, &i3))
        return stoke__fail(STOKE_ENOTSUP,
                           "pinned: block address %p is not page-aligned or "
                           "beyond 52 bits",
                           (void *)a);
    mid *m = atomic_load_explicit(&root[i1], memory_order_acquire);
    if (!m) {
        mid *fresh = calloc(1, sizeof(*fresh));
        if (!fresh)
            return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for the block map");
        if (atomic_compare_exchange_strong_explicit(&root[i1], &m, fresh, memory_order_acq_rel,
                                                    memory_order_acquire))
            m = fresh;
        else
            free(fresh);
    }
    leaf *l = atomic_load_explicit(&m->slot[i2], memory_order_acquire);
    if (!l) {
        leaf *fresh = calloc(1, sizeof(*fresh));
        if (!fresh)
            return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for the block map");
        if (atomic_compare_exchange_strong_explicit(&m->slot[i2], &l, fresh, memory_order_acq_rel,
                                                    memory_order_acquire))
            l = fresh;
        else
            free(fresh);
    }
    atomic_store_explicit(&l->slot[i3], b, memory_order_release);
    return STOKE_OK;
}

void stoke__pn_map_del(pn_block *b)
{
    unsigned i1, i2, i3;
    uintptr_t a = atomic_load_explicit(&b->addr, memory_order_relaxed);
    if (split(a, &i1, &i2, &i3))
        return;
    mid *m = atomic_load_explicit(&root[i1], memory_order_acquire);
    leaf *l = m ? atomic_load_explicit(&m->slot[i2], memory_order_acquire) : NULL;
    if (!l)
        return;
    pn_block *expect = b;
    atomic_compare_exchange_strong_explicit(&l->slot[i3], &expect, NULL, memory_order_acq_rel,
                                            memory_order_relaxed);
}

/* ---- descriptors ------------------------------------------------------------------------ */
#define CHUNK 64

typedef struct chunk {
    struct chunk *next;
    pn_block blocks[CHUNK];
} chunk;

static pthread_mutex_t desc_lock = PTHREAD_MUTEX_INITIALIZER; /* guards chunks, free_desc */
static chunk *chunks;
static pn_block *free_desc;

pn_block *stoke__pn_desc_get(void)
{
    pthread_mutex_lock(&desc_lock);
    if (!free_desc) {
        chunk *c = aligned_alloc(PN_LINE, sizeof(*c));
        if (c)
            memset(c, 0, sizeof(*c));
        if (!c) {
            pthread_mutex_unlock(&desc_lock);
            return NULL;
        }
        c->next = chunks;
        chunks = c;
        for (int i = CHUNK - 1; i >= 0; i--) {
            c->blocks[i].next = free_desc;
            free_desc = &c->blocks[i];
        }
    }
    pn_block *b = free_desc;
    free_desc = b->next;
    pthread_mutex_unlock(&desc_lock);
    b->next = NULL;
    b->events = NULL;
    b->pool = NULL;
    b->size = 0;
    b->cls = 0;
    b->kind = PN_PINNED;
    atomic_store_explicit(&b->has_events, 0, memory_order_relaxed);
    return b;
}

void stoke__pn_desc_put(pn_block *b)
{
    atomic_store_explicit(&b->addr, 0, memory_order_release);
    atomic_store_explicit(&b->state, PN_FREE_DESC, memory_order_release);
    pthread_mutex_lock(&desc_lock);
    b->next = free_desc;
    free_desc = b;
    pthread_mutex_unlock(&desc_lock);
}

void stoke__pn_map_reset(void)
{
    for (unsigned i = 0; i < (1u << L1_BITS); i++) {
        mid *m = atomic_exchange(&root[i], NULL);
        if (!m)
            continue;
        for (unsigned j = 0; j < (1u << L2_BITS); j++)
            free(atomic_load(&m->slot[j]));
        free(m);
    }
    pthread_mutex_lock(&desc_lock);
    while (chunks) {
        chunk *c = chunks;
        chunks = c->next;
        free(c);
    }
    free_desc = NULL;
    pthread_mutex_unlock(&desc_lock);
}

void stoke__pn_live_foreach(void (*fn)(pn_block *b))
{
    pthread_mutex_lock(&desc_lock);
    chunk *list = chunks;
    pthread_mutex_unlock(&desc_lock);
    for (chunk *c = list; c; c = c->next)
        for (int i = 0; i < CHUNK; i++)
            if (atomic_load(&c->blocks[i].state) == PN_LIVE)
                fn(&c->blocks[i]);
}

void stoke__pn_desc_after_fork(void)
{
    /* (in the child, alone: a thread of the parent may have held the lock, mid-way through the
     * free list, which is dropped; the chunk list is only ever pushed whole onto its head) */
    pthread_mutex_init(&desc_lock, NULL);
    free_desc = NULL;
    for (chunk *c = chunks; c; c = c->next)
        for (int i = 0; i < CHUNK; i++)
            if (atomic_load(&c->blocks[i].state) != PN_FREE_DESC)
                atomic_store(&c->blocks[i].state, PN_FOREIGN);
}
