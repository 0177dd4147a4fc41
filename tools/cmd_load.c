/* stoke load — runs the data loader over a source and reports throughput and checksums.
 *
 * content_hash: for every delivered sample, the 64-bit FNV-1a hash of the bytes of its field 0
 * ("data") only, summed modulo 2^64: independent of the order.  order_hash: 64-bit FNV-1a over
 * the delivered sample indices, each as 8 little-endian bytes: depends on the order.
 * content_hash of host batches is computed in a second, untimed pass after the timed one: the
 * same loader runs the same epochs again from epoch 0 (same seed, hence the same order, and the
 * same --limit), hashing each batch (JSON "hash_pass_seconds"); with --device --verify it is
 * computed from the bytes read back from the device, inside the timed pass; with --device alone
 * it is not computed (null).  Errors: a message on stderr and, with --json, one
 * {"ok": false, "error": ...} object on stdout (start-up errors) or the summary with "ok": false
 * and "error" (mid-run errors); the exit status is 2 for usage errors, 1 for others. */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
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
            "  SOURCE                 at most one (default: synthetic):\n"
            "                           synthetic[:N][,shape=3x32x32][,seed=S][,classes=C][,dtype=u8]\n"
            "                           npy:PATH[,labels=LABELS.npy][,io=mmap|pread]\n"
            "  --batch-size N         samples per batch, >= 1 (default 256)\n"
            "  --workers N            worker threads 0..1024, 0 = the caller's thread (default 2)\n"
            "  --prefetch N           batches in flight per worker, 1..1024 (default 2)\n"
            "  --shuffle              random order keyed by (seed, epoch)\n"
            "  --seed N               0..18446744073709551615 (default 0)\n"
            "  --epochs N             >= 1 (default 1)\n"
            "  --drop-last            drop a partial last batch\n"
            "  --no-pin-memory        ordinary memory, no pinning\n"
            "  --pin-memory-device NAME[:I]  pin for this backend (a warning if it cannot pin:\n"
            "                         unavailable, or cpu, which pins nothing)\n"
            "  --out-of-order         deliver batches as they complete\n"
            "  --limit BATCHES        stop after this many batches in all; 0 = no limit (default)\n"
            "  --device NAME[:I]      copy every batch to this device asynchronously\n"
            "  --verify               with --device: read every batch back from the device and\n"
            "                         hash what it holds\n"
            "  --no-hash              skip content_hash\n"
            "  --json                 one JSON object on stdout, errors included\n"
            "\n"
            "content_hash covers field 0 (\"data\") only: the sum modulo 2^64 of the 64-bit FNV-1a\n"
            "hash of each delivered sample's bytes, independent of the order.  Host batches: it is\n"
            "computed in a second, untimed pass after the timed one, which runs the same epochs\n"
            "again from epoch 0 with the same loader (same seed, so the same order, and the same\n"
            "--limit); JSON \"hash_pass_seconds\" is that pass's time.  --device --verify: computed\n"
            "inside the timed pass from the bytes read back from the device.  --device without\n"
            "--verify: not computed (null).  null too when the run failed or with --no-hash.\n"
            "order_hash: FNV-1a over the delivered indices (8 little-endian bytes each).\n"
            "index_sum: the sum of the delivered indices.  With --json, any error prints\n"
            "{\"ok\": false, \"error\": \"...\"} on stdout as well as the message on stderr; the exit\n"
            "status is 2 for a usage error, 1 for any other error.\n");
}

/* Reports an error that stops `stoke load` before the summary: the message on stderr and, with
 * --json, {"ok": false, "error": message} on stdout.  Returns `status`. */
static int fail_early(int json, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "stoke load: %s\n", msg);
    if (json) {
        printf("{\"ok\": false, \"error\": ");
        cli_json_str(stdout, msg);
        printf("}\n");
    }
    return status;
}

/* Parses the value of option `flag` as a decimal integer in [min, max].  0 on success; -1 after
 * reporting the one bad option. */
static int parse_u64(int json, const char *flag, const char *v, uint64_t min, uint64_t max,
                     uint64_t *out)
{
    if (!v)
        return fail_early(json, -1, "%s needs a value", flag);
    if (*v < '0' || *v > '9')
        return fail_early(json, -1, "%s: '%s' is not a non-negative integer", flag, v);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end)
        return fail_early(json, -1, "%s: '%s' is not a non-negative integer", flag, v);
    if (errno == ERANGE || x > max)
        return fail_early(json, -1, "%s: %s is too large (at most %" PRIu64 ")", flag, v, max);
    if (x < min)
        return fail_early(json, -1, "%s must be at least %" PRIu64 " (got %s)", flag, min, v);
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
    const char *source = NULL;
    uint64_t batch = 256, workers = 2, prefetch = 2, seed = 0, epochs = 1, limit = 0;
    int shuffle = 0, drop_last = 0, pin = 1, json = 0, verify = 0, in_order = 1, hash = 1;
    const char *pin_dev = NULL, *device = NULL;
    for (int i = 1; i < argc; i++) /* known before any error is reported */
        if (cli_is(argv[i], "--json"))
            json = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0;
        if (cli_is(a, "--help") || cli_is(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (cli_is(a, "--batch-size")) {
            bad = parse_u64(json, a, v, 1, SIZE_MAX, &batch), i++;
        } else if (cli_is(a, "--workers")) {
            bad = parse_u64(json, a, v, 0, 1024, &workers), i++;
        } else if (cli_is(a, "--prefetch")) {
            bad = parse_u64(json, a, v, 1, 1024, &prefetch), i++;
        } else if (cli_is(a, "--seed")) {
            bad = parse_u64(json, a, v, 0, UINT64_MAX, &seed), i++;
        } else if (cli_is(a, "--epochs")) {
            bad = parse_u64(json, a, v, 1, UINT64_MAX, &epochs), i++;
        } else if (cli_is(a, "--limit")) {
            bad = parse_u64(json, a, v, 0, UINT64_MAX, &limit), i++;
        } else if (cli_is(a, "--shuffle")) {
            shuffle = 1;
        } else if (cli_is(a, "--drop-last")) {
            drop_last = 1;
        } else if (cli_is(a, "--no-pin-memory")) {
            pin = 0;
        } else if (cli_is(a, "--pin-memory-device")) {
            if (!v)
                return fail_early(json, 2, "--pin-memory-device needs NAME[:INDEX]");
            pin_dev = v, i++;
        } else if (cli_is(a, "--device")) {
            if (!v)
                return fail_early(json, 2, "--device needs NAME[:INDEX]");
            device = v, i++;
        } else if (cli_is(a, "--verify")) {
            verify = 1;
        } else if (cli_is(a, "--out-of-order")) {
            in_order = 0;
        } else if (cli_is(a, "--no-hash")) {
            hash = 0;
        } else if (cli_is(a, "--json")) {
            json = 1;
        } else if (a[0] == '-' && a[1] != '\0') {
            if (!json)
                usage(stderr);
            return fail_early(json, 2, "unknown option '%s' (stoke load --help lists them)", a);
        } else if (source) {
            return fail_early(json, 2, "only one SOURCE (got '%s' and '%s')", source, a);
        } else {
            source = a;
        }
        if (bad)
            return 2;
    }
    if (!source)
        source = "synthetic";
    if (verify && !device)
        return fail_early(json, 2, "--verify needs --device");

    stoke_dataset ds;
    int rc = stoke_source_open(source, &ds);
    if (rc != STOKE_OK)
        return fail_early(json, 1, "%s", /* the library's message names the source or file */
                          *stoke_last_error() ? stoke_last_error() : stoke_strerror(rc));
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
        rc = fail_early(json, 1, "%s",
                        *stoke_last_error() ? stoke_last_error() : stoke_strerror(rc));
        stoke_dataset_close(&ds);
        return rc;
    }
    stoke_accelerator_info acc;
    int have_acc = stoke_accelerator_get(&acc) == STOKE_OK;
    const char *pinned_for = stoke_loader_pinned_backend(l);

    uint64_t per_epoch = stoke_loader_num_batches(l);
    /* an iterable source does not know its length: run until the epochs end */
    uint64_t total = per_epoch && per_epoch <= UINT64_MAX / epochs ? per_epoch * epochs
                                                                   : UINT64_MAX;
    if (limit && limit < total)
        total = limit;
    int bar = isatty(2);
    size_t sample_bytes = ds.fields[0].bytes;
    unsigned char *scratch = NULL;
    stoke_loader_stats st = {.size = sizeof(st)};
    if (verify) {
        stoke_loader_get_stats(l, &st); /* a batch's field 0 fits in one buffer */
        scratch = malloc((size_t)st.buffer_bytes);
        if (!scratch) {
            stoke_loader_destroy(l);
            stoke_dataset_close(&ds);
            return fail_early(json, 1, "out of memory for a --verify buffer of %" PRIu64 " bytes",
                              st.buffer_bytes);
        }
    }

    /* Pass 1, timed: index_sum and order_hash (8 bytes per sample), and for --device --verify
     * the content read back from the device.  Pass 2, untimed: the same epochs again from epoch 0
     * (same seed: the same order) for the content_hash of host batches, so hashing never runs
     * beside the workers being measured.  A batch counts as delivered as soon as next() returns
     * it, before its device copy is waited for, as in the loader's statistics. */
    uint64_t nb = 0, ns = 0, index_sum = 0, content = 0, order = FNV_OFFSET;
    uint64_t t0 = now_ns(), t1 = t0, hash_ns = 0;
    int status = 0, hash_pass = 0;
    char errmsg[1024] = "";
    for (int pass = 0; pass < 2 && !status; pass++) {
        int inline_hash = pass == 0 && device && verify && hash;
        if (pass == 1) {
            if (!hash || device)
                break;
            hash_pass = 1;
        }
        uint64_t lb = 0, last_bar = 0, h0 = now_ns();
        for (uint64_t e = 0; e < epochs && lb < total && !status; e++) {
            stoke_batch *b;
            rc = e || pass ? stoke_loader_set_epoch(l, e) : STOKE_OK;
            while (rc == STOKE_OK && lb < total && (rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                size_t n = stoke_batch_count(b);
                const uint64_t *idx = stoke_batch_indices(b);
                if (pass == 0) {
                    for (size_t i = 0; i < n; i++)
                        index_sum += idx[i];
                    order = hash_order(order, idx, n);
                    nb++;
                    ns += n;
                }
                lb++;
                if (device && pass == 0) {
                    rc = stoke_batch_device_wait(b);
                    if (rc == STOKE_OK && verify)
                        rc = stoke_batch_device_read(b, 0, scratch);
                    if (rc != STOKE_OK) {
                        stoke_batch_release(b);
                        break;
                    }
                }
                const unsigned char *bytes = inline_hash ? scratch
                                             : pass == 1 ? stoke_batch_data(b, 0)
                                                         : NULL;
                if (bytes && stoke_batch_offsets(b))
                    content += hash_packed(bytes, stoke_batch_offsets(b), n);
                else if (bytes)
                    content += hash_samples(bytes, n, sample_bytes);
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
                snprintf(errmsg, sizeof(errmsg), "%s", msg && *msg ? msg : stoke_strerror(rc));
                fprintf(stderr, "%sstoke load: %s\n", bar ? "\n" : "", errmsg);
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
    int content_known = !status && hash && (!device || verify);
    const char *content_src = !content_known ? NULL
                              : device       ? "device_readback"
                                             : "host_second_pass";

    if (json) {
        printf("{\"ok\": %s, \"error\": ", status ? "false" : "true");
        if (status)
            cli_json_str(stdout, errmsg);
        else
            printf("null");
        printf(", \"source\": ");
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
        printf(", \"pinned_for\": ");
        if (pinned_for)
            cli_json_str(stdout, pinned_for);
        else
            printf("null");
        printf(", \"pinned_batches\": %" PRIu64 ", \"pageable_batches\": %" PRIu64,
               st.pinned_batches, st.pageable_batches);
        printf(", \"index_sum\": %" PRIu64, index_sum);
        if (content_known)
            printf(", \"content_hash\": \"0x%016" PRIx64 "\"", content);
        else
            printf(", \"content_hash\": null");
        printf(", \"content_hash_from\": ");
        if (content_src)
            cli_json_str(stdout, content_src);
        else
            printf("null");
        printf(", \"order_hash\": \"0x%016" PRIx64 "\"", order);
        printf(", \"data_wait_s\": %.6f, \"wait_p50_s\": %.6f, \"wait_p99_s\": %.6f", st.wait_s,
               st.wait_p50_s, st.wait_p99_s);
        printf(", \"worker_busy_s\": %.6f, \"hash_pass_seconds\": ", st.worker_busy_s);
        if (hash_pass)
            printf("%.6f", (double)hash_ns / 1e9);
        else
            printf("null");
        printf(", \"bytes\": %" PRIu64 ", \"batch_size\": %" PRIu64 ", \"workers\": %" PRIu64
               ", \"epochs\": %" PRIu64 ", \"shuffle\": %s, \"seed\": %" PRIu64,
               st.bytes, batch, workers, epochs, shuffle ? "true" : "false", seed);
        printf(", \"device\": ");
        if (device)
            cli_json_str(stdout, device);
        else
            printf("null");
        printf(", \"device_copies\": %" PRIu64 ", \"device_errors\": %" PRIu64
               ", \"verified\": %s",
               st.device_copies, st.device_errors, verify && !status ? "true" : "false");
        printf(", \"buffers\": %" PRIu64 ", \"buffer_bytes\": %" PRIu64 "}\n", st.buffers,
               st.buffer_bytes);
    } else {
        printf("stoke load %s: %" PRIu64 " samples in %" PRIu64 " batches, %.3f s, %.0f samples/s, "
               "%.1f MB/s%s\n",
               source, ns, nb, secs, (double)ns / secs, (double)st.bytes / secs / 1e6,
               status ? " (FAILED)" : "");
        printf("  accelerator: %s; pinned for: %s; batches pinned: %" PRIu64 ", pageable: %" PRIu64
               "\n",
               have_acc ? acc.backend : "none", pinned_for ? pinned_for : "none",
               st.pinned_batches, st.pageable_batches);
        if (device)
            printf("  device %s: %" PRIu64 " batches copied, %" PRIu64 " failed%s\n", device,
                   st.device_copies, st.device_errors,
                   verify && !status ? ", read back and hashed" : "");
        printf("  consumer waited %.3f s (p50 %.1f us, p99 %.1f us); workers busy %.3f s\n",
               st.wait_s, st.wait_p50_s * 1e6, st.wait_p99_s * 1e6, st.worker_busy_s);
        printf("  index_sum %" PRIu64 ", content_hash ", index_sum);
        if (content_known)
            printf("0x%016" PRIx64 " (field 0, %s)", content,
                   device ? "read back from the device" : "second untimed pass");
        else
            printf("n/a");
        printf(", order_hash 0x%016" PRIx64 "\n", order);
    }
    free(scratch);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    return status;
}
