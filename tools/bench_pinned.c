/* stoke bench pinned — the pinned allocator on the current accelerator (public API only).
 *
 *   cached_pair_ns    median over batches of the mean time of one stoke_pinned_alloc +
 *                     stoke_pinned_free pair of SIZE bytes that the cache serves
 *   uncached_pin_ns   median time of a stoke_pinned_alloc of SIZE bytes that must pin a new
 *                     block (the cache emptied before each), through the current backend
 *   backend_pin_ns    mean time inside the backend's host_alloc for those (from the stats)
 *   pairs_per_s_1t    cached pairs per second from one thread
 *   pairs_per_s_2t    cached pairs per second from two threads together (each its own block)
 *   max_waste_pct     largest rounding waste, in percent, of requests above 1 MiB
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "stoke/stoke.h"

#define MiB ((size_t)1 << 20)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

/* One cached alloc+free pair; returns the status. */
static int pair(size_t size)
{
    void *p;
    int rc = stoke_pinned_alloc(size, &p);
    if (rc != STOKE_OK)
        return rc;
    return stoke_pinned_free(p);
}

typedef struct runner {
    size_t size;
    uint64_t duration_ns;
    pthread_barrier_t *start;
    uint64_t pairs;
    uint64_t elapsed_ns;
    int rc;
} runner;

static void *run_pairs(void *arg)
{
    runner *r = arg;
    r->rc = pair(r->size); /* warm this thread's cache */
    if (r->start)
        pthread_barrier_wait(r->start);
    uint64_t t0 = now_ns(), t = t0, n = 0;
    while (r->rc == STOKE_OK && t - t0 < r->duration_ns) {
        for (int i = 0; i < 256 && r->rc == STOKE_OK; i++)
            r->rc = pair(r->size);
        n += 256;
        t = now_ns();
    }
    r->pairs = n;
    r->elapsed_ns = t - t0;
    return NULL;
}

/* Pairs per second from `threads` threads running at once. */
static int throughput(const cli_cmd *c, int threads, size_t size, uint64_t duration_ns,
                      double *out)
{
    runner r[2];
    pthread_t t[2];
    pthread_barrier_t start;
    pthread_barrier_init(&start, NULL, (unsigned)threads);
    for (int i = 0; i < threads; i++) {
        r[i] = (runner){.size = size, .duration_ns = duration_ns, .start = &start};
        if (pthread_create(&t[i], NULL, run_pairs, &r[i]) != 0)
            return cli_fail(c, 1, "cannot start a thread");
    }
    double rate = 0;
    int rc = STOKE_OK;
    for (int i = 0; i < threads; i++) {
        pthread_join(t[i], NULL);
        if (r[i].rc != STOKE_OK)
            rc = r[i].rc;
        if (r[i].elapsed_ns)
            rate += (double)r[i].pairs * 1e9 / (double)r[i].elapsed_ns;
    }
    pthread_barrier_destroy(&start);
    if (rc != STOKE_OK)
        return cli_fail_rc(c, 1, "cached alloc/free pair", rc);
    *out = rate;
    return 0;
}

static double max_waste_pct(void)
{
    double worst = 0;
    for (size_t s = MiB + 1; s < 1024 * MiB; s += s / 97 + 4093) {
        size_t r = stoke_pinned_round_size(s);
        double w = 100.0 * (double)(r - s) / (double)s;
        if (w > worst)
            worst = w;
    }
    return worst;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: stoke bench pinned [--json] [--quick] [--size BYTES]\n"
               "  the pinned allocator on the current accelerator (STOKE_ACCELERATOR or\n"
               "  STOKE_PLUGIN_PATH to choose one): cached alloc+free pairs vs new pins\n"
               "  --size   bytes per allocation (default 1048576)\n"
               "  --quick  fewer repetitions (a smoke test, not a measurement)\n");
}

int bench_pinned(int argc, char **argv)
{
    cli_cmd c = {"bench pinned", cli_has_json(argc, argv)};
    int quick = 0;
    uint64_t size_opt = MiB;
    for (int i = 1; i < argc; i++) {
        const char *v;
        int got = cli_opt(&c, argc, argv, &i, "--size", &v);
        if (got < 0 || (got && cli_u64(&c, "--size", v, 1, SIZE_MAX, &size_opt) < 0))
            return 2;
        if (got || cli_is(argv[i], "--json"))
            continue;
        if (cli_is(argv[i], "--quick")) {
            quick = 1;
        } else if (cli_is(argv[i], "--help") || cli_is(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else {
            if (!c.json)
                usage(stderr);
            return cli_fail(&c, 2, "unknown option '%s'", argv[i]);
        }
    }
    size_t size = (size_t)size_opt;
    stoke_accelerator_info ai;
    const char *backend = stoke_accelerator_get(&ai) == STOKE_OK ? ai.backend : "none";
    const int samples = quick ? 11 : 101, batch = quick ? 100 : 1000;
    const int pins = quick ? 5 : 31;
    const uint64_t duration = quick ? 50000000u : 500000000u;

    /* Cached pairs: the first pair pins, every later one is served by the cache. */
    int rc = pair(size);
    if (rc != STOKE_OK)
        return cli_fail_rc(&c, 1, "stoke_pinned_alloc", rc);
    double *v = calloc((size_t)(samples > pins ? samples : pins), sizeof(double));
    if (!v)
        return cli_fail(&c, 1, "out of memory");
    for (int s = 0; s < samples && rc == STOKE_OK; s++) {
        uint64_t t0 = now_ns();
        for (int i = 0; i < batch && rc == STOKE_OK; i++)
            rc = pair(size);
        v[s] = (double)(now_ns() - t0) / batch;
    }
    double cached = median(v, samples);

    /* Uncached: empty the cache, then time the allocation that has to pin. */
    stoke_pinned_stats st0 = {.size = sizeof(st0)}, st1 = {.size = sizeof(st1)};
    stoke_pinned_stats_get(&st0);
    for (int s = 0; s < pins && rc == STOKE_OK; s++) {
        void *p = NULL;
        stoke_pinned_empty_cache();
        uint64_t t0 = now_ns();
        rc = stoke_pinned_alloc(size, &p);
        v[s] = (double)(now_ns() - t0);
        if (rc == STOKE_OK)
            rc = stoke_pinned_free(p);
    }
    stoke_pinned_stats_get(&st1);
    double uncached = median(v, pins);
    free(v);
    if (rc != STOKE_OK)
        return cli_fail_rc(&c, 1, "stoke_pinned_alloc", rc);
    uint64_t calls = st1.pin_calls - st0.pin_calls;
    double backend_pin = calls ? (double)(st1.pin_ns - st0.pin_ns) / (double)calls : 0;

    double t1 = 0, t2 = 0;
    if (throughput(&c, 1, size, duration, &t1) || throughput(&c, 2, size, duration, &t2))
        return 1;
    double waste = max_waste_pct();
    stoke_pinned_empty_cache();

    if (c.json) {
        printf("{\"backend\":");
        cli_json_str(stdout, backend);
        printf(",\"size\":%zu,\"cached_pair_ns\":%.1f,\"uncached_pin_ns\":%.0f,"
               "\"backend_pin_ns\":%.0f,\"speedup\":%.1f,\"pairs_per_s_1t\":%.0f,"
               "\"pairs_per_s_2t\":%.0f,\"max_waste_pct\":%.2f}\n",
               size, cached, uncached, backend_pin, cached > 0 ? uncached / cached : 0, t1, t2,
               waste);
    } else {
        printf("pinned allocator on %s, %zu-byte blocks\n", backend, size);
        printf("  cached alloc+free pair   %10.1f ns   (median of %d batches of %d)\n", cached,
               samples, batch);
        printf("  uncached pin             %10.0f ns   (median of %d; %.0f ns in the backend)\n",
               uncached, pins, backend_pin);
        printf("  cached vs uncached       %10.1fx\n", cached > 0 ? uncached / cached : 0);
        printf("  cached pairs/s, 1 thread %10.0f\n", t1);
        printf("  cached pairs/s, 2 threads%10.0f\n", t2);
        printf("  rounding waste > 1 MiB   %10.2f %% at most\n", waste);
    }
    return 0;
}
