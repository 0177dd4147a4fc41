/* simdev — private declarations shared by the plugin's files.  Nothing here is exported: the
 * plugin is built with hidden visibility and exports only stoke_backend_entry and
 * stoke_simdev_counters (see simdev.c).
 *
 * Files: simdev.c (entry point, table, probe, device properties, counters, shutdown),
 * env.c (the only file that reads STOKE_SIMDEV_* variables), memory.c (pinned host memory and
 * device memory), stream.c (stream threads, copies, events).
 *
 * Locking (leaf locks; never held while calling host->log... except where noted):
 * - simdev__lock: the configuration (simdev__cfg), the counters (simdev__ctr), the fault
 *   injection counters and the device-buffer table (memory.c).
 * - memory.c's pinned-range rwlock: the table of pinned host ranges.  Never taken together
 *   with simdev__lock (the copy path takes one, releases it, then the other).
 * - each stream's mutex and each event's mutex (stream.c): the stream thread takes the stream
 *   mutex, releases it, then takes an event mutex; nobody holds two of them at once, except
 *   simdev__lock -> (nothing).
 */
#ifndef SIMDEV_INT_H
#define SIMDEV_INT_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "simdev.h"
#include "stoke/backend.h"
#include "stoke/log.h"

#pragma GCC visibility push(hidden)

#define SIMDEV_MAX_DEVICES 64

/* Settings read from the environment at probe time (env.c). */
typedef struct simdev_config {
    int devices;            /* STOKE_SIMDEV_DEVICES, default 2, 0..64 */
    uint64_t copy_delay_us; /* STOKE_SIMDEV_COPY_DELAY_US, default 0 */
    uint64_t memory;        /* STOKE_SIMDEV_MEMORY: bytes of device memory per device */
    uint64_t fail_alloc;    /* STOKE_SIMDEV_FAIL_ALLOC: 1-based allocation that fails; 0 off */
    uint64_t fail_copy;     /* STOKE_SIMDEV_FAIL_COPY: 1-based copy that fails; 0 off */
    int probe_fail;         /* STOKE_SIMDEV_PROBE_FAIL: probe reports "no device" */
} simdev_config;

#define SIMDEV_DEFAULT_DEVICES 2
#define SIMDEV_DEFAULT_MEMORY  (4ull << 30)

/* Guarded by simdev__lock. */
extern pthread_mutex_t simdev__lock;
/* In a forked child (simdev.c): the lock of the stream and event lists (stream.c) and of the
 * pinned table (memory.c) made anew. */
void simdev__objs_lock_init(void);
void simdev__pinned_table_lock_init(void);
extern simdev_config simdev__cfg;
extern struct stoke_simdev_counters simdev__ctr;
extern uint64_t simdev__alloc_seq; /* allocations attempted since probe */
extern uint64_t simdev__copy_seq;  /* copies queued since probe */

/* simdev.c */
/* Formats a line and hands it to host->log as backend "simdev" (dropped before the entry point
 * ran).  Safe from any thread; do not call with simdev__lock held (the host's sink may block). */
void simdev__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* STOKE_OK if 0 <= dev < configured devices, else logs and returns STOKE_ERANGE. */
int simdev__check_dev(int dev, const char *what);
/* Counts one allocation attempt; returns STOKE_ENOMEM (and logs "injected") when it is the one
 * STOKE_SIMDEV_FAIL_ALLOC names.  Takes simdev__lock. */
int simdev__alloc_attempt(const char *what, int dev, size_t size);

/* env.c: reads every STOKE_SIMDEV_* variable into *cfg; invalid values fall back to the
 * default, with a warning when `warn` is set. */
void simdev__read_config(simdev_config *cfg, int warn);

/* memory.c */
int simdev__host_alloc(int dev, size_t size, void **out);
int simdev__host_free(int dev, void *ptr);
int simdev__host_register(int dev, void *ptr, size_t size);
int simdev__host_unregister(int dev, void *ptr);
int simdev__is_pinned(const void *ptr, int *out);
int simdev__device_alloc(int dev, size_t size, void **out);
int simdev__device_free(int dev, void *handle);
/* 1 when [p, p+n) lies inside one pinned block or registered range. */
int simdev__range_pinned(const void *p, size_t n);
/* A reference to the device buffer `handle` of device `dev` with [off, off+n) in bounds;
 * *rw is the copy engine's read-write view of byte `off`.  STOKE_EINVAL (unknown handle or other
 * device) or STOKE_ERANGE (out of bounds).  Release with simdev__dbuf_release. */
typedef struct simdev_dbuf simdev_dbuf;
int simdev__dbuf_acquire(void *handle, int dev, size_t off, size_t n, simdev_dbuf **out,
                         unsigned char **rw);
void simdev__dbuf_release(simdev_dbuf *b);
/* IPC (memory.c): pinned blocks and device buffers are memfd-backed; a handle carries a dup
 * of the memfd and a small blob (simdev_ipc_blob); an import maps the same memfd. */
int simdev__ipc_export(int dev, stoke_ipc_handle *h, void *ptr);
int simdev__ipc_import(int dev, const stoke_ipc_handle *h, void **out);
int simdev__ipc_close(int dev, int kind, void *ptr);
/* Frees every block, range and buffer (shutdown; stream threads already joined). */
void simdev__memory_shutdown(void);

/* stream.c */
int simdev__stream_create(int dev, stoke_backend_stream **out);
int simdev__stream_destroy(stoke_backend_stream *s);
int simdev__stream_synchronize(stoke_backend_stream *s);
int simdev__copy_h2d_async(void *dst, size_t dst_offset, const void *src, size_t n,
                           stoke_backend_stream *s);
int simdev__copy_d2h_async(void *dst, const void *src, size_t src_offset, size_t n,
                           stoke_backend_stream *s);
int simdev__event_create(int dev, stoke_backend_event **out);
int simdev__event_destroy(stoke_backend_event *e);
int simdev__event_record(stoke_backend_event *e, stoke_backend_stream *s);
int simdev__event_query(stoke_backend_event *e);
int simdev__event_synchronize(stoke_backend_event *e);
/* Stops every stream thread (queued copies are canceled, their events fail with
 * STOKE_ECANCELED), joins them and frees every stream and event. */
void simdev__streams_shutdown(void);

#pragma GCC visibility pop

#endif
