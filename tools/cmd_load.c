/* stoke load — runs the data loader over a source and reports throughput and checksums.
 *
 * content_hash: for every delivered sample, the 64-bit FNV-1a hash of the bytes of its first
 * field ("data"), summed modulo 2^64: independent of the order.  order_hash: 64-bit FNV-1a over
 * the delivered sample indices, each as 8 little-endian bytes: depends on the order.
 * content_hash of host batches is computed in a second, untimed pass over the same batches
 * (hash_seconds); with --device --verify it is computed from the bytes read back from the
 * device, inside the timed pass. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "stoke/stoke.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Sum of the FNV-1a hashes of `count` samples of `bytes` bytes each, four samples at a time so
 * that the multiplications of independent hashes overlap. */
static uint64_t hash_samples(const unsigned char *p, size_t count, size_t bytes)
{
    uint64_t sum = 0;
    size_t i = 0;
    for (; i + 4 <= count; i += 4) {
        const unsigned char *a = p + i * bytes, *b = a + bytes, *c = b + bytes, *d = c + bytes;
        uint64_t ha = FNV_OFFSET, hb = FNV_OFFSET, hc = FNV_OFFSET, hd = FNV_OFFSET;
        for (size_t k = 0; k < bytes; k++) {
            ha = (ha ^ a[k]) * FNV_PRIME;
            hb = (hb ^ b[k]) * FNV_PRIME;
            hc = (hc ^ c[k]) * FNV_PRIME;
            hd = (hd ^ d[k]) * FNV_PRIME;
        }
        sum += ha + hb + hc + hd;
    }
    for (; i < count; i++) {
        const unsigned char *a = p + i * bytes;
        uint64_t h = FNV_OFFSET;
        for (size_t k = 0; k < bytes; k++)
            h = (h ^ a[k]) * FNV_PRIME;
        sum += h;
    }
    return sum;
}

/* The same for packed variable-size samples (offsets: count + 1 entries). */
static uint64_t hash_packed(const unsigned char *p, const uint64_t *off, size_t count)
{
    uint64_t sum = 0;
    for (size_t i = 0; i < count; i++) {
        uint64_t h = FNV_OFFSET;
        for (uint64_t k = off[i]; k < off[i + 1]; k++)
            h = (h ^ p[k]) * FNV_PRIME;
        sum += h;
    }
    return sum;
}

static uint64_t hash_order(uint64_t h, const uint64_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 8; k++)
            h = (h ^ ((idx[i] >> (8 * k)) & 0xffu)) * FNV_PRIME;
    return h;
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stoke load [SOURCE] [options]\n"
            "  SOURCE                 synthetic[:N][,shape=3x32x32,...] (default) or npy:PATH\n"
            "  --batch-size N         samples per batch (default 256)\n"
            "  --workers N            worker threads, 0 = the caller's thread (default 2)\n"
            "  --prefetch N           batches in flight per worker (default 2)\n"
            "  --shuffle              random order keyed by (seed, epoch)\n"
            "  --seed N               default 0\n"
            "  --epochs N             default 1\n"
            "  --drop-last            drop a partial last batch\n"
            "  --no-pin-memory        ordinary memory, no pinning\n"
            "  --pin-memory-device NAME  pin for this backend\n"
            "  --out-of-order         deliver batches as they complete\n"
            "  --limit BATCHES        stop after this many batches in all\n"
            "  --device NAME[:I]      copy every batch to this device asynchronously\n"
            "  --verify               with --device: hash what the device holds\n"
            "  --no-hash              skip content_hash\n"
            "  --json                 one JSON object on stdout\n");
}

static int parse_u64(const char *flag, const char *v, uint64_t *out)
{
    char *end;
    if (!v || !*v || *v == '-') {
        fprintf(stderr, "stoke load: %s needs a non-negative integer\n", flag);
        return -1;
    }
    unsigned long long x = strtoull(v, &end, 10);
    if (*end) {
        fprintf(stderr, "stoke load: %s: '%s' is not a non-negative integer\n", flag, v);
        return -1;
    }
    *out = x;
    return 0;
}

static void progress(uint64_t done, uint64_t total, double secs, uint64_t samples)
{
    if (total == UINT64_MAX) {
        fprintf(stderr, "\r%" PRIu64 " batches  %.0f samples/s ", done,
                secs > 0 ? (double)samples / secs : 0.0);
        fflush(stderr);
        return;
    }
    int width = 30, fill = total ? (int)(done * (uint64_t)width / total) : 0;
    char bar[64];
    for (int i = 0; i < width; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[width] = '\0';
    fprintf(stderr, "\r[%s] %" PRIu64 "/%" PRIu64 " batches  %.0f samples/s ", bar, done, total,
            secs > 0 ? (double)samples / secs : 0.0);
    fflush(stderr);
}

int cmd_load(int argc, char **argv)
{
    const char *source = "synthetic";
    uint64_t batch = 256, workers = 2, prefetch = 2, seed = 0, epochs = 1, limit = 0;
    int shuffle = 0, drop_last = 0, pin = 1, json = 0, verify = 0, in_order = 1, hash = 1;
    const char *pin_dev = NULL, *device = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (cli_is(a, "--help") || cli_is(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (cli_is(a, "--batch-size")) {
            bad = parse_u64(a, v, &batch), i++;
        } else if (cli_is(a, "--workers")) {
            bad = parse_u64(a, v, &workers), i++;
        } else if (cli_is(a, "--prefetch")) {
            bad = parse_u64(a, v, &prefetch), i++;
        } else if (cli_is(a, "--seed")) {
            bad = parse_u64(a, v, &seed), i++;
        } else if (cli_is(a, "--epochs")) {
            bad = parse_u64(a, v, &epochs), i++;
        } else if (cli_is(a, "--limit")) {
            bad = parse_u64(a, v, &limit), i++;
        } else if (cli_is(a, "--shuffle")) {
            shuffle = 1;
        } else if (cli_is(a, "--drop-last")) {
            drop_last = 1;
        } else if (cli_is(a, "--no-pin-memory")) {
            pin = 0;
        } else if (cli_is(a, "--pin-memory-device")) {
            if (!v) {
                fprintf(stderr, "stoke load: --pin-memory-device needs a backend name\n");
                return 2;
            }
            pin_dev = v, i++;
        } else if (cli_is(a, "--device")) {
            if (!v) {
                fprintf(stderr, "stoke load: --device needs NAME[:INDEX]\n");
                return 2;
            }
            device = v, i++;
        } else if (cli_is(a, "--verify")) {
            verify = 1;
        } else if (cli_is(a, "--out-of-order")) {
            in_order = 0;
        } else if (cli_is(a, "--no-hash")) {
            hash = 0;
        } else if (cli_is(a, "--json")) {
            json = 1;
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "stoke load: unknown option '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            source = a;
        }
        if (bad)
            return 2;
    }
    if (verify && !device) {
        fprintf(stderr, "stoke load: --verify needs --device\n");
        return 2;
    }
    if (batch == 0 || workers > 1024 || prefetch == 0 || prefetch > 1024) {
        fprintf(stderr, "stoke load: --batch-size and --prefetch must be >= 1, --workers <= 1024\n");
        return 2;
    }

    stoke_dataset ds;
    int rc = stoke_source_open(source, &ds);
    if (rc != STOKE_OK) {
        cli_error(source, rc);
        return 1;
    }
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = (size_t)batch;
    o.num_workers = (int)workers;
    o.prefetch_factor = (int)prefetch;
    o.shuffle = shuffle;
    o.seed = seed;
    o.drop_last = drop_last;
    o.pin_memory = pin;
    o.pin_memory_device = pin_dev;
    o.in_order = in_order;
    o.device = device;
    stoke_loader *l = NULL;
    rc = stoke_loader_create(&o, &ds, &l);
    if (rc != STOKE_OK) {
        cli_error("creating the loader", rc);
        stoke_dataset_close(&ds);
        return 1;
    }
    stoke_accelerator_info acc;
    int have_acc = stoke_accelerator_get(&acc) == STOKE_OK;

    uint64_t per_epoch = stoke_loader_num_batches(l);
    /* an iterable source does not know its length: run until the epochs end */
    uint64_t total = per_epoch ? per_epoch * epochs : UINT64_MAX;
    if (limit && limit < total)
        total = limit;
    int bar = isatty(2);
    size_t sample_bytes = ds.fields[0].bytes;
    unsigned char *scratch = NULL;
    if (verify) {
        scratch = malloc(sample_bytes * (size_t)batch);
        if (!scratch) {
            fprintf(stderr, "stoke load: out of memory\n");
            stoke_loader_destroy(l);
            stoke_dataset_close(&ds);
            return 1;
        }
    }

    /* Pass 1, timed: index_sum and order_hash (8 bytes per sample), and for --device --verify
     * the content read back from the device.  Pass 2, untimed: the same batches again for the
     * content_hash of host batches, so hashing never runs beside the workers being measured. */
    uint64_t nb = 0, ns = 0, index_sum = 0, content = 0, order = FNV_OFFSET;
    uint64_t t0 = now_ns(), t1 = t0, hash_ns = 0;
    int status = 0;
    stoke_loader_stats st = {.size = sizeof(st)};
    for (int pass = 0; pass < 2 && !status; pass++) {
        int inline_hash = pass == 0 && device && verify && hash;
        if (pass == 1) {
            if (!hash || device)
                break;
            stoke_loader_set_epoch(l, 0);
        }
        uint64_t lb = 0, last_bar = 0, h0 = now_ns();
        for (uint64_t e = 0; e < epochs && lb < total && !status; e++) {
            if (e || pass)
                stoke_loader_set_epoch(l, e);
            stoke_batch *b;
            while (lb < total && (rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                size_t n = stoke_batch_count(b);
                if (device && pass == 0) {
                    int wrc = stoke_batch_device_wait(b);
                    if (wrc == STOKE_OK && verify)
                        wrc = stoke_batch_device_read(b, 0, scratch);
                    if (wrc != STOKE_OK) {
                        cli_error("device copy", wrc);
                        stoke_batch_release(b);
                        status = 1;
                        break;
                    }
                }
                const uint64_t *idx = stoke_batch_indices(b);
                if (pass == 0) {
                    for (size_t i = 0; i < n; i++)
                        index_sum += idx[i];
                    order = hash_order(order, idx, n);
                    nb++;
                    ns += n;
                }
                const unsigned char *bytes = inline_hash ? scratch
                                             : pass == 1 ? stoke_batch_data(b, 0)
                                                         : NULL;
                if (bytes && stoke_batch_offsets(b))
                    content += hash_packed(bytes, stoke_batch_offsets(b), n);
                else if (bytes)
                    content += hash_samples(bytes, n, sample_bytes);
                lb++;
                stoke_batch_release(b);
                if (bar && pass == 0) {
                    uint64_t t = now_ns();
                    if (t - last_bar > 100000000u || lb == total) {
                        last_bar = t;
                        progress(lb, total, (double)(t - t0) / 1e9, ns);
                    }
                }
            }
            if (rc != STOKE_OK && rc != STOKE_EEND) {
                const char *msg = stoke_loader_last_error(l);
                fprintf(stderr, "%sstoke load: %s\n", bar ? "\n" : "",
                        msg && *msg ? msg : stoke_strerror(rc));
                status = 1;
            }
        }
        if (pass == 0) {
            t1 = now_ns();
            stoke_loader_get_stats(l, &st);
            if (bar)
                fputc('\n', stderr);
        } else {
            hash_ns = now_ns() - h0;
        }
    }
    double secs = (double)(t1 - t0) / 1e9;
    if (secs <= 0)
        secs = 1e-9;
    int content_known = hash && (!device || verify);

    if (json) {
        printf("{\"source\": ");
        cli_json_str(stdout, source);
        printf(", \"samples\": %" PRIu64 ", \"batches\": %" PRIu64 ", \"seconds\": %.6f", ns, nb,
               secs);
        printf(", \"samples_per_s\": %.1f, \"bytes_per_s\": %.1f", (double)ns / secs,
               (double)st.bytes / secs);
        printf(", \"accelerator\": ");
        if (have_acc)
            cli_json_str(stdout, acc.backend);
        else
            printf("null");
        printf(", \"pinned_batches\": %" PRIu64 ", \"pageable_batches\": %" PRIu64,
               st.pinned_batches, st.pageable_batches);
        printf(", \"index_sum\": %" PRIu64, index_sum);
        if (content_known)
            printf(", \"content_hash\": \"0x%016" PRIx64 "\"", content);
        else
            printf(", \"content_hash\": null");
        printf(", \"order_hash\": \"0x%016" PRIx64 "\"", order);
        printf(", \"data_wait_s\": %.6f, \"wait_p50_s\": %.6f, \"wait_p99_s\": %.6f", st.wait_s,
               st.wait_p50_s, st.wait_p99_s);
        printf(", \"worker_busy_s\": %.6f, \"hash_seconds\": %.6f", st.worker_busy_s,
               (double)hash_ns / 1e9);
        printf(", \"bytes\": %" PRIu64 ", \"batch_size\": %" PRIu64 ", \"workers\": %" PRIu64
               ", \"epochs\": %" PRIu64 ", \"shuffle\": %s, \"seed\": %" PRIu64,
               st.bytes, batch, workers, epochs, shuffle ? "true" : "false", seed);
        printf(", \"device\": ");
        if (device)
            cli_json_str(stdout, device);
        else
            printf("null");
        printf(", \"device_copies\": %" PRIu64 ", \"verified\": %s", st.device_copies,
               verify ? "true" : "false");
        printf(", \"buffers\": %" PRIu64 ", \"buffer_bytes\": %" PRIu64, st.buffers,
               st.buffer_bytes);
        printf(", \"ok\": %s}\n", status ? "false" : "true");
    } else {
        printf("stoke load %s: %" PRIu64 " samples in %" PRIu64 " batches, %.3f s, %.0f samples/s, "
               "%.1f MB/s\n",
               source, ns, nb, secs, (double)ns / secs, (double)st.bytes / secs / 1e6);
        printf("  accelerator: %s; batches pinned: %" PRIu64 ", pageable: %" PRIu64 "\n",
               have_acc ? acc.backend : "none", st.pinned_batches, st.pageable_batches);
        if (device)
            printf("  device %s: %" PRIu64 " batches copied%s\n", device, st.device_copies,
                   verify ? ", read back and hashed" : "");
        printf("  consumer waited %.3f s (p50 %.1f us, p99 %.1f us); workers busy %.3f s\n",
               st.wait_s, st.wait_p50_s * 1e6, st.wait_p99_s * 1e6, st.worker_busy_s);
        printf("  index_sum %" PRIu64 ", content_hash ", index_sum);
        if (content_known)
            printf("0x%016" PRIx64, content);
        else
            printf("n/a");
        printf(", order_hash 0x%016" PRIx64 "\n", order);
    }
    free(scratch);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    return status;
}
