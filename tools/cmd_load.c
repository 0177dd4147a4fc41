/* stoke load — runs the data loader over a source and reports throughput and checksums.
 *
 * content_hash: for every delivered sample, the 64-bit FNV-1a hash of the bytes of its field 0
 * ("data") only, summed modulo 2^64 (so independent of the order; a sample delivered twice, in
 * two epochs, counts twice).  order_hash: 64-bit FNV-1a over the delivered sample indices taken
 * as 64-bit words (h = (h ^ index) * FNV prime): depends on the order.  index_sum: the sum of those
 * indices.
 *
 * The run is parse_args -> open_loader -> timed_pass -> hash_pass -> print_json / print_text.
 * The timed pass computes index_sum and order_hash (8 bytes per sample), and with --device
 * --verify the content_hash of the bytes read back from the device.  For host batches
 * content_hash is computed afterwards in an untimed hash pass, so that hashing never runs
 * beside the workers being measured: it runs each epoch the timed pass reached again on the
 * same loader and hashes exactly the samples the timed pass delivered.  Of every epoch the timed
 * pass finished, the hash pass hashes what it delivers less the samples the timed pass skipped
 * as bad (its quarantine); of an epoch cut short by --limit (which batches arrived first depends
 * on timing with --out-of-order) the timed pass keeps the delivered indices, and the hash pass
 * hashes those samples only, each once per delivery.  When the passes' samples differ in a way
 * that cannot be undone (a sample that failed in the hash pass only, or was replaced in the
 * timed pass only; counts or index sums that differ) content_hash is null with
 * content_hash_reason, never the hash of other samples (check_passes).  With --device alone
 * content_hash is not computed (null).
 *
 * Errors: a message on stderr and, with --json, one {"ok": false, "error": ...} object on
 * stdout (start-up errors; with "error_code" and "error_name", the library's STOKE_E* status,
 * when the library failed) or the summary with "ok": false, "error", "error_code" and
 * "error_name" (errors once loading started; null when it succeeded); the exit status is 2 for
 * usage errors, 1 for others. */
#include <inttypes.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cmd_load.h"

/* Whether ds is a source of this kind ("npy:", "tar:"): its name starts so (only then are the
 * source's own queries asked, which say STOKE_EINVAL in the debug log for another kind). */
static int source_is(const stoke_dataset *ds, const char *kind)
{
    return strncmp(ds->name, kind, strlen(kind)) == 0;
}

/* The network figures of a tar or npy source (1), or 0 for another kind. */
static int remote_stats(const stoke_dataset *ds, stoke_remote_stats *out)
{
    if (source_is(ds, "tar:"))
        return stoke_tar_remote_stats(ds, out) == STOKE_OK;
    if (source_is(ds, "npy:"))
        return stoke_npy_remote_stats(ds, out) == STOKE_OK;
    return 0;
}

/* ---- options --------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(
        f,
        "usage: stoke load [SOURCE] [options]\n"
        "  SOURCE                 at most one (default: synthetic):\n"
        "                           synthetic[:N][,shape=3x32x32][,seed=S][,classes=C][,dtype=u8]\n"
        "                             [,delay=I:US] (sample I takes US microseconds longer)\n"
        "                           npy:PATH[,labels=LABELS.npy][,io=auto|mmap|pread|uring]\n"
        "                             [,direct=auto|on|off] (block shuffle: O_DIRECT reads)\n"
        "                             PATH may be an http(s):// or s3:// URL (io=remote)\n"
        "                           tar:PATTERN[,fields=EXT:EXT] (shards: {000..099}, globs;\n"
        "                             http(s):// and s3:// URLs)\n"
        "                             [,mode=stream[,shuffle_buffer=N][,seed=S]\n"
        "                             [,rank=R,world_size=W]] streaming: each shard read from\n"
        "                             start to end, shards in a (seed, epoch) order split\n"
        "                             over ranks and workers, N samples mixed (default 1000)\n"
        "                             [,ragged=EXT:EXT][,packed=EXT:EXT] members of varying\n"
        "                             size (raw, .txt, .json, .npy) padded / packed, with\n"
        "                             lengths; [,max_len=N|EXT:N:EXT:N] caps them (required\n"
        "                             with mode=stream), a longer one a bad sample or cut\n"
        "                             with [,truncate]\n"
        "                           images:DIR[,size=224][,train|eval][,layout=chw|hwc]\n"
        "                             [,dtype=u8|f32][,mean=R:G:B,std=R:G:B][,seed=N]\n"
        "                             [,max_decode_bytes=SIZE] (default 256M)\n");
    fprintf(f,
            "  --batch-size N         samples per batch, >= 1 (default 256)\n"
            "  --workers N|auto       worker threads 0..1024, 0 = the caller's thread; auto (the\n"
            "                         default): one per core (at most 16), how many get work\n"
            "                         adapted to throughput and the consumer's waits\n"
            "  --prefetch N|auto      batches in flight per worker, 1..1024; auto (the default):\n"
            "                         2, and a deeper window for batches under 256 KiB\n"
            "  --shuffle[=KIND]       an order keyed by (seed, epoch); KIND: random (a bare\n"
            "                         --shuffle), none (sequential), or block[:ROWS[:WINDOW]]:\n"
            "                         block shuffle, the blocks of ROWS consecutive rows (default\n"
            "                         4096) in random order, WINDOW blocks (default 16) mixed at\n"
            "                         a time: nearly sequential reads (docs/loader.md)\n"
            "  --seed N               0..18446744073709551615 (default 0)\n"
            "  --epochs N             >= 1 (default 1)\n"
            "  --drop-last            drop a partial last batch\n"
            "  --no-pin-memory        ordinary memory, no pinning\n"
            "  --pin-memory-device NAME[:I]  pin for this backend (a warning if it cannot pin:\n"
            "                         unavailable, or cpu, which pins nothing)\n"
            "  --out-of-order         deliver batches as they complete\n"
            "  --distributed          load this rank's share only (DistributedSampler's split);\n"
            "                         rank and world size from RANK/WORLD_SIZE, Open MPI or Slurm\n"
            "  --limit BATCHES        stop after this many batches in all; 0 = no limit (default)\n"
            "  --device NAME[:I]      copy every batch to this device asynchronously\n"
            "  --verify               with --device: read every batch back from the device and\n"
            "                         hash what it holds\n"
            "  --on-error=POLICY      a failing sample: error (default: the run fails),\n"
            "                         skip[:N|:P%%] (dropped; past N per epoch, or P%%, error) or\n"
            "                         replace[:N|:P%%] (a deterministic replacement); JSON\n"
            "                         bad_samples and quarantine list them\n"
            "  --worker-mode=MODE     threads (default) or processes: each worker loads in a\n"
            "                         child process, a crash fails only its sample (map-style\n"
            "                         sources; JSON worker_mode, worker_restarts)\n"
            "  --arena NAME[:SIZE]    batches in the pinned arena NAME (auto: the job's) shared\n"
            "                         by the node's processes; SIZE creates it (docs/ipc.md)\n"
            "  --no-hash              skip content_hash\n"
            "  --json                 one JSON object on stdout, errors included\n"
            "  (an option's value may also be given as --option=VALUE)\n");
    fprintf(f,
            "\n"
            "content_hash covers field 0 (\"data\") only, of exactly the samples the run\n"
            "delivered: the sum modulo 2^64 of the 64-bit FNV-1a hash of each delivered sample's\n"
            "bytes (a sample delivered in two epochs counts twice), independent of the order.\n"
            "Host batches: it is computed in a second, untimed pass after the timed one, which\n"
            "runs the epochs the timed pass reached again with the same loader and hashes the\n"
            "samples the timed pass delivered (of an epoch cut short by --limit, the delivered\n"
            "indices are kept, 8 bytes each; a sample the timed pass skipped is left out);\n"
            "JSON \"hash_pass_seconds\" is that pass's time.  When the hash pass cannot hash\n"
            "exactly those samples (one failed in the hash pass only, or was replaced in the\n"
            "timed pass only), content_hash is null and \"content_hash_reason\" says why\n"
            "(text: \"content_hash none (REASON)\").\n"
            "--device --verify: computed inside the timed pass from the bytes read back from the\n"
            "device.  --device without\n"
            "--verify: not computed (null).  null too when the run failed or with --no-hash.\n"
            "order_hash: FNV-1a over the delivered indices, one 64-bit word each.\n"
            "index_sum: the sum of the delivered indices.  With --json, any error prints\n"
            "{\"ok\": false, \"error\": \"...\"} on stdout as well as the message on stderr, with\n"
            "\"error_code\" and \"error_name\" (the library's status: -4, \"STOKE_EIO\") when the\n"
            "library failed; the exit status is 2 for a usage error, 1 for any other error (a\n"
            "failed write to stdout too).\n");
}

/* Parses the KIND of --shuffle=KIND into a->order and the block sizes.  0, or -1 after
 * reporting the error. */
static int parse_shuffle(const cli_cmd *c, const char *kind, load_args *a)
{
    a->block_rows = a->block_window = 0;
    if (strcmp(kind, "random") == 0 || strcmp(kind, "none") == 0) {
        a->order = kind[0] == 'r' ? ORDER_RANDOM : ORDER_SEQUENTIAL;
        return 0;
    }
    if (strncmp(kind, "block", 5) != 0 || (kind[5] != '\0' && kind[5] != ':'))
        return cli_fail(c, -1, "--shuffle=%s: expected random, none or block[:ROWS[:WINDOW]]",
                        kind);
    a->order = ORDER_BLOCK;
    a->block_rows = STOKE_SAMPLER_BLOCK_ROWS_DEFAULT;
    a->block_window = STOKE_SAMPLER_BLOCK_WINDOW_DEFAULT;
    const char *p = kind[5] ? kind + 6 : NULL;
    uint64_t *dst[2] = {&a->block_rows, &a->block_window};
    for (int k = 0; k < 2 && p; k++) {
        char num[32];
        size_t n = strcspn(p, ":");
        if (n >= sizeof(num) || (k == 1 && p[n] != '\0'))
            return cli_fail(c, -1, "--shuffle=%s: expected block[:ROWS[:WINDOW]]", kind);
        memcpy(num, p, n);
        num[n] = '\0';
        if (cli_u64(c, k ? "--shuffle=block:ROWS:WINDOW" : "--shuffle=block:ROWS", num, 1,
                    1ull << 48, dst[k]) < 0)
            return -1;
        p = p[n] ? p + n + 1 : NULL;
    }
    return 0;
}

/* Fills *a from the command line.  Returns -1 to go on, or the exit status (help printed, or
 * a usage error reported). */
static int parse_args(int argc, char **argv, load_args *a)
{
    static const struct {
        const char *name;
        size_t off;
        uint64_t min, max;
    } nums[] = {{"--batch-size", offsetof(load_args, batch), 1, SIZE_MAX},
                {"--seed", offsetof(load_args, seed), 0, UINT64_MAX},
                {"--epochs", offsetof(load_args, epochs), 1, UINT64_MAX},
                {"--limit", offsetof(load_args, limit), 0, UINT64_MAX}};
    static const struct {
        const char *name;
        size_t off;
    } strs[] = {{"--pin-memory-device", offsetof(load_args, pin_dev)},
                {"--device", offsetof(load_args, device)},
                {"--on-error", offsetof(load_args, on_error)},
                {"--worker-mode", offsetof(load_args, worker_mode)},
                {"--arena", offsetof(load_args, arena)}};
    static const struct {
        const char *name;
        size_t off;
        int value;
    } flags[] = {{"--shuffle", offsetof(load_args, order), ORDER_RANDOM},
                 {"--drop-last", offsetof(load_args, drop_last), 1},
                 {"--no-pin-memory", offsetof(load_args, pin), 0},
                 {"--verify", offsetof(load_args, verify), 1},
                 {"--out-of-order", offsetof(load_args, in_order), 0},
                 {"--distributed", offsetof(load_args, distributed), 1},
                 {"--no-hash", offsetof(load_args, hash), 0},
                 {"--json", offsetof(load_args, cmd.json), 1}};
    *a = (load_args){.cmd = {"load", cli_has_json(argc, argv)},
                     .batch = 256,
                     .workers = 0,
                     .workers_auto = 1,
                     .prefetch = 2,
                     .prefetch_auto = 1,
                     .epochs = 1,
                     .pin = 1,
                     .in_order = 1,
                     .hash = 1};
    const cli_cmd *c = &a->cmd;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i], *v;
        int got = 0;
        if (cli_is(arg, "--help") || cli_is(arg, "-h")) {
            usage(stdout);
            return 0;
        }
        if ((got = cli_opt(c, argc, argv, &i, "--workers", &v)) < 0)
            return 2;
        if (got) {
            a->workers_auto = strcmp(v, "auto") == 0;
            if (!a->workers_auto && cli_u64(c, "--workers", v, 0, 1024, &a->workers) < 0)
                return 2;
        }
        int pf = got ? 0 : cli_opt(c, argc, argv, &i, "--prefetch", &v);
        if (pf < 0)
            return 2;
        if (pf) {
            got = 1;
            a->prefetch_auto = strcmp(v, "auto") == 0;
            if (!a->prefetch_auto && cli_u64(c, "--prefetch", v, 1, 1024, &a->prefetch) < 0)
                return 2;
        }
        for (size_t k = 0; k < sizeof(nums) / sizeof(nums[0]) && !got; k++)
            if ((got = cli_opt(c, argc, argv, &i, nums[k].name, &v)) != 0 &&
                (got < 0 || cli_u64(c, nums[k].name, v, nums[k].min, nums[k].max,
                                    (uint64_t *)((char *)a + nums[k].off)) < 0))
                return 2;
        for (size_t k = 0; k < sizeof(strs) / sizeof(strs[0]) && !got; k++)
            if ((got = cli_opt(c, argc, argv, &i, strs[k].name, &v)) < 0)
                return 2;
            else if (got)
                *(const char **)((char *)a + strs[k].off) = v;
        if (!got && (cli_is(arg, "--shuffle") || strncmp(arg, "--shuffle=", 10) == 0)) {
            /* one order: of two that differ, the last one silently won */
            const char *kind = arg[9] ? arg + 10 : "random";
            if (a->order_arg && strcmp(a->order_arg, kind) != 0)
                return cli_fail(c, 2, "--shuffle=%s and --shuffle=%s: give one order",
                                a->order_arg, kind);
            a->order_arg = kind;
        }
        for (size_t k = 0; k < sizeof(flags) / sizeof(flags[0]) && !got; k++)
            if ((got = cli_is(arg, flags[k].name)) != 0)
                *(int *)((char *)a + flags[k].off) = flags[k].value;
        if (!got && strncmp(arg, "--shuffle=", 10) == 0) {
            if (parse_shuffle(c, arg + 10, a) < 0)
                return 2;
            got = 1;
        }
        if (got)
            continue;
        if (arg[0] == '-' && arg[1] != '\0') {
            if (!c->json)
                usage(stderr);
            return cli_fail(c, 2, "unknown option '%s' (stoke load --help lists them)", arg);
        }
        if (a->source) {
            char other[512];
            stoke_source_redact(a->shown, sizeof(a->shown), a->source);
            return cli_fail(c, 2, "only one SOURCE (got '%s' and '%s')", a->shown,
                            stoke_source_redact(other, sizeof(other), arg));
        }
        a->source = arg;
    }
    if (!a->source)
        a->source = "synthetic";
    stoke_source_redact(a->shown, sizeof(a->shown), a->source);
    stoke_loader_opts_init(&a->bad);
    if (a->on_error && stoke_on_error_parse(a->on_error, &a->bad) != STOKE_OK)
        return cli_fail(c, 2, "--on-error=%s: expected error, skip[:N|:P%%] or replace[:N|:P%%]",
                        a->on_error);
    if (a->verify && !a->device)
        return cli_fail(c, 2, "--verify needs --device");
    if (a->worker_mode && strcmp(a->worker_mode, "threads") != 0 &&
        !(a->procs = strcmp(a->worker_mode, "processes") == 0))
        return cli_fail(c, 2, "--worker-mode=%s: expected threads or processes", a->worker_mode);
    return -1;
}

/* Records the loader's failure (status `rc`) in r->err and on stderr. */
static void run_failed(load_run *r, int rc)
{
    const char *msg = stoke_loader_last_error(r->l);
    snprintf(r->err, sizeof(r->err), "%s", msg && *msg ? msg : stoke_strerror(rc));
    fprintf(stderr, "%sstoke load: %s\n", r->bar ? "\n" : "", r->err);
    r->status = 1;
    r->code = rc;
}

static void keep_indices(delivered *d, const uint64_t *idx, size_t n)
{
    if (d->lost)
        return;
    if (d->cap - d->n < n) {
        size_t cap = d->cap ? d->cap : 1024;
        while (cap - d->n < n && cap <= SIZE_MAX / 2 / sizeof(*d->idx))
            cap *= 2;
        uint64_t *p = cap - d->n >= n ? realloc(d->idx, cap * sizeof(*p)) : NULL;
        if (!p) {
            fprintf(stderr,
                    "stoke load: out of memory keeping the indices of %zu delivered "
                    "samples: content_hash is not computed\n",
                    d->n + n);
            d->lost = 1;
            return;
        }
        d->idx = p;
        d->cap = cap;
    }
    memcpy(d->idx + d->n, idx, n * sizeof(*idx));
    d->n += n;
}

static int open_loader(const load_args *a, load_run *r)
{
    const cli_cmd *c = &a->cmd;
    int rc = stoke_source_open(a->source, &r->ds);
    if (rc != STOKE_OK) /* the library's message names the source or file */
        return cli_fail_code(c, 1, rc, "%s",
                             *stoke_last_error() ? stoke_last_error() : stoke_strerror(rc));
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = (size_t)a->batch;
    o.num_workers = a->workers_auto ? STOKE_LOADER_WORKERS_AUTO : (int)a->workers;
    o.prefetch_factor = a->prefetch_auto ? STOKE_LOADER_PREFETCH_AUTO : (int)a->prefetch;
    o.shuffle = a->order == ORDER_RANDOM;
    if (a->order == ORDER_BLOCK) {
        o.sampler.kind = STOKE_SAMPLER_BLOCK;
        o.sampler.block_rows = a->block_rows;
        o.sampler.block_window = a->block_window;
    }
    o.seed = a->seed;
    o.drop_last = a->drop_last;
    o.sampler.distributed = a->distributed;
    o.pin_memory = a->pin;
    o.pin_memory_device = a->pin_dev;
    o.in_order = a->in_order;
    o.device = a->device;
    o.on_error = a->bad.on_error;
    o.max_bad = a->bad.max_bad;
    o.max_bad_fraction = a->bad.max_bad_fraction;
    o.worker_mode = a->procs ? STOKE_WORKER_PROCESSES : STOKE_WORKER_THREADS;
    o.arena = a->arena;
    rc = stoke_loader_create(&o, &r->ds, &r->l);
    if (rc != STOKE_OK)
        return cli_fail_code(c, 1, rc, "%s",
                             *stoke_last_error() ? stoke_last_error() : stoke_strerror(rc));
    uint64_t per_epoch = stoke_loader_num_batches(r->l);
    /* the split: unknown for an iterable source (a tar stream's is in its spec: null) */
    r->rank = r->ds.kind == STOKE_DATASET_MAP ? 0 : -1;
    r->world = r->ds.kind == STOKE_DATASET_MAP ? 1 : -1;
    stoke_sampler *s = NULL; /* (the loader made its own from the same options: it succeeds) */
    if (a->distributed && r->ds.kind == STOKE_DATASET_MAP &&
        stoke_sampler_create(&o.sampler, r->ds.length(r->ds.user), &s) == STOKE_OK) {
        r->rank = stoke_sampler_rank(s);
        r->world = stoke_sampler_world_size(s);
        stoke_sampler_destroy(s);
    }
    /* an iterable source does not know its length: run until the epochs end */
    r->total =
        per_epoch && per_epoch <= UINT64_MAX / a->epochs ? per_epoch * a->epochs : UINT64_MAX;
    if (per_epoch == 0 && r->ds.kind == STOKE_DATASET_MAP) {
        /* every epoch is empty: said, and none run (2^64 - 1 empty epochs ran for hours, a
         * wrong file or batch size "succeeded" with no word) */
        uint64_t n = r->ds.length(r->ds.user);
        fprintf(stderr,
                "stoke load: warn: every epoch is empty: %s has %" PRIu64 " samples%s%s; "
                "nothing is loaded\n",
                a->shown, n, a->distributed ? " (for all ranks)" : "",
                n && a->drop_last ? ", fewer than a batch, and --drop-last drops the part batch"
                                  : "");
        r->total = 0;
    }
    r->full = r->total;
    if (a->limit && a->limit < r->total)
        r->total = a->limit;
    r->sample_bytes = r->ds.fields[0].bytes;
    if (r->ds.fields[0].ndim && r->ds.fields[0].shape[0] == STOKE_DIM_VAR &&
        !(r->spans = calloc(2 * (size_t)a->batch, sizeof(*r->spans))))
        return cli_fail(c, 1, "out of memory for the spans of %zu samples", (size_t)a->batch);
    r->bar = isatty(2);
    r->order = FNV_OFFSET;
    if (a->verify) {
        stoke_loader_get_stats(r->l, &r->st); /* a batch's field 0 fits in one buffer */
        r->scratch = malloc((size_t)r->st.buffer_bytes);
        if (!r->scratch)
            return cli_fail(c, 1, "out of memory for a --verify buffer of %" PRIu64 " bytes",
                            r->st.buffer_bytes);
    }
    return 0;
}

static void progress(const load_run *r, uint64_t now)
{
    double secs = (double)(now - r->t0) / 1e9;
    double rate = secs > 0 ? (double)r->samples / secs : 0.0;
    if (r->total == UINT64_MAX) {
        fprintf(stderr, "\r%" PRIu64 " batches  %.0f samples/s ", r->batches, rate);
    } else {
        int width = 30, fill = (int)(r->batches * (uint64_t)width / r->total);
        char bar[64];
        for (int i = 0; i < width; i++)
            bar[i] = i < fill ? '#' : '.';
        bar[width] = '\0';
        fprintf(stderr, "\r[%s] %" PRIu64 "/%" PRIu64 " batches  %.0f samples/s ", bar, r->batches,
                r->total, rate);
    }
    stoke_remote_stats net = {.size = sizeof(net)};
    if (remote_stats(&r->ds, &net) && net.shards)
        fprintf(stderr,
                " network %.1f MB, %" PRIu64 " requests, %" PRIu64 " retries, %.1f s waited ",
                (double)net.bytes / 1e6, net.requests, net.retries, net.network_wait_s);
    fflush(stderr);
}

/* The timed pass's work on one delivered batch, which it releases.  A batch counts as
 * delivered as soon as next() returns it, before its device copy is waited for, as in the
 * loader's statistics.  Returns the status of the device wait / read back. */
static int take_batch(load_run *r, stoke_batch *b)
{
    const load_args *a = r->a;
    size_t n = stoke_batch_count(b);
    const uint64_t *idx = stoke_batch_indices(b);
    for (size_t i = 0; i < n; i++)
        r->index_sum += idx[i];
    r->order = cmd_load_hash_order(r->order, idx, n);
    r->batches++;
    r->samples += n;
    int rc = STOKE_OK;
    if (a->device) {
        rc = stoke_batch_device_wait(b);
        if (rc == STOKE_OK && a->verify)
            rc = stoke_batch_device_read(b, 0, r->scratch);
        if (rc == STOKE_OK && a->verify && a->hash)
            r->content += cmd_load_hash_batch(r->scratch, cmd_load_spans(r, b), n, r->sample_bytes);
    } else if (a->hash && r->total != r->full) {
        /* Only a --limit inside the run can end an epoch part-way: only then does the hash pass
         * need to know which samples came (8 bytes each, of that epoch alone, bounded by the
         * limit).  A run to the end keeps nothing. */
        keep_indices(&r->seen, idx, n);
    }
    stoke_batch_release(b);
    return rc;
}

/* Ctrl-C while the progress bar is drawn ends its line (the shell's prompt went on after the
 * bar); with --json, SIGINT and SIGTERM (when not ignored) print the failure's object, as every
 * failure does (stdout was empty: a harness parsing it got no JSON), made before the run and
 * written here (write() only).  Then the process dies of the signal as before. */
static char json_on_sig[2][1200];
static volatile sig_atomic_t json_on;       /* --json: the object is written */
static volatile sig_atomic_t json_printing; /* the summary is being printed: nothing more */
static volatile sig_atomic_t bar_drawn;     /* the progress bar is drawn: its line ended first */
/* The process that hooked the signals: a worker process (and its zygote) inherits the handler,
 * and a Ctrl-C reaches the whole process group: each of them wrote the object too (three
 * objects on stdout with 2 workers, not JSON).  They only die of the signal. */
static pid_t sig_owner;

static void interrupted(int sig)
{
    if (getpid() != sig_owner) {
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    if (bar_drawn) {
        static const char nl = '\n';
        ssize_t w = write(2, &nl, 1);
        (void)w;
    }
    if (json_on && !json_printing) {
        const char *s = json_on_sig[sig == SIGTERM];
        for (size_t n = strlen(s), k = 0; k < n;) {
            ssize_t w = write(1, s + k, n - k);
            if (w <= 0)
                break;
            k += (size_t)w;
        }
        /* and the message on stderr, as every failure's (docs/loader.md) */
        const char *m = sig == SIGTERM ? "stoke load: interrupted by SIGTERM\n"
                                       : "stoke load: interrupted by SIGINT\n";
        ssize_t w = write(2, m, strlen(m));
        (void)w;
    }
    signal(sig, SIG_DFL);
    raise(sig);
}

static void json_hook_signals(const load_args *a)
{
    sig_owner = getpid();
    json_on = 1;
    static const int sigs[2] = {SIGINT, SIGTERM};
    for (int i = 0; i < 2; i++) {
        FILE *f = fmemopen(json_on_sig[i], sizeof(json_on_sig[i]) - 1, "w");
        if (!f)
            continue;
        fprintf(f,
                "{\"ok\": false, \"error\": \"stoke load: interrupted by %s\", "
                "\"error_code\": null, \"error_name\": null, \"signal\": \"%s\", "
                "\"source\": ",
                i ? "SIGTERM" : "SIGINT", i ? "SIGTERM" : "SIGINT");
        cli_json_str(f, a->shown);
        fputs("}\n", f);
        int bad = ferror(f) || ftell(f) >= (long)sizeof(json_on_sig[i]) - 2;
        fclose(f);
        struct sigaction old, on = {.sa_handler = interrupted};
        if (!bad && sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
            sigaction(sigs[i], &on, NULL);
    }
}

/* Pass 1, timed: --epochs epochs, at most r->total batches in all. */
static void timed_pass(load_run *r)
{
    uint64_t last_bar = 0;
    struct sigaction old, on_int = {.sa_handler = interrupted};
    sig_owner = getpid();
    int hooked = r->bar && !r->a->cmd.json && sigaction(SIGINT, NULL, &old) == 0 &&
                 old.sa_handler == SIG_DFL && sigaction(SIGINT, &on_int, NULL) == 0;
    r->t0 = cmd_load_now_ns();
    for (uint64_t e = 0; e < r->a->epochs && r->batches < r->total && !r->status; e++) {
        stoke_batch *b;
        int rc = e ? stoke_loader_set_epoch(r->l, e) : STOKE_OK;
        r->seen.epochs = e + 1;
        r->seen.n = 0; /* the epochs before were delivered whole */
        r->seen.whole_samples = r->samples;
        r->seen.whole_sum = r->index_sum;
        while (rc == STOKE_OK && r->batches < r->total &&
               (rc = stoke_loader_next(r->l, &b)) == STOKE_OK) {
            rc = take_batch(r, b);
            if (!r->bar) /* no clock read per batch (at batch size 1 it is a tenth of one) */
                continue;
            uint64_t t = cmd_load_now_ns();
            if (t - last_bar > 100000000u || r->batches == r->total) {
                last_bar = t;
                progress(r, t);
            }
        }
        /* whole: it ended, or it delivered the run's last batch without a --limit */
        r->seen.last_whole = rc == STOKE_EEND || (rc == STOKE_OK && r->total == r->full);
        if (rc != STOKE_OK && rc != STOKE_EEND)
            run_failed(r, rc);
    }
    r->t1 = cmd_load_now_ns();
    stoke_loader_get_stats(r->l, &r->st);
    r->staged_ok =
        source_is(&r->ds, "npy:") &&
        stoke_npy_block_staged(&r->ds, &r->staged[0], &r->staged[1], &r->staged[2]) == STOKE_OK;
    r->remote.size = sizeof(r->remote);
    r->remote_ok = remote_stats(&r->ds, &r->remote) && r->remote.shards;
    if (hooked)
        sigaction(SIGINT, &old, NULL);
    if (r->bar)
        fputc('\n', stderr);
}

/* ---- the summary ----------------------------------------------------------------------- */

static void json_str_or_null(const char *key, const char *s)
{
    printf(", \"%s\": ", key);
    if (s)
        cli_json_str(stdout, s);
    else
        printf("null");
}

static const char *order_name(int order)
{
    return order == ORDER_BLOCK ? "block" : order == ORDER_RANDOM ? "random" : "sequential";
}

/* The I/O mode the npy source uses (io=auto resolved), or NULL for another source. */
static const char *io_used(const load_run *r)
{
    int io = source_is(&r->ds, "npy:") ? stoke_npy_io_used(&r->ds) : -1;
    return io < 0 ? NULL : stoke_npy_io_name(io);
}

/* "order", "block_rows" and "block_window" (the sizes in use; null unless block), "io", and
 * "block_buffers" (the npy source's block buffers in the timed pass: blocks read whole, of
 * those with O_DIRECT, rows copied from them; null for another source). */
static void print_json_order(const load_run *r)
{
    const load_args *a = r->a;
    json_str_or_null("order", order_name(a->order));
    if (a->order == ORDER_BLOCK)
        printf(", \"block_rows\": %" PRIu64 ", \"block_window\": %" PRIu64, a->block_rows,
               a->block_window);
    else
        printf(", \"block_rows\": null, \"block_window\": null");
    json_str_or_null("io", io_used(r));
    if (r->staged_ok)
        printf(", \"block_buffers\": {\"blocks\": %" PRIu64 ", \"direct\": %" PRIu64
               ", \"rows\": %" PRIu64 "}",
               r->staged[0], r->staged[1], r->staged[2]);
    else
        printf(", \"block_buffers\": null");
}

/* "bad_samples" and "quarantine": the timed pass's bad samples (the hash pass meets them again;
 * those entries come after r->st.quarantined and are left out). */
static void print_json_bad(const load_run *r)
{
    printf(", \"on_error\": ");
    cli_json_str(stdout, r->a->on_error ? r->a->on_error : "error");
    printf(", \"bad_samples\": %" PRIu64 ", \"skipped_samples\": %" PRIu64
           ", \"replaced_samples\": %" PRIu64 ", \"quarantine\": [",
           r->st.bad_samples, r->st.skipped_samples, r->st.replaced_samples);
    for (uint64_t i = 0; r->l && i < r->st.quarantined; i++) {
        stoke_bad_sample q;
        if (stoke_loader_quarantine(r->l, (size_t)i, &q) != STOKE_OK)
            break;
        printf("%s{\"index\": %" PRIu64 ", \"source\": ", i ? ", " : "", q.index);
        cli_json_str(stdout, q.source);
        printf(", \"reason\": ");
        cli_json_str(stdout, q.reason);
        /* the on_error spec's words, as Python's quarantine() gives them */
        printf(", \"action\": \"%s\"", q.action == STOKE_ON_ERROR_SKIP      ? "skip"
                                       : q.action == STOKE_ON_ERROR_REPLACE ? "replace"
                                                                            : "error");
        if (q.replacement != UINT64_MAX)
            printf(", \"replacement\": %" PRIu64, q.replacement);
        printf("}");
    }
    printf("], \"truncated_samples\": %" PRIu64, r->st.truncated_samples);
}

/* "remote": the remote shards' counters after the timed pass (the open's included), or null
 * for another source; the cache_* ones 0 when "cached" is false (no STOKE_CACHE_DIR). */
static void print_json_remote(const load_run *r)
{
    const stoke_remote_stats *m = &r->remote;
    if (!r->remote_ok) {
        printf(", \"remote\": null");
        return;
    }
    printf(", \"remote\": {\"shards\": %" PRIu64 ", \"requests\": %" PRIu64
           ", \"retries\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"network_wait_s\": %.6f",
           m->shards, m->requests, m->retries, m->bytes, m->network_wait_s);
    printf(", \"cached\": %s, \"cache_hits\": %" PRIu64 ", \"cache_misses\": %" PRIu64
           ", \"cache_evictions\": %" PRIu64 ", \"cache_bytes\": %" PRIu64 "}",
           m->cached ? "true" : "false", m->cache_hits, m->cache_misses, m->cache_evictions,
           m->cache_bytes);
}

static void print_json(const load_run *r, const char *content_src, const char *why,
                       const char *accel, const char *pinned_for, double secs)
{
    const load_args *a = r->a;
    const stoke_loader_stats *st = &r->st;
    printf("{\"ok\": %s", r->status ? "false" : "true");
    json_str_or_null("error", r->status ? r->err : NULL);
    if (r->status)
        printf(", \"error_code\": %d", r->code);
    else
        printf(", \"error_code\": null");
    json_str_or_null("error_name", r->status ? stoke_err_name(r->code) : NULL);
    json_str_or_null("source", a->shown);
    printf(", \"samples\": %" PRIu64 ", \"batches\": %" PRIu64 ", \"seconds\": %.6f", r->samples,
           r->batches, secs);
    printf(", \"samples_per_s\": %.1f, \"bytes_per_s\": %.1f", (double)r->samples / secs,
           (double)st->bytes / secs);
    json_str_or_null("accelerator", accel);
    json_str_or_null("pinned_for", pinned_for);
    printf(", \"pinned_batches\": %" PRIu64 ", \"pageable_batches\": %" PRIu64, st->pinned_batches,
           st->pageable_batches);
    printf(", \"index_sum\": %" PRIu64, r->index_sum);
    if (content_src)
        printf(", \"content_hash\": \"0x%016" PRIx64 "\"", r->content);
    else
        printf(", \"content_hash\": null");
    json_str_or_null("content_hash_from", content_src);
    json_str_or_null("content_hash_reason", content_src ? NULL : why);
    printf(", \"order_hash\": \"0x%016" PRIx64 "\"", r->order);
    printf(", \"data_wait_s\": %.6f, \"wait_p50_s\": %.6f, \"wait_p99_s\": %.6f", st->wait_s,
           st->wait_p50_s, st->wait_p99_s);
    printf(", \"worker_busy_s\": %.6f, \"hash_pass_seconds\": ", st->worker_busy_s);
    if (r->hash_pass)
        printf("%.6f", (double)r->hash_ns / 1e9);
    else
        printf("null");
    printf(", \"bytes\": %" PRIu64 ", \"batch_size\": %" PRIu64 ", \"workers\": %" PRIu64
           ", \"workers_auto\": %s, \"workers_active\": %" PRIu64
           ", \"workers_active_min\": %" PRIu64 ", \"workers_active_max\": %" PRIu64
           ", \"workers_changes\": %" PRIu64 ", \"assisted_batches\": %" PRIu64,
           st->bytes, a->batch, st->workers, a->workers_auto ? "true" : "false", st->workers_active,
           st->workers_active_min, st->workers_active_max, st->workers_changes,
           st->assisted_batches);
    /* epochs: asked for; epochs_run: begun by the timed pass (fewer after an error, a --limit,
     * or none when every epoch is empty) */
    printf(", \"epochs\": %" PRIu64 ", \"epochs_run\": %" PRIu64 ", \"shuffle\": %s, "
           "\"seed\": %" PRIu64 ", \"distributed\": %s",
           a->epochs, r->seen.epochs, a->order ? "true" : "false", a->seed,
           a->distributed ? "true" : "false");
    if (r->rank >= 0)
        printf(", \"rank\": %" PRId64 ", \"world_size\": %" PRId64, r->rank, r->world);
    else
        printf(", \"rank\": null, \"world_size\": null");
    print_json_order(r);
    json_str_or_null("device", a->device);
    printf(", \"device_copies\": %" PRIu64 ", \"device_errors\": %" PRIu64 ", \"verified\": %s",
           st->device_copies, st->device_errors, a->verify && !r->status ? "true" : "false");
    print_json_bad(r);
    print_json_remote(r);
    printf(", \"worker_mode\": \"%s\", \"worker_restarts\": %" PRIu64,
           a->procs ? "processes" : "threads", st->worker_restarts);
    printf(", \"buffers\": %" PRIu64 ", \"buffer_bytes\": %" PRIu64 "}\n", st->buffers,
           st->buffer_bytes);
}

static void print_text(const load_run *r, const char *content_src, const char *why,
                       const char *accel, const char *pinned_for, double secs)
{
    const load_args *a = r->a;
    const stoke_loader_stats *st = &r->st;
    printf("stoke load %s: %" PRIu64 " samples in %" PRIu64 " batches, %.3f s, %.0f samples/s, "
           "%.1f MB/s%s\n",
           a->shown, r->samples, r->batches, secs, (double)r->samples / secs,
           (double)st->bytes / secs / 1e6, r->status ? " (FAILED)" : "");
    printf("  accelerator: %s; pinned for: %s; batches pinned: %" PRIu64 ", pageable: %" PRIu64
           "\n",
           accel ? accel : "none", pinned_for ? pinned_for : "none", st->pinned_batches,
           st->pageable_batches);
    if (a->device)
        printf("  device %s: %" PRIu64 " batches copied, %" PRIu64 " failed%s\n", a->device,
               st->device_copies, st->device_errors,
               a->verify && !r->status ? ", read back and hashed" : "");
    printf("  order: %s", order_name(a->order));
    if (a->order == ORDER_BLOCK)
        printf(" (blocks of %" PRIu64 " rows, %" PRIu64 " mixed at a time)", a->block_rows,
               a->block_window);
    const char *io = io_used(r);
    if (io)
        printf("; io: %s", io);
    if (a->distributed && r->rank >= 0)
        printf("; rank %" PRId64 " of %" PRId64, r->rank, r->world);
    printf("\n");
    printf("  consumer waited %.3f s (p50 %.1f us, p99 %.1f us); workers busy %.3f s\n", st->wait_s,
           st->wait_p50_s * 1e6, st->wait_p99_s * 1e6, st->worker_busy_s);
    printf("  workers: %s%" PRIu64 " %s, %" PRIu64 " given work at the end (%" PRIu64 "..%" PRIu64
           " during the run)\n",
           a->workers_auto ? "auto, " : "", st->workers, a->procs ? "processes" : "threads",
           st->workers_active, st->workers_active_min, st->workers_active_max);
    if (st->worker_restarts) /* (as in --json: a text run said nothing of a dead worker) */
        printf("  worker processes restarted: %" PRIu64 "\n", st->worker_restarts);
    printf("  index_sum %" PRIu64 ", content_hash ", r->index_sum);
    if (content_src)
        printf("0x%016" PRIx64 " (field 0, %s)", r->content,
               a->device ? "read back from the device" : "second untimed pass");
    else
        printf("none (%s)", why);
    printf(", order_hash 0x%016" PRIx64 "\n", r->order);
    if (r->remote_ok) {
        const stoke_remote_stats *m = &r->remote;
        printf("  remote: %" PRIu64 " shards, %" PRIu64 " requests (%" PRIu64
               " retries), %.1f MB received, %.3f s waiting on the network",
               m->shards, m->requests, m->retries, (double)m->bytes / 1e6, m->network_wait_s);
        if (m->cached)
            printf(
                "; cache: %" PRIu64 " hits, %" PRIu64 " downloads (%.1f MB), %" PRIu64 " evictions",
                m->cache_hits, m->cache_misses, (double)m->cache_bytes / 1e6, m->cache_evictions);
        printf("\n");
    }
    if (st->truncated_samples) /* (ragged fields cut at max_len: said in --json only) */
        printf("  samples truncated to a ragged field's max_len: %" PRIu64 "\n",
               st->truncated_samples);
    if (st->bad_samples || a->on_error)
        printf("  bad samples: %" PRIu64 " (%" PRIu64 " skipped, %" PRIu64 " replaced; "
               "on-error %s)\n",
               st->bad_samples, st->skipped_samples, st->replaced_samples,
               a->on_error ? a->on_error : "error");
}

static void print_summary(const load_run *r)
{
    const load_args *a = r->a;
    stoke_accelerator_info acc;
    const char *accel = stoke_accelerator_get(&acc) == STOKE_OK ? acc.backend : NULL;
    const char *pinned_for = stoke_loader_pinned_backend(r->l);
    double secs = (double)(r->t1 - r->t0) / 1e9;
    if (secs <= 0)
        secs = 1e-9;
    /* why content_hash is null, if it is */
    const char *why = r->status                 ? "the run failed"
                      : !a->hash                ? "--no-hash"
                      : a->device && !a->verify ? "--device without --verify: the batches are "
                                                  "not read back"
                      : r->seen.lost            ? "out of memory keeping the delivered indices"
                      : r->hash_why[0]          ? r->hash_why
                                                : NULL;
    const char *content_src = why ? NULL : a->device ? "device_readback" : "host_second_pass";
    if (a->cmd.json)
        print_json(r, content_src, why, accel, pinned_for, secs);
    else
        print_text(r, content_src, why, accel, pinned_for, secs);
}

int cmd_load(int argc, char **argv)
{
    load_args a;
    int status = parse_args(argc, argv, &a);
    if (status >= 0)
        return status;
    load_run r = {.a = &a, .st = {.size = sizeof(r.st)}};
    if (a.cmd.json)
        json_hook_signals(&a);
    status = open_loader(&a, &r);
    if (status == 0) {
        bar_drawn = r.bar;
        timed_pass(&r);
        if (!r.status && a.hash && !a.device && !r.seen.lost)
            cmd_load_hash_pass(&r);
        json_printing = 1;
        print_summary(&r);
        status = r.status;
    }
    free(r.seen.idx);
    free(r.scratch);
    free(r.spans);
    stoke_loader_destroy(r.l);
    stoke_dataset_close(&r.ds);
    return status;
}
