/* The sampler's batch fill (stoke__sampler_fill) of RANDOM positions, with the epoch's round
 * function computed and tabulated (stoke__sampler_epoch_tabulate, what a loader's threads use
 * for up to 2^24 rows), in ns per index.
 *
 *   build/bench/bench_sampler N COUNT [TOTAL] [ROUNDS] [computed|table]
 *
 * (defaults: 2^20 positions, 7 rounds, both ways).
 * Each round fills TOTAL positions of one epoch in fills of COUNT (from position 0 again at the
 * end of the epoch), both ways, in the other order every other round; it prints the median and
 * the least of this thread's CPU time per index over the rounds (CPU time: the machine is
 * shared), and the wall time's median.  For instructions per index, run one round under
 *   valgrind --tool=callgrind --toggle-collect=stoke__sampler_fill
 * with one way named, and divide the instructions counted by TOTAL. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "loader/loader_internal.h"
#include "stoke/stoke.h"

#define MAX_ROUNDS 64

static double now_ns(clockid_t c)
{
    struct timespec ts;
    clock_gettime(c, &ts);
    return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s N COUNT [TOTAL] [ROUNDS]\n", argv[0]);
        return 2;
    }
    uint64_t n = strtoull(argv[1], NULL, 0);
    size_t count = (size_t)strtoull(argv[2], NULL, 0);
    size_t total = argc > 3 ? (size_t)strtoull(argv[3], NULL, 0) : (size_t)1 << 20;
    int rounds = argc > 4 ? atoi(argv[4]) : 7;
    int only = argc > 5 ? (strcmp(argv[5], "table") == 0 ? 1 : 0) : -1;
    if (n < 2 || count < 1 || count > n || total < count || rounds < 1 || rounds > MAX_ROUNDS) {
        fprintf(stderr,
                "bench_sampler: need 2 <= N, 1 <= COUNT <= N, TOTAL >= COUNT, "
                "1 <= ROUNDS <= %d\n",
                MAX_ROUNDS);
        return 2;
    }
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.kind = STOKE_SAMPLER_RANDOM;
    stoke_sampler *s = NULL;
    if (stoke_sampler_create(&o, n, &s) != STOKE_OK) {
        fprintf(stderr, "bench_sampler: %s\n", stoke_last_error());
        return 1;
    }
    static uint16_t tab[STOKE__FEISTEL_TAB_LEN];
    uint64_t *out = malloc(count * sizeof(*out));
    if (!out)
        return 1;
    static const char *const names[2] = {"computed", "table"};
    double cpu[2][MAX_ROUNDS], wall[2][MAX_ROUNDS];
    uint64_t sum[2] = {0, 0};
    int have_tab = 1;
    for (int r = 0; r < rounds; r++)
        for (int q = 0; q < 2; q++) {
            int way = r & 1 ? 1 - q : q;
            if (only >= 0 && way != only)
                continue;
            stoke__sampler_epoch e;
            stoke__sampler_epoch_init(&e, s, 1, (uint64_t)r);
            if (way == 1 && !stoke__sampler_epoch_tabulate(&e, tab, STOKE__FEISTEL_TAB_LEN)) {
                have_tab = 0; /* over 2^24 rows: no table */
                continue;
            }
            uint64_t pos = 0, h = 0;
            double c0 = now_ns(CLOCK_THREAD_CPUTIME_ID), w0 = now_ns(CLOCK_MONOTONIC);
            for (size_t done = 0; done < total; done += count) {
                if (pos + count > n)
                    pos = 0;
                (void)stoke__sampler_fill(s, &e, pos, count, out);
                h += out[0] ^ out[count - 1];
                pos += count;
            }
            cpu[way][r] = (now_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)total;
            wall[way][r] = (now_ns(CLOCK_MONOTONIC) - w0) / (double)total;
            sum[way] = h;
        }
    if (only < 0 && have_tab && sum[0] != sum[1]) { /* the last round filled one epoch both ways */
        fprintf(stderr, "bench_sampler: the two ways gave different indices\n");
        return 1;
    }
    for (int way = 0; way < 2; way++) {
        if ((only >= 0 && way != only) || (way == 1 && !have_tab))
            continue;
        qsort(cpu[way], (size_t)rounds, sizeof(double), cmp_double);
        qsort(wall[way], (size_t)rounds, sizeof(double), cmp_double);
        printf("n %llu, fills of %zu, %-8s: CPU %6.2f ns per index (least %6.2f), wall %6.2f\n",
               (unsigned long long)n, count, names[way], cpu[way][rounds / 2], cpu[way][0],
               wall[way][rounds / 2]);
    }
    free(out);
    stoke_sampler_destroy(s);
    return 0;
}
