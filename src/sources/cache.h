/* Private to the built-in sources: the local cache of remote files (cache.c; its read-ahead:
 * cache_ahead.c), shared by the processes of a node through the file system.  See
 * docs/sources.md, "Remote shards", "The cache".
 *
 * With STOKE_CACHE_DIR set, a remote file is downloaded whole into that directory (through
 * stoke__remote_fetch) and read from there; the copy is reused by every later reader, in this
 * process or another, this run or a later one.  The directory holds, per file (HASH: 32 hex
 * digits of the URL without credentials, an s3:// key with its endpoint):
 *     HASH-BASE   the complete copy (BASE: the URL's last path segment, made file-name safe)
 *     HASH.part   a download in progress (renamed to HASH-BASE only once complete and of the
 *                 size the server said)
 *     HASH.lock   flock'ed exclusively by the one process downloading it
 * and stoke-cache.lock, flock'ed while an eviction scans the directory.  A reader holds a
 * shared flock on the copy it has open: eviction (least recently used first, by the access
 * time a reader sets) removes only copies it can lock exclusively.
 *
 * stoke_cache_list and stoke_cache_clear (sources.h) read and empty such a directory.
 *
 * Each cache object keeps, per worker slot (slot % 64), the copy that slot read last open, so
 * that consecutive reads of one file cost a pread. */
#ifndef STOKE_SOURCES_CACHE_H
#define STOKE_SOURCES_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "sources/remote.h"
#include "stoke/sources.h"

typedef struct stoke__cache stoke__cache;

/* From STOKE_CACHE_DIR (created with its parents when missing) and STOKE_CACHE_LIMIT: 0 with
 * *out NULL when STOKE_CACHE_DIR is unset or empty; 0 and *out; or STOKE_EIO (the directory
 * cannot be made or opened), STOKE_ENOMEM, with why set. */
int stoke__cache_create(stoke__cache **out, char *why, size_t why_len);
/* Stops the background downloads (waiting for those running to end, dropping the queued
 * ones), closes the copies held open.  NULL does nothing.  No read may run. */
void stoke__cache_destroy(stoke__cache *c);
/* Fork hooks, as the pool's: prepare takes every slot's lock (so no download, lock file or
 * eviction is half done in the child), parent releases them, child releases them and closes
 * the copies it inherited (the parent's stay open, and locked, in the parent).  prepare also
 * waits for the background downloads running to end (the queued ones wait); the child has
 * none running or queued, and starts none (no read-ahead in a forked worker: it ends with
 * _exit, which would cut its downloads short). */
void stoke__cache_fork_prepare(stoke__cache *c);
void stoke__cache_fork_parent(stoke__cache *c);
void stoke__cache_fork_child(stoke__cache *c);

/* Reads n bytes at off of the cached copy of f into buf through slot `slot`, downloading f
 * whole through pool p first when the cache has no complete copy of it (one process
 * downloads, the others wait for it and read its copy).  expect: the size the file must have
 * (0: any; a copy of another size is downloaded again).  Returns 0, *got = n or fewer where
 * the file ends, *size (may be NULL) the file's size; or the download's error
 * (stoke__remote_fetch: "GET URL: HTTP 500: ... (after N tries)"), or STOKE_EIO for the cache's
 * own ("cache DIR: cannot create HASH.part: No space left on device"), with why set.
 * Thread-safe; reads of one slot are serialised. */
int stoke__cache_read(stoke__cache *c, stoke__remote_pool *p, int slot, const stoke__remote_file *f,
                      uint64_t expect, void *buf, size_t n, uint64_t off, size_t *got,
                      uint64_t *size, char *why, size_t why_len);

/* 1 when the cache has a complete copy of f (of any size), else 0.  Thread-safe. */
int stoke__cache_has(stoke__cache *c, const stoke__remote_file *f);

/* Read-ahead (set_order below): downloads queued (expect[i]: as stoke__cache_read's) for
 * background threads, STOKE_REMOTE_CONNECTIONS of them (default 8; 0: none),
 * each with its own connection (slot STOKE__REMOTE_BG(k) of pool p), started by the first
 * call.  A file already queued or downloading is not queued again; at most
 * STOKE__CACHE_QUEUE_MAX wait.  A background download follows the rules of a read's (lock
 * file, temporary name, length check, one download per node) but never waits for another
 * process's download of the file and never evicts: a file that does not fit under the cap
 * beside the copies there is left to the read that needs it (its size, when not given, is
 * taken as the largest copy seen).  Failures are left to the reads too (logged at debug).
 * Queueing never blocks on the network; the pool must outlive c. */
#define STOKE__CACHE_QUEUE_MAX 256
/* Queues downloads of f[0 .. n) (NULL entries skipped; the first STOKE_REMOTE_CONNECTIONS
 * only) for the background threads, as above, for a reader that knows its own order (the
 * streaming mode: a worker's next shards).  Returns
 * the jobs queued (0 in a forked worker process, or with STOKE_REMOTE_CONNECTIONS=0). */
size_t stoke__cache_prefetch(stoke__cache *c, stoke__remote_pool *p,
                             const stoke__remote_file *const *f, const uint64_t *expect, size_t n);
/* The order the reads of files are expected in (the shards of a source): a read that finds
 * no complete copy of f[i] (it downloads it, or waits for it) queues f[i + 1 ..] up to
 * STOKE_REMOTE_CONNECTIONS of them for background threads, so that the downloads of the next
 * files overlap it.  The pointers are kept (they must outlive c, or the next set_order);
 * expect as stoke__cache_read's (may be NULL).  STOKE_OK or STOKE_ENOMEM.  Thread-safe. */
int stoke__cache_set_order(stoke__cache *c, const stoke__remote_file *const *f,
                           const uint64_t *expect, size_t n);

/* Removes f's copy (a copy whose bytes are found bad: a walk of it failed, as a copy that a
 * power cut left truncated or zero-filled after its rename would), so that the next read
 * downloads f again; the slots reading it let it go (readers elsewhere keep their open
 * descriptor).  0 or -errno. */
int stoke__cache_forget(stoke__cache *c, const stoke__remote_file *f);

/* Counters of a cache object since create, its forked workers' included. */
typedef struct stoke__cache_stats {
    uint64_t hits;      /* a file opened from the cache (found complete, or completed while
                           waiting for another's download) */
    uint64_t misses;    /* a file downloaded by this object */
    uint64_t evictions; /* copies removed to stay under the cap */
    uint64_t bytes;     /* bytes downloaded */
    uint64_t wait_ns;   /* time waiting for another process's download of a file */
} stoke__cache_stats;
void stoke__cache_stats_get(const stoke__cache *c, stoke__cache_stats *out);

#endif
