/* stoke — sharing pinned host memory and device memory with another process.
 *
 * A process exports a pinned block (from stoke_pinned_alloc) or a device buffer as a
 * stoke_ipc_handle, sends the handle to another process over a Unix socket (stoke_ipc_send /
 * stoke_ipc_recv: the handle's file descriptor travels as SCM_RIGHTS), and that process imports
 * it: it gets a host pointer pinned for its own current device, or a device buffer it can copy
 * to and from.  Both processes then see the same bytes.  Works without the loader; routes to
 * the backend that made the memory (export) or the chosen accelerator (import).
 *
 * Lifetimes (docs/ipc.md has the whole story):
 * - A handle owns its file descriptor (fd, or -1 when the backend needs none); stoke_ipc_close
 *   closes it and marks the handle closed.  Closing a handle never affects memory already
 *   imported from it, nor the exporter's memory.  Every handle filled by stoke_ipc_export* or
 *   stoke_ipc_recv must be closed, in each process, exactly once.
 * - The exporter keeps owning its block or buffer.  Freeing it while an importer still uses
 *   it is allowed for memfd-backed memory (simdev, cuda host blocks: the pages live on until
 *   the last mapping goes, but a freed pinned block may be handed out again by
 *   stoke_pinned_alloc, so the importer would then see someone else's data) and undefined for
 *   cuda device buffers: agree on the order (importers unmap, then the exporter frees).
 * - An import lives until stoke_ipc_unmap (host) or stoke_device_buffer_destroy (device), or
 *   until the process exits.
 *
 * Errors: STOKE_ENOTSUP when the backend has no IPC (the message names it); STOKE_EINVAL with a
 * message for misuse (a handle that is closed or not a handle, of the wrong kind, from another
 * backend, a size larger than the memory, a pointer that is not a live stoke pinned block).
 * Thread-safety: every function may be called from any thread; one handle must not be used by
 * two threads at the same time.
 */
#ifndef STOKE_IPC_H
#define STOKE_IPC_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/device.h"
#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_IPC_BLOB_MAX 128         /* bytes of backend-defined data in a handle */
#define STOKE_IPC_MAGIC    0x49504b53u /* "SKPI": an open handle */
#define STOKE_IPC_CLOSED   0x44534c43u /* "CLSD": a handle stoke_ipc_close closed */
#define STOKE_IPC_VERSION  1           /* layout of stoke_ipc_handle */

typedef enum stoke_ipc_kind {
    STOKE_IPC_HOST = 1,  /* a pinned host block */
    STOKE_IPC_DEVICE = 2 /* a device buffer */
} stoke_ipc_kind;

/* A shareable reference to memory of one process.  Plain data: it may be copied, but only one
 * copy owns `fd` (the one that is closed).  Fields are filled by stoke; read them freely. */
typedef struct stoke_ipc_handle {
    uint32_t magic;    /* STOKE_IPC_MAGIC while open, STOKE_IPC_CLOSED once closed */
    uint32_t version;  /* STOKE_IPC_VERSION */
    uint32_t kind;     /* stoke_ipc_kind */
    int32_t device;    /* the exporter's device index */
    uint64_t size;     /* bytes shared */
    char backend[32];  /* the backend that exported it ("simdev", "cuda") */
    int32_t fd;        /* a file descriptor this handle owns, or -1 */
    uint32_t blob_len; /* bytes of blob in use */
    int64_t pid;       /* the exporting process (for messages) */
    unsigned char blob[STOKE_IPC_BLOB_MAX]; /* backend-defined (a CUDA IPC handle, ...) */
} stoke_ipc_handle;

/* Exports the first `size` bytes (0: the whole block) of the pinned block `ptr`, which must be
 * the start of a live block from stoke_pinned_alloc that was pinned by an accelerator, or the
 * start of a live allocation of this process in a node-wide arena (stoke/arena.h: a handle of
 * backend "arena" that any process imports and pins for its own accelerator).  Fills
 * *out (owned by the caller: stoke_ipc_close).  Returns STOKE_OK; STOKE_EINVAL (NULL argument,
 * ptr not a live pinned block or not its start, allocated without an accelerator, size larger
 * than the block); STOKE_ENOTSUP (the block's backend has no IPC, or cannot share this block);
 * STOKE_EIO / the backend's code when the system or driver fails (detail in the last error). */
STOKE_API int stoke_ipc_export(void *ptr, size_t size, stoke_ipc_handle *out);

/* Exports the whole device buffer `b`; as stoke_ipc_export otherwise. */
STOKE_API int stoke_ipc_export_device(stoke_device_buffer *b, stoke_ipc_handle *out);

/* Maps a host handle (from this or another process) into this process, pinned for the chosen
 * accelerator's current device: *out points at h->size bytes for which stoke_is_pinned() is
 * true, until stoke_ipc_unmap.  `h` stays the caller's (it may be closed right after).
 * Returns STOKE_OK; STOKE_EINVAL (closed handle, not a handle, a device handle, a handle of
 * another backend than the chosen accelerator, a blob the backend rejects); STOKE_ENOTSUP (the
 * accelerator has no IPC); STOKE_ENODEV (no accelerator); the backend's code. */
STOKE_API int stoke_ipc_import(const stoke_ipc_handle *h, void **out);

/* Opens a device handle as a device buffer of h->size bytes on the chosen accelerator's
 * current device.  stoke_device_buffer_destroy undoes the import (the exporter's buffer stays).
 * Returns as stoke_ipc_import (STOKE_EINVAL for a host handle). */
STOKE_API int stoke_ipc_import_device(const stoke_ipc_handle *h, stoke_device_buffer **out);

/* Undoes stoke_ipc_import: unpins and unmaps `ptr`.  STOKE_OK, or STOKE_EINVAL when ptr is not
 * a live import of this process. */
STOKE_API int stoke_ipc_unmap(void *ptr);

/* Closes the handle's file descriptor and marks it closed (a second close is STOKE_EINVAL, as
 * is anything that is not a handle).  Imports made from it stay valid. */
STOKE_API int stoke_ipc_close(stoke_ipc_handle *h);

/* Sends `h` (it stays open and the caller's) over the connected Unix socket `sock`, its file
 * descriptor as SCM_RIGHTS.  The receiver gets its own handle from stoke_ipc_recv (which it
 * must close).  Blocks as the socket does (set SO_SNDTIMEO / SO_RCVTIMEO to bound a wait).
 * Returns STOKE_OK; STOKE_EINVAL (not an open handle); STOKE_EIO (the socket failed: the
 * message says how; a timeout is STOKE_ETIMEDOUT); from recv, STOKE_EEND when the peer closed
 * the socket before sending anything. */
STOKE_API int stoke_ipc_send(int sock, const stoke_ipc_handle *h);
STOKE_API int stoke_ipc_recv(int sock, stoke_ipc_handle *out);

/* 1 if the backend named `backend` (NULL: the chosen accelerator) supports IPC, 0 if not, or a
 * negative code when there is no such backend / no accelerator. */
STOKE_API int stoke_ipc_supported(const char *backend);

#ifdef __cplusplus
}
#endif
#endif
