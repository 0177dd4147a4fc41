/* Single-thread memcpy bandwidth, the yardstick of bench/loader_vs_torch.py.
 *
 *     stoke_memcpy_bw [MiB] [reps]      (default 256 MiB, best of 5)
 *
 * Copies a buffer far larger than the caches with one memcpy call per rep (both buffers are
 * touched first, so no page faults are timed) and prints one JSON object:
 * {"bytes": ..., "reps": ..., "best_s": ..., "bytes_per_s": ...}.  No libstoke. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    if (mib == 0 || reps <= 0) {
        fprintf(stderr, "usage: stoke_memcpy_bw [MiB] [reps]\n");
        return 2;
    }
    size_t n = mib << 20;
    unsigned char *src = malloc(n), *dst = malloc(n);
    if (!src || !dst) {
        fprintf(stderr, "stoke_memcpy_bw: cannot allocate 2 x %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++)
        src[i] = (unsigned char)(i * 131u);
    memset(dst, 0, n);
    double best = 1e30;
    unsigned sink = 0;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        memcpy(dst, src, n);
        double t = now_s() - t0;
        sink += dst[(size_t)r * 4099u % n];
        if (t < best)
            best = t;
    }
    printf("{\"bytes\": %zu, \"reps\": %d, \"best_s\": %.6f, \"bytes_per_s\": %.1f, \"check\": %u}\n",
           n, reps, best, (double)n / best, sink);
    free(src);
    free(dst);
    return 0;
}
