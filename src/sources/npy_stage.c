/* Block read-ahead for the npy source: when the loader's order is a block shuffle
 * (dataset.h, access_hint), the first batch of an epoch that touches a block asks the kernel to
 * read the block's whole byte range (posix_fadvise WILLNEED, in pieces the kernel does not cut
 * short), so the disk sees large sequential reads and the rows of the block, read one by one by
 * every I/O mode as before, come from the page cache.  See docs/loader.md, "Block shuffle
 * reads".
 *
 * State: one bit per block, set by the first worker that touches the block in the epoch (an
 * atomic fetch-or: two workers never both read it), cleared by set_epoch (called by the loader
 * while no get runs) in the process that made them, not in a forked one.  The bits and two
 * counters live in a MAP_SHARED anonymous mapping, so process workers (forked after the hint)
 * share them with the parent and with each other.
 *
 * Nothing here changes what a get delivers: a block that is never read ahead (the hint was
 * not a block shuffle, a window of blocks is over a quarter of RAM, the kernel ignores the
 * advice, the pages were evicted again) is read row by row as before, and errors (a file cut
 * short) are found by the row reads with the usual messages.  A block found resident (every page
 * cached, by cachestat; else a few probed pages, preadv2 RWF_NOWAIT) is not advised again: a
 * warm file pays one probe per block and epoch. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/npy_internal.h"
#include "stoke/sampler.h"
#include "stoke/sources.h"

/* Pages probed with RWF_NOWAIT to call a block resident where cachestat cannot tell. */
#define PROBES 8
/* Bytes per WILLNEED call when the device's limits are unknown (the kernel's smallest usual
 * read-ahead window), and the most. */
#define PIECE_MIN ((size_t)128 << 10)
#define PIECE_MAX ((size_t)16 << 20)
/* Blocks of fewer bytes (of the data file) are not read ahead: one advice per block would
 * cost about what the row reads cost. */
#define STAGE_MIN_BYTES ((uint64_t)256 << 10)

struct stoke__npy_stage {
    struct stoke__npy_stage *older; /* the hints before this one (freed at close) */
    uint64_t block_rows, nblocks;
    size_t piece[2]; /* bytes per WILLNEED call, per file */
    void *map;       /* MAP_SHARED: counters[2], then the bits */
    size_t map_len;
    _Atomic uint64_t *counters; /* [0] blocks read ahead, [1] blocks found resident */
    _Atomic uint64_t *bits;
    stoke__npy_slots *slots; /* staged blocks (npy_slots.c); NULL: rows read one by one */
    pid_t pid;               /* the process that made it (and clears the bits) */
};

/* A number from a sysfs file, or 0. */
static uint64_t sysfs_number(const char *path)
{
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    unsigned long long v = 0;
    if (fscanf(f, "%llu", &v) != 1)
        v = 0;
    fclose(f);
    return v;
}

/* One posix_fadvise(WILLNEED) is cut to the larger of the device's read-ahead window and its
 * largest request (read_ahead_kb, max_sectors_kb): the piece size for f, from the queue of the
 * block device (or of the disk of a partition) holding it; PIECE_MIN when unknown. */
static size_t piece_size(const stoke__npy_file *f)
{
    struct stat st;
    size_t best = PIECE_MIN;
    if (fstat(f->fd, &st) != 0)
        return best;
    static const char *const names[] = {"read_ahead_kb", "max_sectors_kb"};
    static const char *const dirs[] = {"queue", "../queue"};
    for (int n = 0; n < 2; n++)
        for (int d = 0; d < 2; d++) {
            char path[128];
            stoke__fmt(path, sizeof(path), "/sys/dev/block/%u:%u/%s/%s", major(st.st_dev),
                       minor(st.st_dev), dirs[d], names[n]);
            uint64_t kb = sysfs_number(path);
            if (kb) {
                if (kb <= PIECE_MAX >> 10 && (size_t)kb << 10 > best)
                    best = (size_t)kb << 10;
                else if (kb > PIECE_MAX >> 10)
                    best = PIECE_MAX;
                break;
            }
        }
    return best;
}

static void stage_free(stoke__npy_stage *s)
{
    if (s->map)
        munmap(s->map, s->map_len);
    stoke__npy_slots_free(s->slots);
    free(s);
}

void stoke__npy_stages_free(stoke__npy_ds *ds)
{
    stoke__npy_stage *s = atomic_exchange(&ds->stages, NULL);
    while (s) {
        stoke__npy_stage *older = s->older;
        stage_free(s);
        s = older;
    }
    atomic_store(&ds->stage, NULL);
}

/* Bytes a window of blocks takes in the page cache, or UINT64_MAX when that overflows. */
static uint64_t window_bytes(const stoke__npy_ds *ds, uint64_t rows, uint64_t win)
{
    uint64_t rb = 0;
    for (int k = 0; k < ds->nfiles; k++)
        rb += ds->f[k].row_bytes;
    if (rows && win > UINT64_MAX / rows)
        return UINT64_MAX;
    uint64_t r = rows * win;
    if (rb && r > UINT64_MAX / rb)
        return UINT64_MAX;
    return r * rb;
}

static stoke__npy_stage *stage_new(const stoke__npy_ds *ds, uint64_t rows)
{
    uint64_t n = ds->f[0].rows, nblocks = n / rows + (n % rows != 0);
    uint64_t words = (nblocks + 63) / 64;
    if (words > (SIZE_MAX - 16) / 8)
        return NULL;
    stoke__npy_stage *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->block_rows = rows;
    s->nblocks = nblocks;
    s->pid = getpid();
    s->map_len = (size_t)(2 + words) * 8;
    s->map = mmap(NULL, s->map_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (s->map == MAP_FAILED) {
        s->map = NULL;
        stage_free(s);
        return NULL;
    }
    s->counters = s->map;
    s->bits = s->counters + 2;
    for (int k = 0; k < ds->nfiles; k++)
        s->piece[k] = piece_size(&ds->f[k]);
    return s;
}

void stoke__npy_access_hint(void *user, int sampler_kind, uint64_t block_rows,
                            uint64_t block_window)
{
    stoke__npy_ds *ds = user;
    const char *path = ds->f[0].path;
    if (sampler_kind != STOKE_SAMPLER_BLOCK || block_rows == 0 || ds->f[0].rows == 0) {
        atomic_store(&ds->stage, NULL);
        return;
    }
    uint64_t rb = ds->f[0].row_bytes;
    if (rb == 0 || block_rows < (STAGE_MIN_BYTES + rb - 1) / rb) {
        stoke__log(STOKE_LOG_DEBUG,
                   "npy %s: block shuffle: blocks of %" PRIu64 " rows are under %" PRIu64
                   " KiB: no block read-ahead",
                   path, block_rows, STAGE_MIN_BYTES >> 10);
        atomic_store(&ds->stage, NULL);
        return;
    }
    uint64_t nb = ds->f[0].rows / block_rows + (ds->f[0].rows % block_rows != 0);
    uint64_t win = block_window < nb ? block_window : nb;
    uint64_t wb = window_bytes(ds, block_rows, win);
    uint64_t ram = stoke__physical_memory();
    if (ram && wb > ram / 4) {
        stoke__log(STOKE_LOG_INFO,
                   "npy %s: block shuffle: a window of %" PRIu64 " blocks of %" PRIu64
                   " rows is over a quarter of RAM: no block read-ahead, rows are read one "
                   "by one",
                   path, win, block_rows);
        atomic_store(&ds->stage, NULL);
        return;
    }
    stoke__npy_stage *s = atomic_load(&ds->stages);
    if (!s || s->block_rows != block_rows) {
        s = stage_new(ds, block_rows);
        if (!s) {
            stoke__log(STOKE_LOG_INFO,
                       "npy %s: block shuffle: no memory for the block "
                       "read-ahead, rows are read one by one",
                       path);
            atomic_store(&ds->stage, NULL);
            return;
        }
        s->older = atomic_load(&ds->stages);
        atomic_store(&ds->stages, s);
    }
    if (ds->io != STOKE_NPY_IO_MMAP && !s->slots) {
        /* queued or positioned reads cost a system call per row: stage whole blocks */
        uint64_t nslots = 2 * win < nb ? 2 * win : nb;
        size_t bytes = stoke__npy_slots_bytes(ds, block_rows, nslots);
        if (ram && bytes > ram / 4)
            stoke__log(STOKE_LOG_INFO,
                       "npy %s: block shuffle: %" PRIu64 " block buffers would take over a "
                       "quarter of RAM: rows are read one by one",
                       path, nslots);
        else if (!(s->slots = stoke__npy_slots_new(ds, block_rows, nb, nslots)))
            stoke__log(STOKE_LOG_INFO,
                       "npy %s: block shuffle: no memory for %" PRIu64 " block buffers "
                       "(%zu MiB): rows are read one by one",
                       path, nslots, bytes >> 20);
        else
            stoke__log(STOKE_LOG_DEBUG,
                       "npy %s: block shuffle: %" PRIu64 " block buffers (%zu MiB): each block "
                       "is read whole once and its rows copied from memory",
                       path, nslots, bytes >> 20);
    }
    /* The probes of resident() are 1-byte reads: without this the first one of a cold block
     * would start the file's usual read-ahead (io=mmap never reads rows through the fd). */
    for (int k = 0; k < ds->nfiles; k++)
        (void)posix_fadvise(ds->f[k].fd, 0, 0, POSIX_FADV_RANDOM);
    atomic_store(&ds->stage, s);
    stoke__log(STOKE_LOG_DEBUG,
               "npy %s: block shuffle: blocks of %" PRIu64 " rows are read ahead whole "
               "(%zu KiB per request)",
               path, block_rows, s->piece[0] >> 10);
}

int stoke__npy_set_epoch(void *user, uint64_t epoch)
{
    (void)epoch;
    stoke__npy_ds *ds = user;
    stoke__npy_stage *s = atomic_load(&ds->stage);
    /* The bits are shared with forked processes (process workers), which call set_epoch too,
     * on their first batch of an epoch, while other processes' gets run: only the process
     * that made them clears them (the loader calls it there while no get runs). */
    if (s && s->pid == getpid())
        for (uint64_t w = 0; w < (s->nblocks + 63) / 64; w++)
            atomic_store_explicit(&s->bits[w], 0, memory_order_relaxed);
    if (s && s->slots)
        stoke__npy_slots_reset(s->slots);
    return STOKE_OK;
}

#ifndef __NR_cachestat
#define __NR_cachestat 451 /* the same on every architecture (Linux 6.5) */
#endif
struct npy_cachestat_range {
    uint64_t off, len;
};
struct npy_cachestat {
    uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

int stoke__npy_resident(const stoke__npy_file *f, uint64_t at, uint64_t len)
{
    static atomic_int no_cachestat; /* ENOSYS once: the kernel has none */
    uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
    if (!atomic_load_explicit(&no_cachestat, memory_order_relaxed)) {
        struct npy_cachestat_range r = {at / pg * pg, 0};
        struct npy_cachestat cs;
        r.len = (at + len + pg - 1) / pg * pg - r.off;
        if (syscall(__NR_cachestat, f->fd, &r, &cs, 0) == 0)
            return cs.nr_cache >= r.len / pg;
        if (errno == ENOSYS)
            atomic_store_explicit(&no_cachestat, 1, memory_order_relaxed);
    }
    if (f->mincore_ok) { /* before Linux 6.5: mincore over a mapping made for the call */
        uint64_t off = at / pg * pg, n = (at + len + pg - 1) / pg * pg - off;
        unsigned char vec[256];
        void *m = mmap(NULL, (size_t)n, PROT_READ, MAP_SHARED, f->fd, (off_t)off);
        int all = m != MAP_FAILED;
        for (uint64_t p = 0; all && p < n / pg; p += sizeof(vec)) {
            uint64_t k = n / pg - p < sizeof(vec) ? n / pg - p : sizeof(vec);
            all = mincore((char *)m + p * pg, (size_t)(k * pg), vec) == 0;
            for (uint64_t i = 0; all && i < k; i++)
                all = vec[i] & 1;
        }
        if (m != MAP_FAILED) {
            munmap(m, (size_t)n);
            return all;
        }
    }
    /* Neither can tell (a file the caller may not write).  A probe that misses starts a read
     * of its page (read-ahead is allowed with RWF_NOWAIT), so a block read with O_DIRECT gains
     * a cached page per probe and epoch here, and may be called resident after a few epochs. */
    for (int i = 0; i < PROBES; i++) {
        char b;
        struct iovec iov = {&b, 1};
        uint64_t off = at + (len - 1) * (uint64_t)i / (PROBES - 1);
        if (preadv2(f->fd, &iov, 1, (off_t)off, RWF_NOWAIT) != 1)
            return 0;
    }
    return 1;
}

/* Rows [*at, *at + *len) of block b in file k (byte offsets). */
static void block_range(const stoke__npy_ds *ds, const stoke__npy_stage *s, int k, uint64_t b,
                        uint64_t *at, uint64_t *len)
{
    uint64_t r0 = b * s->block_rows, nr = ds->f[0].rows - r0;
    if (nr > s->block_rows)
        nr = s->block_rows;
    *at = ds->f[k].h.data_offset + r0 * (uint64_t)ds->f[k].row_bytes;
    *len = nr * (uint64_t)ds->f[k].row_bytes;
}

/* Asks the kernel for block b of every file; counted as read ahead. */
static void advise_block(const stoke__npy_ds *ds, stoke__npy_stage *s, uint64_t b)
{
    for (int k = 0; k < ds->nfiles; k++) {
        uint64_t at, len;
        block_range(ds, s, k, b, &at, &len);
        for (uint64_t o = 0; o < len; o += s->piece[k]) {
            uint64_t n = len - o < s->piece[k] ? len - o : s->piece[k];
            (void)posix_fadvise(ds->f[k].fd, (off_t)(at + o), (off_t)n, POSIX_FADV_WILLNEED);
        }
    }
    atomic_fetch_add_explicit(&s->counters[0], 1, memory_order_relaxed);
}

/* 1 when this call is the first in the epoch to touch block b (it sets b's bit). */
static int first_in_epoch(stoke__npy_stage *s, uint64_t b)
{
    uint64_t m = (uint64_t)1 << (b % 64);
    _Atomic uint64_t *w = &s->bits[b / 64];
    return !(atomic_load_explicit(w, memory_order_relaxed) & m) &&
           !(atomic_fetch_or_explicit(w, m, memory_order_relaxed) & m);
}

/* Reads block b ahead unless it was in this epoch or its data is resident. */
static void stage_once(const stoke__npy_ds *ds, stoke__npy_stage *s, uint64_t b)
{
    if (!first_in_epoch(s, b))
        return;
    uint64_t at, len;
    block_range(ds, s, 0, b, &at, &len);
    if (len && stoke__npy_resident(&ds->f[0], at, len))
        atomic_fetch_add_explicit(&s->counters[1], 1, memory_order_relaxed);
    else
        advise_block(ds, s, b);
}

void stoke__npy_stage_batch(const stoke__npy_ds *ds, const uint64_t *idx, size_t count)
{
    stoke__npy_stage *s = atomic_load_explicit(&ds->stage, memory_order_acquire);
    if (!s)
        return;
    uint64_t last = UINT64_MAX;
    for (size_t j = 0; j < count; j++) {
        uint64_t b = idx[j] / s->block_rows;
        if (b == last || b >= s->nblocks)
            continue;
        last = b;
        stage_once(ds, s, b);
    }
}

void stoke__npy_stage_one(const stoke__npy_ds *ds, uint64_t block)
{
    stoke__npy_stage *s = atomic_load_explicit(&ds->stage, memory_order_acquire);
    if (s && block < s->nblocks)
        stage_once(ds, s, block);
}

void stoke__npy_stage_claim(const stoke__npy_ds *ds, uint64_t block, int how)
{
    stoke__npy_stage *s = atomic_load_explicit(&ds->stage, memory_order_acquire);
    if (!s || block >= s->nblocks || !first_in_epoch(s, block))
        return;
    if (how == STOKE__NPY_STAGE_ADVISE)
        advise_block(ds, s, block);
    else
        atomic_fetch_add_explicit(&s->counters[how == STOKE__NPY_STAGE_RESIDENT ? 1 : 0], 1,
                                  memory_order_relaxed);
}

void stoke__npy_stage_stats(const stoke__npy_ds *ds, uint64_t *read_ahead, uint64_t *resident_)
{
    uint64_t a = 0, r = 0;
    for (const stoke__npy_stage *s = atomic_load(&ds->stages); s; s = s->older) {
        a += atomic_load(&s->counters[0]);
        r += atomic_load(&s->counters[1]);
    }
    *read_ahead = a;
    *resident_ = r;
}

void stoke__npy_stage_staged(const stoke__npy_ds *ds, uint64_t *blocks, uint64_t *direct,
                             uint64_t *rows)
{
    *blocks = *direct = *rows = 0;
    for (const stoke__npy_stage *s = atomic_load(&ds->stages); s; s = s->older)
        if (s->slots)
            stoke__npy_slots_stats(s->slots, blocks, direct, rows);
}

stoke__npy_slots *stoke__npy_stage_slots(const stoke__npy_ds *ds)
{
    stoke__npy_stage *s = atomic_load_explicit(&ds->stage, memory_order_acquire);
    return s ? s->slots : NULL;
}
