/* Private layout of the node-wide pinned arena (stoke/arena.h), shared by arena.c (naming,
 * rendezvous, open/close, the serving thread) and arena_alloc.c (the shared header's lock,
 * chunk allocation, reclaiming the chunks of processes that are gone, stats).
 *
 * Shared memory (one memfd, the same in every attached process):
 *     [ar_hdr][owner: uint8 per chunk][run: uint32 per chunk] ... page ... [data: nchunks chunks]
 * owner[i] is 0 (free) or 1 + the slot of the process that allocated chunk i; run[i] is the
 * length in chunks of the allocation that starts at chunk i (0 elsewhere; only meaningful when
 * owner[i] != 0).  Everything in ar_hdr after `lock` is guarded by it.
 *
 * Slots.  A process attached in slot k holds the abstract socket name "...-<k>" bound (and
 * listens on it).  Whoever can bind the name of slot k knows that no process holds slot k, so
 * the chunks owned by k + 1 belong to a process that is gone: that is the liveness test of
 * reclaim (independent of pid namespaces and pid reuse).  But a process's files close before
 * its children are told it died, and its children (process workers) may still be writing its
 * chunks: the processes recorded as the slot's writers (stoke__arena_add_writer) keep its
 * chunks and its record from being reclaimed while any of them lives. */
#ifndef STOKE_ARENA_INTERNAL_H
#define STOKE_ARENA_INTERNAL_H

#include <pthread.h>
#include <stdint.h>
#include <sys/types.h>

#include "stoke/arena.h"
#include "stoke/ipc.h"

#define AR_MAGIC   0x414e524145544b53ull /* "SKTEARNA" */
#define AR_VERSION 2u                    /* 2: ar_proc records writers */
#define AR_MAXP    STOKE_ARENA_MAX_PROCS
#define AR_LOCK_S  10 /* bound on waiting for the shared lock, seconds */

#define AR_WRITERS 32 /* writers recorded per slot (a zygote and its children per loader) */

/* A process that may write a slot's chunks besides its holder (a process worker's zygote):
 * named by pid, its start time (field 22 of /proc/PID/stat: a reused pid does not match) and
 * its pid namespace (the inode of /proc/self/ns/pid: other namespaces cannot check it). */
typedef struct ar_writer {
    int32_t pid; /* 0: none */
    uint32_t pad;
    uint64_t start;
    uint64_t pidns;
} ar_writer;

typedef struct ar_proc {
    int32_t pid; /* 0: slot unused (as far as the header knows) */
    uint32_t pad;
    uint64_t chunks; /* chunks it holds */
    ar_writer writers[AR_WRITERS];
} ar_proc;

typedef struct ar_hdr {
    uint64_t magic; /* AR_MAGIC once initialised */
    uint32_t version;
    uint32_t maxp;
    uint64_t requested; /* bytes the creator asked for */
    uint64_t chunk;     /* bytes per chunk (a power of two, at least a page) */
    uint64_t nchunks;
    uint64_t data_off; /* offset of chunk 0 from the start of the mapping */
    uint64_t map_len;  /* bytes of the memfd */
    int32_t creator_pid;
    char name[STOKE_ARENA_NAME_MAX + 1];
    pthread_mutex_t lock; /* robust, process-shared; guards everything below */
    int32_t lock_pid;     /* the process holding `lock`, 0 when free */
    uint64_t used;        /* chunks allocated */
    uint64_t allocs, frees, reclaims, reclaimed_chunks;
    ar_proc procs[AR_MAXP];
} ar_hdr;

/* What a serving process sends with the memfd (SCM_RIGHTS) to a process that connects to its
 * slot name. */
typedef struct ar_hello {
    uint64_t magic; /* AR_MAGIC */
    uint32_t version;
    int32_t pid;
    uint64_t requested;
    uint64_t map_len; /* bytes of the memfd */
} ar_hello;

struct stoke_arena {
    char name[STOKE_ARENA_NAME_MAX + 1];
    int memfd;
    unsigned char *base; /* the mapping: header at base, chunk 0 at base + h->data_off */
    size_t map_len;
    ar_hdr *h;
    uint8_t *owner;
    uint32_t *run;
    unsigned char *data;
    uint64_t chunk, nchunks; /* the layout, copied from the header once it was checked */
    int slot;
    int listen_fd; /* bound to the slot's name, listening; -1 in a forked child */
    int wake_fd;   /* eventfd: tells the serving thread to stop */
    pthread_t thread;
    int thread_started;
    uint64_t refused, refused_said; /* (the serving thread's) connections of other uids; when
                                       the last was said (stoke__now_ns) */
    int registered;                 /* stoke_pin_register succeeded */
    int pinned;                     /* ... and stoke_is_pinned says yes */
    int created;
    pid_t pid; /* the process that opened it: a forked child may not use the handle */
    struct stoke_arena *next; /* the process's open arenas (for fork) */
};

/* arena.c: the abstract socket address of `name`'s slot (slot >= 0) or opening lock (slot
 * -1); returns the address length for bind/connect. */
unsigned stoke__arena_addr(const char *name, int slot, void *sockaddr_un);
/* A fresh socket bound to `name`'s slot, or -1 (errno EADDRINUSE when someone holds it). */
int stoke__arena_bind(const char *name, int slot);
/* 1 when a process of another uid holds the name of `name`'s slot (*uid: which), else 0. */
int stoke__arena_slot_foreign(const char *name, int slot, unsigned *uid);
/* 1 when the kernel's socket table (NETLINK_SOCK_DIAG with UDIAG_SHOW_UID, Linux 5.3) names
 * the uid (*uid) of the socket holding the name of `name`'s slot (-1: the opening lock); 0 when
 * it does not (nobody holds it, or the kernel has no unix_diag). */
int stoke__arena_name_uid(const char *name, int slot, unsigned *uid);

/* The loader's way in: `spec` is "name[:size]" (name "auto": stoke_arena_default_name; NULL:
 * $STOKE_ARENA; NULL or "" then: *out stays NULL, STOKE_OK).  Without a size it attaches to a
 * running arena, or creates one of need * $LOCAL_WORLD_SIZE bytes.  `what` starts messages. */
int stoke__arena_open_spec(const char *spec, uint64_t need, const char *what, stoke_arena **out);

/* The arena of this process whose usable bytes contain ptr, or NULL. */
stoke_arena *stoke__arena_find(const void *ptr);

/* arena_ipc.c: host-block IPC of arena allocations (handles of backend STOKE__ARENA_BACKEND).
 * export: ptr must start a live allocation of this process in `a`; size 0: all of it.
 * import: maps the range and pins it for the current accelerator; *mapped: bytes mapped.
 * unmap: undoes an import. */
#define STOKE__ARENA_BACKEND "arena"
int stoke__arena_ipc_export(stoke_arena *a, void *ptr, size_t size, stoke_ipc_handle *out);
int stoke__arena_ipc_import(const stoke_ipc_handle *h, void **out, size_t *mapped);
void stoke__arena_ipc_unmap(void *ptr, size_t mapped);

/* arena_alloc.c */
/* STOKE_OK with *len the bytes of the live allocation of this process that starts at ptr;
 * else STOKE_EINVAL (message says why) or a lock error. */
int stoke__arena_allocation(stoke_arena *a, const void *ptr, size_t *len);
/* Lays out an empty arena of `requested` bytes: fills *chunk, *nchunks, *data_off, *map_len.
 * STOKE_OK or STOKE_ENOMEM (too large). */
int stoke__arena_layout(uint64_t requested, uint64_t *chunk, uint64_t *nchunks, uint64_t *data_off,
                        uint64_t *map_len);
/* Initialises the header of a fresh mapping (the shared lock included) and the views into
 * it, as stoke__arena_check_header does. */
int stoke__arena_init_header(stoke_arena *a, uint64_t requested, uint64_t chunk, uint64_t nchunks,
                             uint64_t data_off);
/* STOKE_OK when the header at a->base describes exactly the layout stoke__arena_layout gives
 * for its `requested` size, in a->map_len bytes: then a->owner, a->run, a->data, a->chunk and
 * a->nchunks are set from that layout (later changes to the shared header cannot move them).
 * Else STOKE_EINVAL naming `pid` (the process that sent the memory). */
int stoke__arena_check_header(stoke_arena *a, int pid);
/* Takes slot a->slot in the header (its name is bound by the caller): reclaims what a
 * previous holder of the slot left, records the pid.  STOKE_OK, a lock error, or 1 (nothing
 * done: a writer of the previous holder lives, so the caller must take another slot). */
int stoke__arena_claim(stoke_arena *a);
/* Records `pid` (a process this one forked, that may write this process's allocations after
 * this process is gone: a process worker's zygote and each of its children) as a writer of
 * this process's slot: while it lives, no other process reclaims the slot's chunks or takes the
 * slot.  Dead writers' entries are reused; a pid that is gone already is not recorded.
 * STOKE_OK; STOKE_ELIMIT (AR_WRITERS live writers already); STOKE_EINVAL (pid <= 0, no /proc,
 * or a handle of another process); a lock error. */
int stoke__arena_add_writer(stoke_arena *a, pid_t pid);
/* Frees the caller's chunks and clears its slot in the header (close). */
void stoke__arena_release(stoke_arena *a);
/* Tests: takes the shared lock and returns with it held (a child then dies holding it). */
int stoke__arena_test_hold_lock(stoke_arena *a);

#endif
