/* Samplers: index at (seed, epoch, position), computed without materializing the order. */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/sampler.h"

struct stoke_sampler {
    int kind;
    uint64_t n;        /* dataset length */
    uint64_t base_len; /* positions in the whole (unsharded) epoch order */
    uint64_t *indices; /* SUBSET */
    int shuffle;       /* SUBSET */
    double *cdf;       /* WEIGHTED: running sums, cdf[n-1] = total */
    /* BLOCK: rows per block, blocks per window (at most nblocks), full blocks, rows of the short
     * last block (0: none), blocks in all */
    uint64_t brows, bwin, nfull, tail_rows, nblocks;
    uint64_t rank, world; /* 0 and 1 unless distributed */
    uint64_t len;         /* positions for this rank */
};

/* ---- the keyed Feistel permutation ----------------------------------------------------------- */

/* stoke_permute's network over [0, n) keyed by `key`, derived once. */
static void feistel_init(stoke__feistel *f, uint64_t n, uint64_t key)
{
    /* The domain: the smallest power of two with an even number of bits (at least 2) >= n. */
    unsigned bits = n > 1 ? 64 - (unsigned)__builtin_clzll(n - 1) : 0;
    if (bits & 1)
        bits++;
    if (bits < 2)
        bits = 2;
    f->n = n;
    f->half = bits / 2;
    f->mask = (1ull << f->half) - 1; /* half <= 32 */
    for (int r = 0; r < STOKE__FEISTEL_ROUNDS; r++)
        f->rk[r] = stoke__mix64(key + 0x632be59bd9b4e019ull * (uint64_t)(r + 1));
    f->tab = NULL;
}

/* The rows of f's table, one per round: t[i][r] = the round function of round i at r. */
typedef const uint16_t *feistel_rows[STOKE__FEISTEL_ROUNDS];

static inline void feistel_tab_rows(const stoke__feistel *f, feistel_rows t)
{
    for (int i = 0; i < STOKE__FEISTEL_ROUNDS; i++)
        t[i] = f->tab + ((size_t)i << f->half);
}

/* One pass of a tabulated network: each round's value is the one before last xor the table's at
 * the last (l, r = r, l ^ F(r) written as a chain), so that only two values are live.  In 32
 * bits (a tabulated network has at most STOKE__FEISTEL_TAB_HALF bits per half: values under
 * 2^24), with a pointer to each round's row: a walk over 10^6 rows took 4.7 ns per index in 64
 * bits indexing the table by round, 3.7 so. */
static inline uint32_t feistel_pass_tab(const feistel_rows t, unsigned h, uint32_t m, uint32_t y)
{
    _Static_assert(STOKE__FEISTEL_ROUNDS == 6, "the chain below has six rounds");
    _Static_assert(2 * STOKE__FEISTEL_TAB_HALF <= 32, "tabulated values fit in 32 bits");
    uint32_t a = (y >> h) & m, b = y & m;
    uint32_t c = a ^ t[0][b], d = b ^ t[1][c], e = c ^ t[2][d], g = d ^ t[3][e];
    uint32_t i = e ^ t[4][g], j = g ^ t[5][i];
    return (i << h) | j;
}

/* One pass of the network, its round function computed: twelve 64-bit multiplies. */
static inline uint64_t feistel_pass_mul(const stoke__feistel *f, uint64_t y)
{
    uint64_t l = (y >> f->half) & f->mask, r = y & f->mask;
    for (int i = 0; i < STOKE__FEISTEL_ROUNDS; i++) {
        uint64_t t = l ^ (stoke__mix64(r ^ f->rk[i]) & f->mask);
        l = r;
        r = t;
    }
    return (l << f->half) | r;
}

/* One pass of the network over the power-of-two domain (the caller walks the cycle). */
static inline uint64_t feistel_pass(const stoke__feistel *f, uint64_t y)
{
    if (f->tab) {
        feistel_rows t;
        feistel_tab_rows(f, t);
        return feistel_pass_tab(t, f->half, (uint32_t)f->mask, (uint32_t)y);
    }
    return feistel_pass_mul(f, y);
}

static inline uint64_t feistel_apply(const stoke__feistel *f, uint64_t x)
{
    if (f->n <= 1 || x >= f->n)
        return x;
    uint64_t y = x;
    do /* cycle walking: the domain is < 4n, so a few rounds on average */
        y = feistel_pass(f, y);
    while (y >= f->n);
    return y;
}

/* ---- a batch at once: the cycle walks in sweeps --------------------------------------------- *
 *
 * v[i] = image of v[i] (each < f->n) for i < count.  Every value of a chunk takes one pass; the
 * ones still outside [0, n) are listed and take the next pass together, and so on until none is
 * left.  The passes of one sweep are independent, so the CPU overlaps them (the table's loads,
 * or the network's multiplies), and nothing branches on a value being done: each is written to
 * the list and the count advances only for those outside.  A domain up to 4n, where most values
 * need more than one pass (2.6 on average for n = 10^5), so costs no mispredicted branches, and
 * a domain just above n (10^6 in 2^20) little more than the one pass.  With the table it replaced
 * a plain walk and 4 or 8 register lanes (as fast as the faster of them up to 2^24 rows, or
 * faster over sparse domains); without it, a scalar walk of four values at a time, 16 refilled
 * lanes in the baseline build and eight at a time with AVX-512 (docs/loader.md, "Sampling
 * order").  Fills without a table take the AVX2 lanes below where the CPU has AVX2. */
#define WALK_CHUNK 256

static inline __attribute__((always_inline)) void
feistel_walk_all(const stoke__feistel *f, uint64_t *v, size_t count, const int tabulated)
{
    const uint64_t n = f->n;
    const unsigned h = f->half;
    const uint32_t m = (uint32_t)f->mask;
    feistel_rows t = {0};
    if (tabulated)
        feistel_tab_rows(f, t);
    uint16_t left[WALK_CHUNK]; /* positions in the chunk of the values still outside [0, n) */
    for (size_t c0 = 0; c0 < count; c0 += WALK_CHUNK) {
        uint64_t *w = v + c0;
        size_t len = count - c0 < WALK_CHUNK ? count - c0 : WALK_CHUNK, k = 0;
        for (size_t i = 0; i < len; i++) {
            uint64_t z =
                tabulated ? feistel_pass_tab(t, h, m, (uint32_t)w[i]) : feistel_pass_mul(f, w[i]);
            w[i] = z;
            left[k] = (uint16_t)i;
            k += z >= n;
        }
        while (k) {
            size_t todo = k;
            k = 0;
            for (size_t j = 0; j < todo; j++) {
                size_t i = left[j];
                uint64_t z = tabulated ? feistel_pass_tab(t, h, m, (uint32_t)w[i])
                                       : feistel_pass_mul(f, w[i]);
                w[i] = z;
                left[k] = (uint16_t)i;
                k += z >= n;
            }
        }
    }
}

/* ---- over 2^24 rows, with AVX2: lanes refilled as they finish ------------------------------ *
 *
 * Without a table (a dataset of more than 2^24 rows: see stoke__sampler_epoch_tabulate) a pass is
 * twelve 64-bit multiplies, and on x86-64 with AVX2 FEISTEL_LANES values walk the network
 * together, written round by round across the lanes so that the rounds vectorize (four lanes to
 * a register); a lane whose value reached [0, n) stores it and takes the next input at once
 * (selects, no branch), so no lane waits for the slowest, and the last lanes finish together.
 * The same images as the walk.  Kept when the other vector paths went, because a vector path
 * pays end to end there: over 4 x 10^7 rows, 16-byte rows in batches of 1024, 2 workers, 24.1
 * M/s with the AVX-512 path this replaced against 15.4 with the computed walk alone (process CPU
 * 43 against 57 ns per sample), 256-byte rows in batches of 256 10.7 against 7.9 M/s; these
 * lanes are as fast end to end as AVX-512 was, and run on more CPUs (docs/bench.md, "The
 * sampler cut").  stoke__feistel_simd 0 turns them off (tests). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(STOKE_NO_SIMD)
#define STOKE__FEISTEL_AVX2 1
#define FEISTEL_LANES       16

/* A lane after a pass: its value *y is stored at its position v[*at] (every pass's value is,
 * the final one last); one in [0, n) is done, and the lane takes the next input v[*next] at
 * once.  Selects, no branch. */
static inline __attribute__((always_inline)) void lane_refill(uint64_t *v, uint64_t n, uint64_t *y,
                                                              size_t *at, size_t *next)
{
    uint64_t z = *y, in = v[*next];
    uint64_t done = (uint64_t)0 - (uint64_t)(z < n); /* all ones when in [0, n) */
    v[*at] = z;
    *at = (*next & done) | (*at & ~done);
    *y = (in & done) | (z & ~done);
    *next += done & 1;
}

/* One pass of the network over every lane of y. */
static inline __attribute__((always_inline)) void feistel_pass_lanes(const stoke__feistel *f,
                                                                     uint64_t *y)
{
    uint64_t l[FEISTEL_LANES], r[FEISTEL_LANES];
    const unsigned h = f->half;
    const uint64_t m = f->mask;
    for (int k = 0; k < FEISTEL_LANES; k++) {
        l[k] = (y[k] >> h) & m;
        r[k] = y[k] & m;
    }
    for (int i = 0; i < STOKE__FEISTEL_ROUNDS; i++) {
        const uint64_t rk = f->rk[i];
        for (int k = 0; k < FEISTEL_LANES; k++) {
            uint64_t t = l[k] ^ (stoke__mix64(r[k] ^ rk) & m);
            l[k] = r[k];
            r[k] = t;
        }
    }
    for (int k = 0; k < FEISTEL_LANES; k++)
        y[k] = (l[k] << h) | r[k];
}

/* Every lane of y needs at least one more pass (an input, or a walk not yet in [0, n)): passes
 * together until all are in, then v[at[k]] = y[k] for the first `live` lanes. */
static inline __attribute__((always_inline)) void
feistel_finish_lanes(const stoke__feistel *f, uint64_t *y, const size_t *at, int live, uint64_t *v)
{
    const uint64_t n = f->n;
    feistel_pass_lanes(f, y);
    for (;;) {
        uint64_t out = 0, z[FEISTEL_LANES];
        for (int k = 0; k < FEISTEL_LANES; k++)
            out |= y[k] >= n;
        if (!out)
            break;
        memcpy(z, y, sizeof(z));
        feistel_pass_lanes(f, z);
        for (int k = 0; k < FEISTEL_LANES; k++)
            y[k] = y[k] >= n ? z[k] : y[k];
    }
    for (int k = 0; k < live; k++)
        v[at[k]] = y[k];
}

/* v[i] = image of v[i] for i < count (count >= FEISTEL_LANES, each v[i] < f->n > 1). */
static inline __attribute__((always_inline)) void feistel_lanes_body(const stoke__feistel *f,
                                                                     uint64_t *v, size_t count)
{
    const uint64_t n = f->n;
    uint64_t y[FEISTEL_LANES];
    size_t at[FEISTEL_LANES], next = 0;
    if (count >= 2 * FEISTEL_LANES) {
        for (int k = 0; k < FEISTEL_LANES; k++) {
            y[k] = v[k];
            at[k] = (size_t)k;
        }
        next = FEISTEL_LANES;
        /* Each sweep takes at most FEISTEL_LANES inputs: v[next] is in range throughout.  A
         * lane stores every pass's value at its own position (its input is already in y, and
         * the final value overwrites it). */
        while (next + FEISTEL_LANES <= count) {
            feistel_pass_lanes(f, y);
            for (int k = 0; k < FEISTEL_LANES; k++)
                lane_refill(v, n, &y[k], &at[k], &next);
        }
        feistel_finish_lanes(f, y, at, FEISTEL_LANES, v);
    }
    /* what is left (fewer than 2 x FEISTEL_LANES), a group of lanes at a time; spare lanes walk
     * copies of the group's first value, which costs no extra pass */
    while (next < count) {
        int live = count - next < FEISTEL_LANES ? (int)(count - next) : FEISTEL_LANES;
        for (int k = 0; k < FEISTEL_LANES; k++) {
            at[k] = next + (size_t)(k < live ? k : 0);
            y[k] = v[at[k]];
        }
        feistel_finish_lanes(f, y, at, live, v);
        next += (size_t)live;
    }
}

__attribute__((target("avx2"))) static void feistel_apply_all_avx2(const stoke__feistel *f,
                                                                   uint64_t *v, size_t count)
{
    feistel_lanes_body(f, v, count);
}
#endif

int stoke__feistel_simd = 1;

/* 1 when this build has the AVX2 lanes, the CPU has AVX2 (libgcc asks it once, when the library
 * is loaded) and stoke__feistel_simd is not 0. */
int stoke__feistel_simd_in_use(void)
{
#ifdef STOKE__FEISTEL_AVX2
    return __atomic_load_n(&stoke__feistel_simd, __ATOMIC_RELAXED) > 0 &&
           __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

static void feistel_apply_all(const stoke__feistel *f, uint64_t *v, size_t count)
{
    if (f->n <= 1)
        return;
    if (f->tab)
        feistel_walk_all(f, v, count, 1);
#ifdef STOKE__FEISTEL_AVX2
    else if (count >= FEISTEL_LANES && stoke__feistel_simd_in_use())
        feistel_apply_all_avx2(f, v, count);
#endif
    else
        feistel_walk_all(f, v, count, 0);
}

uint64_t stoke_permute(uint64_t x, uint64_t n, uint64_t key)
{
    stoke__feistel f;
    feistel_init(&f, n, key);
    return feistel_apply(&f, x);
}

void stoke_sampler_opts_init(stoke_sampler_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->kind = STOKE_SAMPLER_SEQUENTIAL;
    o->rank = -1;
}

#define BLOCK_MAX_PARAM (1ull << 48)
#define BLOCK_MAX_LEN   (1ull << 62)

/* The kind's state and this rank's share of the epoch, checked, into the zeroed s. */
static int sampler_setup(stoke_sampler *s, const stoke_sampler_opts *o, uint64_t dataset_len)
{
    s->kind = o->kind;
    s->n = dataset_len;
    switch (o->kind) {
    case STOKE_SAMPLER_SEQUENTIAL:
    case STOKE_SAMPLER_RANDOM: s->base_len = dataset_len; break;
    case STOKE_SAMPLER_SUBSET:
        if (o->num_indices && !o->indices)
            return stoke__fail(STOKE_EINVAL, "subset sampler: indices is NULL");
        s->indices = malloc((o->num_indices ? o->num_indices : 1) * sizeof(uint64_t));
        if (!s->indices)
            return STOKE_ENOMEM;
        for (size_t i = 0; i < o->num_indices; i++) {
            if (o->indices[i] >= dataset_len)
                return stoke__fail(STOKE_EINVAL,
                                   "subset sampler: index %" PRIu64 " (entry %zu) is out of range "
                                   "for a dataset of %" PRIu64 " samples",
                                   o->indices[i], i, dataset_len);
            s->indices[i] = o->indices[i];
        }
        s->shuffle = o->shuffle ? 1 : 0;
        s->base_len = o->num_indices;
        break;
    case STOKE_SAMPLER_WEIGHTED: {
        if (!o->weights || o->num_weights != dataset_len || dataset_len == 0)
            return stoke__fail(STOKE_EINVAL,
                               "weighted sampler: need one weight per sample (%zu weights for "
                               "%" PRIu64 " samples)",
                               o->weights ? o->num_weights : 0, dataset_len);
        if (!(s->cdf = malloc(o->num_weights * sizeof(double))))
            return STOKE_ENOMEM;
        double sum = 0;
        for (size_t i = 0; i < o->num_weights; i++) {
            double w = o->weights[i];
            if (!(w >= 0) || w > 1e300) /* also rejects NaN */
                return stoke__fail(STOKE_EINVAL,
                                   "weighted sampler: weight %zu is not a finite "
                                   "non-negative number",
                                   i);
            sum += w;
            s->cdf[i] = sum;
        }
        if (!(sum > 0))
            return stoke__fail(STOKE_EINVAL, "weighted sampler: the weights sum to 0");
        s->base_len = o->num_samples ? o->num_samples : o->num_weights;
        break;
    }
    case STOKE_SAMPLER_BLOCK: {
        /* the block geometry: with block_rows and block_window <= 2^48 and at most 2^62 rows, no
         * product below (slot * rows, window * blocks * rows) can overflow */
        uint64_t rows = o->block_rows ? o->block_rows : STOKE_SAMPLER_BLOCK_ROWS_DEFAULT;
        uint64_t win = o->block_window ? o->block_window : STOKE_SAMPLER_BLOCK_WINDOW_DEFAULT;
        if (rows > BLOCK_MAX_PARAM || win > BLOCK_MAX_PARAM)
            return stoke__fail(STOKE_EINVAL,
                               "block sampler: block_rows (%" PRIu64 ") and block_window (%" PRIu64
                               ") must be at most 2^48",
                               rows, win);
        if (dataset_len > BLOCK_MAX_LEN)
            return stoke__fail(STOKE_EINVAL,
                               "block sampler: a dataset of %" PRIu64 " rows is over 2^62",
                               dataset_len);
        if (dataset_len && rows > dataset_len)
            rows = dataset_len; /* one block, the same order */
        s->brows = rows;
        s->nfull = dataset_len / rows;
        s->tail_rows = dataset_len % rows;
        s->nblocks = s->nfull + (s->tail_rows != 0);
        s->bwin = win < s->nblocks ? win : (s->nblocks ? s->nblocks : 1);
        s->base_len = dataset_len;
        break;
    }
    default: return stoke__fail(STOKE_EINVAL, "sampler: unknown kind %d", o->kind);
    }
    s->rank = 0;
    s->world = 1;
    s->len = s->base_len;
    if (!o->distributed)
        return STOKE_OK;
    uint64_t er = 0, ew = 1;
    int from_env = 0;
    if (o->rank < 0 || o->world_size <= 0) {
        from_env = stoke__env_dist("distributed sampler", &er, &ew);
        if (from_env < 0)
            return from_env;
        static atomic_int said; /* (once a process: every loader of a run would say it) */
        if (!from_env && o->rank < 0 && o->world_size <= 0 && !atomic_exchange(&said, 1))
            stoke__log(STOKE_LOG_WARN,
                       "distributed sampler: no rank and world size were given, nor found in "
                       "the environment (RANK/WORLD_SIZE, Open MPI, Slurm): rank 0 of 1, this "
                       "process loads the whole dataset");
    }
    s->rank = o->rank >= 0 ? (uint64_t)o->rank : er;
    s->world = o->world_size > 0 ? (uint64_t)o->world_size : ew;
    if (s->world == 0 || s->rank >= s->world)
        return stoke__fail(STOKE_EINVAL,
                           "distributed sampler: rank %" PRIu64 " is not below world size %" PRIu64
                           "%s",
                           s->rank, s->world, from_env ? " (from the environment)" : "");
    /* (base_len + world - 1) / world without the sum, which a world near 2^64 overflowed */
    s->len = s->base_len / s->world + (!o->drop_last && s->base_len % s->world != 0);
    return STOKE_OK;
}

int stoke_sampler_create(const stoke_sampler_opts *o, uint64_t dataset_len, stoke_sampler **out)
{
    if (!o || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_sampler_create: NULL argument");
    *out = NULL;
    stoke_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return STOKE_ENOMEM;
    int rc = sampler_setup(s, o, dataset_len);
    if (rc != STOKE_OK) {
        stoke_sampler_destroy(s);
        return rc;
    }
    *out = s;
    return STOKE_OK;
}

void stoke_sampler_destroy(stoke_sampler *s)
{
    if (!s)
        return;
    free(s->indices);
    free(s->cdf);
    free(s);
}

uint64_t stoke_sampler_length(const stoke_sampler *s)
{
    return s ? s->len : 0;
}

int64_t stoke_sampler_rank(const stoke_sampler *s)
{
    return s ? (int64_t)s->rank : 0;
}

int64_t stoke_sampler_world_size(const stoke_sampler *s)
{
    return s ? (int64_t)s->world : 1;
}

/* WEIGHTED: draw g of the epoch keyed by `key`. */
static inline uint64_t weighted_draw(const stoke_sampler *s, uint64_t key, uint64_t g)
{
    double total = s->cdf[s->n - 1];
    double u = (double)(stoke__mix64(key ^ stoke__mix64(g)) >> 11) * 0x1.0p-53 * total;
    uint64_t lo = 0, hi = s->n - 1; /* first i with cdf[i] > u */
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (s->cdf[mid] > u)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

/* ---- block shuffle ------------------------------------------------------------------------------
 *
 * B rows per block; F full blocks and, when B does not divide N, a short block of T rows (block
 * id F); K blocks in all.  The epoch's order is K slots: the short block sits at slot t (drawn
 * from the key), the full blocks fill the other slots in the order of a Feistel permutation of
 * [0, F).  Slots are grouped by W into windows; window w's positions are its slots' rows, mixed
 * by a Feistel permutation of the window's size keyed by (key, w).  Every position maps to its
 * index in O(1): the short block shifts the start of later slots by B - T, nothing else. */

/* The window the mapper is in, with what it derived for it. */
typedef struct block_window {
    uint64_t w;          /* window number; UINT64_MAX: none yet */
    uint64_t slot0;      /* its first slot */
    uint64_t start;      /* its first position */
    uint64_t tail_local; /* the short block's slot within the window; UINT64_MAX: not in it */
    stoke__feistel mix;  /* over the window's positions */
    uint64_t have;       /* bit k: ids[k] is known (k < 64) */
    uint64_t ids[64];    /* block id of slot slot0 + k */
} block_window;

/* First position of slot j. */
static inline uint64_t slot_start(const stoke_sampler *s, const stoke__sampler_epoch *e, uint64_t j)
{
    uint64_t p = j * s->brows;
    if (e->tail_slot < j)
        p -= s->brows - s->tail_rows;
    return p;
}

static inline uint64_t slot_block(const stoke_sampler *s, const stoke__sampler_epoch *e, uint64_t j)
{
    if (j == e->tail_slot)
        return s->nfull;
    return feistel_apply(&e->perm, j < e->tail_slot ? j : j - 1);
}

static void block_window_enter(const stoke_sampler *s, const stoke__sampler_epoch *e,
                               block_window *bw, uint64_t w)
{
    uint64_t j0 = w * s->bwin, j1 = j0 + s->bwin < s->nblocks ? j0 + s->bwin : s->nblocks;
    uint64_t start = slot_start(s, e, j0);
    uint64_t end = j1 == s->nblocks ? s->n : slot_start(s, e, j1);
    bw->w = w;
    bw->slot0 = j0;
    bw->start = start;
    bw->tail_local = e->tail_slot >= j0 && e->tail_slot < j1 ? e->tail_slot - j0 : UINT64_MAX;
    feistel_init(&bw->mix, end - start,
                 stoke__mix64(e->key ^ stoke__mix64(w ^ 0x2545f4914f6cdd1dull)));
    bw->have = 0;
}

/* The index at global position g (< n).  bw: the caller's cache across calls. */
static uint64_t block_index(const stoke_sampler *s, const stoke__sampler_epoch *e, uint64_t g,
                            block_window *bw)
{
    uint64_t span = s->bwin * s->brows, w = g / span;
    /* The short block, if in an earlier window, pulls this window's start back by < B <= span. */
    if ((w + 1) * s->bwin < s->nblocks && slot_start(s, e, (w + 1) * s->bwin) <= g)
        w++;
    if (bw->w != w)
        block_window_enter(s, e, bw, w);
    uint64_t o = feistel_apply(&bw->mix, g - bw->start);
    /* Past the short block's rows: count it as a full one, then divide. */
    if (bw->tail_local != UINT64_MAX && o >= bw->tail_local * s->brows + s->tail_rows)
        o += s->brows - s->tail_rows;
    uint64_t k = o / s->brows, within = o % s->brows, id;
    if (k < 64) {
        if (!(bw->have >> k & 1)) {
            bw->ids[k] = slot_block(s, e, bw->slot0 + k);
            bw->have |= 1ull << k;
        }
        id = bw->ids[k];
    } else {
        id = slot_block(s, e, bw->slot0 + k);
    }
    return id * s->brows + within;
}

/* ---- a batch at once ------------------------------------------------------------------------- */

int stoke__sampler_epoch_init(stoke__sampler_epoch *e, const stoke_sampler *s, uint64_t seed,
                              uint64_t epoch)
{
    if (!e || !s)
        return STOKE_EINVAL;
    memset(e, 0, sizeof(*e));
    e->s = s;
    e->seed = seed;
    e->epoch = epoch;
    e->key = stoke__mix64(seed ^ stoke__mix64(epoch ^ 0x5851f42d4c957f2dull));
    switch (s->kind) {
    case STOKE_SAMPLER_RANDOM: feistel_init(&e->perm, s->n, e->key); break;
    case STOKE_SAMPLER_SUBSET: /* only a shuffled one has a permutation (n 0: none) */
        if (s->shuffle)
            feistel_init(&e->perm, s->base_len, e->key);
        break;
    case STOKE_SAMPLER_BLOCK:
        feistel_init(&e->perm, s->nfull, e->key);
        e->tail_slot =
            s->tail_rows ? stoke__mix64(e->key ^ 0x9fb21c651e98df25ull) % s->nblocks : s->nblocks;
        break;
    }
    return STOKE_OK;
}

/* The round function of every half value, round by round (see stoke__feistel.tab). */
int stoke__sampler_epoch_tabulate(stoke__sampler_epoch *e, uint16_t *tab, size_t len)
{
    if (!e || !tab)
        return 0;
    stoke__feistel *f = &e->perm; /* (n 0 for the kinds without a permutation) */
    if (f->n <= 1 || f->half > STOKE__FEISTEL_TAB_HALF ||
        len < ((size_t)STOKE__FEISTEL_ROUNDS << f->half))
        return 0;
    const size_t w = (size_t)1 << f->half;
    for (int i = 0; i < STOKE__FEISTEL_ROUNDS; i++)
        for (size_t r = 0; r < w; r++)
            tab[((size_t)i << f->half) | r] = (uint16_t)(stoke__mix64(r ^ f->rk[i]) & f->mask);
    f->tab = tab;
    return 1;
}

/* out[i] = the unsharded epoch position of this rank's position pos0 + i (all < s->len). */
static void fill_positions(const stoke_sampler *s, uint64_t pos0, size_t count, uint64_t *out)
{
    if (s->world == 1) { /* (one rank, distributed or not: the positions as they are) */
        for (size_t i = 0; i < count; i++)
            out[i] = pos0 + i;
        return;
    }
    /* (rank + pos * world) % base_len as in stoke_sampler_index, one division per batch. */
    uint64_t b = s->base_len, step = s->world % b, g = (s->rank + pos0 * s->world) % b;
    for (size_t i = 0; i < count; i++) {
        out[i] = g;
        g = g >= b - step ? g - (b - step) : g + step;
    }
}

int stoke__sampler_fill(const stoke_sampler *s, const stoke__sampler_epoch *e, uint64_t pos0,
                        size_t count, uint64_t *out)
{
    if (!s || !e || (!out && count) || e->s != s)
        return STOKE_EINVAL;
    if (pos0 > s->len || count > s->len - pos0)
        return STOKE_ERANGE;
    if (!count)
        return STOKE_OK;
    fill_positions(s, pos0, count, out);
    switch (s->kind) {
    case STOKE_SAMPLER_SEQUENTIAL: break;
    case STOKE_SAMPLER_RANDOM: feistel_apply_all(&e->perm, out, count); break;
    case STOKE_SAMPLER_SUBSET:
        if (s->shuffle)
            feistel_apply_all(&e->perm, out, count);
        for (size_t i = 0; i < count; i++)
            out[i] = s->indices[out[i]];
        break;
    case STOKE_SAMPLER_WEIGHTED:
        for (size_t i = 0; i < count; i++)
            out[i] = weighted_draw(s, e->key, out[i]);
        break;
    case STOKE_SAMPLER_BLOCK: {
        block_window bw;
        bw.w = UINT64_MAX;
        for (size_t i = 0; i < count; i++)
            out[i] = block_index(s, e, out[i], &bw);
        break;
    }
    }
    return STOKE_OK;
}

/* One position: the fill of one (the keys derived for it alone). */
int stoke_sampler_index(const stoke_sampler *s, uint64_t seed, uint64_t epoch, uint64_t pos,
                        uint64_t *out)
{
    stoke__sampler_epoch e;
    if (!s || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_sampler_index: NULL argument");
    stoke__sampler_epoch_init(&e, s, seed, epoch);
    return stoke__sampler_fill(s, &e, pos, 1, out);
}
