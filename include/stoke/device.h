/* stoke — device memory, streams, events and asynchronous copies on the chosen accelerator.
 *
 * Thin, backend-independent wrappers over the backend ABI.  Every object is created for the
 * chosen accelerator and the calling thread's current device at creation time, and remembers
 * both: using it later from another thread or after stoke_device_set() still targets the device
 * it was made for.  Objects are not internally locked: one stream or event must not be used by
 * two threads at the same time (different objects may).  Objects are owned by the caller, who
 * destroys them; they refer to the backend's table, which stays loaded for the life of the
 * process.  Functions that fail put the backend's own detail, when it gave one, in
 * stoke_last_error(); they clear the last error before calling the backend.
 */
#ifndef STOKE_DEVICE_H
#define STOKE_DEVICE_H

#include <stddef.h>

#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_stream stoke_stream;
typedef struct stoke_event stoke_event;
typedef struct stoke_device_buffer stoke_device_buffer;

/* Creates an in-order stream of the backend named `backend` (NULL: the chosen accelerator;
 * only read during the call), on the calling thread's current device when that backend is the
 * chosen accelerator, else on its device 0.  *out is owned by the caller
 * (stoke_stream_destroy); it is NULL on failure.  Returns STOKE_OK; STOKE_EINVAL (out NULL);
 * STOKE_ENOENT (unknown name); STOKE_ENODEV (no accelerator, or the named backend is
 * unavailable); with backend NULL, the codes of an invalid STOKE_ACCELERATOR (accelerator.h);
 * STOKE_ENOTSUP (the backend has no streams or no host-to-device copy); STOKE_ENOMEM; the
 * backend's code (e.g. STOKE_EBACKEND) when the driver fails.  Thread-safe. */
STOKE_API int stoke_stream_create(const char *backend, stoke_stream **out);
/* Waits for the stream's work (ignoring its errors), then frees it.  Events and buffers made
 * from it stay valid and must be destroyed separately.  NULL does nothing. */
STOKE_API void stoke_stream_destroy(stoke_stream *s);
/* Blocks until all work queued on `s` finished.  Returns STOKE_OK (also when the backend has
 * no stream synchronization), STOKE_EINVAL (s NULL), or the error that work hit (the backend's
 * code, detail in the last error). */
STOKE_API int stoke_stream_synchronize(stoke_stream *s);
/* Name of the backend (a string owned by the backend, valid for the life of the process; NULL
 * for s NULL) and device index (-1 for s NULL) a stream belongs to.  Read-only: thread-safe. */
STOKE_API const char *stoke_stream_backend(const stoke_stream *s);
STOKE_API int stoke_stream_device(const stoke_stream *s);

/* Creates an event for the backend and device `s` belongs to; *out is owned by the caller.
 * Returns STOKE_OK, STOKE_EINVAL (NULL argument), STOKE_ENOTSUP (the backend has no events),
 * STOKE_ENOMEM, or the backend's error (STOKE_EBACKEND...) with its detail in the last error. */
STOKE_API int stoke_event_create(stoke_stream *s, stoke_event **out);
/* Frees an event (without waiting for it).  It must not be pending on a stream another thread
 * still records to.  NULL does nothing. */
STOKE_API void stoke_event_destroy(stoke_event *e);
/* Marks the point after the work queued so far on `s` (which must be of the same backend and
 * device as the event's).  Returns STOKE_OK, STOKE_EINVAL (NULL, or event and stream of
 * different backends/devices) or the backend's error. */
STOKE_API int stoke_event_record(stoke_event *e, stoke_stream *s);
/* STOKE_OK when done (or never recorded), STOKE_EBUSY while pending, STOKE_EINVAL for e NULL,
 * else the error of the work before it (detail in the last error).  Never blocks. */
STOKE_API int stoke_event_query(stoke_event *e);
/* Blocks until done; returns what stoke_event_query would then return (STOKE_EINVAL for
 * e NULL). */
STOKE_API int stoke_event_synchronize(stoke_event *e);

/* Device memory of `size` bytes on the stream's backend and device; *out is owned by the caller
 * (stoke_device_buffer_destroy) and is NULL on failure; the buffer does not keep `s`.  Returns
 * STOKE_OK, STOKE_EINVAL (s or out NULL), STOKE_ENOTSUP (no device memory on this backend),
 * STOKE_ENOMEM (host or device out of memory) or the backend's error, with the driver's detail
 * in the last error.  Thread-safe (as for the stream). */
STOKE_API int stoke_device_buffer_create(stoke_stream *s, size_t size, stoke_device_buffer **out);
/* Frees it (after synchronizing nothing: the caller must know no queued copy still uses it).
 * NULL does nothing. */
STOKE_API void stoke_device_buffer_destroy(stoke_device_buffer *b);
/* The backend's own handle (CUdeviceptr as a pointer, cl_mem, simdev address; owned by the
 * buffer, valid until stoke_device_buffer_destroy) and size; NULL / 0 for b NULL.  Read-only:
 * thread-safe. */
STOKE_API void *stoke_device_buffer_handle(const stoke_device_buffer *b);
STOKE_API size_t stoke_device_buffer_size(const stoke_device_buffer *b);

/* Queues a copy of n bytes from host `src` into `dst` at `offset` (h2d), or from `src` at
 * `offset` into host `dst` (d2h), on `s`.  The host memory stays the caller's; it must be n
 * valid bytes (a NULL host pointer is STOKE_EINVAL; nothing else is checked) and stay valid and
 * unchanged until an event recorded after the copy completes.  Pinned host memory
 * (stoke_is_pinned) gives truly asynchronous copies on backends that have them.  Returns
 * STOKE_OK, STOKE_EINVAL (buffer or stream NULL, or buffer and stream of different
 * backends/devices), STOKE_ERANGE (offset+n exceeds the buffer), STOKE_ENOTSUP (d2h only: the
 * backend cannot copy device-to-host; a stream always has h2d) or the backend's error.  An
 * error that happens while the copy runs is returned by the next event query/synchronize or
 * stream synchronize after it.  Thread-safety: as for the stream (one thread at a time per
 * stream). */
STOKE_API int stoke_copy_h2d_async(stoke_device_buffer *dst, size_t offset, const void *src,
                                   size_t n, stoke_stream *s);
STOKE_API int stoke_copy_d2h_async(void *dst, stoke_device_buffer *src, size_t offset, size_t n,
                                   stoke_stream *s);

#ifdef __cplusplus
}
#endif
#endif
