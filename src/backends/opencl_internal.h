/* The opencl backend, private: what opencl.c (loading, devices, memory, the backend table)
 * and opencl_stream.c (streams, copies and events) share. */
#ifndef STOKE_BACKENDS_OPENCL_INTERNAL_H
#define STOKE_BACKENDS_OPENCL_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>

#include "backends/opencl_api.h"
#include "stoke/backend.h"

#define OCL_PENDING_TRIM 64 /* a stream checks its copy events once this many are pending */

typedef struct ocl_dev {
    cl_platform_id platform;
    cl_device_id id;
    int kind; /* stoke_device_kind */
    char name[128];
    _Atomic(cl_context) ctx; /* created on first use */
    cl_command_queue util_q; /* for map/unmap; valid once ctx is published */
} ocl_dev;

/* The driver's functions, loaded by the probe; immutable until shutdown after a successful
 * probe (opencl.c, "Locking"). */
extern const struct stoke__ocl_api *const stoke__ocl_fn;

int stoke__ocl_check_dev(int dev);
int stoke__ocl_get_dev(int dev, ocl_dev **out); /* its context created on first use */
const char *stoke__ocl_name(cl_int e);
int stoke__ocl_code(cl_int e);
int stoke__ocl_fail(cl_int e, const char *what); /* logs and returns a STOKE_E* code */

/* opencl_stream.c: the backend table's stream, copy and event entries */
int stoke__opencl_stream_create(int dev, stoke_backend_stream **out);
int stoke__opencl_stream_synchronize(stoke_backend_stream *s);
int stoke__opencl_stream_destroy(stoke_backend_stream *s);
int stoke__opencl_copy_h2d(void *dst, size_t dst_offset, const void *src, size_t n,
                           stoke_backend_stream *s);
int stoke__opencl_copy_d2h(void *dst, const void *src, size_t src_offset, size_t n,
                           stoke_backend_stream *s);
int stoke__opencl_event_create(int dev, stoke_backend_event **out);
int stoke__opencl_event_destroy(stoke_backend_event *ev);
int stoke__opencl_event_record(stoke_backend_event *ev, stoke_backend_stream *s);
int stoke__opencl_event_query(stoke_backend_event *ev);
int stoke__opencl_event_synchronize(stoke_backend_event *ev);

#endif
