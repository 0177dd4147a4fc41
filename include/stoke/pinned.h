/* stoke — pinned host memory, always pinned for the current accelerator.
 *
 * Every function routes to the chosen accelerator (see accelerator.h) and the calling thread's
 * current device (stoke_device_set); none takes a device argument, and none touches a device
 * other than the current one when it pins.  With no accelerator, or with STOKE_PINNED=0,
 * allocations are ordinary page-aligned memory, stoke_is_pinned() is false for them, and ONE
 * warning (per process and reason) says that pinning is not in effect and why.
 *
 * Caching.  Pinning is expensive (a driver call, page locking, often a driver-wide lock), so
 * freed blocks are kept and reused.  A block remembers the backend and device it was pinned for
 * and returns to that (backend, device) cache; a request is served only from the cache of the
 * current (backend, device).  Requests are rounded up to a size class:
 *
 *     request                      class sizes                             waste at most
 *     0 .. 4 KiB                   4 KiB (or the page size if larger)      -
 *     4 KiB .. 1 MiB               powers of two: 8, 16, 32 ... 1024 KiB   < 50 % (< 512 KiB)
 *     above 1 MiB                  four classes per power of two:          < 25 %
 *                                  2^n * 5/4, 6/4, 7/4, 8/4
 *                                  (1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4 MiB, 5, 6, 7, 8 MiB, ...)
 *     above 64 TiB                 refused (STOKE_ENOMEM)
 *
 * stoke_pinned_round_size() gives the class of a request.  The byte counts in the stats are
 * class sizes (what is really pinned), except bytes_requested.
 *
 * Event-guarded reuse.  stoke_pinned_record_stream() records an event on a stream for a block
 * (e.g. after queueing an asynchronous copy from it).  A block freed while such an event is
 * pending waits; it becomes reusable only when every recorded event has completed, which is
 * checked with non-blocking queries when memory is needed (an allocation never blocks on it).
 *
 * Cap.  STOKE_PINNED_LIMIT (bytes, K/M/G suffixes) or stoke_pinned_set_limit() bounds the bytes
 * held from the backend (in use + cached + waiting).  When a new block would pass the cap, idle
 * cached blocks are released first; if that is not enough the allocation fails with
 * STOKE_ELIMIT or returns ordinary pageable memory (one warning), as the policy says.
 *
 * Thread-safety: every function here may be called from any thread at the same time.  A
 * cached alloc+free pair takes only a per-thread lock (never contended except by
 * stoke_pinned_empty_cache / stats / the cap reaching into that thread's small cache).
 */
#ifndef STOKE_PINNED_H
#define STOKE_PINNED_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/device.h"
#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates at least `size` bytes of host memory pinned for the current accelerator and device,
 * reusing a cached block when one is ready.  *out is page-aligned and stays valid until
 * stoke_pinned_free; its usable size is stoke_pinned_round_size(size).  size 0 gives the
 * smallest class.
 * Returns STOKE_OK; STOKE_EINVAL (out NULL); STOKE_ENOMEM (system out of memory, or size above
 * the largest class); STOKE_ELIMIT (the cap was reached and the policy is
 * STOKE_PINNED_LIMIT_FAIL); the backend's code (e.g. STOKE_ENOMEM, STOKE_EBACKEND) when pinning
 * failed (after one retry that releases idle blocks when it was STOKE_ENOMEM), with the
 * driver's reason in stoke_last_error() (RLIMIT_MEMLOCK instead when it gave none); STOKE_ENOMEM also when the
 * allocator's own bookkeeping fails (including more than its fixed number of distinct
 * backend/device pairs); STOKE_ENOENT / STOKE_ERANGE / STOKE_EINVAL when STOKE_ACCELERATOR is
 * invalid.  *out is NULL on failure.  Without an accelerator it succeeds with ordinary memory
 * (see above); past the cap with the FALLBACK policy, with pageable memory.  The caller owns
 * the block until stoke_pinned_free (from any thread).  Thread-safe. */
STOKE_API int stoke_pinned_alloc(size_t size, void **out);

/* Returns a block from stoke_pinned_alloc to the cache of the backend and device it was pinned
 * for (from any thread).  If events recorded for it are pending, it is parked until they
 * complete and only then reused; the call itself never blocks.  Ownership returns to the
 * allocator: the caller must not touch the block afterwards.  NULL does nothing (STOKE_OK).
 * Returns STOKE_OK, or STOKE_EINVAL when `ptr` is not a live block of this allocator (not
 * from stoke_pinned_alloc, an interior pointer, or already freed).  Thread-safe. */
STOKE_API int stoke_pinned_free(void *ptr);

/* Records that the work queued so far on stream `s` reads or writes the block that starts at
 * `ptr` (a live block from stoke_pinned_alloc): after stoke_pinned_free the block is reused only
 * once that work has completed.  Events are taken from a pool, not created per call.  The stream
 * may belong to any device of the accelerator.  Returns STOKE_OK; STOKE_EINVAL (NULL argument,
 * `ptr` not the start of a live block, or the block freed by another thread during the call);
 * STOKE_ENOTSUP (the backend has no events); STOKE_ENOMEM; the backend's code when creating
 * or recording the event failed.  The allocator owns the event; `s` is not kept beyond the
 * event.  Thread-safe (the stream itself must not be used by two threads at once, see
 * device.h). */
STOKE_API int stoke_pinned_record_stream(void *ptr, stoke_stream *s);

/* 1 if `ptr` lies inside memory pinned for the accelerator (a block from stoke_pinned_alloc,
 * cached or live, or a range from stoke_pin_register), else 0 (also for NULL, ordinary memory,
 * stand-in and pageable-fallback blocks).  Memory pinned for a backend that is no longer the
 * chosen accelerator still counts, for every address inside it.  The start of a block is
 * answered from the block itself; any other address by the current accelerator's backend, then
 * the registered ranges, then the other backends that pinned blocks.  Never fails.
 * Thread-safe. */
STOKE_API int stoke_is_pinned(const void *ptr);

/* Pins the caller's memory [ptr, ptr+len) for the current accelerator and device, so that
 * copies from it are asynchronous; the caller keeps ownership and must call
 * stoke_pin_unregister(ptr) before freeing it.  Without an accelerator (or with STOKE_PINNED=0)
 * nothing is pinned, the one warning is logged and STOKE_OK is returned (unregister then also
 * succeeds).  Returns STOKE_OK; STOKE_EINVAL (NULL, len 0, or `ptr` already registered: only
 * the same start address is detected, not overlapping ranges); STOKE_ENOTSUP (the backend
 * cannot register memory); STOKE_ENOMEM; STOKE_ENOENT / STOKE_ERANGE / STOKE_EINVAL when
 * STOKE_ACCELERATOR is invalid; the backend's code on failure (nothing is then registered).
 * Thread-safe. */
STOKE_API int stoke_pin_register(void *ptr, size_t len);

/* Undoes stoke_pin_register(ptr, ...) on the backend and device it was registered for (whatever
 * the current selection is now).  Returns STOKE_OK, STOKE_EINVAL if `ptr` (NULL included) was
 * not registered, or the backend's code, with its detail in the last error; the range then
 * stays registered (and counted), still pinned as far as stoke knows.  Thread-safe. */
STOKE_API int stoke_pin_unregister(void *ptr);

/* The size class a request of `size` bytes is rounded up to (the table above), or 0 if `size`
 * is above the largest class.  Thread-safe. */
STOKE_API size_t stoke_pinned_round_size(size_t size);

/* What happens when a new block would pass the cap and releasing idle blocks is not enough. */
typedef enum stoke_pinned_limit_policy {
    STOKE_PINNED_LIMIT_FALLBACK = 0, /* default: return ordinary pageable memory (is_pinned 0),
                                        counted in pageable_fallbacks, one warning */
    STOKE_PINNED_LIMIT_FAIL = 1      /* fail with STOKE_ELIMIT, counted in limit_failures */
} stoke_pinned_limit_policy;

/* Sets the cap on bytes held from the backend (0: no cap) and the policy; overrides
 * STOKE_PINNED_LIMIT.  Blocks already held are not released by this call (the next allocation
 * that needs room releases idle ones).  Returns STOKE_OK or STOKE_EINVAL (unknown policy).
 * Thread-safe. */
STOKE_API int stoke_pinned_set_limit(uint64_t bytes, int policy);
/* Current cap (0: none) and policy; either pointer may be NULL.  Always returns STOKE_OK.
 * Thread-safe. */
STOKE_API int stoke_pinned_get_limit(uint64_t *bytes, int *policy);

/* Releases every idle cached block (of every backend and device, including those in the
 * per-thread caches) back to its backend.  Live blocks and blocks still waiting on events are
 * never released.  Returns STOKE_OK.  Thread-safe. */
STOKE_API int stoke_pinned_empty_cache(void);

#define STOKE_PINNED_STATS_VERSION 2

/* Counters since the process started.  Appended to only; `version` says what is filled.
 * Byte counts are class sizes unless named "requested".  Counts are exact, except
 * peak_bytes_in_use, which is sampled when a block is pinned and when stats are read. */
typedef struct stoke_pinned_stats {
    uint32_t size;    /* set by the caller to sizeof(stoke_pinned_stats) */
    uint32_t version; /* set by stoke: STOKE_PINNED_STATS_VERSION */
    char backend[32]; /* the current accelerator ("simdev"), or "none" when allocations are
                         ordinary memory (no accelerator or STOKE_PINNED=0) */
    uint64_t limit_bytes;       /* the cap, 0 = none */
    uint64_t limit_policy;      /* stoke_pinned_limit_policy */
    uint64_t bytes_in_use;      /* handed out and not yet freed (all kinds of block) */
    uint64_t count_in_use;
    uint64_t peak_bytes_in_use; /* sampled, see above */
    uint64_t bytes_reserved;    /* held from backends (or stand-in memory): in use + cached +
                                   waiting; the cap applies to this */
    uint64_t count_reserved;
    uint64_t peak_bytes_reserved;
    uint64_t bytes_cached;      /* idle and ready for reuse */
    uint64_t count_cached;
    uint64_t bytes_waiting;     /* freed, but events recorded for them are still pending */
    uint64_t count_waiting;
    uint64_t total_allocs;      /* successful stoke_pinned_alloc calls */
    uint64_t total_frees;
    uint64_t bytes_requested;   /* sum of requested sizes */
    uint64_t cache_hits;        /* allocations served from a cached block */
    uint64_t cache_misses;      /* allocations that needed a new block */
    uint64_t pin_calls;         /* backend allocations (host_alloc) */
    uint64_t pin_ns;            /* time spent in them */
    uint64_t pin_failures;      /* host_alloc calls that failed */
    uint64_t unpin_calls;       /* backend frees (host_free) */
    uint64_t unpin_ns;
    uint64_t standin_allocs;    /* new blocks of ordinary memory because pinning is off */
    uint64_t pageable_fallbacks;/* allocations given pageable memory because of the cap */
    uint64_t pageable_fallback_bytes;
    uint64_t limit_failures;    /* allocations failed with STOKE_ELIMIT */
    uint64_t limit_releases;    /* idle blocks released to stay under the cap */
    uint64_t events_recorded;   /* stoke_pinned_record_stream calls that recorded an event */
    uint64_t events_created;    /* events created for the event pool */
    uint64_t registered_count;  /* ranges currently registered by stoke_pin_register */
    uint64_t registered_bytes;
    /* version 2 */
    uint64_t register_failures; /* stoke_pin_register calls the backend refused (pin_failures
                                   counts allocations only) */
} stoke_pinned_stats;

/* Fills *out (caller's memory; at most out->size bytes; out->size is set to the bytes filled,
 * out->version to the newest version whose members all fit in them).
 * Returns STOKE_OK or STOKE_EINVAL (NULL, or size smaller than the first two members).
 * Thread-safe; the counters are read one after another, not as one atomic snapshot. */
STOKE_API int stoke_pinned_stats_get(stoke_pinned_stats *out);

/* Writes the stats as one JSON object ({"version":2,"backend":"simdev","bytes_in_use":...}, the
 * member names of stoke_pinned_stats) into buf[len], NUL-terminated.  *needed (may be NULL) gets
 * the length without the NUL.  buf may be NULL with len 0 to ask for the length (this returns
 * STOKE_ERANGE with *needed set).  Returns STOKE_OK, STOKE_ERANGE when len is too small (buf
 * then holds a truncated string if len > 0), STOKE_EINVAL (buf NULL with len > 0).
 * Thread-safe. */
STOKE_API int stoke_pinned_stats_json(char *buf, size_t len, size_t *needed);

#ifdef __cplusplus
}
#endif
#endif
