/* Private to the cache of remote files: cache.c (locks, the directory's scan and eviction, a
 * file's download, reads, the object), cache_names.c (the files' names) and cache_ahead.c (the
 * read-ahead: the background downloaders and their queue).  See cache.h. */
#ifndef STOKE_SOURCES_CACHE_INTERNAL_H
#define STOKE_SOURCES_CACHE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "sources/cache.h"
#include "sources/remote.h"

#define STOKE__CACHE_SLOTS 64 /* the copies held open: one per worker slot, slot % 64 */

/* ---- cache_names.c: the names of a file's copy, download and lock ---- */

#define STOKE__CACHE_HEXLEN   32
#define STOKE__CACHE_NAME_MAX (STOKE__CACHE_HEXLEN + 1 + 96) /* HASH-BASE, BASE cut to 96 */

typedef struct stoke__cache_names {
    char hex[STOKE__CACHE_HEXLEN + 1];
    char data[STOKE__CACHE_NAME_MAX + 1]; /* HASH-BASE: the complete copy */
    char part[STOKE__CACHE_HEXLEN + 6];   /* HASH.part: a download in progress */
    char lock[STOKE__CACHE_HEXLEN + 6];   /* HASH.lock: its downloader's lock */
} stoke__cache_names;

void stoke__cache_names_of(const stoke__remote_file *f, stoke__cache_names *nm);

/* What a directory entry is: another file, a copy, a download, a lock. */
enum { K_OTHER, K_DATA, K_PART, K_LOCK };
int stoke__cache_kind_of(const char *name);

typedef struct stoke__cache_held {
    pthread_mutex_t lock;        /* held for a whole read: guards f, fd and size */
    const stoke__remote_file *f; /* the file fd is the copy of; NULL: none */
    int fd;                      /* -1, or the copy, flock'ed shared */
    uint64_t size;
} stoke__cache_held;

typedef struct stoke__cache_counters {
    _Atomic uint64_t hits, misses, evictions, bytes, wait_ns;
} stoke__cache_counters;

/* A download asked for ahead of its reads. */
typedef struct stoke__cache_job {
    const stoke__remote_file *f;
    uint64_t expect;
} stoke__cache_job;

/* The background downloaders: threads started by the first prefetch (and again after a fork,
 * in the child), each with its own slot of the pool, taking jobs from a queue. */
typedef struct stoke__cache_downloader {
    pthread_mutex_t lock;  /* guards all below */
    pthread_cond_t work;   /* a job was queued, or stop */
    pthread_cond_t idle;   /* a job ended */
    stoke__remote_pool *p; /* the pool of the queued jobs */
    stoke__cache_job q[STOKE__CACHE_QUEUE_MAX];
    size_t head, len;                           /* q[head .. head + len) (mod the size) */
    stoke__cache_job run[STOKE__REMOTE_BG_MAX]; /* the jobs running, f NULL where none */
    int running;                                /* of them */
    pthread_t th[STOKE__REMOTE_BG_MAX];
    int nth, stop;
    int paused; /* a fork is being prepared: no job starts */
    pid_t pid;  /* the process the threads run in (a fork the hooks did not see has none) */
    int ready;  /* lock and conditions initialised */
    const stoke__remote_file **order; /* the files in the order their reads come (set_order) */
    uint64_t *order_expect;
    size_t norder;
} stoke__cache_downloader;

struct stoke__cache {
    char *dir;
    int dfd;                  /* the directory: every name is opened relative to it */
    uint64_t limit;           /* 0: keep a tenth of the file system free */
    int connections;          /* background downloads at once (STOKE_REMOTE_CONNECTIONS) */
    _Atomic uint64_t largest; /* the largest copy this object opened or made: the room a
                                 download of a file of unknown size is assumed to need */
    stoke__cache_counters *n; /* a shared mapping: a forked worker's counts reach the parent */
    _Atomic int no_attr;      /* a copy's version could not be kept (said once) */
    stoke__cache_held h[STOKE__CACHE_SLOTS];
    stoke__cache_downloader d;
};

/* cache.c: the copy of f, locked shared (*out, *size): from the cache, or downloaded (its
 * version kept with it).  Where the pool compares versions, a copy of another version than
 * f's (pinned: the open's) fails STOKE_EIO, and a read of f pinned without one yet takes the
 * copy's.  A
 * background downloader (slot < 0) counts no hit, waits for no other download (STOKE_EBUSY:
 * another process or thread has it) and evicts nothing (STOKE_EBUSY: no room). */
int stoke__cache_acquire(stoke__cache *c, stoke__remote_pool *p, int slot,
                         const stoke__remote_file *f, uint64_t expect, int *out, uint64_t *size,
                         char *why, size_t why_len);

/* cache_ahead.c.  init: c->d's lock and conditions (at create; no thread starts).  destroy:
 * the downloads running end, the queued are dropped, the threads joined, the order freed.
 * The fork hooks, called by cache.c's after (prepare) or before (parent, child) the slots':
 * prepare takes d's lock and waits for the running downloads to end (the queued wait), parent
 * lets them go on, child starts none (no thread crossed the fork). */
void stoke__cache_ahead_init(stoke__cache *c);
void stoke__cache_ahead_destroy(stoke__cache *c);
void stoke__cache_ahead_fork_prepare(stoke__cache *c);
void stoke__cache_ahead_fork_parent(stoke__cache *c);
void stoke__cache_ahead_fork_child(stoke__cache *c);
/* Queues the `connections` files after f in the order (set_order), when f is in it. */
void stoke__cache_ahead(stoke__cache *c, stoke__remote_pool *p, const stoke__remote_file *f);

#endif
