/* Private interface of the registry for the layers above it (pinned, loader). */
#ifndef STOKE_REGISTRY_PRIV_H
#define STOKE_REGISTRY_PRIV_H

#include "common/internal.h"
#include "stoke/accelerator.h"
#include "stoke/backend.h"

/* The chosen accelerator's table and the calling thread's current device.
 * STOKE_OK; STOKE_ENODEV when there is none (*vt = NULL, *why = the reason); STOKE_ENOENT /
 * STOKE_ERANGE for a bad STOKE_ACCELERATOR (the last error says so).  `why` may be NULL.
 * Cheap after the first call: one atomic load and a thread-local read. */
int stoke__accel_current(const stoke_backend **vt, int *dev, const char **why);

/* The table of the backend named `name`, probed as explicitly requested.  STOKE_ENOENT for an
 * unknown name (the last error lists the known ones), STOKE_ENODEV when it is unavailable (the
 * last error gives its reason). */
int stoke__backend_lookup(const char *name, const stoke_backend **vt);

/* A backend function's return code as the public API may return it: a positive or unknown
 * code (a plugin's mistake: every call returns STOKE_OK or a negative STOKE_E* code) becomes
 * STOKE_EBACKEND, so that a caller testing rc < 0 never takes it for success. */
static inline int stoke__backend_rc(int rc)
{
    return rc == STOKE_OK || (rc < 0 && stoke__status_known(rc)) ? rc : STOKE_EBACKEND;
}

/* 1 when `vt` has the ABI v2 IPC group (checked at load: all three functions or none). */
static inline int stoke__vt_has_ipc(const stoke_backend *vt)
{
    return vt && vt->abi_version >= 2 && vt->size >= STOKE_BACKEND_V2_SIZE && vt->ipc_export_mem;
}

/* For stoke_ipc (src/ipc): a device buffer over `handle`, a device import of `vt` on `dev`,
 * whose destroy calls vt->ipc_close_mem instead of device_free (STOKE_OK or STOKE_ENOMEM); and
 * the backend and device a buffer belongs to. */
int stoke__device_buffer_wrap_import(const stoke_backend *vt, int dev, void *handle, size_t size,
                                     stoke_device_buffer **out);
void stoke__device_buffer_parts(const stoke_device_buffer *b, const stoke_backend **vt, int *dev);

/* Parses "name[:index]": copies the name (lower-case) and sets *index (-1 when absent).
 * STOKE_EINVAL if malformed. */
int stoke__parse_accel_spec(const char *spec, char *name, size_t name_len, int *index);

/* Comma-separated names of every known backend ("simdev, cuda, hip, opencl, cpu"). */
void stoke__backend_names(char *out, size_t len);

/* Tests only: calls every backend's shutdown, unloads plugins and forgets every probe, load and
 * selection, so that the next call starts from the environment again.  Not thread-safe with
 * respect to concurrent stoke calls. */
void stoke__registry_reset(void);

/* Registers `fn` to run at the start of every stoke__registry_reset, before any backend shuts
 * down, without the registry lock held: layers above (the pinned cache) free what still
 * references a backend.  Registering the same function twice is a no-op; at most 8. */
void stoke__registry_on_reset(void (*fn)(void));

#endif
