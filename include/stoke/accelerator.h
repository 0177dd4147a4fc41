/* stoke — accelerators: which backends exist, which one is chosen, the current device.
 *
 * The selection rule (docs/registry.md):
 *   1. explicit: stoke_accelerator_select("name[:index]") or STOKE_ACCELERATOR=name[:index];
 *   2. plugins the application loaded (stoke_plugin_load, STOKE_PLUGIN_PATH): first loaded wins;
 *   3. built-ins in order cuda, hip, opencl (GPU/accelerator devices only);
 *   4. none: pinned memory falls back to ordinary memory, with one warning.
 * The "cpu" backend is always present and never chosen: it pins nothing.
 *
 * The registry is created lazily by the first call of any function here (or of the pinned
 * allocator / loader), which also loads the plugins named in STOKE_PLUGIN_PATH.  Plugins stay
 * loaded until the process exits.  All functions are thread-safe unless noted; the current
 * device is per thread.  Every new selection (a successful stoke_accelerator_select, any
 * stoke_plugin_load) resets every thread's current device to the new selection's default.
 *
 * While STOKE_ACCELERATOR (with no API selection in force) is invalid, every call that needs
 * the accelerator fails with the same code: STOKE_EINVAL (not of the form name[:index]),
 * STOKE_ENOENT (unknown name; the last error lists the known backends) or STOKE_ERANGE (no
 * such device index).  Names are matched case-insensitively.
 */
#ifndef STOKE_ACCELERATOR_H
#define STOKE_ACCELERATOR_H

#include <stddef.h>

#include "stoke/backend.h"
#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoke_backend_origin {
    STOKE_ORIGIN_BUILTIN = 0, /* compiled into libstoke */
    STOKE_ORIGIN_PLUGIN = 1   /* loaded from a shared object */
} stoke_backend_origin;

/* One backend the registry considered. */
typedef struct stoke_backend_info {
    char name[32];       /* "cuda", "simdev"; for a plugin rejected before it named itself, the
                            file's base name */
    int origin;          /* stoke_backend_origin */
    int available;       /* 1 if its probe succeeded */
    int device_count;    /* devices it exposes (0 if unavailable) */
    char reason[256];    /* why it is (un)available: "no device", "ABI version 9 outside 1..1" */
    char path[512];      /* file it was loaded from (plugins), else "" */
    unsigned long long caps; /* STOKE_CAP_* (0 if unavailable) */
} stoke_backend_info;

/* The chosen accelerator. */
typedef struct stoke_accelerator_info {
    char backend[32];    /* backend name */
    int device_count;
    int current_device;  /* the calling thread's current device */
    char reason[256];    /* why it was chosen: "explicit: STOKE_ACCELERATOR=simdev:1", ... */
} stoke_accelerator_info;

/* Fills *out (caller's memory, must not be NULL) with the chosen accelerator, selecting it on
 * first use.  Returns STOKE_OK; STOKE_EINVAL for out NULL (nothing written); otherwise *out is
 * zeroed except out->reason (why: "no accelerator found: ...", or the error's message) and
 * out->current_device = -1, and the code is STOKE_ENODEV (no accelerator, including an
 * explicit choice of an unavailable backend or of "cpu"), STOKE_EINVAL / STOKE_ENOENT /
 * STOKE_ERANGE (STOKE_ACCELERATOR invalid, see above; the last error says why) or
 * STOKE_ENOMEM.  Thread-safe; current_device is the calling thread's. */
STOKE_API int stoke_accelerator_get(stoke_accelerator_info *out);

/* Chooses the accelerator explicitly, overriding STOKE_ACCELERATOR: `spec` is "name" or
 * "name:index" (index becomes the calling thread's current device and every other thread's
 * default; without it, 0); `spec` is only read during the call.  On success every thread's
 * current device is reset to that default.  Returns STOKE_OK; STOKE_EINVAL (malformed spec,
 * an index above 1000000, or a spec of 64 characters or more); STOKE_ENOENT (unknown name);
 * STOKE_ENODEV (known but unavailable, or "cpu", which pins nothing); STOKE_ERANGE (no such
 * device index).  On any error the previous choice stays and the last error says why.
 * NULL drops the API choice: selection goes back to STOKE_ACCELERATOR if set, else automatic;
 * it then returns STOKE_OK when that yields an accelerator, else STOKE_ENODEV (also when
 * STOKE_ACCELERATOR is invalid), the drop taking effect either way.  Memory pinned before the
 * change stays pinned for the backend it came from.  Thread-safe. */
STOKE_API int stoke_accelerator_select(const char *spec);

/* Number of backends considered, in listing order: plugins in load order (rejected ones
 * included, with their reason), then cuda, hip, opencl, cpu.  Probes every backend not yet
 * probed (this may load driver libraries).  Cannot fail.  Thread-safe. */
STOKE_API int stoke_backend_count(void);

/* Copies the description of backend `i` (0 <= i < stoke_backend_count()) into *out (caller's
 * memory; a snapshot, nothing to free).  Probes backends as stoke_backend_count does.
 * Returns STOKE_OK; STOKE_EINVAL for out NULL; STOKE_ERANGE for another `i` (*out untouched).
 * Thread-safe. */
STOKE_API int stoke_backend_get_info(int i, stoke_backend_info *out);

/* Properties of device `dev` of the backend named `name` (NULL: the chosen accelerator; only
 * read during the call) into *out (caller's memory; out->size must be set by the caller to
 * sizeof(stoke_device_props), and the backend fills at most that many bytes).  A named backend
 * that is not the chosen accelerator is probed as if explicitly requested (all its devices).
 * Returns STOKE_OK; STOKE_EINVAL (out NULL or out->size 0); STOKE_ENOENT (unknown name);
 * STOKE_ENODEV (that backend is unavailable, or name NULL and there is no accelerator);
 * STOKE_ERANGE (`dev` not in [0, device count)); with name NULL, the codes of an invalid
 * STOKE_ACCELERATOR (see above); the backend's own code if its device_props fails.
 * Thread-safe. */
STOKE_API int stoke_device_get_props(const char *name, int dev, stoke_device_props *out);

/* Loads the plugin at `path` (a shared object exporting STOKE_BACKEND_ENTRY_SYMBOL; the
 * string is copied) and adds it to the registry after the plugins already loaded.  A plugin is
 * never unloaded before the process exits.  A rejected plugin is listed with its reason and
 * logged at WARN; the call then returns STOKE_ENOENT (missing file), STOKE_EIO (dlopen
 * failed, or the resolved file or a directory above it is owned by another user than root and
 * this one, or writable by others or a shared group: not loaded, see docs/registry.md),
 * STOKE_EABI (no entry point, version outside the window, table too small or missing
 * a required function, no valid name, or a name already registered), the entry point's own
 * negative code when it fails, STOKE_ELIMIT (512 plugin files already listed) or STOKE_ENODEV (its
 * probe failed or it has no device: it stays loaded and listed as unavailable).  STOKE_EINVAL
 * for a NULL or empty path.  Returns STOKE_OK when it loaded and is available.  Whatever the
 * result, the selection is re-evaluated at the next use (every thread's current device then
 * returns to the default).  Thread-safe. */
STOKE_API int stoke_plugin_load(const char *path);

/* The calling thread's current device of the chosen accelerator (default: the index given in
 * the explicit selection, else 0; reset to it by every new selection).
 * stoke_device_get writes it to *dev; returns STOKE_OK, STOKE_EINVAL (dev NULL), STOKE_ENODEV
 * (no accelerator; *dev = -1) or the codes of an invalid STOKE_ACCELERATOR (*dev = -1).
 * stoke_device_set returns STOKE_OK, STOKE_ERANGE (index outside [0, device_count)),
 * STOKE_ENODEV (no accelerator) or the codes of an invalid STOKE_ACCELERATOR.  Both are
 * thread-safe and affect only the calling thread. */
STOKE_API int stoke_device_get(int *dev);
STOKE_API int stoke_device_set(int dev);

#ifdef __cplusplus
}
#endif
#endif
