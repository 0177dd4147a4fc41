/* Constant-size latency histogram for the loader's wait statistics. */
#include "loader/loader_internal.h"

static unsigned bucket_of(uint64_t v)
{
    if (v < 16)
        return (unsigned)v;
    unsigned e = 63u - (unsigned)__builtin_clzll(v); /* e >= 4 */
    unsigned sub = (unsigned)(v >> (e - 3)) & 7u;
    unsigned b = 16u + (e - 4u) * 8u + sub;
    return b < STOKE__HIST_BUCKETS ? b : STOKE__HIST_BUCKETS - 1;
}

static uint64_t bucket_mid(unsigned b)
{
    if (b < 16)
        return b;
    unsigned e = (b - 16u) / 8u + 4u, sub = (b - 16u) % 8u;
    return (2 * (8ull + sub) + 1) << (e - 4); /* (8 + sub) << (e - 3), plus half the width */
}

void stoke__hist_add(stoke__hist *h, uint64_t ns)
{
    h->count[bucket_of(ns)]++;
    h->n++;
}

uint64_t stoke__hist_quantile(const stoke__hist *h, double q)
{
    if (!h->n)
        return 0;
    uint64_t rank = (uint64_t)(q * (double)(h->n - 1)) + 1, seen = 0;
    for (unsigned b = 0; b < STOKE__HIST_BUCKETS; b++) {
        seen += h->count[b];
        if (seen >= rank)
            return bucket_mid(b);
    }
    return bucket_mid(STOKE__HIST_BUCKETS - 1);
}
