/* The cuda backend: the CUDA driver API, loaded at run time from libcuda.so.1.  The backend ABI
 * itself is the code it shares with the hip backend (gpu_core.c), over this file's driver.
 *
 * - The driver is dlopen'ed by its versioned soname only ("libcuda.so.1", or STOKE_CUDA_LIBRARY),
 *   never "libcuda.so", which is often the toolkit's stub that fails every call.  A path under a
 *   "stubs" directory is refused without loading it; cuInit returning CUDA_ERROR_STUB_LIBRARY is
 *   reported as such.
 * - Entry points are resolved once into a private table (cuda_driver.h), by their `_v2` names
 *   where the driver has several; each symbol is required or optional.  Drivers older than
 *   STOKE_CUDA_DRIVER_MIN are refused.  The shared code's table (gpu_core.h) has the driver's
 *   own types: it takes the driver's entry points as they are.
 * - probe calls cuInit, cuDriverGetVersion and cuDeviceGetCount only: no context is created.
 * - Each device's primary context is retained the first time something is done on that device,
 *   and pushed current only around the driver calls for that device (then popped): the enter and
 *   leave hooks.  So device 0 never gets a context unless it is used, and the caller's own
 *   current context is untouched.  Shutdown releases every retained context.
 * - Pinned memory by others in the process (e.g. another framework) is recognised through
 *   cuPointerGetAttribute(MEMORY_TYPE), which needs no current context.
 *
 * Locking: `g.core.lock` (gpu_core.h) serialises loading, probing, retaining contexts and
 * shutdown.  A retained context is published with release/acquire atomics. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <limits.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "backends/cuda_driver.h"
#include "backends/gpu_core.h"
#include "common/env.h"
#include "common/internal.h"

#define CUDA_DEFAULT_LIBRARY "libcuda.so.1"

/* Symbol each member of the driver table is resolved from: its own name, or with the _V2 macros
 * the `_v2` version where the driver has several. */
#define SYM(member, suffix, req)                                                                   \
    {                                                                                              \
        offsetof(struct stoke__cuda_driver, member), #member suffix, req                           \
    }
#define REQ(member)    SYM(member, "", 1)
#define REQ_V2(member) SYM(member, "_v2", 1)
#define OPT(member)    SYM(member, "", 0)
static const stoke__gpu_sym cuda_symbols[] = {
    REQ(cuInit),
    REQ(cuDriverGetVersion),
    REQ(cuDeviceGetCount),
    REQ(cuDeviceGet),
    REQ(cuDeviceGetName),
    REQ_V2(cuDeviceTotalMem),
    REQ(cuDeviceGetAttribute),
    REQ(cuDevicePrimaryCtxRetain),
    REQ_V2(cuDevicePrimaryCtxRelease),
    REQ_V2(cuCtxPushCurrent),
    REQ_V2(cuCtxPopCurrent),
    REQ(cuMemHostAlloc),
    REQ(cuMemFreeHost),
    REQ_V2(cuMemHostRegister),
    REQ(cuMemHostUnregister),
    REQ_V2(cuMemAlloc),
    REQ_V2(cuMemFree),
    REQ(cuStreamCreate),
    REQ_V2(cuStreamDestroy),
    REQ(cuStreamSynchronize),
    REQ_V2(cuMemcpyHtoDAsync),
    REQ_V2(cuMemcpyDtoHAsync),
    REQ(cuEventCreate),
    REQ_V2(cuEventDestroy),
    REQ(cuEventRecord),
    REQ(cuEventQuery),
    REQ(cuEventSynchronize),
    OPT(cuDeviceGetPCIBusId),
    OPT(cuPointerGetAttribute),
    OPT(cuGetErrorString),
    OPT(cuGetErrorName),
    OPT(cuIpcGetMemHandle),
    SYM(cuIpcOpenMemHandle, "_v2", 0),
    OPT(cuIpcCloseMemHandle),
};
#undef SYM
#undef REQ
#undef REQ_V2
#undef OPT

static const stoke__gpu_desc cuda_desc;

static struct {
    stoke__gpu core; /* lock, shared table, devices, pinned ranges */
    int test_mode;   /* driver table supplied by a test */
    struct stoke__cuda_driver test_drv;
    struct stoke__cuda_driver drv; /* the table in use once `core.ready` */
    void *dl;                      /* the library (kept loaded: see load_driver_locked) */
    char dl_path[512];             /* what `dl` was opened as */
    int driver_version;
    _Atomic(CUcontext) ctx[STOKE__GPU_MAX_DEVICES]; /* primary contexts, NULL until first used */
} g = {.core = STOKE__GPU_INIT(&cuda_desc)};

/* ---- errors ------------------------------------------------------------------------------- */

static const char *cu_name(CUresult r)
{
    const char *s = NULL;
    if (g.drv.cuGetErrorName && g.drv.cuGetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    switch (r) {
    case CUDA_ERROR_INVALID_VALUE: return "CUDA_ERROR_INVALID_VALUE";
    case CUDA_ERROR_OUT_OF_MEMORY: return "CUDA_ERROR_OUT_OF_MEMORY";
    case CUDA_ERROR_NOT_INITIALIZED: return "CUDA_ERROR_NOT_INITIALIZED";
    case CUDA_ERROR_STUB_LIBRARY: return "CUDA_ERROR_STUB_LIBRARY";
    case CUDA_ERROR_NO_DEVICE: return "CUDA_ERROR_NO_DEVICE";
    case CUDA_ERROR_INVALID_CONTEXT: return "CUDA_ERROR_INVALID_CONTEXT";
    case CUDA_ERROR_NOT_READY: return "CUDA_ERROR_NOT_READY";
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        return "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
    case CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED: return "CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED";
    default: return "CUDA_ERROR";
    }
}

static const char *cu_msg(CUresult r)
{
    const char *s = NULL;
    if (g.drv.cuGetErrorString && g.drv.cuGetErrorString(r, &s) == CUDA_SUCCESS && s)
        return s;
    return "no message from the driver";
}

/* ---- loading the driver ------------------------------------------------------------------- */

/* Fills g.drv and the shared table from the library or the test table; on failure writes
 * `reason`.  Under the lock. */
static int load_driver_locked(char *reason, size_t reason_len)
{
    struct stoke__cuda_driver drv;
    memset(&drv, 0, sizeof(drv));
    const char *what = CUDA_DEFAULT_LIBRARY;
    if (g.test_mode) {
        drv = g.test_drv;
        what = "mock driver";
    } else {
        const char *path = stoke__env_str(STOKE_ENV_CUDA_LIBRARY);
        if (!path)
            path = CUDA_DEFAULT_LIBRARY;
        what = path;
        if (strstr(path, "/stubs/")) {
            stoke__fmt(reason, reason_len,
                       "stub library: %s is the CUDA toolkit's link-time "
                       "stub (not loaded); point STOKE_CUDA_LIBRARY at the driver's "
                       "libcuda.so.1",
                       path);
            return STOKE_ENODEV;
        }
        if (!g.dl || strcmp(g.dl_path, path) != 0) {
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *err = dlerror();
                if (strcmp(path, CUDA_DEFAULT_LIBRARY) == 0)
                    stoke__fmt(reason, reason_len,
                               "libcuda.so.1 not found (no NVIDIA driver "
                               "installed?): %s",
                               err ? err : "dlopen failed");
                else
                    stoke__fmt(reason, reason_len, "%s not found (STOKE_CUDA_LIBRARY): %s", path,
                               err ? err : "dlopen failed");
                return STOKE_ENODEV;
            }
            /* Where did the name resolve to?  A toolkit stub renamed or linked as .so.1 is
             * refused here (it is already mapped, but never called). */
            struct link_map *lm = NULL;
            char real[PATH_MAX];
            const char *where = NULL;
            if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name) {
                /* the name as opened, then the file it is (a libcuda.so.1 linked to the stub) */
                if (strstr(lm->l_name, "/stubs/"))
                    where = lm->l_name;
                else if (realpath(lm->l_name, real) && strstr(real, "/stubs/"))
                    where = real;
            }
            if (where) {
                stoke__fmt(reason, reason_len,
                           "stub library: %s resolved to %s, the CUDA "
                           "toolkit's link-time stub, not the driver",
                           path, where);
                dlclose(h);
                return STOKE_ENODEV;
            }
            /* A previously loaded driver is deliberately never dlclose'd (drivers register
             * process-wide state); only tests switch paths. */
            g.dl = h;
            stoke__strlcpy(g.dl_path, path, sizeof(g.dl_path));
        }
        stoke__gpu_resolve(g.dl, &drv, cuda_symbols, STOKE__ARRAY_LEN(cuda_symbols));
    }
    const char *missing = stoke__gpu_missing(&drv, cuda_symbols, STOKE__ARRAY_LEN(cuda_symbols));
    if (missing) {
        int v = 0;
        if (drv.cuDriverGetVersion && drv.cuDriverGetVersion(&v) == CUDA_SUCCESS && v > 0)
            stoke__fmt(reason, reason_len,
                       "driver too old: %s (CUDA %d.%d) lacks %s; stoke "
                       "needs CUDA %d.%d or newer",
                       what, v / 1000, v % 1000 / 10, missing, STOKE_CUDA_DRIVER_MIN / 1000,
                       STOKE_CUDA_DRIVER_MIN % 1000 / 10);
        else
            stoke__fmt(reason, reason_len, "driver too old or not a CUDA driver: %s lacks %s", what,
                       missing);
        return STOKE_ENODEV;
    }
    g.drv = drv;
    g.core.api = (stoke__gpu_api){.device_get = drv.cuDeviceGet,
                                  .device_get_name = drv.cuDeviceGetName,
                                  .device_total_mem = drv.cuDeviceTotalMem,
                                  .device_get_pci_bus_id = drv.cuDeviceGetPCIBusId,
                                  .host_alloc = drv.cuMemHostAlloc,
                                  .host_free = drv.cuMemFreeHost,
                                  .host_register = drv.cuMemHostRegister,
                                  .host_unregister = drv.cuMemHostUnregister,
                                  .pointer_get_attribute = drv.cuPointerGetAttribute,
                                  .mem_alloc = drv.cuMemAlloc,
                                  .mem_free = drv.cuMemFree,
                                  .stream_create = drv.cuStreamCreate,
                                  .stream_destroy = drv.cuStreamDestroy,
                                  .stream_synchronize = drv.cuStreamSynchronize,
                                  .memcpy_htod = drv.cuMemcpyHtoDAsync,
                                  .memcpy_dtoh = drv.cuMemcpyDtoHAsync,
                                  .event_create = drv.cuEventCreate,
                                  .event_destroy = drv.cuEventDestroy,
                                  .event_record = drv.cuEventRecord,
                                  .event_query = drv.cuEventQuery,
                                  .event_synchronize = drv.cuEventSynchronize,
                                  .ipc_get = drv.cuIpcGetMemHandle,
                                  .ipc_open = drv.cuIpcOpenMemHandle,
                                  .ipc_close = drv.cuIpcCloseMemHandle};
    return STOKE_OK;
}

/* ---- probe -------------------------------------------------------------------------------- */

static int cuda_probe_locked(uint32_t flags, char *reason, size_t reason_len)
{
    memset(&g.drv, 0, sizeof(g.drv));
    int rc = load_driver_locked(reason, reason_len);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = g.drv.cuInit(0);
    if (r == CUDA_ERROR_STUB_LIBRARY) {
        stoke__fmt(reason, reason_len,
                   "stub library: cuInit returned CUDA_ERROR_STUB_LIBRARY "
                   "(%s is the CUDA toolkit's stub, not the driver)",
                   g.test_mode ? "the driver" : g.dl_path);
        return STOKE_ENODEV;
    }
    if (r == CUDA_ERROR_NO_DEVICE) {
        stoke__fmt(reason, reason_len, "no device: cuInit returned CUDA_ERROR_NO_DEVICE (%s)",
                   cu_msg(r));
        return STOKE_ENODEV;
    }
    if (r != CUDA_SUCCESS) {
        stoke__fmt(reason, reason_len, "initialization error: cuInit failed with %s (%d): %s",
                   cu_name(r), r, cu_msg(r));
        return STOKE_ENODEV;
    }
    int v = 0;
    r = g.drv.cuDriverGetVersion(&v);
    if (r != CUDA_SUCCESS) {
        stoke__fmt(reason, reason_len,
                   "initialization error: cuDriverGetVersion failed with "
                   "%s (%d): %s",
                   cu_name(r), r, cu_msg(r));
        return STOKE_ENODEV;
    }
    if (v < STOKE_CUDA_DRIVER_MIN) {
        stoke__fmt(reason, reason_len,
                   "driver too old: it supports CUDA %d.%d, stoke needs "
                   "%d.%d or newer",
                   v / 1000, v % 1000 / 10, STOKE_CUDA_DRIVER_MIN / 1000,
                   STOKE_CUDA_DRIVER_MIN % 1000 / 10);
        return STOKE_ENODEV;
    }
    int n = 0;
    r = g.drv.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS) {
        stoke__fmt(reason, reason_len, "no device: cuDeviceGetCount failed with %s (%d): %s",
                   cu_name(r), r, cu_msg(r));
        return STOKE_ENODEV;
    }
    g.driver_version = v;
    return stoke__gpu_enumerate_locked(&g.core, n, reason, reason_len);
}

static void cuda_describe_locked(char *reason, size_t reason_len)
{
    stoke__fmt(reason, reason_len, "%d device(s), driver CUDA %d.%d", g.core.ndev,
               g.driver_version / 1000, g.driver_version % 1000 / 10);
}

static void cuda_props(CUdevice d, stoke_device_props *o)
{
    g.drv.cuDeviceGetAttribute(&o->compute_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    g.drv.cuDeviceGetAttribute(&o->compute_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
    int dom = 0, bus = 0, slot = 0;
    if (!o->pci_bus_id[0] &&
        g.drv.cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d) == 0 &&
        g.drv.cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d) == 0 &&
        g.drv.cuDeviceGetAttribute(&slot, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d) == 0)
        stoke__fmt(o->pci_bus_id, sizeof(o->pci_bus_id), "%04x:%02x:%02x.0", dom, bus, slot);
    stoke__fmt(o->driver_version, sizeof(o->driver_version), "CUDA %d.%d", g.driver_version / 1000,
               g.driver_version % 1000 / 10);
}

/* ---- contexts ----------------------------------------------------------------------------- */

/* Retains the primary context of `dev` (first use: under the lock, so only once). */
static int retain_ctx(int dev, CUcontext *out)
{
    pthread_mutex_lock(&g.core.lock);
    CUcontext c = atomic_load_explicit(&g.ctx[dev], memory_order_relaxed);
    if (!c) {
        CUresult r = g.drv.cuDevicePrimaryCtxRetain(&c, g.core.devs[dev]);
        if (r != CUDA_SUCCESS || !c) {
            pthread_mutex_unlock(&g.core.lock);
            return stoke__gpu_fail(&g.core, r ? r : CUDA_ERROR_INVALID_CONTEXT,
                                   "retaining the primary context of device %d", dev);
        }
        stoke__log(STOKE_LOG_DEBUG, "cuda: retained the primary context of device %d", dev);
        atomic_store_explicit(&g.ctx[dev], c, memory_order_release);
    }
    pthread_mutex_unlock(&g.core.lock);
    *out = c;
    return STOKE_OK;
}

/* The enter hook (gpu_core.h): pushes the primary context of `dev`, retained on first use
 * (`quiet`: only one already retained). */
static int cuda_enter(int dev, int *prev, int quiet)
{
    CUcontext c = atomic_load_explicit(&g.ctx[dev], memory_order_acquire);
    if (!c && quiet)
        return STOKE_ENODEV;
    int rc = c ? STOKE_OK : retain_ctx(dev, &c);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = g.drv.cuCtxPushCurrent(c);
    if (r == CUDA_SUCCESS || quiet)
        return r == CUDA_SUCCESS ? STOKE_OK : STOKE_EBACKEND;
    return stoke__gpu_fail(&g.core, r, "cuCtxPushCurrent");
}

static void cuda_leave(int dev, int prev)
{
    CUcontext c;
    g.drv.cuCtxPopCurrent(&c);
}

/* Releases every retained context (shutdown). */
static void cuda_release_locked(void)
{
    for (int i = 0; i < g.core.ndev; i++) {
        CUcontext c = atomic_exchange(&g.ctx[i], NULL);
        if (c)
            g.drv.cuDevicePrimaryCtxRelease(g.core.devs[i]);
    }
}

int stoke__cuda_context_retained(int dev)
{
    if (dev < 0 || dev >= STOKE__GPU_MAX_DEVICES)
        return 0;
    return atomic_load(&g.ctx[dev]) != NULL;
}

void stoke__cuda_set_driver_for_test(const struct stoke__cuda_driver *d)
{
    pthread_mutex_lock(&g.core.lock);
    stoke__gpu_reset_locked(&g.core);
    g.test_mode = d != NULL;
    g.test_drv = d ? *d : (struct stoke__cuda_driver){0};
    memset(&g.drv, 0, sizeof(g.drv));
    pthread_mutex_unlock(&g.core.lock);
}

/* ---- the backend -------------------------------------------------------------------------- */

static const stoke__gpu_desc cuda_desc = {
    .name = "cuda",
    .api = "CUDA",
    .lib = "driver",
    .vendor = "NVIDIA",
    .ipc_magic = 0x50494355u, /* "UCIP" */
    .probe_locked = cuda_probe_locked,
    .describe_locked = cuda_describe_locked,
    .release_locked = cuda_release_locked,
    .enter = cuda_enter,
    .leave = cuda_leave,
    .err_name = cu_name,
    .err_text = cu_msg,
    .props = cuda_props,
    .call = {.device_get = "cuDeviceGet",
             .device_get_name = "cuDeviceGetName",
             .host_alloc = "cuMemHostAlloc",
             .host_free = "cuMemFreeHost",
             .host_register = "cuMemHostRegister",
             .host_unregister = "cuMemHostUnregister",
             .mem_alloc = "cuMemAlloc",
             .mem_free = "cuMemFree",
             .stream_create = "cuStreamCreate",
             .stream_destroy = "cuStreamDestroy",
             .stream_synchronize = "cuStreamSynchronize",
             .memcpy_htod = "cuMemcpyHtoDAsync",
             .memcpy_dtoh = "cuMemcpyDtoHAsync",
             .event_create = "cuEventCreate",
             .event_destroy = "cuEventDestroy",
             .event_record = "cuEventRecord",
             .event_query = "cuEventQuery",
             .event_synchronize = "cuEventSynchronize",
             .ipc_get = "cuIpcGetMemHandle",
             .ipc_open = "cuIpcOpenMemHandle",
             .ipc_close = "cuIpcCloseMemHandle"},
};

STOKE__GPU_BACKEND(cuda_backend, g.core, "cuda",
                   "NVIDIA CUDA (driver API, libcuda.so.1 loaded at run time)");

int stoke__backend_cuda_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &cuda_backend;
    return STOKE_OK;
}
