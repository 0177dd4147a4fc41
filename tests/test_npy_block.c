/* The npy source under a block shuffle (issue 9): the loader tells the source the order
 * (dataset.h, access_hint) and the source reads each block of the epoch ahead with large reads
 * the first time a batch touches it (npy_stage.c).  Checked here, on a file evicted from the
 * page cache: every io mode and 0/1/2 workers deliver the rows of the file (the same
 * content_hash as a random shuffle of the warm file, the same order in all of them); each block
 * is read ahead exactly once per epoch, and a block found resident is not; the read-ahead
 * really reads the whole block (mincore) after one batch of four rows of it; a random shuffle
 * reads nothing ahead; process workers share the read-ahead; a file cut short in the middle of a
 * block-shuffled epoch is a clear error naming the file and the sample; a restored position
 * delivers the same rest of the epoch.  Needs page-cache eviction (posix_fadvise DONTNEED); where
 * it does not work the cases that need it skip. */
#define _GNU_SOURCE
#include "testutil.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "stoke/stoke.h"

#define ROWS       2000
#define ROW        3000 /* not a multiple of the page size: blocks share their edge pages */
#define BLOCK_ROWS 128  /* 375 KiB blocks: 16 blocks, the last one short */
#define NBLOCKS    ((ROWS + BLOCK_ROWS - 1) / BLOCK_ROWS)
#define WINDOW     4

static unsigned char g_data[(size_t)ROWS * ROW];
static size_t g_hn; /* header bytes: row i is at g_hn + i * ROW */
static int g_uring;

static const int MODES[] = {STOKE_NPY_IO_MMAP, STOKE_NPY_IO_PREAD, STOKE_NPY_IO_URING,
                            STOKE_NPY_IO_AUTO};

static char *tmp(const char *name)
{
    static char bufs[4][512];
    static int k;
    char n[256];
    snprintf(n, sizeof(n), "npyblock_%d_%s", (int)getpid(), name);
    char *b = bufs[k++ % 4];
    tu_tmp_path(n, b, 512);
    return b;
}

static void make_file(const char *path)
{
    uint64_t x = 0x2545f4914f6cdd1du;
    for (size_t i = 0; i < sizeof(g_data); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        g_data[i] = (unsigned char)x;
    }
    char dict[128];
    snprintf(dict, sizeof(dict), "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }",
             ROWS, ROW);
    g_hn = tu_npy_write(path, dict, g_data, sizeof(g_data));
}

/* Evicts path from the page cache (fdatasync, then DONTNEED); skips the test when pages stay. */
static void evict(const char *path)
{
    int left = tu_evict(path);
    if (left > 5)
        tu_skip("page cache eviction does not work here (%d%% still resident)", left);
}

static uint64_t fnv(const unsigned char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3u;
    return h;
}

static uint64_t g_file_hash; /* sum of fnv of every row: the content_hash of a whole epoch */

static int open_opts(const char *path, const char *labels, int io, int direct, stoke_dataset *ds)
{
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    o.io = io;
    o.direct = direct;
    o.labels_path = labels;
    return stoke_npy_open_opts(path, &o, ds);
}

static int open_io(const char *path, int io, stoke_dataset *ds)
{
    return open_opts(path, NULL, io, STOKE_NPY_DIRECT_AUTO, ds);
}

static int64_t g_labels[ROWS]; /* native values; the labels file holds them big-endian */

/* ROWS big-endian int64 labels. */
static void make_labels(const char *path)
{
    unsigned char be[ROWS * 8];
    for (int i = 0; i < ROWS; i++) {
        g_labels[i] = (int64_t)i * 7919 - 123456;
        for (int b = 0; b < 8; b++)
            be[i * 8 + b] = (unsigned char)((uint64_t)g_labels[i] >> (56 - 8 * b));
    }
    char dict[128];
    snprintf(dict, sizeof(dict), "{'descr': '>i8', 'fortran_order': False, 'shape': (%d,), }",
             ROWS);
    tu_npy_write(path, dict, be, sizeof(be));
}

/* Whether O_DIRECT reads work for path (not on tmpfs, for one). */
static int direct_works(const char *path)
{
    int fd = open(path, O_RDONLY | O_DIRECT);
    if (fd < 0)
        return 0;
    void *buf = NULL;
    ssize_t r = -1;
    if (posix_memalign(&buf, 4096, 4096) == 0)
        r = pread(fd, buf, 4096, 0);
    free(buf);
    close(fd);
    return r > 0;
}

static void staged(const stoke_dataset *ds, uint64_t *blocks, uint64_t *direct, uint64_t *rows)
{
    assert_int_equal(stoke_npy_block_staged(ds, blocks, direct, rows), STOKE_OK);
}

static stoke_loader *window_loader(stoke_dataset *ds, int workers, int kind, size_t batch,
                                   uint64_t window, uint64_t seed)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = batch;
    o.num_workers = workers;
    o.pin_memory = 0;
    o.seed = seed;
    o.sampler.kind = kind;
    o.sampler.block_rows = BLOCK_ROWS;
    o.sampler.block_window = window;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, ds, &l), STOKE_OK);
    return l;
}

static stoke_loader *block_loader(stoke_dataset *ds, int workers, int kind, size_t batch)
{
    return window_loader(ds, workers, kind, batch, WINDOW, 5);
}

/* One epoch: checks every row's bytes (and label, with a labels file) against the files,
 * returns the content hash (sum of the rows' fnv) and the order in order[] (ROWS entries). */
static uint64_t run_epoch(stoke_loader *l, uint64_t *order)
{
    uint64_t hash = 0;
    size_t got = 0;
    stoke_batch *b;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        size_t n = stoke_batch_count(b);
        const uint64_t *idx = stoke_batch_indices(b);
        const unsigned char *d = stoke_batch_data(b, 0);
        const int64_t *lab = stoke_batch_data(b, 1); /* NULL without labels */
        assert_true(got + n <= ROWS);
        for (size_t j = 0; j < n; j++) {
            if (memcmp(d + j * ROW, g_data + idx[j] * ROW, ROW) != 0)
                fail_msg("slot %zu (sample %llu): wrong bytes", j, (unsigned long long)idx[j]);
            if (lab && lab[j] != g_labels[idx[j]])
                fail_msg("slot %zu (sample %llu): label %lld, file %lld", j,
                         (unsigned long long)idx[j], (long long)lab[j],
                         (long long)g_labels[idx[j]]);
            hash += fnv(d + j * ROW, ROW);
            order[got + j] = idx[j];
        }
        got += n;
        stoke_batch_release(b);
    }
    if (rc != STOKE_EEND)
        fail_msg("next: %s: %s", stoke_err_name(rc), stoke_last_error());
    assert_int_equal(got, ROWS);
    return hash;
}

static void block_stats(const stoke_dataset *ds, uint64_t *ahead, uint64_t *res)
{
    assert_int_equal(stoke_npy_block_stats(ds, ahead, res), STOKE_OK);
}

/* Every io mode, 0, 1 and 2 workers, on the evicted file: the rows of the file in the same
 * order everywhere, the content hash of a random shuffle of the warm file; each block read
 * ahead once in the cold epoch (0 workers: all of them; with workers a block may be found
 * resident when another worker's rows of it came in first), and each once more in the second,
 * warm epoch (found resident).  io=pread and io=uring (and auto, which picks one of them on
 * the cold file) read blocks whole into block buffers (through the page cache: the file is
 * far under half of RAM): with 0 workers every block once per epoch and every row from a
 * buffer; io=mmap has none. */
static void test_cold_same_content(void **state)
{
    (void)state;
    const char *p = tmp("cold.npy");
    make_file(p);
    tu_use_none();
    /* the reference: a random shuffle of the warm file with io=mmap */
    stoke_dataset ds;
    assert_int_equal(open_io(p, STOKE_NPY_IO_MMAP, &ds), STOKE_OK);
    stoke_loader *l = block_loader(&ds, 0, STOKE_SAMPLER_RANDOM, 64);
    static uint64_t order[ROWS], order0[ROWS];
    assert_int_equal(run_epoch(l, order), g_file_hash);
    stoke_loader_destroy(l);
    uint64_t ahead, res;
    block_stats(&ds, &ahead, &res);
    assert_int_equal(ahead + res, 0); /* a random shuffle reads nothing ahead */
    stoke_dataset_close(&ds);

    int have = 0;
    for (size_t m = 0; m < sizeof(MODES) / sizeof(MODES[0]); m++) {
        if (MODES[m] == STOKE_NPY_IO_URING && !g_uring)
            continue;
        for (int w = 0; w <= 2; w++) {
            evict(p); /* io=auto looks at the file at open */
            assert_int_equal(open_io(p, MODES[m], &ds), STOKE_OK);
            evict(p); /* what the header read at open brought in */
            l = block_loader(&ds, w, STOKE_SAMPLER_BLOCK, 96);
            uint64_t h = run_epoch(l, order);
            if (h != g_file_hash)
                fail_msg("io=%s, %d workers: content hash %llx, file %llx",
                         stoke_npy_io_name(MODES[m]), w, (unsigned long long)h,
                         (unsigned long long)g_file_hash);
            if (!have)
                memcpy(order0, order, sizeof(order));
            else if (memcmp(order, order0, sizeof(order)) != 0)
                fail_msg("io=%s, %d workers: another order", stoke_npy_io_name(MODES[m]), w);
            have = 1;
            block_stats(&ds, &ahead, &res);
            assert_int_equal(ahead + res, NBLOCKS);
            if (w == 0) {
                assert_int_equal(ahead, NBLOCKS);
            } else {
                assert_true(ahead >= 1);
            }
            uint64_t sb, sd, sr;
            staged(&ds, &sb, &sd, &sr);
            assert_int_equal(sd, 0); /* direct=auto: off for a small file */
            if (stoke_npy_io_used(&ds) == STOKE_NPY_IO_MMAP) {
                assert_int_equal(sb + sr, 0);
            } else if (w == 0) {
                assert_int_equal(sb, NBLOCKS);
                assert_int_equal(sr, ROWS);
            } else {
                assert_true(sb >= NBLOCKS / 2 && sr >= ROWS / 2);
            }
            /* the next epoch, warm: every block is found resident */
            int warm = tu_resident_pct(p, 0, 0);
            assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
            assert_int_equal(run_epoch(l, order), g_file_hash);
            uint64_t ahead2, res2;
            block_stats(&ds, &ahead2, &res2);
            /* each block once more; found resident, unless the kernel dropped some of its
             * pages around the epoch (this VM's proactive reclaim does, under load: seen with
             * 6 of 16 found resident): then only the count is checked */
            int kept = warm == 100 && tu_resident_pct(p, 0, 0) >= 90;
            if (!kept && res2 - res < NBLOCKS / 2)
                fprintf(stderr,
                        "note: io=%s, %d workers: the kernel dropped pages of the "
                        "file around the warm epoch (%d%% resident before it); "
                        "residency not checked\n",
                        stoke_npy_io_name(MODES[m]), w, warm);
            if ((ahead2 - ahead) + (res2 - res) != NBLOCKS || (kept && res2 - res < NBLOCKS / 2))
                fail_msg("io=%s, %d workers: epoch 1 read ahead %llu, resident %llu; epoch 2 "
                         "%llu, %llu",
                         stoke_npy_io_name(MODES[m]), w, (unsigned long long)ahead,
                         (unsigned long long)res, (unsigned long long)(ahead2 - ahead),
                         (unsigned long long)(res2 - res));
            stoke_loader_destroy(l);
            stoke_dataset_close(&ds);
        }
    }
    unlink(p);
}

/* Process workers (forked after the hint): the same rows, and the children share the bits,
 * so each block is still read ahead once in the epoch (not once per child), also in the next
 * epoch: a child's set_epoch, on its first batch of the epoch while the other child reads,
 * leaves the shared bits to the parent, which cleared them while no get ran. */
static void test_process_workers(void **state)
{
    (void)state;
    const char *p = tmp("procs.npy");
    make_file(p);
    tu_use_none();
    evict(p);
    stoke_dataset ds;
    assert_int_equal(open_io(p, STOKE_NPY_IO_AUTO, &ds), STOKE_OK);
    evict(p);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 96;
    o.num_workers = 2;
    o.pin_memory = 0;
    o.worker_mode = STOKE_WORKER_PROCESSES;
    o.sampler.kind = STOKE_SAMPLER_BLOCK;
    o.sampler.block_rows = BLOCK_ROWS;
    o.sampler.block_window = WINDOW;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    static uint64_t order[ROWS];
    assert_int_equal(run_epoch(l, order), g_file_hash);
    uint64_t ahead, res;
    block_stats(&ds, &ahead, &res);
    assert_int_equal(ahead + res, NBLOCKS);
    assert_true(ahead >= 1);
    for (int e = 2; e <= 4; e++) {
        assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
        assert_int_equal(run_epoch(l, order), g_file_hash);
        block_stats(&ds, &ahead, &res);
        assert_int_equal(ahead + res, e * NBLOCKS);
    }
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(p);
}

/* A process forked after the block buffers exist (a process worker, or a caller's own fork)
 * reads its rows the io mode's way: the buffers and their state belong to the process that
 * made them (the child's copies could hold a lock taken at the fork).  The parent's first
 * batch is served from a buffer; the child's next batches bring the right bytes and leave the
 * buffers' row count where the fork left it. */
static void test_forked_child_reads_rows(void **state)
{
    (void)state;
    const char *p = tmp("fork.npy");
    make_file(p);
    tu_use_none();
    evict(p);
    stoke_dataset ds;
    assert_int_equal(open_opts(p, NULL, STOKE_NPY_IO_PREAD, STOKE_NPY_DIRECT_OFF, &ds), STOKE_OK);
    stoke_loader *l = block_loader(&ds, 0, STOKE_SAMPLER_BLOCK, 32);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    stoke_batch_release(b);
    uint64_t sb, sd, rows0;
    staged(&ds, &sb, &sd, &rows0);
    assert_int_equal(rows0, 32);
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int bad = 0;
        for (int i = 0; i < 8 && !bad; i++) {
            if (stoke_loader_next(l, &b) != STOKE_OK) {
                bad = 2;
                break;
            }
            const uint64_t *idx = stoke_batch_indices(b);
            const unsigned char *d = stoke_batch_data(b, 0);
            for (size_t j = 0; j < stoke_batch_count(b); j++)
                if (memcmp(d + j * ROW, g_data + idx[j] * ROW, ROW) != 0)
                    bad = 3;
            stoke_batch_release(b);
        }
        uint64_t rows;
        if (!bad && (stoke_npy_block_staged(&ds, &sb, &sd, &rows) != STOKE_OK || rows != rows0))
            bad = 4;
        _exit(bad);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
        fail_msg("child: status %d (2: next failed, 3: wrong bytes, 4: it served rows from the "
                 "parent's buffers)",
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(p);
}

/* Blocks under 256 KiB (here 32 rows, 94 KiB) are not read ahead: the rows still arrive. */
static void test_small_blocks_not_read_ahead(void **state)
{
    (void)state;
    const char *p = tmp("small.npy");
    make_file(p);
    tu_use_none();
    stoke_dataset ds;
    assert_int_equal(open_io(p, STOKE_NPY_IO_PREAD, &ds), STOKE_OK);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 64;
    o.pin_memory = 0;
    o.sampler.kind = STOKE_SAMPLER_BLOCK;
    o.sampler.block_rows = 32;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    static uint64_t order[ROWS];
    assert_int_equal(run_epoch(l, order), g_file_hash);
    uint64_t ahead, res;
    block_stats(&ds, &ahead, &res);
    assert_int_equal(ahead + res, 0);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(p);
}

/* One batch of 4 rows of the first block (window 1: a window is one block): the whole block
 * comes into the page cache (waited for, up to a minute: the reads are asynchronous), the
 * blocks after it do not. */
static void test_whole_block_read(void **state)
{
    (void)state;
    const char *p = tmp("whole.npy");
    make_file(p);
    tu_use_none();
    evict(p);
    stoke_dataset ds;
    assert_int_equal(open_io(p, STOKE_NPY_IO_PREAD, &ds), STOKE_OK);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t all = ((size_t)ROWS * ROW + g_hn + pg - 1) / pg;
    unsigned char *was = malloc(all);
    for (size_t i = 0; i < all; i++)
        was[i] = tu_resident_pct(p, i, 1) == 100;
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.num_workers = 0;
    o.pin_memory = 0;
    o.sampler.kind = STOKE_SAMPLER_BLOCK;
    o.sampler.block_rows = BLOCK_ROWS;
    o.sampler.block_window = 1;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    const uint64_t *idx = stoke_batch_indices(b);
    uint64_t blk = idx[0] / BLOCK_ROWS;
    for (size_t j = 0; j < 4; j++)
        assert_int_equal(idx[j] / BLOCK_ROWS, blk);
    stoke_batch_release(b);
    uint64_t ahead, res;
    block_stats(&ds, &ahead, &res);
    assert_int_equal(ahead, 1);
    assert_int_equal(res, 0);
    /* the block's pages, less its two edge pages (shared with its neighbours) */
    size_t first = (g_hn + blk * BLOCK_ROWS * ROW) / pg + 1;
    size_t last = (g_hn + (blk + 1) * BLOCK_ROWS * ROW - 1) / pg - 1;
    int pct = 0;
    for (int i = 0; i < 6000 && (pct = tu_resident_pct(p, first, last - first + 1)) < 100; i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    assert_int_equal(pct, 100);
    /* Elsewhere nothing came in since open (its header read has a read-ahead of its own) */
    size_t hits = 0;
    for (size_t i = 0; i < all; i++)
        if ((i + 1 < first || i > last + 1) && !was[i] && tu_resident_pct(p, i, 1) == 100)
            hits++;
    if (hits > 2)
        fail_msg("%zu pages outside block %llu came in", hits, (unsigned long long)blk);
    free(was);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(p);
}

/* The file cut to half its rows after the first batches of a block-shuffled epoch: the
 * epoch ends with STOKE_EIO naming the file, a sample and "file changed while loading", in
 * every io mode, with 0 and 2 workers, and with O_DIRECT block reads (direct=on) too. */
static void test_truncated_mid_epoch(void **state)
{
    (void)state;
    const char *p = tmp("cut.npy");
    tu_use_none();
    for (int direct = STOKE_NPY_DIRECT_AUTO; direct <= STOKE_NPY_DIRECT_ON; direct++)
        for (size_t m = 0; m < sizeof(MODES) / sizeof(MODES[0]); m++) {
            if (MODES[m] == STOKE_NPY_IO_URING && !g_uring)
                continue;
            for (int w = 0; w <= 2; w += 2) {
                make_file(p);
                evict(p);
                stoke_dataset ds;
                assert_int_equal(open_opts(p, NULL, MODES[m], direct, &ds), STOKE_OK);
                stoke_loader *l = block_loader(&ds, w, STOKE_SAMPLER_BLOCK, 32);
                stoke_batch *b;
                assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
                stoke_batch_release(b);
                assert_int_equal(truncate(p, (off_t)(g_hn + (size_t)ROWS / 2 * ROW)), 0);
                int rc;
                while ((rc = stoke_loader_next(l, &b)) == STOKE_OK)
                    stoke_batch_release(b);
                if (rc != STOKE_EIO)
                    fail_msg("io=%s, direct=%d, %d workers: %s (%s)", stoke_npy_io_name(MODES[m]),
                             direct, w, stoke_err_name(rc), stoke_last_error());
                const char *e = stoke_last_error();
                char want[600];
                snprintf(want, sizeof(want), "npy %s: sample ", p);
                if (!strstr(e, want) || !strstr(e, "file changed while loading"))
                    fail_msg("io=%s, %d workers: %s", stoke_npy_io_name(MODES[m]), w, e);
                stoke_loader_destroy(l);
                stoke_dataset_close(&ds);
            }
        }
    unlink(p);
}

/* A position saved in the middle of a cold block-shuffled epoch and restored into a new loader
 * on the evicted file delivers the rest of the epoch the first loader delivered. */
static void test_resume(void **state)
{
    (void)state;
    const char *p = tmp("resume.npy");
    make_file(p);
    tu_use_none();
    evict(p);
    stoke_dataset ds;
    assert_int_equal(open_io(p, STOKE_NPY_IO_AUTO, &ds), STOKE_OK);
    stoke_loader *l = block_loader(&ds, 2, STOKE_SAMPLER_BLOCK, 100);
    static uint64_t order[ROWS];
    stoke_batch *b;
    stoke_loader_state st;
    size_t got = 0;
    for (int i = 0; i < 20; i++) {
        if (i == 7)
            assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
        assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
        size_t n = stoke_batch_count(b);
        memcpy(order + got, stoke_batch_indices(b), n * sizeof(uint64_t));
        got += n;
        stoke_batch_release(b);
    }
    assert_int_equal(stoke_loader_next(l, &b), STOKE_EEND);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);

    evict(p);
    assert_int_equal(open_io(p, STOKE_NPY_IO_AUTO, &ds), STOKE_OK);
    l = block_loader(&ds, 2, STOKE_SAMPLER_BLOCK, 100);
    assert_int_equal(stoke_loader_restore_state(l, &st), STOKE_OK);
    size_t at = (size_t)st.cursor * 100;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        size_t n = stoke_batch_count(b);
        const uint64_t *idx = stoke_batch_indices(b);
        const unsigned char *d = stoke_batch_data(b, 0);
        for (size_t j = 0; j < n; j++) {
            assert_int_equal(idx[j], order[at + j]);
            assert_memory_equal(d + j * ROW, g_data + idx[j] * ROW, ROW);
        }
        at += n;
        stoke_batch_release(b);
    }
    assert_int_equal(at, ROWS);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(p);
}

/* Writes the test file at p for an O_DIRECT test (skips where the file system refuses
 * O_DIRECT), with no accelerator; returns the file's pages. */
static size_t direct_file(const char *p)
{
    make_file(p);
    if (!direct_works(p))
        tu_skip("O_DIRECT reads are refused on this file system (%s)", p);
    tu_use_none();
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return ((size_t)ROWS * ROW + g_hn + pg - 1) / pg;
}

/* direct=on, io=pread and io=uring, 0 and 2 workers, data and big-endian labels, evicted: every
 * row and label right in both epochs, in the order of direct=off; with 0 workers each block read
 * whole with O_DIRECT once per epoch and every row served from a buffer; and the data file's
 * pages stay out of the page cache (O_DIRECT reads past it).  direct=off: no O_DIRECT read, and
 * the file is in the page cache after the epoch. */
static void test_direct_blocks(void **state)
{
    (void)state;
    const char *p = tmp("direct.npy"), *lp = tmp("direct_labels.npy");
    size_t all = direct_file(p);
    make_labels(lp);
    static uint64_t order[ROWS], order0[ROWS];
    int have = 0;
    static const int io[] = {STOKE_NPY_IO_PREAD, STOKE_NPY_IO_URING};
    for (int direct = STOKE_NPY_DIRECT_OFF; direct >= STOKE_NPY_DIRECT_ON; direct--)
        for (size_t m = 0; m < 2; m++) {
            if (io[m] == STOKE_NPY_IO_URING && !g_uring)
                continue;
            for (int w = 0; w <= 2; w += 2) {
                evict(p);
                evict(lp);
                stoke_dataset ds;
                assert_int_equal(open_opts(p, lp, io[m], direct, &ds), STOKE_OK);
                evict(p);
                stoke_loader *l = block_loader(&ds, w, STOKE_SAMPLER_BLOCK, 96);
                for (int e = 0; e < 2; e++) {
                    if (e)
                        assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                    assert_int_equal(run_epoch(l, order), g_file_hash);
                    if (!have)
                        memcpy(order0, order, sizeof(order));
                    have = 1;
                    /* both epochs use seed 5: epoch 1 differs from epoch 0, compare epoch 0 */
                    if (e == 0 && memcmp(order, order0, sizeof(order)) != 0)
                        fail_msg("direct=%d io=%s %d workers: another order", direct,
                                 stoke_npy_io_name(io[m]), w);
                    uint64_t sb, sd, sr;
                    staged(&ds, &sb, &sd, &sr);
                    int pct = tu_resident_pct(p, 0, all);
                    if (direct == STOKE_NPY_DIRECT_ON) {
                        if (w == 0 && (sb != (uint64_t)NBLOCKS * (e + 1) || sd != sb ||
                                       sr != (uint64_t)ROWS * (e + 1)))
                            fail_msg("io=%s epoch %d: staged %llu, direct %llu, rows %llu",
                                     stoke_npy_io_name(io[m]), e, (unsigned long long)sb,
                                     (unsigned long long)sd, (unsigned long long)sr);
                        assert_true(sd >= 1);
                        if (pct > 10)
                            fail_msg("direct=on io=%s %d workers: %d%% of the file in the page "
                                     "cache after epoch %d",
                                     stoke_npy_io_name(io[m]), w, pct, e);
                    } else {
                        assert_int_equal(sd, 0);
                        assert_true(sb >= 1);
                        if (pct < 90)
                            fail_msg("direct=off io=%s: only %d%% of the file in the page cache",
                                     stoke_npy_io_name(io[m]), pct);
                    }
                }
                stoke_loader_destroy(l);
                stoke_dataset_close(&ds);
            }
        }
    unlink(p);
    unlink(lp);
}

/* direct=on over ten epochs, 0 workers, the file evicted once: every block of every epoch read
 * with O_DIRECT and the file's pages still out of the page cache after each.  Asking whether a
 * block is cached must not itself read pages in (a 1-byte preadv2 RWF_NOWAIT probe starts a read
 * of the page it misses: one more probed page per block and epoch, until the block looked
 * resident and was read through the page cache). */
static void test_direct_every_epoch(void **state)
{
    (void)state;
    const char *p = tmp("direct_epochs.npy");
    size_t all = direct_file(p);
    static uint64_t order[ROWS];
    evict(p);
    stoke_dataset ds;
    assert_int_equal(open_opts(p, NULL, STOKE_NPY_IO_PREAD, STOKE_NPY_DIRECT_ON, &ds), STOKE_OK);
    evict(p);
    stoke_loader *l = block_loader(&ds, 0, STOKE_SAMPLER_BLOCK, 96);
    uint64_t sb0 = 0, sd0 = 0, sr0 = 0;
    for (int e = 0; e < 10; e++) {
        if (e)
            assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
        assert_int_equal(run_epoch(l, order), g_file_hash);
        uint64_t sb, sd, sr;
        staged(&ds, &sb, &sd, &sr);
        if (sb - sb0 != NBLOCKS || sd - sd0 != NBLOCKS || sr - sr0 != ROWS)
            fail_msg("epoch %d: %llu blocks staged, %llu with O_DIRECT, %llu rows (want %d, %d, "
                     "%d)",
                     e, (unsigned long long)(sb - sb0), (unsigned long long)(sd - sd0),
                     (unsigned long long)(sr - sr0), NBLOCKS, NBLOCKS, ROWS);
        sb0 = sb, sd0 = sd, sr0 = sr;
        int pct = tu_resident_pct(p, 0, all);
        if (pct > 10)
            fail_msg("epoch %d: %d%% of the file in the page cache", e, pct);
    }
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(p);
}

/* Two block buffers (a window of one block) for four workers with batches of 32 rows: the
 * batches in flight span several windows, so workers take buffers from each other, wait for
 * blocks another one reads, and read rows one by one when no buffer is free.  Three epochs,
 * direct=on and off (and both io modes): every row and label right, the same order as 0
 * workers. */
static void test_buffers_contended(void **state)
{
    (void)state;
    const char *p = tmp("contend.npy"), *lp = tmp("contend_labels.npy");
    make_file(p);
    make_labels(lp);
    tu_use_none();
    int dw = direct_works(p);
    static uint64_t order[3][ROWS], got[ROWS];
    for (int direct = STOKE_NPY_DIRECT_ON; direct <= STOKE_NPY_DIRECT_OFF; direct++)
        for (int io = STOKE_NPY_IO_PREAD; io <= STOKE_NPY_IO_URING; io++) {
            if ((io == STOKE_NPY_IO_URING && !g_uring) || (direct == STOKE_NPY_DIRECT_ON && !dw))
                continue;
            for (int w = 0; w <= 4; w += 4) {
                evict(p);
                stoke_dataset ds;
                assert_int_equal(open_opts(p, lp, io, direct, &ds), STOKE_OK);
                stoke_loader *l = window_loader(&ds, w, STOKE_SAMPLER_BLOCK, 32, 1, 9);
                for (int e = 0; e < 3; e++) {
                    if (e)
                        assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                    assert_int_equal(run_epoch(l, w ? got : order[e]), g_file_hash);
                    if (w && memcmp(got, order[e], sizeof(got)) != 0)
                        fail_msg("direct=%d io=%s epoch %d: 4 workers, another order", direct,
                                 stoke_npy_io_name(io), e);
                }
                uint64_t sb, sd, sr;
                staged(&ds, &sb, &sd, &sr);
                assert_true(sb >= 1 && sr >= 1);
                stoke_loader_destroy(l);
                stoke_dataset_close(&ds);
            }
        }
    unlink(p);
    unlink(lp);
}

int main(void)
{
    g_uring = stoke_npy_io_available(STOKE_NPY_IO_URING) == STOKE_OK;
    if (!g_uring) /* its cases are left out: the file reports a skip */
        tu_skip_note("io=uring unavailable: %s", stoke_last_error());
    make_file(tmp("hash.npy"));
    unlink(tmp("hash.npy"));
    for (size_t i = 0; i < ROWS; i++)
        g_file_hash += fnv(g_data + i * ROW, ROW);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cold_same_content),
        cmocka_unit_test(test_process_workers),
        cmocka_unit_test(test_small_blocks_not_read_ahead),
        cmocka_unit_test(test_whole_block_read),
        cmocka_unit_test(test_truncated_mid_epoch),
        cmocka_unit_test(test_resume),
        cmocka_unit_test(test_direct_blocks),
        cmocka_unit_test(test_direct_every_epoch),
        cmocka_unit_test(test_buffers_contended),
        cmocka_unit_test(test_forked_child_reads_rows),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
