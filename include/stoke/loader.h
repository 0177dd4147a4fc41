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
 * Dataset kinds (dataset.h): MAP (samples written in place, fields of a fixed shape or
 * ragged: stoke_batch_lengths) and ITERABLE (each worker w of W iterates its own share; worker w's
 * k-th batch is delivered as batch k * max(W, 1) + w, PyTorch's round robin; no samplers, no
 * shuffle; a saved position is restored by replaying the epoch: stoke_loader_save_state).
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

/* num_workers = STOKE_LOADER_WORKERS_AUTO: one worker thread per online core, at most
 * STOKE_LOADER_WORKERS_AUTO_MAX; the loader then varies how many of them it gives work to,
 * from measured throughput and the time the consumer waits (docs/loader.md, "Auto workers"), and
 * with a MAP dataset that has no worker_init makes batches in the caller's thread when none is
 * worth it.  An ITERABLE dataset keeps all of them (each has its share).  Order and contents do
 * not depend on the count.  stoke_loader_stats reports the count and its range. */
#define STOKE_LOADER_WORKERS_AUTO     (-2) /* -1 and other negatives stay invalid */
#define STOKE_LOADER_WORKERS_AUTO_MAX 16

/* prefetch_factor = STOKE_LOADER_PREFETCH_AUTO: 2 batches per worker, and for small batches with
 * worker threads and a MAP dataset a deeper reorder window, as many batches as 1 MiB of buffers
 * holds (at most 256): workers are woken once the window is half empty, so tiny batches then
 * cost one wake-up per many batches instead of one every few.  The CLI's and Python's
 * default; an explicit number still wins.  stoke_loader_stats' `buffers` shows the count. */
#define STOKE_LOADER_PREFETCH_AUTO 0

typedef struct stoke_loader_opts {
    uint32_t size;                 /* sizeof(stoke_loader_opts): set by stoke_loader_opts_init */
    size_t batch_size;             /* samples per batch; default 1 */
    int num_workers;               /* worker threads; 0 loads in the caller's thread;
                                      STOKE_LOADER_WORKERS_AUTO: chosen and adapted by the loader
                                      (see below).  Default 0. */
    int prefetch_factor;           /* batches in flight per worker, 1..4096, or
                                      STOKE_LOADER_PREFETCH_AUTO (see above); default 2 */
    int in_order;                  /* 1 (default): deliver batches in sampler order; 0: as they
                                      complete */
    int drop_last;                 /* 1: drop the last batch when it is partial.  Default 0. */
    /* Optional: called about every 100 ms by a stoke_loader_next that waits for workers
     * (without the loader's lock held); nonzero makes that call return STOKE_ECANCELED, the
     * epoch going on (the next call continues it).  A batch the caller's thread makes itself
     * (with workers, threads, a MAP dataset: rather than wait, see docs/loader.md) is finished
     * before the next call; once batches take 50 ms or more on average, the caller's thread no
     * longer makes any while the hook is set.  For a consumer that must see signals while
     * it waits: Python's Ctrl-C.  Until a later call delivers a batch, a stoke_loader_destroy
     * then SIGKILLs worker processes (worker_mode processes) busy on a batch at once, where it
     * otherwise gives each up to 2 s to finish it. */
    int (*interrupted)(void *user);
    void *interrupted_user;
    int round_robin;               /* 1: batch k of an epoch is made by worker k % num_workers
                                      (torch's assignment: a worker's RNG stream gives the same
                                      batches run to run); MAP datasets with num_workers >= 1.
                                      Default 0: the next free worker takes the next batch. */
    int shuffle;                   /* 1: random order keyed by (seed, epoch): a SEQUENTIAL sampler
                                      becomes RANDOM, a SUBSET one is visited in random order.
                                      Default 0. */
    uint64_t seed;                 /* key of every random choice; default 0 */
    uint64_t epoch;                /* first epoch; default 0 */
    int pin_memory;                /* 1 (default): batches pinned for the current accelerator; with
                                      none, one warning and ordinary memory */
    const char *pin_memory_device; /* NULL (default): the current accelerator.  A backend name
                                      ("simdev", "cuda:1"): pin for it; a warning if it is not
                                      available or cannot pin (cpu), then the current
                                      accelerator is used; a warning that it has no effect
                                      without pin_memory.  Not of the form name[:index]:
                                      STOKE_EINVAL at create; an index the backend does not
                                      have: STOKE_ERANGE at create */
    uint32_t timeout_ms;           /* a sample taking longer ends the epoch with STOKE_ETIMEDOUT
                                      (with num_workers >= 1 as soon as the limit passes; with
                                      0, in the caller's thread, once the sample returns); 0
                                      (default): no limit */
    int persistent_workers;        /* 1: keep the worker threads (and their worker_init) across
                                      epochs; 0 (default): start them for every epoch */
    stoke_sampler_opts sampler;    /* subset / weighted / distributed; default sequential */
    const char *device;            /* NULL (default): host batches.  "name[:index]": every batch is
                                      also copied asynchronously into a device buffer on that backend
                                      (see stoke_batch_device_buffer); pinning then defaults to that
                                      backend.  Checked at create (see stoke_loader_create) */
    /* ---- appended: bad samples (docs/loader.md, "Bad samples"); a caller built against the
     * older, shorter struct gets the defaults ---- */
    int on_error;            /* what a sample whose get()/get_var()/next() fails does:
                                STOKE_ON_ERROR_ERROR (default): ends the epoch with its error;
                                _SKIP: dropped from its batch (which gets fewer samples; the
                                others keep their order); _REPLACE: its slot gets a
                                deterministic replacement (see stoke_on_error).  Every bad
                                sample goes to the quarantine (stoke_loader_quarantine) */
    uint64_t max_bad;        /* SKIP / REPLACE budget: bad samples per epoch; one more ends the
                                epoch with its error.  Default UINT64_MAX (no limit) */
    double max_bad_fraction; /* the budget as a share of the epoch's samples (0..1; the
                                budget is the smaller of the two).  Default 1.0 */
    /* ---- appended: process workers (docs/loader.md, "Process workers") ---- */
    int worker_mode; /* STOKE_WORKER_THREADS (default) or STOKE_WORKER_PROCESSES: each
                        worker's samples are loaded in a child process (MAP
                        datasets, num_workers >= 1 or auto; ITERABLE: STOKE_ENOTSUP at
                        create), so a sample that crashes its process fails like a bad
                        sample instead of killing the caller */
    /* ---- appended: the node-wide pinned arena (docs/ipc.md, "Node-wide pinned arena") ---- */
    const char *arena; /* "name[:size]": batch buffers come from the arena `name` shared
                          with the job's other processes (stoke/arena.h) instead of this
                          process's own pinned blocks; name "auto": the job's arena
                          (stoke_arena_default_name).  Without a size the loader attaches
                          to a running arena, or creates one of its own need times
                          $LOCAL_WORLD_SIZE (default 1).  NULL (default): $STOKE_ARENA
                          if set; "": no arena.  Only with pinning for the current
                          accelerator (pin_memory_device or device naming another:
                          STOKE_EINVAL at create) */
    /* ---- appended: the buffers beyond the reorder window (docs/loader.md, "Memory") ---- */
    int held_buffers; /* batches the consumer may hold without stalling a worker, 1..4096;
                         default 2 */
    /* ---- appended: errors that do not end the epoch ---- */
    int errors_go_on; /* 1: a batch whose sample failed (on_error ERROR; a worker process's
                         death) is returned by stoke_loader_next as its error, and the epoch
                         goes on: the next call delivers the next batch, the failed one counted
                         as consumed (torch's DataLoader iterator, for a caller that catches
                         the error); MAP datasets only.  An interrupt (STOKE_ECANCELED), a
                         timeout, the on_error budget's error and more than 100 worker process
                         restarts in the epoch still end it.  Default 0: the error ends the
                         epoch */
    /* ---- appended: buffers pinned as batches use them ---- */
    int pin_on_use; /* 1, with worker_mode processes: the shared batch buffers are not pinned at
                       create; stoke_batch_pin pins the part of its buffer a batch used, which
                       stays pinned for the buffer's later batches (and grows when one uses
                       more).  For buffers sized for the largest batch, of which most batches
                       use a part (the Python drop-in's IterableDataset blocks): pinning a whole
                       buffer pins every page of it, used or not.  No effect where nothing pins
                       (pin_memory 0, no accelerator) or with an arena (pinned already); with
                       worker threads or a device: STOKE_EINVAL at create.  Default 0 */
} stoke_loader_opts;

/* stoke_loader_opts.worker_mode. */
typedef enum stoke_worker_mode {
    STOKE_WORKER_THREADS = 0,
    STOKE_WORKER_PROCESSES = 1
} stoke_worker_mode;

/* stoke_loader_opts.on_error.  REPLACE: sample i's slot gets the first of the candidates
 * mix(seed, i, k) mod length(), k = 0..STOKE_REPLACE_TRIES - 1 (seed: the seed option, not
 * the epoch), that loads; the batch's indices show the replacement.  A function of (seed, i)
 * only: the same whatever the epoch, worker count or order.  None loading is the sample's error.
 * ITERABLE datasets have no indices to replace with: REPLACE drops the sample and reads the
 * next one of the worker's stream, as SKIP does. */
typedef enum stoke_on_error {
    STOKE_ON_ERROR_ERROR = 0,
    STOKE_ON_ERROR_SKIP = 1,
    STOKE_ON_ERROR_REPLACE = 2
} stoke_on_error;
#define STOKE_REPLACE_TRIES 16

/* Parses an on_error spec into o->on_error, o->max_bad and o->max_bad_fraction: "error",
 * "skip", "skip:N" (at most N bad samples per epoch), "skip:P%" (at most P percent of the
 * epoch's samples, P a decimal 0..100), "replace", "replace:N", "replace:P%".  Returns
 * STOKE_OK; STOKE_EINVAL for NULL or a malformed spec (stoke_last_error says why; *o
 * untouched).  Thread-safe (touches only *o). */
STOKE_API int stoke_on_error_parse(const char *spec, stoke_loader_opts *o);

/* Fills *o with the defaults documented above (and o->size).  NULL does nothing.  Thread-safe
 * (touches only *o). */
STOKE_API void stoke_loader_opts_init(stoke_loader_opts *o);

/* Creates a loader reading `ds`.  *o and *ds are copied, and so are the `device` and
 * `pin_memory_device` strings (at most 63 characters each) and the sampler's indices and
 * weights; the caller may free them at once.  The loader does not own the dataset: ds->user
 * and the callbacks must stay valid until stoke_loader_stop or stoke_loader_destroy, and the
 * caller closes the dataset (stoke_dataset_close) after that.
 * Allocates every batch buffer now, in the calling thread, pinned as described above:
 * prefetch_factor * max(1, num_workers) + held_buffers buffers (fewer for a short epoch; more
 * for small batches with STOKE_LOADER_PREFETCH_AUTO), each sized for
 * min(batch_size, samples per epoch for this rank) samples of a MAP dataset (so a
 * huge batch_size over a tiny dataset costs only the dataset's size), batch_size samples of an
 * ITERABLE one.  Worker threads start at the first stoke_loader_next.
 * Returns STOKE_OK with *out set (owned by the caller: stoke_loader_destroy), or an error with
 * *out = NULL and stoke_last_error() saying why:
 * - STOKE_EINVAL: NULL argument, options not initialized (o->size 0 or larger than this
 *   header's struct), batch_size 0, num_workers outside 0..1024 (and not
 *   STOKE_LOADER_WORKERS_AUTO), prefetch_factor outside
 *   1..4096 (and not STOKE_LOADER_PREFETCH_AUTO), held_buffers outside 1..4096, a bad dataset
 *   (size not this library's sizeof(stoke_dataset), unknown kind, no callbacks, no field, a
 *   field without a size or a ragged field without max_len, see stoke_field_finish), shuffle
 *   or a non-sequential / distributed sampler with an ITERABLE dataset, bad sampler options
 *   (see stoke_sampler_create), a `device` or `pin_memory_device` longer than 63 characters or
 *   not of the form name[:index];
 * - STOKE_ERANGE: batch_size so large that a batch of batch_size samples overflows size_t; a
 *   `device` / `pin_memory_device` index the backend does not have ("simdev has 2 device(s),
 *   no device 7");
 * - STOKE_ENOENT / STOKE_ENODEV: `device` names an unknown / unavailable backend (the same for
 *   `pin_memory_device` is only a warning, see the option);
 * - STOKE_EINVAL / STOKE_ENOENT / STOKE_ERANGE: with pin_memory on, STOKE_ACCELERATOR is
 *   invalid (accelerator.h);
 * - STOKE_ENOMEM: the batch buffers would exceed physical memory in all (the message names the
 *   total bytes, num_workers, prefetch_factor and the batch size: nothing was allocated), or an
 *   allocation failed; the pinned allocator's codes when a batch buffer cannot be allocated
 *   (STOKE_ELIMIT, the backend's code, see stoke_pinned_alloc);
 * - when `device` is set: STOKE_ENOTSUP (the backend has no streams, events or device memory,
 *   or a device index other than 0 on a backend that is not the chosen accelerator) and the
 *   backend's errors creating the stream, events and device buffers.
 * Thread-safe (any number of loaders may be created concurrently). */
STOKE_API int stoke_loader_create(const stoke_loader_opts *o, stoke_dataset *ds,
                                  stoke_loader **out);

/* Stops and joins every worker thread (waiting for samples in progress, even one that timed
 * out), waits for pending device copies and frees every buffer and `l` itself.  Batches not yet
 * released become invalid (do not release them afterwards).  Safe at any point of an epoch.
 * Does not close the dataset.  NULL does nothing.  Leaves the calling thread's last error as it
 * was (a failure being reported survives the cleanup).  Call it from the consumer thread, with
 * no other call on `l` or its batches in progress. */
STOKE_API void stoke_loader_destroy(stoke_loader *l);

/* Ends the loader's work for good and keeps what the caller holds: abandons the run, stops and
 * joins the worker threads and ends the worker processes, as stoke_loader_destroy does, so the
 * dataset is never called again (the caller may close it now).  Batches not yet released stay
 * valid, their memory and device copies too, and are released as before.  The buffers of the
 * others go back at once (to the pinned pool, the arena, the system; a process workers' pages,
 * unless their mapping is registered with a backend or is an arena's, which stays whole until
 * destroy), and each held one's at its release (device mode: the device buffers, and every
 * staging buffer once the copies queued are done); stoke_loader_destroy frees the rest.
 * Afterwards stoke_loader_next, set_epoch, next_epoch and restore_state fail with
 * STOKE_ECANCELED; the getters and stats still answer.  For a binding whose batches may outlive
 * the object that owns the dataset (a Python tensor kept after its loader is dropped).  Call it
 * from the consumer thread with no other call on `l` in progress; held batches may be released
 * from other threads meanwhile and after.  A second call, or one in a forked child, does
 * nothing.  Leaves the calling thread's last error as it was.  NULL does nothing. */
STOKE_API void stoke_loader_stop(stoke_loader *l);

/* Marks l interrupted: the caller is ending (a Ctrl-C it saw anywhere, its exit).  Until a
 * stoke_loader_next delivers a batch, worker processes (worker_mode processes) busy on a batch
 * nobody wants are SIGKILLed at once (and replaced when work comes): at stoke_loader_destroy,
 * which otherwise gives each up to 2 s to finish it, and when the run is abandoned
 * (stoke_loader_set_epoch, a seek, an error that ends the epoch), which otherwise waits for
 * their batches.  A replaced child starts afresh (a dataset's worker state, its RNG seeds).
 * While it stands, stoke_loader_set_epoch, next_epoch or restore also stops the worker threads,
 * persistent ones too (started again, worker_init and all, when work comes), so a caller that
 * exits with batches still held leaves no thread.
 * Thread-safe; NULL does nothing. */
STOKE_API void stoke_loader_interrupt(stoke_loader *l);

/* Delivers the next batch of the current epoch in *out (owned by the caller until
 * stoke_batch_release; *out is NULL on any other return).  Starts the worker threads if they
 * are not running.  Returns STOKE_OK; STOKE_EINVAL for NULL arguments; STOKE_EEND at the end
 * of the epoch (and again until a new epoch is started); the error of a failing sample (the
 * dataset's code, a positive one becoming STOKE_EDATA; STOKE_ETIMEDOUT; an error queuing a
 * device copy), which ends the epoch (later calls return STOKE_EEND) —
 * stoke_loader_last_error() then names the worker, the sample index and the message; the code
 * of a failing worker_init (positive: STOKE_EDATA), which ends the epoch with workers (worker
 * threads: before its first batch, whichever worker failed; the message names it) and is
 * retried at the next call without; STOKE_ENOMEM when a worker thread cannot be started;
 * STOKE_ELIMIT when the caller holds every batch buffer (the epoch goes on once one is
 * released).  A device copy that fails after it was queued is reported by
 * stoke_batch_device_wait / _read instead.  Consumer thread only. */
STOKE_API int stoke_loader_next(stoke_loader *l, stoke_batch **out);

/* Starts `epoch` from its beginning, abandoning what is left of the current one (batches
 * already delivered stay valid until released): waits for samples in production, stops the
 * worker threads unless persistent_workers, then, for an ITERABLE dataset, calls its
 * reset(epoch).  Returns STOKE_OK; STOKE_EINVAL for NULL; the code of a failing reset
 * (positive: STOKE_EDATA; stoke_loader_last_error says so; the loader has moved to `epoch`
 * anyway).  Consumer thread only. */
STOKE_API int stoke_loader_set_epoch(stoke_loader *l, uint64_t epoch);

/* stoke_loader_set_epoch(l, stoke_loader_epoch(l) + 1): the same return codes.  Consumer thread
 * only. */
STOKE_API int stoke_loader_next_epoch(stoke_loader *l);

/* The current epoch (the one next() delivers from); 0 for NULL.  Thread-safe. */
STOKE_API uint64_t stoke_loader_epoch(const stoke_loader *l);

/* Batches per epoch (for this rank, after drop_last); 0 for an ITERABLE dataset (unknown) and
 * for NULL.  Constant after create.  Thread-safe. */
STOKE_API uint64_t stoke_loader_num_batches(const stoke_loader *l);

/* The position of a loader: constant size, independent of the dataset. */
#define STOKE_LOADER_STATE_VERSION 1
typedef struct stoke_loader_state {
    uint32_t version; /* STOKE_LOADER_STATE_VERSION */
    uint32_t workers; /* ITERABLE: the saving loader's num_workers + 1; MAP: 0 (unchecked) */
    uint64_t seed;
    uint64_t epoch;
    uint64_t cursor; /* batches of the epoch delivered (with in_order = 0: the length of the
                        delivered prefix, so a restore may repeat a few batches) */
} stoke_loader_state;

/* Saves the position into *out (caller's memory; zeroed first on every return but EINVAL): a
 * loader restored from it delivers exactly the batches this one would deliver next.  ITERABLE
 * datasets: the cursor is the seq after the last batch delivered (batch seq s is worker s %
 * max(1, num_workers)'s); a restore restarts the epoch (set_epoch) and each worker makes its
 * batches below the cursor again and discards them (their samples are read again), so the
 * dataset must give the same samples for the same (epoch, worker, num_workers), and only a
 * loader with the same num_workers may restore it.  Returns STOKE_OK; STOKE_EINVAL for NULL;
 * STOKE_ENOTSUP for an ITERABLE dataset with in_order = 0 once the epoch delivered a batch (the
 * delivered seqs are no prefix).  Consumer thread only. */
STOKE_API int stoke_loader_save_state(const stoke_loader *l, stoke_loader_state *out);

/* Moves to a saved position (seed, epoch, cursor), abandoning the current one; *st is not kept.
 * Returns STOKE_OK; STOKE_EINVAL for NULL, a wrong version, a MAP cursor past the epoch's end,
 * or an ITERABLE state saved with another num_workers (the position is unchanged on these
 * errors).  An ITERABLE skipped batch that fails when made again is delivered as its error (the
 * epoch ends).  The loader's seed becomes st->seed.  Consumer thread only. */
STOKE_API int stoke_loader_restore_state(stoke_loader *l, const stoke_loader_state *st);

/* Counters since create.  "Delivered" means returned by stoke_loader_next with STOKE_OK (what
 * the consumer got), whatever happened to the batch afterwards; so batches = pinned_batches +
 * pageable_batches always, and in device mode device_copies = batches. */
typedef struct stoke_loader_stats {
    uint32_t size;             /* set by the caller to sizeof(stoke_loader_stats) */
    uint64_t samples;          /* samples in delivered batches */
    uint64_t batches;          /* delivered batches */
    uint64_t bytes;            /* sample bytes of delivered batches (all fields) */
    uint64_t pinned_batches;   /* delivered batches whose host memory (device mode: staging
                                  memory) is pinned */
    uint64_t pageable_batches; /* delivered batches in ordinary memory */
    uint64_t device_copies;    /* delivered batches whose copy to the device was queued (device
                                  mode), including any later reported failed (device_errors) */
    uint64_t device_bytes;     /* bytes of those copies */
    double wait_s;             /* total time the consumer waited inside stoke_loader_next: with
                                  workers, from the moment the batch it needs was not there (a
                                  batch that was ready counts 0); with 0 workers, the time
                                  making it */
    double wait_p50_s;         /* median wait of one stoke_loader_next call (within ~7%) */
    double wait_p99_s;         /* 99th percentile */
    double worker_busy_s;      /* time workers spent producing samples, summed over workers */
    uint64_t buffers;          /* batch buffers in the pool */
    uint64_t buffer_bytes;     /* bytes of one batch buffer (sized for
                                  min(batch_size, samples per epoch) samples, see create) */
    uint64_t device_errors;    /* delivered batches whose device copy (or a read back) was
                                  reported failed by stoke_batch_device_wait / _read, each
                                  batch counted once */
    /* ---- appended with num_workers = auto ---- */
    uint64_t workers;            /* worker threads: num_workers, or the auto count */
    uint64_t workers_auto;       /* 1 when num_workers was STOKE_LOADER_WORKERS_AUTO */
    uint64_t workers_active;     /* workers given work now (auto: 0 means the caller's thread
                                    makes the batches); otherwise = workers */
    uint64_t workers_active_min; /* lowest workers_active since create */
    uint64_t workers_active_max; /* highest */
    uint64_t workers_changes;    /* times auto changed workers_active */
    uint64_t assisted_batches;   /* batches the caller's thread made itself inside next()
                                    while workers ran (docs/loader.md, "Hand-off") */
    /* ---- appended: bad samples (opts.on_error) ---- */
    uint64_t bad_samples;      /* samples that failed, counted when their batch reached the
                                  consumer (the one that ended an epoch included) */
    uint64_t skipped_samples;  /* of those, dropped from their batch (SKIP) */
    uint64_t replaced_samples; /* of those, replaced (REPLACE) */
    uint64_t quarantined;      /* entries in the quarantine (at most STOKE_QUARANTINE_MAX) */
    /* ---- appended: process workers ---- */
    uint64_t worker_restarts; /* worker processes that died and were replaced (a crash, a
                                 kill); 0 in thread mode */
    /* ---- appended: ragged fields ---- */
    uint64_t truncated_samples; /* delivered samples a ragged field of which was longer than
                                   its max_len and cut to it (stoke_field.truncate) */
} stoke_loader_stats;

/* worker_mode = STOKE_WORKER_PROCESSES: the process id of worker `worker`'s child process, or -1
 * when it has none now (it is started at its first batch and replaced after it dies), for a
 * worker outside 0 .. workers - 1, in thread mode, and for NULL.  Thread-safe. */
STOKE_API int stoke_loader_worker_pid(const stoke_loader *l, int worker);

/* ---- the quarantine: every bad sample, in the order their batches reached the consumer ----- */
#define STOKE_QUARANTINE_MAX 65536 /* entries kept; later bad samples are only counted */
typedef struct stoke_bad_sample {
    uint64_t index; /* the dataset index that failed */
    uint64_t epoch;
    int code;             /* the dataset's status (negative) */
    int action;           /* stoke_on_error: what was done (ERROR: it ended the epoch) */
    uint64_t replacement; /* REPLACE: the index put in its slot (else UINT64_MAX) */
    char source[256];     /* where: the part of the dataset's message before its first ": "
                             ("npy /data/x.npy", "tar /d/shard-0.tar@1536"), or the dataset's
                             name when the message has none */
    char reason[512];     /* the rest of the message */
} stoke_bad_sample;

/* Copies quarantine entry i (0 .. stats.quarantined - 1) into *out.  Returns STOKE_OK;
 * STOKE_EINVAL for NULL; STOKE_ERANGE for i past the end.  Thread-safe. */
STOKE_API int stoke_loader_quarantine(const stoke_loader *l, size_t i, stoke_bad_sample *out);

/* Copies the statistics since create into *out (at most out->size bytes; out->size is kept, so
 * a caller built against an older, shorter struct gets its prefix).  Returns STOKE_OK;
 * STOKE_EINVAL for NULL or out->size 0.  Thread-safe. */
STOKE_API int stoke_loader_get_stats(const stoke_loader *l, stoke_loader_stats *out);

/* Detail of the loader's last failure, or "" (also for NULL): a failing sample ("worker 2:
 * sample 17 of synthetic: bad row (STOKE_EDATA)"), a failed device copy ("loader: the copy of
 * batch 2 of epoch 0 (sample indices 20..29) to device simdev failed: ..."), a failed create
 * step.  Owned by the loader (a buffer inside it: the pointer is valid until
 * stoke_loader_destroy, its contents change at the next failing call on the loader or its
 * batches); for a failure of stoke_loader_create itself, use stoke_last_error().  Consumer
 * thread only. */
STOKE_API const char *stoke_loader_last_error(const stoke_loader *l);

/* Name of the backend batches are pinned for ("simdev"), or NULL when they are not pinned (no
 * accelerator, pin_memory off, or a backend whose memory turned out not to be pinned).  Owned
 * by the loader, constant after create.  Thread-safe. */
STOKE_API const char *stoke_loader_pinned_backend(const stoke_loader *l);

/* ---- batches ------------------------------------------------------------------------------
 * A stoke_batch is owned by the loader and lent to the caller from stoke_loader_next until
 * stoke_batch_release.  Every getter below takes a batch in that window (NULL is tolerated and
 * gives the stated "bad" value), only reads it, allocates nothing, and is thread-safe: any
 * thread may call them concurrently while the batch is held.  Pointers returned point into the
 * batch and are valid until stoke_batch_release.  `field` is 0 .. num_fields - 1; another value
 * is a "bad field". */

/* Samples in the batch (batch_size, or fewer for the last one); 0 for NULL. */
STOKE_API size_t stoke_batch_count(const stoke_batch *b);
/* The dataset index of each sample, count entries, in delivery order; NULL for NULL. */
STOKE_API const uint64_t *stoke_batch_indices(const stoke_batch *b);
/* Position of the batch in its epoch (0-based); 0 for NULL. */
STOKE_API uint64_t stoke_batch_seq(const stoke_batch *b);
/* The epoch the batch belongs to; 0 for NULL. */
STOKE_API uint64_t stoke_batch_epoch(const stoke_batch *b);
/* Number of fields (as the dataset's); 0 for NULL. */
STOKE_API int stoke_batch_num_fields(const stoke_batch *b);
/* Field f of every sample, stacked: count * field bytes, sample i at i * field bytes (a ragged
 * field: as collated, see below); writable by the holder.  NULL for NULL or a bad field, and NULL
 * when device transfer is on (the host copy then goes back to the pool as soon as the device copy
 * completes: use the device buffer). */
STOKE_API void *stoke_batch_data(const stoke_batch *b, int field);
/* Bytes of field f in this batch (count * per-sample bytes; a ragged field: count * L * unit
 * padded, sum of lengths * unit packed); 0 for NULL or a bad field. */
STOKE_API size_t stoke_batch_field_bytes(const stoke_batch *b, int field);
/* The field's description (name, dtype, per-sample shape), owned by the loader (valid until
 * stoke_loader_destroy).  NULL for NULL or a bad field. */
STOKE_API const stoke_field *stoke_batch_field(const stoke_batch *b, int field);
/* Ragged fields (dataset.h, shape[0] == STOKE_DIM_VAR).  Collated padded (STOKE_COLLATE_PAD):
 * the batch is [count, L, shape[1..]], L the longest length in the batch rounded up to the
 * field's multiple_of (at most max_len), each sample's units beyond its length set to
 * pad_value.  Packed (STOKE_COLLATE_PACK): [sum of lengths, shape[1..]], sample j at units
 * [offsets[j], offsets[j + 1]).  Lengths are after truncation.  Both arrays are host memory
 * owned by the batch (also in device mode, where only the field's data is copied).
 * stoke_batch_lengths: count entries; NULL for a field that is not ragged (or NULL, a bad
 * field).  stoke_batch_offsets: count + 1 entries; NULL unless the field is packed. */
STOKE_API const int64_t *stoke_batch_lengths(const stoke_batch *b, int field);
STOKE_API const int64_t *stoke_batch_offsets(const stoke_batch *b, int field);
/* Dimensions of field f in the batch: the field's ndim + 1 (the batch dimension first), a
 * packed ragged field's ndim; -1 for NULL or a bad field. */
STOKE_API int stoke_batch_ndim(const stoke_batch *b, int field);
/* Writes the batch's shape of field f into shape[0 .. *ndim - 1] (shape[] holds max entries):
 * count first, then the per-sample shape (a ragged field: as above).  Returns STOKE_OK;
 * STOKE_ERANGE when max is below stoke_batch_ndim (*ndim set, shape untouched); STOKE_EINVAL
 * for NULL (b, shape or ndim) or a bad field, with the reason in stoke_last_error() (shape and
 * *ndim untouched). */
STOKE_API int stoke_batch_shape(const stoke_batch *b, int field, int64_t *shape, int max,
                                int *ndim);
/* Writes the field's dtype (STOKE_DTYPE_*) to *dtype.  Returns STOKE_OK; STOKE_EINVAL for NULL
 * (b or dtype) or a bad field, with the reason in stoke_last_error() (*dtype untouched). */
STOKE_API int stoke_batch_dtype(const stoke_batch *b, int field, int *dtype);
/* 1 if the batch's host memory is pinned (for device transfer: the staging memory), else 0
 * (also for NULL). */
STOKE_API int stoke_batch_is_pinned(const stoke_batch *b);
/* A batch of a loader with opts.pin_on_use: pins the first nbytes of its host buffer (every
 * byte its producer wrote, all fields) for the loader's accelerator, unless an earlier batch in
 * the same buffer had them pinned already, and marks the batch pinned (stoke_batch_is_pinned;
 * what a framework's release fence looks at).  Once per batch: the consumer's, on a batch it
 * holds, before any copy from it.  Returns STOKE_OK (also for a batch pinned already, to as many
 * bytes: any loader's pinned batch); STOKE_ENOTSUP when the loader's batches are not pinned (no
 * accelerator, pin_memory 0, STOKE_PINNED=0); STOKE_ERANGE when nbytes exceeds the batch's
 * buffer; STOKE_ESTATE for more bytes of a batch pinned already, and in a forked child; the
 * backend's error when it could not pin them (the batch stays readable, not pinned; the loader
 * then registers nothing further for 64 batches: those that need more fail so at once);
 * STOKE_EINVAL for NULL or nbytes 0.  The reason in stoke_last_error(). */
STOKE_API int stoke_batch_pin(stoke_batch *b, size_t nbytes);

/* Device transfer (opts.device set).  The copy was queued on the loader's stream; wait for it
 * with stoke_batch_device_wait, or get the event it completes and chain on it.  The buffer and
 * event belong to the batch: valid until stoke_batch_release, never to be destroyed by the
 * caller.  Field f is at stoke_batch_device_offset(b, f) (same layout as a host batch). */

/* The device buffer holding the batch; NULL for NULL or without device transfer.  Thread-safe. */
STOKE_API stoke_device_buffer *stoke_batch_device_buffer(const stoke_batch *b);
/* Byte offset of field f in the device buffer (and in a host batch); 0 for NULL or a bad
 * field.  Thread-safe. */
STOKE_API size_t stoke_batch_device_offset(const stoke_batch *b, int field);
/* The event the batch's copy completes; NULL for NULL or without device transfer.  Waiting on
 * or querying it is thread-safe; recording or destroying it is not allowed.  Thread-safe. */
STOKE_API stoke_event *stoke_batch_device_event(const stoke_batch *b);
/* Blocks until the batch's copy completed.  Returns STOKE_OK; STOKE_EINVAL for NULL;
 * STOKE_ESTATE without device transfer; the copy's error (e.g. STOKE_EBACKEND): then
 * stoke_loader_last_error() names the batch (its seq, epoch and sample indices), the device and
 * the backend's message, and the batch counts in stats.device_errors.  May be called again (it
 * returns the same status).  Consumer thread (it sets the loader's last error). */
STOKE_API int stoke_batch_device_wait(stoke_batch *b);
/* Reads field f of the batch back from the device into dst (caller's memory of
 * stoke_batch_field_bytes(b, f) bytes), synchronously, on the loader's stream (serialized with
 * the workers' copies).  For checks (stoke load --verify).  Returns STOKE_OK (also, copying
 * nothing, for a field of 0 bytes); STOKE_EINVAL for NULL (b or dst) or a bad field;
 * STOKE_ESTATE without device transfer; a copy error, reported as by stoke_batch_device_wait.
 * Consumer thread. */
STOKE_API int stoke_batch_device_read(stoke_batch *b, int field, void *dst);

/* Gives the batch back: its buffer returns to the pool (for device transfer, the device buffer;
 * the staging host memory already went back once the copy completed); b is invalid afterwards.
 * Once per delivered batch.  NULL does nothing.  Any thread.  A second release of a batch that
 * was not delivered again since is ignored, logged at ERROR and left as the last error
 * (STOKE_ESTATE); once the loader delivered that buffer again, it is the new batch's release. */
STOKE_API void stoke_batch_release(stoke_batch *b);

#ifdef __cplusplus
}
#endif
#endif
