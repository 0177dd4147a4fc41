/* The hip backend (AMD ROCm).  Listed so that the selection order cuda, hip, opencl is visible,
 * but not implemented: it reports whether the runtime library is present and that stoke cannot
 * use it yet.  The library is never dlopen'ed for real use, only checked for existence. */
#include <dlfcn.h>

#include "backends/builtin.h"
#include "common/internal.h"

static int hip_probe(uint32_t flags, char *reason, size_t reason_len)
{
    void *h = dlopen("libamdhip64.so", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libamdhip64.so", RTLD_LAZY | RTLD_LOCAL);
    if (!h) {
        stoke__strlcpy(reason, "libamdhip64.so not found", reason_len);
        return STOKE_ENODEV;
    }
    dlclose(h);
    stoke__strlcpy(reason, "libamdhip64.so found, but the hip backend is not implemented yet",
                   reason_len);
    return STOKE_ENODEV;
}

static int hip_device_count(int *count)
{
    *count = 0;
    return STOKE_OK;
}

static int hip_device_props(int dev, stoke_device_props *p) { return STOKE_ENODEV; }
static int hip_host_alloc(int dev, size_t size, void **out) { return STOKE_ENODEV; }
static int hip_host_free(int dev, void *ptr) { return STOKE_ENODEV; }

static int hip_is_pinned(const void *ptr, int *out)
{
    *out = 0;
    return STOKE_OK;
}

static const stoke_backend hip_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "hip",
    .description = "AMD HIP (not implemented)",
    .probe = hip_probe,
    .device_count = hip_device_count,
    .device_props = hip_device_props,
    .host_alloc = hip_host_alloc,
    .host_free = hip_host_free,
    .is_pinned = hip_is_pinned,
};

int stoke__backend_hip_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &hip_backend;
    return STOKE_OK;
}
