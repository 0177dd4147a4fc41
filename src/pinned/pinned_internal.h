/* Private interface of the pinned allocator (its own files, tests, and other layers of libstoke).
 *
 * Structure (docs/pinned.md has the whole story):
 *   pn_block   one descriptor per block; descriptors are recycled, never freed before reset, so
 *              a stale lookup never reads freed memory.
 *   map        page address of a block's start -> descriptor, a 3-level radix tree read without
 *              locks (map.c).
 *   pn_pool    the cache of one (backend, device): a locked free list per size class and a list
 *              of blocks waiting on events.
 *   pn_tcache  a small per-thread cache of ready blocks of one pool, with its own lock (taken by
 *              its thread on every call, by others only to steal, flush or read counters).
 *
 * Lock order: stoke__pinned.lock -> tcache.lock; stoke__pinned.lock -> pool bin/wait locks.  A
 * tcache lock is never held while taking another lock.  Event stripe locks and the event-pool
 * lock are leaves.
 */
#ifndef STOKE_PINNED_INTERNAL_H
#define STOKE_PINNED_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "stoke/backend.h"
#include "stoke/device.h"
#include "stoke/pinned.h"

/* ---- size classes (sizeclass.c) ---------------------------------------------------------- */
#define PN_SMALL_LOG_MIN 12 /* 4 KiB */
#define PN_SMALL_LOG_MAX 20 /* 1 MiB: the threshold above which classes are quarter steps */
#define PN_NSMALL        (PN_SMALL_LOG_MAX - PN_SMALL_LOG_MIN + 1)
#define PN_LOG_MAX       46 /* largest class: 64 TiB */
#define PN_NCLASS        (PN_NSMALL + (PN_LOG_MAX - PN_SMALL_LOG_MAX) * 4)

/* Class index of a request (pages larger than 4 KiB raise the smallest class), or -1 if too
 * large. */
int stoke__pinned_class(size_t size);
/* Bytes of class `cls` (0 <= cls < PN_NCLASS). */
size_t stoke__pinned_class_size(int cls);
/* Sets the page size the smallest class is raised to (called once at init). */
void stoke__pinned_set_page(size_t page);

/* ---- blocks ------------------------------------------------------------------------------ */
/* PN_FOREIGN: a block of the process this one was forked from (see fork_child in pinned.c):
 * never handed out, freed or released here. */
enum { PN_FREE_DESC = 0, PN_LIVE = 1, PN_CACHED = 2, PN_WAITING = 3, PN_FOREIGN = 4 };
enum { PN_PINNED = 0, PN_STANDIN = 1, PN_FALLBACK = 2 };

typedef struct pn_evnode {
    stoke_event *ev;
    const char *backend; /* the stream's backend name (static in its table) and device */
    int dev;
    struct pn_evnode *next;
} pn_evnode;

struct pn_pool;

/* Descriptors, thread caches and bins are written by different threads: one cache line each. */
#define PN_LINE 64

typedef struct pn_block {
    _Alignas(
        PN_LINE) _Atomic uintptr_t addr; /* start of the block; 0 while the descriptor is unused */
    _Atomic int state;                   /* PN_* state */
    int kind; /* PN_PINNED (pool->vt set), PN_STANDIN (pool->vt NULL), PN_FALLBACK */
    int cls;
    size_t size;           /* class size: bytes held */
    struct pn_pool *pool;  /* the pool it belongs to (PN_FALLBACK: only for its waiting list) */
    pn_evnode *events;     /* under the block's event stripe lock while live; owned by the
                              freeing thread / waiting list afterwards */
    atomic_int has_events; /* set (before the state check) by record_stream: a free that sees
                              0 may skip the stripe lock (see stoke_pinned_free) */
    struct pn_block *next; /* link in whichever list holds it (guarded by that list's lock) */
} pn_block;

/* map.c: lock-free lookup, insert/remove by the owner of the block. */
pn_block *stoke__pn_map_get(const void *ptr);
int stoke__pn_map_put(pn_block *b); /* STOKE_OK or STOKE_ENOMEM / STOKE_ENOTSUP */
void stoke__pn_map_del(pn_block *b);
pn_block *stoke__pn_desc_get(void); /* zeroed descriptor, or NULL */
void stoke__pn_desc_put(pn_block *b);
void stoke__pn_map_reset(void); /* frees the tree and every descriptor (tests) */
/* Calls fn on every descriptor in state PN_LIVE (reset only: nothing may run concurrently). */
void stoke__pn_live_foreach(void (*fn)(pn_block *b));
/* In a forked child: the descriptor lock made anew, the free descriptors dropped (left in
 * their chunks), and every descriptor in use made PN_FOREIGN (it stays in the map, so that a
 * free of it can say whose it is). */
void stoke__pn_desc_after_fork(void);

/* ---- pools and thread caches ------------------------------------------------------------- */
typedef struct pn_bin {
    _Alignas(PN_LINE) pthread_mutex_t lock; /* guards head/n */
    pn_block *head;
    size_t n;
} pn_bin;

typedef struct pn_pool {
    const stoke_backend *vt; /* NULL: the stand-in pool of ordinary page-aligned memory */
    int dev;
    pn_bin bins[PN_NCLASS];
    pthread_mutex_t wait_lock; /* guards waiting */
    pn_block *waiting;
    _Atomic size_t nwaiting;
} pn_pool;

#define PN_TC_NCLASS    17 /* classes up to 4 MiB (index 16) are kept per thread */
#define PN_TC_MAX_BYTES (16u << 20)

typedef struct pn_counters {
    int64_t bytes_in_use, count_in_use; /* per thread: may be negative (freed elsewhere) */
    uint64_t allocs, frees, bytes_requested, hits, misses;
} pn_counters;

typedef struct pn_tcache {
    /* guards everything below except next/prev (stoke__pinned.lock) */
    _Alignas(PN_LINE) pthread_mutex_t lock;
    pn_pool *pool;
    pn_block *bins[PN_TC_NCLASS];
    uint8_t n[PN_TC_NCLASS];
    size_t bytes;
    size_t count;
    pn_counters c;
    struct pn_tcache *next, *prev;
} pn_tcache;

/* ---- shared state (pinned.c) ---------------------------------------------------------------- */
#define PN_MAX_POOLS 64
#define PN_STRIPES   64

typedef struct pn_reg {
    void *ptr;
    size_t len;
    const stoke_backend *vt; /* NULL: nothing was pinned (no accelerator) */
    int dev;
    int ready; /* 0 while the backend call is in flight */
    struct pn_reg *next;
} pn_reg;

/* Counters only the slow paths touch: relaxed atomics. */
#define PN_ATOMIC_COUNTERS(X)                                                                      \
    X(bytes_reserved)                                                                              \
    X(count_reserved)                                                                              \
    X(peak_bytes_reserved) X(peak_bytes_in_use) X(bins_bytes) X(bins_count) X(bytes_waiting)       \
        X(count_waiting) X(pin_calls) X(pin_ns) X(pin_failures) X(unpin_calls) X(unpin_ns)         \
            X(standin_allocs) X(pageable_fallbacks) X(pageable_fallback_bytes) X(limit_failures)   \
                X(limit_releases) X(events_recorded) X(events_created) X(registered_count)         \
                    X(registered_bytes) X(register_failures)

typedef struct pn_global {
    pthread_mutex_t lock; /* guards pool creation, the tcache list, retired, warnings, init */
    atomic_int inited;    /* configuration read from the environment (reset clears it) */
    int disabled;         /* STOKE_PINNED=0; written before `inited` is released */
    int limit_from_api;   /* stoke_pinned_set_limit was called: ignore STOKE_PINNED_LIMIT */
    _Atomic uint64_t limit;
    atomic_int policy;
    _Atomic(pn_pool *) pools[PN_MAX_POOLS];
    pn_tcache *tcaches;
    pn_counters retired; /* counters of exited threads */
#define PN_DECL(name) _Atomic uint64_t name;
    PN_ATOMIC_COUNTERS(PN_DECL)
#undef PN_DECL
    _Atomic(const char *) warned_why; /* the last reason warned about (fast check) */
    atomic_int said_unpinned; /* "no accelerator: nothing is pinned" said, by the allocator or
                                 a loader: the other does not say it again (README: once) */
    uint64_t warned_hash[16];         /* reasons warned about, by hash (under lock) */
    int nwarned;
    pthread_mutex_t evlock; /* guards evfree/nevfree */
    pn_evnode *evfree;
    size_t nevfree;
    pthread_mutex_t reglock; /* guards regs */
    pn_reg *regs;
    pthread_mutex_t stripes[PN_STRIPES]; /* guard pn_block.events of live blocks */
} pn_global;

extern pn_global stoke__pinned;

/* Reads the configuration the first time (and after reset). */
void stoke__pn_init_slow(void);
static inline void stoke__pn_ensure_init(void)
{
    if (!atomic_load_explicit(&stoke__pinned.inited, memory_order_acquire))
        stoke__pn_init_slow();
}
/* The current target: the accelerator (*vt, *dev), or vt NULL (dev -1) for the stand-in of
 * ordinary memory, after the one warning.  Returns STOKE_OK or the registry's error for an
 * invalid STOKE_ACCELERATOR. */
int stoke__pn_target(const stoke_backend **vt, int *dev);
/* Logs `what` at WARN once per process and distinct text (until reset). */
void stoke__pn_warn_once(const char *what);
/* A loader's pin_memory without an accelerator: `what` warned unless the allocator (or another
 * loader) already said that nothing is pinned for want of one. */
void stoke__pn_warn_unpinned(const char *what);
/* Sums the per-thread counters and the cached bytes of every thread cache (takes
 * stoke__pinned.lock). */
void stoke__pn_sum(pn_counters *c, uint64_t *tc_bytes, uint64_t *tc_count);
void stoke__pn_reg_reset(void); /* register.c: unregisters everything (reset) */

#define PN_ADD(name, v) atomic_fetch_add_explicit(&stoke__pinned.name, (v), memory_order_relaxed)
#define PN_SUB(name, v) atomic_fetch_sub_explicit(&stoke__pinned.name, (v), memory_order_relaxed)
#define PN_GET(name)    atomic_load_explicit(&stoke__pinned.name, memory_order_relaxed)

/* ---- other layers -------------------------------------------------------------------------- */
/* stoke_pinned_alloc for a named backend and device instead of the current ones (the loader's
 * pin_memory_device on another device): the same cache, cap, policy and statistics, a block
 * freed with stoke_pinned_free.  It pins for vt whatever STOKE_PINNED says (a caller that names
 * a backend asked for it), and it neither uses nor moves the calling thread's cache when that
 * holds another pool's blocks (one allocation for another device does not make the thread work
 * for it).  STOKE_EINVAL for vt or out NULL; otherwise as stoke_pinned_alloc. */
int stoke__pinned_alloc_on(const stoke_backend *vt, int dev, size_t size, void **out);

/* ---- tests -------------------------------------------------------------------------------- */
/* Tests only: frees every block (cached, waiting and live: pending events are synchronized
 * first), unregisters every registered range, destroys pooled events, forgets warnings,
 * counters, the cap and STOKE_PINNED, so that the next call re-reads the environment.  Call it
 * BEFORE stoke__registry_reset (blocks reference backends).  Not thread-safe with respect to
 * concurrent stoke_pinned_* calls. */
void stoke__pinned_reset(void);

/* events.c: the event pool and a block's recorded events. */
pthread_mutex_t *stoke__pn_stripe_of(const pn_block *b); /* lock of b->events */
void stoke__pn_ev_put_list(pn_evnode *n);                /* back to the pool (or destroyed) */
pn_evnode *stoke__pn_drop_completed(pn_evnode *list);    /* returns the still pending ones */
void stoke__pn_destroy_events(pn_evnode *n);             /* destroys a list taken off the pool */

#endif
