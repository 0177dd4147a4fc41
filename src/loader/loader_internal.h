/* Private helpers of the loader layer. */
#ifndef STOKE_LOADER_INTERNAL_H
#define STOKE_LOADER_INTERNAL_H

#include <stdint.h>

/* splitmix64 finalizer (a bijection of 64-bit integers). */
uint64_t stoke__mix64(uint64_t x);
/* The key of every random choice in epoch `epoch` under `seed`. */
uint64_t stoke__epoch_key(uint64_t seed, uint64_t epoch);

/* Wait-time histogram: log-linear buckets (8 per power of two), about 6% resolution. */
#define STOKE__HIST_BUCKETS 520
typedef struct stoke__hist {
    uint64_t n;
    uint64_t count[STOKE__HIST_BUCKETS];
} stoke__hist;
void stoke__hist_add(stoke__hist *h, uint64_t ns);
/* Value (ns) at quantile q in [0, 1]; 0 when empty. */
uint64_t stoke__hist_quantile(const stoke__hist *h, double q);

#endif
