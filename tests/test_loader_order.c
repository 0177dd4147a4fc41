/* The loader delivers exactly its sampler's order: for RANDOM (shuffle) and BLOCK (block
 * shuffle), with 0 and 2 workers, through a dataset's read() (the npy source, io=mmap and
 * io=pread) and through get() per sample (an in-test dataset), every delivered index equals
 * stoke_sampler_index at its position and every slot holds that sample's bytes; a restored
 * state delivers the rest of the same order, also at small batch sizes (the indices computed
 * ahead in runs); a failing sample in a shuffled order is named by
 * its index, after exactly the batches before it. */
#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_loader_ds.h"

#define N   1000 /* rows: not a multiple of the block size nor of the batch size */
#define ROW 40   /* bytes of an npy row */
#define BS  48
#define BLK 64
#define WIN 3

enum { DS_TDS, DS_NPY_MMAP, DS_NPY_PREAD, DS_KINDS };
static const char *const DS_NAMES[] = {"get() per sample", "npy io=mmap (read)",
                                       "npy io=pread (read)"};
static char g_npy[512];

static unsigned char npy_byte(uint64_t i, size_t k)
{
    return (unsigned char)((i * 37u + k * 11u + 5u) & 0xffu);
}

/* An (N, ROW) uint8 .npy file of npy_byte rows. */
static void write_npy(const char *path)
{
    char dict[128];
    snprintf(dict, sizeof(dict), "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, %d), }", N,
             ROW);
    static unsigned char rows[N * ROW];
    for (uint64_t i = 0; i < N; i++)
        for (size_t k = 0; k < ROW; k++)
            rows[i * ROW + k] = npy_byte(i, k);
    tu_npy_write(path, dict, rows, sizeof(rows));
}

typedef struct src {
    int kind;
    tds t;
    stoke_dataset ds;
} src;

static void src_open(src *s, int kind)
{
    s->kind = kind;
    if (kind == DS_TDS) {
        tds_make(&s->t, &s->ds, N);
        assert_null(s->ds.read);
        return;
    }
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    o.io = kind == DS_NPY_MMAP ? STOKE_NPY_IO_MMAP : STOKE_NPY_IO_PREAD;
    assert_int_equal(stoke_npy_open_opts(g_npy, &o, &s->ds), STOKE_OK);
    assert_int_equal(stoke_npy_io_used(&s->ds), o.io);
    assert_non_null(s->ds.read);
}

static void src_close(src *s)
{
    if (s->kind == DS_TDS)
        tds_free(&s->t);
    else
        stoke_dataset_close(&s->ds);
}

/* 1 if every slot of b holds the bytes of the sample its index names. */
static int batch_bytes_ok(const src *s, const stoke_batch *b)
{
    if (s->kind == DS_TDS)
        return tds_batch_ok(b);
    const unsigned char *d = stoke_batch_data(b, 0);
    const uint64_t *idx = stoke_batch_indices(b);
    for (size_t j = 0; j < stoke_batch_count(b); j++)
        for (size_t k = 0; k < ROW; k++)
            if (d[j * ROW + k] != npy_byte(idx[j], k))
                return 0;
    return 1;
}

enum { ORDER_RANDOM, ORDER_BLOCK };

static stoke_loader_opts opts_for(int order, int workers, uint64_t seed, uint64_t epoch)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = BS;
    o.num_workers = workers;
    o.pin_memory = 0;
    o.seed = seed;
    o.epoch = epoch;
    if (order == ORDER_RANDOM) {
        o.shuffle = 1;
    } else {
        o.sampler.kind = STOKE_SAMPLER_BLOCK;
        o.sampler.block_rows = BLK;
        o.sampler.block_window = WIN;
    }
    return o;
}

/* The sampler the loader should follow: RANDOM, or BLOCK with the same sizes. */
static stoke_sampler *expected_sampler(int order)
{
    stoke_sampler_opts so;
    stoke_sampler_opts_init(&so);
    so.kind = order == ORDER_RANDOM ? STOKE_SAMPLER_RANDOM : STOKE_SAMPLER_BLOCK;
    so.block_rows = BLK;
    so.block_window = WIN;
    stoke_sampler *s;
    assert_int_equal(stoke_sampler_create(&so, N, &s), STOKE_OK);
    return s;
}

/* Delivers the rest of the current epoch in batches of bs; checks each batch's bytes, its seq,
 * and that its indices are the sampler's at their positions (from position `pos`).  Returns the
 * positions delivered. */
static uint64_t drain_bs(stoke_loader *l, const src *s, const stoke_sampler *want, uint64_t seed,
                         uint64_t epoch, uint64_t pos, uint64_t bs, const char *what)
{
    stoke_batch *b;
    int rc;
    uint64_t n = 0;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_int_equal(stoke_batch_epoch(b), epoch);
        assert_int_equal(stoke_batch_seq(b) * bs, pos + n);
        if (!batch_bytes_ok(s, b))
            fail_msg("%s: batch %llu holds bytes of other samples", what,
                     (unsigned long long)stoke_batch_seq(b));
        const uint64_t *idx = stoke_batch_indices(b);
        for (size_t j = 0; j < stoke_batch_count(b); j++, n++) {
            uint64_t x = 0;
            assert_int_equal(stoke_sampler_index(want, seed, epoch, pos + n, &x), STOKE_OK);
            if (idx[j] != x)
                fail_msg("%s: epoch %llu position %llu delivered sample %llu, the sampler says "
                         "%llu",
                         what, (unsigned long long)epoch, (unsigned long long)(pos + n),
                         (unsigned long long)idx[j], (unsigned long long)x);
        }
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    return n;
}

static uint64_t drain_checked(stoke_loader *l, const src *s, const stoke_sampler *want,
                              uint64_t seed, uint64_t epoch, uint64_t pos, const char *what)
{
    return drain_bs(l, s, want, seed, epoch, pos, BS, what);
}

/* Two epochs (3 and 4) of every order, dataset path and worker count: exactly the sampler's
 * order, whole, with the right bytes. */
static void test_order_is_the_samplers(void **state)
{
    static const int workers[] = {0, 2};
    for (int order = ORDER_RANDOM; order <= ORDER_BLOCK; order++) {
        stoke_sampler *want = expected_sampler(order);
        for (int k = 0; k < DS_KINDS; k++) {
            for (size_t w = 0; w < 2; w++) {
                char what[128];
                snprintf(what, sizeof(what), "%s, %s, %d workers",
                         order == ORDER_RANDOM ? "random" : "block", DS_NAMES[k], workers[w]);
                src s;
                src_open(&s, k);
                stoke_loader_opts o = opts_for(order, workers[w], 77, 3);
                stoke_loader *l;
                assert_int_equal(stoke_loader_create(&o, &s.ds, &l), STOKE_OK);
                assert_int_equal(drain_checked(l, &s, want, 77, 3, 0, what), N);
                assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                assert_int_equal(drain_checked(l, &s, want, 77, 4, 0, what), N);
                stoke_loader_destroy(l);
                src_close(&s);
            }
        }
        stoke_sampler_destroy(want);
    }
}

/* Block shuffle reads nearly sequentially: each window of WIN * BLK positions holds the rows
 * of at most WIN blocks (a check that BLOCK, not RANDOM, reached the loader).  15 whole blocks:
 * with a short block the windows after its slot would start elsewhere. */
static void test_block_windows(void **state)
{
    src s;
    s.kind = DS_TDS;
    tds_make(&s.t, &s.ds, 15 * BLK);
    stoke_loader_opts o = opts_for(ORDER_BLOCK, 2, 5, 0);
    o.batch_size = WIN * BLK; /* one window per batch */
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &s.ds, &l), STOKE_OK);
    stoke_batch *b;
    uint64_t seen = 0;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        const uint64_t *idx = stoke_batch_indices(b);
        uint64_t blocks[WIN * BLK];
        size_t nb = 0;
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            size_t m = 0;
            while (m < nb && blocks[m] != idx[j] / BLK)
                m++;
            if (m == nb)
                blocks[nb++] = idx[j] / BLK;
        }
        if (nb > WIN)
            fail_msg("window %llu touches %zu blocks (at most %d)",
                     (unsigned long long)stoke_batch_seq(b), nb, WIN);
        seen += stoke_batch_count(b);
        stoke_batch_release(b);
    }
    assert_int_equal(seen, 15 * BLK);
    stoke_loader_destroy(l);
    src_close(&s);
}

/* Resume: a loader with 2 workers saved mid-epoch; another one (0 workers, another seed and
 * epoch) restored from the state delivers the same rest, which is the sampler's order from
 * the saved cursor on. */
static void test_resume_gives_the_rest(void **state)
{
    for (int order = ORDER_RANDOM; order <= ORDER_BLOCK; order++) {
        stoke_sampler *want = expected_sampler(order);
        for (int k = 0; k < DS_KINDS; k++) {
            char what[128];
            snprintf(what, sizeof(what), "resume, %s, %s",
                     order == ORDER_RANDOM ? "random" : "block", DS_NAMES[k]);
            src s;
            src_open(&s, k);
            stoke_loader_opts o = opts_for(order, 2, 11, 6);
            stoke_loader *a, *c;
            assert_int_equal(stoke_loader_create(&o, &s.ds, &a), STOKE_OK);
            tds_skip(a, 7);
            stoke_loader_state st;
            assert_int_equal(stoke_loader_save_state(a, &st), STOKE_OK);
            assert_int_equal(st.cursor, 7);
            assert_int_equal(drain_checked(a, &s, want, 11, 6, 7 * BS, what), N - 7 * BS);
            stoke_loader_opts o2 = opts_for(order, 0, 1, 0);
            assert_int_equal(stoke_loader_create(&o2, &s.ds, &c), STOKE_OK);
            tds_skip(c, 1); /* running: restore moves it */
            assert_int_equal(stoke_loader_restore_state(c, &st), STOKE_OK);
            assert_int_equal(drain_checked(c, &s, want, 11, 6, 7 * BS, what), N - 7 * BS);
            stoke_loader_destroy(c);
            stoke_loader_destroy(a);
            src_close(&s);
        }
        stoke_sampler_destroy(want);
    }
}

/* Small batches take their indices from runs computed ahead per thread (loader_internal.h,
 * stoke__ahead): batch sizes around the run's length (64) and the dataset prefetch's limit (8),
 * 0, 1 and 3 worker threads and 2 worker processes, with and without a prefetching dataset, over
 * two epochs and a third one reached by set_epoch, then a state saved after 13 batches restored
 * into a loader of another seed whose thread had filled runs of its own order: every index is
 * the sampler's at its position, every slot holds its sample.  Then out of order (3 workers):
 * each batch holds its seq's positions, and every position arrives once. */
static void test_small_batch_runs(void **state)
{
    static const uint64_t sizes[] = {1, 2, 7, 8, 9, 63, 64, 65};
    static const int workers[] = {0, 1, 3, -2}; /* -2: 2 worker processes */
    static const int kinds[] = {DS_TDS, DS_NPY_MMAP};
    stoke_sampler *want = expected_sampler(ORDER_RANDOM);
    for (size_t z = 0; z < sizeof(sizes) / sizeof(*sizes); z++) {
        for (size_t k = 0; k < 2; k++) {
            for (size_t w = 0; w < 4; w++) {
                char what[128];
                snprintf(what, sizeof(what), "batch size %llu, %s, %d workers%s",
                         (unsigned long long)sizes[z], DS_NAMES[kinds[k]],
                         workers[w] < 0 ? -workers[w] : workers[w],
                         workers[w] < 0 ? " (processes)" : "");
                src s;
                src_open(&s, kinds[k]);
                stoke_loader_opts o =
                    opts_for(ORDER_RANDOM, workers[w] < 0 ? -workers[w] : workers[w], 77, 3);
                o.batch_size = sizes[z];
                if (workers[w] < 0)
                    o.worker_mode = STOKE_WORKER_PROCESSES;
                stoke_loader *l, *c;
                assert_int_equal(stoke_loader_create(&o, &s.ds, &l), STOKE_OK);
                assert_int_equal(drain_bs(l, &s, want, 77, 3, 0, sizes[z], what), N);
                assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                assert_int_equal(drain_bs(l, &s, want, 77, 4, 0, sizes[z], what), N);
                assert_int_equal(stoke_loader_set_epoch(l, 9), STOKE_OK);
                tds_skip(l, 13);
                stoke_loader_state st;
                assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK);
                uint64_t at = 13 * sizes[z];
                assert_int_equal(drain_bs(l, &s, want, 77, 9, at, sizes[z], what), N - at);
                stoke_loader_opts o2 = o;
                o2.seed = 5; /* and the same epoch, 9: only the seed tells the runs apart */
                o2.epoch = 9;
                assert_int_equal(stoke_loader_create(&o2, &s.ds, &c), STOKE_OK);
                stoke_batch *b;
                for (int i = 0; i < 12; i++) { /* runs of seed 5 over positions to come */
                    int rc = stoke_loader_next(c, &b);
                    if (rc != STOKE_OK)
                        fail_msg("%s: batch %d of seed 5: %s (%s)", what, i, stoke_err_name(rc),
                                 stoke_loader_last_error(c));
                    stoke_batch_release(b);
                }
                assert_int_equal(stoke_loader_restore_state(c, &st), STOKE_OK);
                assert_int_equal(drain_bs(c, &s, want, 77, 9, at, sizes[z], what), N - at);
                stoke_loader_destroy(c);
                stoke_loader_destroy(l);
                src_close(&s);
            }
        }
        src s;
        src_open(&s, DS_NPY_MMAP);
        stoke_loader_opts o = opts_for(ORDER_RANDOM, 3, 77, 3);
        o.batch_size = sizes[z];
        o.in_order = 0;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &s.ds, &l), STOKE_OK);
        static unsigned char seen[N];
        memset(seen, 0, sizeof(seen));
        stoke_batch *b;
        int rc;
        uint64_t n = 0;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            assert_true(batch_bytes_ok(&s, b));
            const uint64_t *idx = stoke_batch_indices(b);
            for (size_t j = 0; j < stoke_batch_count(b); j++, n++) {
                uint64_t pos = stoke_batch_seq(b) * sizes[z] + j, x = 0;
                assert_int_equal(stoke_sampler_index(want, 77, 3, pos, &x), STOKE_OK);
                if (idx[j] != x || seen[pos]++)
                    fail_msg("out of order, batch size %llu: position %llu delivered sample "
                             "%llu (the sampler says %llu), %d time(s)",
                             (unsigned long long)sizes[z], (unsigned long long)pos,
                             (unsigned long long)idx[j], (unsigned long long)x, seen[pos]);
            }
            stoke_batch_release(b);
        }
        assert_int_equal(rc, STOKE_EEND);
        assert_int_equal(n, N);
        stoke_loader_destroy(l);
        src_close(&s);
    }
    stoke_sampler_destroy(want);
}

/* A failing sample in a block-shuffled epoch, through get() per sample with a timeout set:
 * the batches before it arrive in the sampler's order, then the error names the sample's
 * index and the dataset's message. */
static void test_failure_names_the_index(void **state)
{
    stoke_sampler *want = expected_sampler(ORDER_BLOCK);
    static const int workers[] = {0, 2};
    for (size_t w = 0; w < 2; w++) {
        src s;
        src_open(&s, DS_TDS);
        uint64_t bad_pos = 5 * BS + 17; /* batch 5 */
        assert_int_equal(stoke_sampler_index(want, 2, 0, bad_pos, &s.t.fail_index), STOKE_OK);
        stoke_loader_opts o = opts_for(ORDER_BLOCK, workers[w], 2, 0);
        o.timeout_ms = 60000;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &s.ds, &l), STOKE_OK);
        stoke_batch *b;
        int rc;
        uint64_t pos = 0;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            assert_true(tds_batch_ok(b));
            for (size_t j = 0; j < stoke_batch_count(b); j++, pos++) {
                uint64_t x = 0;
                assert_int_equal(stoke_sampler_index(want, 2, 0, pos, &x), STOKE_OK);
                assert_int_equal(stoke_batch_indices(b)[j], x);
            }
            stoke_batch_release(b);
        }
        assert_int_equal(rc, STOKE_EDATA);
        assert_int_equal(pos, 5 * BS);
        char needle[128];
        snprintf(needle, sizeof(needle), "sample %llu of testds: row %llu is corrupt",
                 (unsigned long long)s.t.fail_index, (unsigned long long)s.t.fail_index);
        if (!strstr(stoke_loader_last_error(l), needle))
            fail_msg("last error [%s] lacks [%s]", stoke_loader_last_error(l), needle);
        stoke_loader_destroy(l);
        src_close(&s);
    }
    stoke_sampler_destroy(want);
}

static int setup(void **state)
{
    (void)state;
    char name[64];
    snprintf(name, sizeof(name), "order_%d.npy", (int)getpid());
    tu_tmp_path(name, g_npy, sizeof(g_npy));
    write_npy(g_npy);
    tu_use_none();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    unlink(g_npy);
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_order_is_the_samplers),   cmocka_unit_test(test_block_windows),
        cmocka_unit_test(test_resume_gives_the_rest),   cmocka_unit_test(test_small_batch_runs),
        cmocka_unit_test(test_failure_names_the_index),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, setup, teardown));
}
