/* The cpu fallback backend: always present, never chosen as the accelerator, pins nothing.
 * It exists so that every listing shows what stoke falls back to, and so that code paths that
 * want "a backend" always have one. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/builtin.h"
#include "common/internal.h"

static int cpu_probe(uint32_t flags, char *reason, size_t reason_len)
{
    stoke__strlcpy(reason, "fallback: ordinary pageable memory, never chosen as accelerator",
                   reason_len);
    return STOKE_OK;
}

static int cpu_device_count(int *count)
{
    *count = 1;
    return STOKE_OK;
}

static int cpu_device_props(int dev, stoke_device_props *p)
{
    if (dev != 0)
        return STOKE_ERANGE;
    stoke_device_props d = {.size = sizeof(d), .kind = STOKE_DEVICE_CPU};
    stoke__strlcpy(d.name, "host CPU", sizeof(d.name));
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0)
        d.total_memory = (uint64_t)pages * (uint64_t)psz;
    return stoke__props_out(p, &d);
}

static int cpu_host_alloc(int dev, size_t size, void **out)
{
    long psz = sysconf(_SC_PAGESIZE);
    if (posix_memalign(out, psz > 0 ? (size_t)psz : 4096, size ? size : 1))
        return STOKE_ENOMEM;
    return STOKE_OK;
}

static int cpu_host_free(int dev, void *ptr)
{
    free(ptr);
    return STOKE_OK;
}

static int cpu_is_pinned(const void *ptr, int *out)
{
    *out = 0;
    return STOKE_OK;
}

static const stoke_backend cpu_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "cpu",
    .description = "host memory fallback (pins nothing)",
    .caps = 0,
    .probe = cpu_probe,
    .device_count = cpu_device_count,
    .device_props = cpu_device_props,
    .host_alloc = cpu_host_alloc,
    .host_free = cpu_host_free,
    .is_pinned = cpu_is_pinned,
};

int stoke__backend_cpu_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &cpu_backend;
    return STOKE_OK;
}
