/* Samplers: index at (seed, epoch, position), computed without materializing the order. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/sampler.h"

struct stoke_sampler {
    int kind;
    uint64_t n;          /* dataset length */
    uint64_t base_len;   /* positions in the whole (unsharded) epoch order */
    uint64_t *indices;   /* SUBSET */
    int shuffle;         /* SUBSET */
    double *cdf;         /* WEIGHTED: running sums, cdf[n-1] = total */
    int distributed;
    uint64_t rank, world;
    uint64_t len;        /* positions for this rank */
};

uint64_t stoke__mix64(uint64_t x)
{
    /* splitmix64's finalizer: a bijection with good avalanche. */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

uint64_t stoke__epoch_key(uint64_t seed, uint64_t epoch)
{
    return stoke__mix64(seed ^ stoke__mix64(epoch ^ 0x5851f42d4c957f2dull));
}

#define FEISTEL_ROUNDS 6

uint64_t stoke_permute(uint64_t x, uint64_t n, uint64_t key)
{
    if (n <= 1 || x >= n)
        return x;
    unsigned bits = 0;
    while (bits < 64 && (n - 1) >> bits)
        bits++;
    if (bits & 1)
        bits++;
    if (bits < 2)
        bits = 2;
    unsigned half = bits / 2;
    uint64_t mask = half >= 64 ? ~0ull : ((1ull << half) - 1);
    uint64_t rk[FEISTEL_ROUNDS];
    for (int r = 0; r < FEISTEL_ROUNDS; r++)
        rk[r] = stoke__mix64(key + 0x632be59bd9b4e019ull * (uint64_t)(r + 1));
    uint64_t y = x;
    do { /* cycle walking: the domain is < 4n, so a few rounds on average */
        uint64_t l = (y >> half) & mask, r = y & mask;
        for (int i = 0; i < FEISTEL_ROUNDS; i++) {
            uint64_t t = l ^ (stoke__mix64(r ^ rk[i]) & mask);
            l = r;
            r = t;
        }
        y = (l << half) | r;
    } while (y >= n);
    return y;
}

void stoke_sampler_opts_init(stoke_sampler_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->kind = STOKE_SAMPLER_SEQUENTIAL;
    o->rank = -1;
    o->world_size = 0;
}

/* Rank and world size from the first pair of variables that is set. */
static int dist_from_env(uint64_t *rank, uint64_t *world)
{
    static const stoke_env_id pairs[][2] = {{STOKE_ENV_RANK, STOKE_ENV_WORLD_SIZE},
                                            {STOKE_ENV_OMPI_RANK, STOKE_ENV_OMPI_SIZE},
                                            {STOKE_ENV_SLURM_RANK, STOKE_ENV_SLURM_SIZE}};
    for (size_t i = 0; i < STOKE__ARRAY_LEN(pairs); i++) {
        uint64_t r = 0, w = 0;
        int hr = stoke__env_u64(pairs[i][0], &r), hw = stoke__env_u64(pairs[i][1], &w);
        if (!hr && !hw)
            continue;
        if (hr != hw)
            return stoke__fail(STOKE_EINVAL, "distributed sampler: %s and %s must both be set",
                               stoke__env_name(pairs[i][0]), stoke__env_name(pairs[i][1]));
        *rank = r;
        *world = w;
        return 1;
    }
    return 0;
}

int stoke_sampler_create(const stoke_sampler_opts *o, uint64_t dataset_len, stoke_sampler **out)
{
    if (!o || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_sampler_create: NULL argument");
    *out = NULL;
    stoke_sampler *s = calloc(1, sizeof(*s));
    if (!s)
        return STOKE_ENOMEM;
    s->kind = o->kind;
    s->n = dataset_len;
    int rc = STOKE_OK;
    switch (o->kind) {
    case STOKE_SAMPLER_SEQUENTIAL:
    case STOKE_SAMPLER_RANDOM: s->base_len = dataset_len; break;
    case STOKE_SAMPLER_SUBSET:
        if (o->num_indices && !o->indices) {
            rc = stoke__fail(STOKE_EINVAL, "subset sampler: indices is NULL");
            goto fail;
        }
        s->indices = malloc((o->num_indices ? o->num_indices : 1) * sizeof(uint64_t));
        if (!s->indices) {
            rc = STOKE_ENOMEM;
            goto fail;
        }
        for (size_t i = 0; i < o->num_indices; i++) {
            if (o->indices[i] >= dataset_len) {
                rc = stoke__fail(STOKE_EINVAL,
                                 "subset sampler: index %" PRIu64 " (entry %zu) is out of range "
                                 "for a dataset of %" PRIu64 " samples",
                                 o->indices[i], i, dataset_len);
                goto fail;
            }
            s->indices[i] = o->indices[i];
        }
        s->shuffle = o->shuffle ? 1 : 0;
        s->base_len = o->num_indices;
        break;
    case STOKE_SAMPLER_WEIGHTED: {
        if (!o->weights || o->num_weights != dataset_len || dataset_len == 0) {
            rc = stoke__fail(STOKE_EINVAL,
                             "weighted sampler: need one weight per sample (%zu weights for %" PRIu64
                             " samples)",
                             o->weights ? o->num_weights : 0, dataset_len);
            goto fail;
        }
        s->cdf = malloc(o->num_weights * sizeof(double));
        if (!s->cdf) {
            rc = STOKE_ENOMEM;
            goto fail;
        }
        double sum = 0;
        for (size_t i = 0; i < o->num_weights; i++) {
            double w = o->weights[i];
            if (!(w >= 0) || w > 1e300) { /* also rejects NaN */
                rc = stoke__fail(STOKE_EINVAL, "weighted sampler: weight %zu is not a finite "
                                               "non-negative number", i);
                goto fail;
            }
            sum += w;
            s->cdf[i] = sum;
        }
        if (!(sum > 0)) {
            rc = stoke__fail(STOKE_EINVAL, "weighted sampler: the weights sum to 0");
            goto fail;
        }
        s->base_len = o->num_samples ? o->num_samples : o->num_weights;
        break;
    }
    default: rc = stoke__fail(STOKE_EINVAL, "sampler: unknown kind %d", o->kind); goto fail;
    }

    s->rank = 0;
    s->world = 1;
    s->len = s->base_len;
    if (o->distributed) {
        uint64_t er = 0, ew = 1;
        int from_env = 0;
        if (o->rank < 0 || o->world_size <= 0) {
            from_env = dist_from_env(&er, &ew);
            if (from_env < 0) {
                rc = from_env;
                goto fail;
            }
        }
        s->rank = o->rank >= 0 ? (uint64_t)o->rank : er;
        s->world = o->world_size > 0 ? (uint64_t)o->world_size : ew;
        if (s->world == 0 || s->rank >= s->world) {
            rc = stoke__fail(STOKE_EINVAL,
                             "distributed sampler: rank %" PRIu64 " is not below world size %" PRIu64
                             "%s",
                             s->rank, s->world, from_env ? " (from the environment)" : "");
            goto fail;
        }
        s->distributed = 1;
        if (o->drop_last)
            s->len = s->base_len / s->world;
        else
            s->len = (s->base_len + s->world - 1) / s->world;
        if (s->base_len == 0)
            s->len = 0;
    }
    *out = s;
    return STOKE_OK;
fail:
    stoke_sampler_destroy(s);
    return rc;
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

int stoke_sampler_index(const stoke_sampler *s, uint64_t seed, uint64_t epoch, uint64_t pos,
                        uint64_t *out)
{
    if (!s || !out)
        return STOKE_EINVAL;
    if (pos >= s->len)
        return STOKE_ERANGE;
    uint64_t g = pos;
    if (s->distributed) /* rank's stride, padded by repeating the order from its start */
        g = (s->rank + pos * s->world) % s->base_len;
    uint64_t key = stoke__epoch_key(seed, epoch);
    switch (s->kind) {
    case STOKE_SAMPLER_SEQUENTIAL: *out = g; break;
    case STOKE_SAMPLER_RANDOM: *out = stoke_permute(g, s->n, key); break;
    case STOKE_SAMPLER_SUBSET:
        *out = s->indices[s->shuffle ? stoke_permute(g, s->base_len, key) : g];
        break;
    case STOKE_SAMPLER_WEIGHTED: {
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
        *out = lo;
        break;
    }
    default: return STOKE_EINVAL;
    }
    return STOKE_OK;
}
