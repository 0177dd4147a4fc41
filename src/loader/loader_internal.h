/* Private helpers of the loader layer. */
#ifndef STOKE_LOADER_INTERNAL_H
#define STOKE_LOADER_INTERNAL_H

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "common/internal.h"
#include "stoke/backend.h"
#include "stoke/device.h"
#include "stoke/loader.h"

/* v rounded up to a multiple of a. */
static inline size_t stoke__align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

/* Wait-time histogram: log-linear buckets (8 per power of two), about 6% resolution. */
#define STOKE__HIST_BUCKETS 520
typedef struct stoke__hist {
    uint64_t n;
    uint64_t count[STOKE__HIST_BUCKETS];
} stoke__hist;
void stoke__hist_add(stoke__hist *h, uint64_t ns);
/* Value (ns) at quantile q in [0, 1]; 0 when empty. */
uint64_t stoke__hist_quantile(const stoke__hist *h, double q);

/* ---- the data loader (loader.c, worker.c, transfer.c, state.c, batch.c) ----------------------
 *
 * Locking (docs/loader.md):
 * - `mu` protects every field marked (mu) below: the free lists, the done list, the epoch
 *   position, counters and statistics.  Workers hold it only to take and hand back work, never
 *   while producing samples or copying.
 * - `stream_mu` serializes use of the loader's device stream and of the events recorded on it
 *   (device.h objects are not locked).  Never taken while holding `mu`... except never: the two
 *   are never held together.
 * - The consumer thread alone calls next/set_epoch/restore; batches are released from any thread.
 * - `mu` is taken, released and waited on only through stoke__loader_lock / _unlock / _wait
 *   (below), where the lifecycle check runs in builds that have it.
 */

enum {
    STOKE__ALLOC_PAGEABLE = 0,
    STOKE__ALLOC_POOL = 1,
    STOKE__ALLOC_BACKEND = 2,
    STOKE__ALLOC_ARENA = 3
};

/* A sample that failed while its batch was produced (badsample.c). */
typedef struct stoke__bad {
    uint64_t index;
    uint64_t replacement; /* UINT64_MAX: none */
    int code;
    int action; /* stoke_on_error */
    char msg[STOKE__MSG_MAX];
} stoke__bad;

/* Host memory of one batch. */
typedef struct stoke__slot {
    unsigned char *mem;
    int pinned;
    int idle; /* (mu) its memory was given back on a stopped loader (stoke__loader_free_idle) */
    size_t reg_len;  /* opts.pin_on_use: the bytes from mem registered (stoke_batch_pin), or 0 */
    stoke_event *ev; /* device transfer: completes when the copy out of `mem` did */
    struct stoke__slot *next;
} stoke__slot;

/* Batches of at most this many samples keep their indices in the batch's first cache line. */
#define STOKE__BATCH_INLINE 2

/* ---- the lifecycle of a batch (docs/loader.md, "Batch lifecycle") ---------------------------
 *
 * Every batch is in exactly one state; `state` says which, and the containers and counters of
 * the loader agree with it (stoke__loader_check, check.c, verifies that at every release of
 * `mu` in builds with STOKE_CHECK_INVARIANTS).  Calloc'd batches start FREE.
 *
 * FREE      In free_v[0 .. nfree).  Owner: the holder of `mu`, which writes nothing in it
 *           (dispatch writes seq, k, gen, state and, device mode, host as it takes it).
 * FILLING   In no container; counted in `filling`, and in `outstanding` while b->gen == l->gen
 *           (an older gen: its run was abandoned, and complete recycles it).  Owner: the
 *           producing thread (a worker, or the caller's thread), without `mu`: the first line
 *           but `state`, indices[], offsets[], host->mem, epoch, copied, dev_failed, bad,
 *           err_index, err_msg.  gen, host, next and state change only under `mu`.
 * DONE      On the done list or in the ready ring; counted in `outstanding`.  Owner: the holder
 *           of `mu`: next (the done list), host (complete hands the slot to the copy FIFO),
 *           status, bad and err_* (stoke__bad_account).
 * HELD      The caller's (delivered); counted in `held`.  The caller reads it; the loader
 *           writes only dev_failed, under `mu`.
 * RELEASED  On the `released` stack; still counted in `held`.  stoke_batch_release writes next
 *           and state, without `mu`; then nobody until reclaim takes the stack under `mu`.
 *
 * Transitions, each under `mu` but HELD -> RELEASED: FREE -> FILLING dispatch; FILLING -> DONE
 * complete; FILLING -> FREE complete of an abandoned gen or of an ITERABLE share's empty end;
 * DONE -> HELD next (delivered); DONE -> FREE abandon, a failed batch (batch_error); HELD ->
 * RELEASED stoke_batch_release (any thread, a lock-free push); RELEASED -> FREE reclaim.  In
 * device mode a staging slot is in free_s, in the copy FIFO, or a batch's `host` (FILLING; DONE,
 * HELD, RELEASED when no copy was queued), never two of them. */
enum stoke__batch_state {
    STOKE__B_FREE = 0,
    STOKE__B_FILLING,
    STOKE__B_DONE,
    STOKE__B_HELD,
    STOKE__B_RELEASED
};

/* Laid out by cache line, each batch on lines of its own (stoke__calloc_lines).  The first
 * line holds everything a batch's producer writes and its consumer reads for every batch
 * (with the indices of a batch of one or two samples): handing over a small batch then moves
 * that one line between the cores and back.  The rest is written only when it changes (the
 * epoch, the gen, device flags, bad samples: `if (x != v) x = v`), so those lines stay shared
 * by every core that reads them; but for `next`, which the release of every batch writes, on a
 * line with the error message. */
struct stoke_batch {
    _Alignas(STOKE__LINE) uint64_t seq;
    size_t count;
    size_t bytes;      /* sample bytes in the batch, all fields */
    uint64_t *indices; /* idx_inline when the buffer holds at most STOKE__BATCH_INLINE */
    int status;        /* of producing it */
    int worker;
    unsigned char pinned;
    unsigned char end; /* ITERABLE: the worker's share ended while filling it */
    /* stoke__batch_state (above), set at every transition (stoke__batch_move): on this line,
     * which dispatch (seq) and the producer write for every batch anyway; atomic (relaxed, a
     * plain store) because a release stores it without `mu` while the check reads it */
    _Atomic unsigned char state;
    uint64_t idx_inline[STOKE__BATCH_INLINE];
    /* the second line on */
    stoke_loader *l;
    stoke__slot *host; /* host mode: always this batch's slot; device mode: while filling */
    uint64_t epoch, gen;
    int copied;         /* device mode: the copy was queued */
    int dev_failed;     /* device mode: a wait or read reported a failure (counted once) */
    uint32_t truncated; /* samples with a ragged field cut to max_len */
    int ends_epoch;     /* its error ends the epoch even with opts.errors_go_on (a process
                           worker's restart past its cap: procworker.c, after_crash) */
    struct {
        stoke__bad *v;
        size_t n, cap;
    } bad; /* the producer's, then (mu) the consumer's: bad samples met */
    uint64_t err_index;
    stoke_device_buffer *dbuf;
    stoke_event *ev; /* device mode: the consumer's copy-complete event */
    /* ragged fields: each one's extent, lengths and offsets (stoke__ragged_meta), host memory
     * of the batch's own (not in its buffer: a device mode batch keeps them after its staging
     * slot went back; process workers: in the shared mapping, written by the child) */
    int64_t *rmeta;
    /* On a line of its own: every release writes it (the released stack) from the consumer's
     * thread, and beside epoch and host it took from the producers' caches the line they read
     * for every batch. */
    _Alignas(STOKE__LINE) struct stoke_batch *next;
    char err_msg[STOKE__MSG_MAX];
};

/* ---- sampler.c: a batch's indices at once ----------------------------------------------------
 *
 * stoke_sampler_index derives the epoch's keys on every call.  For a run of positions, derive
 * them once per (seed, epoch) with stoke__sampler_epoch_init, then fill whole batches:
 *
 *     stoke__sampler_epoch ep;                      (per worker, or per batch: about 20 ns)
 *     stoke__sampler_epoch_init(&ep, l->sampler, seed, epoch);
 *     rc = stoke__sampler_fill(l->sampler, &ep, seq * l->o.batch_size, b->count, b->indices);
 *
 * The indices are exactly those of stoke_sampler_index at the same positions, for every kind
 * and distributed setting.  The context is read-only once made: any number of threads may fill
 * from one context at once. */
#define STOKE__FEISTEL_ROUNDS 6

/* A keyed bijection of [0, n) (the one behind stoke_permute), with its round keys derived. */
typedef struct stoke__feistel {
    uint64_t n;    /* the domain; identity when n <= 1 */
    uint64_t mask; /* (1 << half) - 1 */
    unsigned half; /* bits of each half */
    uint64_t rk[STOKE__FEISTEL_ROUNDS];
    /* NULL, or the round function tabulated (stoke__sampler_epoch_tabulate): tab[(i << half) | r] =
     * mix64(r ^ rk[i]) & mask for every round i and every half r.  A pass is then six loads
     * instead of twelve 64-bit multiplies; the images are the same. */
    const uint16_t *tab;
} stoke__feistel;

/* Networks of at most this many bits per half (datasets of up to 2^24 samples) are tabulated by
 * stoke__sampler_epoch_tabulate, into a table of up to STOKE__FEISTEL_TAB_LEN entries (48 KiB:
 * the L2, and the L1 for 2^22 samples or fewer). */
#define STOKE__FEISTEL_TAB_HALF 12
#define STOKE__FEISTEL_TAB_LEN  ((size_t)STOKE__FEISTEL_ROUNDS << STOKE__FEISTEL_TAB_HALF)

typedef struct stoke__sampler_epoch {
    const stoke_sampler *s; /* the sampler it was made for */
    uint64_t seed, epoch;   /* as given (a caller may compare them to decide to remake it) */
    uint64_t key;           /* the key of every random choice in (seed, epoch) */
    stoke__feistel perm;    /* RANDOM, shuffled SUBSET: the epoch order; BLOCK: the full blocks */
    uint64_t tail_slot;     /* BLOCK: where the short last block goes (number of blocks: none) */
} stoke__sampler_epoch;

/* Derives epoch `epoch`'s keys under `seed` for `s` into *e.  STOKE_OK, or STOKE_EINVAL for a
 * NULL argument.  Pure; thread-safe. */
int stoke__sampler_epoch_init(stoke__sampler_epoch *e, const stoke_sampler *s, uint64_t seed,
                              uint64_t epoch);
/* Tabulates e's permutation (RANDOM, shuffled SUBSET, BLOCK) into tab[0 .. len - 1], which
 * must outlive every fill from e: 1 when it did, 0 when e has no permutation, or one of more
 * than STOKE__FEISTEL_TAB_HALF bits per half, or len is short (e is unchanged).  Costs six round
 * functions per entry (24576 for 2^24 samples, about 20 us); a thread that fills many positions
 * of one epoch earns it back in its first few thousand. */
int stoke__sampler_epoch_tabulate(stoke__sampler_epoch *e, uint16_t *tab, size_t len);
/* The dataset indices at positions pos0 .. pos0 + count - 1 into out[0 .. count - 1].  STOKE_OK;
 * STOKE_ERANGE if pos0 + count passes stoke_sampler_length (nothing written); STOKE_EINVAL for
 * s or e NULL, out NULL with count > 0, or e made for another sampler.  No last error is set.
 * Expected O(count) time (O(1) per position: no position needs an earlier one). */
int stoke__sampler_fill(const stoke_sampler *s, const stoke__sampler_epoch *e, uint64_t pos0,
                        size_t count, uint64_t *out);
/* stoke__sampler_fill walks a batch of RANDOM (and shuffled SUBSET) positions together, from a
 * context stoke__sampler_epoch_tabulate filled over the table; from any other context (over 2^24
 * rows) with the multiplies, 16 lanes at a time compiled for AVX2 for a batch of 16 or more when
 * the build and the CPU have it and stoke__feistel_simd is not 0 (tests set it to 0 to compare
 * the walk).  Every way gives the same indices.  stoke__feistel_simd_in_use says whether such a
 * batch takes the AVX2 lanes now. */
extern int stoke__feistel_simd;
int stoke__feistel_simd_in_use(void);

/* The indices a thread computes ahead of its batches (worker.c, look_ahead and
 * batch_indices).  A batch of up to STOKE__AHEAD_RUN samples is not computed alone: its run
 * reaches as far as the batches this thread makes in a row (seq_end), at most STOKE__AHEAD_RUN
 * positions, so that batch size 1 takes its indices from one fill of many positions (the
 * sampler walks a fill's values together) rather than one walk per batch.  One run: the
 * look-ahead for batch seq + 1 comes once batch seq's indices left it (fill_batch).  The
 * epoch's keys are derived once per (seed, epoch), not once per batch, and its permutation
 * tabulated when it is small enough (stoke__sampler_epoch_tabulate).  Each thread has its own
 * (the caller's thread: l->caller.ahead; a process worker: its copy of it). */
#define STOKE__AHEAD_RUN 64
/* Runs filled, by every thread of the process (relaxed; tests count them). */
extern _Atomic uint64_t stoke__ahead_fills;
typedef struct stoke__ahead {
    /* the run: positions pos0 .. pos0 + n - 1 of ep's (seed, epoch) (n 0: empty; emptied when
     * ep is derived again) */
    uint64_t pos0;
    size_t n;
    uint64_t idx[STOKE__AHEAD_RUN];
    uint64_t seq_end;        /* the batches this thread makes in a row end before this seq */
    stoke__sampler_epoch ep; /* the keys of the (seed, epoch) it names (zeroed: none) */
    uint16_t tab[STOKE__FEISTEL_TAB_LEN]; /* ep's round table, when it has one */
    /* The producer's scratch for the dataset's calls (allocated at create): dst[j * nfields +
     * f] the slots, len[j * nfields + f] the ragged lengths (NULL without ragged fields), for
     * up to max(l->cap, STOKE__AHEAD_RUN) samples (a batch, or a group's samples). */
    void **dst;
    int64_t *len;
} stoke__ahead;

/* The fast paths that apply, decided once at create (loader.c, plan_loader: the table). */
typedef struct stoke__plan {
    unsigned group : 1;      /* claims of up to 16 tiny batches per hold of mu */
    unsigned scatter : 1;    /* a group's samples in one read() */
    unsigned assist : 1;     /* the caller's thread makes the batch it needs */
    unsigned help : 1;       /* ... and helps while a worker makes it */
    unsigned hint_next : 1;  /* the next batch's samples named to the dataset */
    unsigned marks : 1;      /* busy marks (stoke__busy): timeout_ms, process workers */
    unsigned caller_all : 1; /* 0 workers: the caller's thread makes every batch */
} stoke__plan;

/* A producer: what makes batches, all through one loop (worker.c, stoke__loader_make_group:
 * claim k >= 1 batches under `mu`, fill them without it, complete them under it) and one fill
 * pipeline (stoke__loader_fill_batch ... finish_batch).  Three kinds, one struct:
 * - a worker thread: l->w[i].p, wid i, w its record (the busy marks the consumer's timeout
 *   reads; ITERABLE: its share);
 * - the caller's thread: l->caller, wid nworkers, w NULL (it times its own samples): every
 *   batch with 0 workers (ITERABLE: the one share, l->w[0]'s), else the batches it assists with
 *   (next.c);
 * - a process worker's child: its copy of l->caller, wid its worker's (procworker.c), filling
 *   the batches its parent's thread claimed for it. */
/* What a producer is loading, where plan.marks says (worker.c, busy_begin): for the consumer's
 * timeout check (next.c, wait_done: it reads `since`, then `index`), and from a process
 * worker's child, in memory it shares with the parent, for the parent to name the sample a
 * crash was on (procworker.c, after_crash). */
#define STOKE__BUSY_INIT 2 /* stoke__busy.in_batch of a worker_init */
typedef struct stoke__busy {
    _Atomic uint64_t index; /* dataset index (UINT64_MAX: an ITERABLE sample) */
    _Atomic uint64_t since; /* start of that dataset call (ns); 0: none in progress */
    _Atomic int in_batch;   /* the call is read() (index: its first sample), or
                               STOKE__BUSY_INIT: the worker thread's worker_init (timed as a
                               sample under timeout_ms) */
    _Atomic int stop;       /* process workers: destroy began, the child starts no batch more */
    _Atomic uint64_t gen;   /* the loader's run (l->gen), written by abandon: a batch of another
                               run stops between two samples (fill_samples), and a process
                               worker's request of another run is answered, not made */
} stoke__busy;

/* Whether a batch of run `gen` is no longer wanted, by the producer's busy marks m: its run was
 * abandoned (a reposition, an error that ended the epoch, destroy: stoke__loader_abandon), or
 * destroy began (a process worker's `stop`).  Read between two samples and before a request. */
static inline int stoke__run_abandoned(stoke__busy *m, uint64_t gen)
{
    return atomic_load_explicit(&m->gen, memory_order_relaxed) != gen ||
           atomic_load_explicit(&m->stop, memory_order_relaxed);
}

typedef struct stoke__producer {
    int wid;                 /* the dataset's worker argument */
    struct stoke__worker *w; /* a worker thread's record (ITERABLE: its share), or NULL */
    stoke__busy *busy;       /* its busy marks: a worker's (a process worker's: its child's,
                                shared), a child's; NULL: the caller's thread */
    uint64_t seed, epoch;    /* of the batches it makes now (dispatch sets them) */
    stoke__ahead ahead;      /* its look-ahead and scratch */
} stoke__producer;

/* Whether batch b, which producer p makes, is no longer wanted (stoke__run_abandoned on p's
 * marks); 0 in the caller's thread, which has no marks: nothing abandons a run while it makes a
 * batch. */
static inline int stoke__producer_abandoned(const stoke__producer *p, const stoke_batch *b)
{
    return p->busy && stoke__run_abandoned(p->busy, b->gen);
}

typedef struct stoke__worker {
    stoke_loader *l;
    stoke__producer p;
    pthread_t th;
    stoke__busy busy; /* a worker thread's marks (p.busy) */
    /* ITERABLE (mu): this worker's next batch number, the number its share ended at
     * (UINT64_MAX: not ended), its batches in flight */
    uint64_t k_next, end_at;
    int outstanding;
    int sleeping; /* (mu) waiting on work_cv, not yet woken by wake_workers */
    int polling;  /* (mu) process workers: waiting on its child, with room for a request */
} stoke__worker;

/* ---- autotune.c: num_workers = auto (docs/loader.md, "Auto workers") ------------------------
 *
 * A hill climb over the number of workers given work (nact): next() reports every delivery
 * (stoke__autotune_delivered); every ~50 ms of them it measures the period and takes one step.
 * All of it runs under `mu`, in the consumer's thread. */
typedef struct stoke__autotune {
    /* the period in progress */
    uint64_t t0, batches, wait_ns, assisted0, helped0, cpu0;
    /* the climb: the last period's batches per ns; the last move (+1, -1, a drop to the floor,
     * 0: none), how long moves are held off after a loss and the hold left; the move that
     * lost last (0: none) */
    double prev_tput;
    int last, backoff, hold, failed;
    /* statistics: the range of nact since create, and how often it changed */
    int lo, hi;
    uint64_t changes;
} stoke__autotune;

/* What one period measured: batches per ns, the share of it the consumer waited, the share of
 * batches the caller's thread made because nobody was making them, the process's share of the
 * CPUs it could use, and `solo` (batches per ns x ns to make one; 0: unknown). */
typedef struct stoke__autotune_period {
    double tput, wait_frac, assisted_frac, cpu_share, solo;
} stoke__autotune_period;

/* create: no period begun, nothing moved; the range starts at `nact`. */
void stoke__autotune_init(stoke__autotune *a, int nact);
/* One step of the climb: the active count for the next period, within [lo, hi], from the
 * current count n and the period p (remembered for the next step's judgement).  Pure apart from
 * *a: tests drive it with made-up periods. */
int stoke__autotune_step(stoke__autotune *a, int n, int lo, int hi,
                         const stoke__autotune_period *p);
/* The part of stoke__autotune_delivered (below the loader's struct) past the count: the clock,
 * and a period's end. */
void stoke__autotune_clock(stoke_loader *l, uint64_t now);

struct stoke_loader {
    /* Immutable after create. */
    stoke_loader_opts o; /* o.device / o.pin_memory_device point at the copies below; o.device
                            set: device mode, every batch is copied to it (transfer.c) */
    char device_spec[64];
    char pin_spec[64];
    stoke_dataset ds;    /* ds.fields points at `fields` */
    stoke_field *fields; /* ds.nfields copies; names in place (one block with the shapes and
                            the four arrays below: copy_fields) */
    size_t *off;         /* where each field starts in a batch buffer */
    size_t *step;        /* each field's bytes per sample (fields[f].bytes, side by side) */
    /* Ragged fields (dataset.h): rg[r] is the r-th's field; rix[f] is f's r, or -1.  Each batch has
     * for each one in b->rmeta: int64 extent (PAD: the padded length L; PACK: the sum), int64
     * lengths[cap], PACK: int64 offsets[cap + 1] (stoke__ragged_meta, worker.c). */
    int *rg;
    int *rix;
    int nragged;
    size_t buf_bytes;    /* one batch buffer */
    int prefetch;        /* batches in flight per worker (prefetch_factor; 2 for auto) */
    stoke__plan plan;    /* the fast paths that apply (loader.c, plan_loader) */
    size_t cap;          /* samples one buffer holds: batch_size, or for MAP at most
                            the samples of one epoch for this rank (at least 1) */
    size_t sample_bytes; /* all fields of one sample */
    stoke_sampler *sampler;
    uint64_t nsamples; /* positions per epoch */
    uint64_t nbatches;
    int nworkers; /* worker threads (num_workers, or the auto count) */
    int ncpu;     /* CPUs this process may run on (affinity), at create */
    int nw1;      /* max(1, nworkers): producers of an ITERABLE dataset */
    int nact_min; /* auto: lowest active count (0 with plan.assist) */
    int iterable; /* dataset kind ITERABLE */
    int window;   /* batches dispatched and not yet delivered, at most */
    int nbuf;
    int alloc_kind;
    const stoke_backend *pin_vt; /* STOKE__ALLOC_BACKEND: batches are pinned for this backend
                                    and pin_dev, not the current ones (stoke__pinned_alloc_on) */
    struct stoke_arena *arena;   /* STOKE__ALLOC_ARENA: the node-wide arena (arena.c) */
    int pin_dev;
    char pin_backend[32]; /* "" when not pinned */
    int pin_lazy;         /* opts.pin_on_use in effect: a slot is registered by stoke_batch_pin
                             (its `pinned` stays 0; reg_len says how far) */
    int pin_failed;       /* (the consumer's) pin_lazy: a registration failed (its code) 64
                             batches before pin_retry_at; none is tried before that */
    uint64_t pin_retry_at;
    stoke_stream *stream;
    stoke_event *read_ev;
    pthread_mutex_t stream_mu;

    stoke_batch *bat;   /* nbuf */
    stoke__slot *slots; /* nbuf */
    stoke__worker *w;   /* nworkers */

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers: work may be available, or quit */
    pthread_cond_t done_cv; /* consumer: a batch completed */
    /* (mu) Free batches: a stack of pointers, the last released on top (its buffer is the one
     * most likely still in a cache).  An array rather than a list through the batches: taking a
     * group of 16 followed 16 `next` pointers, each a cache line last written by the consumer's
     * core. */
    stoke_batch **free_v;
    int nfree;
    /* Released batches not yet back in free_v (stoke_batch_release pushes them here without
     * `mu`, a lock-free stack through `next`; stoke__loader_reclaim moves them, under `mu`, at
     * the next next(), abandon, or wherever free batches are counted).  Until then they count
     * in `held`.  A thread that would sleep for lack of free batches first counts itself in
     * rel_sleepers and reclaims once more; a release that sees rel_sleepers takes `mu` and
     * wakes them (the push and the count are sequentially consistent, so one of the two sees
     * the other). */
    _Atomic(stoke_batch *) released;
    atomic_int rel_sleepers;
    stoke__slot *free_s; /* (mu) device mode */
    /* (mu) device mode: slots whose copy may still run, FIFO */
    stoke__slot *copy_head, *copy_tail;
    stoke_batch *done;       /* (mu) completed, undelivered; FIFO by completion */
    stoke_batch **done_tail; /* (mu) */
    /* (mu) MAP in order: completed batches by seq, ready[seq & ready_mask], instead of the done
     * list (next() takes batch `prefix` without walking past the others: a walk touched one
     * batch's cache line per batch completed out of turn).  The seqs in flight lie in [prefix,
     * prefix + window), fewer than the ring's slots, so no two share one.  NULL otherwise. */
    stoke_batch **ready;
    uint64_t ready_mask;
    uint64_t seed, epoch, gen; /* (mu) */
    uint64_t next_dispatch;    /* (mu) next batch seq to hand out */
    uint64_t start_cursor;     /* (mu) where this run of the epoch started */
    uint64_t ndelivered;       /* (mu) delivered since start_cursor */
    uint64_t prefix;           /* (mu) lowest undelivered seq */
    unsigned char *bits;       /* (mu) in_order == 0: delivered seqs */
    int outstanding;           /* (mu) dispatched, not delivered (this gen) */
    int filling;               /* (mu) batches being produced (any gen) */
    int held;                  /* (mu) delivered, not released */
    int ended;                 /* (mu) EEND until a new epoch */
    int overran;               /* (mu) this epoch ended on a sample past opts.timeout_ms: the
                                  EEND after it does not join the workers (that sample may
                                  never return); the next epoch or destroy does */
    int running;               /* (mu) worker threads started (0 workers: worker_init done) */
    int quit;                  /* (mu) workers must exit */
    int init_failed;           /* (mu) a worker_init failed (status) */
    int init_failed_worker;    /* (mu) the worker whose worker_init failed first */
    int inits_pending;         /* (mu) worker threads whose worker_init has not returned: no
                                  batch is delivered before it is 0 (next.c, next_batch) */
    stoke__producer caller;    /* the caller's thread (and a process worker's child) */
    int quiesce;               /* (mu) set_epoch is waiting for batches in production */
    int nact;                  /* (mu) workers given work: ids below it (= nworkers unless auto) */
    int work_sleepers;         /* (mu) workers waiting on work_cv, not yet woken */
    uint64_t busy_avg;         /* (mu) moving average of the ns one batch takes to make */
    /* Bumped (release) with `mu` held by everything a waiting consumer may be waiting for (a
     * completion, a worker_init failure, a release while a thread sleeps for lack of free
     * batches): the consumer spins on it before sleeping. */
    _Atomic uint64_t events;
    /* Bumped (release) with `mu` held whenever workers might find work: they spin on it. */
    _Atomic uint64_t work_events;
    stoke__autotune autotune; /* (mu) auto: the hill climb over nact (autotune.c) */
    /* statistics (mu): the counts of stoke_loader_stats (get_stats fills in the rest) */
    stoke_loader_stats st;
    uint64_t st_helped;     /* (mu) of st.assisted_batches, those made while a worker made the
                               one needed */
    uint64_t st_work_wakes; /* (mu) broadcasts on work_cv by wake_workers (tests) */
    uint64_t st_wait_ns, st_busy_ns;
    stoke__hist wait_hist;

    char err[1024]; /* consumer only */
    int created;    /* consumer only: create got as far as the pools (destroy stops it) */
    /* stoke_loader_stop ended its work for good (written by the consumer; read by a release,
     * from any thread, which then frees its buffer: stoke__loader_free_idle) */
    _Atomic int stopped;
    int idle_from; /* (mu) free_v[0 .. idle_from) were freed so (nothing pops it once stopped) */
    /* 1: the consumer's last stoke_loader_next ended STOKE_ECANCELED by opts.interrupted
     * (Ctrl-C); 2: stoke_loader_interrupt; either until a stoke_loader_next delivers a batch.
     * Worker processes busy on a batch nobody wants are then killed at once rather than waited
     * for (procworker.c, receive): at destroy; with 2, when their run is abandoned too */
    _Atomic int interrupted;
    /* bad samples (badsample.c), all (mu) */
    stoke_bad_sample *quar; /* the quarantine */
    size_t nquar, quar_cap;
    uint64_t bad_gen;                      /* the gen the per-epoch counts below belong to */
    uint64_t bad_epoch, bad_epoch_samples; /* handled bad samples / delivered samples this run */
    struct stoke__proc *proc; /* worker_mode processes (procworker.c); NULL for threads */
    unsigned fork_gen;        /* stoke__fork_gen() at create */
    int pid;                  /* the process that created it */
    /* STOKE_CHECK_INVARIANTS: the thread holding `mu` (stoke__loader_me), 0 when none; always
     * here, so that the layout does not depend on the build (tests read fields of it) */
    _Atomic uintptr_t mu_owner;
};

/* ---- `mu`, and the lifecycle check (check.c) -------------------------------------------------
 *
 * Every lock, unlock and wait of `mu` in the loader goes through these.  With
 * STOKE_CHECK_INVARIANTS (Debug builds, CMake option STOKE_CHECK_INVARIANTS; the tests' own
 * copy of the loader, tests/CMakeLists.txt) they record the holder, so that functions marked
 * (mu) can assert it, and run stoke__loader_check before every release of `mu` (an unlock or a
 * wait); STOKE__LOADER_ASSERT logs and aborts.  Without it they are the pthread calls and the
 * asserts are nothing: no check code on the hot path. */
#ifdef STOKE_CHECK_INVARIANTS
/* Aborts, after logging every broken invariant, unless l's batches, containers and counters
 * agree (the table above struct stoke_batch).  `mu` held. */
void stoke__loader_check(stoke_loader *l);
/* Checks run, by every loader of the process (relaxed; tests count them). */
extern _Atomic uint64_t stoke__loader_checks;
/* Logs "stoke: loader invariant broken at FILE:LINE: what" to stderr and aborts. */
_Noreturn void stoke__loader_check_failed(const char *file, int line, const char *what);
/* A tag of the calling thread, never 0. */
uintptr_t stoke__loader_me(void);
#define STOKE__LOADER_ASSERT(cond)                                                                 \
    ((cond) ? (void)0 : stoke__loader_check_failed(__FILE__, __LINE__, #cond))
#define STOKE__LOADER_ASSERT_MU(l)                                                                 \
    STOKE__LOADER_ASSERT(atomic_load_explicit(&(l)->mu_owner, memory_order_relaxed) ==             \
                         stoke__loader_me())
#define STOKE__MU_TAKEN(l)                                                                         \
    atomic_store_explicit(&(l)->mu_owner, stoke__loader_me(), memory_order_relaxed)
#define STOKE__MU_RELEASING(l)                                                                     \
    (STOKE__LOADER_ASSERT_MU(l), stoke__loader_check(l),                                           \
     atomic_store_explicit(&(l)->mu_owner, 0, memory_order_relaxed))
#else
#define STOKE__LOADER_ASSERT(cond) ((void)0)
#define STOKE__LOADER_ASSERT_MU(l) ((void)0)
#define STOKE__MU_TAKEN(l)         ((void)0)
#define STOKE__MU_RELEASING(l)     ((void)0)
#endif

/* STOKE_TEST_BREAK_TRANSITION (tests/test_lifecycle.c only): while stoke__test_break is set,
 * delivering a batch skips counting it in `held`, for the check to catch. */
#ifdef STOKE_TEST_BREAK_TRANSITION
extern int stoke__test_break;
#define STOKE__TEST_BROKEN() (stoke__test_break != 0)
#else
#define STOKE__TEST_BROKEN() 0
#endif

static inline void stoke__loader_lock(stoke_loader *l)
{
    pthread_mutex_lock(&l->mu);
    STOKE__MU_TAKEN(l);
}

static inline void stoke__loader_unlock(stoke_loader *l)
{
    STOKE__MU_RELEASING(l);
    pthread_mutex_unlock(&l->mu);
}

/* pthread_cond_wait on `mu` (which it releases meanwhile); until a CLOCK_MONOTONIC time when
 * `until` is not NULL (done_cv's clock). */
static inline void stoke__loader_wait(stoke_loader *l, pthread_cond_t *cv,
                                      const struct timespec *until)
{
    STOKE__MU_RELEASING(l);
    if (until)
        pthread_cond_timedwait(cv, &l->mu, until);
    else
        pthread_cond_wait(cv, &l->mu);
    STOKE__MU_TAKEN(l);
}

/* A transition of b from state `from` to `to` (the table above struct stoke_batch). */
static inline void stoke__batch_move(stoke_batch *b, int from, int to)
{
    STOKE__LOADER_ASSERT(atomic_load_explicit(&b->state, memory_order_relaxed) == from);
    (void)from;
    atomic_store_explicit(&b->state, (unsigned char)to, memory_order_relaxed);
}

/* (mu) Consumer (autotune.c): a batch was delivered after `waited` ns in next(), which read the
 * clock (now) when it waited; 0 when the batch was ready (the clock is then read, for batches
 * under 2 us to make only every 16th delivery).  At a period's end, steps and applies the new
 * count to l->nact (waking workers).  Inline: at batch size 1 a call for each delivery cost
 * about 18 instructions more than the count it makes 15 times in 16. */
static inline void stoke__autotune_delivered(stoke_loader *l, uint64_t now, uint64_t waited)
{
    stoke__autotune *a = &l->autotune;
    a->batches++;
    a->wait_ns += waited;
    if (!now && a->t0 && l->busy_avg < 2000u && (a->batches & 15))
        return;
    stoke__autotune_clock(l, now);
}

/* loader.c: formats the loader's last error into l->err and sets the thread's last error; returns
 * `code`. */
int stoke__loader_fail(stoke_loader *l, int code, const char *fmt, ...) STOKE__PRINTF(3, 4);

/* loader.c: parses and looks up the backend spec "name[:index]" of option `what` ("device",
 * "pin_memory_device").  STOKE_OK; STOKE_EINVAL (malformed) and STOKE_ERANGE (no device of that
 * index) with l->err set; the lookup's STOKE_ENOENT / STOKE_ENODEV with only the thread's last
 * error set (the caller decides whether that is an error or a warning).  *index: -1 if absent. */
int stoke__loader_resolve_spec(stoke_loader *l, const char *what, const char *spec,
                               const stoke_backend **vt, int *index);
/* loader.c: "batch 3 of epoch 0 (sample indices 30..39)" and the like, into buf. */
void stoke__loader_batch_desc(const stoke_loader *l, const stoke_batch *b, char *buf, size_t len);

/* transfer.c */
int stoke__loader_setup_device(stoke_loader *l);
void stoke__loader_copy_batch(stoke_loader *l, stoke_batch *b);
/* (mu) Device mode: b's staging slot, if it has one, leaves b: into the copy FIFO when a copy
 * from it was queued (it is reused once the copy's event completed), else onto free_s. */
void stoke__loader_drop_slot(stoke_loader *l, stoke_batch *b);
/* (mu) Gives b, FILLING, DONE or RELEASED, back to the pools (FREE). */
void stoke__loader_recycle(stoke_loader *l, stoke_batch *b);
/* (mu) Takes back the batches released since the last call (see `released`); wakes workers
 * when none was free.  Returns how many. */
int stoke__loader_reclaim(stoke_loader *l);
/* (mu) Before a thread sleeps: when no batch is free, counts it in rel_sleepers (*counted = 1)
 * and reclaims.  Returns 1 when that freed some (the thread looks again instead of sleeping,
 * uncounted), else 0: it sleeps, then calls stoke__loader_sleep_done(l, *counted). */
int stoke__loader_sleep_begin(stoke_loader *l, int *counted);
void stoke__loader_sleep_done(stoke_loader *l, int counted);
/* (mu) Device mode: a staging slot into b->host (b FILLING); may drop `mu` to wait for an
 * old copy, with the slot already b's. */
void stoke__loader_take_slot(stoke_loader *l, stoke_batch *b);

/* worker.c */
/* Resets b's production fields (status, count for its seq, worker, flags) before producer p
 * makes batch b->seq of p->epoch. */
void stoke__loader_batch_start(stoke_loader *l, stoke_batch *b, const stoke__producer *p);
/* (mu) Whether worker w (NULL: the caller's thread, MAP) may take a batch now. */
int stoke__loader_can_dispatch(const stoke_loader *l, const stoke__worker *w);
/* (mu) Wakes workers waiting for work, if any wait and (unless `force`) the window is half
 * empty. */
void stoke__loader_wake_workers(stoke_loader *l, int force);
/* (mu) Tells a consumer spinning or waiting in next() that something changed. */
void stoke__loader_notify(stoke_loader *l);
/* (mu) The spin before a sleep, for the consumer (on `events`, while a batch is being made)
 * and the workers (on `work_events`, for the consumer to take a batch): when batches take only
 * microseconds (a batch arrives sooner than a sleeping thread wakes up), drops `mu`, spins
 * until *counter changes or twice a batch's average time passed (at most 20 us; the clock read
 * every 32 turns; each turn a pause, or a yield when the loader's threads outnumber the CPUs),
 * takes `mu` again.  The caller decides whether a spin is worth it; after it, it must look at
 * the state again before sleeping (a change made after the spin ended and before `mu` was
 * taken again wakes nobody). */
void stoke__loader_spin(stoke_loader *l, _Atomic uint64_t *counter);
/* (mu) The producer loop's one turn: dispatches a group of batches (at least one: the caller
 * saw one could be), makes them without `mu` and hands them back (no wake-up: a worker signals
 * done_cv after it).  p: a worker thread's producer, or l->caller.
 * Batches of a few microseconds go in groups of up to 16 (worker.c, claim_size), one at a time
 * otherwise.  Returns with `mu` held, the number of batches made. */
int stoke__loader_make_group(stoke_loader *l, stoke__producer *p, uint64_t *clock);
int stoke__loader_start_workers(stoke_loader *l);
/* Consumer, without `mu`: asks the workers to exit and joins them (nothing if none run). */
void stoke__loader_stop_workers(stoke_loader *l);

/* badsample.c: the bad-sample policy (opts.on_error), see docs/loader.md.
 * Returned by stoke__bad_sample when the sample was dropped. */
#define STOKE__BAD_SKIPPED 1
/* Producer: sample `*idx` (dataset index; ITERABLE: as next() gave it) of batch b, slot `slot`,
 * failed with rc / msg.  Records it in b->bad and applies the policy: returns rc (ERROR, or an
 * error no policy handles: ETIMEDOUT, ENOMEM), STOKE__BAD_SKIPPED, or STOKE_OK with the slot
 * refilled from a replacement and *idx set to it (REPLACE).  msg then holds the error. */
int stoke__bad_sample(stoke_loader *l, stoke_batch *b, stoke__producer *p, size_t slot,
                      uint64_t *idx, int rc, char *msg, size_t msg_len);
/* Producer: records the failure of sample idx without a policy (the batch fails). */
void stoke__bad_note(stoke_batch *b, uint64_t idx, int rc, const char *msg);
/* Producer: a new entry at the end of b->bad, or NULL (out of memory: not listed). */
stoke__bad *stoke__bad_append(stoke_batch *b);
/* (mu) Consumer, for each batch taken from the done list: moves b->bad to the quarantine and the
 * counts, and fails a good batch that takes the epoch past the budget. */
void stoke__bad_account(stoke_loader *l, stoke_batch *b);
/* ITERABLE: whether a batch that ends its worker's share is delivered (it has samples, and
 * drop_last does not drop it as short). */
static inline int stoke__loader_iter_keeps(const stoke_loader *l, const stoke_batch *b)
{
    return b->count && !(l->o.drop_last && b->count < l->o.batch_size);
}
/* worker.c: one sample into slot j (see worker.c). */
int stoke__loader_one_sample(stoke_loader *l, stoke_batch *b, stoke__producer *p, size_t j,
                             uint64_t *idx, char *msg, size_t msg_len);

/* A ragged field of the loader (dataset.h): samples are written at the stride of max_len
 * units (a unit: the field's bytes / max_len), lengths recorded per slot, and the batch collated
 * once it is full (worker.c, finish_batch). */
/* The int64 words of ragged field r of batch b, STOKE__RMETA_WORDS apiece in b->rmeta: [0] the
 * extent, [1 .. cap] the lengths, then (PACK) the offsets, cap + 1. */
#define STOKE__RMETA_WORDS(l) (2 + 2 * (l)->cap)
static inline int64_t *stoke__ragged_meta(const stoke_batch *b, int r)
{
    return b->rmeta + (size_t)r * STOKE__RMETA_WORDS(b->l);
}
/* Bytes of field f in batch b (ragged: as collated).  batch.c. */
size_t stoke__batch_field_bytes(const stoke_batch *b, int f);

/* worker.c: batch b failed (status rc, a positive one as STOKE_EDATA) at dataset index or
 * sampler position `where`, with msg (or the code's text when msg is empty); no samples. */
void stoke__batch_failed(stoke_batch *b, int rc, uint64_t where, const char *msg);
/* worker.c: fills batch b->seq of (p->seed, p->epoch) into b->host (b owned by the caller; sets
 * status and errors). */
void stoke__loader_fill_batch(stoke_loader *l, stoke_batch *b, stoke__producer *p);

/* procworker.c: process workers (docs/loader.md, "Process workers"). */
typedef struct stoke__proc stoke__proc;
/* create, after the batch handles and pinning were chosen, before any thread: checks the mode,
 * puts the batch buffers and index arrays in shared memory, forks the zygote.  l->err set on
 * failure. */
int stoke__proc_create(stoke_loader *l);
/* Producer (worker thread p->wid), requests in flight to its child, oldest first, at most
 * prefetch_factor: room for more (room) and how many (in_flight); send: batch b, just
 * dispatched, is filled by the child (what fill_batch does) after the ones before it; take:
 * waits for the oldest's reply and returns its batch, filled (or failed) and copied to the
 * device, with its busy time; NULL when `wakeable` and stoke__proc_wake woke it first.  A child
 * that dies is replaced (on the oldest request: its crash is that batch's; the others are sent
 * again).  wake (mu): wakes the workers waiting in take that could dispatch now. */
int stoke__proc_room(const stoke_loader *l, int wid);
int stoke__proc_in_flight(const stoke_loader *l, int wid);
void stoke__proc_send(stoke_loader *l, stoke_batch *b, stoke__producer *p);
stoke_batch *stoke__proc_take(stoke_loader *l, stoke__producer *p, int wakeable, uint64_t *busy_ns);
void stoke__proc_wake(stoke_loader *l);
/* destroy: before the worker threads are joined (a child stuck in a sample gets SIGKILLed). */
void stoke__proc_stopping(stoke_loader *l);
/* stop and destroy, after the threads were joined: ends and reaps every process (once). */
void stoke__proc_end(stoke_loader *l);
/* stop: the pages of slot s's buffer (a batch not held) go back to the system, where the
 * shared mapping is this loader's own and not registered; the mapping stays. */
void stoke__proc_release_buffer(stoke_loader *l, stoke__slot *s);
/* stoke_batch_pin for a loader with pin_lazy (procworker.c). */
int stoke__proc_pin(stoke_loader *l, stoke_batch *b, size_t nbytes);
/* destroy: stoke__proc_end, then unmaps the buffers. */
void stoke__proc_destroy(stoke_loader *l);
/* Forks (procworker.c): the number of forks this process descends from since the first
 * create (a pthread_atfork child handler counts them and closes every live loader's sockets in
 * the child); whether l was created by another process (forked: this one is a fork of it, l's
 * threads and children are not here; foreign: forked and l has threads, processes, device
 * copies or an arena, so it cannot be used here); that error, STOKE_ESTATE, for the API calls
 * that would wait. */
unsigned stoke__fork_gen(void);
int stoke__loader_forked(const stoke_loader *l);
int stoke__loader_foreign(const stoke_loader *l);
int stoke__loader_forked_fail(stoke_loader *l);
/* loader.c: STOKE_ECANCELED for `call` on a loader stoke_loader_stop ended (l->err says so);
 * the buffers of the batches not held, on a stopped loader, freed (takes `mu`). */
int stoke__loader_stopped_fail(stoke_loader *l, const char *call);
void stoke__loader_free_idle(stoke_loader *l);

/* state.c */
void stoke__loader_abandon(stoke_loader *l);
void stoke__loader_set_position(stoke_loader *l, uint64_t epoch, uint64_t cursor);
int stoke__loader_dataset_epoch(stoke_loader *l, uint64_t epoch);

#endif
