/* The opencl backend: streams, copies and events.  Each stream is an in-order command queue;
 * copies are non-blocking clEnqueueWrite/ReadBuffer calls, each with an event; the events of
 * the copies since the last record move into the recorded event (with a marker), so a failed
 * copy is reported by the event after it.  A stream belongs to one thread at a time
 * (device.h); an event has a mutex because the thread that records it and the one that queries
 * it may differ.  Loading, devices and the backend table: opencl.c. */
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backends/opencl_internal.h"
#include "common/internal.h"

struct stoke_backend_stream {
    ocl_dev *d;
    int dev;
    cl_command_queue q;
    cl_event *pending; /* copy events since the last record (owned) */
    size_t npending, cap;
    int error; /* first failure seen among trimmed copy events (a STOKE_E* code), sticky */
};

struct stoke_backend_event {
    pthread_mutex_t lock;
    int dev;
    cl_event marker; /* NULL until recorded */
    cl_event *deps;  /* copy events before the marker (owned) */
    size_t ndeps;
    int error; /* failure carried from the stream when recorded */
};

/* ---- streams and copies ------------------------------------------------------------------- */

/* STOKE_OK (complete), STOKE_EBUSY (pending) or the failure of the command behind `e`. */
static int event_status(cl_event e)
{
    cl_int st = CL_COMPLETE;
    cl_int err =
        stoke__ocl_fn->clGetEventInfo(e, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof(st), &st, NULL);
    if (err != CL_SUCCESS)
        return stoke__ocl_fail(err, "clGetEventInfo");
    if (st < 0)
        return stoke__fail(stoke__ocl_code(st), "opencl: a queued copy failed: %s (%d)",
                           stoke__ocl_name(st), (int)st);
    return st == CL_COMPLETE ? STOKE_OK : STOKE_EBUSY;
}

/* Releases the stream's completed copy events, keeping a failure as its sticky error. */
static void trim_pending(stoke_backend_stream *s)
{
    size_t keep = 0;
    for (size_t i = 0; i < s->npending; i++) {
        int rc = event_status(s->pending[i]);
        if (rc == STOKE_EBUSY) {
            s->pending[keep++] = s->pending[i];
            continue;
        }
        if (rc != STOKE_OK && s->error == STOKE_OK)
            s->error = rc;
        stoke__ocl_fn->clReleaseEvent(s->pending[i]);
    }
    s->npending = keep;
}

static int push_pending(stoke_backend_stream *s, cl_event e)
{
    if (s->npending >= OCL_PENDING_TRIM)
        trim_pending(s);
    if (s->npending == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        cl_event *v = realloc(s->pending, cap * sizeof(*v));
        if (!v) {
            /* Cannot track it: wait for it instead. */
            stoke__ocl_fn->clWaitForEvents(1, &e);
            int rc = event_status(e);
            stoke__ocl_fn->clReleaseEvent(e);
            if (rc != STOKE_OK && s->error == STOKE_OK)
                s->error = rc;
            return STOKE_OK;
        }
        s->pending = v;
        s->cap = cap;
    }
    s->pending[s->npending++] = e;
    return STOKE_OK;
}

int stoke__opencl_stream_create(int dev, stoke_backend_stream **out)
{
    *out = NULL;
    ocl_dev *d;
    int rc = stoke__ocl_get_dev(dev, &d);
    if (rc != STOKE_OK)
        return rc;
    stoke_backend_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return STOKE_ENOMEM;
    cl_int e = CL_SUCCESS;
    s->q = stoke__ocl_fn->clCreateCommandQueue(atomic_load_explicit(&d->ctx, memory_order_acquire),
                                               d->id, 0, &e);
    if (!s->q || e != CL_SUCCESS) {
        free(s);
        return stoke__ocl_fail(e ? e : CL_INVALID_COMMAND_QUEUE, "clCreateCommandQueue");
    }
    s->d = d;
    s->dev = dev;
    *out = s;
    return STOKE_OK;
}

int stoke__opencl_stream_synchronize(stoke_backend_stream *s)
{
    cl_int e = stoke__ocl_fn->clFinish(s->q);
    trim_pending(s);
    if (e != CL_SUCCESS)
        return stoke__ocl_fail(e, "clFinish");
    int rc = s->error;
    s->error = STOKE_OK;
    return rc;
}

int stoke__opencl_stream_destroy(stoke_backend_stream *s)
{
    if (!s)
        return STOKE_OK;
    stoke__ocl_fn->clFinish(s->q);
    for (size_t i = 0; i < s->npending; i++)
        stoke__ocl_fn->clReleaseEvent(s->pending[i]);
    free(s->pending);
    stoke__ocl_fn->clReleaseCommandQueue(s->q);
    free(s);
    return STOKE_OK;
}

int stoke__opencl_copy_h2d(void *dst, size_t dst_offset, const void *src, size_t n,
                           stoke_backend_stream *s)
{
    if (n == 0)
        return STOKE_OK;
    cl_event ev = NULL;
    cl_int e = stoke__ocl_fn->clEnqueueWriteBuffer(s->q, (cl_mem)dst, CL_FALSE, dst_offset, n, src,
                                                   0, NULL, &ev);
    if (e != CL_SUCCESS)
        return stoke__ocl_fail(e, "clEnqueueWriteBuffer");
    stoke__ocl_fn->clFlush(s->q);
    return push_pending(s, ev);
}

int stoke__opencl_copy_d2h(void *dst, const void *src, size_t src_offset, size_t n,
                           stoke_backend_stream *s)
{
    if (n == 0)
        return STOKE_OK;
    cl_event ev = NULL;
    cl_int e = stoke__ocl_fn->clEnqueueReadBuffer(s->q, (cl_mem)(uintptr_t)src, CL_FALSE,
                                                  src_offset, n, dst, 0, NULL, &ev);
    if (e != CL_SUCCESS)
        return stoke__ocl_fail(e, "clEnqueueReadBuffer");
    stoke__ocl_fn->clFlush(s->q);
    return push_pending(s, ev);
}

/* ---- events ------------------------------------------------------------------------------- */

int stoke__opencl_event_create(int dev, stoke_backend_event **out)
{
    *out = NULL;
    int rc = stoke__ocl_check_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    stoke_backend_event *ev = calloc(1, sizeof(*ev));
    if (!ev)
        return STOKE_ENOMEM;
    pthread_mutex_init(&ev->lock, NULL);
    ev->dev = dev;
    *out = ev;
    return STOKE_OK;
}

static void release_events(cl_event marker, cl_event *deps, size_t n)
{
    if (marker)
        stoke__ocl_fn->clReleaseEvent(marker);
    for (size_t i = 0; i < n; i++)
        stoke__ocl_fn->clReleaseEvent(deps[i]);
    free(deps);
}

int stoke__opencl_event_destroy(stoke_backend_event *ev)
{
    if (!ev)
        return STOKE_OK;
    release_events(ev->marker, ev->deps, ev->ndeps);
    pthread_mutex_destroy(&ev->lock);
    free(ev);
    return STOKE_OK;
}

int stoke__opencl_event_record(stoke_backend_event *ev, stoke_backend_stream *s)
{
    cl_event marker = NULL;
    cl_int e = stoke__ocl_fn->clEnqueueMarkerWithWaitList(s->q, 0, NULL, &marker);
    if (e != CL_SUCCESS)
        return stoke__ocl_fail(e, "clEnqueueMarkerWithWaitList");
    stoke__ocl_fn->clFlush(s->q);
    /* The copies since the last record now belong to this event. */
    cl_event *deps = s->pending;
    size_t ndeps = s->npending;
    s->pending = NULL;
    s->npending = s->cap = 0;
    int carried = s->error;
    s->error = STOKE_OK;

    pthread_mutex_lock(&ev->lock);
    cl_event old_marker = ev->marker;
    cl_event *old_deps = ev->deps;
    size_t old_n = ev->ndeps;
    ev->marker = marker;
    ev->deps = deps;
    ev->ndeps = ndeps;
    ev->error = carried;
    pthread_mutex_unlock(&ev->lock);
    release_events(old_marker, old_deps, old_n);
    return STOKE_OK;
}

/* Under ev->lock. */
static int query_locked(stoke_backend_event *ev)
{
    if (!ev->marker)
        return STOKE_OK;
    int rc = event_status(ev->marker);
    if (rc == STOKE_EBUSY)
        return rc;
    /* The marker completed (in order: so did every copy before it); any of them failed? */
    for (size_t i = 0; i < ev->ndeps; i++) {
        int r = event_status(ev->deps[i]);
        if (r != STOKE_OK && r != STOKE_EBUSY && ev->error == STOKE_OK)
            ev->error = r;
    }
    for (size_t i = 0; i < ev->ndeps; i++)
        stoke__ocl_fn->clReleaseEvent(ev->deps[i]);
    free(ev->deps);
    ev->deps = NULL;
    ev->ndeps = 0;
    if (rc == STOKE_OK)
        rc = ev->error;
    return rc;
}

int stoke__opencl_event_query(stoke_backend_event *ev)
{
    pthread_mutex_lock(&ev->lock);
    int rc = query_locked(ev);
    pthread_mutex_unlock(&ev->lock);
    return rc;
}

int stoke__opencl_event_synchronize(stoke_backend_event *ev)
{
    pthread_mutex_lock(&ev->lock);
    cl_event m = ev->marker;
    if (m)
        stoke__ocl_fn->clRetainEvent(m);
    pthread_mutex_unlock(&ev->lock);
    if (m) {
        stoke__ocl_fn->clWaitForEvents(1, &m); /* failures are read back below */
        stoke__ocl_fn->clReleaseEvent(m);
    }
    pthread_mutex_lock(&ev->lock);
    int rc = query_locked(ev);
    pthread_mutex_unlock(&ev->lock);
    /* Re-recorded meanwhile onto later work: wait for that too. */
    return rc == STOKE_EBUSY ? stoke__opencl_event_synchronize(ev) : rc;
}
