/* stoke — one pinned arena shared by the processes of a job on one machine.
 *
 * Eight training processes on a node each pinning their own staging memory lock eight times the
 * memory they need at once.  An arena is one block of shared memory that every process of the
 * job attaches to by name and pins (registers) for its own current accelerator; each process
 * allocates its buffers from it.  docs/ipc.md, "Node-wide pinned arena", has the whole story.
 *
 *     stoke_arena *a;
 *     if (stoke_arena_open(NULL, 1ull << 30, &a) != STOKE_OK) ...stoke_last_error()...
 *     void *p;
 *     stoke_arena_alloc(a, 64 << 20, &p);   // pinned: stoke_is_pinned(p) == 1
 *     ...
 *     stoke_arena_free(a, p);
 *     stoke_arena_close(a);
 *
 * Naming.  Processes of one user (uid) that open the same name share one arena.  NULL derives
 * the name from the job (stoke_arena_default_name): $STOKE_ARENA (its name part, unless it is
 * "auto", which stands for the job's name below), else
 * "torchelastic-$TORCHELASTIC_RUN_ID", else "slurm-$SLURM_JOB_ID.$SLURM_STEP_ID", else
 * "ompi-$OMPI_MCA_ess_base_jobid"; characters other than [A-Za-z0-9._-] become '_', and the
 * name is cut at STOKE_ARENA_NAME_MAX characters.
 *
 * Rendezvous without files.  The arena is a memfd; each attached process serves its descriptor
 * on an abstract Unix socket ("\0stoke-arena-<uid>-<name>-<slot>", one slot per process, at
 * most STOKE_ARENA_MAX_PROCS) from a small thread ("stoke-arena"), so any attached process can
 * let a new one in, and everything vanishes with the last process: nothing is created in
 * /dev/shm or the file system.  Abstract sockets belong to a network namespace: processes in
 * different network namespaces (containers) cannot share an arena.  A process of another uid is
 * refused.
 *
 * Lifetime.  The arena lives while any process has it open (or mapped: a child forked after
 * open keeps the memory but cannot use the handle).  Allocations belong to the process that
 * made them; when a process exits or dies, its allocations return to the arena (they are
 * reclaimed by the next process that needs room, takes the arena's lock after the dead process
 * held it, or attaches in its slot).  stoke_arena_close frees the caller's allocations.
 *
 * Pinning.  Each process registers the whole mapping once with stoke_pin_register for its
 * current accelerator and device at open (the memory is pinned once per process, but the pages
 * are the same physical pages in every process).  Without an accelerator (or with
 * STOKE_PINNED=0) the arena is ordinary shared memory and the usual one warning says so; a
 * backend that cannot register memory (STOKE_ENOTSUP) also leaves it unpinned, with a warning.
 *
 * Thread-safety: every function may be called from any thread; an arena must not be closed
 * while another thread still uses it.
 */
#ifndef STOKE_ARENA_H
#define STOKE_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_arena stoke_arena;

#define STOKE_ARENA_NAME_MAX  64 /* characters of a name */
#define STOKE_ARENA_MAX_PROCS 64 /* processes attached to one arena at once */

/* Opens the arena `name` (NULL: stoke_arena_default_name) of this user: attaches to it when a
 * process has it open, else creates it with `size` bytes (rounded up to its chunk size; see
 * stoke_arena_stats).  size 0 attaches only.  *out is the caller's until stoke_arena_close.
 * Returns STOKE_OK; STOKE_EINVAL (out NULL, a name that is empty, too long or has characters
 * outside [A-Za-z0-9._-], or an existing arena of another size than a non-zero `size`: the
 * message names the arena and both sizes); STOKE_ENOENT (NULL name and no job to derive one
 * from, or size 0 and no such arena); STOKE_ELIMIT (STOKE_ARENA_MAX_PROCS processes attached
 * already); STOKE_ETIMEDOUT (another process kept the arena's opening lock for more than 10 s);
 * STOKE_EBUSY (a process of this uid holds the arena but did not answer within 2 s: stopped,
 * or its socket's queue flooded; no second arena of the name is made);
 * STOKE_ENOMEM / STOKE_EIO (memfd, mmap or socket failures, with the system's reason); the
 * backend's code when pinning failed (its reason in stoke_last_error()). */
STOKE_API int stoke_arena_open(const char *name, size_t size, stoke_arena **out);

/* Allocates `size` bytes (0: one chunk) from the arena: *out is aligned to the arena's chunk
 * size (at least a page) and lies in pinned memory when the arena is pinned.  The allocation
 * belongs to the calling process.  When the arena has no room, the allocations of processes
 * that are gone are reclaimed first.  Returns STOKE_OK; STOKE_EINVAL (NULL argument, or a
 * handle used in a child forked after open); STOKE_ENOMEM (no run of free chunks large enough:
 * the message gives the arena's size, what is used and by how many processes);
 * STOKE_ETIMEDOUT (the arena's lock was held for more than 10 s, by the process named). */
STOKE_API int stoke_arena_alloc(stoke_arena *a, size_t size, void **out);

/* Returns an allocation of the calling process to the arena.  NULL does nothing.  Returns
 * STOKE_OK; STOKE_EINVAL (ptr is not the start of a live allocation of this process in this
 * arena); STOKE_ETIMEDOUT as above. */
STOKE_API int stoke_arena_free(stoke_arena *a, void *ptr);

/* Frees the caller's allocations, stops serving the arena, unpins and unmaps it.  The arena
 * itself lives on while other processes have it open.  NULL does nothing.  Returns STOKE_OK
 * (cleanup cannot fail; problems are logged). */
STOKE_API int stoke_arena_close(stoke_arena *a);

/* Addresses differ between processes; offsets do not.  stoke_arena_offset gives the offset
 * of `ptr` (any address inside the arena's usable bytes) and stoke_arena_ptr the address of an
 * offset in this process, so one process can tell another where its data is.  Both return
 * STOKE_OK or STOKE_EINVAL (NULL argument, or outside the arena's usable bytes: the message
 * gives the arena's size). */
STOKE_API int stoke_arena_offset(const stoke_arena *a, const void *ptr, uint64_t *offset);
STOKE_API int stoke_arena_ptr(const stoke_arena *a, uint64_t offset, void **ptr);

/* The name NULL stands for (see Naming above) into buf[len].  Returns STOKE_OK; STOKE_ENOENT
 * when none of the variables is set; STOKE_EINVAL (buf NULL or len 0). */
STOKE_API int stoke_arena_default_name(char *buf, size_t len);

#define STOKE_ARENA_STATS_VERSION 1

typedef struct stoke_arena_stats {
    uint32_t size;    /* set by the caller to sizeof(stoke_arena_stats) */
    uint32_t version; /* set by stoke: STOKE_ARENA_STATS_VERSION */
    char name[STOKE_ARENA_NAME_MAX + 1];
    uint64_t bytes;           /* usable bytes (the size asked at creation, rounded to chunks) */
    uint64_t requested_bytes; /* the size the creating process asked for */
    uint64_t chunk_bytes;     /* allocation granule and alignment */
    uint64_t mapped_bytes;    /* the whole shared mapping (bookkeeping included) */
    uint64_t bytes_used;      /* allocated, by all processes */
    uint64_t bytes_used_self; /* allocated by this process */
    uint64_t processes;       /* processes attached now (dead ones are reclaimed first) */
    uint64_t allocs;          /* successful allocations since creation, all processes */
    uint64_t frees;
    uint64_t reclaims;        /* processes whose allocations were reclaimed after they died */
    uint64_t reclaimed_bytes; /* bytes those reclaims returned */
    int32_t creator_pid;      /* the process that created the arena */
    int32_t pinned;           /* 1: registered for this process's accelerator */
    int32_t created;          /* 1: this process created it */
    int32_t slot;             /* this process's slot, 0 .. STOKE_ARENA_MAX_PROCS-1 */
} stoke_arena_stats;

/* Fills *out (at most out->size bytes; out->size is set to the bytes filled), reclaiming the
 * allocations of processes that are gone first.  Returns STOKE_OK; STOKE_EINVAL (NULL, size
 * too small, handle used in a forked child); STOKE_ETIMEDOUT as for alloc. */
STOKE_API int stoke_arena_stats_get(stoke_arena *a, stoke_arena_stats *out);

#ifdef __cplusplus
}
#endif
#endif
