/* A thread-safe table of host address ranges a backend pinned (allocated or registered), so
 * that is_pinned answers for interior addresses and free/unregister find what they undo.
 * Shared by the cuda and hip backends (gpu_core.c) and opencl (private to libstoke).
 *
 * Locking: one rwlock per table; find takes it shared (is_pinned is on the hot path), add and
 * remove exclusive.  Ranges never overlap; entries are copied in and out, so no pointer into
 * the table escapes the lock. */
#ifndef STOKE_HOSTRANGES_H
#define STOKE_HOSTRANGES_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

typedef struct stoke__hostrange {
    uintptr_t base; /* first byte handed out / registered */
    size_t size;    /* bytes from base */
    int dev;        /* backend device index it was pinned for */
    int kind;       /* backend-defined (allocated vs registered) */
    void *obj;      /* backend-defined: a cl_mem, ... */
    void *map;      /* backend-defined: the mapped pointer behind base, ... */
} stoke__hostrange;

typedef struct stoke__hostranges {
    pthread_rwlock_t lock;
    stoke__hostrange *v; /* sorted by base */
    size_t n, cap;
} stoke__hostranges;

#define STOKE__HOSTRANGES_INIT {PTHREAD_RWLOCK_INITIALIZER, NULL, 0, 0}

/* Adds `r`.  STOKE_OK, STOKE_EINVAL if it overlaps a range already there, STOKE_ENOMEM. */
int stoke__hostranges_add(stoke__hostranges *t, const stoke__hostrange *r);
/* Removes the range starting exactly at `base` and copies it to *out (may be NULL).
 * STOKE_OK or STOKE_ENOENT. */
int stoke__hostranges_remove(stoke__hostranges *t, const void *base, stoke__hostrange *out);
/* 1 and *out (may be NULL) filled if `p` lies inside a range, else 0. */
int stoke__hostranges_find(stoke__hostranges *t, const void *p, stoke__hostrange *out);
/* Moves every range out (the caller frees *v with free()); the table is left empty. */
void stoke__hostranges_take_all(stoke__hostranges *t, stoke__hostrange **v, size_t *n);
/* Number of ranges. */
size_t stoke__hostranges_count(stoke__hostranges *t);

#endif
