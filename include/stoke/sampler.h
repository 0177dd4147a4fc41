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
 *
 * Distributed (any kind): the epoch's order of L positions is split between `world_size` ranks
 * as PyTorch's DistributedSampler does: without drop_last the order is padded to a multiple of
 * world_size by repeating it from its start; with drop_last it is truncated to a multiple; rank r
 * gets positions r, r + W, r + 2W, ...  Rank and world size come from the options, else from the
 * environment: RANK/WORLD_SIZE (torchrun), then OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE, then
 * SLURM_PROCID/SLURM_NTASKS; else rank 0 of 1.
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
    STOKE_SAMPLER_WEIGHTED = 3
} stoke_sampler_kind;

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
} stoke_sampler_opts;

typedef struct stoke_sampler stoke_sampler;

/* Fills *o with the defaults above.  NULL does nothing. */
STOKE_API void stoke_sampler_opts_init(stoke_sampler_opts *o);

/* Creates a sampler for a dataset of `dataset_len` samples.  STOKE_EINVAL for a bad kind, an
 * index out of range, bad weights, rank >= world size, or a malformed RANK/WORLD_SIZE-style
 * variable (the last error says which).  *out is owned by the caller.  Thread-safe. */
STOKE_API int stoke_sampler_create(const stoke_sampler_opts *o, uint64_t dataset_len,
                                   stoke_sampler **out);
/* Frees it.  NULL does nothing. */
STOKE_API void stoke_sampler_destroy(stoke_sampler *s);

/* Positions per epoch for this rank. */
STOKE_API uint64_t stoke_sampler_length(const stoke_sampler *s);
/* The rank and world size in use (after reading the environment). */
STOKE_API int64_t stoke_sampler_rank(const stoke_sampler *s);
STOKE_API int64_t stoke_sampler_world_size(const stoke_sampler *s);

/* The dataset index at position `pos` (< stoke_sampler_length) of `epoch` under `seed`.
 * STOKE_OK, or STOKE_ERANGE for a position past the end.  Pure and thread-safe: callable from
 * any number of threads at once. */
STOKE_API int stoke_sampler_index(const stoke_sampler *s, uint64_t seed, uint64_t epoch,
                                  uint64_t pos, uint64_t *out);

/* The permutation behind RANDOM: the image of x (< n) under the bijection of [0, n) keyed by
 * `key`.  Exposed for tests and for users building their own samplers.  Thread-safe. */
STOKE_API uint64_t stoke_permute(uint64_t x, uint64_t n, uint64_t key);

#ifdef __cplusplus
}
#endif
#endif
