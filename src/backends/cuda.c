/* The cuda backend: the CUDA driver API, loaded at run time from libcuda.so.1.
 *
 * - The driver is dlopen'ed by its versioned soname only ("libcuda.so.1", or STOKE_CUDA_LIBRARY),
 *   never "libcuda.so", which is often the toolkit's stub that fails every call.  A path under a
 *   "stubs" directory is refused without loading it; cuInit returning CUDA_ERROR_STUB_LIBRARY is
 *   reported as such.
 * - Entry points are resolved once into a private table (cuda_driver.h), by their `_v2` names
 *   where the driver has several; each symbol is required or optional.  Drivers older than
 *   STOKE_CUDA_DRIVER_MIN are refused.
 * - probe calls cuInit, cuDriverGetVersion and cuDeviceGetCount only: no context is created.
 * - Each device's primary context is retained the first time something is done on that device,
 *   and pushed current only around the driver calls for that device (then popped), so device 0
 *   never gets a context unless it is used, and the caller's own current context is untouched.
 * - Pinned memory: cuMemHostAlloc(PORTABLE) and cuMemHostRegister(PORTABLE), tracked in a range
 *   table (is_pinned answers for interior addresses); memory pinned by someone else in the
 *   process (e.g. another framework) is recognised through cuPointerGetAttribute(MEMORY_TYPE),
 *   which needs no current context.
 * - Every call that needs a context runs between push()/enter() and leave(), which pops and
 *   turns the driver's result into a status with the call described (see leave).
 *
 * Locking: `g.lock` serialises loading, probing, retaining contexts and shutdown.  After a
 * successful probe `g.drv`, `g.ndev` and `g.devs[i].dev` are immutable until shutdown, so the
 * hot paths (copies, events, is_pinned) read them without the lock; a retained context is
 * published with release/acquire atomics.  The pinned range table has its own rwlock. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "backends/cuda_driver.h"
#include "backends/hostranges.h"
#include "common/env.h"
#include "common/internal.h"

#define CUDA_MAX_DEVICES 64
#define CUDA_DEFAULT_LIBRARY "libcuda.so.1"

enum { RANGE_ALLOC = 0, RANGE_REGISTERED = 1 };

/* Symbol each member of the driver table is resolved from. */
static const struct {
    size_t offset;
    const char *symbol;
    int required;
} cuda_symbols[] = {
#define REQ(member, sym) {offsetof(struct stoke__cuda_driver, member), sym, 1}
#define OPT(member, sym) {offsetof(struct stoke__cuda_driver, member), sym, 0}
    REQ(cuInit, "cuInit"),
    REQ(cuDriverGetVersion, "cuDriverGetVersion"),
    REQ(cuDeviceGetCount, "cuDeviceGetCount"),
    REQ(cuDeviceGet, "cuDeviceGet"),
    REQ(cuDeviceGetName, "cuDeviceGetName"),
    REQ(cuDeviceTotalMem, "cuDeviceTotalMem_v2"),
    REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute"),
    REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"),
    REQ(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"),
    REQ(cuCtxPushCurrent, "cuCtxPushCurrent_v2"),
    REQ(cuCtxPopCurrent, "cuCtxPopCurrent_v2"),
    REQ(cuMemHostAlloc, "cuMemHostAlloc"),
    REQ(cuMemFreeHost, "cuMemFreeHost"),
    REQ(cuMemHostRegister, "cuMemHostRegister_v2"),
    REQ(cuMemHostUnregister, "cuMemHostUnregister"),
    REQ(cuMemAlloc, "cuMemAlloc_v2"),
    REQ(cuMemFree, "cuMemFree_v2"),
    REQ(cuStreamCreate, "cuStreamCreate"),
    REQ(cuStreamDestroy, "cuStreamDestroy_v2"),
    REQ(cuStreamSynchronize, "cuStreamSynchronize"),
    REQ(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    REQ(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    REQ(cuEventCreate, "cuEventCreate"),
    REQ(cuEventDestroy, "cuEventDestroy_v2"),
    REQ(cuEventRecord, "cuEventRecord"),
    REQ(cuEventQuery, "cuEventQuery"),
    REQ(cuEventSynchronize, "cuEventSynchronize"),
    OPT(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId"),
    OPT(cuPointerGetAttribute, "cuPointerGetAttribute"),
    OPT(cuGetErrorString, "cuGetErrorString"),
    OPT(cuGetErrorName, "cuGetErrorName"),
    OPT(cuIpcGetMemHandle, "cuIpcGetMemHandle"),
    OPT(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2"),
    OPT(cuIpcCloseMemHandle, "cuIpcCloseMemHandle"),
#undef REQ
#undef OPT
};

typedef struct cuda_dev {
    CUdevice dev;
    _Atomic(CUcontext) ctx; /* primary context, NULL until first used */
} cuda_dev;

static struct {
    pthread_mutex_t lock;
    int test_mode;                       /* driver table supplied by a test */
    struct stoke__cuda_driver test_drv;
    struct stoke__cuda_driver drv;       /* the table in use once `ready` */
    void *dl;                            /* the library (kept loaded: see shutdown) */
    char dl_path[512];                   /* what `dl` was opened as */
    int ready;                           /* probe succeeded */
    int driver_version;
    int ndev;
    cuda_dev devs[CUDA_MAX_DEVICES];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static stoke__hostranges g_ranges = STOKE__HOSTRANGES_INIT;

struct stoke_backend_stream {
    CUstream s;
    CUcontext ctx;
    int dev;
};

struct stoke_backend_event {
    CUevent e;
    CUcontext ctx;
    int dev;
};

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

/* Fails with the driver's name and message for `r` after a description of the call
 * (stoke__backend_vfail): "cuda: cuMemAlloc(4096 bytes) on device 1: CUDA_ERROR_OUT_OF_MEMORY
 * (2): out of memory". */
static int vfail(CUresult r, const char *fmt, va_list ap) STOKE__PRINTF(2, 0);
static int vfail(CUresult r, const char *fmt, va_list ap)
{
    return stoke__backend_vfail("cuda", r == CUDA_ERROR_OUT_OF_MEMORY, (int)r, cu_name(r),
                                cu_msg(r), fmt, ap);
}

static int cu_fail(CUresult r, const char *fmt, ...) STOKE__PRINTF(2, 3);
static int cu_fail(CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(r, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- loading the driver ------------------------------------------------------------------- */

/* Fills g.drv from the library or the test table; on failure writes `reason`.  Under g.lock. */
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
            stoke__fmt(reason, reason_len, "stub library: %s is the CUDA toolkit's link-time "
                       "stub (not loaded); point STOKE_CUDA_LIBRARY at the driver's "
                       "libcuda.so.1", path);
            return STOKE_ENODEV;
        }
        if (!g.dl || strcmp(g.dl_path, path) != 0) {
            void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
            if (!h) {
                const char *err = dlerror();
                if (strcmp(path, CUDA_DEFAULT_LIBRARY) == 0)
                    stoke__fmt(reason, reason_len, "libcuda.so.1 not found (no NVIDIA driver "
                               "installed?): %s", err ? err : "dlopen failed");
                else
                    stoke__fmt(reason, reason_len, "%s not found (STOKE_CUDA_LIBRARY): %s",
                               path, err ? err : "dlopen failed");
                return STOKE_ENODEV;
            }
            /* Where did the name resolve to?  A toolkit stub renamed or linked as .so.1 is
             * refused here (it is already mapped, but never called). */
            struct link_map *lm = NULL;
            if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name &&
                strstr(lm->l_name, "/stubs/")) {
                stoke__fmt(reason, reason_len, "stub library: %s resolved to %s, the CUDA "
                           "toolkit's link-time stub, not the driver", path, lm->l_name);
                dlclose(h);
                return STOKE_ENODEV;
            }
            /* A previously loaded driver is deliberately never dlclose'd (drivers register
             * process-wide state); only tests switch paths. */
            g.dl = h;
            stoke__strlcpy(g.dl_path, path, sizeof(g.dl_path));
        }
        for (size_t i = 0; i < STOKE__ARRAY_LEN(cuda_symbols); i++) {
            void *fn = dlsym(g.dl, cuda_symbols[i].symbol);
            memcpy((char *)&drv + cuda_symbols[i].offset, &fn, sizeof(fn));
        }
    }
    for (size_t i = 0; i < STOKE__ARRAY_LEN(cuda_symbols); i++) {
        void *fn;
        memcpy(&fn, (char *)&drv + cuda_symbols[i].offset, sizeof(fn));
        if (!fn && cuda_symbols[i].required) {
            int v = 0;
            if (drv.cuDriverGetVersion && drv.cuDriverGetVersion(&v) == CUDA_SUCCESS && v > 0)
                stoke__fmt(reason, reason_len, "driver too old: %s (CUDA %d.%d) lacks %s; "
                           "stoke needs CUDA %d.%d or newer", what, v / 1000, v % 1000 / 10,
                           cuda_symbols[i].symbol, STOKE_CUDA_DRIVER_MIN / 1000,
                           STOKE_CUDA_DRIVER_MIN % 1000 / 10);
            else
                stoke__fmt(reason, reason_len, "driver too old or not a CUDA driver: %s lacks "
                           "%s", what, cuda_symbols[i].symbol);
            return STOKE_ENODEV;
        }
    }
    g.drv = drv;
    return STOKE_OK;
}

static int cuda_probe(uint32_t flags, char *reason, size_t reason_len)
{
    pthread_mutex_lock(&g.lock);
    int rc = STOKE_OK;
    if (g.ready) {
        stoke__fmt(reason, reason_len, "%d device(s), driver CUDA %d.%d", g.ndev,
                   g.driver_version / 1000, g.driver_version % 1000 / 10);
        goto done;
    }
    memset(&g.drv, 0, sizeof(g.drv));
    rc = load_driver_locked(reason, reason_len);
    if (rc != STOKE_OK)
        goto done;
    rc = STOKE_ENODEV;
    CUresult r = g.drv.cuInit(0);
    if (r == CUDA_ERROR_STUB_LIBRARY) {
        stoke__fmt(reason, reason_len, "stub library: cuInit returned CUDA_ERROR_STUB_LIBRARY "
                   "(%s is the CUDA toolkit's stub, not the driver)",
                   g.test_mode ? "the driver" : g.dl_path);
        goto done;
    }
    if (r == CUDA_ERROR_NO_DEVICE) {
        stoke__fmt(reason, reason_len, "no device: cuInit returned CUDA_ERROR_NO_DEVICE (%s)",
                   cu_msg(r));
        goto done;
    }
    if (r != CUDA_SUCCESS) {
        stoke__fmt(reason, reason_len, "initialization error: cuInit failed with %s (%d): %s",
                   cu_name(r), r, cu_msg(r));
        goto done;
    }
    int v = 0;
    r = g.drv.cuDriverGetVersion(&v);
    if (r != CUDA_SUCCESS) {
        stoke__fmt(reason, reason_len, "initialization error: cuDriverGetVersion failed with "
                   "%s (%d): %s", cu_name(r), r, cu_msg(r));
        goto done;
    }
    if (v < STOKE_CUDA_DRIVER_MIN) {
        stoke__fmt(reason, reason_len, "driver too old: it supports CUDA %d.%d, stoke needs "
                   "%d.%d or newer", v / 1000, v % 1000 / 10, STOKE_CUDA_DRIVER_MIN / 1000,
                   STOKE_CUDA_DRIVER_MIN % 1000 / 10);
        goto done;
    }
    int n = 0;
    r = g.drv.cuDeviceGetCount(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        if (r != CUDA_SUCCESS)
            stoke__fmt(reason, reason_len, "no device: cuDeviceGetCount failed with %s (%d): "
                       "%s", cu_name(r), r, cu_msg(r));
        else
            stoke__strlcpy(reason, "no device: the driver reports 0 CUDA devices", reason_len);
        goto done;
    }
    if (n > CUDA_MAX_DEVICES) {
        stoke__log(STOKE_LOG_WARN, "cuda: %d devices; only the first %d are used", n,
                   CUDA_MAX_DEVICES);
        n = CUDA_MAX_DEVICES;
    }
    for (int i = 0; i < n; i++) {
        r = g.drv.cuDeviceGet(&g.devs[i].dev, i);
        if (r != CUDA_SUCCESS) {
            stoke__fmt(reason, reason_len, "initialization error: cuDeviceGet(%d) failed with "
                       "%s (%d): %s", i, cu_name(r), r, cu_msg(r));
            goto done;
        }
        atomic_store(&g.devs[i].ctx, NULL);
    }
    g.driver_version = v;
    g.ndev = n;
    g.ready = 1;
    rc = STOKE_OK;
    stoke__fmt(reason, reason_len, "%d device(s), driver CUDA %d.%d", n, v / 1000,
               v % 1000 / 10);
done:
    pthread_mutex_unlock(&g.lock);
    return rc;
}

static int cuda_device_count(int *count)
{
    pthread_mutex_lock(&g.lock);
    *count = g.ready ? g.ndev : 0;
    pthread_mutex_unlock(&g.lock);
    return STOKE_OK;
}

static int check_dev(int dev)
{
    if (!g.ready)
        return stoke__fail(STOKE_ENODEV, "cuda: the backend is not initialised");
    if (dev < 0 || dev >= g.ndev)
        return stoke__fail(STOKE_ERANGE, "cuda: no device %d (%d device(s))", dev, g.ndev);
    return STOKE_OK;
}

/* ---- contexts ----------------------------------------------------------------------------- */

/* The primary context of `dev`, retained on first use. */
static int get_ctx(int dev, CUcontext *out)
{
    int rc = check_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    CUcontext c = atomic_load_explicit(&g.devs[dev].ctx, memory_order_acquire);
    if (c) {
        *out = c;
        return STOKE_OK;
    }
    pthread_mutex_lock(&g.lock);
    c = atomic_load_explicit(&g.devs[dev].ctx, memory_order_relaxed);
    if (!c) {
        CUresult r = g.drv.cuDevicePrimaryCtxRetain(&c, g.devs[dev].dev);
        if (r != CUDA_SUCCESS || !c) {
            pthread_mutex_unlock(&g.lock);
            return cu_fail(r ? r : CUDA_ERROR_INVALID_CONTEXT,
                           "retaining the primary context of device %d", dev);
        }
        stoke__log(STOKE_LOG_DEBUG, "cuda: retained the primary context of device %d", dev);
        atomic_store_explicit(&g.devs[dev].ctx, c, memory_order_release);
    }
    pthread_mutex_unlock(&g.lock);
    *out = c;
    return STOKE_OK;
}

static int push(CUcontext c)
{
    CUresult r = g.drv.cuCtxPushCurrent(c);
    return r == CUDA_SUCCESS ? STOKE_OK : cu_fail(r, "cuCtxPushCurrent");
}

static void pop(void)
{
    CUcontext c;
    g.drv.cuCtxPopCurrent(&c);
}

/* Retains (if needed) and pushes the context of `dev`. */
static int enter(int dev)
{
    CUcontext c;
    int rc = get_ctx(dev, &c);
    return rc == STOKE_OK ? push(c) : rc;
}

/* Every driver call that needs a context is made between push() or enter() and leave():
 *     int rc = push(s->ctx);
 *     return rc != STOKE_OK ? rc : leave(g.drv.cuXxx(...), "cuXxx on device %d", s->dev);
 * leave() pops the context, then turns `r`, the result of the call, into a status; `fmt`
 * describes the call for the error message. */
static int leave(CUresult r, const char *fmt, ...) STOKE__PRINTF(2, 3);
static int leave(CUresult r, const char *fmt, ...)
{
    pop();
    if (r == CUDA_SUCCESS)
        return STOKE_OK;
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(r, fmt, ap);
    va_end(ap);
    return rc;
}

int stoke__cuda_context_retained(int dev)
{
    if (dev < 0 || dev >= CUDA_MAX_DEVICES)
        return 0;
    return atomic_load(&g.devs[dev].ctx) != NULL;
}

/* ---- devices ------------------------------------------------------------------------------ */

static int cuda_device_props(int dev, stoke_device_props *p)
{
    int rc = check_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    CUdevice d = g.devs[dev].dev;
    stoke_device_props o = {.size = sizeof(o), .kind = STOKE_DEVICE_GPU};
    stoke__strlcpy(o.vendor, "NVIDIA", sizeof(o.vendor));
    CUresult r = g.drv.cuDeviceGetName(o.name, (int)sizeof(o.name), d);
    if (r != CUDA_SUCCESS)
        return cu_fail(r, "cuDeviceGetName(device %d)", dev);
    o.name[sizeof(o.name) - 1] = '\0';
    size_t mem = 0;
    if (g.drv.cuDeviceTotalMem(&mem, d) == CUDA_SUCCESS)
        o.total_memory = mem;
    g.drv.cuDeviceGetAttribute(&o.compute_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d);
    g.drv.cuDeviceGetAttribute(&o.compute_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d);
    if (!g.drv.cuDeviceGetPCIBusId ||
        g.drv.cuDeviceGetPCIBusId(o.pci_bus_id, (int)sizeof(o.pci_bus_id), d) != CUDA_SUCCESS) {
        int dom = 0, bus = 0, slot = 0;
        if (g.drv.cuDeviceGetAttribute(&dom, CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID, d) == 0 &&
            g.drv.cuDeviceGetAttribute(&bus, CU_DEVICE_ATTRIBUTE_PCI_BUS_ID, d) == 0 &&
            g.drv.cuDeviceGetAttribute(&slot, CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID, d) == 0)
            stoke__fmt(o.pci_bus_id, sizeof(o.pci_bus_id), "%04x:%02x:%02x.0", dom, bus, slot);
        else
            o.pci_bus_id[0] = '\0';
    }
    o.pci_bus_id[sizeof(o.pci_bus_id) - 1] = '\0';
    stoke__fmt(o.driver_version, sizeof(o.driver_version), "CUDA %d.%d", g.driver_version / 1000,
               g.driver_version % 1000 / 10);
    return stoke__props_out(p, &o);
}

/* ---- pinned host memory ------------------------------------------------------------------- */

static int cuda_host_alloc(int dev, size_t size, void **out)
{
    *out = NULL;
    int rc = enter(dev);
    if (rc != STOKE_OK)
        return rc;
    void *p = NULL;
    CUresult r = g.drv.cuMemHostAlloc(&p, size ? size : 1, CU_MEMHOSTALLOC_PORTABLE);
    rc = leave(r == CUDA_SUCCESS && !p ? CUDA_ERROR_OUT_OF_MEMORY : r,
               "cuMemHostAlloc(%zu bytes) for device %d", size, dev);
    if (rc != STOKE_OK)
        return rc;
    stoke__hostrange range = {.base = (uintptr_t)p, .size = size, .dev = dev,
                              .kind = RANGE_ALLOC};
    rc = stoke__hostranges_add(&g_ranges, &range);
    if (rc != STOKE_OK) {
        if (enter(dev) == STOKE_OK)
            leave(g.drv.cuMemFreeHost(p), "cuMemFreeHost");
        return stoke__fail(rc, "cuda: tracking pinned block %p failed", p);
    }
    *out = p;
    return STOKE_OK;
}

/* Forgets the tracked range starting at `ptr` (of `kind`) and releases it with `release` on its
 * device.  If the driver cannot be entered or refuses, the memory is still pinned: the range is
 * tracked again. */
static int release_range(void *ptr, int kind, const char *what, CUresult (*release)(void *),
                         const char *fn)
{
    stoke__hostrange r;
    if (!stoke__hostranges_find(&g_ranges, ptr, &r) || r.base != (uintptr_t)ptr || r.kind != kind)
        return stoke__fail(STOKE_EINVAL, "cuda: %s(%p): not a %s", what, ptr,
                           kind == RANGE_ALLOC ? "block from host_alloc" : "registered range");
    if (stoke__hostranges_remove(&g_ranges, ptr, &r) != STOKE_OK)
        return stoke__fail(STOKE_EINVAL, "cuda: %s(%p): released twice", what, ptr);
    int rc = enter(r.dev);
    if (rc == STOKE_OK)
        rc = leave(release(ptr), "%s(%p) on device %d", fn, ptr, r.dev);
    if (rc != STOKE_OK)
        stoke__hostranges_add(&g_ranges, &r);
    return rc;
}

static int cuda_host_free(int dev, void *ptr)
{
    if (!ptr)
        return STOKE_OK;
    return release_range(ptr, RANGE_ALLOC, "host_free", g.drv.cuMemFreeHost, "cuMemFreeHost");
}

static int cuda_host_register(int dev, void *ptr, size_t size)
{
    if (!ptr || !size)
        return stoke__fail(STOKE_EINVAL, "cuda: host_register of an empty range");
    stoke__hostrange range = {.base = (uintptr_t)ptr, .size = size, .dev = dev,
                              .kind = RANGE_REGISTERED};
    int rc = stoke__hostranges_add(&g_ranges, &range);
    if (rc != STOKE_OK)
        return stoke__fail(rc, "cuda: [%p, +%zu) overlaps memory already pinned", ptr, size);
    rc = enter(dev);
    CUresult r = CUDA_SUCCESS;
    if (rc == STOKE_OK) {
        r = g.drv.cuMemHostRegister(ptr, size, CU_MEMHOSTREGISTER_PORTABLE);
        rc = leave(r, "cuMemHostRegister(%zu bytes) for device %d", size, dev);
    }
    if (rc != STOKE_OK)
        stoke__hostranges_remove(&g_ranges, ptr, NULL);
    /* Pinned by someone else in this process (wholly or in part): the caller's mistake. */
    return r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ? STOKE_EINVAL : rc;
}

static int cuda_host_unregister(int dev, void *ptr)
{
    return release_range(ptr, RANGE_REGISTERED, "host_unregister", g.drv.cuMemHostUnregister,
                         "cuMemHostUnregister");
}

/* Memory type of `ptr` according to the driver: CU_MEMORYTYPE_HOST for memory pinned by
 * anyone in this process (cuMemHostAlloc'ed or registered), 0 when the driver does not know
 * it.  MEMORY_TYPE needs no current context; should a driver want one anyway, the question is
 * asked again in a context we already hold (none held: no context is created just to answer). */
static unsigned driver_memory_type(const void *ptr)
{
    unsigned type = 0;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    CUresult r = g.drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r == CUDA_SUCCESS)
        return type;
    for (int i = 0; r == CUDA_ERROR_INVALID_CONTEXT && i < g.ndev; i++) {
        CUcontext c = atomic_load_explicit(&g.devs[i].ctx, memory_order_acquire);
        if (!c || g.drv.cuCtxPushCurrent(c) != CUDA_SUCCESS)
            continue;
        r = g.drv.cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
        pop();
        return r == CUDA_SUCCESS ? type : 0;
    }
    return 0;
}

static int cuda_is_pinned(const void *ptr, int *out)
{
    *out = 0;
    if (!ptr)
        return STOKE_OK;
    if (stoke__hostranges_find(&g_ranges, ptr, NULL))
        *out = 1;
    else if (g.ready && g.drv.cuPointerGetAttribute) /* pinned by someone else? */
        *out = driver_memory_type(ptr) == CU_MEMORYTYPE_HOST;
    return STOKE_OK;
}

/* ---- device memory, streams, copies, events ----------------------------------------------- */

static int cuda_device_alloc(int dev, size_t size, void **out)
{
    *out = NULL;
    int rc = enter(dev);
    if (rc != STOKE_OK)
        return rc;
    CUdeviceptr d = 0;
    rc = leave(g.drv.cuMemAlloc(&d, size ? size : 1), "cuMemAlloc(%zu bytes) on device %d",
               size, dev);
    if (rc == STOKE_OK)
        *out = (void *)(uintptr_t)d;
    return rc;
}

static int cuda_device_free(int dev, void *handle)
{
    if (!handle)
        return STOKE_OK;
    int rc = enter(dev);
    return rc != STOKE_OK ? rc
                          : leave(g.drv.cuMemFree((CUdeviceptr)(uintptr_t)handle),
                                  "cuMemFree on device %d", dev);
}

static int cuda_stream_create(int dev, stoke_backend_stream **out)
{
    *out = NULL;
    stoke_backend_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return stoke__fail(STOKE_ENOMEM, "cuda: out of memory for a stream");
    s->dev = dev;
    int rc = get_ctx(dev, &s->ctx);
    if (rc == STOKE_OK)
        rc = push(s->ctx);
    if (rc == STOKE_OK)
        rc = leave(g.drv.cuStreamCreate(&s->s, CU_STREAM_NON_BLOCKING),
                   "cuStreamCreate on device %d", dev);
    if (rc != STOKE_OK) {
        free(s);
        return rc;
    }
    *out = s;
    return STOKE_OK;
}

static int cuda_stream_destroy(stoke_backend_stream *s)
{
    if (!s)
        return STOKE_OK;
    int rc = push(s->ctx);
    if (rc == STOKE_OK)
        rc = leave(g.drv.cuStreamDestroy(s->s), "cuStreamDestroy on device %d", s->dev);
    free(s);
    return rc;
}

static int cuda_stream_synchronize(stoke_backend_stream *s)
{
    int rc = push(s->ctx);
    return rc != STOKE_OK ? rc
                          : leave(g.drv.cuStreamSynchronize(s->s),
                                  "cuStreamSynchronize on device %d", s->dev);
}

static int cuda_copy_h2d(void *dst, size_t dst_offset, const void *src, size_t n,
                         stoke_backend_stream *s)
{
    int rc = push(s->ctx);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = g.drv.cuMemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst + dst_offset, src, n, s->s);
    return leave(r, "cuMemcpyHtoDAsync(%zu bytes) on device %d", n, s->dev);
}

static int cuda_copy_d2h(void *dst, const void *src, size_t src_offset, size_t n,
                         stoke_backend_stream *s)
{
    int rc = push(s->ctx);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = g.drv.cuMemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src + src_offset, n, s->s);
    return leave(r, "cuMemcpyDtoHAsync(%zu bytes) on device %d", n, s->dev);
}

static int cuda_event_create(int dev, stoke_backend_event **out)
{
    *out = NULL;
    stoke_backend_event *e = calloc(1, sizeof(*e));
    if (!e)
        return stoke__fail(STOKE_ENOMEM, "cuda: out of memory for an event");
    e->dev = dev;
    int rc = get_ctx(dev, &e->ctx);
    if (rc == STOKE_OK)
        rc = push(e->ctx);
    if (rc == STOKE_OK)
        rc = leave(g.drv.cuEventCreate(&e->e, CU_EVENT_DISABLE_TIMING),
                   "cuEventCreate on device %d", dev);
    if (rc != STOKE_OK) {
        free(e);
        return rc;
    }
    *out = e;
    return STOKE_OK;
}

static int cuda_event_destroy(stoke_backend_event *e)
{
    if (!e)
        return STOKE_OK;
    int rc = push(e->ctx);
    if (rc == STOKE_OK)
        rc = leave(g.drv.cuEventDestroy(e->e), "cuEventDestroy on device %d", e->dev);
    free(e);
    return rc;
}

static int cuda_event_record(stoke_backend_event *e, stoke_backend_stream *s)
{
    int rc = push(s->ctx);
    return rc != STOKE_OK ? rc
                          : leave(g.drv.cuEventRecord(e->e, s->s), "cuEventRecord on device %d",
                                  s->dev);
}

/* STOKE_OK once the work recorded before the event has completed, STOKE_EBUSY until then. */
static int cuda_event_query(stoke_backend_event *e)
{
    int rc = push(e->ctx);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = g.drv.cuEventQuery(e->e);
    rc = leave(r == CUDA_ERROR_NOT_READY ? CUDA_SUCCESS : r, "cuEventQuery on device %d",
               e->dev);
    return r == CUDA_ERROR_NOT_READY ? STOKE_EBUSY : rc;
}

static int cuda_event_synchronize(stoke_backend_event *e)
{
    int rc = push(e->ctx);
    return rc != STOKE_OK ? rc
                          : leave(g.drv.cuEventSynchronize(e->e),
                                  "cuEventSynchronize on device %d", e->dev);
}

/* ---- shutdown ----------------------------------------------------------------------------- */

/* Frees what is still pinned and releases every retained context.  Under g.lock. */
static void release_all_locked(void)
{
    stoke__hostrange *v = NULL;
    size_t n = 0;
    stoke__hostranges_take_all(&g_ranges, &v, &n);
    for (size_t i = 0; g.ready && i < n; i++) {
        CUcontext c = atomic_load(&g.devs[v[i].dev].ctx);
        if (!c || g.drv.cuCtxPushCurrent(c) != CUDA_SUCCESS)
            continue; /* quietly: shutdown leaves the caller's last error alone */
        if (v[i].kind == RANGE_ALLOC)
            g.drv.cuMemFreeHost((void *)v[i].base);
        else
            g.drv.cuMemHostUnregister((void *)v[i].base);
        pop();
    }
    if (n)
        stoke__log(STOKE_LOG_DEBUG, "cuda: shutdown released %zu pinned range(s) still held", n);
    free(v);
    for (int i = 0; g.ready && i < g.ndev; i++) {
        CUcontext c = atomic_exchange(&g.devs[i].ctx, NULL);
        if (c)
            g.drv.cuDevicePrimaryCtxRelease(g.devs[i].dev);
    }
    g.ready = 0;
    g.ndev = 0;
}

/* ---- IPC (stoke/ipc.h) -------------------------------------------------------------------- *
 * Device buffers: the driver's IPC memory handles (64 bytes in the handle's blob, no file
 * descriptor).  The importer opens the handle in its own context of the device it imports
 * on; the driver refuses an open in the exporting process itself.  Pinned host blocks come
 * from cuMemHostAlloc, which another process cannot map: they are not shareable here (that
 * would need memfd-backed blocks registered with cuMemHostRegister in each process). */

#define CUDA_IPC_MAGIC 0x50494355u /* "UCIP" */

typedef struct cuda_ipc_blob {
    uint32_t magic; /* CUDA_IPC_MAGIC */
    int32_t dev;    /* the exporter's device index */
    CUipcMemHandle mh;
} cuda_ipc_blob;

static int ipc_host_unsupported(const char *what)
{
    return stoke__fail(STOKE_ENOTSUP, "cuda: %s: pinned host blocks are cuMemHostAlloc memory, "
                       "which another process cannot map; on cuda only device buffers can be "
                       "shared", what);
}

static int ipc_symbols(const char *what)
{
    if (g.drv.cuIpcGetMemHandle && g.drv.cuIpcOpenMemHandle && g.drv.cuIpcCloseMemHandle)
        return STOKE_OK;
    return stoke__fail(STOKE_ENOTSUP, "cuda: %s: the driver has no cuIpcGetMemHandle / "
                       "cuIpcOpenMemHandle_v2 / cuIpcCloseMemHandle", what);
}

static int cuda_ipc_export(int dev, stoke_ipc_handle *h, void *ptr)
{
    if (h->kind == STOKE_IPC_HOST)
        return ipc_host_unsupported("export");
    int rc = ipc_symbols("export");
    if (rc == STOKE_OK)
        rc = enter(dev);
    if (rc != STOKE_OK)
        return rc;
    cuda_ipc_blob blob = {.magic = CUDA_IPC_MAGIC, .dev = dev};
    CUresult r = g.drv.cuIpcGetMemHandle(&blob.mh, (CUdeviceptr)(uintptr_t)ptr);
    rc = leave(r, "cuIpcGetMemHandle(%p) on device %d", ptr, dev);
    if (r == CUDA_ERROR_NOT_SUPPORTED)
        rc = STOKE_ENOTSUP;
    if (rc != STOKE_OK)
        return rc;
    memcpy(h->blob, &blob, sizeof(blob));
    h->blob_len = sizeof(blob);
    return STOKE_OK;
}

static int cuda_ipc_import(int dev, const stoke_ipc_handle *h, void **out)
{
    *out = NULL;
    if (h->kind == STOKE_IPC_HOST)
        return ipc_host_unsupported("import");
    cuda_ipc_blob blob;
    if (h->blob_len != sizeof(blob))
        return stoke__fail(STOKE_EINVAL, "cuda: import: the handle's blob has %u bytes, a CUDA "
                           "IPC handle %zu", (unsigned)h->blob_len, sizeof(blob));
    memcpy(&blob, h->blob, sizeof(blob));
    if (blob.magic != CUDA_IPC_MAGIC)
        return stoke__fail(STOKE_EINVAL, "cuda: import: the handle's blob is not a CUDA IPC "
                           "handle (magic 0x%08x)", (unsigned)blob.magic);
    int rc = ipc_symbols("import");
    if (rc == STOKE_OK)
        rc = enter(dev);
    if (rc != STOKE_OK)
        return rc;
    CUdeviceptr d = 0;
    CUresult r = g.drv.cuIpcOpenMemHandle(&d, blob.mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    rc = leave(r == CUDA_SUCCESS && !d ? CUDA_ERROR_INVALID_VALUE : r,
               "cuIpcOpenMemHandle (device %d of process %lld) on device %d", (int)blob.dev,
               (long long)h->pid, dev);
    if (rc == STOKE_OK)
        *out = (void *)(uintptr_t)d;
    return rc;
}

static int cuda_ipc_close(int dev, int kind, void *ptr)
{
    if (kind != STOKE_IPC_DEVICE)
        return stoke__fail(STOKE_EINVAL, "cuda: ipc close: only device imports exist");
    int rc = ipc_symbols("close");
    if (rc == STOKE_OK)
        rc = enter(dev);
    if (rc != STOKE_OK)
        return rc;
    return leave(g.drv.cuIpcCloseMemHandle((CUdeviceptr)(uintptr_t)ptr),
                 "cuIpcCloseMemHandle(%p) on device %d", ptr, dev);
}

static void cuda_shutdown(void)
{
    pthread_mutex_lock(&g.lock);
    release_all_locked();
    pthread_mutex_unlock(&g.lock);
}

void stoke__cuda_set_driver_for_test(const struct stoke__cuda_driver *d)
{
    pthread_mutex_lock(&g.lock);
    release_all_locked();
    g.test_mode = d != NULL;
    if (d)
        g.test_drv = *d;
    else
        memset(&g.test_drv, 0, sizeof(g.test_drv));
    memset(&g.drv, 0, sizeof(g.drv));
    pthread_mutex_unlock(&g.lock);
}

static const stoke_backend cuda_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "cuda",
    .description = "NVIDIA CUDA (driver API, libcuda.so.1 loaded at run time)",
    .caps = STOKE_CAP_PINNED_ALLOC | STOKE_CAP_HOST_REGISTER | STOKE_CAP_DEVICE_MEMORY |
            STOKE_CAP_ASYNC_COPY | STOKE_CAP_EVENTS | STOKE_CAP_IPC,
    .probe = cuda_probe,
    .device_count = cuda_device_count,
    .device_props = cuda_device_props,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .is_pinned = cuda_is_pinned,
    .device_alloc = cuda_device_alloc,
    .device_free = cuda_device_free,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_synchronize = cuda_stream_synchronize,
    .copy_h2d_async = cuda_copy_h2d,
    .copy_d2h_async = cuda_copy_d2h,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_query = cuda_event_query,
    .event_synchronize = cuda_event_synchronize,
    .shutdown = cuda_shutdown,
    .ipc_export_mem = cuda_ipc_export,
    .ipc_import_mem = cuda_ipc_import,
    .ipc_close_mem = cuda_ipc_close,
};

int stoke__backend_cuda_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &cuda_backend;
    return STOKE_OK;
}
