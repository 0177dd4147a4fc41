/* stoke — samplers: which dataset index comes at each position of an epoch.
 *
 * A sampler is pure configuration: the index at position `pos` of epoch `epoch` is a function of
 * (seed, epoch, pos) only, computed without materializing the order.  That is what makes the
 * order independent of the number of workers and a loader's position three numbers
 * (seed, epoch, cursor) that can be saved and restored in O(1).
 *
 * Kinds:
 * - SEQUENTIAL: 0, 1, ..., N-1.
 * - RANDOM:     a permutation of [0, N) keyed by (seed, epoch): a keyed Feistel network over the
 *               smallest even-bit power of two >= N with cycle walking (a bijection; about two
 *               rounds of walking on average).  A different epoch gives a different order.
 * - SUBSET:     the caller's list of indices, in order, or permuted as RANDOM when `shuffle` is
 *               set (PyTorch's SubsetRandomSampler).
 * - WEIGHTED:   `num_samples` draws with replacement, index i with probability
 *               weights[i] / sum(weights); draw p is a function of (seed, epoch, p).
 * - BLOCK:      block shuffle (FFCV's quasi-random order, WebDataset's shard shuffle), a
 *               permutation of [0, N) keyed by (seed, epoch) that reads nearly sequentially.  The
 *               rows are cut into blocks of `block_rows` consecutive indices (the last one may be
 *               shorter); the epoch visits the blocks in a random order, taken `block_window`
 *               blocks at a time, and mixes the rows of those blocks in random order before
 *               moving to the next window.  So a window of block_window * block_rows positions
 *               holds every row of at most block_window blocks and nothing else, and each block
 *               is read within one window.  A larger window mixes better and touches more memory
 *               at once; block_window >= the number of blocks is a full random permutation (not
 *               the same one as RANDOM).  docs/loader.md, "Sampling order and block shuffle".
 *
 * Distributed (any kind): the epoch's order of L positions is split between `world_size` ranks
 * as PyTorch's DistributedSampler does: without drop_last the order is padded to a multiple of
 * world_size by repeating it from its start; with drop_last it is truncated to a multiple; rank r
 * gets positions r, r + W, r + 2W, ...  Rank and world size come from the options, else from the
 * environment: RANK/WORLD_SIZE (torchrun), then OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, then
 * SLURM_PROCID/SLURM_NTASKS (the first pair with a variable set); else rank 0 of 1.  A
 * variable whose value is not a non-negative integer is ignored with a warning, as if unset.
 *
 * A sampler is immutable after create: every function here is thread-safe.
 */
#ifndef STOKE_SAMPLER_H
#define STOKE_SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoke_sampler_kind {
    STOKE_SAMPLER_SEQUENTIAL = 0,
    STOKE_SAMPLER_RANDOM = 1,
    STOKE_SAMPLER_SUBSET = 2,
    STOKE_SAMPLER_WEIGHTED = 3,
    STOKE_SAMPLER_BLOCK = 4
} stoke_sampler_kind;

/* BLOCK's defaults: 4096 rows per block (1 MiB of 256-byte rows, 12 MiB of 3 KB rows; the
 * sampler does not know a row's size, so pick block_rows for blocks of about 1-4 MiB), and 16
 * blocks mixed together. */
#define STOKE_SAMPLER_BLOCK_ROWS_DEFAULT   4096u
#define STOKE_SAMPLER_BLOCK_WINDOW_DEFAULT 16u

typedef struct stoke_sampler_opts {
    int kind;                /* stoke_sampler_kind; default SEQUENTIAL */
    /* SUBSET: the indices (copied at create; each must be < the dataset length).  Default NULL. */
    const uint64_t *indices;
    size_t num_indices;      /* default 0 */
    int shuffle;             /* SUBSET: visit the subset in random order.  Default 0. */
    /* WEIGHTED: one non-negative weight per dataset index (copied at create; the count must
     * equal the dataset length and the sum must be > 0).  Default NULL. */
    const double *weights;
    size_t num_weights;      /* default 0 */
    uint64_t num_samples;    /* WEIGHTED: draws per epoch; 0 (default) = num_weights */
    /* Distributed sharding. */
    int distributed;         /* 1: shard between ranks; default 0 */
    int64_t rank;            /* -1 (default): from the environment (see above) */
    int64_t world_size;      /* 0 (default): from the environment (see above) */
    int drop_last;           /* distributed: 1 drops the tail instead of padding.  Default 0. */
    /* BLOCK (ignored by the other kinds; new fields go after these).  At most 2^48 each. */
    uint64_t block_rows;     /* rows per block; 0 (default) = STOKE_SAMPLER_BLOCK_ROWS_DEFAULT */
    uint64_t block_window;   /* blocks mixed together; 0 (default) = ..._BLOCK_WINDOW_DEFAULT */
} stoke_sampler_opts;

typedef struct stoke_sampler stoke_sampler;

/* Fills *o with the defaults above.  NULL does nothing.  Thread-safe. */
STOKE_API void stoke_sampler_opts_init(stoke_sampler_opts *o);

/* Creates a sampler for a dataset of `dataset_len` samples.  *o is read only during the call
 * (indices and weights are copied).  Returns STOKE_OK with *out owned by the caller
 * (stoke_sampler_destroy); else *out = NULL and: STOKE_EINVAL for o or out NULL, a bad kind,
 * indices NULL with num_indices > 0, an index out of range, bad weights (NULL, count not the
 * dataset length, dataset length 0, a negative / NaN / huge weight, a sum of 0), BLOCK with
 * block_rows or block_window above 2^48 or a dataset of more than 2^62 rows, rank >= world
 * size (world size 0 included), or only one variable of an environment pair set (the last
 * error says which); STOKE_ENOMEM.  Thread-safe. */
STOKE_API int stoke_sampler_create(const stoke_sampler_opts *o, uint64_t dataset_len,
                                   stoke_sampler **out);
/* Frees it.  NULL does nothing.  No other call on `s` may be in progress. */
STOKE_API void stoke_sampler_destroy(stoke_sampler *s);

/* Positions per epoch for this rank (0 for NULL). */
STOKE_API uint64_t stoke_sampler_length(const stoke_sampler *s);
/* The rank and world size in use (after reading the environment); 0 and 1 for NULL, and when
 * not distributed. */
STOKE_API int64_t stoke_sampler_rank(const stoke_sampler *s);
STOKE_API int64_t stoke_sampler_world_size(const stoke_sampler *s);

/* The dataset index at position `pos` (< stoke_sampler_length) of `epoch` under `seed`, into
 * *out.  STOKE_OK, STOKE_EINVAL for s or out NULL, or STOKE_ERANGE for a position past the end
 * (no last error is set for these).  Pure and thread-safe: callable from any number of threads
 * at once. */
STOKE_API int stoke_sampler_index(const stoke_sampler *s, uint64_t seed, uint64_t epoch,
                                  uint64_t pos, uint64_t *out);

/* The permutation behind RANDOM: the image of x (< n) under the bijection of [0, n) keyed by
 * `key`; x itself when x >= n or n <= 1.  Exposed for tests and for users building their own
 * samplers.  Pure; thread-safe. */
STOKE_API uint64_t stoke_permute(uint64_t x, uint64_t n, uint64_t key);

#ifdef __cplusplus
}
#endif
#endif
