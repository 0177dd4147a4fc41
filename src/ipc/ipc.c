/* Sharing pinned host blocks and device buffers with other processes (stoke/ipc.h): checks
 * the caller's handles and memory, routes to the backend's ABI v2 IPC group, and keeps the
 * table of host imports that stoke_ipc_unmap undoes.  The socket transport is in socket.c.
 *
 * Locking: `imports.lock` guards the import table (a leaf lock; backends are called without
 * it).  Handles belong to their caller and are not locked. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "ipc/ipc_internal.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/ipc.h"

typedef struct ipc_import {
    void *ptr;
    const stoke_backend *vt; /* NULL: a range of an arena (arena_ipc.c) */
    int dev;
    size_t len; /* arena ranges: bytes mapped */
} ipc_import;

static struct {
    pthread_mutex_t lock; /* guards everything below */
    ipc_import *v;
    size_t n, cap;
    int hooked; /* the registry-reset hook is installed */
} imports = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* Registry reset (tests): the backends about to shut down drop their mappings themselves;
 * arena ranges are ours to unmap (their pin registrations go with the reset). */
static void forget_imports(void)
{
    pthread_mutex_lock(&imports.lock);
    for (size_t i = 0; i < imports.n; i++)
        if (!imports.v[i].vt)
            stoke__arena_ipc_unmap(imports.v[i].ptr, imports.v[i].len);
    free(imports.v);
    imports.v = NULL;
    imports.n = imports.cap = 0;
    pthread_mutex_unlock(&imports.lock);
}

static int imports_add(void *ptr, const stoke_backend *vt, int dev, size_t len)
{
    pthread_mutex_lock(&imports.lock);
    if (!imports.hooked) {
        stoke__registry_on_reset(forget_imports);
        imports.hooked = 1;
    }
    int rc = STOKE_OK;
    if (imports.n == imports.cap) {
        size_t cap = imports.cap ? 2 * imports.cap : 16;
        ipc_import *grown = realloc(imports.v, cap * sizeof(*grown));
        if (!grown)
            rc = STOKE_ENOMEM;
        else
            imports.v = grown, imports.cap = cap;
    }
    if (rc == STOKE_OK)
        imports.v[imports.n++] = (ipc_import){.ptr = ptr, .vt = vt, .dev = dev, .len = len};
    pthread_mutex_unlock(&imports.lock);
    return rc;
}

/* Removes the import of `ptr` into *out; 1 if found. */
static int imports_take(void *ptr, ipc_import *out)
{
    int found = 0;
    pthread_mutex_lock(&imports.lock);
    for (size_t i = 0; i < imports.n; i++) {
        if (imports.v[i].ptr == ptr) {
            *out = imports.v[i];
            imports.v[i] = imports.v[--imports.n];
            found = 1;
            break;
        }
    }
    pthread_mutex_unlock(&imports.lock);
    return found;
}

/* Fails with `code` and a message that ends with the backend's detail when it left one (the
 * thread's last error, cleared before the call).  A detail that already starts with the
 * backend's name ("simdev: ...") is appended as is. */
static int backend_fail(int code, const char *fmt, ...) STOKE__PRINTF(2, 3);
static int backend_fail(int code, const char *fmt, ...)
{
    char detail[512], msg[512];
    stoke__strlcpy(detail, stoke_last_error(), sizeof(detail));
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (!detail[0])
        return stoke__fail(code, "%s: %s", msg, stoke_strerror(code));
    return stoke__fail(code, "%s: %s", msg, detail);
}

/* Why a backend without the IPC group has none. */
static const char *no_ipc_reason(const stoke_backend *vt)
{
    if (strcmp(vt->name, "opencl") == 0)
        return "OpenCL has no portable way to share a buffer or pinned host memory with another "
               "process";
    if (strcmp(vt->name, "cpu") == 0)
        return "the cpu fallback pins nothing";
    return vt->abi_version < 2 ? "its plugin implements backend ABI v1" : "it has no IPC functions";
}

static int no_ipc(const stoke_backend *vt, const char *what)
{
    return stoke__fail(STOKE_ENOTSUP, "%s: backend %s does not support IPC (%s)", what, vt->name,
                       no_ipc_reason(vt));
}

const char *stoke__ipc_kind_name(uint32_t kind)
{
    return kind == STOKE_IPC_HOST     ? "pinned host block"
           : kind == STOKE_IPC_DEVICE ? "device buffer"
                                      : "unknown kind";
}

int stoke__ipc_check_handle(const stoke_ipc_handle *h, const char *what)
{
    if (!h)
        return stoke__fail(STOKE_EINVAL, "%s: handle is NULL", what);
    if (h->magic == STOKE_IPC_CLOSED)
        return stoke__fail(STOKE_EINVAL,
                           "%s: the handle is closed (stoke_ipc_close was called "
                           "on it)",
                           what);
    if (h->magic != STOKE_IPC_MAGIC)
        return stoke__fail(STOKE_EINVAL, "%s: not a stoke IPC handle (magic 0x%08x)", what,
                           (unsigned)h->magic);
    if (h->version != STOKE_IPC_VERSION)
        return stoke__fail(STOKE_EINVAL, "%s: handle layout version %u, this library reads %d",
                           what, (unsigned)h->version, STOKE_IPC_VERSION);
    if (h->kind != STOKE_IPC_HOST && h->kind != STOKE_IPC_DEVICE)
        return stoke__fail(STOKE_EINVAL, "%s: handle of unknown kind %u", what, (unsigned)h->kind);
    if (h->size == 0 || h->size > SIZE_MAX)
        return stoke__fail(STOKE_EINVAL, "%s: handle of %llu bytes", what,
                           (unsigned long long)h->size);
    if (h->blob_len > STOKE_IPC_BLOB_MAX || !memchr(h->backend, '\0', sizeof(h->backend)) ||
        !h->backend[0])
        return stoke__fail(STOKE_EINVAL,
                           "%s: malformed handle (blob of %u bytes, or no "
                           "backend name)",
                           what, (unsigned)h->blob_len);
    return STOKE_OK;
}

/* Fills the host's part of a handle and asks the backend for the rest. */
static int export_mem(const stoke_backend *vt, int dev, uint32_t kind, void *mem, size_t size,
                      stoke_ipc_handle *out, const char *what)
{
    memset(out, 0, sizeof(*out));
    out->fd = -1;
    out->magic = STOKE_IPC_MAGIC;
    out->version = STOKE_IPC_VERSION;
    out->kind = kind;
    out->device = dev;
    out->size = size;
    out->pid = (int64_t)getpid();
    stoke__strlcpy(out->backend, vt->name, sizeof(out->backend));
    stoke__clear_error();
    int rc = stoke__backend_rc(vt->ipc_export_mem(dev, out, mem));
    if (rc == STOKE_OK && (out->blob_len > STOKE_IPC_BLOB_MAX || out->magic != STOKE_IPC_MAGIC))
        rc = stoke__fail(STOKE_EBACKEND, "%s: backend %s returned a malformed handle", what,
                         vt->name);
    if (rc != STOKE_OK) {
        if (out->fd >= 0)
            close(out->fd);
        int fd = -1;
        memset(out, 0, sizeof(*out));
        out->fd = fd;
        return backend_fail(rc, "%s: %s could not export the %zu-byte %s %p of device %d", what,
                            vt->name, size, stoke__ipc_kind_name(kind), mem, dev);
    }
    return STOKE_OK;
}

static void wipe(stoke_ipc_handle *out)
{
    if (out) {
        memset(out, 0, sizeof(*out));
        out->fd = -1;
    }
}

int stoke_ipc_export(void *ptr, size_t size, stoke_ipc_handle *out)
{
    const char *what = "stoke_ipc_export";
    wipe(out);
    if (!ptr || !out)
        return stoke__fail(STOKE_EINVAL, "%s: %s is NULL", what, ptr ? "out" : "ptr");
    pn_block *b = stoke__pn_map_get(ptr);
    stoke_arena *arena;
    if ((!b || atomic_load_explicit(&b->addr, memory_order_acquire) != (uintptr_t)ptr) &&
        (arena = stoke__arena_find(ptr)) != NULL)
        return stoke__arena_ipc_export(arena, ptr, size, out);
    if (!b || atomic_load_explicit(&b->addr, memory_order_acquire) != (uintptr_t)ptr ||
        atomic_load_explicit(&b->state, memory_order_acquire) != PN_LIVE)
        return stoke__fail(STOKE_EINVAL,
                           "%s: %p is not a stoke pinned block (the start of a "
                           "live block from stoke_pinned_alloc)",
                           what, ptr);
    if (b->kind != PN_PINNED || !b->pool || !b->pool->vt)
        return stoke__fail(STOKE_EINVAL, "%s: the block %p is ordinary memory, not pinned (%s)",
                           what, ptr,
                           b->kind == PN_FALLBACK ? "pageable fallback past the "
                                                    "pinned cap"
                                                  : "allocated while no accelerator was chosen");
    if (size == 0)
        size = b->size;
    if (size > b->size)
        return stoke__fail(STOKE_EINVAL, "%s: %zu bytes asked, but the block %p holds %zu", what,
                           size, ptr, b->size);
    const stoke_backend *vt = b->pool->vt;
    if (!stoke__vt_has_ipc(vt))
        return no_ipc(vt, what);
    return export_mem(vt, b->pool->dev, STOKE_IPC_HOST, ptr, size, out, what);
}

int stoke_ipc_export_device(stoke_device_buffer *buf, stoke_ipc_handle *out)
{
    const char *what = "stoke_ipc_export_device";
    wipe(out);
    if (!buf || !out)
        return stoke__fail(STOKE_EINVAL, "%s: %s is NULL", what, buf ? "out" : "buffer");
    const stoke_backend *vt;
    int dev;
    stoke__device_buffer_parts(buf, &vt, &dev);
    if (!stoke__vt_has_ipc(vt))
        return no_ipc(vt, what);
    return export_mem(vt, dev, STOKE_IPC_DEVICE, stoke_device_buffer_handle(buf),
                      stoke_device_buffer_size(buf), out, what);
}

/* The accelerator an import goes to: checks the handle against it. */
static int import_target(const stoke_ipc_handle *h, uint32_t kind, const char *what,
                         const stoke_backend **vt, int *dev)
{
    int rc = stoke__ipc_check_handle(h, what);
    if (rc != STOKE_OK)
        return rc;
    if (h->kind != kind)
        return stoke__fail(
            STOKE_EINVAL, "%s: the handle is of a %s; use %s", what, stoke__ipc_kind_name(h->kind),
            h->kind == STOKE_IPC_HOST ? "stoke_ipc_import" : "stoke_ipc_import_device");
    const char *why = NULL;
    rc = stoke__accel_current(vt, dev, &why);
    if (rc == STOKE_ENODEV)
        return stoke__fail(rc, "%s: no accelerator to import into: %s", what, why);
    if (rc != STOKE_OK)
        return rc;
    if (strcmp((*vt)->name, h->backend) != 0)
        return stoke__fail(STOKE_EINVAL,
                           "%s: the handle comes from backend %s (process %lld), "
                           "but the chosen accelerator is %s",
                           what, h->backend, (long long)h->pid, (*vt)->name);
    if (!stoke__vt_has_ipc(*vt))
        return no_ipc(*vt, what);
    return STOKE_OK;
}

int stoke_ipc_import(const stoke_ipc_handle *h, void **out)
{
    const char *what = "stoke_ipc_import";
    if (!out)
        return stoke__fail(STOKE_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    const stoke_backend *vt;
    int dev;
    void *p = NULL;
    if (stoke__ipc_check_handle(h, what) == STOKE_OK && h->kind == STOKE_IPC_HOST &&
        strcmp(h->backend, STOKE__ARENA_BACKEND) == 0) {
        size_t len = 0;
        int rc = stoke__arena_ipc_import(h, &p, &len);
        if (rc == STOKE_OK && (rc = imports_add(p, NULL, -1, len)) != STOKE_OK) {
            stoke__arena_ipc_unmap(p, len);
            return stoke__fail(rc, "%s: out of memory", what);
        }
        if (rc == STOKE_OK)
            *out = p;
        return rc;
    }
    int rc = import_target(h, STOKE_IPC_HOST, what, &vt, &dev);
    if (rc != STOKE_OK)
        return rc;
    stoke__clear_error();
    rc = stoke__backend_rc(vt->ipc_import_mem(dev, h, &p));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: %s could not import the %llu-byte %s of process %lld", what,
                            vt->name, (unsigned long long)h->size, stoke__ipc_kind_name(h->kind),
                            (long long)h->pid);
    rc = imports_add(p, vt, dev, 0);
    if (rc != STOKE_OK) {
        vt->ipc_close_mem(dev, STOKE_IPC_HOST, p);
        return stoke__fail(rc, "%s: out of memory", what);
    }
    *out = p;
    return STOKE_OK;
}

int stoke_ipc_import_device(const stoke_ipc_handle *h, stoke_device_buffer **out)
{
    const char *what = "stoke_ipc_import_device";
    if (!out)
        return stoke__fail(STOKE_EINVAL, "%s: out is NULL", what);
    *out = NULL;
    const stoke_backend *vt;
    int dev;
    int rc = import_target(h, STOKE_IPC_DEVICE, what, &vt, &dev);
    if (rc != STOKE_OK)
        return rc;
    void *handle = NULL;
    stoke__clear_error();
    rc = stoke__backend_rc(vt->ipc_import_mem(dev, h, &handle));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: %s could not import the %llu-byte %s of process %lld", what,
                            vt->name, (unsigned long long)h->size, stoke__ipc_kind_name(h->kind),
                            (long long)h->pid);
    rc = stoke__device_buffer_wrap_import(vt, dev, handle, (size_t)h->size, out);
    if (rc != STOKE_OK) {
        vt->ipc_close_mem(dev, STOKE_IPC_DEVICE, handle);
        return stoke__fail(rc, "%s: out of memory", what);
    }
    return STOKE_OK;
}

int stoke_ipc_unmap(void *ptr)
{
    ipc_import im;
    if (!ptr || !imports_take(ptr, &im))
        return stoke__fail(STOKE_EINVAL,
                           "stoke_ipc_unmap: %p is not a live import of this "
                           "process (from stoke_ipc_import)",
                           ptr);
    if (!im.vt) {
        stoke__arena_ipc_unmap(ptr, im.len);
        return STOKE_OK;
    }
    stoke__clear_error();
    int rc = im.vt->ipc_close_mem(im.dev, STOKE_IPC_HOST, ptr);
    if (rc != STOKE_OK)
        return backend_fail(rc, "stoke_ipc_unmap: %s could not unmap %p", im.vt->name, ptr);
    return STOKE_OK;
}

int stoke_ipc_close(stoke_ipc_handle *h)
{
    int rc = stoke__ipc_check_handle(h, "stoke_ipc_close");
    if (rc != STOKE_OK)
        return rc;
    if (h->fd >= 0)
        close(h->fd);
    h->fd = -1;
    h->magic = STOKE_IPC_CLOSED;
    return STOKE_OK;
}

int stoke_ipc_supported(const char *backend)
{
    const stoke_backend *vt;
    int dev, rc;
    if (backend)
        rc = stoke__backend_lookup(backend, &vt);
    else
        rc = stoke__accel_current(&vt, &dev, NULL);
    if (rc != STOKE_OK)
        return rc;
    return stoke__vt_has_ipc(vt);
}
