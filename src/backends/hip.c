/* The hip backend: AMD's HIP runtime API (ROCm), loaded at run time.
 *
 * - The runtime is dlopen'ed as "libamdhip64.so.6", then "libamdhip64.so.5", then
 *   "libamdhip64.so" (or only STOKE_HIP_LIBRARY when set).  Entry points are resolved once into
 *   a private table (hip_runtime.h), each required or optional; runtimes older than
 *   STOKE_HIP_RUNTIME_MIN are refused.  The library is never dlclose'd.
 * - probe calls hipRuntimeGetVersion, hipDriverGetVersion (if present), hipGetDeviceCount and
 *   hipDeviceGet only: it initialises the runtime as hipGetDeviceCount does and nothing more (no
 *   hipSetDevice, no allocation, no stream).  device_props uses per-device queries that take a
 *   device handle (hipDeviceGetName, hipDeviceTotalMem, ...), never the versioned props struct.
 * - HIP selects devices per thread.  Every runtime call for device `dev` runs with `dev` current
 *   on the calling thread and the caller's previous device restored afterwards
 *   (hipGetDevice/hipSetDevice around the call, no switch when `dev` is already current), so no
 *   device other than the target is made current to do work.
 * - Pinned memory: hipHostMalloc(Portable) and hipHostRegister(Portable), tracked in the shared
 *   range table so that is_pinned answers for interior addresses.  Memory pinned by someone
 *   else is not recognised (hipPointerGetAttributes' struct differs between ROCm 5 and 6).
 *
 * Locking: `g.lock` serialises loading, probing and shutdown.  After a successful probe `g.rt`,
 * `g.ndev` and `g.devs` are immutable until shutdown, so the hot paths read them without the
 * lock (the registry publishes the probe's result with release/acquire).  The range table has
 * its own rwlock. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/builtin.h"
#include "backends/hip_runtime.h"
#include "backends/hostranges.h"
#include "common/env.h"
#include "common/internal.h"

#define HIP_MAX_DEVICES 64

enum { PIN_ALLOC = 0, PIN_REGISTERED = 1 };

static const char *const default_libs[] = {"libamdhip64.so.6", "libamdhip64.so.5",
                                           "libamdhip64.so"};

/* Every member of the table, resolved by its own name. */
#define HIP_SYM(member, req) {offsetof(struct stoke__hip_runtime, member), #member, req}
static const struct {
    size_t offset;
    const char *name;
    int required;
} hip_syms[] = {
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

static struct {
    pthread_mutex_t lock;
    int test_mode;                   /* table supplied by a test */
    struct stoke__hip_runtime test_rt;
    struct stoke__hip_runtime rt;    /* the table in use once `ready` */
    void *dl;                        /* the library (kept loaded) */
    char dl_name[512];               /* the name it was opened by */
    int ready;                       /* probe succeeded */
    int version;                     /* hipRuntimeGetVersion */
    int driver_version;              /* hipDriverGetVersion, 0 if unknown */
    int ndev;
    hipDevice_t devs[HIP_MAX_DEVICES];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static stoke__hostranges pins = STOKE__HOSTRANGES_INIT;

struct stoke_backend_stream {
    hipStream_t s;
    int dev;
};

struct stoke_backend_event {
    hipEvent_t e;
    int dev;
};

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

/* Fails with the runtime's name and message for `r` after a description of the call
 * (stoke__backend_vfail): "hip: hipMalloc(4096 bytes) on device 1: hipErrorOutOfMemory (2): out
 * of memory". */
static int vfail(hipError_t r, const char *fmt, va_list ap) STOKE__PRINTF(2, 0);
static int vfail(hipError_t r, const char *fmt, va_list ap)
{
    return stoke__backend_vfail("hip", r == hipErrorOutOfMemory, (int)r, hip_errname(r),
                                hip_errtext(r), fmt, ap);
}

static int hfail(hipError_t r, const char *fmt, ...) STOKE__PRINTF(2, 3);
static int hfail(hipError_t r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(r, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- loading the runtime ------------------------------------------------------------------ */

/* Opens the library into g.dl; on failure writes `reason`.  Under g.lock. */
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

/* Fills g.rt from the library or the test table; on failure writes `reason`.  Under g.lock. */
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
        for (size_t i = 0; i < STOKE__ARRAY_LEN(hip_syms); i++) {
            void *fn = dlsym(g.dl, hip_syms[i].name);
            memcpy((char *)&rt + hip_syms[i].offset, &fn, sizeof(fn));
        }
    }
    for (size_t i = 0; i < STOKE__ARRAY_LEN(hip_syms); i++) {
        void *fn;
        memcpy(&fn, (const char *)&rt + hip_syms[i].offset, sizeof(fn));
        if (fn || !hip_syms[i].required)
            continue;
        int v = 0;
        if (rt.hipRuntimeGetVersion && rt.hipRuntimeGetVersion(&v) == hipSuccess && v > 0)
            stoke__fmt(reason, reason_len, "runtime too old: %s (HIP %d.%d) lacks %s; stoke "
                       "needs HIP %d.%d or newer", lib, v / 10000000, v / 100000 % 100,
                       hip_syms[i].name, STOKE_HIP_RUNTIME_MIN / 10000000,
                       STOKE_HIP_RUNTIME_MIN / 100000 % 100);
        else
            stoke__fmt(reason, reason_len, "missing symbol: %s lacks %s (too old, or not the "
                       "HIP runtime)", lib, hip_syms[i].name);
        return STOKE_ENODEV;
    }
    g.rt = rt;
    return STOKE_OK;
}

/* ---- probe -------------------------------------------------------------------------------- */

static void describe_locked(char *reason, size_t reason_len)
{
    stoke__fmt(reason, reason_len, "%d device(s), HIP runtime %d.%d", g.ndev,
               g.version / 10000000, g.version / 100000 % 100);
}

/* Everything the probe does, once the lock is held and nothing is ready. */
static int probe_locked(char *reason, size_t reason_len)
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
    if (n <= 0) {
        stoke__strlcpy(reason, "no device: the runtime reports 0 HIP devices", reason_len);
        return STOKE_ENODEV;
    }
    if (n > HIP_MAX_DEVICES) {
        stoke__log(STOKE_LOG_WARN, "hip: %d devices; only the first %d are used", n,
                   HIP_MAX_DEVICES);
        n = HIP_MAX_DEVICES;
    }
    for (int i = 0; i < n; i++) {
        r = g.rt.hipDeviceGet(&g.devs[i], i);
        if (r != hipSuccess) {
            stoke__fmt(reason, reason_len, "initialization error: hipDeviceGet(%d) failed with "
                       "%s (%d): %s", i, hip_errname(r), r, hip_errtext(r));
            return STOKE_ENODEV;
        }
    }
    g.version = v;
    g.driver_version = dv;
    g.ndev = n;
    g.ready = 1;
    return STOKE_OK;
}

static int hip_probe(uint32_t flags, char *reason, size_t reason_len)
{
    pthread_mutex_lock(&g.lock);
    int rc = g.ready ? STOKE_OK : probe_locked(reason, reason_len);
    if (rc == STOKE_OK)
        describe_locked(reason, reason_len);
    pthread_mutex_unlock(&g.lock);
    return rc;
}

static int hip_device_count(int *count)
{
    pthread_mutex_lock(&g.lock);
    *count = g.ready ? g.ndev : 0;
    pthread_mutex_unlock(&g.lock);
    return STOKE_OK;
}

static int valid_dev(int dev)
{
    if (!g.ready)
        return stoke__fail(STOKE_ENODEV, "hip: the backend is not initialised");
    if (dev < 0 || dev >= g.ndev)
        return stoke__fail(STOKE_ERANGE, "hip: no device %d (%d device(s))", dev, g.ndev);
    return STOKE_OK;
}

/* ---- the current device ------------------------------------------------------------------- */

/* Makes `dev` the calling thread's current device; *prev receives the caller's, to hand to
 * leave() after the call. */
static int enter(int dev, int *prev)
{
    int rc = valid_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    hipError_t r = g.rt.hipGetDevice(prev);
    if (r != hipSuccess)
        return hfail(r, "hipGetDevice");
    if (*prev == dev)
        return STOKE_OK;
    r = g.rt.hipSetDevice(dev);
    return r == hipSuccess ? STOKE_OK : hfail(r, "hipSetDevice(%d)", dev);
}

/* Gives the caller back device `prev`, then turns `r`, the result of the call just made on
 * `dev`, into a status; `fmt` describes that call for the error message. */
static int leave(int dev, int prev, hipError_t r, const char *fmt, ...) STOKE__PRINTF(4, 5);
static int leave(int dev, int prev, hipError_t r, const char *fmt, ...)
{
    if (prev != dev) {
        hipError_t back = g.rt.hipSetDevice(prev);
        if (back != hipSuccess)
            stoke__log(STOKE_LOG_WARN, "hip: could not make device %d current again: %s (%d)",
                       prev, hip_errname(back), back);
    }
    if (r == hipSuccess)
        return STOKE_OK;
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(r, fmt, ap);
    va_end(ap);
    return rc;
}

/* Runs fn(p) with `dev` current (`name` is the runtime call fn makes, for errors). */
static int on_dev(int dev, hipError_t (*fn)(void *), void *p, const char *name)
{
    int prev;
    int rc = enter(dev, &prev);
    return rc != STOKE_OK ? rc : leave(dev, prev, fn(p), "%s on device %d", name, dev);
}

/* ---- devices ------------------------------------------------------------------------------ */

static int hip_device_props(int dev, stoke_device_props *p)
{
    int rc = valid_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    hipDevice_t d = g.devs[dev];
    stoke_device_props o = {.size = sizeof(o), .kind = STOKE_DEVICE_GPU};
    stoke__strlcpy(o.vendor, "AMD", sizeof(o.vendor));
    hipError_t r = g.rt.hipDeviceGetName(o.name, (int)sizeof(o.name), d);
    if (r != hipSuccess)
        return hfail(r, "hipDeviceGetName(device %d)", dev);
    o.name[sizeof(o.name) - 1] = '\0';
    size_t mem = 0;
    if (g.rt.hipDeviceTotalMem(&mem, d) == hipSuccess)
        o.total_memory = mem;
    /* The GCN/RDNA architecture's major.minor (gfx90a: 9.0), as HIP reports it. */
    if (!g.rt.hipDeviceComputeCapability ||
        g.rt.hipDeviceComputeCapability(&o.compute_major, &o.compute_minor, d) != hipSuccess)
        o.compute_major = o.compute_minor = 0;
    if (!g.rt.hipDeviceGetPCIBusId ||
        g.rt.hipDeviceGetPCIBusId(o.pci_bus_id, (int)sizeof(o.pci_bus_id), d) != hipSuccess)
        o.pci_bus_id[0] = '\0';
    o.pci_bus_id[sizeof(o.pci_bus_id) - 1] = '\0';
    stoke__fmt(o.driver_version, sizeof(o.driver_version), "HIP %d.%d.%d", g.version / 10000000,
               g.version / 100000 % 100, g.version % 100000);
    return stoke__props_out(p, &o);
}

/* ---- pinned host memory ------------------------------------------------------------------- */

static hipError_t host_free_fn(void *p) { return g.rt.hipHostFree(p); }
static hipError_t host_unregister_fn(void *p) { return g.rt.hipHostUnregister(p); }
static hipError_t dev_free_fn(void *p) { return g.rt.hipFree(p); }

static int hip_host_alloc(int dev, size_t size, void **out)
{
    *out = NULL;
    int prev;
    int rc = enter(dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    void *p = NULL;
    hipError_t r = g.rt.hipHostMalloc(&p, size ? size : 1, hipHostMallocPortable);
    if (r == hipSuccess && !p)
        r = hipErrorOutOfMemory;
    rc = leave(dev, prev, r, "hipHostMalloc(%zu bytes) for device %d", size, dev);
    if (rc != STOKE_OK)
        return rc;
    stoke__hostrange pin = {.base = (uintptr_t)p, .size = size, .dev = dev, .kind = PIN_ALLOC};
    rc = stoke__hostranges_add(&pins, &pin);
    if (rc != STOKE_OK) {
        on_dev(dev, host_free_fn, p, "hipHostFree");
        return stoke__fail(rc, "hip: tracking pinned block %p failed", p);
    }
    *out = p;
    return STOKE_OK;
}

/* Undoes the pinning that starts at `ptr` (of `kind`) with `undo` on its device.  The range
 * leaves the table before the runtime releases it; if the runtime refuses, the memory is still
 * pinned and the range goes back. */
static int unpin(void *ptr, int kind, const char *op, hipError_t (*undo)(void *),
                 const char *undo_name)
{
    stoke__hostrange pin;
    if (!stoke__hostranges_find(&pins, ptr, &pin) || pin.base != (uintptr_t)ptr ||
        pin.kind != kind || stoke__hostranges_remove(&pins, ptr, &pin) != STOKE_OK)
        return stoke__fail(STOKE_EINVAL, "hip: %s(%p): not the start of a %s", op, ptr,
                           kind == PIN_ALLOC ? "block from host_alloc" : "registered range");
    int rc = on_dev(pin.dev, undo, ptr, undo_name);
    if (rc != STOKE_OK)
        stoke__hostranges_add(&pins, &pin);
    return rc;
}

static int hip_host_free(int dev, void *ptr)
{
    return ptr ? unpin(ptr, PIN_ALLOC, "host_free", host_free_fn, "hipHostFree") : STOKE_OK;
}

static int hip_host_register(int dev, void *ptr, size_t size)
{
    if (!ptr || !size)
        return stoke__fail(STOKE_EINVAL, "hip: host_register of an empty range");
    /* Claim the range first, so that two threads cannot register overlapping memory. */
    stoke__hostrange pin = {.base = (uintptr_t)ptr, .size = size, .dev = dev,
                            .kind = PIN_REGISTERED};
    int rc = stoke__hostranges_add(&pins, &pin);
    if (rc != STOKE_OK)
        return stoke__fail(rc, "hip: [%p, +%zu) overlaps memory already pinned", ptr, size);
    int prev;
    rc = enter(dev, &prev);
    hipError_t r = hipSuccess;
    if (rc == STOKE_OK) {
        r = g.rt.hipHostRegister(ptr, size, hipHostRegisterPortable);
        rc = leave(dev, prev, r, "hipHostRegister(%zu bytes) for device %d", size, dev);
    }
    if (rc != STOKE_OK)
        stoke__hostranges_remove(&pins, ptr, NULL);
    return r == hipErrorHostMemoryAlreadyRegistered ? STOKE_EINVAL : rc;
}

static int hip_host_unregister(int dev, void *ptr)
{
    return unpin(ptr, PIN_REGISTERED, "host_unregister", host_unregister_fn,
                 "hipHostUnregister");
}

static int hip_is_pinned(const void *ptr, int *out)
{
    *out = ptr && stoke__hostranges_find(&pins, ptr, NULL);
    return STOKE_OK;
}

/* ---- device memory, streams, copies, events ----------------------------------------------- */

static int hip_device_alloc(int dev, size_t size, void **out)
{
    *out = NULL;
    int prev;
    int rc = enter(dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    void *d = NULL;
    hipError_t r = g.rt.hipMalloc(&d, size ? size : 1);
    if (r == hipSuccess && !d)
        r = hipErrorOutOfMemory;
    rc = leave(dev, prev, r, "hipMalloc(%zu bytes) on device %d", size, dev);
    if (rc == STOKE_OK)
        *out = d;
    return rc;
}

static int hip_device_free(int dev, void *handle)
{
    return handle ? on_dev(dev, dev_free_fn, handle, "hipFree") : STOKE_OK;
}

static hipError_t stream_new(void *o)
{
    return g.rt.hipStreamCreateWithFlags(&((stoke_backend_stream *)o)->s, hipStreamNonBlocking);
}
static hipError_t stream_del(void *o)
{
    return g.rt.hipStreamDestroy(((stoke_backend_stream *)o)->s);
}

static int hip_stream_create(int dev, stoke_backend_stream **out)
{
    stoke_backend_stream *s = calloc(1, sizeof(*s));
    *out = s;
    if (!s)
        return stoke__fail(STOKE_ENOMEM, "hip: out of memory for a stream");
    s->dev = dev;
    int rc = on_dev(dev, stream_new, s, "hipStreamCreateWithFlags");
    if (rc != STOKE_OK) {
        *out = NULL;
        free(s);
    }
    return rc;
}

static int hip_stream_destroy(stoke_backend_stream *s)
{
    int rc = s ? on_dev(s->dev, stream_del, s, "hipStreamDestroy") : STOKE_OK;
    free(s);
    return rc;
}

static int hip_stream_synchronize(stoke_backend_stream *s)
{
    int prev;
    int rc = enter(s->dev, &prev);
    return rc != STOKE_OK ? rc
                          : leave(s->dev, prev, g.rt.hipStreamSynchronize(s->s),
                                  "hipStreamSynchronize on device %d", s->dev);
}

/* One asynchronous copy on `s`, with its device current around the call. */
static int copy_async(void *dst, const void *src, size_t n, int kind, const char *dir,
                      stoke_backend_stream *s)
{
    int prev;
    int rc = enter(s->dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    hipError_t r = g.rt.hipMemcpyAsync(dst, src, n, kind, s->s);
    return leave(s->dev, prev, r, "hipMemcpyAsync(%zu bytes, %s, device %d)", n, dir, s->dev);
}

static int hip_copy_h2d(void *dst, size_t dst_offset, const void *src, size_t n,
                        stoke_backend_stream *s)
{
    return copy_async((char *)dst + dst_offset, src, n, hipMemcpyHostToDevice, "host to device",
                      s);
}

static int hip_copy_d2h(void *dst, const void *src, size_t src_offset, size_t n,
                        stoke_backend_stream *s)
{
    return copy_async(dst, (const char *)src + src_offset, n, hipMemcpyDeviceToHost,
                      "device to host", s);
}

static hipError_t event_new(void *o)
{
    return g.rt.hipEventCreateWithFlags(&((stoke_backend_event *)o)->e, hipEventDisableTiming);
}
static hipError_t event_del(void *o)
{
    return g.rt.hipEventDestroy(((stoke_backend_event *)o)->e);
}

static int hip_event_create(int dev, stoke_backend_event **out)
{
    stoke_backend_event *e = calloc(1, sizeof(*e));
    if (e)
        e->dev = dev;
    int rc = e ? on_dev(dev, event_new, e, "hipEventCreateWithFlags")
               : stoke__fail(STOKE_ENOMEM, "hip: out of memory for an event");
    if (rc != STOKE_OK) {
        free(e);
        e = NULL;
    }
    *out = e;
    return rc;
}

static int hip_event_destroy(stoke_backend_event *e)
{
    int rc = e ? on_dev(e->dev, event_del, e, "hipEventDestroy") : STOKE_OK;
    free(e);
    return rc;
}

static int hip_event_record(stoke_backend_event *e, stoke_backend_stream *s)
{
    int prev;
    int rc = enter(s->dev, &prev);
    return rc != STOKE_OK ? rc
                          : leave(s->dev, prev, g.rt.hipEventRecord(e->e, s->s),
                                  "hipEventRecord on device %d", s->dev);
}

static int hip_event_query(stoke_backend_event *e)
{
    int prev;
    int rc = enter(e->dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    hipError_t r = g.rt.hipEventQuery(e->e);
    rc = leave(e->dev, prev, r == hipErrorNotReady ? hipSuccess : r, "hipEventQuery");
    return r == hipErrorNotReady ? STOKE_EBUSY : rc;
}

static int hip_event_synchronize(stoke_backend_event *e)
{
    int prev;
    int rc = enter(e->dev, &prev);
    return rc != STOKE_OK ? rc
                          : leave(e->dev, prev, g.rt.hipEventSynchronize(e->e),
                                  "hipEventSynchronize on device %d", e->dev);
}

/* ---- shutdown ----------------------------------------------------------------------------- */

/* Releases what is still pinned and forgets the probe.  Under g.lock. */
static void reset_locked(void)
{
    stoke__hostrange *v = NULL;
    size_t n = 0;
    stoke__hostranges_take_all(&pins, &v, &n);
    for (size_t i = 0; g.ready && i < n; i++)
        on_dev(v[i].dev, v[i].kind == PIN_ALLOC ? host_free_fn : host_unregister_fn,
               (void *)v[i].base, v[i].kind == PIN_ALLOC ? "hipHostFree" : "hipHostUnregister");
    if (n)
        stoke__log(STOKE_LOG_DEBUG, "hip: shutdown released %zu pinned range(s) still held", n);
    free(v);
    g.ready = 0;
    g.ndev = 0;
}

static void hip_shutdown(void)
{
    pthread_mutex_lock(&g.lock);
    reset_locked();
    pthread_mutex_unlock(&g.lock);
}

void stoke__hip_set_runtime_for_test(const struct stoke__hip_runtime *rt)
{
    pthread_mutex_lock(&g.lock);
    reset_locked();
    g.test_mode = rt != NULL;
    memset(&g.test_rt, 0, sizeof(g.test_rt));
    if (rt)
        g.test_rt = *rt;
    memset(&g.rt, 0, sizeof(g.rt));
    pthread_mutex_unlock(&g.lock);
}

/* ---- IPC (stoke/ipc.h) -------------------------------------------------------------------- *
 * Device buffers: the runtime's IPC memory handles (64 bytes in the handle's blob, no file
 * descriptor), opened on the importer's device.  Pinned host blocks come from hipHostMalloc,
 * which another process cannot map: not shareable here. */

#define HIP_IPC_MAGIC 0x50494948u /* "HIIP" */

typedef struct hip_ipc_blob {
    uint32_t magic; /* HIP_IPC_MAGIC */
    int32_t dev;    /* the exporter's device index */
    hipIpcMemHandle_t mh;
} hip_ipc_blob;

static int hip_ipc_check(int kind, const char *what)
{
    if (kind == STOKE_IPC_HOST)
        return stoke__fail(STOKE_ENOTSUP, "hip: %s: pinned host blocks are hipHostMalloc "
                           "memory, which another process cannot map; on hip only device "
                           "buffers can be shared", what);
    if (g.rt.hipIpcGetMemHandle && g.rt.hipIpcOpenMemHandle && g.rt.hipIpcCloseMemHandle)
        return STOKE_OK;
    return stoke__fail(STOKE_ENOTSUP, "hip: %s: the runtime has no hipIpcGetMemHandle / "
                       "hipIpcOpenMemHandle / hipIpcCloseMemHandle", what);
}

static int hip_ipc_export(int dev, stoke_ipc_handle *h, void *ptr)
{
    int prev, rc = hip_ipc_check((int)h->kind, "export");
    if (rc == STOKE_OK)
        rc = enter(dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    hip_ipc_blob blob = {.magic = HIP_IPC_MAGIC, .dev = dev};
    hipError_t r = g.rt.hipIpcGetMemHandle(&blob.mh, ptr);
    rc = leave(dev, prev, r, "hipIpcGetMemHandle(%p) on device %d", ptr, dev);
    if (r == hipErrorNotSupported)
        rc = STOKE_ENOTSUP;
    if (rc != STOKE_OK)
        return rc;
    memcpy(h->blob, &blob, sizeof(blob));
    h->blob_len = sizeof(blob);
    return STOKE_OK;
}

static int hip_ipc_import(int dev, const stoke_ipc_handle *h, void **out)
{
    *out = NULL;
    int prev, rc = hip_ipc_check((int)h->kind, "import");
    if (rc != STOKE_OK)
        return rc;
    hip_ipc_blob blob;
    memcpy(&blob, h->blob, sizeof(blob));
    if (h->blob_len != sizeof(blob) || blob.magic != HIP_IPC_MAGIC)
        return stoke__fail(STOKE_EINVAL, "hip: import: the handle's blob (%u bytes) is not a "
                           "HIP IPC handle", (unsigned)h->blob_len);
    rc = enter(dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    void *d = NULL;
    hipError_t r = g.rt.hipIpcOpenMemHandle(&d, blob.mh, hipIpcMemLazyEnablePeerAccess);
    rc = leave(dev, prev, r == hipSuccess && !d ? hipErrorInvalidValue : r,
               "hipIpcOpenMemHandle (device %d of process %lld) on device %d", (int)blob.dev,
               (long long)h->pid, dev);
    if (rc == STOKE_OK)
        *out = d;
    return rc;
}

static int hip_ipc_close(int dev, int kind, void *ptr)
{
    int prev, rc = hip_ipc_check(kind, "close");
    if (rc == STOKE_OK)
        rc = enter(dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    return leave(dev, prev, g.rt.hipIpcCloseMemHandle(ptr), "hipIpcCloseMemHandle(%p) on device "
                 "%d", ptr, dev);
}

static const stoke_backend hip_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "hip",
    .description = "AMD HIP (runtime API, libamdhip64.so loaded at run time)",
    .caps = STOKE_CAP_PINNED_ALLOC | STOKE_CAP_HOST_REGISTER | STOKE_CAP_DEVICE_MEMORY |
            STOKE_CAP_ASYNC_COPY | STOKE_CAP_EVENTS | STOKE_CAP_IPC,
    .probe = hip_probe,
    .device_count = hip_device_count,
    .device_props = hip_device_props,
    .host_alloc = hip_host_alloc,
    .host_free = hip_host_free,
    .host_register = hip_host_register,
    .host_unregister = hip_host_unregister,
    .is_pinned = hip_is_pinned,
    .device_alloc = hip_device_alloc,
    .device_free = hip_device_free,
    .stream_create = hip_stream_create,
    .stream_destroy = hip_stream_destroy,
    .stream_synchronize = hip_stream_synchronize,
    .copy_h2d_async = hip_copy_h2d,
    .copy_d2h_async = hip_copy_d2h,
    .event_create = hip_event_create,
    .event_destroy = hip_event_destroy,
    .event_record = hip_event_record,
    .event_query = hip_event_query,
    .event_synchronize = hip_event_synchronize,
    .shutdown = hip_shutdown,
    .ipc_export_mem = hip_ipc_export,
    .ipc_import_mem = hip_ipc_import,
    .ipc_close_mem = hip_ipc_close,
};

int stoke__backend_hip_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &hip_backend;
    return STOKE_OK;
}
