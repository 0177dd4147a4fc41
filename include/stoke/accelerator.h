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
 * allocator / loader), which also loads the plugins named in STOKE_PLUGIN_PATH.  All functions
 * are thread-safe.
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

/* Fills *out with the chosen accelerator.
 * Returns STOKE_OK; STOKE_ENODEV when there is none (out->reason still says why, the other
 * fields are zero/empty); STOKE_ENOENT when STOKE_ACCELERATOR names an unknown backend (the
 * last error lists the known ones); STOKE_ERANGE when its index is not a device of it. */
STOKE_API int stoke_accelerator_get(stoke_accelerator_info *out);

/* Chooses the accelerator explicitly, overriding STOKE_ACCELERATOR: `spec` is "name" or
 * "name:index" (index becomes the calling thread's current device and every other thread's
 * default); NULL returns to automatic selection.  Returns STOKE_OK, STOKE_ENOENT (unknown name),
 * STOKE_ENODEV (known but unavailable; the previous choice stays), STOKE_ERANGE (bad index),
 * STOKE_EINVAL (malformed spec).  Memory pinned before the change stays pinned for the backend
 * it came from. */
STOKE_API int stoke_accelerator_select(const char *spec);

/* Number of backends considered, in listing order: plugins in load order, then cuda, hip,
 * opencl, cpu.  Probes every backend on first use. */
STOKE_API int stoke_backend_count(void);

/* Fills *out for backend `i` (0 <= i < stoke_backend_count()).  STOKE_ERANGE otherwise. */
STOKE_API int stoke_backend_get_info(int i, stoke_backend_info *out);

/* Properties of device `dev` of the backend named `name` (NULL: the chosen accelerator).
 * out->size must be set by the caller.  STOKE_ENOENT / STOKE_ENODEV / STOKE_ERANGE. */
STOKE_API int stoke_device_get_props(const char *name, int dev, stoke_device_props *out);

/* Loads the plugin at `path` (a shared object exporting STOKE_BACKEND_ENTRY_SYMBOL) and adds it
 * to the registry after the plugins already loaded.  A rejected plugin is listed with its reason
 * and logged at WARN; the call then returns STOKE_ENOENT (missing file), STOKE_EIO (dlopen
 * failed), STOKE_EABI (no entry point, version outside the window, table too small or missing a
 * required function) or STOKE_ENODEV (probe failed).  Returns STOKE_OK when it loaded and is
 * available.  Automatic selection is re-evaluated. */
STOKE_API int stoke_plugin_load(const char *path);

/* The calling thread's current device of the chosen accelerator (default: the index given in
 * the explicit selection, else 0).  stoke_device_set fails with STOKE_ERANGE for an index
 * outside [0, device_count) and STOKE_ENODEV when there is no accelerator.  Per thread. */
STOKE_API int stoke_device_get(int *dev);
STOKE_API int stoke_device_set(int dev);

#ifdef __cplusplus
}
#endif
#endif
