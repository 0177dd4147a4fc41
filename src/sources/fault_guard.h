/* A SIGBUS guard around copies out of file mappings the npy source owns.
 *
 * A file mapped with mmap that shrinks underneath (truncated, or rewritten in place by a
 * program that truncates first) raises SIGBUS on the next access to a page past its new end.
 * stoke__guarded_copy turns that into a return code for the one copy that faulted; every other
 * SIGBUS goes to the handler that was installed before stoke's (or to the default action, which
 * ends the process as if stoke had installed nothing).  See docs/sources.md. */
#ifndef STOKE_FAULT_GUARD_H
#define STOKE_FAULT_GUARD_H

#include <stddef.h>

/* Makes stoke's SIGBUS handler the current one: installs it the first time, chaining to the
 * disposition found then; later calls do nothing unless something replaced it since, which it
 * then chains to.  Returns 0, or -errno if sigaction failed.  Thread-safe. */
int stoke__fault_guard_install(void);

/* Copies n bytes from src to dst, where [src, src + n) lies inside the mapping
 * [base, base + len).  Returns 0, or -1 when the copy raised SIGBUS inside that mapping (the
 * mapped file shrank): dst is then partly written, and the calling thread's signal mask is
 * as it was before the call.  Requires stoke__fault_guard_install to have succeeded (else a fault
 * kills the process as it would without the guard).  Not
 * reentrant within one thread (no nested guarded copies); thread-safe otherwise. */
int stoke__guarded_copy(void *dst, const void *src, size_t n, const void *base, size_t len);

/* Runs fn(arg) with the guard armed over the mapping [base, base + len): fn copies out of it
 * (many rows at once: one arming for all of them).  Returns 0, or -1 when a read inside the
 * mapping raised SIGBUS: fn was abandoned at that point, and *fault (unless fault is NULL) is
 * the address whose read faulted, so fn need not record its progress to tell which row it was.
 * fn must not take locks, allocate or arm another guard.  Same requirements and thread-safety
 * as stoke__guarded_copy. */
int stoke__guarded_run(void (*fn)(void *arg), void *arg, const void *base, size_t len,
                       const void **fault);

#endif
