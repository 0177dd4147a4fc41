/* A minimal backend plugin, parameterized by macros so that each file in tests/plugins builds a
 * real shared object with one deliberate property (good, wrong ABI version, failing probe, ...).
 *
 *   FAKE_NAME          backend name (default "fake")
 *   FAKE_DEVICES       device count (default 2)
 *   FAKE_ABI           abi_version reported (default STOKE_BACKEND_ABI_VERSION)
 *   FAKE_SIZE          size reported (default sizeof(stoke_backend))
 *   FAKE_PROBE_FAILS   probe fails with reason "fake device is switched off"
 *   FAKE_NO_HOST_ALLOC leave the required host_alloc NULL
 *   FAKE_ENTRY_FAILS   the entry point returns STOKE_EBACKEND
 *   FAKE_ENTRY_RC      the entry point returns this code (a positive one is a plugin's mistake)
 *   FAKE_ALLOC_RC      host_alloc fails with this code
 *   FAKE_HALF_EVENTS   has event_create but not the rest of the event group
 *   FAKE_STREAMS_NO_SYNC has streams and copies but no stream_synchronize
 *   FAKE_HALF_IPC      has ipc_export_mem but not the rest of the (ABI v2) IPC group
 *   FAKE_V1_IPC        claims STOKE_CAP_IPC and fills the ABI v1 ipc_export/ipc_import
 *                      placeholders (the host must not take that as IPC support)
 *   FAKE_CTOR_THREAD   its constructor starts a thread that runs the plugin's code for ever
 *                      (a driver runtime does: the library must stay loaded even if rejected)
 *   FAKE_REASON_NO_NUL the probe fills its whole reason buffer with 'A', without a NUL, and
 *                      fails
 *
 * Its "pinned" memory is ordinary memory it tracks, so is_pinned can be checked. */
#include <stdlib.h>
#include <string.h>

#include "stoke/backend.h"

#ifndef FAKE_NAME
#define FAKE_NAME "fake"
#endif
#ifndef FAKE_DEVICES
#define FAKE_DEVICES 2
#endif
#ifndef FAKE_ABI
#define FAKE_ABI STOKE_BACKEND_ABI_VERSION
#endif
#ifndef FAKE_SIZE
#define FAKE_SIZE sizeof(stoke_backend)
#endif

#define FAKE_EXPORT __attribute__((visibility("default")))

static const stoke_backend_host *fake_host __attribute__((unused));

#ifdef FAKE_CTOR_THREAD
#include <pthread.h>
#include <unistd.h>

static void *fake_runtime(void *arg)
{
    for (;;)
        usleep(1000); /* returns into this library's code every millisecond */
    return arg;
}

__attribute__((constructor)) static void fake_start_runtime(void)
{
    pthread_t t;
    if (pthread_create(&t, NULL, fake_runtime, NULL) == 0)
        pthread_detach(t);
}
#endif

static int fake_probe(uint32_t flags, char *reason, size_t reason_len)
{
#ifdef FAKE_REASON_NO_NUL
    memset(reason, 'A', reason_len);
    return STOKE_ENODEV;
#endif
#ifdef FAKE_PROBE_FAILS
    strncpy(reason, "fake device is switched off", reason_len - 1);
    reason[reason_len - 1] = '\0';
    return STOKE_ENODEV;
#else
    strncpy(reason, "fake devices ready", reason_len - 1);
    reason[reason_len - 1] = '\0';
    return STOKE_OK;
#endif
}

static int fake_device_count(int *count)
{
    *count = FAKE_DEVICES;
    return STOKE_OK;
}

static int fake_device_props(int dev, stoke_device_props *p)
{
    if (dev < 0 || dev >= FAKE_DEVICES)
        return STOKE_ERANGE;
    p->kind = STOKE_DEVICE_SIMULATED;
    strcpy(p->name, FAKE_NAME " device");
    return STOKE_OK;
}

__attribute__((unused)) static int fake_host_alloc(int dev, size_t size, void **out)
{
#ifdef FAKE_ALLOC_RC
    return FAKE_ALLOC_RC;
#endif
    /* Page-aligned, as the ABI asks (the pinned allocator relies on it). */
    size_t n = size ? (size + 4095) / 4096 * 4096 : 4096;
    *out = aligned_alloc(4096, n);
    return *out ? STOKE_OK : STOKE_ENOMEM;
}

static int fake_host_free(int dev, void *ptr)
{
    free(ptr);
    return STOKE_OK;
}

static int fake_is_pinned(const void *ptr, int *out)
{
    *out = 0;
    return STOKE_OK;
}

#ifdef FAKE_HALF_EVENTS
static int fake_event_create(int dev, stoke_backend_event **out)
{
    *out = NULL;
    return STOKE_ENOTSUP;
}
#endif

#ifdef FAKE_STREAMS_NO_SYNC
static int fake_stream_create(int dev, stoke_backend_stream **out)
{
    *out = NULL;
    return STOKE_ENOTSUP;
}

static int fake_stream_destroy(stoke_backend_stream *s)
{
    return STOKE_OK;
}

static int fake_copy_h2d_async(void *dst, size_t dst_offset, const void *src, size_t n,
                               stoke_backend_stream *s)
{
    return STOKE_ENOTSUP;
}
#endif

#ifdef FAKE_HALF_IPC
static int fake_ipc_export_mem(int dev, stoke_ipc_handle *h, void *ptr)
{
    return STOKE_ENOTSUP;
}
#endif

#ifdef FAKE_V1_IPC
static int fake_v1_ipc_export(int dev, void *ptr, unsigned char handle[64], size_t *handle_len)
{
    return STOKE_ENOTSUP;
}

static int fake_v1_ipc_import(int dev, const unsigned char *handle, size_t handle_len, void **out)
{
    return STOKE_ENOTSUP;
}
#endif

static const stoke_backend fake_backend = {
    .abi_version = FAKE_ABI,
    .size = FAKE_SIZE,
    .name = FAKE_NAME,
    .description = "test plugin",
    .probe = fake_probe,
    .device_count = fake_device_count,
    .device_props = fake_device_props,
#ifndef FAKE_NO_HOST_ALLOC
    .host_alloc = fake_host_alloc,
#endif
    .host_free = fake_host_free,
    .is_pinned = fake_is_pinned,
#ifdef FAKE_HALF_EVENTS
    .event_create = fake_event_create,
#endif
#ifdef FAKE_HALF_IPC
    .ipc_export_mem = fake_ipc_export_mem,
#endif
#ifdef FAKE_V1_IPC
    .caps = STOKE_CAP_IPC,
    .ipc_export = fake_v1_ipc_export,
    .ipc_import = fake_v1_ipc_import,
#endif
#ifdef FAKE_STREAMS_NO_SYNC
    .stream_create = fake_stream_create,
    .stream_destroy = fake_stream_destroy,
    .copy_h2d_async = fake_copy_h2d_async,
#endif
};

#ifndef FAKE_NO_ENTRY
FAKE_EXPORT int stoke_backend_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    fake_host = host;
#if defined(FAKE_ENTRY_FAILS)
    return STOKE_EBACKEND;
#elif defined(FAKE_ENTRY_RC)
    return FAKE_ENTRY_RC;
#else
    *out = &fake_backend;
    return STOKE_OK;
#endif
}
#else
/* Exports something, just not the entry point. */
FAKE_EXPORT int stoke_backend_entry_misspelled(const stoke_backend_host *host,
                                               const stoke_backend **out)
{
    (void)fake_host_alloc;
    *out = &fake_backend;
    return STOKE_OK;
}
#endif
