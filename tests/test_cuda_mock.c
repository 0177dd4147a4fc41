/* The cuda backend's logic without a GPU: a mock driver table (cuda_driver.h) that emulates
 * devices, primary contexts, pinned and device memory (malloc), and streams and events that
 * behave like a GPU's (mock_gpu.h: copies queued and run later by an engine thread, events
 * not ready until then), and checks that every call runs with the right context current.  Plus the
 * real loading path for the reasons that need no driver: library missing, toolkit stub refused. */
#define _GNU_SOURCE
#include "testutil.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/cuda_driver.h"
#include "mock_checks.h"
#include "mock_gpu.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"

/* ---- the mock driver ---------------------------------------------------------------------- */

#define MOCK_MAX_DEV 4

struct CUctx_st {
    int dev;
};
struct CUstream_st {
    int dev;
    mg_stream *q;
};
struct CUevent_st {
    int dev;
    mg_event *m;
};

static struct {
    pthread_mutex_t lock;
    CUresult init_result;
    int version;
    int ndev;
    int retained[MOCK_MAX_DEV]; /* primary context retain count */
    int retain_calls[MOCK_MAX_DEV];
    int violations; /* calls made without the right context current */
    char violation[256];
    int fail_mem_alloc;   /* cuMemAlloc returns OUT_OF_MEMORY */
    int fail_host_alloc;  /* cuMemHostAlloc returns OUT_OF_MEMORY */
    CUresult event_error; /* cuEventQuery/Synchronize, cuStreamSynchronize fail with this */
    int host_allocs, host_frees, registers, unregisters, dev_allocs, dev_frees;
    int h2d, d2h;
    int alloc_dev[8]; /* device whose context was current at each cuMemHostAlloc */
    int ipc_gets, ipc_opens, ipc_closes, ipc_open_now; /* IPC calls; handles open right now */
    int ipc_open_dev;    /* device whose context was current at the last open */
    CUresult ipc_result; /* cuIpcGetMemHandle fails with this (0: works) */
} mock = {.lock = PTHREAD_MUTEX_INITIALIZER};

static struct CUctx_st mock_ctx[MOCK_MAX_DEV];
static _Thread_local int ctx_stack[16];
static _Thread_local int ctx_depth;

static void violation(const char *what)
{
    pthread_mutex_lock(&mock.lock);
    if (!mock.violations++)
        snprintf(mock.violation, sizeof(mock.violation), "%s", what);
    pthread_mutex_unlock(&mock.lock);
}

static void count(int *c)
{
    pthread_mutex_lock(&mock.lock);
    (*c)++;
    pthread_mutex_unlock(&mock.lock);
}

/* Device of the current context, or -1. */
static int cur_dev(void)
{
    return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : -1;
}

static int need_ctx(const char *what, int dev)
{
    if (cur_dev() < 0 || (dev >= 0 && cur_dev() != dev)) {
        char m[128];
        snprintf(m, sizeof(m), "%s: current context is device %d, wanted %d", what, cur_dev(), dev);
        violation(m);
        return 0;
    }
    pthread_mutex_lock(&mock.lock);
    int alive = mock.retained[cur_dev()] > 0;
    pthread_mutex_unlock(&mock.lock);
    if (!alive) {
        violation("context used after release");
        return 0;
    }
    return 1;
}

static CUresult m_init(unsigned f)
{
    return mock.init_result;
}
static CUresult m_version(int *v)
{
    *v = mock.version;
    return CUDA_SUCCESS;
}
static CUresult m_count(int *n)
{
    *n = mock.ndev;
    return CUDA_SUCCESS;
}
static CUresult m_get(CUdevice *d, int i)
{
    if (i < 0 || i >= mock.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = 100 + i; /* device handles differ from ordinals */
    return CUDA_SUCCESS;
}
static CUresult m_name(char *name, int len, CUdevice d)
{
    snprintf(name, (size_t)len, "Mock GPU %d", d - 100);
    return CUDA_SUCCESS;
}
static CUresult m_totalmem(size_t *b, CUdevice d)
{
    *b = (size_t)(d - 99) << 30;
    return CUDA_SUCCESS;
}
static CUresult m_attr(int *v, int a, CUdevice d)
{
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *v = 0x17 + (d - 100); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: *v = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}
static CUresult m_retain(CUcontext *c, CUdevice d)
{
    int i = d - 100;
    if (i < 0 || i >= mock.ndev)
        return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&mock.lock);
    mock.retained[i]++;
    mock.retain_calls[i]++;
    pthread_mutex_unlock(&mock.lock);
    mock_ctx[i].dev = i;
    *c = &mock_ctx[i];
    return CUDA_SUCCESS;
}
static CUresult m_release(CUdevice d)
{
    int i = d - 100;
    pthread_mutex_lock(&mock.lock);
    mock.retained[i]--;
    pthread_mutex_unlock(&mock.lock);
    return CUDA_SUCCESS;
}
static CUresult m_push(CUcontext c)
{
    if (ctx_depth >= 16)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c->dev;
    return CUDA_SUCCESS;
}
static CUresult m_pop(CUcontext *c)
{
    if (ctx_depth <= 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    *c = &mock_ctx[ctx_stack[--ctx_depth]];
    return CUDA_SUCCESS;
}
static CUresult m_host_alloc(void **p, size_t n, unsigned flags)
{
    if (!need_ctx("cuMemHostAlloc", -1))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!(flags & CU_MEMHOSTALLOC_PORTABLE))
        violation("cuMemHostAlloc without PORTABLE");
    if (mock.fail_host_alloc)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (posix_memalign(p, 4096, n))
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (mg_pin_add(*p, n, MG_PIN_ALLOC) != 0) {
        free(*p);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&mock.lock);
    if (mock.host_allocs < 8)
        mock.alloc_dev[mock.host_allocs] = cur_dev();
    mock.host_allocs++;
    pthread_mutex_unlock(&mock.lock);
    return CUDA_SUCCESS;
}
static CUresult m_free_host(void *p)
{
    need_ctx("cuMemFreeHost", -1);
    if (mg_pin_remove(p, MG_PIN_ALLOC) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    free(p);
    count(&mock.host_frees);
    return CUDA_SUCCESS;
}
/* Like the driver: a range overlapping memory already page-locked (registered or from
 * cuMemHostAlloc, by anyone) is CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED. */
static CUresult m_register(void *p, size_t n, unsigned flags)
{
    need_ctx("cuMemHostRegister", -1);
    if (!p || !n)
        return CUDA_ERROR_INVALID_VALUE;
    if (mg_pin_add(p, n, MG_PIN_REGISTERED) != 0)
        return CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
    count(&mock.registers);
    return CUDA_SUCCESS;
}
static CUresult m_unregister(void *p)
{
    need_ctx("cuMemHostUnregister", -1);
    if (mg_pin_remove(p, MG_PIN_REGISTERED) != 0)
        return CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED;
    count(&mock.unregisters);
    return CUDA_SUCCESS;
}
static CUresult m_mem_alloc(CUdeviceptr *d, size_t n)
{
    if (!need_ctx("cuMemAlloc", -1))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (mock.fail_mem_alloc)
        return CUDA_ERROR_OUT_OF_MEMORY;
    void *p = mg_dev_alloc(cur_dev(), n);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *d = (CUdeviceptr)(uintptr_t)p;
    count(&mock.dev_allocs);
    return CUDA_SUCCESS;
}
static CUresult m_mem_free(CUdeviceptr d)
{
    size_t off, size;
    int dev;
    if (!mg_dev_find((void *)(uintptr_t)d, &off, &dev, &size) || off)
        return CUDA_ERROR_INVALID_VALUE;
    need_ctx("cuMemFree", dev);
    mg_dev_free((void *)(uintptr_t)d);
    count(&mock.dev_frees);
    return CUDA_SUCCESS;
}
/* IPC: the handle names the block (this mock has one address space: "another process" opens
 * the same block), the open checks the handle and its flags, close undoes one open. */
static const char mock_ipc_tag[8] = "MOCKIPC";
static CUresult m_ipc_get(CUipcMemHandle *h, CUdeviceptr d)
{
    size_t off, size;
    int dev;
    if (!mg_dev_find((void *)(uintptr_t)d, &off, &dev, &size) || off)
        return CUDA_ERROR_INVALID_VALUE;
    if (!need_ctx("cuIpcGetMemHandle", dev))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (mock.ipc_result != CUDA_SUCCESS)
        return mock.ipc_result;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, mock_ipc_tag, sizeof(mock_ipc_tag));
    memcpy(h->reserved + 8, &d, sizeof(d));
    count(&mock.ipc_gets);
    return CUDA_SUCCESS;
}
static CUresult m_ipc_open(CUdeviceptr *d, CUipcMemHandle h, unsigned flags)
{
    if (!need_ctx("cuIpcOpenMemHandle", -1))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!(flags & CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        violation("cuIpcOpenMemHandle without LAZY_ENABLE_PEER_ACCESS");
    CUdeviceptr p;
    memcpy(&p, h.reserved + 8, sizeof(p));
    size_t off, size;
    int dev;
    if (memcmp(h.reserved, mock_ipc_tag, sizeof(mock_ipc_tag)) != 0 ||
        !mg_dev_find((void *)(uintptr_t)p, &off, &dev, &size) || off)
        return CUDA_ERROR_INVALID_VALUE;
    *d = p;
    pthread_mutex_lock(&mock.lock);
    mock.ipc_opens++;
    mock.ipc_open_now++;
    mock.ipc_open_dev = cur_dev();
    pthread_mutex_unlock(&mock.lock);
    return CUDA_SUCCESS;
}
static CUresult m_ipc_close(CUdeviceptr d)
{
    if (!need_ctx("cuIpcCloseMemHandle", -1))
        return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&mock.lock);
    int open = mock.ipc_open_now > 0;
    if (open) {
        mock.ipc_open_now--;
        mock.ipc_closes++;
    }
    pthread_mutex_unlock(&mock.lock);
    return open ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
static CUresult m_stream_create(CUstream *s, unsigned flags)
{
    if (!need_ctx("cuStreamCreate", -1))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (!(flags & CU_STREAM_NON_BLOCKING))
        violation("stream is not NON_BLOCKING");
    *s = calloc(1, sizeof(**s));
    if (!*s || !((*s)->q = mg_stream_create())) {
        free(*s);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*s)->dev = cur_dev();
    return CUDA_SUCCESS;
}
static CUresult m_stream_destroy(CUstream s)
{
    need_ctx("cuStreamDestroy", s->dev);
    mg_stream_destroy(s->q);
    free(s);
    return CUDA_SUCCESS;
}
static CUresult m_stream_sync(CUstream s)
{
    need_ctx("cuStreamSynchronize", s->dev);
    mg_stream_sync(s->q);
    return mock.event_error;
}
/* Queues a copy of n bytes between host memory and device block `d` on s. */
static CUresult queue_copy(const char *what, void *dst, const void *src, CUdeviceptr d, size_t n,
                           CUstream s, int *counter)
{
    size_t off, size;
    int dev;
    need_ctx(what, s->dev);
    if (!mg_dev_find((void *)(uintptr_t)d, &off, &dev, &size) || dev != s->dev || off + n > size)
        return CUDA_ERROR_INVALID_VALUE;
    if (mg_copy(s->q, dst, src, n) != 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    count(counter);
    return CUDA_SUCCESS;
}
static CUresult m_h2d(CUdeviceptr dst, const void *src, size_t n, CUstream s)
{
    return queue_copy("cuMemcpyHtoDAsync", (void *)(uintptr_t)dst, src, dst, n, s, &mock.h2d);
}
static CUresult m_d2h(void *dst, CUdeviceptr src, size_t n, CUstream s)
{
    return queue_copy("cuMemcpyDtoHAsync", dst, (const void *)(uintptr_t)src, src, n, s, &mock.d2h);
}
static CUresult m_event_create(CUevent *e, unsigned flags)
{
    if (!need_ctx("cuEventCreate", -1))
        return CUDA_ERROR_INVALID_CONTEXT;
    *e = calloc(1, sizeof(**e));
    if (!*e || !((*e)->m = mg_event_create())) {
        free(*e);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    (*e)->dev = cur_dev();
    return CUDA_SUCCESS;
}
static CUresult m_event_destroy(CUevent e)
{
    need_ctx("cuEventDestroy", e->dev);
    mg_event_destroy(e->m);
    free(e);
    return CUDA_SUCCESS;
}
static CUresult m_event_record(CUevent e, CUstream s)
{
    need_ctx("cuEventRecord", s->dev);
    if (e->dev != s->dev)
        return CUDA_ERROR_INVALID_VALUE;
    return mg_event_record(e->m, s->q) == 0 ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
static CUresult m_event_query(CUevent e)
{
    if (mock.event_error)
        return mock.event_error;
    return mg_event_done(e->m) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
static CUresult m_event_sync(CUevent e)
{
    mg_event_sync(e->m);
    return mock.event_error;
}
static CUresult m_pci(char *id, int len, CUdevice d)
{
    snprintf(id, (size_t)len, "0000:%02x:00.0", 0x17 + (d - 100));
    return CUDA_SUCCESS;
}
/* As the driver documents it: MEMORY_TYPE needs no current context, and knows page-locked host
 * memory (allocated or registered, by anyone) and device memory; anything else is
 * CUDA_ERROR_INVALID_VALUE. */
static CUresult m_ptr_attr(void *data, int attr, CUdeviceptr p)
{
    if (attr != CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
        return CUDA_ERROR_INVALID_VALUE;
    size_t off, size;
    int dev;
    if (mg_pin_kind((const void *)(uintptr_t)p))
        *(unsigned *)data = CU_MEMORYTYPE_HOST;
    else if (mg_dev_find((const void *)(uintptr_t)p, &off, &dev, &size) && off < size)
        *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}
static CUresult m_err_string(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "out of memory"; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        *s = "part or all of the requested memory range is already mapped";
        break;
    case 700: *s = "an illegal memory access was encountered"; break;
    case 999: *s = "unknown error (mock)"; break;
    default: *s = "mock error"; break;
    }
    return CUDA_SUCCESS;
}
static CUresult m_err_name(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: *s = "CUDA_ERROR_OUT_OF_MEMORY"; break;
    case CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED:
        *s = "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED";
        break;
    case 700: *s = "CUDA_ERROR_ILLEGAL_ADDRESS"; break;
    case 999: *s = "CUDA_ERROR_UNKNOWN"; break;
    default: *s = "CUDA_ERROR_MOCK"; break;
    }
    return CUDA_SUCCESS;
}

static struct stoke__cuda_driver mock_table(void)
{
    struct stoke__cuda_driver d = {
        .cuInit = m_init,
        .cuDriverGetVersion = m_version,
        .cuDeviceGetCount = m_count,
        .cuDeviceGet = m_get,
        .cuDeviceGetName = m_name,
        .cuDeviceTotalMem = m_totalmem,
        .cuDeviceGetAttribute = m_attr,
        .cuDevicePrimaryCtxRetain = m_retain,
        .cuDevicePrimaryCtxRelease = m_release,
        .cuCtxPushCurrent = m_push,
        .cuCtxPopCurrent = m_pop,
        .cuMemHostAlloc = m_host_alloc,
        .cuMemFreeHost = m_free_host,
        .cuMemHostRegister = m_register,
        .cuMemHostUnregister = m_unregister,
        .cuMemAlloc = m_mem_alloc,
        .cuMemFree = m_mem_free,
        .cuStreamCreate = m_stream_create,
        .cuStreamDestroy = m_stream_destroy,
        .cuStreamSynchronize = m_stream_sync,
        .cuMemcpyHtoDAsync = m_h2d,
        .cuMemcpyDtoHAsync = m_d2h,
        .cuEventCreate = m_event_create,
        .cuEventDestroy = m_event_destroy,
        .cuEventRecord = m_event_record,
        .cuEventQuery = m_event_query,
        .cuEventSynchronize = m_event_sync,
        .cuDeviceGetPCIBusId = m_pci,
        .cuPointerGetAttribute = m_ptr_attr,
        .cuGetErrorString = m_err_string,
        .cuGetErrorName = m_err_name,
        .cuIpcGetMemHandle = m_ipc_get,
        .cuIpcOpenMemHandle = m_ipc_open,
        .cuIpcCloseMemHandle = m_ipc_close,
    };
    return d;
}

/* Resets the mock to `ndev` healthy devices and installs `table` (NULL: the default table). */
static void install(int ndev, const struct stoke__cuda_driver *table)
{
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL); /* shuts the backend down: releases its contexts */
    pthread_mutex_lock(&mock.lock);
    mock.init_result = CUDA_SUCCESS;
    mock.version = 12040;
    mock.ndev = ndev;
    memset(mock.retained, 0, sizeof(mock.retained));
    memset(mock.retain_calls, 0, sizeof(mock.retain_calls));
    mock.violations = 0;
    mock.violation[0] = '\0';
    mock.fail_mem_alloc = mock.fail_host_alloc = 0;
    mock.event_error = CUDA_SUCCESS;
    mock.host_allocs = mock.host_frees = mock.registers = mock.unregisters = 0;
    mock.dev_allocs = mock.dev_frees = mock.h2d = mock.d2h = 0;
    mock.ipc_gets = mock.ipc_opens = mock.ipc_closes = mock.ipc_open_now = 0;
    mock.ipc_open_dev = -1;
    mock.ipc_result = CUDA_SUCCESS;
    pthread_mutex_unlock(&mock.lock);
    mg_reset();
    struct stoke__cuda_driver d = mock_table();
    stoke__cuda_set_driver_for_test(table ? table : &d);
}

/* install(ndev, NULL), then cuda as the explicitly chosen accelerator (mc_use). */
static void use_cuda(int ndev)
{
    install(ndev, NULL);
    mc_use("cuda");
}

/* The cuda backend's table (after use_cuda or mc_select("cuda", ...)). */
static const stoke_backend *cuda_table(void)
{
    const stoke_backend *vt = NULL;
    assert_int_equal(stoke__backend_lookup("cuda", &vt), STOKE_OK);
    return vt;
}

static void assert_no_violation(void)
{
    if (mock.violations)
        fail_msg("%d driver call(s) with the wrong context; first: %s", mock.violations,
                 mock.violation);
    assert_int_equal(ctx_depth, 0); /* every push was popped */
}

static int teardown(void **state)
{
    mg_hold(0);
    mg_set_delay_us(0);
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL);
    tu_env("STOKE_CUDA_LIBRARY", NULL);
    stoke__cuda_set_driver_for_test(NULL);
    return 0;
}

/* ---- unavailability reasons --------------------------------------------------------------- */

static void test_missing_library(void **state)
{
    stoke__cuda_set_driver_for_test(NULL);
    tu_env("STOKE_CUDA_LIBRARY", "/nonexistent/dir/libcuda.so.1");
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "/nonexistent/dir/libcuda.so.1 not found"));
}

/* The default name on a machine without a driver.  Run alone, as the CTest test
 * test_cuda_mock_default_library (tests/test_cuda_mock.cmake), which reports SKIP where a
 * driver is installed: this outcome cannot be forced there. */
static void test_missing_default_library(void **state)
{
    stoke__cuda_set_driver_for_test(NULL);
    tu_env("STOKE_CUDA_LIBRARY", NULL);
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "libcuda.so.1 not found (no NVIDIA driver installed?)"));
}

static void test_stub_library_path_refused_unloaded(void **state)
{
    stoke__cuda_set_driver_for_test(NULL);
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    tu_env("STOKE_CUDA_LIBRARY", stub);
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "stub library"));
    /* It was refused by path, never loaded. */
    assert_null(dlopen(stub, RTLD_LAZY | RTLD_NOLOAD));
}

/* A libcuda.so.1 that is a symbolic link to a file under stubs/ (the toolkit's stub renamed by
 * a link, as an install may leave it) is refused by the path it resolves to, before any call
 * (it was called: "not a CUDA driver", or cuInit's CUDA_ERROR_STUB_LIBRARY on the real stub).
 * The "stub" here is a copy of a test plugin: any shared object is refused by where it is. */
static void test_stub_library_behind_a_link_refused(void **state)
{
    stoke__cuda_set_driver_for_test(NULL);
    char dir[512], stubs[600], lib[600], stub[700], link[700], cmd[4096], pb[1024];
    snprintf(dir, sizeof(dir), "%s/cudalink-%ld", getenv("STOKE_TEST_TMP"), (long)getpid());
    snprintf(stubs, sizeof(stubs), "%s/stubs", dir);
    snprintf(lib, sizeof(lib), "%s/lib", dir);
    snprintf(stub, sizeof(stub), "%s/libcuda.so", stubs);
    snprintf(link, sizeof(link), "%s/libcuda.so.1", lib);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s' '%s' && cp '%s' '%s'", dir, stubs, lib,
             tu_test_plugin("alpha.so", pb, sizeof(pb)), stub);
    assert_int_equal(system(cmd), 0);
    assert_int_equal(symlink(stub, link), 0);
    tu_env("STOKE_CUDA_LIBRARY", link);
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    if (!strstr(reason, "stub library") || !strstr(reason, "/stubs/libcuda.so"))
        fail_msg("reason: %s", reason);
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
}

static void test_stub_library_by_cuinit(void **state)
{
    install(1, NULL);
    mock.init_result = CUDA_ERROR_STUB_LIBRARY;
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "stub library"));
    assert_non_null(strstr(reason, "CUDA_ERROR_STUB_LIBRARY"));
}

static void test_no_device(void **state)
{
    install(1, NULL);
    mock.init_result = CUDA_ERROR_NO_DEVICE;
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "no device"));
    assert_non_null(strstr(reason, "CUDA_ERROR_NO_DEVICE"));

    install(0, NULL); /* cuInit fine, zero devices */
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "no device"));
}

static void test_driver_too_old(void **state)
{
    install(1, NULL);
    mock.version = 10020;
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "driver too old"));
    assert_non_null(strstr(reason, "10.2"));
    assert_non_null(strstr(reason, "11.0"));
}

static void test_missing_required_symbol(void **state)
{
    struct stoke__cuda_driver d = mock_table();
    d.cuMemAlloc = NULL;
    install(1, &d);
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "cuMemAlloc_v2"));
    assert_non_null(strstr(reason, "driver too old"));

    /* Optional symbols may be missing. */
    d = mock_table();
    d.cuDeviceGetPCIBusId = NULL;
    d.cuPointerGetAttribute = NULL;
    d.cuGetErrorString = NULL;
    d.cuGetErrorName = NULL;
    install(1, &d);
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_OK);
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props("cuda", 0, &p), STOKE_OK);
    assert_string_equal(p.pci_bus_id, "0000:17:00.0"); /* from the attributes */
}

static void test_init_error_carries_driver_message(void **state)
{
    install(1, NULL);
    mock.init_result = 999;
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_ENODEV);
    assert_non_null(strstr(reason, "initialization error"));
    assert_non_null(strstr(reason, "CUDA_ERROR_UNKNOWN"));
    assert_non_null(strstr(reason, "unknown error (mock)"));
}

/* ---- contexts ----------------------------------------------------------------------------- */

static void test_probe_and_props_create_no_context(void **state)
{
    install(3, NULL);
    char reason[256];
    assert_int_equal(mc_select("cuda", reason, sizeof(reason)), STOKE_OK);
    assert_non_null(strstr(reason, "explicit"));
    stoke_accelerator_info ai;
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_OK);
    assert_int_equal(ai.device_count, 3);
    for (int i = 0; i < 3; i++) {
        stoke_device_props p = {.size = sizeof(p)};
        assert_int_equal(stoke_device_get_props(NULL, i, &p), STOKE_OK);
        char name[32];
        snprintf(name, sizeof(name), "Mock GPU %d", i);
        assert_string_equal(p.name, name);
        assert_int_equal(p.kind, STOKE_DEVICE_GPU);
        assert_int_equal(p.compute_major, 9);
        assert_int_equal(p.total_memory, (uint64_t)(i + 1) << 30);
        char bus[32];
        snprintf(bus, sizeof(bus), "0000:%02x:00.0", 0x17 + i);
        assert_string_equal(p.pci_bus_id, bus);
        assert_string_equal(p.driver_version, "CUDA 12.4");
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(mock.retain_calls[i], 0);
    assert_no_violation();
}

static void test_context_only_for_device_used(void **state)
{
    use_cuda(3);
    assert_int_equal(stoke_device_set(2), STOKE_OK);
    void *p = NULL;
    assert_int_equal(stoke_pinned_alloc(1 << 20, &p), STOKE_OK);
    assert_int_equal(stoke_is_pinned(p), 1);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_stream_device(s), 2);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, 1 << 20, &d), STOKE_OK);
    assert_int_equal(stoke_copy_h2d_async(d, 0, p, 1 << 20, s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_int_equal(mock.retain_calls[0], 0);
    assert_int_equal(mock.retain_calls[1], 0);
    assert_int_equal(mock.retain_calls[2], 1); /* retained once, however many calls */
    assert_int_equal(stoke__cuda_context_retained(0), 0);
    assert_int_equal(stoke__cuda_context_retained(2), 1);
    assert_int_equal(mock.alloc_dev[0], 2);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    assert_no_violation();
    /* Shutdown releases what it retained. */
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL);
    assert_int_equal(mock.retained[2], 0);
    assert_int_equal(mock.host_frees, mock.host_allocs);
}

/* ---- failures ----------------------------------------------------------------------------- */

static void test_alloc_failures_are_clear(void **state)
{
    use_cuda(1);
    const stoke_backend *vt = cuda_table();

    mock.fail_host_alloc = 1;
    void *p = (void *)1;
    assert_int_equal(vt->host_alloc(0, 4096, &p), STOKE_ENOMEM);
    assert_null(p);
    assert_non_null(strstr(stoke_last_error(), "cuMemHostAlloc"));
    assert_non_null(strstr(stoke_last_error(), "CUDA_ERROR_OUT_OF_MEMORY"));
    mock.fail_host_alloc = 0;

    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    mock.fail_mem_alloc = 1;
    tu_log_capture();
    tu_log_clear();
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, 1 << 20, &d), STOKE_ENOMEM);
    assert_null(d);
    assert_non_null(strstr(stoke_last_error(), "allocating 1048576 bytes"));
    /* The driver's name and message reach the caller's last error, and the log. */
    assert_non_null(strstr(stoke_last_error(), "cuMemAlloc(1048576 bytes) on device 0: "
                                               "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory"));
    assert_true(tu_log_count(-1, "CUDA_ERROR_OUT_OF_MEMORY (2): out of memory") >= 1);
    mock.fail_mem_alloc = 0;

    /* A failing event (e.g. an illegal address in earlier work) is an error with its message. */
    stoke_event *e = NULL;
    assert_int_equal(stoke_event_create(s, &e), STOKE_OK);
    assert_int_equal(stoke_event_record(e, s), STOKE_OK);
    mock.event_error = 700;
    assert_int_equal(stoke_event_query(e), STOKE_EBACKEND);
    assert_int_equal(stoke_event_synchronize(e), STOKE_EBACKEND);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_EBACKEND);
    mock.event_error = CUDA_SUCCESS;
    stoke_event_destroy(e);
    stoke_stream_destroy(s);

    /* Freeing something that is not ours is refused, not passed to the driver. */
    int local;
    assert_int_equal(vt->host_free(0, &local), STOKE_EINVAL);
    assert_int_equal(mock.host_frees, 0);
    assert_no_violation();
}

/* ---- a whole cycle ------------------------------------------------------------------------ */

static void test_alloc_copy_event_cycle(void **state)
{
    use_cuda(2);
    const stoke_backend *vt = cuda_table();
    assert_true(vt->caps & STOKE_CAP_ASYNC_COPY);

    size_t n = 300000;
    unsigned char *src = NULL, *back = NULL;
    assert_int_equal(stoke_pinned_alloc(n, (void **)&src), STOKE_OK);
    assert_int_equal(stoke_pinned_alloc(n, (void **)&back), STOKE_OK);
    assert_int_equal(stoke_is_pinned(src + n - 1), 1);
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 7 + 3);
    memset(back, 0, n);

    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, n + 100, &d), STOKE_OK);
    stoke_event *e = NULL;
    assert_int_equal(stoke_event_create(s, &e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK); /* never recorded */
    assert_int_equal(stoke_copy_h2d_async(d, 100, src, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, 100, n, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e, s), STOKE_OK);
    assert_int_equal(stoke_event_synchronize(e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK);
    assert_int_equal(mg_copies_run(), 2);
    assert_memory_equal(back, src, n);
    assert_int_equal(mock.h2d, 1);
    assert_int_equal(mock.d2h, 1);

    /* Registering caller memory, and memory pinned by someone else. */
    void *mem = NULL;
    assert_int_equal(posix_memalign(&mem, 4096, 65536), 0);
    assert_int_equal(vt->host_register(0, mem, 65536), STOKE_OK);
    int pinned = 0;
    assert_int_equal(vt->is_pinned((char *)mem + 100, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->host_unregister(0, mem), STOKE_OK);
    assert_int_equal(vt->is_pinned((char *)mem + 100, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(mock.registers, 1);
    assert_int_equal(mock.unregisters, 1);
    assert_int_equal(mg_pin_add(mem, 65536, MG_PIN_REGISTERED), 0); /* by someone else */
    assert_int_equal(vt->is_pinned((char *)mem + 5, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(mg_pin_remove(mem, MG_PIN_REGISTERED), 0);
    free(mem);

    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(mock.dev_frees, mock.dev_allocs);
    assert_int_equal(stoke_pinned_free(src), STOKE_OK);
    assert_int_equal(stoke_pinned_free(back), STOKE_OK);
    assert_int_equal(mock.retain_calls[1], 0);
    assert_no_violation();
}

/* Several threads on one device at once: one retained context, every call in it. */
static void *cycle_worker(void *arg)
{
    int *ok = arg;
    *ok = 0;
    if (stoke_device_set(1) != STOKE_OK)
        return NULL;
    size_t n = 65536;
    unsigned char *src = NULL, *back = malloc(n);
    stoke_stream *s = NULL;
    stoke_device_buffer *d = NULL;
    stoke_event *e = NULL;
    if (back && stoke_pinned_alloc(n, (void **)&src) == STOKE_OK &&
        stoke_stream_create(NULL, &s) == STOKE_OK &&
        stoke_device_buffer_create(s, n, &d) == STOKE_OK && stoke_event_create(s, &e) == STOKE_OK) {
        *ok = 1;
        for (int r = 0; r < 20 && *ok; r++) {
            memset(src, r, n);
            if (stoke_copy_h2d_async(d, 0, src, n, s) != STOKE_OK ||
                stoke_copy_d2h_async(back, d, 0, n, s) != STOKE_OK ||
                stoke_event_record(e, s) != STOKE_OK || stoke_event_synchronize(e) != STOKE_OK ||
                memcmp(back, src, n) != 0)
                *ok = 0;
        }
    }
    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    if (src)
        stoke_pinned_free(src);
    free(back);
    if (ctx_depth != 0)
        *ok = 0;
    return NULL;
}

static void test_threads_share_one_context(void **state)
{
    use_cuda(2);
    enum { T = 4 };
    pthread_t th[T];
    int ok[T];
    for (int i = 0; i < T; i++)
        assert_int_equal(pthread_create(&th[i], NULL, cycle_worker, &ok[i]), 0);
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_true(ok[i]);
    }
    assert_int_equal(mock.retain_calls[1], 1);
    assert_int_equal(mock.retain_calls[0], 0);
    assert_no_violation();
}

/* ---- a GPU that works asynchronously ------------------------------------------------------ */

/* Copies run later, on the mock's engine (mock_checks.h). */
static void test_synchronize_waits_for_queued_copies(void **state)
{
    use_cuda(1);
    mc_async_copies();
    assert_no_violation();
}

/* The driver refuses ranges that overlap memory already page-locked by anyone, with
 * CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (mock_checks.h). */
static void test_register_refused_with_driver_codes(void **state)
{
    use_cuda(1);
    const stoke_backend *vt = cuda_table();
    mc_register_refusals(vt, "cuMemHostRegister(65536 bytes) for device 0: "
                             "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED (712)");
    assert_int_equal(mock.registers, 1);
    assert_int_equal(mock.unregisters, 1);
    assert_no_violation();
}

/* Memory pinned by someone else is recognised through cuPointerGetAttribute, which needs no
 * context: none is retained (or created) to answer. */
static void test_is_pinned_asks_the_driver_without_a_context(void **state)
{
    use_cuda(2);
    const stoke_backend *vt = cuda_table();
    char *a = NULL, *b = NULL;
    assert_int_equal(posix_memalign((void **)&a, 4096, 4096), 0);
    assert_int_equal(posix_memalign((void **)&b, 4096, 16384), 0);
    assert_int_equal(mg_pin_add(a, 4096, MG_PIN_ALLOC), 0);      /* cuMemHostAlloc'ed */
    assert_int_equal(mg_pin_add(b, 8192, MG_PIN_REGISTERED), 0); /* cuMemHostRegister'ed */
    int pinned = -1;
    assert_int_equal(vt->is_pinned(a + 100, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(b + 8191, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(b + 8192, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->is_pinned(&pinned, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(stoke_is_pinned(a), 1);
    assert_int_equal(mock.retain_calls[0] + mock.retain_calls[1], 0);
    assert_int_equal(mg_pin_remove(a, MG_PIN_ALLOC), 0);
    assert_int_equal(mg_pin_remove(b, MG_PIN_REGISTERED), 0);
    free(a);
    free(b);
    assert_no_violation();
}

/* The loader's device path on a GPU with a slow copy engine: no staging slot or batch buffer is
 * reused before its copy ran (mock_checks.h). */
static void test_loader_device_path_on_a_slow_gpu(void **state)
{
    use_cuda(2);
    mc_device_run("cuda", 2, 1, 1500);
    mc_device_run("cuda", 3, 0, 1500);
    mc_device_run("cuda", 0, 1, 1500);
    assert_int_equal(mock.dev_frees, mock.dev_allocs);
    assert_no_violation();
}

static void expect_err(int rc, int want, const char *needle)
{
    if (rc != want || !strstr(stoke_last_error(), needle))
        fail_msg("got %s \"%s\", expected %s with \"%s\"", stoke_err_name(rc), stoke_last_error(),
                 stoke_err_name(want), needle);
}

/* IPC of a device buffer through the driver's memory handles: exported on device 1, sent over
 * a socket (no descriptor), opened in the context of device 1, shared bytes, closed once. */
static void test_ipc_device_buffer(void **state)
{
    use_cuda(2);
    assert_int_equal(stoke_ipc_supported("cuda"), 1);
    assert_int_equal(stoke_device_set(1), STOKE_OK);
    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL, *imp = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 65536, &b), STOKE_OK);
    stoke_ipc_handle h, got;
    assert_int_equal(stoke_ipc_export_device(b, &h), STOKE_OK);
    assert_string_equal(h.backend, "cuda");
    assert_int_equal(h.kind, STOKE_IPC_DEVICE);
    assert_int_equal(h.device, 1);
    assert_int_equal(h.fd, -1);
    assert_true(h.blob_len >= CU_IPC_HANDLE_SIZE);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    assert_int_equal(stoke_ipc_send(sv[0], &h), STOKE_OK);
    assert_int_equal(stoke_ipc_recv(sv[1], &got), STOKE_OK);
    close(sv[0]);
    close(sv[1]);
    assert_int_equal(got.fd, -1);
    assert_memory_equal(got.blob, h.blob, h.blob_len);
    assert_int_equal(stoke_ipc_import_device(&got, &imp), STOKE_OK);
    assert_int_equal(mock.ipc_open_dev, 1);
    assert_int_equal(stoke_ipc_close(&got), STOKE_OK);
    assert_int_equal(stoke_ipc_close(&h), STOKE_OK);

    unsigned char in[65536], out[65536];
    for (size_t i = 0; i < sizeof(in); i++)
        in[i] = (unsigned char)(i * 13 + 1);
    assert_int_equal(stoke_copy_h2d_async(imp, 0, in, sizeof(in), s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(out, b, 0, sizeof(out), s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(in, out, sizeof(in));
    stoke_device_buffer_destroy(imp); /* cuIpcCloseMemHandle, not cuMemFree */
    assert_int_equal(mock.ipc_closes, 1);
    assert_int_equal(mock.ipc_open_now, 0);
    assert_int_equal(mock.dev_frees, 0);
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
    assert_int_equal(mock.dev_frees, 1);
    assert_int_equal(mock.retain_calls[0], 0); /* device 0 never touched */
    assert_no_violation();
}

/* What cuda cannot share, and a driver without IPC or refusing it, say so. */
static void test_ipc_refusals(void **state)
{
    use_cuda(2);
    void *block = NULL;
    stoke_ipc_handle h;
    assert_int_equal(stoke_pinned_alloc(4096, &block), STOKE_OK);
    expect_err(stoke_ipc_export(block, 0, &h), STOKE_ENOTSUP,
               "pinned host blocks are cuMemHostAlloc memory");
    stoke_pinned_free(block);

    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL, *imp = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 4096, &b), STOKE_OK);
    assert_int_equal(stoke_ipc_export_device(b, &h), STOKE_OK);
    stoke_ipc_handle g = h;
    memset(g.blob, 0x77, sizeof(g.blob));
    expect_err(stoke_ipc_import_device(&g, &imp), STOKE_EINVAL, "not a CUDA IPC handle");
    g = h;
    g.blob_len = 12;
    expect_err(stoke_ipc_import_device(&g, &imp), STOKE_EINVAL, "blob has 12 bytes");
    assert_int_equal(mock.ipc_opens, 0);
    assert_int_equal(stoke_ipc_close(&h), STOKE_OK);

    mock.ipc_result = CUDA_ERROR_NOT_SUPPORTED; /* e.g. WSL, or IPC disabled */
    expect_err(stoke_ipc_export_device(b, &h), STOKE_ENOTSUP, "cuIpcGetMemHandle");
    mock.ipc_result = CUDA_SUCCESS;
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
    assert_no_violation();

    /* A driver without the IPC entry points (they are optional). */
    struct stoke__cuda_driver d = mock_table();
    d.cuIpcGetMemHandle = NULL;
    install(1, &d);
    mc_use("cuda");
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_device_buffer_create(s, 4096, &b), STOKE_OK);
    expect_err(stoke_ipc_export_device(b, &h), STOKE_ENOTSUP,
               "the driver has no cuIpcGetMemHandle");
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
}

int main(int argc, char **argv)
{
    /* `test_cuda_mock default-library`: test_missing_default_library alone (mock_checks.h) */
    if (argc > 1 && strcmp(argv[1], "default-library") == 0) {
        static const char *const names[] = {"libcuda.so.1"};
        const struct CMUnitTest test =
            cmocka_unit_test_teardown(test_missing_default_library, teardown);
        return mc_run_default_library_test(names, sizeof(names) / sizeof(names[0]), &test);
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_missing_library, teardown),
        cmocka_unit_test_teardown(test_stub_library_path_refused_unloaded, teardown),
        cmocka_unit_test_teardown(test_stub_library_behind_a_link_refused, teardown),
        cmocka_unit_test_teardown(test_stub_library_by_cuinit, teardown),
        cmocka_unit_test_teardown(test_no_device, teardown),
        cmocka_unit_test_teardown(test_driver_too_old, teardown),
        cmocka_unit_test_teardown(test_missing_required_symbol, teardown),
        cmocka_unit_test_teardown(test_init_error_carries_driver_message, teardown),
        cmocka_unit_test_teardown(test_probe_and_props_create_no_context, teardown),
        cmocka_unit_test_teardown(test_context_only_for_device_used, teardown),
        cmocka_unit_test_teardown(test_alloc_failures_are_clear, teardown),
        cmocka_unit_test_teardown(test_alloc_copy_event_cycle, teardown),
        cmocka_unit_test_teardown(test_threads_share_one_context, teardown),
        cmocka_unit_test_teardown(test_synchronize_waits_for_queued_copies, teardown),
        cmocka_unit_test_teardown(test_register_refused_with_driver_codes, teardown),
        cmocka_unit_test_teardown(test_is_pinned_asks_the_driver_without_a_context, teardown),
        cmocka_unit_test_teardown(test_loader_device_path_on_a_slow_gpu, teardown),
        cmocka_unit_test_teardown(test_ipc_device_buffer, teardown),
        cmocka_unit_test_teardown(test_ipc_refusals, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
