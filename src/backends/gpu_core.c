/* The backend ABI over a driver-shaped table, shared by the cuda and hip backends (see
 * gpu_core.h). */
#define _GNU_SOURCE
#include "backends/gpu_core.h"

#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

enum { PIN_ALLOC = 0, PIN_REGISTERED = 1 };

struct stoke_backend_stream {
    stoke__gpu *core;
    CUstream s;
    int dev;
};

struct stoke_backend_event {
    stoke__gpu *core;
    CUevent e;
    int dev;
};

/* ---- loading, errors ---------------------------------------------------------------------- */

void stoke__gpu_resolve(void *dl, void *table, const stoke__gpu_sym *syms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *fn = dlsym(dl, syms[i].symbol);
        memcpy((char *)table + syms[i].offset, &fn, sizeof(fn));
    }
}

const char *stoke__gpu_missing(const void *table, const stoke__gpu_sym *syms, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        void *fn;
        memcpy(&fn, (const char *)table + syms[i].offset, sizeof(fn));
        if (!fn && syms[i].required)
            return syms[i].symbol;
    }
    return NULL;
}

static int vfail(const stoke__gpu *c, CUresult r, const char *fmt, va_list ap) STOKE__PRINTF(3, 0);
static int vfail(const stoke__gpu *c, CUresult r, const char *fmt, va_list ap)
{
    return stoke__backend_vfail(c->desc->name, r == CUDA_ERROR_OUT_OF_MEMORY, (int)r,
                                c->desc->err_name(r), c->desc->err_text(r), fmt, ap);
}

int stoke__gpu_fail(const stoke__gpu *c, CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(c, r, fmt, ap);
    va_end(ap);
    return rc;
}

/* ---- probe, devices ----------------------------------------------------------------------- */

int stoke__gpu_probe(stoke__gpu *c, uint32_t flags, char *reason, size_t reason_len)
{
    pthread_mutex_lock(&c->lock);
    int rc = STOKE_OK;
    if (!c->ready) {
        memset(&c->api, 0, sizeof(c->api));
        rc = c->desc->probe_locked(flags, reason, reason_len);
    }
    if (rc == STOKE_OK)
        c->desc->describe_locked(reason, reason_len);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

int stoke__gpu_enumerate_locked(stoke__gpu *c, int n, char *reason, size_t reason_len)
{
    const stoke__gpu_desc *d = c->desc;
    if (n <= 0) {
        stoke__fmt(reason, reason_len, "no device: the %s reports 0 %s devices", d->lib, d->api);
        return STOKE_ENODEV;
    }
    if (n > STOKE__GPU_MAX_DEVICES) {
        stoke__log(STOKE_LOG_WARN, "%s: %d devices; only the first %d are used", d->name, n,
                   STOKE__GPU_MAX_DEVICES);
        n = STOKE__GPU_MAX_DEVICES;
    }
    for (int i = 0; i < n; i++) {
        CUresult r = c->api.device_get(&c->devs[i], i);
        if (r != CUDA_SUCCESS) {
            stoke__fmt(reason, reason_len, "initialization error: %s(%d) failed with %s (%d): %s",
                       d->call.device_get, i, d->err_name(r), r, d->err_text(r));
            return STOKE_ENODEV;
        }
    }
    c->ndev = n;
    c->ready = 1;
    return STOKE_OK;
}

int stoke__gpu_device_count(stoke__gpu *c, int *count)
{
    pthread_mutex_lock(&c->lock);
    *count = c->ready ? c->ndev : 0;
    pthread_mutex_unlock(&c->lock);
    return STOKE_OK;
}

static int check_dev(const stoke__gpu *c, int dev)
{
    if (!c->ready)
        return stoke__fail(STOKE_ENODEV, "%s: the backend is not initialised", c->desc->name);
    if (dev < 0 || dev >= c->ndev)
        return stoke__fail(STOKE_ERANGE, "%s: no device %d (%d device(s))", c->desc->name, dev,
                           c->ndev);
    return STOKE_OK;
}

/* Every driver call for a device is made between enter() and leave():
 *     int prev, rc = enter(c, dev, &prev);
 *     return rc != STOKE_OK ? rc : leave(c, dev, prev, c->api.xxx(...), "%s on device %d", ...);
 * enter makes the device current (the backend's hook); leave gives the caller back theirs, then
 * turns `r`, the result of the call, into a status; `fmt` describes the call for the error
 * message (CALL below, for the common description). */
static int enter(const stoke__gpu *c, int dev, int *prev)
{
    int rc = check_dev(c, dev);
    return rc != STOKE_OK ? rc : c->desc->enter(dev, prev, 0);
}

static int leave(const stoke__gpu *c, int dev, int prev, CUresult r, const char *fmt, ...)
    STOKE__PRINTF(5, 6);
static int leave(const stoke__gpu *c, int dev, int prev, CUresult r, const char *fmt, ...)
{
    c->desc->leave(dev, prev);
    if (r == CUDA_SUCCESS)
        return STOKE_OK;
    va_list ap;
    va_start(ap, fmt);
    int rc = vfail(c, r, fmt, ap);
    va_end(ap);
    return rc;
}

/* leave() after table call `fn`(...), described as "<the API's name for fn> on device <dev>". */
#define CALL(c, dev, prev, fn, ...)                                                                \
    leave(c, dev, prev, (c)->api.fn(__VA_ARGS__), "%s on device %d", (c)->desc->call.fn, dev)

int stoke__gpu_device_props(stoke__gpu *c, int dev, stoke_device_props *p)
{
    int rc = check_dev(c, dev);
    if (rc != STOKE_OK)
        return rc;
    CUdevice d = c->devs[dev];
    stoke_device_props o = {.size = sizeof(o), .kind = STOKE_DEVICE_GPU};
    stoke__strlcpy(o.vendor, c->desc->vendor, sizeof(o.vendor));
    CUresult r = c->api.device_get_name(o.name, (int)sizeof(o.name), d);
    if (r != CUDA_SUCCESS)
        return stoke__gpu_fail(c, r, "%s(device %d)", c->desc->call.device_get_name, dev);
    o.name[sizeof(o.name) - 1] = '\0';
    size_t mem = 0;
    if (c->api.device_total_mem(&mem, d) == CUDA_SUCCESS)
        o.total_memory = mem;
    if (!c->api.device_get_pci_bus_id ||
        c->api.device_get_pci_bus_id(o.pci_bus_id, (int)sizeof(o.pci_bus_id), d) != CUDA_SUCCESS)
        o.pci_bus_id[0] = '\0';
    c->desc->props(d, &o);
    o.pci_bus_id[sizeof(o.pci_bus_id) - 1] = '\0';
    return stoke__props_out(p, &o);
}

/* ---- pinned host memory ------------------------------------------------------------------- */

int stoke__gpu_host_alloc(stoke__gpu *c, int dev, size_t size, void **out)
{
    *out = NULL;
    int prev, rc = enter(c, dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    void *p = NULL;
    CUresult r = c->api.host_alloc(&p, size ? size : 1, CU_MEMHOSTALLOC_PORTABLE);
    rc = leave(c, dev, prev, r == CUDA_SUCCESS && !p ? CUDA_ERROR_OUT_OF_MEMORY : r,
               "%s(%zu bytes) for device %d", c->desc->call.host_alloc, size, dev);
    if (rc != STOKE_OK)
        return rc;
    stoke__hostrange pin = {.base = (uintptr_t)p, .size = size, .dev = dev, .kind = PIN_ALLOC};
    rc = stoke__hostranges_add(&c->pinned, &pin);
    if (rc != STOKE_OK) {
        if (enter(c, dev, &prev) == STOKE_OK)
            leave(c, dev, prev, c->api.host_free(p), "%s", c->desc->call.host_free);
        return stoke__fail(rc, "%s: tracking pinned block %p failed", c->desc->name, p);
    }
    *out = p;
    return STOKE_OK;
}

/* Forgets the pinned range starting at `ptr` (of `kind`) and releases it with `release` on its
 * device.  If the driver cannot be entered or refuses, the memory is still pinned: the range is
 * tracked again. */
static int unpin(stoke__gpu *c, void *ptr, int kind, const char *what, CUresult (*release)(void *),
                 const char *fn)
{
    stoke__hostrange r;
    if (!stoke__hostranges_find(&c->pinned, ptr, &r) || r.base != (uintptr_t)ptr || r.kind != kind)
        return stoke__fail(STOKE_EINVAL, "%s: %s(%p): not a %s", c->desc->name, what, ptr,
                           kind == PIN_ALLOC ? "block from host_alloc" : "registered range");
    if (stoke__hostranges_remove(&c->pinned, ptr, &r) != STOKE_OK)
        return stoke__fail(STOKE_EINVAL, "%s: %s(%p): released twice", c->desc->name, what, ptr);
    int prev, rc = enter(c, r.dev, &prev);
    if (rc == STOKE_OK)
        rc = leave(c, r.dev, prev, release(ptr), "%s(%p) on device %d", fn, ptr, r.dev);
    if (rc != STOKE_OK)
        stoke__hostranges_add(&c->pinned, &r);
    return rc;
}

int stoke__gpu_host_free(stoke__gpu *c, int dev, void *ptr)
{
    if (!ptr)
        return STOKE_OK;
    return unpin(c, ptr, PIN_ALLOC, "host_free", c->api.host_free, c->desc->call.host_free);
}

int stoke__gpu_host_register(stoke__gpu *c, int dev, void *ptr, size_t size)
{
    if (!ptr || !size)
        return stoke__fail(STOKE_EINVAL, "%s: host_register of an empty range", c->desc->name);
    /* Claim the range first, so that two threads cannot register overlapping memory. */
    stoke__hostrange pin = {.base = (uintptr_t)ptr, .size = size, .dev = dev,
                            .kind = PIN_REGISTERED};
    int rc = stoke__hostranges_add(&c->pinned, &pin);
    if (rc != STOKE_OK)
        return stoke__fail(rc, "%s: [%p, +%zu) overlaps memory already pinned", c->desc->name,
                           ptr, size);
    int prev;
    rc = enter(c, dev, &prev);
    CUresult r = CUDA_SUCCESS;
    if (rc == STOKE_OK) {
        r = c->api.host_register(ptr, size, CU_MEMHOSTREGISTER_PORTABLE);
        rc = leave(c, dev, prev, r, "%s(%zu bytes) for device %d", c->desc->call.host_register,
                   size, dev);
    }
    if (rc != STOKE_OK)
        stoke__hostranges_remove(&c->pinned, ptr, NULL);
    /* Pinned by someone else in this process (wholly or in part): the caller's mistake. */
    return r == CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED ? STOKE_EINVAL : rc;
}

int stoke__gpu_host_unregister(stoke__gpu *c, int dev, void *ptr)
{
    return unpin(c, ptr, PIN_REGISTERED, "host_unregister", c->api.host_unregister,
                 c->desc->call.host_unregister);
}

/* Memory type of `ptr` according to the driver: CU_MEMORYTYPE_HOST for memory pinned by
 * anyone in this process (allocated or registered), 0 when the driver does not know it.
 * MEMORY_TYPE needs no current context; should a driver want one anyway, the question is asked
 * again in a context the backend already holds (none held: none is created just to answer). */
static unsigned driver_memory_type(const stoke__gpu *c, const void *ptr)
{
    unsigned type = 0;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)ptr;
    CUresult r = c->api.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
    if (r == CUDA_SUCCESS)
        return type;
    for (int i = 0, prev; r == CUDA_ERROR_INVALID_CONTEXT && i < c->ndev; i++) {
        if (c->desc->enter(i, &prev, 1) != STOKE_OK)
            continue;
        r = c->api.pointer_get_attribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p);
        c->desc->leave(i, prev);
        return r == CUDA_SUCCESS ? type : 0;
    }
    return 0;
}

int stoke__gpu_is_pinned(stoke__gpu *c, const void *ptr, int *out)
{
    *out = 0;
    if (!ptr)
        return STOKE_OK;
    if (stoke__hostranges_find(&c->pinned, ptr, NULL))
        *out = 1;
    else if (c->ready && c->api.pointer_get_attribute) /* pinned by someone else? */
        *out = driver_memory_type(c, ptr) == CU_MEMORYTYPE_HOST;
    return STOKE_OK;
}

/* ---- device memory, streams, copies, events ----------------------------------------------- */

int stoke__gpu_device_alloc(stoke__gpu *c, int dev, size_t size, void **out)
{
    *out = NULL;
    int prev, rc = enter(c, dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    CUdeviceptr d = 0;
    CUresult r = c->api.mem_alloc(&d, size ? size : 1);
    rc = leave(c, dev, prev, r == CUDA_SUCCESS && !d ? CUDA_ERROR_OUT_OF_MEMORY : r,
               "%s(%zu bytes) on device %d", c->desc->call.mem_alloc, size, dev);
    if (rc == STOKE_OK)
        *out = (void *)(uintptr_t)d;
    return rc;
}

int stoke__gpu_device_free(stoke__gpu *c, int dev, void *handle)
{
    if (!handle)
        return STOKE_OK;
    int prev, rc = enter(c, dev, &prev);
    return rc != STOKE_OK ? rc : CALL(c, dev, prev, mem_free, (CUdeviceptr)(uintptr_t)handle);
}

int stoke__gpu_stream_create(stoke__gpu *c, int dev, stoke_backend_stream **out)
{
    *out = NULL;
    stoke_backend_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return stoke__fail(STOKE_ENOMEM, "%s: out of memory for a stream", c->desc->name);
    *s = (stoke_backend_stream){.core = c, .dev = dev};
    int prev, rc = enter(c, dev, &prev);
    if (rc == STOKE_OK)
        rc = CALL(c, dev, prev, stream_create, &s->s, CU_STREAM_NON_BLOCKING);
    if (rc != STOKE_OK) {
        free(s);
        return rc;
    }
    *out = s;
    return STOKE_OK;
}

int stoke__gpu_stream_destroy(stoke_backend_stream *s)
{
    if (!s)
        return STOKE_OK;
    int prev, rc = enter(s->core, s->dev, &prev);
    if (rc == STOKE_OK)
        rc = CALL(s->core, s->dev, prev, stream_destroy, s->s);
    free(s);
    return rc;
}

int stoke__gpu_stream_synchronize(stoke_backend_stream *s)
{
    int prev, rc = enter(s->core, s->dev, &prev);
    return rc != STOKE_OK ? rc : CALL(s->core, s->dev, prev, stream_synchronize, s->s);
}

int stoke__gpu_copy_h2d_async(void *dst, size_t dst_offset, const void *src, size_t n,
                              stoke_backend_stream *s)
{
    const stoke__gpu *c = s->core;
    int prev, rc = enter(c, s->dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = c->api.memcpy_htod((CUdeviceptr)(uintptr_t)dst + dst_offset, src, n, s->s);
    return leave(c, s->dev, prev, r, "%s(%zu bytes, host to device) on device %d",
                 c->desc->call.memcpy_htod, n, s->dev);
}

int stoke__gpu_copy_d2h_async(void *dst, const void *src, size_t src_offset, size_t n,
                              stoke_backend_stream *s)
{
    const stoke__gpu *c = s->core;
    int prev, rc = enter(c, s->dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = c->api.memcpy_dtoh(dst, (CUdeviceptr)(uintptr_t)src + src_offset, n, s->s);
    return leave(c, s->dev, prev, r, "%s(%zu bytes, device to host) on device %d",
                 c->desc->call.memcpy_dtoh, n, s->dev);
}

int stoke__gpu_event_create(stoke__gpu *c, int dev, stoke_backend_event **out)
{
    *out = NULL;
    stoke_backend_event *e = calloc(1, sizeof(*e));
    if (!e)
        return stoke__fail(STOKE_ENOMEM, "%s: out of memory for an event", c->desc->name);
    *e = (stoke_backend_event){.core = c, .dev = dev};
    int prev, rc = enter(c, dev, &prev);
    if (rc == STOKE_OK)
        rc = CALL(c, dev, prev, event_create, &e->e, CU_EVENT_DISABLE_TIMING);
    if (rc != STOKE_OK) {
        free(e);
        return rc;
    }
    *out = e;
    return STOKE_OK;
}

int stoke__gpu_event_destroy(stoke_backend_event *e)
{
    if (!e)
        return STOKE_OK;
    int prev, rc = enter(e->core, e->dev, &prev);
    if (rc == STOKE_OK)
        rc = CALL(e->core, e->dev, prev, event_destroy, e->e);
    free(e);
    return rc;
}

int stoke__gpu_event_record(stoke_backend_event *e, stoke_backend_stream *s)
{
    int prev, rc = enter(s->core, s->dev, &prev);
    return rc != STOKE_OK ? rc : CALL(s->core, s->dev, prev, event_record, e->e, s->s);
}

/* STOKE_OK once the work recorded before the event has completed, STOKE_EBUSY until then. */
int stoke__gpu_event_query(stoke_backend_event *e)
{
    const stoke__gpu *c = e->core;
    int prev, rc = enter(c, e->dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    CUresult r = c->api.event_query(e->e);
    rc = leave(c, e->dev, prev, r == CUDA_ERROR_NOT_READY ? CUDA_SUCCESS : r, "%s on device %d",
               c->desc->call.event_query, e->dev);
    return r == CUDA_ERROR_NOT_READY ? STOKE_EBUSY : rc;
}

int stoke__gpu_event_synchronize(stoke_backend_event *e)
{
    int prev, rc = enter(e->core, e->dev, &prev);
    return rc != STOKE_OK ? rc : CALL(e->core, e->dev, prev, event_synchronize, e->e);
}

/* ---- shutdown ----------------------------------------------------------------------------- */

void stoke__gpu_reset_locked(stoke__gpu *c)
{
    stoke__hostrange *v = NULL;
    size_t n = 0;
    stoke__hostranges_take_all(&c->pinned, &v, &n);
    for (size_t i = 0; c->ready && i < n; i++) {
        int prev;
        if (c->desc->enter(v[i].dev, &prev, 1) != STOKE_OK)
            continue;
        if (v[i].kind == PIN_ALLOC)
            c->api.host_free((void *)v[i].base);
        else
            c->api.host_unregister((void *)v[i].base);
        c->desc->leave(v[i].dev, prev);
    }
    if (n)
        stoke__log(STOKE_LOG_DEBUG, "%s: shutdown released %zu pinned range(s) still held",
                   c->desc->name, n);
    free(v);
    if (c->ready && c->desc->release_locked)
        c->desc->release_locked();
    c->ready = 0;
    c->ndev = 0;
}

void stoke__gpu_shutdown(stoke__gpu *c)
{
    pthread_mutex_lock(&c->lock);
    stoke__gpu_reset_locked(c);
    pthread_mutex_unlock(&c->lock);
}

/* ---- IPC (stoke/ipc.h) -------------------------------------------------------------------- *
 * Device buffers: the driver's IPC memory handles (64 bytes in the handle's blob, no file
 * descriptor).  The importer opens the handle on the device it imports on (CUDA: in its own
 * context); the driver refuses an open in the exporting process itself.  Pinned host blocks
 * come from host_alloc (cuMemHostAlloc, hipHostMalloc), which another process cannot map: they
 * are not shareable here (that would need memfd-backed blocks registered in each process). */

typedef struct ipc_blob {
    uint32_t magic; /* the backend's ipc_magic */
    int32_t dev;    /* the exporter's device index */
    CUipcMemHandle mh;
} ipc_blob;

/* STOKE_OK when memory of `kind` can be shared: device memory, with the driver's IPC calls. */
static int ipc_check(const stoke__gpu *c, int kind, const char *what)
{
    const stoke__gpu_desc *d = c->desc;
    if (kind == STOKE_IPC_HOST)
        return stoke__fail(STOKE_ENOTSUP, "%s: %s: pinned host blocks are %s memory, which "
                           "another process cannot map; on %s only device buffers can be shared",
                           d->name, what, d->call.host_alloc, d->name);
    if (c->api.ipc_get && c->api.ipc_open && c->api.ipc_close)
        return STOKE_OK;
    return stoke__fail(STOKE_ENOTSUP, "%s: %s: the %s has no %s / %s / %s", d->name, what, d->lib,
                       d->call.ipc_get, d->call.ipc_open, d->call.ipc_close);
}

int stoke__gpu_ipc_export_mem(stoke__gpu *c, int dev, stoke_ipc_handle *h, void *ptr)
{
    int prev, rc = ipc_check(c, (int)h->kind, "export");
    if (rc == STOKE_OK)
        rc = enter(c, dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    ipc_blob blob = {.magic = c->desc->ipc_magic, .dev = dev};
    CUresult r = c->api.ipc_get(&blob.mh, (CUdeviceptr)(uintptr_t)ptr);
    rc = leave(c, dev, prev, r, "%s(%p) on device %d", c->desc->call.ipc_get, ptr, dev);
    if (r == CUDA_ERROR_NOT_SUPPORTED)
        rc = STOKE_ENOTSUP;
    if (rc != STOKE_OK)
        return rc;
    memcpy(h->blob, &blob, sizeof(blob));
    h->blob_len = sizeof(blob);
    return STOKE_OK;
}

int stoke__gpu_ipc_import_mem(stoke__gpu *c, int dev, const stoke_ipc_handle *h, void **out)
{
    *out = NULL;
    int prev, rc = ipc_check(c, (int)h->kind, "import");
    if (rc != STOKE_OK)
        return rc;
    ipc_blob blob;
    if (h->blob_len != sizeof(blob))
        return stoke__fail(STOKE_EINVAL, "%s: import: the handle's blob has %u bytes, a %s IPC "
                           "handle %zu", c->desc->name, (unsigned)h->blob_len, c->desc->api,
                           sizeof(blob));
    memcpy(&blob, h->blob, sizeof(blob));
    if (blob.magic != c->desc->ipc_magic)
        return stoke__fail(STOKE_EINVAL, "%s: import: the handle's blob is not a %s IPC handle "
                           "(magic 0x%08x)", c->desc->name, c->desc->api, (unsigned)blob.magic);
    rc = enter(c, dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    CUdeviceptr d = 0;
    CUresult r = c->api.ipc_open(&d, blob.mh, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    rc = leave(c, dev, prev, r == CUDA_SUCCESS && !d ? CUDA_ERROR_INVALID_VALUE : r,
               "%s (device %d of process %lld) on device %d", c->desc->call.ipc_open,
               (int)blob.dev, (long long)h->pid, dev);
    if (rc == STOKE_OK)
        *out = (void *)(uintptr_t)d;
    return rc;
}

int stoke__gpu_ipc_close_mem(stoke__gpu *c, int dev, int kind, void *ptr)
{
    int prev, rc = ipc_check(c, kind, "close");
    if (rc == STOKE_OK)
        rc = enter(c, dev, &prev);
    if (rc != STOKE_OK)
        return rc;
    return leave(c, dev, prev, c->api.ipc_close((CUdeviceptr)(uintptr_t)ptr),
                 "%s(%p) on device %d", c->desc->call.ipc_close, ptr, dev);
}
