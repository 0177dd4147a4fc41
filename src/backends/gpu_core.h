/* What the cuda and hip backends share (private to libstoke): the backend ABI implemented once
 * (gpu_core.c) over a table of driver entry points shaped like the CUDA driver API
 * (stoke__gpu_api), which each backend fills from its own library, and a description of the
 * backend (stoke__gpu_desc) with hooks for what really differs.
 *
 * - HIP's runtime API mirrors CUDA's (the same calls under other names, CUDA's error numbers and
 *   flag values), so the table has the CUDA driver's types (cuda_driver.h) and the shared code
 *   compares results with CUDA's codes: the cuda backend fills it with its driver's entry points
 *   as they are, the hip backend with the runtime's where the types agree and small adapters
 *   where a HIP type differs (hipStream_t, pointers for device memory) or a call has another
 *   shape (hipMemcpyAsync); hip.c asserts that the codes and flags agree.
 * - Each backend keeps what is its own: loading the library (names, symbols, version floor), the
 *   probe and its reasons, the driver's error names, the device properties it reports its own
 *   way, and how a device is made current: CUDA pushes the device's primary context (retained
 *   on first use), HIP selects the device on the calling thread.  Every driver call for a device
 *   runs between the backend's enter and leave hooks.
 * - The backend ABI's functions take no backend argument, so each backend instantiates its own
 *   table over its own static stoke__gpu with STOKE__GPU_BACKEND; streams and events carry their
 *   stoke__gpu, and their functions are shared as they are.
 * - Pinned memory: host_alloc and host_register (PORTABLE), tracked in a range table so that
 *   is_pinned answers for interior addresses; memory pinned by someone else in the process is
 *   recognised where the table has pointer_get_attribute (CUDA).
 *
 * Locking: `lock` serialises loading, probing, what a backend retains for a device (CUDA's
 * contexts) and shutdown; the backend's probe_locked and release_locked hooks run under it.
 * After a successful probe `api`, `ndev` and `devs` are immutable until shutdown, so the hot
 * paths (copies, events, is_pinned) read them without the lock (the registry publishes the
 * probe's result with release/acquire).  The range table has its own rwlock. */
#ifndef STOKE_GPU_CORE_H
#define STOKE_GPU_CORE_H

#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/builtin.h"
#include "backends/cuda_driver.h"
#include "backends/hostranges.h"

#define STOKE__GPU_MAX_DEVICES 64

/* The driver entry points the shared code calls, in the CUDA driver's types; the comment names
 * the CUDA and HIP calls each stands for.  Optional members may be NULL. */
typedef struct stoke__gpu_api {
    CUresult (*device_get)(CUdevice *dev, int ordinal);                 /* cuDeviceGet */
    CUresult (*device_get_name)(char *name, int len, CUdevice dev);     /* cuDeviceGetName */
    CUresult (*device_total_mem)(size_t *bytes, CUdevice dev);          /* cuDeviceTotalMem */
    CUresult (*device_get_pci_bus_id)(char *bus_id, int len, CUdevice dev); /* optional */
    CUresult (*host_alloc)(void **p, size_t size, unsigned flags);      /* cuMemHostAlloc */
    CUresult (*host_free)(void *p);                                     /* cuMemFreeHost */
    CUresult (*host_register)(void *p, size_t size, unsigned flags);    /* cuMemHostRegister */
    CUresult (*host_unregister)(void *p);                               /* cuMemHostUnregister */
    CUresult (*pointer_get_attribute)(void *data, int attr, CUdeviceptr p); /* optional */
    CUresult (*mem_alloc)(CUdeviceptr *dptr, size_t size);              /* cuMemAlloc, hipMalloc */
    CUresult (*mem_free)(CUdeviceptr dptr);                             /* cuMemFree, hipFree */
    CUresult (*stream_create)(CUstream *s, unsigned flags);             /* cuStreamCreate */
    CUresult (*stream_destroy)(CUstream s);
    CUresult (*stream_synchronize)(CUstream s);
    CUresult (*memcpy_htod)(CUdeviceptr dst, const void *src, size_t n, CUstream s); /* async */
    CUresult (*memcpy_dtoh)(void *dst, CUdeviceptr src, size_t n, CUstream s);       /* async */
    CUresult (*event_create)(CUevent *e, unsigned flags);               /* cuEventCreate */
    CUresult (*event_destroy)(CUevent e);
    CUresult (*event_record)(CUevent e, CUstream s);
    CUresult (*event_query)(CUevent e);
    CUresult (*event_synchronize)(CUevent e);
    /* optional, all three or none: sharing device memory with other processes */
    CUresult (*ipc_get)(CUipcMemHandle *h, CUdeviceptr dptr);           /* cuIpcGetMemHandle */
    CUresult (*ipc_open)(CUdeviceptr *dptr, CUipcMemHandle h, unsigned flags);
    CUresult (*ipc_close)(CUdeviceptr dptr);
} stoke__gpu_api;

/* A backend over the shared code: its words for messages and its hooks.  Static, one per
 * backend. */
typedef struct stoke__gpu_desc {
    const char *name;   /* the backend, first word of every message: "cuda" */
    const char *api;    /* "CUDA": "0 CUDA devices", "not a CUDA IPC handle" */
    const char *lib;    /* what the library is called: "driver", "runtime" */
    const char *vendor; /* stoke_device_props.vendor */
    uint32_t ipc_magic; /* first word of an exported handle's blob */
    /* Everything the probe does once the lock is held and nothing is ready: load the library,
     * fill core->api, count the devices and end with stoke__gpu_enumerate_locked.  Writes
     * `reason` and returns STOKE_ENODEV when the backend is unusable. */
    int (*probe_locked)(uint32_t flags, char *reason, size_t reason_len);
    /* The reason a successful probe gives: "2 device(s), driver CUDA 12.4". */
    void (*describe_locked)(char *reason, size_t reason_len);
    /* Releases what the backend holds besides pinned memory (CUDA's contexts) at shutdown, while
     * still ready; may be NULL. */
    void (*release_locked)(void);
    /* Makes device `dev` (valid) current for driver calls on this thread; *prev receives what
     * leave needs to give the caller back theirs.  `quiet` (shutdown, a retried question): only
     * with what the backend already holds, and without reporting an error.  Returns a status. */
    int (*enter)(int dev, int *prev, int quiet);
    void (*leave)(int dev, int prev);
    /* The driver's name and message for a result. */
    const char *(*err_name)(CUresult r);
    const char *(*err_text)(CUresult r);
    /* Completes what the API reports its own way: compute capability, driver version, and a
     * PCI address where device_get_pci_bus_id gave none. */
    void (*props)(CUdevice d, stoke_device_props *o);
    /* The API's names of the calls in stoke__gpu_api, for messages: "cuMemAlloc". */
    struct {
        const char *device_get, *device_get_name, *host_alloc, *host_free, *host_register,
            *host_unregister, *mem_alloc, *mem_free, *stream_create, *stream_destroy,
            *stream_synchronize, *memcpy_htod, *memcpy_dtoh, *event_create, *event_destroy,
            *event_record, *event_query, *event_synchronize, *ipc_get, *ipc_open, *ipc_close;
    } call;
} stoke__gpu_desc;

/* The state of one backend over the shared code (see Locking above). */
typedef struct stoke__gpu {
    const stoke__gpu_desc *desc;
    pthread_mutex_t lock;
    stoke__gpu_api api; /* filled by the probe; in use once `ready` */
    stoke__hostranges pinned;
    int ready;          /* probe succeeded */
    int ndev;
    CUdevice devs[STOKE__GPU_MAX_DEVICES];
} stoke__gpu;

#define STOKE__GPU_INIT(desc_)                                                                     \
    {.desc = (desc_), .lock = PTHREAD_MUTEX_INITIALIZER, .pinned = STOKE__HOSTRANGES_INIT}

/* A driver table member and the symbol it is resolved from. */
typedef struct stoke__gpu_sym {
    size_t offset;
    const char *symbol;
    int required;
} stoke__gpu_sym;

/* Resolves each of the `n` symbols from `dl` into `table` (NULL where absent). */
void stoke__gpu_resolve(void *dl, void *table, const stoke__gpu_sym *syms, size_t n);
/* The first required symbol `table` lacks, or NULL. */
const char *stoke__gpu_missing(const void *table, const stoke__gpu_sym *syms, size_t n);

/* Fails (stoke__backend_vfail) with the driver's name and message for `r` after a description
 * of the call: "cuda: cuMemAlloc(4096 bytes) on device 1: CUDA_ERROR_OUT_OF_MEMORY (2): out of
 * memory".  STOKE_ENOMEM for out of memory, else STOKE_EBACKEND. */
int stoke__gpu_fail(const stoke__gpu *c, CUresult r, const char *fmt, ...) STOKE__PRINTF(3, 4);

/* The end of a probe: takes the handles of the first `n` devices (at most
 * STOKE__GPU_MAX_DEVICES, with a warning) and marks the backend ready; with none, or a handle
 * refused, writes `reason` and returns STOKE_ENODEV.  Under the lock. */
int stoke__gpu_enumerate_locked(stoke__gpu *c, int n, char *reason, size_t reason_len);
/* Frees what is still pinned (quietly: it leaves the caller's last error alone), calls
 * release_locked and forgets the probe.  Under the lock. */
void stoke__gpu_reset_locked(stoke__gpu *c);

/* The backend ABI (stoke/backend.h), over `c`. */
int stoke__gpu_probe(stoke__gpu *c, uint32_t flags, char *reason, size_t reason_len);
int stoke__gpu_device_count(stoke__gpu *c, int *count);
int stoke__gpu_device_props(stoke__gpu *c, int dev, stoke_device_props *p);
int stoke__gpu_host_alloc(stoke__gpu *c, int dev, size_t size, void **out);
int stoke__gpu_host_free(stoke__gpu *c, int dev, void *ptr);
int stoke__gpu_host_register(stoke__gpu *c, int dev, void *ptr, size_t size);
int stoke__gpu_host_unregister(stoke__gpu *c, int dev, void *ptr);
int stoke__gpu_is_pinned(stoke__gpu *c, const void *ptr, int *out);
int stoke__gpu_device_alloc(stoke__gpu *c, int dev, size_t size, void **out);
int stoke__gpu_device_free(stoke__gpu *c, int dev, void *handle);
int stoke__gpu_stream_create(stoke__gpu *c, int dev, stoke_backend_stream **out);
int stoke__gpu_stream_destroy(stoke_backend_stream *s);
int stoke__gpu_stream_synchronize(stoke_backend_stream *s);
int stoke__gpu_copy_h2d_async(void *dst, size_t dst_offset, const void *src, size_t n,
                              stoke_backend_stream *s);
int stoke__gpu_copy_d2h_async(void *dst, const void *src, size_t src_offset, size_t n,
                              stoke_backend_stream *s);
int stoke__gpu_event_create(stoke__gpu *c, int dev, stoke_backend_event **out);
int stoke__gpu_event_destroy(stoke_backend_event *e);
int stoke__gpu_event_record(stoke_backend_event *e, stoke_backend_stream *s);
int stoke__gpu_event_query(stoke_backend_event *e);
int stoke__gpu_event_synchronize(stoke_backend_event *e);
void stoke__gpu_shutdown(stoke__gpu *c);
int stoke__gpu_ipc_export_mem(stoke__gpu *c, int dev, stoke_ipc_handle *h, void *ptr);
int stoke__gpu_ipc_import_mem(stoke__gpu *c, int dev, const stoke_ipc_handle *h, void **out);
int stoke__gpu_ipc_close_mem(stoke__gpu *c, int dev, int kind, void *ptr);

/* One function of backend table `t` bound to core `c`: t_fn(params) calls stoke__gpu_fn(&c,
 * args). */
#define STOKE__GPU_BIND(t, c, fn, params, ...)                                                     \
    static int t##_##fn params                                                                     \
    {                                                                                              \
        return stoke__gpu_##fn(&(c), __VA_ARGS__);                                                 \
    }

/* Defines `static const stoke_backend t`, the table of the backend whose state is the static
 * stoke__gpu `c`, with `name_` and `description_`. */
#define STOKE__GPU_BACKEND(t, c, name_, description_)                                              \
    STOKE__GPU_BIND(t, c, probe, (uint32_t f, char *r, size_t n), f, r, n)                         \
    STOKE__GPU_BIND(t, c, device_count, (int *n), n)                                               \
    STOKE__GPU_BIND(t, c, device_props, (int d, stoke_device_props *p), d, p)                      \
    STOKE__GPU_BIND(t, c, host_alloc, (int d, size_t n, void **o), d, n, o)                        \
    STOKE__GPU_BIND(t, c, host_free, (int d, void *p), d, p)                                       \
    STOKE__GPU_BIND(t, c, host_register, (int d, void *p, size_t n), d, p, n)                      \
    STOKE__GPU_BIND(t, c, host_unregister, (int d, void *p), d, p)                                 \
    STOKE__GPU_BIND(t, c, is_pinned, (const void *p, int *o), p, o)                                \
    STOKE__GPU_BIND(t, c, device_alloc, (int d, size_t n, void **o), d, n, o)                      \
    STOKE__GPU_BIND(t, c, device_free, (int d, void *p), d, p)                                     \
    STOKE__GPU_BIND(t, c, stream_create, (int d, stoke_backend_stream **o), d, o)                  \
    STOKE__GPU_BIND(t, c, event_create, (int d, stoke_backend_event **o), d, o)                    \
    STOKE__GPU_BIND(t, c, ipc_export_mem, (int d, stoke_ipc_handle *h, void *p), d, h, p)          \
    STOKE__GPU_BIND(t, c, ipc_import_mem, (int d, const stoke_ipc_handle *h, void **o), d, h, o)   \
    STOKE__GPU_BIND(t, c, ipc_close_mem, (int d, int k, void *p), d, k, p)                         \
    static void t##_shutdown(void)                                                                 \
    {                                                                                              \
        stoke__gpu_shutdown(&(c));                                                                 \
    }                                                                                              \
    static const stoke_backend t = {                                                               \
        .abi_version = STOKE_BACKEND_ABI_VERSION, .size = sizeof(stoke_backend), .name = name_,    \
        .description = description_,                                                               \
        .caps = STOKE_CAP_PINNED_ALLOC | STOKE_CAP_HOST_REGISTER | STOKE_CAP_DEVICE_MEMORY |       \
                STOKE_CAP_ASYNC_COPY | STOKE_CAP_EVENTS | STOKE_CAP_IPC,                           \
        .probe = t##_probe, .device_count = t##_device_count, .device_props = t##_device_props,    \
        .host_alloc = t##_host_alloc, .host_free = t##_host_free,                                  \
        .host_register = t##_host_register, .host_unregister = t##_host_unregister,                \
        .is_pinned = t##_is_pinned, .device_alloc = t##_device_alloc,                              \
        .device_free = t##_device_free, .stream_create = t##_stream_create,                        \
        .stream_destroy = stoke__gpu_stream_destroy,                                               \
        .stream_synchronize = stoke__gpu_stream_synchronize,                                       \
        .copy_h2d_async = stoke__gpu_copy_h2d_async, .copy_d2h_async = stoke__gpu_copy_d2h_async,  \
        .event_create = t##_event_create, .event_destroy = stoke__gpu_event_destroy,               \
        .event_record = stoke__gpu_event_record, .event_query = stoke__gpu_event_query,            \
        .event_synchronize = stoke__gpu_event_synchronize, .shutdown = t##_shutdown,               \
        .ipc_export_mem = t##_ipc_export_mem, .ipc_import_mem = t##_ipc_import_mem,                \
        .ipc_close_mem = t##_ipc_close_mem,                                                        \
    }

#endif
