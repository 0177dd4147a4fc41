/* The hip backend: AMD's HIP runtime API (ROCm), loaded at run time.  The backend ABI itself is
 * the code it shares with the cuda backend (gpu_core.c), over this file's runtime.
 *
 * - The runtime is dlopen'ed as "libamdhip64.so.6", then "libamdhip64.so.5", then
 *   "libamdhip64.so" (or only STOKE_HIP_LIBRARY when set).  Entry points are resolved once into
 *   a private table (hip_runtime.h), each required or optional; runtimes older than
 *   STOKE_HIP_RUNTIME_MIN are refused.  The library is never dlclose'd.
 * - The shared code's table (gpu_core.h) has the CUDA driver's types; HIP's calls have the same
 *   shape, and most the same types: those are taken as they are, the others through the
 *   adapters below.
 * - probe calls hipRuntimeGetVersion, hipDriverGetVersion (if present), hipGetDeviceCount and
 *   hipDeviceGet only: it initialises the runtime as hipGetDeviceCount does and nothing more (no
 *   hipSetDevice, no allocation, no stream).  device_props uses per-device queries that take a
 *   device handle (hipDeviceGetName, hipDeviceTotalMem, ...), never the versioned props struct.
 * - HIP selects devices per thread.  Every runtime call for device `dev` runs with `dev` current
 *   on the calling thread and the caller's previous device restored afterwards (the enter and
 *   leave hooks: hipGetDevice/hipSetDevice around the call, no switch when `dev` is already
 *   current), so no device other than the target is made current to do work.
 * - Memory pinned by someone else is not recognised (hipPointerGetAttributes' struct differs
 *   between ROCm 5 and 6).
 *
 * Locking: `g.core.lock` (gpu_core.h) serialises loading, probing and shutdown. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "backends/gpu_core.h"
#include "backends/hip_runtime.h"
#include "common/env.h"
#include "common/internal.h"

/* The shared code compares results with CUDA's codes and passes CUDA's flags (gpu_core.h). */
_Static_assert((int)hipSuccess == CUDA_SUCCESS &&
                   (int)hipErrorInvalidValue == CUDA_ERROR_INVALID_VALUE &&
                   (int)hipErrorOutOfMemory == CUDA_ERROR_OUT_OF_MEMORY &&
                   (int)hipErrorNotReady == CUDA_ERROR_NOT_READY &&
                   (int)hipErrorHostMemoryAlreadyRegistered ==
                       CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED &&
                   (int)hipErrorNotSupported == CUDA_ERROR_NOT_SUPPORTED,
               "HIP's error codes are CUDA's");
_Static_assert(hipHostMallocPortable == CU_MEMHOSTALLOC_PORTABLE &&
                   hipHostRegisterPortable == CU_MEMHOSTREGISTER_PORTABLE &&
                   hipStreamNonBlocking == CU_STREAM_NON_BLOCKING &&
                   hipEventDisableTiming == CU_EVENT_DISABLE_TIMING &&
                   hipIpcMemLazyEnablePeerAccess == CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS &&
                   sizeof(hipIpcMemHandle_t) == sizeof(CUipcMemHandle),
               "HIP's flags and IPC handle are CUDA's");

static const char *const default_libs[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                           "libamdhip64.so"};

/* Every member of the table, resolved by its own name. */
#define HIP_SYM(member, req) {offsetof(struct stoke__hip_runtime, member), #member, req}
static const stoke__gpu_sym hip_syms[] = {
    HIP_SYM(hipRuntimeGetVersion, 1), HIP_SYM(hipGetDeviceCount, 1),
    HIP_SYM(hipDeviceGet, 1),         HIP_SYM(hipDeviceGetName, 1),
    HIP_SYM(hipDeviceTotalMem, 1),    HIP_SYM(hipGetDevice, 1),
    HIP_SYM(hipSetDevice, 1),         HIP_SYM(hipHostMalloc, 1),
    HIP_SYM(hipHostFree, 1),          HIP_SYM(hipHostRegister, 1),
    HIP_SYM(hipHostUnregister, 1),    HIP_SYM(hipMalloc, 1),
    HIP_SYM(hipFree, 1),              HIP_SYM(hipStreamCreateWithFlags, 1),
    HIP_SYM(hipStreamDestroy, 1),     HIP_SYM(hipStreamSynchronize, 1),
    HIP_SYM(hipMemcpyAsync, 1),       HIP_SYM(hipEventCreateWithFlags, 1),
    HIP_SYM(hipEventDestroy, 1),      HIP_SYM(hipEventRecord, 1),
    HIP_SYM(hipEventQuery, 1),        HIP_SYM(hipEventSynchronize, 1),
    HIP_SYM(hipDriverGetVersion, 0),  HIP_SYM(hipDeviceGetPCIBusId, 0),
    HIP_SYM(hipDeviceComputeCapability, 0), HIP_SYM(hipGetErrorName, 0),
    HIP_SYM(hipGetErrorString, 0),    HIP_SYM(hipIpcGetMemHandle, 0),
    HIP_SYM(hipIpcOpenMemHandle, 0),  HIP_SYM(hipIpcCloseMemHandle, 0),
};
#undef HIP_SYM

static const stoke__gpu_desc hip_desc;

static struct {
    stoke__gpu core;                 /* lock, shared table, devices, pinned ranges */
    int test_mode;                   /* table supplied by a test */
    struct stoke__hip_runtime test_rt;
    struct stoke__hip_runtime rt;    /* the table in use once `core.ready` */
    void *dl;                        /* the library (kept loaded) */
    char dl_name[512];               /* the name it was opened by */
    int version;                     /* hipRuntimeGetVersion */
    int driver_version;              /* hipDriverGetVersion, 0 if unknown */
} g = {.core = STOKE__GPU_INIT(&hip_desc)};

/* ---- errors ------------------------------------------------------------------------------- */

static const char *hip_errname(hipError_t r)
{
    const char *s = g.rt.hipGetErrorName ? g.rt.hipGetErrorName(r) : NULL;
    return s ? s : r == hipErrorOutOfMemory ? "hipErrorOutOfMemory" : "hipError";
}

static const char *hip_errtext(hipError_t r)
{
    const char *s = g.rt.hipGetErrorString ? g.rt.hipGetErrorString(r) : NULL;
    return s ? s : "no message from the runtime";
}

/* ---- the shared table from the runtime ---------------------------------------------------- *
 * The calls whose types differ from the CUDA driver's: hipStream_t and hipEvent_t for CUstream
 * and CUevent, pointers for CUdeviceptr, hipIpcMemHandle_t for CUipcMemHandle, and one
 * hipMemcpyAsync for both copies. */

static CUresult mem_alloc(CUdeviceptr *d, size_t size)
{
    void *p = NULL;
    hipError_t r = g.rt.hipMalloc(&p, size);
    *d = (CUdeviceptr)(uintptr_t)p;
    return r;
}
static CUresult mem_free(CUdeviceptr d) { return g.rt.hipFree((void *)(uintptr_t)d); }
static CUresult stream_create(CUstream *s, unsigned flags)
{
    hipStream_t h = NULL;
    hipError_t r = g.rt.hipStreamCreateWithFlags(&h, flags);
    *s = (CUstream)h;
    return r;
}
static CUresult stream_destroy(CUstream s) { return g.rt.hipStreamDestroy((hipStream_t)s); }
static CUresult stream_synchronize(CUstream s) { return g.rt.hipStreamSynchronize((hipStream_t)s); }
static CUresult memcpy_htod(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return g.rt.hipMemcpyAsync((void *)(uintptr_t)dst, src, n, hipMemcpyHostToDevice,
                               (hipStream_t)s);
}
static CUresult memcpy_dtoh(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return g.rt.hipMemcpyAsync(dst, (const void *)(uintptr_t)src, n, hipMemcpyDeviceToHost,
                               (hipStream_t)s);
}
static CUresult event_create(CUevent *e, unsigned flags)
{
    hipEvent_t h = NULL;
    hipError_t r = g.rt.hipEventCreateWithFlags(&h, flags);
    *e = (CUevent)h;
    return r;
}
static CUresult event_destroy(CUevent e) { return g.rt.hipEventDestroy((hipEvent_t)e); }
static CUresult event_record(CUevent e, CUstream s)
{
    return g.rt.hipEventRecord((hipEvent_t)e, (hipStream_t)s);
}
static CUresult event_query(CUevent e) { return g.rt.hipEventQuery((hipEvent_t)e); }
static CUresult event_synchronize(CUevent e) { return g.rt.hipEventSynchronize((hipEvent_t)e); }
static CUresult ipc_get(CUipcMemHandle *h, CUdeviceptr d)
{
    hipIpcMemHandle_t mh;
    hipError_t r = g.rt.hipIpcGetMemHandle(&mh, (void *)(uintptr_t)d);
    memcpy(h, &mh, sizeof(*h));
    return r;
}
static CUresult ipc_open(CUdeviceptr *d, CUipcMemHandle h, unsigned flags)
{
    hipIpcMemHandle_t mh;
    memcpy(&mh, &h, sizeof(mh));
    void *p = NULL;
    hipError_t r = g.rt.hipIpcOpenMemHandle(&p, mh, flags);
    *d = (CUdeviceptr)(uintptr_t)p;
    return r;
}
static CUresult ipc_close(CUdeviceptr d) { return g.rt.hipIpcCloseMemHandle((void *)(uintptr_t)d); }

/* ---- loading the runtime ------------------------------------------------------------------ */

/* Opens the library into g.dl; on failure writes `reason`.  Under the lock. */
static int open_library_locked(char *reason, size_t reason_len)
{
    const char *env = stoke__env_str(STOKE_ENV_HIP_LIBRARY);
    const char *const *names = env ? &env : default_libs;
    size_t count = env ? 1 : STOKE__ARRAY_LEN(default_libs);
    char last_err[256] = "dlopen failed";
    void *h = NULL;
    size_t i;
    for (i = 0; i < count && !h; i++) {
        h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        const char *e = h ? NULL : dlerror();
        if (e)
            stoke__strlcpy(last_err, e, sizeof(last_err));
    }
    if (!h) {
        if (env)
            stoke__fmt(reason, reason_len, "%s not found (STOKE_HIP_LIBRARY): %s", env,
                       last_err);
        else
            stoke__fmt(reason, reason_len, "libamdhip64.so not found (tried .so.6, .so.5, .so; "
                       "ROCm not installed?): %s", last_err);
        return STOKE_ENODEV;
    }
    if (h == g.dl) {
        dlclose(h); /* the reference we already hold is enough */
    } else {
        /* A runtime loaded before (only tests switch libraries) stays mapped: it registers
         * process-wide state. */
        g.dl = h;
    }
    stoke__strlcpy(g.dl_name, names[i - 1], sizeof(g.dl_name));
    return STOKE_OK;
}

/* Fills g.rt and the shared table from the library or the test table; on failure writes
 * `reason`.  Under the lock. */
static int load_runtime_locked(char *reason, size_t reason_len)
{
    struct stoke__hip_runtime rt;
    memset(&rt, 0, sizeof(rt));
    const char *lib = "the mock runtime";
    if (g.test_mode) {
        rt = g.test_rt;
    } else {
        int rc = open_library_locked(reason, reason_len);
        if (rc != STOKE_OK)
            return rc;
        lib = g.dl_name;
        stoke__gpu_resolve(g.dl, &rt, hip_syms, STOKE__ARRAY_LEN(hip_syms));
    }
    const char *missing = stoke__gpu_missing(&rt, hip_syms, STOKE__ARRAY_LEN(hip_syms));
    if (missing) {
        int v = 0;
        if (rt.hipRuntimeGetVersion && rt.hipRuntimeGetVersion(&v) == hipSuccess && v > 0)
            stoke__fmt(reason, reason_len, "runtime too old: %s (HIP %d.%d) lacks %s; stoke "
                       "needs HIP %d.%d or newer", lib, v / 10000000, v / 100000 % 100, missing,
                       STOKE_HIP_RUNTIME_MIN / 10000000, STOKE_HIP_RUNTIME_MIN / 100000 % 100);
        else
            stoke__fmt(reason, reason_len, "missing symbol: %s lacks %s (too old, or not the "
                       "HIP runtime)", lib, missing);
        return STOKE_ENODEV;
    }
    g.rt = rt;
    g.core.api = (stoke__gpu_api){
        .device_get = rt.hipDeviceGet, .device_get_name = rt.hipDeviceGetName,
        .device_total_mem = rt.hipDeviceTotalMem, .device_get_pci_bus_id = rt.hipDeviceGetPCIBusId,
        .host_alloc = rt.hipHostMalloc, .host_free = rt.hipHostFree,
        .host_register = rt.hipHostRegister, .host_unregister = rt.hipHostUnregister,
        .mem_alloc = mem_alloc, .mem_free = mem_free, .stream_create = stream_create,
        .stream_destroy = stream_destroy, .stream_synchronize = stream_synchronize,
        .memcpy_htod = memcpy_htod, .memcpy_dtoh = memcpy_dtoh, .event_create = event_create,
        .event_destroy = event_destroy, .event_record = event_record, .event_query = event_query,
        .event_synchronize = event_synchronize, .ipc_get = rt.hipIpcGetMemHandle ? ipc_get : NULL,
        .ipc_open = rt.hipIpcOpenMemHandle ? ipc_open : NULL,
        .ipc_close = rt.hipIpcCloseMemHandle ? ipc_close : NULL};
    return STOKE_OK;
}

/* ---- probe -------------------------------------------------------------------------------- */

static int hip_probe_locked(uint32_t flags, char *reason, size_t reason_len)
{
    memset(&g.rt, 0, sizeof(g.rt));
    int rc = load_runtime_locked(reason, reason_len);
    if (rc != STOKE_OK)
        return rc;
    int v = 0;
    hipError_t r = g.rt.hipRuntimeGetVersion(&v);
    if (r != hipSuccess) {
        stoke__fmt(reason, reason_len, "initialization error: hipRuntimeGetVersion failed with "
                   "%s (%d): %s", hip_errname(r), r, hip_errtext(r));
        return STOKE_ENODEV;
    }
    if (v < STOKE_HIP_RUNTIME_MIN) {
        stoke__fmt(reason, reason_len, "runtime too old: HIP %d.%d.%d, stoke needs HIP %d.%d or "
                   "newer", v / 10000000, v / 100000 % 100, v % 100000,
                   STOKE_HIP_RUNTIME_MIN / 10000000, STOKE_HIP_RUNTIME_MIN / 100000 % 100);
        return STOKE_ENODEV;
    }
    int dv = 0;
    if (g.rt.hipDriverGetVersion && g.rt.hipDriverGetVersion(&dv) != hipSuccess)
        dv = 0;
    int n = 0;
    r = g.rt.hipGetDeviceCount(&n);
    if (r == hipErrorNoDevice) {
        stoke__fmt(reason, reason_len, "no device: hipGetDeviceCount returned hipErrorNoDevice "
                   "(%s)", hip_errtext(r));
        return STOKE_ENODEV;
    }
    if (r == hipErrorInsufficientDriver) {
        stoke__fmt(reason, reason_len, "driver too old for HIP %d.%d: hipGetDeviceCount "
                   "returned hipErrorInsufficientDriver (%s)", v / 10000000, v / 100000 % 100,
                   hip_errtext(r));
        return STOKE_ENODEV;
    }
    if (r != hipSuccess) {
        stoke__fmt(reason, reason_len, "initialization error: hipGetDeviceCount failed with %s "
                   "(%d): %s", hip_errname(r), r, hip_errtext(r));
        return STOKE_ENODEV;
    }
    g.version = v;
    g.driver_version = dv;
    return stoke__gpu_enumerate_locked(&g.core, n, reason, reason_len);
}

static void hip_describe_locked(char *reason, size_t reason_len)
{
    stoke__fmt(reason, reason_len, "%d device(s), HIP runtime %d.%d", g.core.ndev,
               g.version / 10000000, g.version / 100000 % 100);
}

static void hip_props(hipDevice_t d, stoke_device_props *o)
{
    /* The GCN/RDNA architecture's major.minor (gfx90a: 9.0), as HIP reports it. */
    if (!g.rt.hipDeviceComputeCapability ||
        g.rt.hipDeviceComputeCapability(&o->compute_major, &o->compute_minor, d) != hipSuccess)
        o->compute_major = o->compute_minor = 0;
    stoke__fmt(o->driver_version, sizeof(o->driver_version), "HIP %d.%d.%d",
               g.version / 10000000, g.version / 100000 % 100, g.version % 100000);
}

/* ---- the current device ------------------------------------------------------------------- */

/* The enter hook (gpu_core.h): makes `dev` the calling thread's current device; *prev receives
 * the caller's, to hand to hip_leave after the call. */
static int hip_enter(int dev, int *prev, int quiet)
{
    hipError_t r = g.rt.hipGetDevice(prev);
    if (r != hipSuccess)
        return quiet ? STOKE_EBACKEND : stoke__gpu_fail(&g.core, r, "hipGetDevice");
    if (*prev == dev)
        return STOKE_OK;
    r = g.rt.hipSetDevice(dev);
    if (r == hipSuccess || quiet)
        return r == hipSuccess ? STOKE_OK : STOKE_EBACKEND;
    return stoke__gpu_fail(&g.core, r, "hipSetDevice(%d)", dev);
}

/* Gives the caller back device `prev`. */
static void hip_leave(int dev, int prev)
{
    if (prev == dev)
        return;
    hipError_t back = g.rt.hipSetDevice(prev);
    if (back != hipSuccess)
        stoke__log(STOKE_LOG_WARN, "hip: could not make device %d current again: %s (%d)", prev,
                   hip_errname(back), back);
}

void stoke__hip_set_runtime_for_test(const struct stoke__hip_runtime *rt)
{
    pthread_mutex_lock(&g.core.lock);
    stoke__gpu_reset_locked(&g.core);
    g.test_mode = rt != NULL;
    g.test_rt = rt ? *rt : (struct stoke__hip_runtime){0};
    memset(&g.rt, 0, sizeof(g.rt));
    pthread_mutex_unlock(&g.core.lock);
}

/* ---- the backend -------------------------------------------------------------------------- */

static const stoke__gpu_desc hip_desc = {
    .name = "hip", .api = "HIP", .lib = "runtime", .vendor = "AMD",
    .ipc_magic = 0x50494948u, /* "HIIP" */
    .probe_locked = hip_probe_locked, .describe_locked = hip_describe_locked,
    .enter = hip_enter, .leave = hip_leave, .err_name = hip_errname, .err_text = hip_errtext,
    .props = hip_props,
    .call = {.device_get = "hipDeviceGet", .device_get_name = "hipDeviceGetName",
             .host_alloc = "hipHostMalloc", .host_free = "hipHostFree",
             .host_register = "hipHostRegister", .host_unregister = "hipHostUnregister",
             .mem_alloc = "hipMalloc", .mem_free = "hipFree",
             .stream_create = "hipStreamCreateWithFlags", .stream_destroy = "hipStreamDestroy",
             .stream_synchronize = "hipStreamSynchronize", .memcpy_htod = "hipMemcpyAsync",
             .memcpy_dtoh = "hipMemcpyAsync", .event_create = "hipEventCreateWithFlags",
             .event_destroy = "hipEventDestroy", .event_record = "hipEventRecord",
             .event_query = "hipEventQuery", .event_synchronize = "hipEventSynchronize",
             .ipc_get = "hipIpcGetMemHandle", .ipc_open = "hipIpcOpenMemHandle",
             .ipc_close = "hipIpcCloseMemHandle"},
};

STOKE__GPU_BACKEND(hip_backend, g.core, "hip",
                   "AMD HIP (runtime API, libamdhip64.so loaded at run time)");

int stoke__backend_hip_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &hip_backend;
    return STOKE_OK;
}
