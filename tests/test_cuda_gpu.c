/* The cuda backend on a real NVIDIA GPU (tests/gpu/run.sh runs it; elsewhere it skips: CI has no
 * GPU).  Checks what a mock cannot: the real driver's probe creates no context, pinned memory is
 * what the driver calls host memory, copies both ways keep every byte, and only the device in
 * use gets a primary context (the driver's own cuDevicePrimaryCtxGetState says so). */
#define _GNU_SOURCE
#include "testutil.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backends/cuda_driver.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"

typedef CUresult (*ctx_state_fn)(CUdevice dev, unsigned *flags, int *active);
typedef CUresult (*dev_get_fn)(CUdevice *dev, int ordinal);
typedef CUresult (*ptr_attr_fn)(void *data, int attribute, CUdeviceptr ptr);

static struct {
    ctx_state_fn state;
    dev_get_fn get;
    ptr_attr_fn attr;
    int ndev;
} drv;

/* Selects cuda; skips when this machine has no usable CUDA GPU. */
static void use_cuda(void)
{
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", "cuda");
    stoke_accelerator_info ai;
    if (stoke_accelerator_get(&ai) != STOKE_OK) {
        print_message("[  SKIP    ] no usable CUDA GPU: %s\n", ai.reason);
        skip();
    }
    drv.ndev = ai.device_count;
    const char *lib = getenv("STOKE_CUDA_LIBRARY");
    void *h = dlopen(lib && *lib ? lib : "libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    assert_non_null(h); /* the backend has it loaded */
    *(void **)&drv.state = dlsym(h, "cuDevicePrimaryCtxGetState");
    *(void **)&drv.get = dlsym(h, "cuDeviceGet");
    *(void **)&drv.attr = dlsym(h, "cuPointerGetAttribute");
    assert_non_null(drv.state);
    assert_non_null(drv.get);
    dlclose(h); /* drops our reference only */
}

static int ctx_active(int ordinal)
{
    CUdevice d;
    unsigned flags = 0;
    int active = -1;
    assert_int_equal(drv.get(&d, ordinal), CUDA_SUCCESS);
    assert_int_equal(drv.state(d, &flags, &active), CUDA_SUCCESS);
    return active;
}

static void test_probe_and_props_create_no_context(void **state)
{
    use_cuda();
    for (int i = 0; i < drv.ndev; i++) {
        stoke_device_props p = {.size = sizeof(p)};
        assert_int_equal(stoke_device_get_props("cuda", i, &p), STOKE_OK);
        print_message("cuda %d: %s, %.1f GiB, cc %d.%d, pci %s, %s\n", i, p.name,
                      (double)p.total_memory / (1u << 30), p.compute_major, p.compute_minor,
                      p.pci_bus_id, p.driver_version);
        assert_true(p.name[0]);
        assert_true(p.total_memory > 0);
        assert_true(p.compute_major >= 3);
    }
    for (int i = 0; i < drv.ndev; i++)
        assert_int_equal(ctx_active(i), 0);
}

static void test_copies_on_the_last_device(void **state)
{
    use_cuda();
    int dev = drv.ndev - 1; /* not device 0 when there are several */
    assert_int_equal(stoke_device_set(dev), STOKE_OK);
    size_t n = 64u << 20;
    unsigned char *src = NULL, *back = malloc(n);
    assert_non_null(back);
    assert_int_equal(stoke_pinned_alloc(n, (void **)&src), STOKE_OK);
    assert_int_equal(stoke_is_pinned(src + n / 2), 1);
    if (drv.attr) {
        unsigned type = 0;
        /* Unified addressing: the driver knows the pointer without a current context. */
        CUresult r = drv.attr(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                              (CUdeviceptr)(uintptr_t)src);
        if (r == CUDA_SUCCESS)
            assert_int_equal(type, CU_MEMORYTYPE_HOST);
    }
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131 + (i >> 13));
    memset(back, 0, n);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_int_equal(stoke_stream_device(s), dev);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, n, &d), STOKE_OK);
    stoke_event *e = NULL;
    assert_int_equal(stoke_event_create(s, &e), STOKE_OK);
    assert_int_equal(stoke_copy_h2d_async(d, 0, src, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, 0, n, s), STOKE_OK);
    assert_int_equal(stoke_event_record(e, s), STOKE_OK);
    int q = stoke_event_query(e);
    assert_true(q == STOKE_OK || q == STOKE_EBUSY);
    assert_int_equal(stoke_event_synchronize(e), STOKE_OK);
    assert_int_equal(stoke_event_query(e), STOKE_OK);
    assert_memory_equal(back, src, n);

    /* Registered (pageable) memory too. */
    unsigned char *reg = NULL;
    assert_int_equal(posix_memalign((void **)&reg, 4096, 1u << 20), 0);
    memset(reg, 0x5a, 1u << 20);
    assert_int_equal(stoke_pin_register(reg, 1u << 20), STOKE_OK);
    assert_int_equal(stoke_is_pinned(reg + 100), 1);
    assert_int_equal(stoke_copy_h2d_async(d, 0, reg, 1u << 20, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, 0, 1u << 20, s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(back, reg, 1u << 20);
    assert_int_equal(stoke_pin_unregister(reg), STOKE_OK);
    free(reg);

    assert_int_equal(ctx_active(dev), 1);
    if (dev != 0)
        assert_int_equal(ctx_active(0), 0);

    stoke_event_destroy(e);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(stoke_pinned_free(src), STOKE_OK);
    free(back);
}

static void test_device_alloc_failure_is_clear(void **state)
{
    use_cuda();
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    tu_log_capture();
    tu_log_clear();
    assert_int_equal(stoke_device_buffer_create(s, (size_t)1 << 52, &d), STOKE_ENOMEM);
    assert_non_null(strstr(stoke_last_error(), "allocating"));
    /* The driver's own words are logged (debug) on the way. */
    assert_true(tu_log_count(-1, "CUDA_ERROR_OUT_OF_MEMORY") >= 1);
    stoke_stream_destroy(s);
}

static int teardown(void **state)
{
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL);
    return 0;
}

/* CTest's SKIP_RETURN_CODE (tests/CMakeLists.txt): the whole file is reported as skipped,
 * not passed, on a machine without a usable CUDA GPU. */
#define SKIP_RETURN_CODE 77

int main(void)
{
    tu_env("STOKE_ACCELERATOR", "cuda");
    stoke_accelerator_info ai;
    int have_gpu = stoke_accelerator_get(&ai) == STOKE_OK;
    tu_env("STOKE_ACCELERATOR", NULL);
    if (!have_gpu) {
        printf("[  SKIPPED ] test_cuda_gpu: no usable CUDA GPU: %s\n", ai.reason);
        return SKIP_RETURN_CODE;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_probe_and_props_create_no_context, teardown),
        cmocka_unit_test_teardown(test_copies_on_the_last_device, teardown),
        cmocka_unit_test_teardown(test_device_alloc_failure_is_clear, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
