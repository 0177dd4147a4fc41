/* The opencl backend.  Placeholder until the real-accelerators issue lands: it is listed by the
 * registry and honestly reports that it is not implemented yet. */
#include "backends/builtin.h"
#include "common/internal.h"

static int opencl_probe(uint32_t flags, char *reason, size_t reason_len)
{
    stoke__strlcpy(reason, "opencl backend not implemented yet", reason_len);
    return STOKE_ENODEV;
}

static int opencl_device_count(int *count)
{
    *count = 0;
    return STOKE_OK;
}

static int opencl_device_props(int dev, stoke_device_props *p)
{
    return STOKE_ENODEV;
}

static int opencl_host_alloc(int dev, size_t size, void **out)
{
    return STOKE_ENODEV;
}

static int opencl_host_free(int dev, void *ptr)
{
    return STOKE_ENODEV;
}

static int opencl_is_pinned(const void *ptr, int *out)
{
    *out = 0;
    return STOKE_OK;
}

static const stoke_backend opencl_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "opencl",
    .description = "opencl (not implemented yet)",
    .probe = opencl_probe,
    .device_count = opencl_device_count,
    .device_props = opencl_device_props,
    .host_alloc = opencl_host_alloc,
    .host_free = opencl_host_free,
    .is_pinned = opencl_is_pinned,
};

int stoke__backend_opencl_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &opencl_backend;
    return STOKE_OK;
}
