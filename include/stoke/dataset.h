/* stoke — the dataset interface the loader reads from (version 1).
 *
 * A dataset is a struct of callbacks the application (or a built-in source) fills in, and a
 * list of fields: each sample has nfields fields ("data", "label", ...), each a tensor described
 * by a stoke_field; the loader collates sample i's field f into slot i of field f of the batch,
 * in place (the dataset writes straight into the pinned batch: no intermediate buffer).
 *
 * The design, as a whole (docs/loader.md, "The dataset interface"):
 * - Kinds: MAP (length() samples, read by index) and ITERABLE (next() produces samples until
 *   STOKE_EEND; each worker iterates its own share, sharded by (worker, num_workers) as with
 *   PyTorch's IterableDataset).
 * - Reads: get() writes one sample, the simple form every MAP dataset has; read() (optional)
 *   writes many at once into runs of slots (stoke_slots: a batch is one run), so a source can
 *   keep many reads in flight, merge neighbours or overlap cache misses.  The loader calls read() for a batch, or for a
 *   group of small batches, and falls back to get() per sample to find and handle a bad one.
 * - One epoch notification, set_epoch(); one hint call, hint(), for what the loader knows of
 *   its future accesses (the sampler's pattern, the next samples); fork hooks for datasets that
 *   must prepare for process workers (Python's interpreter); worker_init per worker.
 * - Any number of fields and dimensions (the shapes are pointers, not fixed arrays).
 * - Ragged fields: a field whose first dimension is STOKE_DIM_VAR has a length per sample (text
 *   tokens, audio frames, boxes).  The sample writes up to max_len units and reports its length
 *   in len[f]; the loader collates the batch padded to its longest (pad_value, multiple_of,
 *   truncation at max_len) with the lengths beside it, or packed end to end with offsets
 *   (stoke_batch_lengths, stoke_batch_offsets in loader.h).
 * - The struct carries its size (stoke_dataset_init sets it); the loader refuses a dataset whose
 *   size is not the one it was built with, naming the mismatch.
 *
 * Callbacks are called from worker threads (and processes, with worker_mode processes),
 * concurrently for different samples: get/read/next must be thread-safe for distinct workers.
 * The worker argument is 0..num_workers-1 for the loader's worker threads and num_workers for
 * the caller's thread: with num_workers 0 it makes every batch, and with workers a MAP dataset
 * without worker_init may also get calls from it (the loader makes a batch there when waiting
 * would be slower; docs/loader.md, "Hand-off"), so per-worker state needs num_workers + 1
 * slots.  A callback returns STOKE_OK or a negative code (the loader turns a positive one into
 * STOKE_EDATA), and may write a NUL-terminated message into msg (msg_len bytes) that the loader
 * reports with the sample index and worker.
 *
 * The stoke_dataset struct and its fields belong to the caller.  A loader copies them (fields,
 * names and shapes included) at create but does not take ownership: `user` and the callbacks
 * must stay valid until stoke_loader_stop or stoke_loader_destroy, after which the caller
 * releases the dataset with stoke_dataset_close.
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

/* In a field's shape[0]: the dimension varies per sample (a ragged field). */
#define STOKE_DIM_VAR (-1)

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

/* How a batch holds a ragged field (shape[0] == STOKE_DIM_VAR). */
typedef enum stoke_collate {
    STOKE_COLLATE_PAD = 0, /* [count, L, ...]: L the batch's longest, the rest pad_value */
    STOKE_COLLATE_PACK = 1 /* [sum of lengths, ...]: samples end to end, offsets beside */
} stoke_collate;

/* One field of a sample.  A ragged field (shape[0] == STOKE_DIM_VAR) has a length per sample,
 * at most max_len units of shape[1..ndim-1]; get/read/next write up to max_len units and report
 * the sample's length in len[f].  A longer sample is cut to max_len when `truncate` is set
 * (its true length reported: stoke_loader_stats counts such samples), else it is a bad sample (STOKE_ELIMIT,
 * under opts.on_error).  max_len is required: batch buffers are allocated, and pinned, once at
 * create and cannot grow in the middle of an epoch. */
typedef struct stoke_field {
    char name[64];        /* "data", "label" */
    int dtype;            /* stoke_dtype */
    size_t itemsize;      /* bytes per element */
    int ndim;             /* per-sample dimensions (0: a scalar) */
    const int64_t *shape; /* ndim dimensions (NULL when ndim is 0); shape[0] may be DIM_VAR */
    size_t bytes;         /* bytes per sample = itemsize * prod(shape); ragged: at max_len */
    /* ragged fields only */
    int64_t max_len;     /* the most units of the variable dimension one sample holds */
    int collate;         /* stoke_collate */
    int truncate;        /* 1: a longer sample is cut to max_len; 0: it is a bad sample */
    int64_t multiple_of; /* PAD: the batch's length rounded up to a multiple of it (0: none) */
    double pad_value;    /* PAD: the value past each sample's end (converted to dtype) */
} stoke_field;

typedef enum stoke_dataset_kind {
    STOKE_DATASET_MAP = 0,
    STOKE_DATASET_ITERABLE = 1
} stoke_dataset_kind;

/* What hint() tells a dataset (a hint only: it must not change what get/read deliver). */
typedef enum stoke_hint_kind {
    /* The order the loader will ask for samples in (at create, from the caller's thread, before
     * set_epoch and any read; MAP only): sampler_kind is a stoke_sampler_kind (stoke/sampler.h)
     * as the loader runs it (RANDOM for opts.shuffle); for STOKE_SAMPLER_BLOCK block_rows and
     * block_window are the values in use, else 0.  The npy source reads each block of a block
     * shuffle with large sequential reads the first time an epoch touches it.  A dataset
     * shared by loaders running at once gets each one's hint; the last one counts. */
    STOKE_HINT_ORDER = 0,
    /* Samples the loader will ask for next (MAP, small batches: at most
     * STOKE_DATASET_PREFETCH_MAX samples), from a producer just before it makes the batch
     * before them: the npy source's io=mmap prefetches their rows into the cache.  Must not
     * block or fail; indices may be out of range.  Thread-safety as get(). */
    STOKE_HINT_NEXT = 1
} stoke_hint_kind;

typedef struct stoke_hint {
    int kind;                /* stoke_hint_kind */
    int sampler_kind;        /* ORDER */
    uint64_t block_rows;     /* ORDER */
    uint64_t block_window;   /* ORDER */
    const uint64_t *indices; /* NEXT: count dataset indices */
    size_t count;            /* NEXT */
} stoke_hint;

/* Where a read() writes: the call's samples in runs, each run's slots one after the other.
 * Run r holds samples [start[r], start[r + 1]) of the call; field f of its k-th sample goes to
 * base[r * nfields + f] + k * fields[f].bytes (base NULL: skip that field of the run).  The
 * loader passes one run for a batch (a source can then merge neighbouring rows into one read)
 * and one run per batch for a group of small batches.  len: for ragged fields, sample j's
 * length goes to len[j * nfields + f] (preset to max_len, the room); NULL when no field is
 * ragged. */
typedef struct stoke_slots {
    size_t nruns;
    const size_t *start; /* nruns + 1 entries: start[0] = 0, start[nruns] = count */
    void *const *base;   /* nruns * nfields */
    int64_t *len;
} stoke_slots;

/* The slots of sample j of a read() into dst[0 .. nfields - 1] (NULL for a skipped field), for
 * a read() that works sample by sample.  fields: the dataset's.  Thread-safe. */
STOKE_API void stoke_slots_sample(const stoke_slots *s, int nfields, const stoke_field *fields,
                                  size_t j, void **dst);

/* The largest batch whose next batch is named to the dataset's hint (STOKE_HINT_NEXT). */
#define STOKE_DATASET_PREFETCH_MAX 8

typedef struct stoke_dataset {
    uint32_t size;             /* sizeof(stoke_dataset): set by stoke_dataset_init; checked */
    int kind;                  /* stoke_dataset_kind */
    char name[64];             /* for messages: "npy:/data/train.npy" */
    void *user;                /* passed to every callback */
    int nfields;               /* >= 1 */
    const stoke_field *fields; /* nfields */

    /* MAP: number of samples. */
    uint64_t (*length)(void *user);
    /* MAP: write sample `index` field f into dst[f] (fields[f].bytes bytes each).  len: NULL
     * when no field is ragged; else the sample sets len[f] for each ragged field f (units of
     * its first dimension; the loader preset it to max_len). */
    int (*get)(void *user, uint64_t index, void *const dst[], int64_t len[], int worker, char *msg,
               size_t msg_len);
    /* MAP, optional: write `count` samples at once, sample indices[j] into its slots in *dst
     * (stoke_slots: runs of slots one after the other, so that a source can merge neighbouring
     * indices into one read, and the ragged lengths).  On an error it returns the negative code, writes the message
     * into msg (the loader adds the worker) and the failing sample's dataset index into
     * *err_index; the slots' contents are then unspecified, and the loader calls get() sample by
     * sample to find and handle the bad one (opts.on_error).  get() must still be set.
     * Thread-safety as get(). */
    int (*read)(void *user, const uint64_t *indices, size_t count, const stoke_slots *dst,
                int worker, char *msg, size_t msg_len, uint64_t *err_index);
    /* ITERABLE: write the next sample of this worker's share into dst[f] (len as get()), its
     * index into *index; STOKE_EEND when the share is exhausted. */
    int (*next)(void *user, int worker, int num_workers, void *const dst[], int64_t len[],
                uint64_t *index, char *msg, size_t msg_len);
    /* Optional: called once in each worker thread (or worker process) before its first sample
     * (and for the caller's thread when num_workers is 0, with worker 0). */
    int (*worker_init)(void *user, int worker, int num_workers);
    /* Optional: the epoch about to start.  Called before any sample of an epoch is fetched (at
     * stoke_loader_create for its first epoch, at every stoke_loader_set_epoch/next_epoch and
     * restore), from the caller's thread, while no worker calls get/read/next; in a worker
     * process before its first sample of a new epoch.  A source whose samples depend on the
     * epoch (random augmentation) keeps it; an ITERABLE dataset restarts its iteration.  A
     * negative return fails create (or the epoch change) with that code. */
    int (*set_epoch)(void *user, uint64_t epoch);
    /* Optional: what the loader knows of its coming accesses (stoke_hint_kind). */
    void (*hint)(void *user, const stoke_hint *h);
    /* Optional fork hooks, for worker_mode processes: fork_prepare in the process about to fork
     * (the caller's thread at create for the zygote, the zygote for each worker), then
     * fork_parent there once fork returned, and fork_child in the new process before anything
     * else of the dataset runs there (worker: the worker id, or -1 in the zygote).  As
     * pthread_atfork's three handlers; Python's PyOS_BeforeFork / AfterFork_Parent /
     * AfterFork_Child fit them. */
    void (*fork_prepare)(void *user);
    void (*fork_parent)(void *user);
    void (*fork_child)(void *user, int worker);
    /* Optional: release `user`; called by stoke_dataset_close. */
    void (*close)(void *user);
    /* Optional: where sample `index` (a get()'s index, or one next() returned) comes from, for
     * the loader's own messages about it (a ragged field past its max_len): written into buf
     * as the dataset's messages begin, e.g. "tar /d/shard-3.tar@1536: sample 'a/b07'" --
     * without ": " at the end (the loader terminates buf at n - 1 whatever describe wrote).
     * Returns STOKE_OK, or a negative code (the loader then names the index).  Called from
     * any worker, as get().  Appended in version 2 of this struct (size tag: a dataset built
     * against version 1 is refused, naming the mismatch). */
    int (*describe)(void *user, uint64_t index, char *buf, size_t n);
} stoke_dataset;

/* Zeroes *ds and sets ds->size.  NULL does nothing. */
STOKE_API void stoke_dataset_init(stoke_dataset *ds);
/* Calls ds->close(ds->user) if set and zeroes *ds.  NULL does nothing.  Must not be called while
 * a loader created from the dataset still exists, nor twice concurrently on one dataset. */
STOKE_API void stoke_dataset_close(stoke_dataset *ds);
/* From inside a dataset's get(), read() or next() called by a worker (a thread or a process
 * worker's child): 1 when the batch the call is for is no longer wanted -- its run was abandoned
 * (stoke_loader_set_epoch, next_epoch or restore_state began, or the epoch ended with an error)
 * or the loader is being destroyed; 0 otherwise, outside such a call, and in the caller's thread
 * (num_workers 0: nothing abandons a run while it makes a batch).  A call that takes long (a
 * read() of a whole batch, a batch of Python samples) may ask it between two samples and then
 * return STOKE_ECANCELED: the batch is discarded, with no bad sample counted and nothing read
 * again.  STOKE_ECANCELED returned while the batch is wanted is an interrupt (Ctrl-C in a
 * Python dataset): it ends the epoch with that error, and on_error never skips or replaces it.
 * The loader itself asks it between two get()/next() calls.  Two atomic loads. */
STOKE_API int stoke_dataset_abandoned(void);
/* Fills field->itemsize (from dtype, overwriting it, unless RAW) and field->bytes from dtype,
 * ndim and shape (a 0 dimension gives 0 bytes; a ragged field counts max_len units).  Returns
 * STOKE_OK; STOKE_EINVAL for field NULL, an unknown dtype, RAW with itemsize 0, a negative
 * ndim, shape NULL with ndim > 0, a negative dimension (STOKE_DIM_VAR other than first), a
 * ragged field without max_len >= 1 or with an unknown collate; STOKE_ERANGE when the sample
 * size overflows size_t.  Thread-safe. */
STOKE_API int stoke_field_finish(stoke_field *field);

#ifdef __cplusplus
}
#endif
#endif
