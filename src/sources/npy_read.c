/* The npy source's reads: the helpers get() uses, and get_batch() for every I/O mode.
 *
 * get_batch() checks the batch's indices, fstat()s the files once when the batch holds an
 * index that is a multiple of STOKE__NPY_STAT_EVERY_BATCH, cuts the batch into runs (consecutive
 * indices, whose rows are consecutive in the file and whose slots are consecutive in the
 * batch) and moves each run with one copy or one read: io=mmap under one SIGBUS guard per
 * field with a software prefetch of upcoming rows, io=pread one pread per run, io=uring on the
 * worker's ring (npy_uring.c).  Under a block shuffle the blocks the batch touches first in
 * the epoch are read ahead before that (npy_stage.c), and with io=pread or io=uring the rows
 * come from block buffers, each block read whole once (npy_slots.c); the rows those do not
 * serve go the io mode's way.  Big-endian data is swapped once the whole batch is in. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/fault_guard.h"
#include "sources/npy_internal.h"
#include "stoke/sources.h"

/* mmap: rows this far ahead of the copy are prefetched (their first two cache lines, one for a
 * row of 64 bytes or less; the hardware fetches the lines after them once the copy starts).
 * Two lines, not four: perf put most of the gather's own time of 256-byte rows on the prefetch
 * instructions (the CPU's miss buffers full), and 128 bytes gave 6% more samples/s than 256
 * and than 64, for 256-byte and for 3 KB rows (AMD EPYC, 6 alternating runs each; 0 workers
 * 7%). */
#define PREFETCH_AHEAD 8
/* mmap, the dataset's prefetch (the next small batch): the first AHEAD_BYTES of each row. */
#define AHEAD_BYTES 4096
/* mmap: a run at least this long gets MADV_WILLNEED first (the mapping is MADV_RANDOM, so a
 * sequential stretch would otherwise fault page by page on a cold file) - not on a mapping
 * io=auto populated, whose pages are in: there the call only cost (a 150 KB row was a run of
 * its own, and a system call per row took 0 workers from 88 to 61 k rows/s, 2 workers from 114 to
 * 96 k). */
#define WILLNEED_MIN ((size_t)64 << 10)

void stoke__npy_swap(unsigned char *p, size_t n, size_t unit)
{
    for (size_t i = 0; i + unit <= n; i += unit) {
        if (unit == 2) {
            uint16_t v;
            memcpy(&v, p + i, 2);
            v = __builtin_bswap16(v);
            memcpy(p + i, &v, 2);
        } else if (unit == 4) {
            uint32_t v;
            memcpy(&v, p + i, 4);
            v = __builtin_bswap32(v);
            memcpy(p + i, &v, 4);
        } else if (unit == 8) {
            uint64_t v;
            memcpy(&v, p + i, 8);
            v = __builtin_bswap64(v);
            memcpy(p + i, &v, 8);
        }
    }
}

int stoke__npy_changed(const stoke__npy_file *f, uint64_t index, char *msg, size_t msg_len,
                       const char *why)
{
    stoke__fmt(msg, msg_len, "npy %s: sample %llu: file changed while loading (%s)", f->path,
               (unsigned long long)index, why);
    return STOKE_EIO;
}

int stoke__npy_rows_within(const stoke__npy_file *f, const uint64_t *idx, size_t count, int fault,
                           char *msg, size_t msg_len, uint64_t *err_index)
{
    if (fault) /* (the one field written after open: atomic, so const elsewhere) */
        atomic_store_explicit((atomic_int *)&f->shrunk, 1, memory_order_relaxed);
    if (!atomic_load_explicit(&f->shrunk, memory_order_relaxed) || !count)
        return STOKE_OK;
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        *err_index = idx[0];
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: cannot stat: %s", f->path,
                   (unsigned long long)idx[0], strerror(errno));
        return STOKE_EIO;
    }
    for (size_t j = 0; j < count; j++) {
        uint64_t end = f->h.data_offset + (idx[j] + 1) * (uint64_t)f->row_bytes;
        if (end > (uint64_t)st.st_size) {
            char why[128] = "its mapped pages are gone: truncated"; /* (the fault's read) */
            if (!fault)
                stoke__fmt(why, sizeof(why), "now %llu bytes, %llu when opened: truncated",
                           (unsigned long long)st.st_size, (unsigned long long)f->size);
            *err_index = idx[j];
            return stoke__npy_changed(f, idx[j], msg, msg_len, why);
        }
    }
    return STOKE_OK;
}

int stoke__npy_check_unchanged(const stoke__npy_file *f, uint64_t index, char *msg, size_t msg_len)
{
    if (f->remote) /* each answer's Content-Range is checked instead (npy_remote.c) */
        return STOKE_OK;
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: cannot stat: %s", f->path,
                   (unsigned long long)index, strerror(errno));
        return STOKE_EIO;
    }
    char why[128];
    if ((uint64_t)st.st_size != f->size) {
        stoke__fmt(why, sizeof(why), "now %llu bytes, %llu when opened",
                   (unsigned long long)st.st_size, (unsigned long long)f->size);
        return stoke__npy_changed(f, index, msg, msg_len, why);
    }
    if (st.st_mtim.tv_sec != f->mtime.tv_sec || st.st_mtim.tv_nsec != f->mtime.tv_nsec)
        return stoke__npy_changed(f, index, msg, msg_len, "modified after it was opened");
    return STOKE_OK;
}

int stoke__npy_read_failed(const stoke__npy_file *f, uint64_t index, uint64_t end, int err,
                           char *msg, size_t msg_len)
{
    if (err) {
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: read failed: %s", f->path,
                   (unsigned long long)index, strerror(-err));
        return STOKE_EIO;
    }
    /* a read that started past the new end got nothing: say where the file ends now */
    struct stat st;
    if (fstat(f->fd, &st) == 0 && (uint64_t)st.st_size < end)
        end = (uint64_t)st.st_size;
    char why[128];
    stoke__fmt(why, sizeof(why), "it ends at byte %llu: truncated", (unsigned long long)end);
    return stoke__npy_changed(f, index, msg, msg_len, why);
}

int stoke__npy_run_failed(const stoke__npy_ds *ds, const uint64_t *idx, const stoke__npy_run *r,
                          size_t got, int err, char *msg, size_t msg_len, uint64_t *err_index)
{
    const stoke__npy_file *f = &ds->f[r->k];
    size_t j = r->pos + got / f->row_bytes;
    if (j >= r->pos + r->n)
        j = r->pos + r->n - 1;
    *err_index = idx[j];
    return stoke__npy_read_failed(f, idx[j], r->at + got, err, msg, msg_len);
}

/* ---- runs ----------------------------------------------------------------------------------- */

void stoke__npy_runs_init(stoke__npy_runs *it, const stoke__npy_ds *ds, const uint64_t *idx,
                          size_t count, void *const dst[])
{
    it->ds = ds;
    it->idx = idx;
    it->count = count;
    it->dst = dst;
    it->k = 0;
    it->kend = ds->nfiles;
    it->pos = 0;
}

int stoke__npy_runs_next(stoke__npy_runs *it, stoke__npy_run *r)
{
    while (it->k < it->kend) {
        const stoke__npy_file *f = &it->ds->f[it->k];
        if (!it->dst[it->k] || !f->row_bytes || it->pos >= it->count) {
            it->k++;
            it->pos = 0;
            continue;
        }
        size_t rb = f->row_bytes, p = it->pos;
        size_t n = stoke__npy_run_len(it->idx, p, it->count, stoke__npy_run_most(rb));
        r->k = it->k;
        r->pos = p;
        r->n = n;
        r->at = f->h.data_offset + it->idx[p] * (uint64_t)rb;
        r->dst = (unsigned char *)it->dst[it->k] + p * rb;
        r->len = n * rb;
        it->pos = p + n;
        return 1;
    }
    return 0;
}

/* ---- io=mmap -------------------------------------------------------------------------------- */

size_t stoke__npy_nt_min = STOKE__NPY_NT_MIN;
int stoke__npy_nt_always;
_Atomic uint64_t stoke__npy_nt_fields;
_Atomic uint64_t stoke__npy_willneed;

typedef struct gather {
    stoke__npy_runs it;
    const stoke__npy_file *f;
    int nt; /* non-temporal stores for runs of STOKE__NPY_NT_RUN bytes or more */
} gather;

/* MADV_WILLNEED over the pages of [src, src + len) of f's mapping (see WILLNEED_MIN). */
static __attribute__((noinline)) void will_need(const stoke__npy_file *f, const unsigned char *src,
                                                size_t len)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t at = (size_t)(src - f->map), lo = at / pg * pg;
    madvise((void *)(f->map + lo), at + len - lo, MADV_WILLNEED);
    atomic_fetch_add_explicit(&stoke__npy_willneed, 1, memory_order_relaxed);
}

/* Prefetches a row's first line, and its second when `two` (rows over 64 bytes; see
 * PREFETCH_AHEAD). */
static void prefetch_row(const unsigned char *p, int two)
{
    __builtin_prefetch(p);
    if (two)
        __builtin_prefetch(p + 64);
}

static void gather_field(void *arg)
{
    gather *g = arg;
    const stoke__npy_file *f = g->f;
    const uint64_t *idx = g->it.idx;
    const unsigned char *base = f->map + f->h.data_offset;
    unsigned char *dst = g->it.dst[g->it.k];
    const size_t rb = f->row_bytes, n = g->it.count, most = stoke__npy_run_most(rb);
    const int pf2 = rb > 64;
    /* Copies of the loop's invariants: locals whose address is never taken, so that the calls
     * in the loop (memcpy) do not make the compiler load them again from *g and *f after each
     * row.  Those loads and the tests on them cost 3-4 ns per 256-byte row (about 10%). */
    const size_t nt_run = g->nt ? STOKE__NPY_NT_RUN : SIZE_MAX;
    const size_t hint_run = f->populated ? SIZE_MAX : WILLNEED_MIN;
    /* The runs of stoke__npy_runs_next, walked inline (a call per 256-byte row cost 3.6%).  A
     * shuffled batch is almost all runs of one row: the test for a longer one is a branch taken
     * rarely, and nothing is stored per row (a fault names its row by its address). */
    for (size_t j = 0, m; j < n; j += m) {
        if (j + PREFETCH_AHEAD < n)
            prefetch_row(base + idx[j + PREFETCH_AHEAD] * (uint64_t)rb, pf2);
        m = 1;
        if (__builtin_expect(j + 1 < n && idx[j + 1] == idx[j] + 1, 0))
            m = stoke__npy_run_len(idx, j, n, most);
        const size_t len = m * rb;
        const unsigned char *src = base + idx[j] * (uint64_t)rb;
        if (__builtin_expect(len >= hint_run, 0))
            will_need(f, src, len);
        if (__builtin_expect(len >= nt_run, 0))
            stoke__copy_nt(dst + j * rb, src, len);
        else
            memcpy(dst + j * rb, src, len);
    }
}

/* get_scattered's copies from one file's mapping, under the guard: row idx[j] to dst[j * nf +
 * k].  The first PREFETCH_AHEAD rows' first lines are prefetched together before the first
 * copy (their address translations then overlap too), the others PREFETCH_AHEAD rows ahead. */
typedef struct scatter {
    const stoke__npy_file *f;
    const uint64_t *idx;
    void *const *dst;
    size_t count, nf, k;
} scatter;

static void gather_scattered(void *arg)
{
    const scatter *g = arg;
    const unsigned char *base = g->f->map + g->f->h.data_offset;
    const uint64_t *idx = g->idx;
    void *const *dst = g->dst;
    const size_t rb = g->f->row_bytes, n = g->count, nf = g->nf, k = g->k;
    const int pf2 = rb > 64;
    for (size_t j = 0; j < n && j < PREFETCH_AHEAD; j++)
        prefetch_row(base + idx[j] * (uint64_t)rb, pf2);
    for (size_t j = 0; j < n; j++) {
        if (j + PREFETCH_AHEAD < n)
            prefetch_row(base + idx[j + PREFETCH_AHEAD] * (uint64_t)rb, pf2);
        if (dst[j * nf + k])
            memcpy(dst[j * nf + k], base + idx[j] * (uint64_t)rb, rb);
    }
}

void stoke__npy_prefetch(void *user, const uint64_t *idx, size_t count)
{
    const stoke__npy_ds *ds = user;
    if (ds->io != STOKE_NPY_IO_MMAP)
        return;
    for (int k = 0; k < ds->nfiles; k++) {
        const stoke__npy_file *f = &ds->f[k];
        size_t rb = f->row_bytes, pf = rb < AHEAD_BYTES ? rb : AHEAD_BYTES;
        for (size_t j = 0; j < count; j++) {
            if (idx[j] >= f->rows)
                continue;
            const unsigned char *p = f->map + f->h.data_offset + idx[j] * (uint64_t)rb;
            for (size_t o = 0; o < pf; o += 64)
                __builtin_prefetch(p + o);
        }
    }
}

/* The sample whose row holds the address that faulted in a gather of idx[0, count) from f: the
 * row it lies in, or the batch's first index if it lies in none of the batch's rows (it
 * cannot: the guard acts only on reads of f's mapping, and the gather reads only those rows). */
static uint64_t fault_row(const stoke__npy_file *f, const uint64_t *idx, size_t count,
                          const void *fault)
{
    const unsigned char *a = fault, *base = f->map + f->h.data_offset;
    if (a >= base && f->row_bytes) {
        uint64_t row = (uint64_t)(a - base) / f->row_bytes;
        for (size_t j = 0; j < count; j++)
            if (idx[j] == row)
                return row;
    }
    return idx[0];
}

/* A fault in a gather of idx[0, count) from f's mapping: the faulting sample into *err_index,
 * the message into msg; returns STOKE_EIO. */
static int mapping_gone(const stoke__npy_file *f, const uint64_t *idx, size_t count,
                        const void *fault, char *msg, size_t msg_len, uint64_t *err_index)
{
    *err_index = fault_row(f, idx, count, fault);
    int rc = stoke__npy_rows_within(f, idx, count, 1, msg, msg_len, err_index);
    /* (the first row past the end now, else the faulting one: the file grew back meanwhile) */
    if (rc != STOKE_OK)
        return rc;
    *err_index = fault_row(f, idx, count, fault);
    return stoke__npy_changed(f, *err_index, msg, msg_len, "its mapped pages are gone: truncated");
}

static int batch_mmap_fields(const stoke__npy_ds *ds, const uint64_t *idx, size_t count,
                             void *const dst[], int shared, char *msg, size_t msg_len,
                             uint64_t *err_index)
{
    for (int k = 0; k < ds->nfiles; k++) {
        const stoke__npy_file *f = &ds->f[k];
        if (!dst[k] || !f->row_bytes)
            continue;
        int rc = stoke__npy_rows_within(f, idx, count, 0, msg, msg_len, err_index);
        if (rc != STOKE_OK)
            return rc;
        gather g;
        stoke__npy_runs_init(&g.it, ds, idx, count, dst);
        g.it.k = k;
        g.it.kend = k + 1;
        g.f = f;
        g.nt = count * f->row_bytes >= stoke__npy_nt_min && (shared || stoke__npy_nt_always);
        const void *fault = NULL;
        int faulted = stoke__guarded_run(gather_field, &g, f->map, f->map_len, &fault) != 0;
        if (g.nt) {
            stoke__copy_nt_done(); /* the batch is published to the consumer next */
            atomic_fetch_add_explicit(&stoke__npy_nt_fields, 1, memory_order_relaxed);
        }
        if (faulted)
            return mapping_gone(f, idx, count, fault, msg, msg_len, err_index);
    }
    return STOKE_OK;
}

/* The copies of one batch.  A batch with a field big enough for the non-temporal stores is
 * counted in ds->copying: whether another one is being copied at the same time decides them.
 * Smaller batches leave the counter alone (an atomic on a shared line per batch would cost
 * more than a batch of one small row). */
static int batch_mmap(const stoke__npy_ds *ds, const uint64_t *idx, size_t count, void *const dst[],
                      char *msg, size_t msg_len, uint64_t *err_index)
{
    int big = 0;
    for (int k = 0; k < ds->nfiles; k++)
        big |= dst[k] && count * ds->f[k].row_bytes >= stoke__npy_nt_min;
    if (!big)
        return batch_mmap_fields(ds, idx, count, dst, 0, msg, msg_len, err_index);
    atomic_int *copying = (atomic_int *)&ds->copying;
    int others = atomic_fetch_add_explicit(copying, 1, memory_order_relaxed);
    int rc = batch_mmap_fields(ds, idx, count, dst, others > 0, msg, msg_len, err_index);
    atomic_fetch_sub_explicit(copying, 1, memory_order_relaxed);
    return rc;
}

/* ---- io=pread ------------------------------------------------------------------------------- */

int stoke__npy_batch_pread(const stoke__npy_ds *ds, const uint64_t *idx, size_t count,
                           void *const dst[], char *msg, size_t msg_len, uint64_t *err_index)
{
    stoke__npy_runs it;
    stoke__npy_runs_init(&it, ds, idx, count, dst);
    stoke__npy_run r;
    while (stoke__npy_runs_next(&it, &r)) {
        size_t got = 0;
        int e = stoke__pread_full(ds->f[r.k].fd, r.dst, r.len, r.at, &got);
        if (e || got != r.len)
            return stoke__npy_run_failed(ds, idx, &r, got, e, msg, msg_len, err_index);
    }
    return STOKE_OK;
}

/* ---- get_batch ------------------------------------------------------------------------------ */

/* Samples from .. from + n - 1 of a batch, read the io mode's way (a stoke__npy_rest_fn). */
typedef struct read_ctx {
    stoke__npy_ds *ds;
    const uint64_t *idx;
    void *const *dst;
    int worker;
    char *msg;
    size_t msg_len;
    uint64_t *err_index;
} read_ctx;

static int read_rest(void *ctx, size_t from, size_t n)
{
    read_ctx *c = ctx;
    stoke__npy_ds *ds = c->ds;
    void *dst[2] = {NULL, NULL};
    for (int k = 0; k < ds->nfiles; k++)
        if (c->dst[k])
            dst[k] = (unsigned char *)c->dst[k] + from * ds->f[k].row_bytes;
    const uint64_t *idx = c->idx + from;
    switch (ds->io) {
    case STOKE_NPY_IO_MMAP: return batch_mmap(ds, idx, n, dst, c->msg, c->msg_len, c->err_index);
    case STOKE_NPY_IO_URING:
        return stoke__npy_batch_uring(ds, idx, n, dst, c->worker, c->msg, c->msg_len, c->err_index);
    case STOKE_NPY_IO_REMOTE:
        return stoke__npy_batch_remote(ds, idx, n, dst, c->worker, c->msg, c->msg_len,
                                       c->err_index);
    default: return stoke__npy_batch_pread(ds, idx, n, dst, c->msg, c->msg_len, c->err_index);
    }
}

/* Range of every index, then the size/mtime check once if an index is a multiple of
 * STOKE__NPY_STAT_EVERY_BATCH. */
static int check_batch(const stoke__npy_ds *ds, const uint64_t *idx, size_t count, char *msg,
                       size_t msg_len, uint64_t *err_index)
{
    const stoke__npy_file *f0 = &ds->f[0];
    size_t stat_at = count;
    for (size_t j = 0; j < count; j++) {
        if (idx[j] >= f0->rows) {
            *err_index = idx[j];
            stoke__fmt(msg, msg_len, "npy %s: index %llu out of range (%llu rows)", f0->path,
                       (unsigned long long)idx[j], (unsigned long long)f0->rows);
            return STOKE_ERANGE;
        }
        if (stat_at == count && idx[j] % STOKE__NPY_STAT_EVERY_BATCH == 0)
            stat_at = j;
    }
    if (stat_at < count)
        for (int k = 0; k < ds->nfiles; k++) {
            int rc = stoke__npy_check_unchanged(&ds->f[k], idx[stat_at], msg, msg_len);
            if (rc) {
                *err_index = idx[stat_at];
                return rc;
            }
        }
    return STOKE_OK;
}

int stoke__npy_get_scattered(void *user, const uint64_t *indices, size_t count, void *const dst[],
                             int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    stoke__npy_ds *ds = user;
    uint64_t ignored;
    if (!err_index)
        err_index = &ignored;
    const size_t nf = (size_t)ds->nfiles; /* (no samples: every loop below is empty) */
    if (ds->io != STOKE_NPY_IO_MMAP || stoke__npy_stage_slots(ds)) {
        for (size_t j = 0; j < count; j++) {
            int rc = stoke__npy_get_batch(user, &indices[j], 1, &dst[j * nf], worker, msg, msg_len,
                                          err_index);
            if (rc)
                return rc;
        }
        return STOKE_OK;
    }
    int rc = check_batch(ds, indices, count, msg, msg_len, err_index);
    if (rc)
        return rc;
    stoke__npy_stage_batch(ds, indices, count);
    for (int k = 0; k < ds->nfiles; k++) {
        const stoke__npy_file *f = &ds->f[k];
        if (!f->row_bytes)
            continue;
        int rw = stoke__npy_rows_within(f, indices, count, 0, msg, msg_len, err_index);
        if (rw != STOKE_OK)
            return rw;
        scatter g = {f, indices, dst, count, nf, (size_t)k};
        const void *fault = NULL;
        if (stoke__guarded_run(gather_scattered, &g, f->map, f->map_len, &fault) != 0)
            return mapping_gone(f, indices, count, fault, msg, msg_len, err_index);
        for (size_t j = 0; f->h.swap && j < count; j++)
            if (dst[j * nf + (size_t)k])
                stoke__npy_swap(dst[j * nf + (size_t)k], f->row_bytes, f->h.swap);
    }
    return STOKE_OK;
}

int stoke__npy_get_batch(void *user, const uint64_t *indices, size_t count, void *const dst[],
                         int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    stoke__npy_ds *ds = user;
    uint64_t ignored;
    if (!err_index)
        err_index = &ignored;
    if (count == 0)
        return STOKE_OK;
    int rc = check_batch(ds, indices, count, msg, msg_len, err_index);
    if (rc)
        return rc;
    read_ctx c = {ds, indices, dst, worker, msg, msg_len, err_index};
    stoke__npy_slots *slots = stoke__npy_stage_slots(ds);
    if (!slots)
        stoke__npy_stage_batch(ds, indices, count);
    rc = slots ? stoke__npy_slots_serve(ds, slots, indices, count, dst, read_rest, &c)
               : read_rest(&c, 0, count);
    if (rc)
        return rc;
    for (int k = 0; k < ds->nfiles; k++)
        if (dst[k] && ds->f[k].h.swap)
            stoke__npy_swap(dst[k], count * ds->f[k].row_bytes, ds->f[k].h.swap);
    return STOKE_OK;
}
