/* The npy source's I/O modes: io=mmap, io=pread, io=uring and io=auto deliver the same bytes
 * (get, get_batch and through the loader with 0 and 2 workers), a file truncated under a read
 * gives the same error in every mode, io=uring without liburing or with a kernel that refuses
 * io_uring fails clearly (auto falls back), and io=auto follows the file's page-cache residency.
 * The io=uring cases skip (the file exits 77) when this build has no liburing. */
#define _GNU_SOURCE
#include "testutil.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/npy_internal.h"
#include "stoke/stoke.h"

#define SKIP_RETURN_CODE 77

static int g_skipped;
static int g_uring; /* io=uring usable in this process */

#define ROWS 1000
#define ROW  3000 /* not a multiple of the page size: rows straddle pages */

static const int MODES[] = {STOKE_NPY_IO_MMAP, STOKE_NPY_IO_PREAD, STOKE_NPY_IO_URING,
                            STOKE_NPY_IO_AUTO};

static char *tmp(const char *name)
{
    static char bufs[4][512];
    static int k;
    char n[256];
    snprintf(n, sizeof(n), "npyio_%d_%s", (int)getpid(), name);
    char *b = bufs[k++ % 4];
    tu_tmp_path(n, b, 512);
    return b;
}

static unsigned char g_data[ROWS * ROW];
static int64_t g_labels[ROWS]; /* native values; the file holds them big-endian */

static void make_files(const char *data, const char *labels)
{
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (size_t i = 0; i < sizeof(g_data); i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        g_data[i] = (unsigned char)x;
    }
    char dict[128];
    snprintf(dict, sizeof(dict), "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }",
             ROWS, ROW);
    tu_npy_write(data, dict, g_data, sizeof(g_data));
    if (!labels)
        return;
    unsigned char be[ROWS * 8];
    for (int i = 0; i < ROWS; i++) {
        g_labels[i] = (int64_t)i * 7919 - 123456;
        uint64_t v = (uint64_t)g_labels[i];
        for (int b = 0; b < 8; b++)
            be[i * 8 + b] = (unsigned char)(v >> (56 - 8 * b));
    }
    snprintf(dict, sizeof(dict), "{'descr': '>i8', 'fortran_order': False, 'shape': (%d,), }",
             ROWS);
    tu_npy_write(labels, dict, be, sizeof(be));
}

static int open_io(const char *path, const char *labels, int io, stoke_dataset *ds)
{
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    o.labels_path = labels;
    o.io = io;
    return stoke_npy_open_opts(path, &o, ds);
}

static int skip_uring(int io)
{
    if (io == STOKE_NPY_IO_URING && !g_uring) {
        g_skipped = 1;
        return 1;
    }
    return 0;
}

/* Opens MODES[m] over p (labels lp) into *ds: 1, or 0 when this build skips the mode. */
static int open_mode(size_t m, const char *p, const char *lp, stoke_dataset *ds)
{
    if (skip_uring(MODES[m]))
        return 0;
    assert_int_equal(open_io(p, lp, MODES[m], ds), STOKE_OK);
    return 1;
}

/* A batch of `n` indices: shuffled, with runs of consecutive rows mixed in. */
static void batch_indices(uint64_t *idx, size_t n, unsigned seed)
{
    uint64_t x = seed * 2654435761u + 1;
    for (size_t j = 0; j < n; j++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        if (j && (x >> 60) < 6 && idx[j - 1] + 1 < ROWS)
            idx[j] = idx[j - 1] + 1; /* a run */
        else
            idx[j] = (x >> 33) % ROWS;
    }
}

static void check_batch(const uint64_t *idx, size_t n, const unsigned char *d, const int64_t *lab)
{
    for (size_t j = 0; j < n; j++) {
        if (memcmp(d + j * ROW, g_data + idx[j] * ROW, ROW) != 0)
            fail_msg("slot %zu (sample %llu): wrong bytes", j, (unsigned long long)idx[j]);
        if (lab && lab[j] != g_labels[idx[j]])
            fail_msg("slot %zu (sample %llu): label %lld, expected %lld", j,
                     (unsigned long long)idx[j], (long long)lab[j], (long long)g_labels[idx[j]]);
    }
}

/* Frees a test's batch arrays and removes its two files. */
static void free_case(void *idx, void *d, void *lab, const char *p, const char *lp)
{
    free(idx);
    free(d);
    free(lab);
    unlink(p);
    unlink(lp);
}

/* Every mode: get() of every sample and get_batch() of shuffled batches with runs (longer
 * than the uring queue, so the queue refills) give the file's bytes and native labels. */
static void test_modes_identical(void **state)
{
    const char *p = tmp("same.npy"), *lp = tmp("same-labels.npy");
    make_files(p, lp);
    enum { N = 700 };
    uint64_t *idx = malloc(N * sizeof(*idx));
    unsigned char *d = malloc((size_t)N * ROW);
    int64_t *lab = malloc(N * sizeof(*lab));
    for (size_t m = 0; m < sizeof(MODES) / sizeof(MODES[0]); m++) {
        stoke_dataset ds;
        if (!open_mode(m, p, lp, &ds))
            continue;
        int io = MODES[m], used = stoke_npy_io_used(&ds);
        assert_true(io == STOKE_NPY_IO_AUTO ? used != STOKE_NPY_IO_AUTO && used >= 0 : used == io);
        assert_non_null(ds.read);
        char msg[256];
        for (uint64_t i = 0; i < ROWS; i += 37) {
            void *dst[TU_FIELDS] = {d, lab};
            assert_int_equal(ds.get(ds.user, i, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
            check_batch(&i, 1, d, lab);
        }
        for (unsigned seed = 1; seed <= 4; seed++) {
            size_t n = seed == 4 ? 1 : N - seed * 50;
            batch_indices(idx, n, seed);
            memset(d, 0, (size_t)N * ROW);
            void *dst[TU_FIELDS] = {d, lab};
            uint64_t err = 0;
            assert_int_equal(tu_read_batch(&ds, idx, n, dst, (int)seed % 3, msg, sizeof(msg), &err),
                             STOKE_OK);
            check_batch(idx, n, d, lab);
        }
        /* a NULL field is skipped; an index past the end is STOKE_ERANGE naming it */
        void *only_labels[TU_FIELDS] = {NULL, lab};
        uint64_t err = 0, bad[3] = {5, ROWS + 4, 6};
        assert_int_equal(tu_read_batch(&ds, bad, 1, only_labels, 0, msg, sizeof(msg), &err),
                         STOKE_OK);
        assert_int_equal(lab[0], g_labels[5]);
        assert_int_equal(tu_read_batch(&ds, bad, 3, only_labels, 0, msg, sizeof(msg), &err),
                         STOKE_ERANGE);
        assert_int_equal(err, ROWS + 4);
        assert_non_null(strstr(msg, "index 1004 out of range"));
        stoke_dataset_close(&ds);
    }
    free_case(idx, d, lab, p, lp);
}

/* read() with a run of slots per sample (its scattered path) in every mode: 64 shuffled samples
 * (runs mixed in), each into buffers of its own (the labels file is big-endian: io=mmap swaps each
 * row), the bytes and labels right; no samples is STOKE_OK; a NULL slot is left alone; an index
 * past the end is STOKE_ERANGE naming it.  A file cut short after open: mmap and pread fail with
 * STOKE_EIO naming the first sample past the cut. */
static void test_scattered_identical(void **state)
{
    const char *p = tmp("scat.npy"), *lp = tmp("scat-labels.npy");
    make_files(p, lp);
    enum { SN = 64 };
    uint64_t idx[SN];
    unsigned char *d = malloc((size_t)SN * ROW);
    int64_t lab[SN];
    void *dst[SN * 2];
    for (size_t m = 0; m < sizeof(MODES) / sizeof(MODES[0]); m++) {
        stoke_dataset ds;
        if (!open_mode(m, p, lp, &ds))
            continue;
        assert_non_null(ds.read);
        char msg[256];
        for (unsigned seed = 1; seed <= 3; seed++) {
            size_t n = seed == 3 ? 1 : SN - seed;
            batch_indices(idx, n, seed + 10);
            memset(d, 0, (size_t)SN * ROW);
            for (size_t j = 0; j < n; j++) { /* sample j in slot n - 1 - j: not in index order */
                dst[2 * j] = d + (n - 1 - j) * ROW;
                dst[2 * j + 1] = &lab[n - 1 - j];
            }
            uint64_t err = 0;
            assert_int_equal(tu_read_each(&ds, idx, n, dst, 1, msg, sizeof(msg), &err), STOKE_OK);
            for (size_t j = 0; j < n; j++)
                check_batch(&idx[j], 1, d + (n - 1 - j) * ROW, &lab[n - 1 - j]);
        }
        uint64_t err = 0, bad[3] = {5, 6, ROWS + 4};
        assert_int_equal(tu_read_each(&ds, bad, 0, dst, 0, msg, sizeof(msg), &err),
                         STOKE_OK); /* no samples: nothing read, not even the bad index */
        int64_t keep = 42;
        void *three[6] = {d, NULL, d + ROW, &keep, d + 2 * ROW, &lab[0]};
        lab[0] = 0;
        assert_int_equal(tu_read_each(&ds, bad, 2, three, 0, msg, sizeof(msg), &err), STOKE_OK);
        assert_int_equal(keep, g_labels[6]);
        check_batch(&bad[0], 1, d, NULL);
        assert_int_equal(tu_read_each(&ds, bad, 3, three, 0, msg, sizeof(msg), &err), STOKE_ERANGE);
        assert_int_equal(err, ROWS + 4);
        assert_non_null(strstr(msg, "index 1004 out of range"));
        stoke_dataset_close(&ds);
    }
    static const int cut_modes[] = {STOKE_NPY_IO_MMAP, STOKE_NPY_IO_PREAD};
    for (int c = 0; c < 2; c++) {
        make_files(p, NULL);
        stoke_dataset ds;
        assert_int_equal(open_io(p, NULL, cut_modes[c], &ds), STOKE_OK);
        unsigned char head[256];
        char dict[128];
        snprintf(dict, sizeof(dict),
                 "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }", ROWS, ROW);
        assert_int_equal(truncate(p, (off_t)(tu_npy_head(head, dict) + 20 * ROW)), 0);
        uint64_t some[6] = {1, 2, 3, 500, 4, 999}, err = 0;
        void *six[6];
        for (int j = 0; j < 6; j++)
            six[j] = d + (size_t)j * ROW;
        char msg[256] = "";
        assert_int_equal(tu_read_each(&ds, some, 6, six, 0, msg, sizeof(msg), &err), STOKE_EIO);
        assert_int_equal(err, 500);
        assert_non_null(strstr(msg, "sample 500:"));
        assert_non_null(strstr(msg, "file changed while loading"));
        check_batch(some, 3, d, NULL); /* the samples before it are written */
        stoke_dataset_close(&ds);
    }
    free(d);
    unlink(p);
    unlink(lp);
}

/* One shuffled epoch through the loader: every batch's samples (indices, bytes, labels) for
 * 0 and 2 workers in every mode; the order is the same in all of them. */
static void test_loader_identical(void **state)
{
    const char *p = tmp("loader.npy"), *lp = tmp("loader-labels.npy");
    make_files(p, lp);
    tu_use_none();
    uint64_t order0[ROWS];
    int have_order = 0;
    for (size_t m = 0; m < sizeof(MODES) / sizeof(MODES[0]); m++) {
        int io = MODES[m];
        if (skip_uring(io))
            continue;
        for (int workers = 0; workers <= 2; workers += 2) {
            char spec[600];
            snprintf(spec, sizeof(spec), "npy:%s,labels=%s,io=%s", p, lp, stoke_npy_io_name(io));
            stoke_dataset ds;
            assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
            stoke_loader_opts o;
            stoke_loader_opts_init(&o);
            o.batch_size = 96; /* not a divisor of ROWS: a partial last batch */
            o.num_workers = workers;
            o.shuffle = 1;
            o.seed = 11;
            stoke_loader *l = NULL;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            uint64_t order[ROWS];
            size_t got = 0;
            stoke_batch *b;
            int rc;
            while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
                size_t n = stoke_batch_count(b);
                assert_true(got + n <= ROWS);
                const uint64_t *idx = stoke_batch_indices(b);
                check_batch(idx, n, stoke_batch_data(b, 0), stoke_batch_data(b, 1));
                memcpy(order + got, idx, n * sizeof(*idx));
                got += n;
                stoke_batch_release(b);
            }
            assert_int_equal(rc, STOKE_EEND);
            assert_int_equal(got, ROWS);
            if (!have_order) {
                memcpy(order0, order, sizeof(order));
                have_order = 1;
                int shuffled = 0;
                for (size_t i = 0; i < ROWS; i++)
                    shuffled |= order[i] != i;
                assert_true(shuffled);
            } else if (memcmp(order0, order, sizeof(order)) != 0) {
                fail_msg("io=%s, %d workers: a different order", stoke_npy_io_name(io), workers);
            }
            stoke_loader_destroy(l);
            stoke_dataset_close(&ds);
        }
    }
    unlink(p);
    unlink(lp);
}

/* One epoch of l (unshuffled, every row once): its bytes and labels checked. */
static void epoch_checked(stoke_loader *l, const char *what)
{
    size_t got = 0;
    stoke_batch *b;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        size_t n = stoke_batch_count(b);
        const uint64_t *idx = stoke_batch_indices(b);
        for (size_t j = 0; j < n; j++)
            assert_int_equal(idx[j], got + j);
        check_batch(idx, n, stoke_batch_data(b, 0), stoke_batch_data(b, 1));
        got += n;
        stoke_batch_release(b);
    }
    if (rc != STOKE_EEND || got != ROWS)
        fail_msg("%s: %s after %zu rows: %s", what, stoke_err_name(rc), got,
                 stoke_loader_last_error(l));
}

/* io=uring rings are their process's: one dataset's loaders in turn -- in this process, in
 * worker processes, in this process again -- each read every row right, and so did a child
 * forked by the caller (not the loader) and this process after it.  Before, a forked worker
 * submitted to the parent's ring (the queues are shared mappings), and the parent's next batch
 * crashed on a NULL submission entry. */
static void test_uring_rings_across_fork(void **state)
{
    (void)state;
    if (!g_uring) {
        g_skipped = 1;
        skip();
    }
    const char *p = tmp("fork.npy"), *lp = tmp("fork-labels.npy");
    make_files(p, lp);
    tu_use_none();
    char spec[600];
    snprintf(spec, sizeof(spec), "npy:%s,labels=%s,io=uring", p, lp);
    stoke_dataset ds;
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    static const int turns[][2] = {{0, 0}, {2, 1}, {0, 0}, {1, 1}, {2, 0}, {0, 0}};
    for (size_t t = 0; t < sizeof(turns) / sizeof(turns[0]); t++) {
        stoke_loader_opts o;
        stoke_loader_opts_init(&o);
        o.batch_size = 96;
        o.num_workers = turns[t][0];
        o.worker_mode = turns[t][1] ? STOKE_WORKER_PROCESSES : STOKE_WORKER_THREADS;
        stoke_loader *l = NULL;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        char what[64];
        snprintf(what, sizeof(what), "turn %zu (%d %s workers)", t, turns[t][0],
                 turns[t][1] ? "process" : "thread");
        epoch_checked(l, what);
        stoke_loader_destroy(l);
    }
    /* a fork the loader does not know of: the child reads on worker 0's ring, inherited */
    uint64_t idx[200];
    unsigned char *d = malloc(sizeof(idx) / sizeof(idx[0]) * ROW);
    int64_t lab[200];
    void *dst[TU_FIELDS] = {d, lab};
    char msg[256];
    uint64_t err = 0;
    for (int round = 0; round < 3; round++) {
        batch_indices(idx, 200, 40 + round);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int bad = 0;
            for (int k = 0; k < 3 && !bad; k++) {
                bad |= tu_read_batch(&ds, idx, 200, dst, 0, msg, sizeof(msg), &err) != STOKE_OK;
                for (size_t j = 0; j < 200 && !bad; j++)
                    bad |= memcmp(d + j * ROW, g_data + idx[j] * ROW, ROW) != 0 ||
                           lab[j] != g_labels[idx[j]];
            }
            _exit(bad ? 1 : 0);
        }
        int st = 0;
        assert_int_equal(waitpid(pid, &st, 0), pid);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
            fail_msg("round %d: the forked child's reads failed (status 0x%x)", round, st);
        assert_int_equal(tu_read_batch(&ds, idx, 200, dst, 0, msg, sizeof(msg), &err), STOKE_OK);
        check_batch(idx, 200, d, lab);
    }
    free(d);
    stoke_dataset_close(&ds);
    unlink(p);
    unlink(lp);
}

/* The header's size of make_files's data file. */
static size_t head_size(void)
{
    unsigned char head[256];
    char dict[128];
    snprintf(dict, sizeof(dict), "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }",
             ROWS, ROW);
    return tu_npy_head(head, dict);
}

/* get_batch() of `idx` on a fresh dataset of `io` after the file was cut to `cut` bytes:
 * returns the code; msg and *err receive the error. */
static int read_truncated(const char *p, int io, size_t cut, const uint64_t *idx, size_t n,
                          char *msg, size_t msg_len, uint64_t *err)
{
    make_files(p, NULL);
    stoke_dataset ds;
    assert_int_equal(open_io(p, NULL, io, &ds), STOKE_OK);
    assert_int_equal(truncate(p, (off_t)cut), 0);
    unsigned char *d = malloc(n * ROW);
    void *dst[TU_FIELDS] = {d};
    msg[0] = '\0';
    int rc = tu_read_batch(&ds, idx, n, dst, 0, msg, msg_len, err);
    free(d);
    stoke_dataset_close(&ds);
    return rc;
}

/* A file cut short after open: io=uring reports exactly what io=pread reports (same code,
 * sample and message: the file, the sample, "file changed while loading", where it ends), for
 * a cut inside a row and for the first failing slot of a shuffled batch; io=mmap the same
 * sample with its own reason. */
static void test_truncated_same_error(void **state)
{
    if (!g_uring) {
        g_skipped = 1;
        skip();
    }
    const char *p = tmp("cut.npy");
    size_t hn = head_size();
    /* no index is a multiple of 256: the reads notice, not the size check */
    static const uint64_t batches[3][6] = {
        {10, 11, 12, 13, 14, 15}, /* a run: row 12 is cut in the middle */
        {40, 5, 30, 3, 41, 42},   /* shuffled: slot 0 (sample 40) is the first one missing */
        {1, 2, 3, 500, 4, 999},   /* slot 3 */
    };
    static const uint64_t want_index[3] = {12, 40, 500};
    for (int t = 0; t < 3; t++) {
        size_t cut = t == 0 ? hn + 12 * ROW + 100 : hn + 20 * ROW;
        char m_pread[256], m_uring[256], m_mmap[256];
        uint64_t e_pread = 0, e_uring = 1, e_mmap = 2;
        int rp = read_truncated(p, STOKE_NPY_IO_PREAD, cut, batches[t], 6, m_pread, sizeof(m_pread),
                                &e_pread);
        int ru = read_truncated(p, STOKE_NPY_IO_URING, cut, batches[t], 6, m_uring, sizeof(m_uring),
                                &e_uring);
        int rm = read_truncated(p, STOKE_NPY_IO_MMAP, cut, batches[t], 6, m_mmap, sizeof(m_mmap),
                                &e_mmap);
        assert_int_equal(rp, STOKE_EIO);
        assert_int_equal(ru, STOKE_EIO);
        assert_int_equal(rm, STOKE_EIO);
        assert_int_equal(e_pread, want_index[t]);
        assert_int_equal(e_uring, want_index[t]);
        assert_string_equal(m_uring, m_pread);
        char want[600];
        snprintf(want, sizeof(want),
                 "npy %s: sample %llu: file changed while loading (it ends at byte %llu: "
                 "truncated)",
                 p, (unsigned long long)want_index[t], (unsigned long long)cut);
        assert_string_equal(m_uring, want);
        /* mmap: the fault names the sample whose row holds the first page past the cut (row
         * 12 here too: the run's fault is in row 12's last bytes, not in row 10, its first) */
        assert_non_null(strstr(m_mmap, "file changed while loading"));
        assert_non_null(strstr(m_mmap, "mapped pages are gone"));
        assert_int_equal(e_mmap, want_index[t]);
        snprintf(want, sizeof(want), "sample %llu:", (unsigned long long)want_index[t]);
        assert_non_null(strstr(m_mmap, want));
    }
    unlink(p);
}

/* io=mmap after a read faulted on a file cut short: a row past the new end that lies in the
 * last page (read as zeros, without a fault) fails as the others do; it was delivered as
 * zeros (get() and a batch's read), and a batch named the faulting row, not the first one
 * past the end. */
static void test_mmap_rows_past_the_end_after_a_fault(void **state)
{
    (void)state;
    const char *p = tmp("cutpage.npy");
    size_t hn = head_size();
    uint64_t r = 2; /* a row wholly inside one page, the file cut just before it */
    while ((hn + r * ROW) / 4096 != (hn + (r + 1) * ROW - 1) / 4096)
        r++;
    make_files(p, NULL);
    stoke_dataset ds;
    assert_int_equal(open_io(p, NULL, STOKE_NPY_IO_MMAP, &ds), STOKE_OK);
    assert_int_equal(truncate(p, (off_t)(hn + r * ROW - 10)), 0);
    unsigned char *d = malloc(2 * ROW);
    void *dst[TU_FIELDS] = {d};
    char msg[512];
    int64_t len[TU_FIELDS];
    uint64_t err = 0, far = 900, two[2] = {r, far};
    assert_int_equal(tu_read_batch(&ds, &far, 1, dst, 0, msg, sizeof(msg), &err), STOKE_EIO);
    assert_int_equal(err, far);
    memset(d, 0xAA, ROW);
    assert_int_equal(ds.get(ds.user, r, dst, len, 0, msg, sizeof(msg)), STOKE_EIO);
    assert_non_null(strstr(msg, "file changed while loading (now"));
    assert_int_equal(tu_read_batch(&ds, two, 2, dst, 0, msg, sizeof(msg), &err), STOKE_EIO);
    assert_int_equal(err, r);
    /* a group of two batches (two runs: the scattered gather), rows r - 2 and r */
    uint64_t group[2] = {r - 2, r};
    size_t start[3] = {0, 1, 2};
    void *base[2] = {d, d + ROW};
    stoke_slots runs = {2, start, base, len};
    err = 0;
    assert_int_equal(ds.read(ds.user, group, 2, &runs, 0, msg, sizeof(msg), &err), STOKE_EIO);
    assert_int_equal(err, r);
    assert_int_equal(ds.get(ds.user, r - 2, dst, len, 0, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(d, g_data + (r - 2) * ROW, ROW); /* (r - 1 ends past the cut too) */
    free(d);
    stoke_dataset_close(&ds);
    unlink(p);
}

static void warm(const char *path)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char buf[1 << 16];
    while (fread(buf, 1, sizeof(buf), f) > 0) {
    }
    fclose(f);
}

static int auto_choice(const char *path)
{
    stoke_dataset ds;
    assert_int_equal(open_io(path, NULL, STOKE_NPY_IO_AUTO, &ds), STOKE_OK);
    int io = stoke_npy_io_used(&ds);
    /* whatever it chose, it reads the file */
    uint64_t idx[4] = {999, 0, 1, 500};
    unsigned char *d = malloc(4 * ROW);
    void *dst[TU_FIELDS] = {d};
    char msg[256];
    uint64_t err;
    assert_int_equal(tu_read_batch(&ds, idx, 4, dst, 0, msg, sizeof(msg), &err), STOKE_OK);
    check_batch(idx, 4, d, NULL);
    free(d);
    stoke_dataset_close(&ds);
    return io;
}

/* io=auto: a resident file is mapped; evicted (checked with mincore), it is read with queued
 * reads (uring when usable, else pread), and the choice is logged at INFO; warm again, mapped. */
static void test_auto_follows_residency(void **state)
{
    const char *p = tmp("auto.npy");
    make_files(p, NULL);
    warm(p);
    tu_log_capture();
    stoke_log_set_level(STOKE_LOG_INFO);
    assert_int_equal(auto_choice(p), STOKE_NPY_IO_MMAP);
    assert_int_equal(tu_log_count(STOKE_LOG_INFO, "io=auto chose io=mmap"), 1);
    int left = tu_evict(p);
    if (left > 5) {
        print_message("page cache eviction does not work here (%d%% still resident)\n", left);
        g_skipped = 1;
        stoke_log_set_level(STOKE_LOG_WARN);
        unlink(p);
        skip();
    }
    int want = g_uring ? STOKE_NPY_IO_URING : STOKE_NPY_IO_PREAD;
    tu_log_clear();
    assert_int_equal(auto_choice(p), want);
    char line[64];
    snprintf(line, sizeof(line), "io=auto chose io=%s", stoke_npy_io_name(want));
    assert_int_equal(tu_log_count(STOKE_LOG_INFO, line), 1);
    warm(p);
    assert_int_equal(auto_choice(p), STOKE_NPY_IO_MMAP);
    stoke_log_set_level(STOKE_LOG_WARN);
    unlink(p);
}

/* In a child: io_uring_setup fails with EPERM from now on (as under a container's seccomp
 * profile).  Returns 0, or -1 when the filter cannot be installed. */
static int deny_io_uring(void)
{
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {(unsigned short)(sizeof(f) / sizeof(f[0])), f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        return -1;
    return prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) == 0 ? 0 : -1;
}

/* io=uring where it cannot work is STOKE_ENOTSUP at open with a message naming the missing
 * feature (the build's liburing, or the kernel's io_uring); io=auto on a cold file falls back
 * to pread.  Without liburing this runs in-process; with it, in a child whose seccomp filter
 * refuses io_uring_setup. */
static void test_uring_unavailable(void **state)
{
    const char *p = tmp("nouring.npy");
    make_files(p, NULL);
    char spec[600];
    snprintf(spec, sizeof(spec), "npy:%s,io=uring", p);
    stoke_dataset ds;
    if (!g_uring) {
        assert_int_equal(stoke_npy_io_available(STOKE_NPY_IO_URING), STOKE_ENOTSUP);
        assert_int_equal(stoke_source_open(spec, &ds), STOKE_ENOTSUP);
        assert_non_null(strstr(stoke_last_error(), p));
        assert_non_null(strstr(stoke_last_error(), "io=uring is not available"));
        assert_non_null(strstr(stoke_last_error(), "without liburing"));
        if (tu_evict(p) <= 5)
            assert_int_equal(auto_choice(p), STOKE_NPY_IO_PREAD);
        unlink(p);
        return;
    }
    int cold = tu_evict(p) <= 5;
    fflush(NULL);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (deny_io_uring() != 0)
            _exit(SKIP_RETURN_CODE);
        if (stoke_npy_io_available(STOKE_NPY_IO_URING) != STOKE_ENOTSUP)
            _exit(1);
        if (!strstr(stoke_last_error(), "io_uring_queue_init failed: Operation not permitted"))
            _exit(2);
        if (stoke_source_open(spec, &ds) != STOKE_ENOTSUP)
            _exit(3);
        if (!strstr(stoke_last_error(), p) ||
            !strstr(stoke_last_error(), "io=uring is not available: io_uring_queue_init failed"))
            _exit(4);
        if (open_io(p, NULL, STOKE_NPY_IO_AUTO, &ds) != STOKE_OK)
            _exit(5);
        int io = stoke_npy_io_used(&ds);
        stoke_dataset_close(&ds);
        if (cold && io != STOKE_NPY_IO_PREAD)
            _exit(6);
        _exit(0);
    }
    int st = 0;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st));
    unlink(p);
    if (WEXITSTATUS(st) == SKIP_RETURN_CODE) {
        print_message("cannot install a seccomp filter here\n");
        g_skipped = 1;
        skip();
    }
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Spec strings: every io= mode by name, and a bad one listing them. */
static void test_spec_io(void **state)
{
    const char *p = tmp("spec.npy");
    make_files(p, NULL);
    for (size_t m = 0; m < sizeof(MODES) / sizeof(MODES[0]); m++) {
        if (MODES[m] == STOKE_NPY_IO_URING && !g_uring)
            continue;
        char spec[600];
        snprintf(spec, sizeof(spec), "npy:%s,io=%s", p, stoke_npy_io_name(MODES[m]));
        stoke_dataset ds;
        assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
        if (MODES[m] != STOKE_NPY_IO_AUTO)
            assert_int_equal(stoke_npy_io_used(&ds), MODES[m]);
        stoke_dataset_close(&ds);
    }
    stoke_dataset ds;
    assert_int_equal(stoke_source_open("npy:/x.npy,io=fast", &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "io=auto, io=mmap, io=pread, io=uring, "
                                               "io=remote, direct=auto, direct=on or direct=off"));
    /* io=remote: URLs only, and a URL with io=remote (or auto) only: refused before any request */
    assert_string_equal(stoke_npy_io_name(STOKE_NPY_IO_REMOTE), "remote");
    char url_spec[600];
    snprintf(url_spec, sizeof(url_spec), "npy:%s,io=remote", p);
    assert_int_equal(stoke_source_open(url_spec, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "io=remote reads http://"));
    assert_int_equal(stoke_source_open("npy:http://u:pw@127.0.0.1:1/x.npy,io=mmap", &ds),
                     STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "io=mmap reads local files only"));
    assert_null(strstr(stoke_last_error(), "pw@"));
    snprintf(url_spec, sizeof(url_spec), "npy:http://127.0.0.1:1/x.npy,labels=%s", p);
    assert_int_equal(stoke_source_open(url_spec, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "both be URLs or both local files"));
    /* direct=: each value by name, with and after io= (a bad one refused like io=) */
    static const char *const dv[] = {",direct=auto", ",direct=on", ",direct=off",
                                     ",io=pread,direct=on", ",direct=off,io=pread"};
    for (size_t k = 0; k < sizeof(dv) / sizeof(dv[0]); k++) {
        char spec[600];
        snprintf(spec, sizeof(spec), "npy:%s%s", p, dv[k]);
        if (stoke_source_open(spec, &ds) != STOKE_OK)
            fail_msg("%s: %s", spec, stoke_last_error());
        if (strstr(dv[k], "pread"))
            assert_int_equal(stoke_npy_io_used(&ds), STOKE_NPY_IO_PREAD);
        stoke_dataset_close(&ds);
    }
    assert_int_equal(stoke_source_open("npy:/x.npy,direct=yes", &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "bad option 'direct=yes'"));
    /* an option misspelt stays in the path (only known options end it): the file it names
     * does not exist, and the message names the word, not only "cannot open"; a file whose
     * name holds such a word opens */
    char sp[700], want[700];
    snprintf(sp, sizeof(sp), "npy:%s,batchy=3", p);
    assert_int_equal(stoke_source_open(sp, &ds), STOKE_ENOENT);
    snprintf(want, sizeof(want),
             "no file '%s,batchy=3', and 'batchy=3' is no npy: option (labels=, io=, direct=): "
             "a misspelt option?",
             p);
    if (!strstr(stoke_last_error(), want))
        fail_msg("%s: %s", sp, stoke_last_error());
    snprintf(sp, sizeof(sp), "npy:%s,lables=%s", p, p); /* (an absolute path in its value) */
    assert_int_equal(stoke_source_open(sp, &ds), STOKE_ENOENT);
    snprintf(want, sizeof(want), "'lables=%s' is no npy: option", p);
    if (!strstr(stoke_last_error(), want))
        fail_msg("%s: %s", sp, stoke_last_error());
    snprintf(sp, sizeof(sp), "npy:%s,labels=%s,batch2=3", p, p);
    assert_int_equal(stoke_source_open(sp, &ds), STOKE_ENOENT);
    assert_non_null(strstr(stoke_last_error(), "'batch2=3' is no npy: option"));
    /* npy: has no one-word options: a missing "run,final" is a missing file */
    assert_int_equal(stoke_source_open("npy:/nonexistent-dir/run,final", &ds), STOKE_ENOENT);
    assert_null(strstr(stoke_last_error(), "misspelt"));
    assert_int_equal(stoke_source_open("npy:/nonexistent-dir/x.npy", &ds), STOKE_ENOENT);
    const char *odd = tmp("odd,seed=1.npy");
    make_files(odd, NULL);
    snprintf(sp, sizeof(sp), "npy:%s", odd);
    if (stoke_source_open(sp, &ds) != STOKE_OK)
        fail_msg("%s: %s", sp, stoke_last_error());
    stoke_dataset_close(&ds);
    /* a direct mode out of range; an opts struct of the size before `direct` means auto */
    stoke_npy_opts bad;
    stoke_npy_opts_init(&bad);
    bad.direct = 7;
    assert_int_equal(stoke_npy_open_opts(p, &bad, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "unknown direct mode 7"));
    bad.direct = 7;
    bad.size = (uint32_t)(offsetof(stoke_npy_opts, io) + sizeof(int));
    assert_int_equal(stoke_npy_open_opts(p, &bad, &ds), STOKE_OK);
    stoke_dataset_close(&ds);
    bad.size = (uint32_t)offsetof(stoke_npy_opts, io);
    assert_int_equal(stoke_npy_open_opts(p, &bad, &ds), STOKE_EINVAL);
    stoke_dataset syn;
    assert_int_equal(stoke_source_open("synthetic:10", &syn), STOKE_OK);
    assert_int_equal(stoke_npy_io_used(&syn), STOKE_EINVAL);
    stoke_dataset_close(&syn);
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    assert_int_equal(o.io, STOKE_NPY_IO_AUTO);
    assert_int_equal(o.direct, STOKE_NPY_DIRECT_AUTO);
    unlink(p);
}

/* The non-temporal copy equals memcpy for every length around its 64-byte body and every
 * misalignment of the destination; io=mmap with it forced (stoke__npy_nt_min 1, no second copy
 * needed) gives the file's bytes and labels into misaligned batch slots (3000-byte rows: each
 * has a head, a body and a tail), counting each field in stoke__npy_nt_fields; without
 * another batch being copied at the same time it is not used. */
static void test_mmap_streaming_stores(void **state)
{
    (void)state;
    unsigned char src[600], a[640], b[640];
    for (size_t i = 0; i < sizeof(src); i++)
        src[i] = (unsigned char)(i * 131 + 7);
    for (size_t off = 0; off < 16; off++)
        for (size_t n = 0; n < 300; n += off % 3 + 1) {
            memset(a, 0xee, sizeof(a));
            memset(b, 0xee, sizeof(b));
            stoke__copy_nt(a + off, src + (n % 5), n);
            stoke__copy_nt_done();
            memcpy(b + off, src + (n % 5), n);
            if (memcmp(a, b, sizeof(a)) != 0)
                fail_msg("stoke__copy_nt of %zu bytes at offset %zu differs from memcpy", n, off);
        }

    const char *p = tmp("nt.npy"), *lp = tmp("nt-labels.npy");
    make_files(p, lp);
    enum { N = 600 };
    uint64_t *idx = malloc(N * sizeof(*idx));
    unsigned char *d = malloc((size_t)N * ROW + 16);
    int64_t *lab = malloc(N * sizeof(*lab) + 16);
    stoke_dataset ds;
    assert_int_equal(open_io(p, lp, STOKE_NPY_IO_MMAP, &ds), STOKE_OK);
    stoke__npy_nt_min = 1;
    char msg[256];
    for (int always = 1; always >= 0; always--) {
        stoke__npy_nt_always = always;
        for (unsigned seed = 1; seed <= 3; seed++) {
            size_t n = N - seed * 100, off = seed * 5;
            batch_indices(idx, n, seed);
            memset(d, 0, (size_t)N * ROW + 16);
            unsigned char *dd = d + off;
            int64_t *ll = lab; /* labels: 8-byte rows, runs of them reach STOKE__NPY_NT_RUN */
            void *dst[TU_FIELDS] = {dd, ll};
            uint64_t err = 0, before = atomic_load(&stoke__npy_nt_fields);
            assert_int_equal(tu_read_batch(&ds, idx, n, dst, 0, msg, sizeof(msg), &err), STOKE_OK);
            for (size_t j = 0; j < n; j++) {
                if (memcmp(dd + j * ROW, g_data + idx[j] * ROW, ROW) != 0)
                    fail_msg("always %d, slot %zu (sample %llu): wrong bytes", always, j,
                             (unsigned long long)idx[j]);
                if (ll[j] != g_labels[idx[j]])
                    fail_msg("always %d, slot %zu: label %lld, expected %lld", always, j,
                             (long long)ll[j], (long long)g_labels[idx[j]]);
            }
            assert_int_equal(atomic_load(&stoke__npy_nt_fields) - before, always ? 2 : 0);
        }
    }
    stoke__npy_nt_always = 0;
    stoke__npy_nt_min = STOKE__NPY_NT_MIN;
    stoke_dataset_close(&ds);
    free_case(idx, d, lab, p, lp);
}

/* A run of 64 KiB or more gets MADV_WILLNEED with io=mmap, but not on the mapping io=auto made
 * for a resident file and populated (where the kernel has MADV_POPULATE_READ): its pages are
 * in, and the call was a system call per 150 KB row.  The bytes are the same either way. */
static void test_populated_mapping_skips_willneed(void **state)
{
    (void)state;
    const char *p = tmp("willneed.npy");
    make_files(p, NULL);
    warm(p);
    int can_populate = 0; /* does this kernel have MADV_POPULATE_READ? */
#ifdef MADV_POPULATE_READ
    void *probe = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(probe != MAP_FAILED);
    can_populate = madvise(probe, 4096, MADV_POPULATE_READ) == 0;
    munmap(probe, 4096);
#endif
    enum { N = 100 }; /* rows 0..99: one run of 300,000 bytes */
    uint64_t idx[N];
    for (uint64_t j = 0; j < N; j++)
        idx[j] = j;
    unsigned char *d = malloc((size_t)N * ROW);
    assert_non_null(d);
    char msg[256];
    static const int modes[] = {STOKE_NPY_IO_AUTO, STOKE_NPY_IO_MMAP};
    for (size_t k = 0; k < 2; k++) {
        int io = modes[k];
        stoke_dataset ds;
        assert_int_equal(open_io(p, NULL, io, &ds), STOKE_OK);
        assert_int_equal(stoke_npy_io_used(&ds), STOKE_NPY_IO_MMAP);
        void *dst[TU_FIELDS] = {d};
        uint64_t err = 0, before = atomic_load(&stoke__npy_willneed);
        assert_int_equal(tu_read_batch(&ds, idx, N, dst, 0, msg, sizeof(msg), &err), STOKE_OK);
        assert_memory_equal(d, g_data, (size_t)N * ROW);
        uint64_t calls = atomic_load(&stoke__npy_willneed) - before;
        if (io == STOKE_NPY_IO_AUTO && can_populate && calls != 0)
            fail_msg("io=auto on a resident file: %llu MADV_WILLNEED calls, expected none",
                     (unsigned long long)calls);
        if ((io == STOKE_NPY_IO_MMAP || !can_populate) && calls != 1)
            fail_msg("io=%s: %llu MADV_WILLNEED calls for one run of 300,000 bytes, expected 1",
                     stoke_npy_io_name(io), (unsigned long long)calls);
        stoke_dataset_close(&ds);
    }
    free(d);
    unlink(p);
}

int main(void)
{
    g_uring = stoke_npy_io_available(STOKE_NPY_IO_URING) == STOKE_OK;
    if (!g_uring)
        printf("[  NOTE    ] io=uring unavailable: %s\n", stoke_last_error());
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_modes_identical),
        cmocka_unit_test(test_scattered_identical),
        cmocka_unit_test(test_loader_identical),
        cmocka_unit_test(test_uring_rings_across_fork),
        cmocka_unit_test(test_truncated_same_error),
        cmocka_unit_test(test_mmap_rows_past_the_end_after_a_fault),
        cmocka_unit_test(test_auto_follows_residency),
        cmocka_unit_test(test_uring_unavailable),
        cmocka_unit_test(test_spec_io),
        cmocka_unit_test(test_mmap_streaming_stores),
        cmocka_unit_test(test_populated_mapping_skips_willneed),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (rc == 0 && g_skipped) {
        printf("[  SKIPPED ] test_npy_io: some cases need io=uring (liburing and a kernel that "
               "allows it) or page-cache eviction\n");
        return SKIP_RETURN_CODE;
    }
    return rc;
}
