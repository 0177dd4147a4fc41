/* stoke — the dataset interface the loader reads from.
 *
 * A dataset is a struct of callbacks the application (or a built-in source) fills in.  Each
 * sample has up to STOKE_MAX_FIELDS fields ("data", "label"), each a fixed-size tensor described
 * by a stoke_field; the loader stacks sample i's field f into slot i of field f of the batch.
 *
 * Kinds:
 * - STOKE_DATASET_MAP:      length() samples, get(i) writes sample i straight into the batch
 *                           slots it is given (the one-copy path: no intermediate buffer).
 * - STOKE_DATASET_MAP_VAR:  length() samples of variable size (one field, dtype STOKE_DTYPE_RAW):
 *                           get_var(i) returns bytes and length; the loader packs them.
 * - STOKE_DATASET_ITERABLE: next() produces samples until it returns STOKE_EEND.  With several
 *                           workers each worker iterates the dataset itself and must shard it
 *                           by (worker, num_workers), as with PyTorch's IterableDataset.
 *
 * Callbacks are called from worker threads, concurrently for different samples: get/get_var/
 * next must be thread-safe for distinct workers.  The worker argument is 0..num_workers-1 for
 * the loader's worker threads and num_workers for the caller's thread: with num_workers 0 it
 * makes every batch, and with workers a MAP / MAP_VAR dataset without worker_init may also get
 * calls from it (the loader makes a batch there when waiting would be slower; docs/loader.md,
 * "Hand-off"), so per-worker state needs num_workers + 1 slots.  A callback returns STOKE_OK or a negative
 * code (the loader turns a positive one into STOKE_EDATA), and may write a NUL-terminated
 * message into msg (msg_len bytes) that the loader reports with the sample index and worker.
 *
 * The stoke_dataset struct belongs to the caller.  A loader copies it at create but does not
 * take ownership: `user` and the callbacks must stay valid until stoke_loader_destroy, after
 * which the caller releases the dataset with stoke_dataset_close.
 *
 * The functions below are thread-safe: they touch only their arguments.
 */
#ifndef STOKE_DATASET_H
#define STOKE_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

#define STOKE_MAX_FIELDS 4
#define STOKE_MAX_DIMS 8

typedef enum stoke_dtype {
    STOKE_DTYPE_RAW = 0, /* opaque bytes of `itemsize` each */
    STOKE_DTYPE_BOOL,
    STOKE_DTYPE_U8,
    STOKE_DTYPE_I8,
    STOKE_DTYPE_U16,
    STOKE_DTYPE_I16,
    STOKE_DTYPE_U32,
    STOKE_DTYPE_I32,
    STOKE_DTYPE_U64,
    STOKE_DTYPE_I64,
    STOKE_DTYPE_F16,
    STOKE_DTYPE_BF16,
    STOKE_DTYPE_F32,
    STOKE_DTYPE_F64,
    STOKE_DTYPE_C64,
    STOKE_DTYPE_C128
} stoke_dtype;

/* "u8", "f32", ... ("raw" for STOKE_DTYPE_RAW, "unknown" for a value outside stoke_dtype): a
 * static string, never NULL, never to be freed. */
STOKE_API const char *stoke_dtype_name(int dtype);
/* Bytes per element (0 for RAW: use the field's itemsize; 0 for an unknown dtype). */
STOKE_API size_t stoke_dtype_size(int dtype);

/* One field of a sample. */
typedef struct stoke_field {
    char name[16];                 /* "data", "label" */
    int dtype;                     /* stoke_dtype */
    size_t itemsize;               /* bytes per element */
    int ndim;                      /* per-sample dimensions (0: a scalar) */
    int64_t shape[STOKE_MAX_DIMS]; /* per-sample shape */
    size_t bytes;                  /* bytes per sample = itemsize * prod(shape) */
} stoke_field;

typedef enum stoke_dataset_kind {
    STOKE_DATASET_MAP = 0,
    STOKE_DATASET_MAP_VAR = 1,
    STOKE_DATASET_ITERABLE = 2
} stoke_dataset_kind;

typedef struct stoke_dataset {
    uint32_t size;          /* sizeof(stoke_dataset): set by stoke_dataset_init */
    int kind;               /* stoke_dataset_kind */
    char name[64];          /* for messages: "npy:/data/train.npy" */
    void *user;             /* passed to every callback */
    int nfields;            /* 1..STOKE_MAX_FIELDS */
    stoke_field fields[STOKE_MAX_FIELDS];

    /* MAP, MAP_VAR: number of samples. */
    uint64_t (*length)(void *user);
    /* MAP: write sample `index` field f into dst[f] (fields[f].bytes bytes each). */
    int (*get)(void *user, uint64_t index, void *const dst[], int worker, char *msg,
               size_t msg_len);
    /* MAP_VAR: point *data at sample `index` (*len bytes), valid until release_var(*token). */
    int (*get_var)(void *user, uint64_t index, const void **data, size_t *len, void **token,
                   int worker, char *msg, size_t msg_len);
    void (*release_var)(void *user, void *token);
    /* ITERABLE: write the next sample of this worker's share into dst[f], its index into *index;
     * STOKE_EEND when the share is exhausted. */
    int (*next)(void *user, int worker, int num_workers, void *const dst[], uint64_t *index,
                char *msg, size_t msg_len);
    /* Optional: called once in each worker thread before its first sample (and for the caller's
     * thread when num_workers is 0, with worker 0). */
    int (*worker_init)(void *user, int worker, int num_workers);
    /* Optional: ITERABLE only — restart the iteration for a new epoch. */
    int (*reset)(void *user, uint64_t epoch);
    /* Optional: release `user`; called by stoke_dataset_close. */
    void (*close)(void *user);

    /* ---- appended in 0.2; a caller compiled against an older header has a smaller `size`, and
     * the loader then ignores these members (STOKE_DATASET_HAS). ---- */

    /* Optional, MAP only: write `count` samples at once, sample indices[j] into slot j: field f
     * of slot j at (unsigned char *)dst[f] + j * fields[f].bytes (dst[f] NULL: skip field f).
     * The loader calls it once per batch, with the batch's indices in delivery order, instead of
     * get() per sample; a source can then keep many reads in flight (the npy source's io=uring)
     * or merge runs of consecutive indices into one read.  get() must still be set.  On an
     * error it returns the negative code, writes the message into msg (the loader adds the
     * worker) and the failing sample's dataset index into *err_index; the slots' contents are
     * then unspecified.  Thread-safety as get(). */
    int (*get_batch)(void *user, const uint64_t *indices, size_t count, void *const dst[],
                     int worker, char *msg, size_t msg_len, uint64_t *err_index);

    /* Optional, any kind: the epoch about to start.  The loader calls it before any sample of
     * an epoch is fetched (at stoke_loader_create for its first epoch, at every
     * stoke_loader_set_epoch/next_epoch and restore), from the caller's thread, while no worker
     * calls get/get_batch/next; a source whose samples depend on the epoch (random
     * augmentation: the images: source) keeps it for the gets that follow.  A negative return
     * fails create (or the epoch change) with that code.  Appended after 0.2: guard with
     * STOKE_DATASET_HAS(ds, set_epoch). */
    int (*set_epoch)(void *user, uint64_t epoch);

    /* Optional, MAP only: the order the loader will ask for samples in, so a source can read
     * ahead to suit it (the npy source reads each block of a block shuffle with large
     * sequential reads the first time an epoch touches it; docs/loader.md, "Block shuffle
     * reads").  `sampler_kind` is a stoke_sampler_kind (stoke/sampler.h) as the loader runs it
     * (RANDOM for opts.shuffle); for STOKE_SAMPLER_BLOCK, block_rows and block_window are the
     * values in use (defaults resolved), else 0.  The loader calls it once at
     * stoke_loader_create, from the caller's thread, before set_epoch and before any sample is
     * fetched (and not while another loader of the dataset is being created).  A hint only: it
     * must not change what get/get_batch deliver.  A dataset shared by loaders that run at the
     * same time gets each one's hint, the last one counts.  Appended after set_epoch: guard
     * with STOKE_DATASET_HAS(ds, access_hint). */
    void (*access_hint)(void *user, int sampler_kind, uint64_t block_rows, uint64_t block_window);

    /* Optional, MAP only: samples the loader will ask for next, so a source can start moving
     * them towards the CPU (the npy source's io=mmap prefetches their rows into the cache).
     * For small batches (at most STOKE_DATASET_PREFETCH_MAX samples) a thread calls it with
     * the indices of the batch it makes next, just before it makes the current one: the
     * source's own look-ahead within a batch has nothing to look at there (not for a group of
     * them made with one get_scattered call, which names the group's samples).  A hint only: it
     * must not block, fail or change what get/get_batch deliver, and indices may be out of
     * range.  Thread-safety as get().  Appended after access_hint: guard with
     * STOKE_DATASET_HAS(ds, prefetch). */
    void (*prefetch)(void *user, const uint64_t *indices, size_t count);

    /* Optional, MAP only: write `count` samples at once, each into slots of its own: field f
     * of sample j (sample indices[j]) at dst[j * nfields + f] (NULL: skip it).  The loader
     * makes a group of small batches a thread makes in a row (up to 16 batches, at most 64
     * samples: batch size 1, 16 one-sample batches) with one call, so a source does its
     * per-call work once per group and overlaps the rows' cache misses, as within one batch.  The error contract is get_batch's (the
     * loader then makes the group's batches one by one, which names the failing sample and
     * applies on_error).  Thread-safety as get().  Appended after prefetch: guard with
     * STOKE_DATASET_HAS(ds, get_scattered). */
    int (*get_scattered)(void *user, const uint64_t *indices, size_t count, void *const dst[],
                         int worker, char *msg, size_t msg_len, uint64_t *err_index);
} stoke_dataset;

/* The largest batch whose next batch is named to the dataset's prefetch. */
#define STOKE_DATASET_PREFETCH_MAX 8

/* Whether *ds (size set by the header it was compiled with) has member `m`: for the members
 * appended after the first release, e.g. STOKE_DATASET_HAS(ds, get_batch). */
#define STOKE_DATASET_HAS(ds, m)                                                                   \
    ((ds)->size >= offsetof(stoke_dataset, m) + sizeof((ds)->m) && (ds)->m != NULL)

/* Zeroes *ds and sets ds->size.  NULL does nothing. */
STOKE_API void stoke_dataset_init(stoke_dataset *ds);
/* Calls ds->close(ds->user) if set and zeroes *ds.  NULL does nothing.  Must not be called while
 * a loader created from the dataset still exists, nor twice concurrently on one dataset. */
STOKE_API void stoke_dataset_close(stoke_dataset *ds);
/* Fills field->itemsize (from dtype, overwriting it, unless RAW) and field->bytes from dtype,
 * ndim and shape (a 0 dimension gives 0 bytes).  Returns STOKE_OK; STOKE_EINVAL for field NULL,
 * an unknown dtype, RAW with itemsize 0, ndim outside 0..STOKE_MAX_DIMS or a negative
 * dimension; STOKE_ERANGE when the sample size overflows size_t.  Thread-safe. */
STOKE_API int stoke_field_finish(stoke_field *field);

#ifdef __cplusplus
}
#endif
#endif
