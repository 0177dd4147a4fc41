/* The cuda backend.  Placeholder until the real-accelerators issue lands: it is listed by the
 * registry and honestly reports that it is not implemented yet. */
#include "backends/builtin.h"
#include "common/internal.h"

static int cuda_probe(uint32_t flags, char *reason, size_t reason_len)
{
    stoke__strlcpy(reason, "cuda backend not implemented yet", reason_len);
    return STOKE_ENODEV;
}

static int cuda_device_count(int *count)
{
    *count = 0;
    return STOKE_OK;
}

static int cuda_device_props(int dev, stoke_device_props *p)
{
    return STOKE_ENODEV;
}

static int cuda_host_alloc(int dev, size_t size, void **out)
{
    return STOKE_ENODEV;
}

static int cuda_host_free(int dev, void *ptr)
{
    return STOKE_ENODEV;
}

static int cuda_is_pinned(const void *ptr, int *out)
{
    *out = 0;
    return STOKE_OK;
}

static const stoke_backend cuda_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "cuda",
    .description = "cuda (not implemented yet)",
    .probe = cuda_probe,
    .device_count = cuda_device_count,
    .device_props = cuda_device_props,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .is_pinned = cuda_is_pinned,
};

int stoke__backend_cuda_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &cuda_backend;
    return STOKE_OK;
}
