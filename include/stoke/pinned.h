/* stoke — pinned host memory, always pinned for the current accelerator.
 *
 * (API outline; the pinned-memory issue completes this header: size classes, cap, stats.)
 *
 * Every function routes to the chosen accelerator and the calling thread's current device; none
 * takes a device argument.  With no accelerator, or STOKE_PINNED=0, allocations are ordinary
 * page-aligned memory, stoke_is_pinned() is false for them, and one warning says so.
 */
#ifndef STOKE_PINNED_H
#define STOKE_PINNED_H

#include <stddef.h>

#include "stoke/device.h"
#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Allocates at least `size` bytes of host memory pinned for the current accelerator (cached:
 * freed blocks are reused).  *out is page-aligned.  Thread-safe. */
STOKE_API int stoke_pinned_alloc(size_t size, void **out);
/* Returns a block from stoke_pinned_alloc to the cache.  NULL does nothing.  Thread-safe. */
STOKE_API int stoke_pinned_free(void *ptr);
/* Records that the work queued so far on `s` reads or writes the block containing `ptr`: after
 * stoke_pinned_free the block is reused only once that work has completed.  Thread-safe. */
STOKE_API int stoke_pinned_record_stream(void *ptr, stoke_stream *s);
/* 1 if `ptr` lies inside a pinned allocation or registered range, else 0.  Thread-safe. */
STOKE_API int stoke_is_pinned(const void *ptr);
/* Pins caller memory [ptr, ptr+len) for the current accelerator / undoes it. */
STOKE_API int stoke_pin_register(void *ptr, size_t len);
STOKE_API int stoke_pin_unregister(void *ptr);

#ifdef __cplusplus
}
#endif
#endif
