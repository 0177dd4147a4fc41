/* simdev — the simulated accelerator's own query interface (not part of the backend ABI).
 *
 * libstoke-backend-simdev.so exports, besides stoke_backend_entry, one extra function that tests
 * and benchmarks fetch with dlopen(path, RTLD_NOLOAD) + dlsym(STOKE_SIMDEV_COUNTERS_SYMBOL):
 *
 *     int stoke_simdev_counters(struct stoke_simdev_counters *out);
 *
 * (The struct has no typedef: its tag and the function share the name, which C allows only
 * in this form.)
 *
 * It copies a snapshot of the counters into *out.  The caller sets out->size to
 * sizeof(struct stoke_simdev_counters) as it was compiled; the plugin fills at most that many bytes
 * (older callers get a prefix, newer callers' extra members stay as they were), sets out->size
 * to the number of bytes it wrote and out->version to STOKE_SIMDEV_COUNTERS_VERSION.
 * Returns STOKE_OK (0), or STOKE_EINVAL (-1) when out is NULL or out->size is smaller than the
 * header (size + version).  Thread-safe; the snapshot is consistent (taken under one lock).
 *
 * Every counter is reset to zero when the host probes the plugin (after each load or registry
 * reset).  Members are only ever appended.
 */
#ifndef STOKE_SIMDEV_H
#define STOKE_SIMDEV_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_SIMDEV_COUNTERS_VERSION 1
#define STOKE_SIMDEV_COUNTERS_SYMBOL  "stoke_simdev_counters"

struct stoke_simdev_counters {
    uint32_t size;    /* in: sizeof as the caller compiled it; out: bytes written */
    uint32_t version; /* out: STOKE_SIMDEV_COUNTERS_VERSION */

    /* Copies, counted when they are queued (copy_h2d_async / copy_d2h_async returned OK).
     * "pinned" means the whole host side [ptr, ptr+n) lies inside one block pinned by simdev
     * (host_alloc or host_register); "pageable" is everything else. */
    uint64_t h2d_copies;
    uint64_t h2d_pinned;
    uint64_t h2d_pageable;
    uint64_t h2d_bytes;
    uint64_t d2h_copies;
    uint64_t d2h_pinned;
    uint64_t d2h_pageable;
    uint64_t d2h_bytes;
    /* Counted when the stream thread ran the copy. */
    uint64_t copies_completed;
    uint64_t copies_failed; /* injected (STOKE_SIMDEV_FAIL_COPY) or canceled by shutdown */

    /* Allocations that succeeded, and their undoing. */
    uint64_t host_allocs;
    uint64_t host_frees;
    uint64_t host_registers;
    uint64_t host_unregisters;
    uint64_t device_allocs;
    uint64_t device_frees;
    uint64_t allocs_failed; /* injected (STOKE_SIMDEV_FAIL_ALLOC) or refused by the OS / limit */

    /* What is alive right now (all zero after every object was freed). */
    uint64_t live_host_blocks; /* host_alloc blocks not yet freed */
    uint64_t live_host_bytes;  /* their requested bytes */
    uint64_t live_registered;  /* host_register ranges not yet unregistered */
    uint64_t live_registered_bytes;
    uint64_t live_device_buffers; /* device_alloc buffers not yet freed */
    uint64_t live_device_bytes;   /* their requested bytes */
    uint64_t live_streams;
    uint64_t live_events;

    /* IPC (appended: read them only when `size` covers them). */
    uint64_t ipc_exports;         /* handles made by ipc_export_mem */
    uint64_t ipc_imports;         /* ipc_import_mem that succeeded */
    uint64_t live_host_imports;   /* host imports not yet closed */
    uint64_t live_device_imports; /* device imports not yet closed */
};

/* Type of the exported function, for dlsym. */
typedef int (*stoke_simdev_counters_fn)(struct stoke_simdev_counters *out);

#ifdef __cplusplus
}
#endif
#endif
