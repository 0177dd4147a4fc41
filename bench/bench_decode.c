/* The decoder's own limit for an images: spec: libjpeg-turbo alone decoding the same files at
 * the same DCT scale, column crop and rows as stoke (the same code path, with the resampler
 * switched off: stoke__image_opts.decode_only), one thread, from memory; and, for comparison,
 * the whole decode + resample of stoke__image_decode on the same thread.
 *
 *   build/bench/bench_decode images:DIR[,size=224][,train|eval][,seed=N][,...] [ROUNDS]
 *
 * DIR must not contain a comma.  Samples are index 0..N-1 of the canonical order at epoch 0,
 * as `stoke load` draws them in its first epoch (the crops of train are a function of the
 * seed, the epoch and the index only).  The files are read into memory first; each round
 * decodes every one, decode-only then full, and the best round of each counts (this thread's
 * CPU time: the machine may be shared).  Prints one JSON object: images, decode_only_per_cpu_s,
 * stoke_decode_per_cpu_s, and resample_share (the part of the full decode's CPU time that is
 * not the decoder's).  bench/bench_images.py divides stoke's images per CPU-second by
 * decode_only_per_cpu_s.  For instructions, run one round under callgrind. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "sources/image.h"
#include "stoke/stoke.h"

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static unsigned char *slurp(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0)
            close(fd);
        return NULL;
    }
    unsigned char *b = malloc((size_t)st.st_size + 1);
    size_t got = 0;
    while (b && got < (size_t)st.st_size) {
        ssize_t r = read(fd, b + got, (size_t)st.st_size - got);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    close(fd);
    if (!b || got != (size_t)st.st_size) {
        free(b);
        return NULL;
    }
    *len = got;
    return b;
}

int main(int argc, char **argv)
{
    if (argc < 2 || strncmp(argv[1], "images:", 7) != 0) {
        fprintf(stderr, "usage: %s images:DIR[,size=224][,train|eval][,seed=N] [ROUNDS]\n",
                argv[0]);
        return 2;
    }
    const int rounds = argc > 2 ? atoi(argv[2]) : 3;
    char *spec = strdup(argv[1] + 7), *save = NULL, msg[256];
    const char *dir = strtok_r(spec, ",", &save);
    stoke__image_opts o;
    stoke__image_opts_init(&o);
    for (char *opt; (opt = strtok_r(NULL, ",", &save));) {
        char *eq = strchr(opt, '=');
        if (eq)
            *eq++ = '\0';
        if (stoke__image_parse_opt(&o, opt, eq, msg, sizeof(msg)) != 1) {
            fprintf(stderr, "bench_decode: option '%s': %s\n", opt, msg);
            return 2;
        }
    }
    stoke_dataset ds;
    if (stoke_images_open(dir, NULL, &ds) != STOKE_OK) {
        fprintf(stderr, "bench_decode: %s\n", stoke_last_error());
        return 1;
    }
    const size_t n = (size_t)ds.length(ds.user);
    unsigned char **data = calloc(n, sizeof(*data));
    size_t *len = calloc(n, sizeof(*len));
    const size_t out_bytes =
        (size_t)o.size * (size_t)o.size * 3 * (o.dtype == STOKE_DTYPE_F32 ? 4 : 1);
    void *out = malloc(out_bytes);
    if (!data || !len || !out)
        return 1;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, stoke_images_path(&ds, i));
        if (!(data[i] = slurp(path, &len[i]))) {
            fprintf(stderr, "bench_decode: cannot read %s\n", path);
            return 1;
        }
    }
    double best[2] = {1e300, 1e300};
    for (int r = 0; r < rounds; r++)
        for (int full = 0; full < 2; full++) {
            o.decode_only = !full;
            double t0 = cpu_s();
            for (size_t i = 0; i < n; i++) {
                int rc = stoke__image_decode(&o, data[i], len[i], 0, i, out, msg, sizeof(msg));
                if (rc) {
                    fprintf(stderr, "bench_decode: %s: %s\n", stoke_images_path(&ds, i), msg);
                    return 1;
                }
            }
            double t = cpu_s() - t0;
            best[full] = t < best[full] ? t : best[full];
        }
    printf("{\"images\": %zu, \"size\": %d, \"train\": %d, \"rounds\": %d, "
           "\"decode_only_per_cpu_s\": %.1f, \"stoke_decode_per_cpu_s\": %.1f, "
           "\"resample_share\": %.3f}\n",
           n, o.size, o.train, rounds, (double)n / best[0], (double)n / best[1],
           1.0 - best[0] / best[1]);
    for (size_t i = 0; i < n; i++)
        free(data[i]);
    free(data);
    free(len);
    free(out);
    free(spec);
    stoke_dataset_close(&ds);
    return 0;
}
