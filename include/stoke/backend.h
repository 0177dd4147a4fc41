/* stoke — the backend ABI (version 2), for accelerator plugin authors.
 *
 * Every accelerator stoke can pin memory for — the built-in cuda and opencl backends, the cpu
 * fallback and third-party plugins — implements the one table of functions below.  A plugin is a
 * shared object that exports one function, STOKE_BACKEND_ENTRY_SYMBOL, of type
 * stoke_backend_entry_fn.  The host calls it once, passing a stoke_backend_host that says which
 * ABI versions the host accepts and gives the plugin a log function; the plugin returns a pointer
 * to its (static) stoke_backend table.
 *
 * Compatibility rules:
 * - The table starts with abi_version and size.  It only ever grows by appending members; a
 *   member is never removed, reordered or retyped.  The host reads a member only if it lies
 *   within `size`, so an older plugin keeps working with a newer host.
 * - The host accepts plugins whose abi_version is within [STOKE_BACKEND_ABI_MIN,
 *   STOKE_BACKEND_ABI_VERSION]; others are rejected with a logged reason, never fatally.
 * - Functions marked "required" must be non-NULL; optional ones may be NULL and are then
 *   treated as STOKE_ENOTSUP (shutdown: simply skipped).  Optional functions come in groups,
 *   checked when the plugin loads (a table missing a member of a group it uses is rejected with
 *   STOKE_EABI): stream_create needs stream_destroy and copy_h2d_async; event_create needs
 *   event_destroy, event_record, event_query and event_synchronize; device_alloc needs
 *   device_free; host_register needs host_unregister; (ABI v2) ipc_export_mem, ipc_import_mem and
 *   ipc_close_mem go together, and STOKE_CAP_IPC is what a table with them reports (the host
 *   sets or clears it to match).  stream_synchronize is required as soon
 *   as any stream function is present (stream_create, stream_destroy, copy_h2d_async,
 *   copy_d2h_async): it is what makes it safe to free or reuse a buffer a copy may still read.
 * - `name` must be non-empty, shorter than 32 bytes and unique in the registry (else the plugin
 *   is rejected with STOKE_EABI).
 *
 * Conventions for every function: return STOKE_OK (0) or a negative STOKE_E* code; never abort
 * or exit; report detail through host->log.  `dev` is a device index in [0, device_count).  All
 * functions must be thread-safe: the loader calls them from several threads at once.
 *
 * Device memory is an opaque handle (a pointer for CUDA and simdev, a cl_mem for OpenCL); copies
 * address it as (handle, byte offset).  Streams and events are opaque types each backend defines.
 *
 * docs/backend-authors.md walks through plugins/simdev as a worked example.
 */
#ifndef STOKE_BACKEND_H
#define STOKE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/ipc.h"
#include "stoke/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_BACKEND_ABI_VERSION  2 /* the newest ABI this header describes */
#define STOKE_BACKEND_ABI_MIN      1 /* the oldest ABI the host still accepts */
#define STOKE_BACKEND_ENTRY_SYMBOL "stoke_backend_entry"

/* Capability flags (stoke_backend.caps). */
#define STOKE_CAP_PINNED_ALLOC  (1u << 0) /* host_alloc returns page-locked memory */
#define STOKE_CAP_HOST_REGISTER (1u << 1) /* host_register pins caller memory */
#define STOKE_CAP_DEVICE_MEMORY (1u << 2) /* device_alloc / copies work */
#define STOKE_CAP_ASYNC_COPY    (1u << 3) /* copies return before completing */
#define STOKE_CAP_EVENTS        (1u << 4) /* events can be recorded and queried */
#define STOKE_CAP_IPC           (1u << 5) /* the ABI v2 IPC group works */
#define STOKE_CAP_FORK_SAFE                                                                        \
    (1u << 6) /* a process forked from one that probed it may go on                                \
                 using it (without: it is unavailable there) */

/* Probe flags. */
#define STOKE_PROBE_EXPLICIT                                                                       \
    (1u << 0) /* the user named this backend: also expose devices that                             \
                 automatic selection skips (e.g. CPU OpenCL devices) */

/* Device kinds (stoke_device_props.kind). */
typedef enum stoke_device_kind {
    STOKE_DEVICE_GPU = 0,
    STOKE_DEVICE_ACCELERATOR = 1,
    STOKE_DEVICE_CPU = 2,
    STOKE_DEVICE_SIMULATED = 3
} stoke_device_kind;

typedef struct stoke_device_props {
    uint32_t size;         /* set by the caller to sizeof(stoke_device_props) */
    int kind;              /* stoke_device_kind */
    char name[128];        /* "NVIDIA H200", "simdev 0", ... */
    char vendor[64];       /* may be empty */
    char pci_bus_id[32];   /* "0000:17:00.0", or empty when not on PCI */
    uint64_t total_memory; /* bytes of device memory, 0 if unknown */
    int compute_major;     /* compute capability (CUDA) or OpenCL version major; 0 if n/a */
    int compute_minor;
    char driver_version[64]; /* may be empty */
} stoke_device_props;

/* Defined by each backend. */
typedef struct stoke_backend_stream stoke_backend_stream;
typedef struct stoke_backend_event stoke_backend_event;

/* What the host gives a plugin.  Members are appended only; read `size` before a member. */
typedef struct stoke_backend_host {
    uint32_t abi_version; /* newest ABI the host speaks (STOKE_BACKEND_ABI_VERSION) */
    uint32_t size;        /* sizeof(stoke_backend_host) on the host */
    uint32_t abi_min;     /* oldest ABI the host accepts */
    uint32_t reserved;
    /* Log a line for this backend (level is a stoke_log_level; msg is copied).  A line at WARN
     * or ERROR also becomes the calling thread's stoke_last_error(), so a plugin reports the
     * detail of a failing call this way.  Thread-safe; not callable from a log sink. */
    void (*log)(const char *backend, int level, const char *msg);
} stoke_backend_host;

typedef struct stoke_backend {
    uint32_t abi_version; /* the ABI this table implements */
    uint32_t size;        /* sizeof the table as the plugin compiled it */
    const char *name;     /* short lowercase name used in STOKE_ACCELERATOR: "simdev" */
    const char *description;
    uint64_t caps; /* STOKE_CAP_* */

    /* required: is the backend usable here?  Must not create device contexts.  On failure fills
     * `reason` (NUL-terminated, at most reason_len bytes) with a precise cause ("libcuda.so.1 not
     * found", "no device") and returns STOKE_ENODEV (or another code).  `flags`: STOKE_PROBE_*.
     * Called before any other function except shutdown; may be called again. */
    int (*probe)(uint32_t flags, char *reason, size_t reason_len);
    /* required: number of devices (after a successful probe). */
    int (*device_count)(int *count);
    /* required: properties of device `dev`; fill at most props->size bytes. */
    int (*device_props)(int dev, stoke_device_props *props);

    /* required: allocate `size` bytes of host memory pinned for device `dev` (for backends
     * without STOKE_CAP_PINNED_ALLOC: ordinary memory).  Returned memory is page-aligned and
     * readable/writable by the CPU.  Must not touch any device other than `dev`. */
    int (*host_alloc)(int dev, size_t size, void **out);
    /* required: free memory from host_alloc. */
    int (*host_free)(int dev, void *ptr);
    /* optional: pin [ptr, ptr+size) of caller memory for `dev` / undo it (ptr as registered). */
    int (*host_register)(int dev, void *ptr, size_t size);
    int (*host_unregister)(int dev, void *ptr);
    /* required: *out = 1 if `ptr` lies inside memory pinned by this backend (host_alloc or
     * host_register), else 0. */
    int (*is_pinned)(const void *ptr, int *out);

    /* optional (STOKE_CAP_DEVICE_MEMORY): device memory as an opaque handle. */
    int (*device_alloc)(int dev, size_t size, void **out);
    int (*device_free)(int dev, void *handle);

    /* optional: an in-order queue of work on device `dev`. */
    int (*stream_create)(int dev, stoke_backend_stream **out);
    int (*stream_destroy)(stoke_backend_stream *s);
    /* Wait until everything queued on `s` has finished.  Required whenever the table has any
     * stream or copy function (a table without it is rejected at load). */
    int (*stream_synchronize)(stoke_backend_stream *s);

    /* optional: queue a copy of n bytes host→device (dst handle + offset) or device→host on `s`.
     * With STOKE_CAP_ASYNC_COPY they return before the copy ran; the host buffer must stay valid
     * and unchanged until an event recorded after the copy completes.  An error that happens
     * while the copy runs is reported by the next event_query/event_synchronize/
     * stream_synchronize on that stream. */
    int (*copy_h2d_async)(void *dst, size_t dst_offset, const void *src, size_t n,
                          stoke_backend_stream *s);
    int (*copy_d2h_async)(void *dst, const void *src, size_t src_offset, size_t n,
                          stoke_backend_stream *s);

    /* optional (STOKE_CAP_EVENTS): markers in a stream. */
    int (*event_create)(int dev, stoke_backend_event **out);
    int (*event_destroy)(stoke_backend_event *e);
    /* Mark the point after all work queued so far on `s`; re-recording moves the marker. */
    int (*event_record)(stoke_backend_event *e, stoke_backend_stream *s);
    /* STOKE_OK when complete (or never recorded), STOKE_EBUSY while pending, else the error of
     * the work it follows.  Never blocks. */
    int (*event_query)(stoke_backend_event *e);
    /* Block until complete; returns like event_query would afterwards. */
    int (*event_synchronize)(stoke_backend_event *e);

    /* optional: release everything; called once by the host when it unloads the backend (a
     * registry reset, as stoke's tests do), never at process exit: threads of the program may
     * still be in the backend then.  Work that must run at exit belongs in the plugin's own
     * destructor or atexit handler. */
    void (*shutdown)(void);

    /* Reserved in ABI v1 and never called by the host (they could not say what kind of
     * memory, how large, nor carry a file descriptor): leave them NULL.  IPC is the ABI v2
     * group below. */
    int (*ipc_export)(int dev, void *ptr, unsigned char handle[64], size_t *handle_len);
    int (*ipc_import)(int dev, const unsigned char *handle, size_t handle_len, void **out);

    /* ---- ABI v2 (members read only when abi_version >= 2 and `size` covers them) ---- */

    /* optional group (STOKE_CAP_IPC; all three or none): share memory with another process.
     * See stoke/ipc.h for the handle and docs/ipc.md for the lifetimes.
     *
     * ipc_export_mem: the host has filled h->magic, version, kind, device, size, backend, pid,
     * h->fd = -1 and blob_len = 0.  STOKE_IPC_HOST: `ptr` is the start of a live block from
     * this backend's host_alloc on `dev`, of at least h->size bytes.  STOKE_IPC_DEVICE: `ptr`
     * is a handle from device_alloc on `dev` of at least h->size bytes.  The backend sets
     * h->fd to a new descriptor the handle then owns (the host closes it) and/or fills up to
     * STOKE_IPC_BLOB_MAX bytes of h->blob.  STOKE_EINVAL for memory it cannot share (with a
     * logged reason), STOKE_ENOTSUP for a kind it does not support.
     *
     * ipc_import_mem: maps a handle exported by this backend (possibly in another process)
     * for `dev`; it must check h->blob (any bytes may arrive) and never take h->fd (dup it if
     * it must keep it).  STOKE_IPC_HOST: *out is a host pointer to h->size bytes that
     * is_pinned reports as pinned.  STOKE_IPC_DEVICE: *out is a device handle of h->size bytes
     * usable in this backend's copies on `dev` (device_free is not called on it).
     *
     * ipc_close_mem: undoes one ipc_import_mem of `kind` whose *out was `ptr`. */
    int (*ipc_export_mem)(int dev, stoke_ipc_handle *h, void *ptr);
    int (*ipc_import_mem)(int dev, const stoke_ipc_handle *h, void **out);
    int (*ipc_close_mem)(int dev, int kind, void *ptr);
} stoke_backend;

/* The one symbol a plugin exports.  Returns STOKE_OK and sets *out to a table that stays valid
 * until shutdown, or a negative code (the plugin is then rejected, and may log why). */
typedef int (*stoke_backend_entry_fn)(const stoke_backend_host *host, const stoke_backend **out);

/* Size of the ABI v1 table: a plugin must report at least this many bytes. */
#define STOKE_BACKEND_V1_SIZE (offsetof(stoke_backend, ipc_import) + sizeof(void *))
/* Size of the ABI v2 table (v1 + the IPC group): a v2 plugin must report at least this. */
#define STOKE_BACKEND_V2_SIZE (offsetof(stoke_backend, ipc_close_mem) + sizeof(void *))

#ifdef __cplusplus
}
#endif
#endif
