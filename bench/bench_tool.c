/* The C side of bench/peers.py: the gather bound, the order, and the I/O limits.
 *
 *     bench_tool gather DATA.npy [--labels L.npy] [--batch B] [--threads T] [--seed S]
 *                       [--epoch E] [--limit SAMPLES] [--sequential]
 *         Gathers the rows of stoke's shuffled order (stoke_sampler_index, RANDOM, keyed by
 *         (seed, epoch): the order `stoke load --shuffle` delivers) into a batch buffer per
 *         thread, batch k by thread k mod T, from the file mapped with MAP_POPULATE.  The order is
 *         computed before the clock starts; only the copies are timed.  Labels (any 1-D dtype)
 *         are gathered beside the rows.  Prints {"samples", "seconds", "samples_per_s",
 *         "bytes_per_s", "index_sum", "order_hash", ...}; order_hash is the CLI's (64-bit FNV-1a
 *         over the indices, one 64-bit word each), so the two can be compared.
 *     bench_tool order N OUT [--seed S] [--epoch E] [--sequential]
 *         Writes the first N positions' indices of the same order as little-endian uint64 to OUT
 *         (for the NumPy peers) and prints {"samples", "index_sum", "order_hash"}.
 *     bench_tool evict FILE
 *         fdatasync, then posix_fadvise(POSIX_FADV_DONTNEED) over the whole file; prints the
 *         resident fraction (mincore) before and after, so a caller can tell an eviction that
 *         did not happen.
 *     bench_tool randread FILE [--size 4096] [--threads 32] [--count N] [--depth 64] [--pread]
 *         Random reads of --size bytes at distinct --size-aligned offsets, with a deep queue:
 *         io_uring (--depth in flight) when built with liburing and the kernel allows a ring,
 *         else (or with --pread) --threads threads of pread.  "method" says which ran.
 *         O_DIRECT when --size is a multiple of 4096 and the file system allows it, else
 *         buffered with POSIX_FADV_RANDOM.  Evict first for a cold figure.  Prints
 *         {"reads_per_s", "bytes_per_s", "method", ...}.
 *     bench_tool seqread FILE [--block 1048576] [--bytes N]
 *         One thread reading sequentially; prints {"bytes_per_s", ...}.
 *     bench_tool spin
 *         Spins on one core until killed (the "busy core" case's hog).
 *
 * Built by bench/CMakeLists.txt only (never by the tests).  Links libstoke for the sampler. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "stoke/sampler.h"
#include "stoke/status.h"

#ifdef STOKE_BENCH_URING
#include <liburing.h>
#endif

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME  0x100000001b3ull

typedef struct npy_file {
    int fd;
    size_t size;      /* file size */
    size_t data_off;  /* offset of row 0 */
    uint64_t rows;    /* shape[0] */
    size_t row_bytes; /* product of the other dims x item size */
    const unsigned char *map;
} npy_file;

typedef struct opts {
    const char *labels;
    uint64_t batch, threads, seed, epoch, limit, size, count, depth, block, bytes;
    int sequential, pread;
} opts;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int die(const char *what, const char *path)
{
    fprintf(stderr, "bench_tool: %s %s: %s\n", what, path ? path : "",
            errno ? strerror(errno) : "");
    return 1;
}

/* --- .npy header --------------------------------------------------------------------------- */

/* Item size from the descr ('<f4', '|u1', '<i8', ...): the digits after the type letter. */
static size_t descr_itemsize(const char *h)
{
    const char *d = strstr(h, "'descr'");
    if (!d || !(d = strchr(d + 7, '\'')))
        return 0;
    d++;
    while (*d && (*d < '0' || *d > '9') && *d != '\'')
        d++;
    return (size_t)strtoul(d, NULL, 10);
}

/* Fills rows and row_bytes from the 'shape' tuple of header h. */
static int parse_shape(const char *h, size_t item, npy_file *f)
{
    const char *s = strstr(h, "'shape'");
    if (!s || !(s = strchr(s, '(')) || strstr(h, "'fortran_order': True"))
        return -1;
    char *end;
    f->rows = strtoull(s + 1, &end, 10);
    if (end == s + 1)
        return -1;
    f->row_bytes = item;
    for (s = end; *s && *s != ')'; s = end) {
        while (*s == ',' || *s == ' ')
            s++;
        if (*s == ')')
            break;
        unsigned long long d = strtoull(s, &end, 10);
        if (end == s)
            return -1;
        f->row_bytes *= (size_t)d;
    }
    return 0;
}

static int npy_header(npy_file *f, const char *path)
{
    unsigned char pre[12];
    if (pread(f->fd, pre, sizeof pre, 0) != (ssize_t)sizeof pre || memcmp(pre, "\x93NUMPY", 6)) {
        fprintf(stderr, "bench_tool: %s: not an .npy file\n", path);
        return -1;
    }
    size_t hl = pre[6] == 1 ? (size_t)pre[8] | (size_t)pre[9] << 8
                            : (size_t)pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
                                  (size_t)pre[11] << 24;
    size_t start = pre[6] == 1 ? 10 : 12;
    char *h = calloc(1, hl + 1);
    if (!h || pread(f->fd, h, hl, (off_t)start) != (ssize_t)hl) {
        fprintf(stderr, "bench_tool: %s: cannot read the .npy header\n", path);
        free(h);
        return -1;
    }
    size_t item = descr_itemsize(h);
    int rc = item ? parse_shape(h, item, f) : -1;
    free(h);
    f->data_off = start + hl;
    if (rc || f->data_off + f->rows * f->row_bytes > f->size) {
        fprintf(stderr, "bench_tool: %s: unsupported or short .npy\n", path);
        return -1;
    }
    return 0;
}

/* Opens and maps an .npy file; populate: fault every page in now (warm gathers). */
static int npy_open(npy_file *f, const char *path, int populate)
{
    struct stat st;
    memset(f, 0, sizeof *f);
    f->fd = open(path, O_RDONLY);
    if (f->fd < 0 || fstat(f->fd, &st))
        return die("cannot open", path);
    f->size = (size_t)st.st_size;
    if (npy_header(f, path))
        return 1;
    void *m = mmap(NULL, f->size, PROT_READ, MAP_SHARED | (populate ? MAP_POPULATE : 0), f->fd, 0);
    if (m == MAP_FAILED)
        return die("cannot map", path);
    f->map = m;
    return 0;
}

static void npy_close(npy_file *f)
{
    if (f->map)
        munmap((void *)f->map, f->size);
    if (f->fd >= 0)
        close(f->fd);
}

/* --- the order ------------------------------------------------------------------------------ */

/* The first n indices of stoke's order over `len` rows into out; their sum and order_hash. */
static int make_order(const opts *o, uint64_t len, uint64_t n, uint64_t *out, uint64_t *sum,
                      uint64_t *hash)
{
    stoke_sampler_opts so;
    stoke_sampler *s = NULL;
    stoke_sampler_opts_init(&so);
    so.kind = o->sequential ? STOKE_SAMPLER_SEQUENTIAL : STOKE_SAMPLER_RANDOM;
    int rc = stoke_sampler_create(&so, len, &s);
    *sum = 0;
    *hash = FNV_OFFSET;
    for (uint64_t p = 0; !rc && p < n; p++) {
        rc = stoke_sampler_index(s, o->seed, o->epoch, p, &out[p]);
        *sum += out[p];
        *hash = (*hash ^ out[p]) * FNV_PRIME;
    }
    stoke_sampler_destroy(s);
    if (rc)
        fprintf(stderr, "bench_tool: sampler: %s\n", stoke_strerror(rc));
    return rc ? 1 : 0;
}

/* --- gather --------------------------------------------------------------------------------- */

typedef struct gather_job {
    const npy_file *data, *labels;
    const uint64_t *order;
    uint64_t n, batch, threads, first;
    unsigned sink;
    unsigned char *rows, *labs; /* the thread's batch buffers, written once before the clock */
} gather_job;

static void gather_rows(const npy_file *f, const uint64_t *idx, uint64_t k, unsigned char *dst)
{
    const unsigned char *base = f->map + f->data_off;
    size_t rb = f->row_bytes;
    for (uint64_t j = 0; j < k; j++) {
        if (j + 8 < k)
            __builtin_prefetch(base + idx[j + 8] * rb);
        memcpy(dst + j * rb, base + idx[j] * rb, rb);
    }
}

static void *gather_main(void *arg)
{
    gather_job *g = arg;
    size_t lb = g->labels ? g->labels->row_bytes : 0;
    unsigned char *rows = g->rows, *labs = g->labs;
    for (uint64_t b = g->first; b * g->batch < g->n; b += g->threads) {
        uint64_t start = b * g->batch, k = g->n - start < g->batch ? g->n - start : g->batch;
        gather_rows(g->data, g->order + start, k, rows);
        if (g->labels)
            gather_rows(g->labels, g->order + start, k, labs);
        g->sink += rows[(k - 1) * g->data->row_bytes] + (lb ? labs[0] : 0u);
    }
    return NULL;
}

/* Runs fn on each of the n jobs (job i at (char *)jobs + i * size), a thread each, and joins
 * them.  Returns the seconds from the first start to the last join, < 0 when a thread could not
 * start or returned non-NULL (failure). */
static double run_jobs(void *(*fn)(void *), void *jobs, size_t size, uint64_t n)
{
    pthread_t *tid = calloc(n, sizeof *tid);
    if (!tid)
        return -1;
    double t0 = now_s();
    uint64_t started = 0;
    while (started < n &&
           pthread_create(&tid[started], NULL, fn, (char *)jobs + started * size) == 0)
        started++;
    int bad = started < n;
    for (uint64_t t = 0; t < started; t++) {
        void *r = NULL;
        pthread_join(tid[t], &r);
        bad |= r != NULL;
    }
    double dt = now_s() - t0;
    free(tid);
    return bad ? -1 : dt;
}

/* Runs the threads over the order; returns the seconds they took, < 0 on failure. */
static double gather_run(const opts *o, const npy_file *d, const npy_file *l, const uint64_t *order,
                         uint64_t n, unsigned *sink)
{
    gather_job *jobs = calloc(o->threads, sizeof *jobs);
    if (!jobs)
        return -1;
    /* Each thread's buffers are allocated and written before the clock starts, so the bound
     * pays no page faults for them (stoke's batch buffers are resident from the loader's
     * creation: pinned memory, or its resident stand-in). */
    size_t rb = o->batch * d->row_bytes + 64, lb = o->batch * (l ? l->row_bytes : 0) + 64;
    double dt = -1;
    uint64_t ready = 0;
    for (; ready < o->threads; ready++) {
        unsigned char *rows = malloc(rb), *labs = malloc(lb);
        jobs[ready] = (gather_job){d, l, order, n, o->batch, o->threads, ready, 0, rows, labs};
        if (!rows || !labs) {
            ready++;
            goto out;
        }
        memset(rows, 0, rb);
        memset(labs, 0, lb);
    }
    dt = run_jobs(gather_main, jobs, sizeof *jobs, o->threads);
    for (uint64_t t = 0; t < o->threads; t++)
        *sink += jobs[t].sink;
out:
    for (uint64_t t = 0; t < ready; t++) {
        free(jobs[t].rows);
        free(jobs[t].labs);
    }
    free(jobs);
    return dt;
}

static int cmd_gather(const char *path, const opts *o)
{
    npy_file d, l;
    int have_l = o->labels != NULL;
    if (npy_open(&d, path, 1) || (have_l && npy_open(&l, o->labels, 1)))
        return 1;
    if (have_l && l.rows != d.rows) {
        fprintf(stderr, "bench_tool: %s has %" PRIu64 " rows, %s %" PRIu64 "\n", o->labels, l.rows,
                path, d.rows);
        return 1;
    }
    uint64_t n = o->limit && o->limit < d.rows ? o->limit : d.rows, sum, hash;
    uint64_t *order = malloc((n ? n : 1) * sizeof *order);
    unsigned sink = 0;
    if (!order || make_order(o, d.rows, n, order, &sum, &hash))
        return 1;
    double dt = gather_run(o, &d, have_l ? &l : NULL, order, n, &sink);
    if (dt < 0) {
        fprintf(stderr, "bench_tool: gather: a thread failed (memory or pthread_create)\n");
        return 1;
    }
    size_t per = d.row_bytes + (have_l ? l.row_bytes : 0);
    printf("{\"samples\": %" PRIu64 ", \"batches\": %" PRIu64 ", \"seconds\": %.6f, "
           "\"samples_per_s\": %.1f, \"bytes_per_s\": %.1f, \"threads\": %" PRIu64
           ", \"batch_size\": %" PRIu64 ", \"row_bytes\": %zu, \"index_sum\": %" PRIu64
           ", \"order_hash\": \"0x%016" PRIx64 "\", \"sink\": %u}\n",
           n, (n + o->batch - 1) / o->batch, dt, dt > 0 ? (double)n / dt : 0.0,
           dt > 0 ? (double)n * (double)per / dt : 0.0, o->threads, o->batch, per, sum, hash, sink);
    free(order);
    npy_close(&d);
    if (have_l)
        npy_close(&l);
    return 0;
}

static int cmd_order(const char *count, const char *out, const opts *o)
{
    uint64_t n = strtoull(count, NULL, 10), sum, hash;
    uint64_t *order = malloc((n ? n : 1) * sizeof *order);
    if (!order || make_order(o, n, n, order, &sum, &hash))
        return 1;
    FILE *f = fopen(out, "wb");
    /* x86-64 and aarch64 are little-endian: the array is written as it is */
    if (!f || fwrite(order, sizeof *order, n, f) != n || fclose(f))
        return die("cannot write", out);
    printf("{\"samples\": %" PRIu64 ", \"index_sum\": %" PRIu64 ", \"order_hash\": \"0x%016" PRIx64
           "\"}\n",
           n, sum, hash);
    free(order);
    return 0;
}

/* --- page cache ------------------------------------------------------------------------------ */

/* Fraction of the file's pages in the page cache (mincore), < 0 if unknown. */
static double resident(int fd, size_t size)
{
    if (size == 0)
        return 0;
    void *m = mmap(NULL, size, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return -1;
    size_t page = (size_t)sysconf(_SC_PAGESIZE), pages = (size + page - 1) / page, in = 0;
    unsigned char *v = malloc(pages);
    double r = -1;
    if (v && mincore(m, size, v) == 0) {
        for (size_t i = 0; i < pages; i++)
            in += v[i] & 1;
        r = (double)in / (double)pages;
    }
    free(v);
    munmap(m, size);
    return r;
}

static int cmd_evict(const char *path)
{
    struct stat st;
    int fd = open(path, O_RDONLY);
    if (fd < 0 || fstat(fd, &st))
        return die("cannot open", path);
    double before = resident(fd, (size_t)st.st_size);
    fdatasync(fd); /* dirty pages (a file just written) cannot be dropped */
    int rc = posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    double after = resident(fd, (size_t)st.st_size);
    close(fd);
    printf("{\"file\": \"%s\", \"bytes\": %lld, \"fadvise_rc\": %d, \"resident_before\": %.4f, "
           "\"resident_after\": %.4f}\n",
           path, (long long)st.st_size, rc, before, after);
    return rc != 0;
}

/* --- random and sequential reads -------------------------------------------------------------- */

typedef struct read_job {
    int fd;
    const uint64_t *offs;
    uint64_t n, size, threads, first, done;
} read_job;

/* Opens for reading with O_DIRECT when the file system allows it and reads of `size` bytes can be
 * direct (*direct = 1), else buffered with FADV_RANDOM. */
static int open_reader(const char *path, uint64_t size, int *direct)
{
    int fd = size % 4096 ? -1 : open(path, O_RDONLY | O_DIRECT);
    *direct = fd >= 0;
    if (fd < 0 && (fd = open(path, O_RDONLY)) >= 0)
        posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM);
    return fd;
}

/* Distinct size-aligned offsets in random order (a permutation of the file's blocks; a
 * splitmix-driven Fisher-Yates over the first `count` slots). */
static uint64_t *random_offsets(uint64_t blocks, uint64_t count, uint64_t size)
{
    uint64_t *b = malloc(blocks * sizeof *b), x = 0x9e3779b97f4a7c15ull;
    if (!b)
        return NULL;
    for (uint64_t i = 0; i < blocks; i++)
        b[i] = i;
    for (uint64_t i = 0; i < count; i++) {
        uint64_t z = (x += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        z ^= z >> 31;
        uint64_t j = i + z % (blocks - i), t = b[j];
        b[j] = b[i];
        b[i] = t * size;
    }
    return b;
}

static void *pread_main(void *arg)
{
    read_job *r = arg;
    unsigned char *buf = aligned_alloc(4096, (r->size + 4095) / 4096 * 4096);
    if (!buf)
        return (void *)1;
    for (uint64_t i = r->first; i < r->n; i += r->threads) {
        if (pread(r->fd, buf, r->size, (off_t)r->offs[i]) != (ssize_t)r->size) {
            free(buf);
            return (void *)1;
        }
        r->done++;
    }
    free(buf);
    return NULL;
}

static double randread_threads(int fd, const uint64_t *offs, const opts *o)
{
    read_job *jobs = calloc(o->threads, sizeof *jobs);
    if (!jobs)
        return -1;
    for (uint64_t t = 0; t < o->threads; t++)
        jobs[t] = (read_job){fd, offs, o->count, o->size, o->threads, t, 0};
    double dt = run_jobs(pread_main, jobs, sizeof *jobs, o->threads);
    free(jobs);
    return dt;
}

#ifdef STOKE_BENCH_URING
/* Keeps o->depth reads in flight on one ring until o->count have completed.  Returns the seconds,
 * -1 for a failed read, -2 when no ring could be set up (the caller falls back to pread). */
static double randread_uring(int fd, const uint64_t *offs, const opts *o)
{
    struct io_uring ring;
    unsigned depth = (unsigned)o->depth;
    size_t slot = (o->size + 4095) / 4096 * 4096;
    unsigned char *buf = aligned_alloc(4096, slot * depth);
    if (!buf || io_uring_queue_init(depth, &ring, 0) < 0) {
        free(buf);
        return -2;
    }
    uint64_t next = 0, done = 0;
    int bad = 0;
    double t0 = now_s();
    while (done < o->count && !bad) {
        unsigned queued = 0;
        for (; next < o->count && next - done < depth; next++, queued++) {
            struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
            if (!sqe)
                break;
            io_uring_prep_read(sqe, fd, buf + (next % depth) * slot, (unsigned)o->size, offs[next]);
        }
        if (queued && io_uring_submit(&ring) < 0)
            bad = 1;
        struct io_uring_cqe *cqe;
        if (!bad && io_uring_wait_cqe(&ring, &cqe) == 0) {
            unsigned head, seen = 0;
            io_uring_for_each_cqe(&ring, head, cqe)
            {
                bad |= cqe->res != (int)o->size;
                seen++;
            }
            io_uring_cq_advance(&ring, seen);
            done += seen;
        } else {
            bad = 1;
        }
    }
    double dt = now_s() - t0;
    io_uring_queue_exit(&ring);
    free(buf);
    return bad ? -1 : dt;
}
#endif

static int cmd_randread(const char *path, const opts *o)
{
    struct stat st;
    int direct;
    int fd = open_reader(path, o->size, &direct);
    if (fd < 0 || fstat(fd, &st))
        return die("cannot open", path);
    uint64_t blocks = (uint64_t)st.st_size / o->size;
    opts r = *o;
    if (r.count == 0 || r.count > blocks)
        r.count = blocks;
    uint64_t *offs = blocks ? random_offsets(blocks, r.count, r.size) : NULL;
    if (!offs) {
        fprintf(stderr, "bench_tool: %s: too small or out of memory\n", path);
        return 1;
    }
    const char *method = "pread_threads";
    uint64_t threads = r.threads, depth = r.threads;
    double dt = -2;
#ifdef STOKE_BENCH_URING
    if (!r.pread && (dt = randread_uring(fd, offs, &r)) != -2) {
        method = "io_uring";
        threads = 1;
        depth = r.depth;
    }
#endif
    if (dt == -2) /* no io_uring: not built with it, --pread, or the kernel refused a ring */
        dt = randread_threads(fd, offs, &r);
    free(offs);
    close(fd);
    if (dt <= 0) {
        fprintf(stderr, "bench_tool: %s: a read failed\n", path);
        return 1;
    }
    printf("{\"method\": \"%s\", \"direct\": %s, \"reads\": %" PRIu64 ", \"read_bytes\": %" PRIu64
           ", \"threads\": %" PRIu64 ", \"depth\": %" PRIu64 ", \"seconds\": %.6f, "
           "\"reads_per_s\": %.1f, \"bytes_per_s\": %.1f}\n",
           method, direct ? "true" : "false", r.count, r.size, threads, depth, dt,
           (double)r.count / dt, (double)(r.count * r.size) / dt);
    return 0;
}

static int cmd_seqread(const char *path, const opts *o)
{
    int fd = open(path, O_RDONLY);
    unsigned char *buf = malloc(o->block);
    if (fd < 0 || !buf)
        return die("cannot open", path);
    posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    uint64_t total = 0;
    double t0 = now_s();
    for (ssize_t got; (!o->bytes || total < o->bytes) && (got = read(fd, buf, o->block)) > 0;)
        total += (uint64_t)got;
    double dt = now_s() - t0;
    close(fd);
    free(buf);
    printf("{\"bytes\": %" PRIu64 ", \"block\": %" PRIu64 ", \"seconds\": %.6f, "
           "\"bytes_per_s\": %.1f}\n",
           total, o->block, dt, dt > 0 ? (double)total / dt : 0.0);
    return 0;
}

static int cmd_spin(void)
{
    volatile uint64_t x = 0;
    for (;;)
        x++;
    return 0;
}

/* --- options ---------------------------------------------------------------------------------- */

static int parse_opts(int argc, char **argv, int first, opts *o)
{
    *o = (opts){.batch = 256, .size = 4096, .depth = 64, .block = 1 << 20};
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        uint64_t *u = !strcmp(a, "--batch")     ? &o->batch
                      : !strcmp(a, "--threads") ? &o->threads
                      : !strcmp(a, "--seed")    ? &o->seed
                      : !strcmp(a, "--epoch")   ? &o->epoch
                      : !strcmp(a, "--limit")   ? &o->limit
                      : !strcmp(a, "--size")    ? &o->size
                      : !strcmp(a, "--count")   ? &o->count
                      : !strcmp(a, "--depth")   ? &o->depth
                      : !strcmp(a, "--block")   ? &o->block
                      : !strcmp(a, "--bytes")   ? &o->bytes
                                                : NULL;
        if (!strcmp(a, "--sequential")) {
            o->sequential = 1;
        } else if (!strcmp(a, "--pread")) {
            o->pread = 1;
        } else if (!strcmp(a, "--labels") && i + 1 < argc) {
            o->labels = argv[++i];
        } else if (u && i + 1 < argc) {
            *u = strtoull(argv[++i], NULL, 10);
        } else {
            fprintf(stderr, "bench_tool: unknown or incomplete option %s\n", a);
            return -1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    const char *cmd = argc > 1 ? argv[1] : "";
    int args = !strcmp(cmd, "order") ? 2 : !strcmp(cmd, "spin") ? 0 : 1;
    opts o;
    if (!*cmd || argc < 2 + args || parse_opts(argc, argv, 2 + args, &o)) {
        fprintf(stderr, "usage: bench_tool gather|order|evict|randread|seqread|spin ...  (see the "
                        "comment at the top of bench/bench_tool.c)\n");
        return 2;
    }
    int pread_default = o.threads == 0;
    if (o.threads == 0)
        o.threads = 1;
    if (o.batch == 0 || o.size == 0 || o.block == 0 || o.depth == 0 || o.threads > 1024) {
        fprintf(stderr, "bench_tool: --batch, --size, --block, --depth must be > 0\n");
        return 2;
    }
    if (!strcmp(cmd, "gather"))
        return cmd_gather(argv[2], &o);
    if (!strcmp(cmd, "order"))
        return cmd_order(argv[2], argv[3], &o);
    if (!strcmp(cmd, "evict"))
        return cmd_evict(argv[2]);
    if (!strcmp(cmd, "randread")) {
        if (pread_default)
            o.threads = 32;
        return cmd_randread(argv[2], &o);
    }
    if (!strcmp(cmd, "seqread"))
        return cmd_seqread(argv[2], &o);
    if (!strcmp(cmd, "spin"))
        return cmd_spin();
    fprintf(stderr, "bench_tool: unknown command %s\n", cmd);
    return 2;
}
