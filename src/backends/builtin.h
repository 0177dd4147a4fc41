/* Entry points of the backends compiled into libstoke.  Same contract as a plugin's
 * stoke_backend_entry (backend.h). */
#ifndef STOKE_BUILTIN_H
#define STOKE_BUILTIN_H

#include <stdarg.h>

#include "common/internal.h"
#include "stoke/backend.h"

int stoke__backend_cpu_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_cuda_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_hip_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_opencl_entry(const stoke_backend_host *host, const stoke_backend **out);

/* Copies `props` into the caller's *out, at most out->size bytes (the caller's struct may be an
 * older, smaller one), and sets out->size to what was written.  Returns STOKE_OK. */
int stoke__props_out(stoke_device_props *out, const stoke_device_props *props);

/* Fails (stoke__fail) with a driver's or runtime's result after a description of the call:
 * "<backend>: <call>: <name> (<code>): <text>", <call> being `fmt` formatted with `ap`, e.g.
 * "cuda: cuMemAlloc(4096 bytes) on device 1: CUDA_ERROR_OUT_OF_MEMORY (2): out of memory".
 * Returns STOKE_ENOMEM when `oom` (the result means out of memory), else STOKE_EBACKEND. */
int stoke__backend_vfail(const char *backend, int oom, int code, const char *name, const char *text,
                         const char *fmt, va_list ap) STOKE__PRINTF(6, 0);

#endif
