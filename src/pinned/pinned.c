/* The pinned host memory caching allocator: allocation, free, event-guarded reuse, the cap.
 *
 * Paths of an allocation, cheapest first (docs/pinned.md):
 *   1. the calling thread's cache (pn_tcache: its own lock, uncontended);
 *   2. the pool's free list of the size class (a lock per class and pool);
 *   3. blocks of the pool whose events have completed since they were freed (non-blocking
 *      queries);
 *   4. a block of that class idle in another thread's cache;
 *   5. a new block from the backend (under the cap: idle blocks are released first; past it the
 *      policy decides).
 * A free goes to the thread's cache (same pool, small classes, room left), else to the pool's
 * free list, or to the pool's waiting list while events recorded for the block are pending.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/env.h"
#include "common/internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"

pn_global stoke__pinned = {.lock = PTHREAD_MUTEX_INITIALIZER,
                           .evlock = PTHREAD_MUTEX_INITIALIZER,
                           .reglock = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t once = PTHREAD_ONCE_INIT;
static pthread_key_t tc_key;
static size_t page_size = 4096;
static _Thread_local pn_tcache *tl_tc;
static _Thread_local int tl_tc_dead; /* the thread is exiting: no new cache */

static void tc_exit(void *arg);

/* ---- fork ----------------------------------------------------------------------------------
 * A forked child inherits copies of the parent's pools, caches and blocks.  Handing one of
 * them out would give the child memory the parent uses too (a backend's MAP_SHARED blocks), or
 * memory that is not there (CUDA maps its pinned memory MADV_DONTFORK); freeing one would
 * release the parent's.  So the child starts afresh: the parent's blocks become PN_FOREIGN,
 * its pools, thread caches, pooled events and registrations are set aside (kept reachable,
 * never used), the counters start at 0, and every lock is made anew (a thread of the parent may
 * have held one).  No lock is taken around fork(): handlers that take locks there run in the
 * order of their registration, which changes as plugins are loaded and unloaded, so two of them
 * would take their locks in either order (ThreadSanitizer's lock-order report); the child reads
 * only the heads of what it sets aside and the descriptor chunks, pushed whole onto their list. */
typedef struct pn_orphans {
    struct pn_orphans *next;
    pn_pool *pools[PN_MAX_POOLS];
    pn_tcache *tcaches;
    pn_evnode *evfree;
    pn_reg *regs;
} pn_orphans;

static pn_orphans *orphans; /* what forks left, newest first (only for leak checkers) */
static int parent_pid;      /* the process the live blocks came from, once forked */

static void fork_child(void)
{
    stoke__pn_desc_after_fork();
    parent_pid = (int)getppid();
    pn_orphans *o = calloc(1, sizeof(*o));
    if (o) {
        o->next = orphans;
        orphans = o;
    }
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_exchange(&stoke__pinned.pools[i], NULL);
        if (o)
            o->pools[i] = p;
    }
    if (o) {
        o->tcaches = stoke__pinned.tcaches;
        o->evfree = stoke__pinned.evfree;
        o->regs = stoke__pinned.regs;
    }
    stoke__pinned.tcaches = NULL;
    stoke__pinned.evfree = NULL;
    stoke__pinned.nevfree = 0;
    stoke__pinned.regs = NULL;
    tl_tc = NULL;
    pthread_setspecific(tc_key, NULL);
    memset(&stoke__pinned.retired, 0, sizeof(stoke__pinned.retired));
#define PN_ZERO_CHILD(name) atomic_store(&stoke__pinned.name, 0);
    PN_ATOMIC_COUNTERS(PN_ZERO_CHILD)
#undef PN_ZERO_CHILD
    /* (held by other threads of the parent, perhaps: those threads are not here) */
    pthread_mutex_init(&stoke__pinned.lock, NULL);
    pthread_mutex_init(&stoke__pinned.evlock, NULL);
    pthread_mutex_init(&stoke__pinned.reglock, NULL);
    for (int i = 0; i < PN_STRIPES; i++)
        pthread_mutex_init(&stoke__pinned.stripes[i], NULL);
}

static void once_init(void)
{
    pthread_atfork(NULL, NULL, fork_child);
    for (int i = 0; i < PN_STRIPES; i++)
        pthread_mutex_init(&stoke__pinned.stripes[i], NULL);
    pthread_key_create(&tc_key, tc_exit);
    long p = sysconf(_SC_PAGESIZE);
    if (p > 0)
        page_size = (size_t)p;
    stoke__pinned_set_page(page_size);
    /* Cached blocks and pooled events reference backends: drop them before a reset unloads. */
    stoke__registry_on_reset(stoke__pinned_reset);
}

void stoke__pn_init_slow(void)
{
    pthread_once(&once, once_init);
    pthread_mutex_lock(&stoke__pinned.lock);
    if (!atomic_load_explicit(&stoke__pinned.inited, memory_order_relaxed)) {
        int on = 1;
        stoke__pinned.disabled = stoke__env_bool(STOKE_ENV_PINNED, &on) && !on;
        uint64_t v;
        if (!stoke__pinned.limit_from_api && stoke__env_size(STOKE_ENV_PINNED_LIMIT, &v))
            atomic_store(&stoke__pinned.limit, v);
        atomic_store_explicit(&stoke__pinned.inited, 1, memory_order_release);
    }
    pthread_mutex_unlock(&stoke__pinned.lock);
}

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    while (*s)
        h = (h ^ (unsigned char)*s++) * 1099511628211ull;
    return h;
}

void stoke__pn_warn_once(const char *what)
{
    uint64_t h = hash_str(what);
    pthread_mutex_lock(&stoke__pinned.lock);
    for (int i = 0; i < stoke__pinned.nwarned; i++) {
        if (stoke__pinned.warned_hash[i] == h) {
            pthread_mutex_unlock(&stoke__pinned.lock);
            return;
        }
    }
    if (stoke__pinned.nwarned < (int)STOKE__ARRAY_LEN(stoke__pinned.warned_hash))
        stoke__pinned.warned_hash[stoke__pinned.nwarned++] = h;
    pthread_mutex_unlock(&stoke__pinned.lock);
    stoke__log(STOKE_LOG_WARN, "%s", what);
}

void stoke__pn_warn_unpinned(const char *what)
{
    if (!atomic_exchange(&stoke__pinned.said_unpinned, 1))
        stoke__pn_warn_once(what);
}

int stoke__pn_target(const stoke_backend **vt, int *dev)
{
    const char *why = NULL;
    int rc = stoke__accel_current(vt, dev, &why);
    if (rc == STOKE_OK && !stoke__pinned.disabled)
        return STOKE_OK;
    if (rc == STOKE_OK)
        why = "STOKE_PINNED turns it off";
    else if (rc != STOKE_ENODEV)
        return rc;
    *vt = NULL;
    *dev = -1;
    /* The reason string of one registry selection is stable: skip the lock after the first. */
    if (atomic_load_explicit(&stoke__pinned.warned_why, memory_order_acquire) != why) {
        /* (a loader said "batches will not be pinned" for want of an accelerator already:
         * the same news; STOKE_PINNED's is other news) */
        if (rc != STOKE_OK && atomic_exchange(&stoke__pinned.said_unpinned, 1)) {
            atomic_store_explicit(&stoke__pinned.warned_why, why, memory_order_release);
            return STOKE_OK;
        }
        char msg[512];
        stoke__fmt(msg, sizeof(msg),
                   "pinned memory: pinning is not in effect (%s); "
                   "stoke_pinned_alloc returns ordinary page-aligned memory",
                   why && *why ? why : "no accelerator");
        stoke__pn_warn_once(msg);
        atomic_store_explicit(&stoke__pinned.warned_why, why, memory_order_release);
    }
    return STOKE_OK;
}

/* ---- pools -------------------------------------------------------------------------------- */

static pn_pool *pool_get(const stoke_backend *vt, int dev)
{
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_load_explicit(&stoke__pinned.pools[i], memory_order_acquire);
        if (!p)
            break;
        if (p->vt == vt && p->dev == dev)
            return p;
    }
    pthread_mutex_lock(&stoke__pinned.lock);
    pn_pool *found = NULL;
    int i;
    for (i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_load_explicit(&stoke__pinned.pools[i], memory_order_relaxed);
        if (!p)
            break;
        if (p->vt == vt && p->dev == dev) {
            found = p;
            break;
        }
    }
    if (!found && i < PN_MAX_POOLS) {
        found = aligned_alloc(PN_LINE, sizeof(*found));
        if (found) {
            memset(found, 0, sizeof(*found));
            found->vt = vt;
            found->dev = dev;
            for (int c = 0; c < PN_NCLASS; c++)
                pthread_mutex_init(&found->bins[c].lock, NULL);
            pthread_mutex_init(&found->wait_lock, NULL);
            atomic_store_explicit(&stoke__pinned.pools[i], found, memory_order_release);
        }
    }
    pthread_mutex_unlock(&stoke__pinned.lock);
    return found;
}

static void bin_push(pn_pool *p, pn_block *b)
{
    pn_bin *bin = &p->bins[b->cls];
    atomic_store_explicit(&b->state, PN_CACHED, memory_order_relaxed);
    /* Count before publishing: once in the bin, another thread may pop, free and recycle the
     * descriptor, so `b` must not be read after the unlock. */
    PN_ADD(bins_bytes, b->size);
    PN_ADD(bins_count, 1);
    pthread_mutex_lock(&bin->lock);
    b->next = bin->head;
    bin->head = b;
    bin->n++;
    pthread_mutex_unlock(&bin->lock);
}

static pn_block *bin_pop(pn_pool *p, int cls)
{
    pn_bin *bin = &p->bins[cls];
    pthread_mutex_lock(&bin->lock);
    pn_block *b = bin->head;
    if (b) {
        bin->head = b->next;
        bin->n--;
    }
    pthread_mutex_unlock(&bin->lock);
    if (b) {
        PN_SUB(bins_bytes, b->size);
        PN_SUB(bins_count, 1);
    }
    return b;
}

/* Gives a block back to its backend (or the system) for good. */
static void release_block(pn_block *b)
{
    void *ptr = (void *)atomic_load_explicit(&b->addr, memory_order_relaxed);
    stoke__pn_map_del(b);
    if (b->kind == PN_FALLBACK) {
        free(ptr);
    } else {
        pn_pool *p = b->pool;
        if (p->vt) {
            uint64_t t0 = stoke__now_ns();
            int rc = stoke__backend_rc(p->vt->host_free(p->dev, ptr));
            PN_ADD(unpin_ns, stoke__now_ns() - t0);
            PN_ADD(unpin_calls, 1);
            if (rc != STOKE_OK)
                stoke__log(STOKE_LOG_WARN,
                           "pinned: %s failed to free %zu pinned bytes at %p on "
                           "device %d: %s",
                           p->vt->name, b->size, ptr, p->dev, stoke_err_name(rc));
        } else {
            stoke__resident_free(ptr, b->size); /* a stand-in */
        }
        PN_SUB(bytes_reserved, b->size);
        PN_SUB(count_reserved, 1);
    }
    stoke__pn_desc_put(b);
}

static void wait_push(pn_pool *p, pn_block *b)
{
    atomic_store_explicit(&b->state, PN_WAITING, memory_order_relaxed);
    PN_ADD(bytes_waiting, b->size);
    PN_ADD(count_waiting, 1);
    pthread_mutex_lock(&p->wait_lock);
    b->next = p->waiting;
    p->waiting = b;
    atomic_fetch_add_explicit(&p->nwaiting, 1, memory_order_relaxed);
    pthread_mutex_unlock(&p->wait_lock);
}

/* Moves the pool's waiting blocks whose events all completed to its free lists.  Returns how
 * many moved.  Never blocks on an event. */
static int process_waiting(pn_pool *p)
{
    if (!atomic_load_explicit(&p->nwaiting, memory_order_relaxed))
        return 0;
    pthread_mutex_lock(&p->wait_lock);
    pn_block *list = p->waiting;
    p->waiting = NULL;
    pthread_mutex_unlock(&p->wait_lock);
    pn_block *still = NULL, *tail = NULL;
    int moved = 0;
    while (list) {
        pn_block *b = list;
        list = b->next;
        b->events = stoke__pn_drop_completed(b->events);
        if (b->events) {
            b->next = still;
            still = b;
            if (!tail)
                tail = b;
            continue;
        }
        atomic_fetch_sub_explicit(&p->nwaiting, 1, memory_order_relaxed);
        PN_SUB(bytes_waiting, b->size);
        PN_SUB(count_waiting, 1);
        if (b->kind == PN_FALLBACK) {
            release_block(b);
            continue;
        }
        bin_push(p, b);
        moved++;
    }
    if (still) {
        pthread_mutex_lock(&p->wait_lock);
        tail->next = p->waiting;
        p->waiting = still;
        pthread_mutex_unlock(&p->wait_lock);
    }
    return moved;
}

/* ---- thread caches ------------------------------------------------------------------------ */

static unsigned tc_max_per_class(int cls)
{
    return stoke__pinned_class_size(cls) <= ((size_t)1 << PN_SMALL_LOG_MAX) ? 8 : 2;
}

/* Detaches every block of `tc` (its lock held); returns them as a list. */
static pn_block *tc_take_all_locked(pn_tcache *tc)
{
    pn_block *all = NULL;
    for (int c = 0; c < PN_TC_NCLASS; c++) {
        while (tc->bins[c]) {
            pn_block *b = tc->bins[c];
            tc->bins[c] = b->next;
            b->next = all;
            all = b;
        }
        tc->n[c] = 0;
    }
    tc->bytes = 0;
    tc->count = 0;
    return all;
}

static void push_list(pn_pool *p, pn_block *list)
{
    while (list) {
        pn_block *b = list;
        list = b->next;
        bin_push(p, b);
    }
}

static void counters_add(pn_counters *dst, const pn_counters *src)
{
    dst->bytes_in_use += src->bytes_in_use;
    dst->count_in_use += src->count_in_use;
    dst->allocs += src->allocs;
    dst->frees += src->frees;
    dst->bytes_requested += src->bytes_requested;
    dst->hits += src->hits;
    dst->misses += src->misses;
}

/* Thread exit: the cache's blocks go to their pool, its counters to `retired`. */
static void tc_exit(void *arg)
{
    pn_tcache *tc = arg;
    tl_tc = NULL;
    tl_tc_dead = 1;
    pthread_mutex_lock(&stoke__pinned.lock);
    if (tc->prev)
        tc->prev->next = tc->next;
    else
        stoke__pinned.tcaches = tc->next;
    if (tc->next)
        tc->next->prev = tc->prev;
    pthread_mutex_lock(&tc->lock);
    counters_add(&stoke__pinned.retired, &tc->c);
    pn_block *all = tc_take_all_locked(tc);
    pn_pool *p = tc->pool;
    pthread_mutex_unlock(&tc->lock);
    if (p)
        push_list(p, all);
    pthread_mutex_unlock(&stoke__pinned.lock);
    pthread_mutex_destroy(&tc->lock);
    free(tc);
}

static pn_tcache *tc_get(void)
{
    pn_tcache *tc = tl_tc;
    if (tc || tl_tc_dead)
        return tc;
    tc = aligned_alloc(PN_LINE, sizeof(*tc));
    if (!tc)
        return NULL;
    memset(tc, 0, sizeof(*tc));
    pthread_mutex_init(&tc->lock, NULL);
    pthread_mutex_lock(&stoke__pinned.lock);
    tc->next = stoke__pinned.tcaches;
    if (stoke__pinned.tcaches)
        stoke__pinned.tcaches->prev = tc;
    stoke__pinned.tcaches = tc;
    pthread_mutex_unlock(&stoke__pinned.lock);
    pthread_setspecific(tc_key, tc);
    tl_tc = tc;
    return tc;
}

/* Takes a block of class `cls` of pool `p` idle in any thread's cache. */
static pn_block *steal(pn_pool *p, int cls)
{
    if (cls >= PN_TC_NCLASS)
        return NULL;
    pn_block *b = NULL;
    pthread_mutex_lock(&stoke__pinned.lock);
    for (pn_tcache *tc = stoke__pinned.tcaches; tc && !b; tc = tc->next) {
        pthread_mutex_lock(&tc->lock);
        if (tc->pool == p && tc->bins[cls]) {
            b = tc->bins[cls];
            tc->bins[cls] = b->next;
            tc->n[cls]--;
            tc->bytes -= b->size;
            tc->count--;
        }
        pthread_mutex_unlock(&tc->lock);
    }
    pthread_mutex_unlock(&stoke__pinned.lock);
    return b;
}

/* Moves every thread cache's blocks to the pools' free lists. */
static void flush_all_tcaches(void)
{
    pthread_mutex_lock(&stoke__pinned.lock);
    for (pn_tcache *tc = stoke__pinned.tcaches; tc; tc = tc->next) {
        pthread_mutex_lock(&tc->lock);
        pn_block *all = tc_take_all_locked(tc);
        pn_pool *p = tc->pool;
        pthread_mutex_unlock(&tc->lock);
        if (p)
            push_list(p, all);
    }
    pthread_mutex_unlock(&stoke__pinned.lock);
}

void stoke__pn_sum(pn_counters *c, uint64_t *tc_bytes, uint64_t *tc_count)
{
    uint64_t bytes = 0, count = 0;
    pthread_mutex_lock(&stoke__pinned.lock);
    *c = stoke__pinned.retired;
    for (pn_tcache *tc = stoke__pinned.tcaches; tc; tc = tc->next) {
        pthread_mutex_lock(&tc->lock);
        counters_add(c, &tc->c);
        bytes += tc->bytes;
        count += tc->count;
        pthread_mutex_unlock(&tc->lock);
    }
    pthread_mutex_unlock(&stoke__pinned.lock);
    if (tc_bytes)
        *tc_bytes = bytes;
    if (tc_count)
        *tc_count = count;
}

static void sample_peak_in_use(void)
{
    pn_counters c;
    stoke__pn_sum(&c, NULL, NULL);
    uint64_t now = c.bytes_in_use > 0 ? (uint64_t)c.bytes_in_use : 0;
    uint64_t peak = PN_GET(peak_bytes_in_use);
    while (now > peak &&
           !atomic_compare_exchange_weak(&stoke__pinned.peak_bytes_in_use, &peak, now)) {
    }
}

/* ---- the cap -------------------------------------------------------------------------------- */

/* Adds `n` to the bytes held if that stays within the cap.  STOKE_OK or STOKE_ELIMIT. */
static int reserve(uint64_t n)
{
    uint64_t limit = atomic_load_explicit(&stoke__pinned.limit, memory_order_relaxed);
    uint64_t cur = PN_GET(bytes_reserved);
    do {
        if (limit && cur + n > limit)
            return STOKE_ELIMIT;
    } while (!atomic_compare_exchange_weak_explicit(&stoke__pinned.bytes_reserved, &cur, cur + n,
                                                    memory_order_relaxed, memory_order_relaxed));
    PN_ADD(count_reserved, 1);
    return STOKE_OK;
}

/* Raises the peak to what is reserved now: after the block behind a reservation exists (a
 * failed allocation gives its reservation back and must not leave its size in the peak). */
static void note_peak(void)
{
    uint64_t now = PN_GET(bytes_reserved), peak = PN_GET(peak_bytes_reserved);
    while (now > peak &&
           !atomic_compare_exchange_weak(&stoke__pinned.peak_bytes_reserved, &peak, now)) {
    }
}

static void unreserve(uint64_t n)
{
    PN_SUB(bytes_reserved, n);
    PN_SUB(count_reserved, 1);
}

/* Releases idle blocks of pool `p`, largest classes first, until `need` more bytes fit under
 * the cap (need == SIZE_MAX: all of them).  Returns the number released. */
static size_t release_pool(pn_pool *p, size_t need)
{
    size_t released = 0;
    for (int c = PN_NCLASS - 1; c >= 0; c--) {
        for (;;) {
            if (need != SIZE_MAX) {
                uint64_t limit = atomic_load_explicit(&stoke__pinned.limit, memory_order_relaxed);
                if (!limit || PN_GET(bytes_reserved) + need <= limit)
                    return released;
            }
            pn_block *b = bin_pop(p, c);
            if (!b)
                break;
            release_block(b);
            released++;
        }
    }
    return released;
}

/* Makes room for `need` bytes (SIZE_MAX: releases every idle block): completed waiting blocks
 * become idle, thread caches are flushed, then idle blocks of the current pool `cur` and then
 * of the others are released.  Returns the number of blocks released. */
static size_t release_idle(pn_pool *cur, size_t need)
{
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_load_explicit(&stoke__pinned.pools[i], memory_order_acquire);
        if (!p)
            break;
        process_waiting(p);
    }
    flush_all_tcaches();
    size_t released = cur ? release_pool(cur, need) : 0;
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_load_explicit(&stoke__pinned.pools[i], memory_order_acquire);
        if (!p)
            break;
        if (p != cur)
            released += release_pool(p, need);
    }
    return released;
}

static void describe_memlock(char *buf, size_t len)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0)
        stoke__strlcpy(buf, "unknown", len);
    else if (rl.rlim_cur == RLIM_INFINITY)
        stoke__strlcpy(buf, "unlimited", len);
    else
        stoke__fmt(buf, len, "%llu bytes", (unsigned long long)rl.rlim_cur);
}

/* A new block of class `cls` for pool `p` (step 5): pinned, stand-in, or (past the cap, by
 * policy) a PN_FALLBACK block of pageable memory that is never cached. */
static int pin_new(pn_pool *p, int cls, pn_block **out)
{
    size_t size = stoke__pinned_class_size(cls);
    pn_block *b = stoke__pn_desc_get();
    if (!b)
        return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for a block descriptor");
    int rc = reserve(size);
    if (rc == STOKE_ELIMIT) {
        size_t n = release_idle(p, size);
        PN_ADD(limit_releases, n);
        rc = reserve(size);
    }
    void *mem = NULL;
    if (rc == STOKE_ELIMIT) {
        uint64_t limit = atomic_load_explicit(&stoke__pinned.limit, memory_order_relaxed);
        if (atomic_load_explicit(&stoke__pinned.policy, memory_order_relaxed) ==
            STOKE_PINNED_LIMIT_FAIL) {
            PN_ADD(limit_failures, 1);
            stoke__pn_desc_put(b);
            return stoke__fail(STOKE_ELIMIT,
                               "pinned: %zu more bytes would pass the cap of "
                               "%llu bytes (%llu held, none idle; STOKE_PINNED_LIMIT or "
                               "stoke_pinned_set_limit)",
                               size, (unsigned long long)limit,
                               (unsigned long long)PN_GET(bytes_reserved));
        }
        if (posix_memalign(&mem, page_size, size)) {
            stoke__pn_desc_put(b);
            return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for %zu pageable bytes", size);
        }
        char msg[256];
        stoke__fmt(msg, sizeof(msg),
                   "pinned memory: the cap of %llu bytes is reached; further "
                   "allocations past it are ordinary pageable memory (see the stats' "
                   "pageable_fallbacks)",
                   (unsigned long long)limit);
        stoke__pn_warn_once(msg);
        PN_ADD(pageable_fallbacks, 1);
        PN_ADD(pageable_fallback_bytes, size);
        b->kind = PN_FALLBACK;
        b->pool = p; /* only for its waiting list: never cached */
    } else if (p->vt) {
        for (int attempt = 0;; attempt++) {
            uint64_t t0 = stoke__now_ns();
            stoke__clear_error();
            rc = stoke__backend_rc(p->vt->host_alloc(p->dev, size, &mem));
            PN_ADD(pin_ns, stoke__now_ns() - t0);
            PN_ADD(pin_calls, 1);
            if (rc == STOKE_OK)
                break;
            PN_ADD(pin_failures, 1);
            /* Like a driver out of pinnable memory: give idle blocks back, try once more. */
            if (attempt == 0 && rc == STOKE_ENOMEM && release_idle(p, SIZE_MAX) > 0)
                continue;
            unreserve(size);
            stoke__pn_desc_put(b);
            /* The backend's own reason stands alone; only a failure it left unexplained gets
             * the memory-lock limit as a possible cause (naming it next to, say, an injected
             * fault would point at the wrong cause). */
            char detail[512], ml[64];
            stoke__strlcpy(detail, stoke_last_error(), sizeof(detail));
            if (detail[0])
                return stoke__fail(rc, "pinned: %s could not pin %zu bytes for device %d: %s",
                                   p->vt->name, size, p->dev, detail);
            describe_memlock(ml, sizeof(ml));
            return stoke__fail(rc,
                               "pinned: %s could not pin %zu bytes for device %d: %s "
                               "(RLIMIT_MEMLOCK: %s; the backend gave no detail)",
                               p->vt->name, size, p->dev, stoke_strerror(rc), ml);
        }
        b->kind = PN_PINNED;
        b->pool = p;
    } else { /* no accelerator: resident, as the pinned memory it stands in for would be */
        if (!(mem = stoke__resident_alloc(size))) {
            unreserve(size);
            stoke__pn_desc_put(b);
            return stoke__fail(STOKE_ENOMEM, "pinned: out of memory for %zu bytes", size);
        }
        PN_ADD(standin_allocs, 1);
        b->kind = PN_STANDIN;
        b->pool = p;
    }
    if (b->kind != PN_FALLBACK)
        note_peak();
    b->size = size;
    b->cls = cls;
    atomic_store_explicit(&b->addr, (uintptr_t)mem, memory_order_release);
    rc = stoke__pn_map_put(b);
    if (rc != STOKE_OK) {
        release_block(b);
        return rc;
    }
    *out = b;
    return STOKE_OK;
}

/* ---- the API ------------------------------------------------------------------------------ */

/* An allocation for (vt, dev) (vt NULL: the stand-in pool), out checked and init done.
 * `rekey`: the thread now works for (vt, dev), so its cache moves to that pool when it holds
 * another's blocks; otherwise (stoke__pinned_alloc_on: one allocation for a device the thread
 * does not use) a cache of another pool is left as it is and not used. */
static int alloc_in(const stoke_backend *vt, int dev, size_t size, void **out, int rekey)
{
    int rc;
    int cls = stoke__pinned_class(size);
    if (cls < 0)
        return stoke__fail(STOKE_ENOMEM,
                           "stoke_pinned_alloc: %zu bytes is above the largest "
                           "size class",
                           size);
    pn_tcache *tc = tc_get();
    pn_pool *p = tc && tc->pool && tc->pool->vt == vt && tc->pool->dev == dev ? tc->pool : NULL;
    pn_block *b = NULL;
    int use_tc = tc != NULL; /* its ready blocks are of p */
    if (!p) {
        p = pool_get(vt, dev);
        if (!p)
            return stoke__fail(STOKE_ENOMEM,
                               "pinned: no memory for the pool of %s device %d "
                               "(or more than %d backend/device pairs)",
                               vt ? vt->name : "none", dev, PN_MAX_POOLS);
        if (tc && rekey) { /* the thread now works for another (backend, device) */
            pthread_mutex_lock(&tc->lock);
            pn_block *old = tc_take_all_locked(tc);
            pn_pool *oldp = tc->pool;
            tc->pool = p;
            pthread_mutex_unlock(&tc->lock);
            if (oldp)
                push_list(oldp, old);
        } else {
            use_tc = 0;
        }
    }
    int hit = 1;
    if (use_tc) {
        pthread_mutex_lock(&tc->lock);
        if (cls < PN_TC_NCLASS && (b = tc->bins[cls]) != NULL) {
            tc->bins[cls] = b->next;
            tc->n[cls]--;
            tc->bytes -= b->size;
            tc->count--;
            tc->c.allocs++;
            tc->c.hits++;
            tc->c.bytes_requested += size;
            tc->c.bytes_in_use += (int64_t)b->size;
            tc->c.count_in_use++;
            pthread_mutex_unlock(&tc->lock);
            goto done;
        }
        pthread_mutex_unlock(&tc->lock);
    }
    b = bin_pop(p, cls);
    if (!b && process_waiting(p) > 0)
        b = bin_pop(p, cls);
    if (!b)
        b = steal(p, cls);
    if (!b) {
        hit = 0;
        rc = pin_new(p, cls, &b);
        if (rc != STOKE_OK)
            return rc;
    }
    pn_counters *c = tc ? &tc->c : &stoke__pinned.retired;
    pthread_mutex_t *m = tc ? &tc->lock : &stoke__pinned.lock;
    pthread_mutex_lock(m);
    c->allocs++;
    c->hits += (uint64_t)hit;
    c->misses += (uint64_t)!hit;
    c->bytes_requested += size;
    c->bytes_in_use += (int64_t)b->size;
    c->count_in_use++;
    pthread_mutex_unlock(m);
    if (!hit)
        sample_peak_in_use();
done:
    b->next = NULL;
    atomic_store_explicit(&b->state, PN_LIVE, memory_order_release);
    *out = (void *)atomic_load_explicit(&b->addr, memory_order_relaxed);
    return STOKE_OK;
}

int stoke_pinned_alloc(size_t size, void **out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_alloc: out is NULL");
    *out = NULL;
    stoke__pn_ensure_init();
    const stoke_backend *vt;
    int dev;
    int rc = stoke__pn_target(&vt, &dev);
    if (rc != STOKE_OK)
        return rc;
    return alloc_in(vt, dev, size, out, 1);
}

int stoke__pinned_alloc_on(const stoke_backend *vt, int dev, size_t size, void **out)
{
    if (!out || !vt)
        return stoke__fail(STOKE_EINVAL, "stoke__pinned_alloc_on: NULL argument");
    *out = NULL;
    stoke__pn_ensure_init();
    return alloc_in(vt, dev, size, out, 0);
}

int stoke_pinned_free(void *ptr)
{
    if (!ptr)
        return STOKE_OK;
    pn_block *b = stoke__pn_map_get(ptr);
    int expect = PN_LIVE;
    if (b && !atomic_compare_exchange_strong(&b->state, &expect, PN_CACHED) && expect == PN_FOREIGN)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_pinned_free(%p): allocated before process %d forked this "
                           "one; it is that process's (or an earlier one's) to free",
                           ptr, parent_pid);
    if (!b || expect != PN_LIVE)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_pinned_free(%p): not a live block of "
                           "stoke_pinned_alloc (foreign or interior pointer, or freed twice)",
                           ptr);
    pn_tcache *tc = tc_get();
    size_t size = b->size;
    int cls = b->cls;
    /* Events recorded for the block: the completed ones go back to the pool right away.  The
     * state CAS above and this load are seq_cst, record_stream sets the flag before it checks
     * the state: without the flag no event can be attached, and the lock is skipped. */
    pn_evnode *ev = NULL;
    if (atomic_load(&b->has_events)) {
        pthread_mutex_t *sm = stoke__pn_stripe_of(b);
        pthread_mutex_lock(sm);
        ev = b->events;
        b->events = NULL;
        atomic_store(&b->has_events, 0);
        pthread_mutex_unlock(sm);
        if (ev)
            ev = stoke__pn_drop_completed(ev);
    }

    int cached = 0;
    if (tc) {
        pthread_mutex_lock(&tc->lock);
        if (!tc->pool && b->kind != PN_FALLBACK)
            tc->pool = b->pool;
        if (!ev && b->kind != PN_FALLBACK && tc->pool == b->pool && cls < PN_TC_NCLASS &&
            tc->n[cls] < tc_max_per_class(cls) && tc->bytes + size <= PN_TC_MAX_BYTES) {
            b->next = tc->bins[cls];
            tc->bins[cls] = b;
            tc->n[cls]++;
            tc->bytes += size;
            tc->count++;
            cached = 1;
        }
        tc->c.frees++;
        tc->c.bytes_in_use -= (int64_t)size;
        tc->c.count_in_use--;
        pthread_mutex_unlock(&tc->lock);
    } else {
        pthread_mutex_lock(&stoke__pinned.lock);
        stoke__pinned.retired.frees++;
        stoke__pinned.retired.bytes_in_use -= (int64_t)size;
        stoke__pinned.retired.count_in_use--;
        pthread_mutex_unlock(&stoke__pinned.lock);
    }
    if (cached)
        return STOKE_OK;
    if (ev) {
        b->events = ev;
        wait_push(b->pool, b);
    } else if (b->kind == PN_FALLBACK) {
        release_block(b);
    } else {
        bin_push(b->pool, b);
    }
    return STOKE_OK;
}

size_t stoke_pinned_round_size(size_t size)
{
    stoke__pn_ensure_init();
    int cls = stoke__pinned_class(size);
    return cls < 0 ? 0 : stoke__pinned_class_size(cls);
}

int stoke_pinned_set_limit(uint64_t bytes, int policy)
{
    if (policy != STOKE_PINNED_LIMIT_FALLBACK && policy != STOKE_PINNED_LIMIT_FAIL)
        return stoke__fail(STOKE_EINVAL, "stoke_pinned_set_limit: unknown policy %d", policy);
    stoke__pn_ensure_init();
    pthread_mutex_lock(&stoke__pinned.lock);
    stoke__pinned.limit_from_api = 1;
    atomic_store(&stoke__pinned.limit, bytes);
    atomic_store(&stoke__pinned.policy, policy);
    pthread_mutex_unlock(&stoke__pinned.lock);
    return STOKE_OK;
}

int stoke_pinned_get_limit(uint64_t *bytes, int *policy)
{
    stoke__pn_ensure_init();
    if (bytes)
        *bytes = atomic_load(&stoke__pinned.limit);
    if (policy)
        *policy = atomic_load(&stoke__pinned.policy);
    return STOKE_OK;
}

int stoke_pinned_empty_cache(void)
{
    stoke__pn_ensure_init();
    release_idle(NULL, SIZE_MAX);
    return STOKE_OK;
}

/* ---- reset (tests) ------------------------------------------------------------------------- */

static void release_with_events(pn_block *b)
{
    pn_evnode *ev = b->events;
    b->events = NULL;
    for (pn_evnode *n = ev; n; n = n->next)
        stoke_event_synchronize(n->ev);
    while (ev) {
        pn_evnode *next = ev->next;
        stoke_event_destroy(ev->ev);
        free(ev);
        ev = next;
    }
    release_block(b);
}

static void release_live(pn_block *b)
{
    release_with_events(b);
}

void stoke__pinned_reset(void)
{
    pthread_once(&once, once_init);
    /* Thread caches stay registered (their threads still point at them) but are emptied. */
    pthread_mutex_lock(&stoke__pinned.lock);
    for (pn_tcache *tc = stoke__pinned.tcaches; tc; tc = tc->next) {
        pthread_mutex_lock(&tc->lock);
        pn_block *all = tc_take_all_locked(tc);
        tc->pool = NULL;
        memset(&tc->c, 0, sizeof(tc->c));
        pthread_mutex_unlock(&tc->lock);
        while (all) {
            pn_block *b = all;
            all = b->next;
            release_block(b);
        }
    }
    memset(&stoke__pinned.retired, 0, sizeof(stoke__pinned.retired));
    pthread_mutex_unlock(&stoke__pinned.lock);
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_load(&stoke__pinned.pools[i]);
        if (!p)
            continue;
        release_pool(p, SIZE_MAX);
        while (p->waiting) {
            pn_block *b = p->waiting;
            p->waiting = b->next;
            release_with_events(b);
        }
    }
    stoke__pn_live_foreach(release_live);
    for (int i = 0; i < PN_MAX_POOLS; i++) {
        pn_pool *p = atomic_exchange(&stoke__pinned.pools[i], NULL);
        if (!p)
            continue;
        for (int c = 0; c < PN_NCLASS; c++)
            pthread_mutex_destroy(&p->bins[c].lock);
        pthread_mutex_destroy(&p->wait_lock);
        free(p);
    }
    pthread_mutex_lock(&stoke__pinned.evlock);
    pn_evnode *ev = stoke__pinned.evfree;
    stoke__pinned.evfree = NULL;
    stoke__pinned.nevfree = 0;
    pthread_mutex_unlock(&stoke__pinned.evlock);
    stoke__pn_destroy_events(ev);
    stoke__pn_reg_reset();
    stoke__pn_map_reset();
    pthread_mutex_lock(&stoke__pinned.lock);
#define PN_ZERO(name) atomic_store(&stoke__pinned.name, 0);
    PN_ATOMIC_COUNTERS(PN_ZERO)
#undef PN_ZERO
    stoke__pinned.nwarned = 0;
    atomic_store(&stoke__pinned.warned_why, NULL);
    atomic_store(&stoke__pinned.said_unpinned, 0);
    stoke__pinned.limit_from_api = 0;
    atomic_store(&stoke__pinned.limit, 0);
    atomic_store(&stoke__pinned.policy, STOKE_PINNED_LIMIT_FALLBACK);
    stoke__pinned.disabled = 0;
    atomic_store(&stoke__pinned.inited, 0);
    pthread_mutex_unlock(&stoke__pinned.lock);
}
