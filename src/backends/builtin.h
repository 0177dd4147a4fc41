/* Entry points of the backends compiled into libstoke.  Same contract as a plugin's
 * stoke_backend_entry (backend.h). */
#ifndef STOKE_BUILTIN_H
#define STOKE_BUILTIN_H

#include "stoke/backend.h"

int stoke__backend_cpu_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_cuda_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_hip_entry(const stoke_backend_host *host, const stoke_backend **out);
int stoke__backend_opencl_entry(const stoke_backend_host *host, const stoke_backend **out);

#endif
