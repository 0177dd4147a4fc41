/* stoke — the data loader: worker threads collate samples straight into batches that sit in
 * memory pinned for the current accelerator, deliver them in order (or as they complete), and
 * optionally copy them to a device asynchronously.  docs/loader.md has the design.
 *
 * Typical use:
 *     stoke_loader_opts o;
 *     stoke_loader_opts_init(&o);
 *     o.batch_size = 256; o.num_workers = 4; o.shuffle = 1; o.seed = 42;
 *     stoke_loader *l;
 *     if (stoke_loader_create(&o, &dataset, &l) != STOKE_OK) ...stoke_last_error()...
 *     for (int epoch = 0; epoch < 10; epoch++, stoke_loader_next_epoch(l)) {
 *         stoke_batch *b;
 *         int rc;
 *         while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
 *             train(stoke_batch_data(b, 0), stoke_batch_count(b));
 *             stoke_batch_release(b);
 *         }
 *         if (rc != STOKE_EEND) ...stoke_loader_last_error(l)...
 *     }
 *     stoke_loader_destroy(l);
 *
 * Dataset kinds (dataset.h): MAP (fixed-size samples written in place), MAP_VAR (one field;
 * fields[0].bytes is the largest sample; samples are packed, see stoke_batch_offsets) and
 * ITERABLE (each worker w of W iterates its own share; worker w's k-th batch is delivered as
 * batch k * max(W, 1) + w, PyTorch's round robin; no samplers, no shuffle, no saved position).
 *
 * Threading: one consumer thread at a time may call the functions taking a stoke_loader
 * (next, set_epoch, state, stats...); batches may be released from any thread.  The loader's
 * own worker threads are named "stoke-w0", "stoke-w1", ...
 */
#ifndef STOKE_LOADER_H
#define STOKE_LOADER_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/dataset.h"
#include "stoke/device.h"
#include "stoke/export.h"
#include "stoke/sampler.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct stoke_loader stoke_loader;
typedef struct stoke_batch stoke_batch;

typedef struct stoke_loader_opts {
    uint32_t size;            /* sizeof(stoke_loader_opts): set by stoke_loader_opts_init */
    size_t batch_size;        /* samples per batch; default 1 */
    int num_workers;          /* worker threads; 0 loads in the caller's thread.  Default 0. */
    int prefetch_factor;      /* batches in flight per worker (at least 1); default 2 */
    int in_order;             /* 1 (default): deliver batches in sampler order; 0: as they
                                 complete */
    int drop_last;            /* 1: drop the last batch when it is partial.  Default 0. */
    int shuffle;              /* 1: random order keyed by (seed, epoch): a SEQUENTIAL sampler
                                 becomes RANDOM, a SUBSET one is visited in random order.
                                 Default 0. */
    uint64_t seed;            /* key of every random choice; default 0 */
    uint64_t epoch;           /* first epoch; default 0 */
    int pin_memory;           /* 1 (default): batches pinned for the current accelerator; with
                                 none, one warning and ordinary memory */
    const char *pin_memory_device; /* NULL (default): the current accelerator.  A backend name
                                      ("simdev", "cuda:1"): pin for it; a warning if it is not
                                      available (then the current accelerator is used); a
                                      warning that it has no effect without pin_memory */
    uint32_t timeout_ms;      /* a sample taking longer ends the epoch with STOKE_ETIMEDOUT; 0
                                 (default): no limit */
    int persistent_workers;   /* 1: keep the worker threads (and their worker_init) across
                                 epochs; 0 (default): start them for every epoch */
    stoke_sampler_opts sampler; /* subset / weighted / distributed; default sequential */
    const char *device;       /* NULL (default): host batches.  "name[:index]": every batch is
                                 also copied asynchronously into a device buffer on that backend
                                 (see stoke_batch_device_buffer); pinning then defaults to that
                                 backend */
} stoke_loader_opts;

/* Fills *o with the defaults documented above.  NULL does nothing. */
STOKE_API void stoke_loader_opts_init(stoke_loader_opts *o);

/* Creates a loader reading `ds`, which must stay valid (and its callbacks callable) until
 * stoke_loader_destroy.  Allocates every batch buffer now (prefetch_factor * max(1, num_workers)
 * + 2 of them, fewer for a short epoch), in the calling thread, pinned as described above;
 * worker threads start at the first stoke_loader_next.
 * Returns STOKE_OK; STOKE_EINVAL (bad option or dataset: the last error says which);
 * STOKE_ENOTSUP (a dataset kind or option not supported); STOKE_ENOMEM; device errors when
 * `device` is set.  *out is owned by the caller.  Thread-safe. */
STOKE_API int stoke_loader_create(const stoke_loader_opts *o, stoke_dataset *ds,
                                  stoke_loader **out);

/* Stops and joins every worker thread (waiting for samples in progress, even one that timed
 * out), waits for pending device copies and frees every buffer.  Batches not yet released become
 * invalid.  Safe at any point of an epoch.  NULL does nothing. */
STOKE_API void stoke_loader_destroy(stoke_loader *l);

/* Delivers the next batch of the current epoch in *out (owned by the caller until
 * stoke_batch_release).  Returns STOKE_OK; STOKE_EEND at the end of the epoch (and again until a
 * new epoch is started); the error of a failing sample (the dataset's code, STOKE_ETIMEDOUT, a
 * device copy error), which ends the epoch — stoke_loader_last_error() then names the worker,
 * the sample index and the message; STOKE_ELIMIT when the caller holds every batch buffer.
 * Consumer thread only. */
STOKE_API int stoke_loader_next(stoke_loader *l, stoke_batch **out);

/* Starts `epoch` from its beginning, abandoning what is left of the current one (batches
 * already delivered stay valid until released): waits for samples in production, then, for an
 * ITERABLE dataset, calls its reset(epoch).  next_epoch is set_epoch(current + 1).
 * STOKE_OK, or the code of a failing reset.  Consumer thread only. */
STOKE_API int stoke_loader_set_epoch(stoke_loader *l, uint64_t epoch);
STOKE_API int stoke_loader_next_epoch(stoke_loader *l);
STOKE_API uint64_t stoke_loader_epoch(const stoke_loader *l);
/* Batches per epoch (for this rank, after drop_last); 0 for an ITERABLE dataset (unknown). */
STOKE_API uint64_t stoke_loader_num_batches(const stoke_loader *l);

/* The position of a loader: constant size, independent of the dataset. */
#define STOKE_LOADER_STATE_VERSION 1
typedef struct stoke_loader_state {
    uint32_t version;  /* STOKE_LOADER_STATE_VERSION */
    uint32_t reserved;
    uint64_t seed;
    uint64_t epoch;
    uint64_t cursor;   /* batches of the epoch delivered (with in_order = 0: the length of the
                          delivered prefix, so a restore may repeat a few batches) */
} stoke_loader_state;

/* Saves the position: a loader restored from it delivers exactly the batches this one would
 * deliver next.  STOKE_OK; STOKE_ENOTSUP for an ITERABLE dataset.  Consumer thread only. */
STOKE_API int stoke_loader_save_state(const stoke_loader *l, stoke_loader_state *out);
/* Moves to a saved position (seed, epoch, cursor), abandoning the current one.  STOKE_EINVAL for
 * a wrong version or a cursor past the epoch's end; STOKE_ENOTSUP for an ITERABLE dataset.
 * Consumer thread only. */
STOKE_API int stoke_loader_restore_state(stoke_loader *l, const stoke_loader_state *st);

typedef struct stoke_loader_stats {
    uint32_t size;             /* set by the caller to sizeof(stoke_loader_stats) */
    uint64_t samples;          /* delivered */
    uint64_t batches;          /* delivered */
    uint64_t bytes;            /* sample bytes delivered (all fields) */
    uint64_t pinned_batches;   /* delivered batches in pinned memory */
    uint64_t pageable_batches; /* delivered batches in ordinary memory */
    uint64_t device_copies;    /* batches copied to the device */
    uint64_t device_bytes;     /* bytes copied to the device */
    double wait_s;             /* total time the consumer waited inside stoke_loader_next */
    double wait_p50_s;         /* median wait of one stoke_loader_next call (within ~7%) */
    double wait_p99_s;         /* 99th percentile */
    double worker_busy_s;      /* time workers spent producing samples, summed over workers */
    uint64_t buffers;          /* batch buffers in the pool */
    uint64_t buffer_bytes;     /* bytes of one batch buffer */
} stoke_loader_stats;

/* Copies the statistics since create into *out (at most out->size bytes).  STOKE_OK;
 * STOKE_EINVAL for NULL or size 0.  Thread-safe. */
STOKE_API int stoke_loader_get_stats(const stoke_loader *l, stoke_loader_stats *out);

/* Detail of the loader's last failure ("worker 2: sample 17 of synthetic: bad row (EDATA)"), or
 * "".  Valid until the next call on the loader.  Consumer thread only. */
STOKE_API const char *stoke_loader_last_error(const stoke_loader *l);

/* Name of the backend batches are pinned for, or NULL when they are not pinned. */
STOKE_API const char *stoke_loader_pinned_backend(const stoke_loader *l);

/* ---- batches: valid from stoke_loader_next until stoke_batch_release ---------------------- */

/* Samples in the batch (batch_size, or fewer for the last one). */
STOKE_API size_t stoke_batch_count(const stoke_batch *b);
/* The dataset index of each sample, count entries. */
STOKE_API const uint64_t *stoke_batch_indices(const stoke_batch *b);
/* Position of the batch in its epoch (0-based) and the epoch. */
STOKE_API uint64_t stoke_batch_seq(const stoke_batch *b);
STOKE_API uint64_t stoke_batch_epoch(const stoke_batch *b);
/* Number of fields (as the dataset's). */
STOKE_API int stoke_batch_num_fields(const stoke_batch *b);
/* Field f of every sample, stacked: count * field bytes, sample i at i * field bytes.  NULL for
 * a bad field, and NULL when device transfer is on (the host copy then goes back to the pool as
 * soon as the device copy completes: use the device buffer). */
STOKE_API void *stoke_batch_data(const stoke_batch *b, int field);
/* Bytes of field f in this batch (count * per-sample bytes; MAP_VAR: the packed bytes); 0 for a
 * bad field. */
STOKE_API size_t stoke_batch_field_bytes(const stoke_batch *b, int field);
/* The field's description (name, dtype, per-sample shape).  NULL for a bad field. */
STOKE_API const stoke_field *stoke_batch_field(const stoke_batch *b, int field);
/* MAP_VAR datasets: the samples are packed back to back in field 0; sample j occupies bytes
 * [offsets[j], offsets[j+1]) (count + 1 entries).  NULL for other dataset kinds. */
STOKE_API const uint64_t *stoke_batch_offsets(const stoke_batch *b);
/* dtype and shape including the batch dimension: shape[0] = count, then the per-sample shape.
 * Returns ndim + 1 (at most STOKE_MAX_DIMS + 1 entries written), or -1 for a bad field. */
STOKE_API int stoke_batch_shape(const stoke_batch *b, int field, int64_t *shape);
STOKE_API int stoke_batch_dtype(const stoke_batch *b, int field);
/* 1 if the batch's host memory is pinned (for device transfer: the staging memory). */
STOKE_API int stoke_batch_is_pinned(const stoke_batch *b);

/* Device transfer (opts.device set); otherwise NULL / 0 / STOKE_ESTATE.
 * The device buffer holding the batch, field f at stoke_batch_device_offset(b, f) (same layout
 * as the host batch).  The copy was queued on the loader's stream; wait for it with
 * stoke_batch_device_wait, or get the event it completes and chain on it.  The buffer and event
 * belong to the batch: valid until stoke_batch_release. */
STOKE_API stoke_device_buffer *stoke_batch_device_buffer(const stoke_batch *b);
STOKE_API size_t stoke_batch_device_offset(const stoke_batch *b, int field);
STOKE_API stoke_event *stoke_batch_device_event(const stoke_batch *b);
/* Blocks until the batch's copy completed; returns the copy's status. */
STOKE_API int stoke_batch_device_wait(stoke_batch *b);
/* Reads field f of the batch back from the device into dst (stoke_batch_field_bytes bytes),
 * synchronously, on the loader's stream.  For checks (stoke load --verify).  Thread-safe with
 * respect to the loader's workers. */
STOKE_API int stoke_batch_device_read(stoke_batch *b, int field, void *dst);

/* Gives the batch back: its buffer returns to the pool (for device transfer, the device buffer;
 * the staging host memory already went back once the copy completed).  NULL does nothing.
 * Any thread. */
STOKE_API void stoke_batch_release(stoke_batch *b);

#ifdef __cplusplus
}
#endif
#endif
