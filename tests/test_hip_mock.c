/* The hip backend's logic without an AMD GPU: a mock runtime table (hip_runtime.h) with a
 * per-thread current device like HIP's, "device" memory from malloc, and streams and events
 * that behave like a GPU's (mock_gpu.h: copies queued and run later by an engine thread, events
 * not ready until then, synchronize waits).  The mock checks
 * that every call runs with the right device current; the tests check that the caller's device
 * is restored and that the probe makes nothing current.  Plus the real loading path for a
 * library that is not there. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda_driver.h"
#include "backends/hip_runtime.h"
#include "mock_gpu.h"
#include "mock_checks.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"

/* ---- the mock runtime --------------------------------------------------------------------- */

#define NDEV_MAX 4

struct ihipStream_t {
    int dev;
    mg_stream *q;
};
struct ihipEvent_t {
    int dev;
    mg_event *m;
};

static struct mock_state {
    pthread_mutex_t lock;
    int version;
    hipError_t count_result;     /* hipGetDeviceCount's result */
    int ndev;
    int set_calls[NDEV_MAX];     /* hipSetDevice(d) calls, per d */
    int wrong;                   /* calls made with the wrong device current */
    char first_wrong[160];
    int fail_malloc, fail_host_malloc;
    hipError_t register_result;  /* hipHostRegister fails with this (when not hipSuccess) */
    int host_allocs, host_frees, registers, unregisters, dev_allocs, dev_frees;
    int streams, events, copies_h2d, copies_d2h;
    int streams_on[NDEV_MAX];    /* streams created, per device current at the time */
    int last_host_alloc_dev;     /* device current at the last hipHostMalloc */
    int ipc_gets, ipc_opens, ipc_closes, ipc_open_now; /* IPC calls; handles open right now */
    int ipc_open_dev;            /* device current at the last hipIpcOpenMemHandle */
} mk = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int tl_dev; /* HIP's per-thread current device; 0 until set */

static void count(int *c)
{
    pthread_mutex_lock(&mk.lock);
    (*c)++;
    pthread_mutex_unlock(&mk.lock);
}

/* Records a violation unless the current device is `want` (-1: any). */
static int on(const char *call, int want)
{
    if (want < 0 || tl_dev == want)
        return 1;
    pthread_mutex_lock(&mk.lock);
    if (!mk.wrong++)
        snprintf(mk.first_wrong, sizeof(mk.first_wrong), "%s ran on device %d, not %d", call,
                 tl_dev, want);
    pthread_mutex_unlock(&mk.lock);
    return 0;
}

static hipError_t r_version(int *v)
{
    *v = mk.version;
    return hipSuccess;
}
static hipError_t r_driver_version(int *v)
{
    *v = mk.version;
    return hipSuccess;
}
static hipError_t r_count(int *n)
{
    *n = mk.count_result == hipSuccess ? mk.ndev : 0;
    return mk.count_result;
}
static hipError_t r_device_get(hipDevice_t *d, int i)
{
    if (i < 0 || i >= mk.ndev)
        return hipErrorInvalidDevice;
    *d = 40 + i; /* handles differ from ordinals */
    return hipSuccess;
}
static hipError_t r_name(char *s, int len, hipDevice_t d)
{
    snprintf(s, (size_t)len, "Mock Instinct %d", d - 40);
    return hipSuccess;
}
static hipError_t r_total_mem(size_t *b, hipDevice_t d)
{
    *b = (size_t)(d - 39) << 30;
    return hipSuccess;
}
static hipError_t r_pci(char *s, int len, hipDevice_t d)
{
    snprintf(s, (size_t)len, "0000:%02x:00.0", 0xc1 + (d - 40));
    return hipSuccess;
}
static hipError_t r_cc(int *major, int *minor, hipDevice_t d)
{
    *major = 9;
    *minor = 4;
    return hipSuccess;
}
static hipError_t r_get_device(int *d)
{
    *d = tl_dev;
    return hipSuccess;
}
static hipError_t r_set_device(int d)
{
    if (d < 0 || d >= mk.ndev)
        return hipErrorInvalidDevice;
    count(&mk.set_calls[d]);
    tl_dev = d;
    return hipSuccess;
}
static hipError_t r_host_malloc(void **p, size_t n, unsigned flags)
{
    if (!(flags & hipHostMallocPortable))
        on("hipHostMalloc without Portable", 99);
    if (mk.fail_host_malloc)
        return hipErrorOutOfMemory;
    if (posix_memalign(p, 4096, n))
        return hipErrorOutOfMemory;
    if (mg_pin_add(*p, n, MG_PIN_ALLOC) != 0) {
        free(*p);
        return hipErrorOutOfMemory;
    }
    pthread_mutex_lock(&mk.lock);
    mk.host_allocs++;
    mk.last_host_alloc_dev = tl_dev;
    pthread_mutex_unlock(&mk.lock);
    return hipSuccess;
}
static hipError_t r_host_free(void *p)
{
    if (mg_pin_remove(p, MG_PIN_ALLOC) != 0)
        return hipErrorInvalidValue;
    free(p);
    count(&mk.host_frees);
    return hipSuccess;
}
static hipError_t r_register(void *p, size_t n, unsigned flags)
{
    if (!(flags & hipHostRegisterPortable))
        on("hipHostRegister without Portable", 99);
    if (mk.register_result != hipSuccess)
        return mk.register_result;
    if (!p || !n)
        return hipErrorInvalidValue;
    /* Like the runtime: memory already page-locked (in part, by anyone) is refused. */
    if (mg_pin_add(p, n, MG_PIN_REGISTERED) != 0)
        return hipErrorHostMemoryAlreadyRegistered;
    count(&mk.registers);
    return hipSuccess;
}
static hipError_t r_unregister(void *p)
{
    if (mg_pin_remove(p, MG_PIN_REGISTERED) != 0)
        return hipErrorHostMemoryNotRegistered;
    count(&mk.unregisters);
    return hipSuccess;
}
static hipError_t r_malloc(void **p, size_t n)
{
    if (mk.fail_malloc)
        return hipErrorOutOfMemory;
    *p = mg_dev_alloc(tl_dev, n);
    if (!*p)
        return hipErrorOutOfMemory;
    count(&mk.dev_allocs);
    return hipSuccess;
}
static hipError_t r_free(void *p)
{
    size_t off, size;
    int dev;
    if (!mg_dev_find(p, &off, &dev, &size) || off)
        return hipErrorInvalidValue;
    on("hipFree", dev);
    mg_dev_free(p);
    count(&mk.dev_frees);
    return hipSuccess;
}
/* IPC: one address space, so the handle names the block and "another process" opens it. */
static const char ipc_tag[8] = "MOCKHIP";
static hipError_t r_ipc_get(hipIpcMemHandle_t *h, void *p)
{
    size_t off, size;
    int dev;
    if (!mg_dev_find(p, &off, &dev, &size) || off)
        return hipErrorInvalidValue;
    on("hipIpcGetMemHandle", dev);
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, ipc_tag, sizeof(ipc_tag));
    memcpy(h->reserved + 8, &p, sizeof(p));
    count(&mk.ipc_gets);
    return hipSuccess;
}
static hipError_t r_ipc_open(void **d, hipIpcMemHandle_t h, unsigned flags)
{
    void *p;
    memcpy(&p, h.reserved + 8, sizeof(p));
    size_t off, size;
    int dev;
    if (memcmp(h.reserved, ipc_tag, sizeof(ipc_tag)) != 0 || !mg_dev_find(p, &off, &dev, &size) ||
        off || !(flags & hipIpcMemLazyEnablePeerAccess))
        return hipErrorInvalidValue;
    *d = p;
    pthread_mutex_lock(&mk.lock);
    mk.ipc_opens++;
    mk.ipc_open_now++;
    mk.ipc_open_dev = tl_dev;
    pthread_mutex_unlock(&mk.lock);
    return hipSuccess;
}
static hipError_t r_ipc_close(void *d)
{
    pthread_mutex_lock(&mk.lock);
    int open = mk.ipc_open_now > 0;
    if (open) {
        mk.ipc_open_now--;
        mk.ipc_closes++;
    }
    pthread_mutex_unlock(&mk.lock);
    return open ? hipSuccess : hipErrorInvalidValue;
}
static hipError_t r_stream_create(hipStream_t *s, unsigned flags)
{
    if (!(flags & hipStreamNonBlocking))
        on("stream not hipStreamNonBlocking", 99);
    *s = calloc(1, sizeof(**s));
    if (!*s || !((*s)->q = mg_stream_create())) {
        free(*s);
        return hipErrorOutOfMemory;
    }
    (*s)->dev = tl_dev;
    count(&mk.streams);
    count(&mk.streams_on[tl_dev]);
    return hipSuccess;
}
static hipError_t r_stream_destroy(hipStream_t s)
{
    on("hipStreamDestroy", s->dev);
    mg_stream_destroy(s->q);
    free(s);
    return hipSuccess;
}
static hipError_t r_stream_sync(hipStream_t s)
{
    on("hipStreamSynchronize", s->dev);
    mg_stream_sync(s->q);
    return hipSuccess;
}
static hipError_t r_memcpy_async(void *dst, const void *src, size_t n, int kind, hipStream_t s)
{
    on("hipMemcpyAsync", s->dev);
    size_t off, size;
    int dev;
    if ((kind != hipMemcpyHostToDevice && kind != hipMemcpyDeviceToHost) ||
        !mg_dev_find(kind == hipMemcpyHostToDevice ? dst : src, &off, &dev, &size) ||
        dev != s->dev || off + n > size)
        return hipErrorInvalidValue;
    if (mg_copy(s->q, dst, src, n) != 0)
        return hipErrorOutOfMemory;
    count(kind == hipMemcpyHostToDevice ? &mk.copies_h2d : &mk.copies_d2h);
    return hipSuccess;
}
static hipError_t r_event_create(hipEvent_t *e, unsigned flags)
{
    if (!(flags & hipEventDisableTiming))
        on("event without hipEventDisableTiming", 99);
    *e = calloc(1, sizeof(**e));
    if (!*e || !((*e)->m = mg_event_create())) {
        free(*e);
        return hipErrorOutOfMemory;
    }
    (*e)->dev = tl_dev;
    count(&mk.events);
    return hipSuccess;
}
static hipError_t r_event_destroy(hipEvent_t e)
{
    on("hipEventDestroy", e->dev);
    mg_event_destroy(e->m);
    free(e);
    return hipSuccess;
}
static hipError_t r_event_record(hipEvent_t e, hipStream_t s)
{
    on("hipEventRecord", s->dev);
    if (e->dev != s->dev)
        return hipErrorInvalidValue;
    return mg_event_record(e->m, s->q) == 0 ? hipSuccess : hipErrorOutOfMemory;
}
static hipError_t r_event_query(hipEvent_t e)
{
    on("hipEventQuery", e->dev);
    return mg_event_done(e->m) ? hipSuccess : hipErrorNotReady;
}
static hipError_t r_event_sync(hipEvent_t e)
{
    on("hipEventSynchronize", e->dev);
    mg_event_sync(e->m);
    return hipSuccess;
}
static const char *r_err_name(hipError_t r)
{
    switch (r) {
    case hipErrorOutOfMemory: return "hipErrorOutOfMemory";
    case hipErrorNoDevice: return "hipErrorNoDevice";
    case hipErrorInsufficientDriver: return "hipErrorInsufficientDriver";
    case hipErrorHostMemoryAlreadyRegistered: return "hipErrorHostMemoryAlreadyRegistered";
    case hipErrorUnknown: return "hipErrorUnknown";
    default: return "hipErrorMock";
    }
}
static const char *r_err_string(hipError_t r)
{
    switch (r) {
    case hipErrorOutOfMemory: return "out of memory";
    case hipErrorNoDevice: return "no ROCm-capable device is detected";
    case hipErrorUnknown: return "unknown error (mock)";
    default: return "mock error";
    }
}

static struct stoke__hip_runtime mock_runtime(void)
{
    struct stoke__hip_runtime rt = {
        .hipRuntimeGetVersion = r_version,
        .hipGetDeviceCount = r_count,
        .hipDeviceGet = r_device_get,
        .hipDeviceGetName = r_name,
        .hipDeviceTotalMem = r_total_mem,
        .hipGetDevice = r_get_device,
        .hipSetDevice = r_set_device,
        .hipHostMalloc = r_host_malloc,
        .hipHostFree = r_host_free,
        .hipHostRegister = r_register,
        .hipHostUnregister = r_unregister,
        .hipMalloc = r_malloc,
        .hipFree = r_free,
        .hipStreamCreateWithFlags = r_stream_create,
        .hipStreamDestroy = r_stream_destroy,
        .hipStreamSynchronize = r_stream_sync,
        .hipMemcpyAsync = r_memcpy_async,
        .hipEventCreateWithFlags = r_event_create,
        .hipEventDestroy = r_event_destroy,
        .hipEventRecord = r_event_record,
        .hipEventQuery = r_event_query,
        .hipEventSynchronize = r_event_sync,
        .hipDriverGetVersion = r_driver_version,
        .hipDeviceGetPCIBusId = r_pci,
        .hipDeviceComputeCapability = r_cc,
        .hipGetErrorName = r_err_name,
        .hipGetErrorString = r_err_string,
        .hipIpcGetMemHandle = r_ipc_get,
        .hipIpcOpenMemHandle = r_ipc_open,
        .hipIpcCloseMemHandle = r_ipc_close,
    };
    return rt;
}

/* Resets the mock to `ndev` healthy devices of HIP 6.2 and installs `rt` (NULL: the full
 * table).  The calling thread's current device goes back to HIP's default, 0. */
static void install(int ndev, const struct stoke__hip_runtime *rt)
{
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL); /* shuts the backend down */
    mg_reset();
    pthread_mutex_lock(&mk.lock);
    memset(&mk.version, 0, sizeof(mk) - offsetof(struct mock_state, version));
    mk.version = 60241134; /* HIP 6.2.41134 */
    mk.ndev = ndev;
    mk.count_result = hipSuccess;
    mk.register_result = hipSuccess;
    mk.last_host_alloc_dev = -1;
    pthread_mutex_unlock(&mk.lock);
    tl_dev = 0;
    struct stoke__hip_runtime full = mock_runtime();
    stoke__hip_set_runtime_for_test(rt ? rt : &full);
}

/* install(ndev, NULL), then hip as the explicitly chosen accelerator (mc_use). */
static void use_hip(int ndev)
{
    install(ndev, NULL);
    mc_use("hip");
}

static const stoke_backend *hip_table(void)
{
    const stoke_backend *vt = NULL;
    assert_int_equal(stoke__backend_lookup("hip", &vt), STOKE_OK);
    return vt;
}

static int total_set_calls(void)
{
    int n = 0;
    for (int i = 0; i < NDEV_MAX; i++)
        n += mk.set_calls[i];
    return n;
}

static void assert_all_on_right_device(void)
{
    if (mk.wrong)
        fail_msg("%d runtime call(s) on the wrong device; first: %s", mk.wrong, mk.first_wrong);
}

static int teardown(void **state)
{
    mg_hold(0);
    mg_set_delay_us(0);
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL);
    tu_env("STOKE_HIP_LIBRARY", NULL);
    stoke__hip_set_runtime_for_test(NULL);
    stoke__cuda_set_driver_for_test(NULL);
    tl_dev = 0;
    return 0;
}

/* ---- unavailability reasons --------------------------------------------------------------- */

static void test_missing_library(void **state)
{
    stoke__hip_set_runtime_for_test(NULL);
    tu_env("STOKE_HIP_LIBRARY", "/nonexistent/rocm/libamdhip64.so.6");
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "/nonexistent/rocm/libamdhip64.so.6 not found "
                                   "(STOKE_HIP_LIBRARY)"));
}

/* The default names on a machine without ROCm.  Run alone, as the CTest test
 * test_hip_mock_default_library (tests/test_hip_mock.cmake), which reports SKIP where a HIP
 * runtime is installed: this outcome cannot be forced there. */
static void test_missing_default_library(void **state)
{
    stoke__hip_set_runtime_for_test(NULL);
    tu_env("STOKE_HIP_LIBRARY", NULL);
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "libamdhip64.so not found (tried .so.6, .so.5, .so"));
}

static void test_missing_symbol(void **state)
{
    struct stoke__hip_runtime rt = mock_runtime();
    rt.hipMalloc = NULL;
    install(1, &rt);
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "lacks hipMalloc"));
    assert_non_null(strstr(reason, "runtime too old"));
    assert_non_null(strstr(reason, "(HIP 6.2)"));

    /* Without even a version: not recognisably a HIP runtime. */
    rt = mock_runtime();
    rt.hipRuntimeGetVersion = NULL;
    install(1, &rt);
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "missing symbol"));
    assert_non_null(strstr(reason, "lacks hipRuntimeGetVersion"));

    /* Optional symbols may be missing: the properties they give are then empty. */
    rt = mock_runtime();
    rt.hipDriverGetVersion = NULL;
    rt.hipDeviceGetPCIBusId = NULL;
    rt.hipDeviceComputeCapability = NULL;
    rt.hipGetErrorName = NULL;
    rt.hipGetErrorString = NULL;
    install(1, &rt);
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_OK);
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props("hip", 0, &p), STOKE_OK);
    assert_string_equal(p.name, "Mock Instinct 0");
    assert_string_equal(p.pci_bus_id, "");
    assert_int_equal(p.compute_major, 0);
    /* An error still says what failed, without the runtime's words. */
    mk.fail_malloc = 1;
    void *d = (void *)1;
    assert_int_equal(hip_table()->device_alloc(0, 64, &d), STOKE_ENOMEM);
    assert_null(d);
    assert_non_null(strstr(stoke_last_error(), "hipMalloc(64 bytes) on device 0: "
                                               "hipErrorOutOfMemory (2)"));
}

static void test_runtime_too_old(void **state)
{
    install(1, NULL);
    mk.version = 40200000; /* HIP 4.2 */
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "runtime too old: HIP 4.2.0, stoke needs HIP 5.0 or newer"));
}

static void test_no_device(void **state)
{
    install(2, NULL);
    mk.count_result = hipErrorNoDevice;
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "no device: hipGetDeviceCount returned hipErrorNoDevice "
                                   "(no ROCm-capable device is detected)"));

    install(0, NULL); /* success, zero devices */
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "no device: the runtime reports 0 HIP devices"));
}

static void test_init_error_carries_runtime_message(void **state)
{
    install(1, NULL);
    mk.count_result = hipErrorUnknown;
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "initialization error: hipGetDeviceCount failed with "
                                   "hipErrorUnknown (999): unknown error (mock)"));

    install(1, NULL);
    mk.count_result = hipErrorInsufficientDriver;
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "driver too old for HIP 6.2"));
}

/* ---- the current device ------------------------------------------------------------------- */

static void test_probe_makes_nothing_current(void **state)
{
    install(3, NULL);
    r_set_device(2); /* the caller's own choice */
    mk.set_calls[2] = 0;
    char reason[256];
    assert_int_equal(mc_select("hip", reason, sizeof(reason)), STOKE_OK);
    stoke_accelerator_info ai;
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_OK);
    assert_string_equal(ai.backend, "hip");
    assert_int_equal(ai.device_count, 3);
    for (int i = 0; i < 3; i++) {
        stoke_device_props p = {.size = sizeof(p)};
        assert_int_equal(stoke_device_get_props("hip", i, &p), STOKE_OK);
        char want[64];
        snprintf(want, sizeof(want), "Mock Instinct %d", i);
        assert_string_equal(p.name, want);
        assert_string_equal(p.vendor, "AMD");
        assert_int_equal(p.kind, STOKE_DEVICE_GPU);
        assert_int_equal(p.total_memory, (uint64_t)(i + 1) << 30);
        snprintf(want, sizeof(want), "0000:%02x:00.0", 0xc1 + i);
        assert_string_equal(p.pci_bus_id, want);
        assert_int_equal(p.compute_major, 9);
        assert_int_equal(p.compute_minor, 4);
        assert_string_equal(p.driver_version, "HIP 6.2.41134");
    }
    /* Nothing was made current, allocated or created. */
    assert_int_equal(total_set_calls(), 0);
    assert_int_equal(tl_dev, 2);
    assert_int_equal(mk.host_allocs + mk.dev_allocs + mk.streams + mk.events, 0);
}

static void test_calls_run_on_their_device_and_restore_the_callers(void **state)
{
    use_hip(3);
    r_set_device(2); /* the caller works on device 2 through HIP directly */
    memset(mk.set_calls, 0, sizeof(mk.set_calls));
    assert_int_equal(stoke_device_set(1), STOKE_OK);

    void *p = NULL;
    assert_int_equal(stoke_pinned_alloc(1 << 16, &p), STOKE_OK);
    assert_int_equal(mk.last_host_alloc_dev, 1);
    assert_int_equal(tl_dev, 2);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_stream_device(s), 1);
    assert_int_equal(tl_dev, 2);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, 1 << 16, &d), STOKE_OK);
    assert_int_equal(tl_dev, 2);
    stoke_event *e = NULL;
    assert_int_equal(stoke_event_create(s, &e), STOKE_OK);
    assert_int_equal(stoke_copy_h2d_async(d, 0, p, 1 << 16, s), STOKE_OK);
    assert_int_equal(tl_dev, 2);
    assert_int_equal(stoke_event_record(e, s), STOKE_OK);
    assert_int_equal(stoke_event_synchronize(e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK); /* after synchronize: no longer busy */
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_int_equal(tl_dev, 2);
    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    assert_int_equal(tl_dev, 2);
    assert_all_on_right_device();
    /* Device 0 was never touched; every switch to 1 was undone by a switch back to 2. */
    assert_int_equal(mk.set_calls[0], 0);
    assert_true(mk.set_calls[1] > 0);
    assert_int_equal(mk.set_calls[2], mk.set_calls[1]);

    /* A caller already on the target device sees no switch at all. */
    r_set_device(1);
    memset(mk.set_calls, 0, sizeof(mk.set_calls));
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 4096, &d), STOKE_OK);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(total_set_calls(), 0);
    assert_all_on_right_device();
}

/* ---- pinned memory ------------------------------------------------------------------------ */

static void test_pinned_alloc_and_is_pinned(void **state)
{
    use_hip(2);
    const stoke_backend *vt = hip_table();
    assert_true(vt->caps & STOKE_CAP_PINNED_ALLOC);
    char *p = NULL;
    assert_int_equal(vt->host_alloc(1, 10000, (void **)&p), STOKE_OK);
    assert_int_equal(mk.last_host_alloc_dev, 1);
    int pinned = -1;
    assert_int_equal(vt->is_pinned(p, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(p + 5000, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(p + 9999, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(p + 10000, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->is_pinned(&pinned, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->is_pinned(NULL, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    /* Only the start of a block is freed; what is not ours never reaches the runtime. */
    assert_int_equal(vt->host_free(1, p + 8), STOKE_EINVAL);
    assert_int_equal(vt->host_free(1, &pinned), STOKE_EINVAL);
    assert_int_equal(mk.host_frees, 0);
    assert_int_equal(vt->host_free(1, p), STOKE_OK);
    assert_int_equal(mk.host_frees, 1);
    assert_int_equal(vt->is_pinned(p + 5000, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->host_free(1, p), STOKE_EINVAL); /* twice */
    assert_int_equal(mk.host_frees, 1);
    assert_all_on_right_device();

    /* Shutdown frees what is still pinned. */
    assert_int_equal(vt->host_alloc(0, 4096, (void **)&p), STOKE_OK);
    tu_env("STOKE_ACCELERATOR", NULL);
    assert_int_equal(mk.host_frees, mk.host_allocs);
}

static void test_register_unregister(void **state)
{
    use_hip(2);
    const stoke_backend *vt = hip_table();
    char *mem = NULL;
    assert_int_equal(posix_memalign((void **)&mem, 4096, 65536), 0);
    assert_int_equal(vt->host_register(1, mem, 65536), STOKE_OK);
    assert_int_equal(mk.registers, 1);
    int pinned = 0;
    assert_int_equal(vt->is_pinned(mem + 65535, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    /* Overlapping, empty and wrong-kind requests are refused before the runtime sees them. */
    assert_int_equal(vt->host_register(1, mem + 4096, 4096), STOKE_EINVAL);
    assert_int_equal(vt->host_register(1, mem, 0), STOKE_EINVAL);
    assert_int_equal(vt->host_free(1, mem), STOKE_EINVAL);
    assert_int_equal(mk.registers, 1);
    assert_int_equal(vt->host_unregister(1, mem), STOKE_OK);
    assert_int_equal(mk.unregisters, 1);
    assert_int_equal(vt->is_pinned(mem + 100, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->host_unregister(1, mem), STOKE_EINVAL);
    assert_int_equal(mk.unregisters, 1);

    /* The runtime failing leaves nothing tracked. */
    mk.register_result = hipErrorUnknown;
    assert_int_equal(vt->host_register(0, mem, 65536), STOKE_EBACKEND);
    assert_non_null(strstr(stoke_last_error(), "hipHostRegister(65536 bytes) for device 0: "
                                               "hipErrorUnknown (999): unknown error (mock)"));
    assert_int_equal(vt->is_pinned(mem, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    free(mem);
    assert_all_on_right_device();
}

/* ---- failures ----------------------------------------------------------------------------- */

static void test_alloc_failure_says_why(void **state)
{
    use_hip(1);

    mk.fail_host_malloc = 1;
    void *p = (void *)1;
    assert_int_equal(hip_table()->host_alloc(0, 4096, &p), STOKE_ENOMEM);
    assert_null(p);
    assert_non_null(strstr(stoke_last_error(), "hip: hipHostMalloc(4096 bytes) for device 0: "
                                               "hipErrorOutOfMemory (2): out of memory"));
    mk.fail_host_malloc = 0;

    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    mk.fail_malloc = 1;
    tu_log_capture();
    tu_log_clear();
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, 1 << 20, &d), STOKE_ENOMEM);
    assert_null(d);
    assert_non_null(strstr(stoke_last_error(), "hipMalloc(1048576 bytes) on device 0: "
                                               "hipErrorOutOfMemory (2): out of memory"));
    assert_true(tu_log_count(-1, "hipErrorOutOfMemory (2): out of memory") >= 1);
    mk.fail_malloc = 0;
    stoke_stream_destroy(s);
    assert_int_equal(tl_dev, 0);
    assert_all_on_right_device();
}

/* ---- a whole cycle ------------------------------------------------------------------------ */

static void test_alloc_copy_event_cycle(void **state)
{
    use_hip(2);
    assert_true(hip_table()->caps & STOKE_CAP_ASYNC_COPY);
    assert_true(hip_table()->caps & STOKE_CAP_EVENTS);

    size_t n = 200003;
    unsigned char *src = NULL, *back = NULL;
    assert_int_equal(stoke_pinned_alloc(n, (void **)&src), STOKE_OK);
    assert_int_equal(stoke_pinned_alloc(n, (void **)&back), STOKE_OK);
    assert_int_equal(stoke_is_pinned(src + n - 1), 1);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 13 + 5);
    memset(back, 0, n);

    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, n + 64, &d), STOKE_OK);
    stoke_event *e = NULL;
    assert_int_equal(stoke_event_create(s, &e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK); /* never recorded */
    assert_int_equal(stoke_copy_h2d_async(d, 64, src, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, 64, n, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e, s), STOKE_OK);
    assert_int_equal(stoke_event_synchronize(e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK);
    assert_memory_equal(back, src, n);
    assert_int_equal(mk.copies_h2d, 1);
    assert_int_equal(mk.copies_d2h, 1);

    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(mk.dev_frees, mk.dev_allocs);
    assert_int_equal(stoke_pinned_free(src), STOKE_OK);
    assert_int_equal(stoke_pinned_free(back), STOKE_OK);
    assert_int_equal(total_set_calls(), 0); /* all on device 0, the thread's current one */
    assert_all_on_right_device();
}

/* Threads with different devices of their own, all working on device 1 at once. */
static void *cycle_worker(void *arg)
{
    int *ok = arg;
    int mine = *ok; /* in: the thread's own current device; out: success */
    *ok = 0;
    r_set_device(mine);
    if (stoke_device_set(1) != STOKE_OK)
        return NULL;
    size_t n = 32768;
    unsigned char *src = NULL, *back = malloc(n);
    stoke_stream *s = NULL;
    stoke_device_buffer *d = NULL;
    stoke_event *e = NULL;
    if (back && stoke_pinned_alloc(n, (void **)&src) == STOKE_OK &&
        stoke_stream_create(NULL, &s) == STOKE_OK &&
        stoke_device_buffer_create(s, n, &d) == STOKE_OK && stoke_event_create(s, &e) == STOKE_OK) {
        *ok = 1;
        for (int r = 0; r < 16 && *ok; r++) {
            memset(src, r + mine, n);
            if (stoke_copy_h2d_async(d, 0, src, n, s) != STOKE_OK ||
                stoke_copy_d2h_async(back, d, 0, n, s) != STOKE_OK ||
                stoke_event_record(e, s) != STOKE_OK || stoke_event_synchronize(e) != STOKE_OK ||
                memcmp(back, src, n) != 0 || tl_dev != mine)
                *ok = 0;
        }
    }
    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    if (src)
        stoke_pinned_free(src);
    free(back);
    if (tl_dev != mine)
        *ok = 0;
    return NULL;
}

static void test_threads_keep_their_own_device(void **state)
{
    use_hip(3);
    enum { T = 4 };
    pthread_t th[T];
    int ok[T];
    for (int i = 0; i < T; i++) {
        ok[i] = i % 3; /* devices 0, 1, 2, 0 */
        assert_int_equal(pthread_create(&th[i], NULL, cycle_worker, &ok[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_true(ok[i]);
    }
    assert_int_equal(mk.streams_on[1], T); /* every thread's stream went to device 1 */
    assert_all_on_right_device();
}

/* ---- selection order ---------------------------------------------------------------------- */

static void test_automatic_selection_prefers_hip_after_cuda(void **state)
{
    install(2, NULL);
    /* A cuda "driver" with no entry points at all: unavailable, whatever this machine has. */
    struct stoke__cuda_driver none;
    memset(&none, 0, sizeof(none));
    stoke__cuda_set_driver_for_test(&none);
    tu_env("STOKE_ACCELERATOR", NULL);
    stoke_accelerator_info ai;
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_OK);
    assert_string_equal(ai.backend, "hip");
    assert_int_equal(ai.device_count, 2);
    assert_non_null(strstr(ai.reason, "first available built-in"));
    stoke_backend_info bi;
    int found_cuda = 0;
    int nb = stoke_backend_count();
    for (int i = 0; i < nb && stoke_backend_get_info(i, &bi) == STOKE_OK; i++)
        if (strcmp(bi.name, "cuda") == 0) {
            found_cuda = 1;
            assert_false(bi.available);
        }
    assert_true(found_cuda);
    /* Pinned memory now comes from hip. */
    void *p = NULL;
    assert_int_equal(stoke_pinned_alloc(8192, &p), STOKE_OK);
    assert_int_equal(stoke_is_pinned(p), 1);
    assert_true(mk.host_allocs >= 1);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
}

/* ---- a GPU that works asynchronously ------------------------------------------------------ */

/* Copies run later, on the mock's engine (mock_checks.h). */
static void test_synchronize_waits_for_queued_copies(void **state)
{
    use_hip(2);
    mc_async_copies();
    assert_all_on_right_device();
}

/* The runtime refuses ranges that overlap memory already page-locked by anyone, with
 * hipErrorHostMemoryAlreadyRegistered (mock_checks.h). */
static void test_register_refused_with_runtime_codes(void **state)
{
    use_hip(1);
    mc_register_refusals(hip_table(), "hipHostRegister(65536 bytes) for device 0: "
                                      "hipErrorHostMemoryAlreadyRegistered (712)");
    assert_int_equal(mk.registers, 1);
    assert_int_equal(mk.unregisters, 1);
    assert_all_on_right_device();
}

/* The loader's device path on a GPU with a slow copy engine, device 1 of the caller's thread on
 * 0: no staging slot or batch buffer is reused before its copy ran (mock_checks.h). */
static void test_loader_device_path_on_a_slow_gpu(void **state)
{
    use_hip(2);
    mc_device_run("hip", 2, 1, 1500);
    mc_device_run("hip", 3, 0, 1500);
    mc_device_run("hip", 0, 1, 1500);
    assert_int_equal(mk.dev_frees, mk.dev_allocs);
    assert_int_equal(tl_dev, 0);
    assert_all_on_right_device();
}

/* IPC of a device buffer on device 1 through the runtime's memory handles; host blocks and a
 * runtime without the IPC entry points are refused with the reason. */
static void test_ipc_device_buffer(void **state)
{
    use_hip(2);
    assert_int_equal(stoke_device_set(1), STOKE_OK);
    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL, *imp = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 8192, &b), STOKE_OK);
    stoke_ipc_handle h;
    assert_int_equal(stoke_ipc_export_device(b, &h), STOKE_OK);
    assert_string_equal(h.backend, "hip");
    assert_int_equal(h.fd, -1);
    assert_int_equal(stoke_ipc_import_device(&h, &imp), STOKE_OK);
    assert_int_equal(mk.ipc_open_dev, 1);
    assert_int_equal(stoke_ipc_close(&h), STOKE_OK);
    unsigned char in[8192], out[8192];
    for (size_t i = 0; i < sizeof(in); i++)
        in[i] = (unsigned char)(i * 5 + 2);
    assert_int_equal(stoke_copy_h2d_async(imp, 0, in, sizeof(in), s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(out, b, 0, sizeof(out), s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(in, out, sizeof(in));
    stoke_device_buffer_destroy(imp);
    assert_int_equal(mk.ipc_closes, 1);
    assert_int_equal(mk.ipc_open_now, 0);
    assert_int_equal(mk.dev_frees, 0);
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);

    void *block = NULL;
    assert_int_equal(stoke_pinned_alloc(4096, &block), STOKE_OK);
    assert_int_equal(stoke_ipc_export(block, 0, &h), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "hipHostMalloc memory"));
    stoke_pinned_free(block);
    assert_all_on_right_device();

    struct stoke__hip_runtime rt = mock_runtime();
    rt.hipIpcOpenMemHandle = NULL;
    install(1, &rt);
    mc_use("hip");
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 4096, &b), STOKE_OK);
    assert_int_equal(stoke_ipc_export_device(b, &h), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "no hipIpcGetMemHandle"));
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
}

int main(int argc, char **argv)
{
    /* `test_hip_mock default-library`: test_missing_default_library alone (mock_checks.h) */
    if (argc > 1 && strcmp(argv[1], "default-library") == 0) {
        static const char *const names[] = {"libamdhip64.so.6", "libamdhip64.so.5", "libamdhip64.so"};
        const struct CMUnitTest test =
            cmocka_unit_test_teardown(test_missing_default_library, teardown);
        return mc_run_default_library_test(names, sizeof(names) / sizeof(names[0]), &test);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_missing_library, teardown),
        cmocka_unit_test_teardown(test_missing_symbol, teardown),
        cmocka_unit_test_teardown(test_runtime_too_old, teardown),
        cmocka_unit_test_teardown(test_no_device, teardown),
        cmocka_unit_test_teardown(test_init_error_carries_runtime_message, teardown),
        cmocka_unit_test_teardown(test_probe_makes_nothing_current, teardown),
        cmocka_unit_test_teardown(test_calls_run_on_their_device_and_restore_the_callers,
                                  teardown),
        cmocka_unit_test_teardown(test_pinned_alloc_and_is_pinned, teardown),
        cmocka_unit_test_teardown(test_register_unregister, teardown),
        cmocka_unit_test_teardown(test_alloc_failure_says_why, teardown),
        cmocka_unit_test_teardown(test_alloc_copy_event_cycle, teardown),
        cmocka_unit_test_teardown(test_threads_keep_their_own_device, teardown),
        cmocka_unit_test_teardown(test_automatic_selection_prefers_hip_after_cuda, teardown),
        cmocka_unit_test_teardown(test_synchronize_waits_for_queued_copies, teardown),
        cmocka_unit_test_teardown(test_register_refused_with_runtime_codes, teardown),
        cmocka_unit_test_teardown(test_loader_device_path_on_a_slow_gpu, teardown),
        cmocka_unit_test_teardown(test_ipc_device_buffer, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
