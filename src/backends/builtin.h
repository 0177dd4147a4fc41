/* Entry points of the backends compiled into libstoke.  Same contract as a plugin's
 * stoke_backend_entry (backend.h). */
#ifndef STOKE_BUILTIN_H
#define STOKE_BUILTIN_H

#include "stoke/backend.h"

int stoke__backend_cpu_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_cuda_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_hip_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_opencl_entry(const stoke_backend_host *host, const stoke_backend **out);

/* Copies `props` into the caller's *out, at most out->size bytes (the caller's struct may be an
 * older, smaller one), and sets out->size to what was written.  Returns STOKE_OK. */
int stoke__props_out(stoke_device_props *out, const stoke_device_props *props);

#endif
