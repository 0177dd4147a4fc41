/* Streams, events and device buffers: the backend ABI behind small owned objects that remember
 * which backend and device they belong to.  Objects are not locked (see device.h). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "registry/registry.h"
#include "stoke/device.h"

struct stoke_stream {
    const stoke_backend *vt;
    int dev;
    stoke_backend_stream *s;
};

struct stoke_event {
    const stoke_backend *vt;
    int dev;
    stoke_backend_event *e;
};

struct stoke_device_buffer {
    const stoke_backend *vt;
    int dev;
    void *handle;
    size_t size;
    int imported; /* from stoke_ipc_import_device: destroy undoes the import (ipc_close_mem) */
};

/* Fails with `code` and a message that ends with the backend's own detail, when the backend left
 * one (built-in backends record it as the thread's last error; callers clear it before calling
 * into the backend so that a stale message is never appended).  The message starts with the
 * backend's name ("simdev: ..."); a plugin's detail arrives with the same "simdev: " prefix
 * (registry.c's host_log), which is dropped rather than repeated. */
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
        return stoke__fail(code, "%s", msg);
    const char *d = detail, *colon = strstr(msg, ": ");
    if (colon && strncmp(detail, msg, (size_t)(colon - msg) + 2) == 0 && detail[colon - msg + 2])
        d = detail + (colon - msg) + 2;
    return stoke__fail(code, "%s: %s", msg, d);
}

int stoke_stream_create(const char *backend, stoke_stream **out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "stoke_stream_create: NULL argument");
    *out = NULL;
    const stoke_backend *vt;
    int dev = 0, rc;
    const char *why = NULL;
    if (backend) {
        rc = stoke__backend_lookup(backend, &vt);
        if (rc == STOKE_OK) {
            const stoke_backend *cur;
            int cdev;
            /* The current device applies when `backend` is the chosen accelerator. */
            if (stoke__accel_current(&cur, &cdev, NULL) == STOKE_OK && cur == vt)
                dev = cdev;
        }
    } else {
        rc = stoke__accel_current(&vt, &dev, &why);
        if (rc == STOKE_ENODEV)
            return stoke__fail(rc, "no accelerator for a stream: %s", why);
    }
    if (rc != STOKE_OK)
        return rc;
    if (!vt->stream_create || !vt->copy_h2d_async)
        return stoke__fail(STOKE_ENOTSUP, "backend %s has no streams", vt->name);
    stoke_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return STOKE_ENOMEM;
    s->vt = vt;
    s->dev = dev;
    stoke__clear_error();
    rc = stoke__backend_rc(vt->stream_create(dev, &s->s));
    if (rc != STOKE_OK) {
        free(s);
        return backend_fail(rc, "%s: creating a stream on device %d failed", vt->name, dev);
    }
    *out = s;
    return STOKE_OK;
}

void stoke_stream_destroy(stoke_stream *s)
{
    if (!s)
        return;
    if (s->vt->stream_synchronize)
        s->vt->stream_synchronize(s->s);
    if (s->vt->stream_destroy)
        s->vt->stream_destroy(s->s);
    free(s);
}

int stoke_stream_synchronize(stoke_stream *s)
{
    if (!s)
        return stoke__fail(STOKE_EINVAL, "stoke_stream_synchronize: NULL argument");
    if (!s->vt->stream_synchronize)
        return STOKE_OK;
    stoke__clear_error();
    int rc = stoke__backend_rc(s->vt->stream_synchronize(s->s));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: work on the stream of device %d failed", s->vt->name, s->dev);
    return rc;
}

const char *stoke_stream_backend(const stoke_stream *s)
{
    return s ? s->vt->name : NULL;
}

int stoke_stream_device(const stoke_stream *s)
{
    return s ? s->dev : -1;
}

int stoke_event_create(stoke_stream *s, stoke_event **out)
{
    if (!s || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_event_create: NULL argument");
    *out = NULL;
    if (!s->vt->event_create)
        return stoke__fail(STOKE_ENOTSUP, "backend %s has no events", s->vt->name);
    stoke_event *e = calloc(1, sizeof(*e));
    if (!e)
        return STOKE_ENOMEM;
    e->vt = s->vt;
    e->dev = s->dev;
    stoke__clear_error();
    int rc = stoke__backend_rc(s->vt->event_create(s->dev, &e->e));
    if (rc != STOKE_OK) {
        free(e);
        return backend_fail(rc, "%s: creating an event on device %d failed", s->vt->name, s->dev);
    }
    *out = e;
    return STOKE_OK;
}

void stoke_event_destroy(stoke_event *e)
{
    if (!e)
        return;
    if (e->vt->event_destroy)
        e->vt->event_destroy(e->e);
    free(e);
}

int stoke_event_record(stoke_event *e, stoke_stream *s)
{
    if (!e || !s)
        return stoke__fail(STOKE_EINVAL, "stoke_event_record: NULL argument");
    if (e->vt != s->vt || e->dev != s->dev)
        return stoke__fail(STOKE_EINVAL, "event of %s:%d recorded on a stream of %s:%d",
                           e->vt->name, e->dev, s->vt->name, s->dev);
    stoke__clear_error();
    int rc = stoke__backend_rc(e->vt->event_record(e->e, s->s));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: recording an event failed", e->vt->name);
    return rc;
}

int stoke_event_query(stoke_event *e)
{
    if (!e)
        return stoke__fail(STOKE_EINVAL, "stoke_event_query: NULL argument");
    stoke__clear_error();
    int rc = stoke__backend_rc(e->vt->event_query(e->e));
    if (rc != STOKE_OK && rc != STOKE_EBUSY)
        return backend_fail(rc, "%s: work before the event on device %d failed", e->vt->name,
                            e->dev);
    return rc;
}

int stoke_event_synchronize(stoke_event *e)
{
    if (!e)
        return stoke__fail(STOKE_EINVAL, "stoke_event_synchronize: NULL argument");
    stoke__clear_error();
    int rc = stoke__backend_rc(e->vt->event_synchronize(e->e));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: work before the event on device %d failed", e->vt->name,
                            e->dev);
    return rc;
}

int stoke_device_buffer_create(stoke_stream *s, size_t size, stoke_device_buffer **out)
{
    if (!s || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_device_buffer_create: NULL argument");
    *out = NULL;
    if (!s->vt->device_alloc)
        return stoke__fail(STOKE_ENOTSUP, "backend %s has no device memory", s->vt->name);
    stoke_device_buffer *b = calloc(1, sizeof(*b));
    if (!b)
        return STOKE_ENOMEM;
    b->vt = s->vt;
    b->dev = s->dev;
    b->size = size;
    stoke__clear_error();
    int rc = stoke__backend_rc(s->vt->device_alloc(s->dev, size, &b->handle));
    if (rc != STOKE_OK) {
        free(b);
        return backend_fail(rc, "%s: allocating %zu bytes on device %d failed", s->vt->name, size,
                            s->dev);
    }
    *out = b;
    return STOKE_OK;
}

void stoke_device_buffer_destroy(stoke_device_buffer *b)
{
    if (!b)
        return;
    if (b->imported)
        b->vt->ipc_close_mem(b->dev, STOKE_IPC_DEVICE, b->handle);
    else if (b->vt->device_free)
        b->vt->device_free(b->dev, b->handle);
    free(b);
}

int stoke__device_buffer_wrap_import(const stoke_backend *vt, int dev, void *handle, size_t size,
                                     stoke_device_buffer **out)
{
    stoke_device_buffer *b = calloc(1, sizeof(*b));
    if (!b)
        return STOKE_ENOMEM;
    *b = (stoke_device_buffer){.vt = vt, .dev = dev, .handle = handle, .size = size, .imported = 1};
    *out = b;
    return STOKE_OK;
}

void stoke__device_buffer_parts(const stoke_device_buffer *b, const stoke_backend **vt, int *dev)
{
    *vt = b->vt;
    *dev = b->dev;
}

void *stoke_device_buffer_handle(const stoke_device_buffer *b)
{
    return b ? b->handle : NULL;
}

size_t stoke_device_buffer_size(const stoke_device_buffer *b)
{
    return b ? b->size : 0;
}

static int check_copy(stoke_device_buffer *b, size_t offset, size_t n, stoke_stream *s)
{
    if (!b || !s)
        return stoke__fail(STOKE_EINVAL, "a device copy: NULL argument");
    if (b->vt != s->vt || b->dev != s->dev)
        return stoke__fail(STOKE_EINVAL, "buffer of %s:%d used on a stream of %s:%d", b->vt->name,
                           b->dev, s->vt->name, s->dev);
    if (offset > b->size || n > b->size - offset)
        return stoke__fail(STOKE_ERANGE,
                           "copy of %zu bytes at offset %zu exceeds the %zu-byte "
                           "device buffer",
                           n, offset, b->size);
    return STOKE_OK;
}

int stoke_copy_h2d_async(stoke_device_buffer *dst, size_t offset, const void *src, size_t n,
                         stoke_stream *s)
{
    if (!src)
        return stoke__fail(STOKE_EINVAL, "stoke_copy_h2d_async: NULL host source");
    int rc = check_copy(dst, offset, n, s);
    if (rc != STOKE_OK)
        return rc;
    stoke__clear_error();
    rc = stoke__backend_rc(s->vt->copy_h2d_async(dst->handle, offset, src, n, s->s));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: host-to-device copy of %zu bytes failed", s->vt->name, n);
    return rc;
}

int stoke_copy_d2h_async(void *dst, stoke_device_buffer *src, size_t offset, size_t n,
                         stoke_stream *s)
{
    if (!dst)
        return stoke__fail(STOKE_EINVAL, "stoke_copy_d2h_async: NULL host destination");
    int rc = check_copy(src, offset, n, s);
    if (rc != STOKE_OK)
        return rc;
    if (!s->vt->copy_d2h_async)
        return stoke__fail(STOKE_ENOTSUP, "backend %s cannot copy device-to-host", s->vt->name);
    stoke__clear_error();
    rc = stoke__backend_rc(s->vt->copy_d2h_async(dst, src->handle, offset, n, s->s));
    if (rc != STOKE_OK)
        return backend_fail(rc, "%s: device-to-host copy of %zu bytes failed", s->vt->name, n);
    return rc;
}
