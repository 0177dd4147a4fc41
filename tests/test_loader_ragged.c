/* Dataset interface v1 through the loader: ragged fields (padded and packed; lengths, offsets,
 * pad values, multiple_of, truncation, empty samples) with 0/1/2 worker threads, process
 * workers, read() and device copies; 64 fields; the size tag; the fork hooks' order. */
#define _GNU_SOURCE
#include "testutil.h"

#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stoke/stoke.h"

/* ---- the reference dataset ----------------------------------------------------------------
 * Sample i: "tok" i32[VAR], tok_len(i) values i * 1000 + k; "box" f32[VAR, 3], box_len(i)
 * rows, element (k, c) = i + k / 2 + c / 4; "label" i64 = i. */

enum { RN = 97 };

static int64_t tok_len(uint64_t i)
{
    return (int64_t)((i * 7) % 13); /* 0 (empty) .. 12 */
}

static int64_t box_len(uint64_t i)
{
    return (int64_t)(i % 4);
}

static float box_val(uint64_t i, int64_t k, int c)
{
    return (float)i + (float)k * 0.5f + (float)c * 0.25f;
}

typedef struct rds {
    atomic_int gets, reads;
    const stoke_field *fields;
    int fail_long;   /* get() of a sample longer than this: fails with STOKE_EDATA (0: never) */
    uint64_t neg_at; /* get() of this sample reports tok's length as -1 (UINT64_MAX: none) */
} rds;

static uint64_t r_length(void *user)
{
    (void)user;
    return RN;
}

/* Writes what the slot has room for (lens[f] on entry), reports the true lengths. */
static int r_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                 char *msg, size_t msg_len)
{
    rds *r = user;
    (void)worker;
    atomic_fetch_add(&r->gets, 1);
    if (r->fail_long && tok_len(index) > r->fail_long) {
        snprintf(msg, msg_len, "sample %" PRIu64 " is too long for this test", index);
        return STOKE_EDATA;
    }
    int64_t n = tok_len(index), room = lens[0];
    int32_t *t = dst[0];
    for (int64_t k = 0; k < n && k < room; k++)
        t[k] = (int32_t)(index * 1000 + (uint64_t)k);
    lens[0] = index == r->neg_at ? -1 : n;
    int64_t m = box_len(index);
    float *b = dst[1];
    for (int64_t k = 0; k < m && k < lens[1]; k++)
        for (int c = 0; c < 3; c++)
            b[k * 3 + c] = box_val(index, k, c);
    lens[1] = m;
    int64_t label = (int64_t)index;
    memcpy(dst[2], &label, sizeof(label));
    return STOKE_OK;
}

/* read(): get() per sample, with the lengths at len[j * 3 + f]. */
static int r_read(void *user, const uint64_t *idx, size_t count, const stoke_slots *dst, int worker,
                  char *msg, size_t msg_len, uint64_t *err_index)
{
    rds *r = user;
    atomic_fetch_add(&r->reads, 1);
    assert_int_equal(dst->nruns, 1); /* a batch: one run */
    assert_non_null(dst->len);
    for (size_t j = 0; j < count; j++) {
        void *d[3];
        stoke_slots_sample(dst, 3, r->fields, j, d);
        int rc = r_get(user, idx[j], d, &dst->len[j * 3], worker, msg, msg_len);
        if (rc != STOKE_OK) {
            *err_index = idx[j];
            return rc;
        }
    }
    return STOKE_OK;
}

/* The dataset's describe: sample i is at byte 100 * i of "rows.bin". */
static int r_describe(void *user, uint64_t index, char *buf, size_t n)
{
    (void)user;
    snprintf(buf, n, "rows.bin@%llu", (unsigned long long)(index * 100));
    return STOKE_OK;
}

/* A describe that fills all n bytes of buf, with no terminator. */
static int r_describe_unterminated(void *user, uint64_t index, char *buf, size_t n)
{
    (void)user;
    (void)index;
    memset(buf, 'x', n);
    return STOKE_OK;
}

static void r_make(rds *r, stoke_dataset *ds, int tok_collate, int64_t tok_max, int truncate)
{
    memset(r, 0, sizeof(*r));
    stoke_dataset_init(ds);
    ds->kind = STOKE_DATASET_MAP;
    snprintf(ds->name, sizeof(ds->name), "ragged");
    ds->user = r;
    ds->nfields = 3;
    stoke_field *f = TU_F(ds);
    snprintf(f[0].name, sizeof(f[0].name), "tok");
    f[0].dtype = STOKE_DTYPE_I32;
    f[0].ndim = 1;
    TU_SHAPE(ds, 0)[0] = STOKE_DIM_VAR;
    f[0].max_len = tok_max;
    f[0].collate = tok_collate;
    f[0].truncate = truncate;
    f[0].multiple_of = 4;
    f[0].pad_value = -1;
    snprintf(f[1].name, sizeof(f[1].name), "box");
    f[1].dtype = STOKE_DTYPE_F32;
    f[1].ndim = 2;
    TU_SHAPE(ds, 1)[0] = STOKE_DIM_VAR;
    TU_SHAPE(ds, 1)[1] = 3;
    f[1].max_len = 3;
    f[1].collate = STOKE_COLLATE_PACK;
    snprintf(f[2].name, sizeof(f[2].name), "label");
    f[2].dtype = STOKE_DTYPE_I64;
    for (int k = 0; k < 3; k++) /* bytes: what read()'s slots step by */
        assert_int_equal(stoke_field_finish(&f[k]), STOKE_OK);
    ds->length = r_length;
    ds->get = r_get;
    r->fields = ds->fields;
    r->neg_at = UINT64_MAX;
}

/* Checks batch b against the reference: tok collated as `collate` (max_len tok_max, truncation
 * as given), box packed, label.  data: the fields' bytes (host, or read back from the device);
 * NULL to take them from the batch.  Marks the indices seen. */
static void check_batch(stoke_batch *b, int collate, int64_t tok_max, void *const data[3],
                        unsigned char *seen)
{
    size_t n = stoke_batch_count(b);
    const uint64_t *idx = stoke_batch_indices(b);
    const int32_t *tok = data ? data[0] : stoke_batch_data(b, 0);
    const float *box = data ? data[1] : stoke_batch_data(b, 1);
    const int64_t *label = data ? data[2] : stoke_batch_data(b, 2);
    const int64_t *tl = stoke_batch_lengths(b, 0), *bl = stoke_batch_lengths(b, 1);
    const int64_t *toff = stoke_batch_offsets(b, 0), *boff = stoke_batch_offsets(b, 1);
    assert_non_null(tl);
    assert_non_null(bl);
    assert_non_null(boff);
    assert_null(stoke_batch_lengths(b, 2));
    assert_null(stoke_batch_offsets(b, 2));
    int64_t shape[4];
    int nd = 0;
    /* tok */
    int64_t longest = 0, total = 0;
    for (size_t j = 0; j < n; j++) {
        int64_t want = tok_len(idx[j]) < tok_max ? tok_len(idx[j]) : tok_max;
        assert_int_equal(tl[j], want);
        longest = want > longest ? want : longest;
        total += want;
    }
    assert_int_equal(stoke_batch_shape(b, 0, shape, 4, &nd), STOKE_OK);
    if (collate == STOKE_COLLATE_PAD) {
        assert_null(toff);
        int64_t L = (longest + 3) / 4 * 4;
        L = L < tok_max ? L : tok_max;
        assert_int_equal(nd, 2);
        assert_int_equal(shape[0], (int64_t)n);
        assert_int_equal(shape[1], L);
        assert_int_equal(stoke_batch_field_bytes(b, 0), n * (size_t)L * 4);
        for (size_t j = 0; j < n; j++)
            for (int64_t k = 0; k < L; k++)
                assert_int_equal(tok[j * (size_t)L + (size_t)k],
                                 k < tl[j] ? (int32_t)(idx[j] * 1000 + (uint64_t)k) : -1);
    } else {
        assert_non_null(toff);
        assert_int_equal(nd, 1);
        assert_int_equal(shape[0], total);
        assert_int_equal(toff[0], 0);
        for (size_t j = 0; j < n; j++) {
            assert_int_equal(toff[j + 1] - toff[j], tl[j]);
            for (int64_t k = 0; k < tl[j]; k++)
                assert_int_equal(tok[toff[j] + k], (int32_t)(idx[j] * 1000 + (uint64_t)k));
        }
        assert_int_equal(stoke_batch_field_bytes(b, 0), (size_t)total * 4);
    }
    /* box: packed rows of 3 */
    assert_int_equal(stoke_batch_shape(b, 1, shape, 4, &nd), STOKE_OK);
    assert_int_equal(nd, 2);
    assert_int_equal(shape[0], boff[n]);
    assert_int_equal(shape[1], 3);
    assert_int_equal(boff[0], 0);
    for (size_t j = 0; j < n; j++) {
        assert_int_equal(bl[j], box_len(idx[j]));
        assert_int_equal(boff[j + 1] - boff[j], bl[j]);
        for (int64_t k = 0; k < bl[j]; k++)
            for (int c = 0; c < 3; c++)
                assert_true(box[(boff[j] + k) * 3 + c] == box_val(idx[j], k, c));
        assert_int_equal(label[j], (int64_t)idx[j]);
        if (seen) {
            assert_int_equal(seen[idx[j]], 0);
            seen[idx[j]] = 1;
        }
    }
}

/* The rest of an epoch of l, to its end (STOKE_EEND): every batch checked (check_batch),
 * released; the samples. */
static size_t r_epoch(stoke_loader *l, int collate, int64_t tok_max, unsigned char *seen)
{
    stoke_batch *b;
    size_t got = 0;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        check_batch(b, collate, tok_max, NULL, seen);
        got += stoke_batch_count(b);
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    return got;
}

/* Takes and releases batches of l until one does not come: its status. */
static int r_until_error(stoke_loader *l)
{
    stoke_batch *b;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK)
        stoke_batch_release(b);
    return rc;
}

static stoke_loader_opts r_opts(int workers, int mode)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 5;
    o.num_workers = workers;
    o.worker_mode = mode;
    o.shuffle = 1;
    o.seed = 11;
    o.pin_memory = 0;
    return o;
}

/* An epoch of every mode and both collations, through get() and read(): every sample once,
 * each batch's bytes, lengths and offsets as the reference says; two epochs. */
static void test_ragged_modes(void **state)
{
    (void)state;
    static const struct {
        int workers, mode;
    } modes[] = {{0, STOKE_WORKER_THREADS},
                 {1, STOKE_WORKER_THREADS},
                 {2, STOKE_WORKER_THREADS},
                 {2, STOKE_WORKER_PROCESSES}};
    for (size_t m = 0; m < sizeof(modes) / sizeof(modes[0]); m++)
        for (int collate = 0; collate < 2; collate++)
            for (int with_read = 0; with_read < 2; with_read++) {
                rds r;
                stoke_dataset ds;
                r_make(&r, &ds, collate, 16, 0);
                if (with_read)
                    ds.read = r_read;
                stoke_loader_opts o = r_opts(modes[m].workers, modes[m].mode);
                stoke_loader *l;
                assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
                for (int e = 0; e < 2; e++) {
                    unsigned char seen[RN] = {0};
                    assert_int_equal(r_epoch(l, collate, 16, seen), RN);
                    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                }
                stoke_loader_destroy(l);
                if (with_read && modes[m].mode == STOKE_WORKER_THREADS)
                    assert_true(atomic_load(&r.reads) > 0);
            }
}

/* max_len 8: with truncate the lengths are cut at 8; without, a longer sample is a bad sample
 * (STOKE_ELIMIT naming the field), skipped under on_error=skip. */
static void test_ragged_truncation(void **state)
{
    (void)state;
    for (int collate = 0; collate < 2; collate++) {
        rds r;
        stoke_dataset ds;
        r_make(&r, &ds, collate, 8, 1);
        stoke_loader_opts o =
            r_opts(collate ? 2 : 0, collate ? STOKE_WORKER_PROCESSES : STOKE_WORKER_THREADS);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        unsigned char seen[RN] = {0};
        assert_int_equal(r_epoch(l, collate, 8, seen), RN);
        uint64_t cut = 0;
        for (uint64_t i = 0; i < RN; i++)
            cut += tok_len(i) > 8;
        stoke_loader_stats st = {.size = sizeof(st)};
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        assert_true(cut > 0);
        assert_int_equal(st.truncated_samples, cut);
        stoke_loader_destroy(l);
    }
    /* no truncate: the first long sample fails the epoch, naming the field */
    rds r;
    stoke_dataset ds;
    r_make(&r, &ds, STOKE_COLLATE_PAD, 8, 0);
    stoke_loader_opts o = r_opts(0, STOKE_WORKER_THREADS);
    o.shuffle = 0;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(r_until_error(l), STOKE_ELIMIT);
    /* the first sample longer than 8 in order: 5 (tok_len 35 % 13 = 9) */
    assert_non_null(strstr(stoke_loader_last_error(l), "sample 5 "));
    assert_non_null(strstr(stoke_loader_last_error(l), "field 'tok': 9 units, more than"));
    stoke_loader_destroy(l);
    /* with describe, the loader's own message says where the sample is, as the dataset's
     * messages do, and the quarantine's source is that place */
    ds.describe = r_describe;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(r_until_error(l), STOKE_ELIMIT);
    assert_non_null(strstr(stoke_loader_last_error(l),
                           "sample 5 of ragged: rows.bin@500: field 'tok': 9 units, more than"));
    stoke_bad_sample q;
    assert_int_equal(stoke_loader_quarantine(l, 0, &q), STOKE_OK);
    assert_string_equal(q.source, "rows.bin@500");
    stoke_loader_destroy(l);
    /* a describe that fills its buffer without a terminator: the message is cut, not read
     * past (ASan) */
    ds.describe = r_describe_unterminated;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(r_until_error(l), STOKE_ELIMIT);
    assert_non_null(strstr(stoke_loader_last_error(l), "xxxx: field 'tok': 9 units"));
    stoke_loader_destroy(l);
    ds.describe = NULL;
    /* on_error=skip: exactly the samples of length <= 8 arrive */
    assert_int_equal(stoke_on_error_parse("skip", &o), STOKE_OK);
    o.num_workers = 2;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    size_t want = 0;
    for (uint64_t i = 0; i < RN; i++)
        want += tok_len(i) <= 8;
    unsigned char seen[RN] = {0};
    assert_int_equal(r_epoch(l, STOKE_COLLATE_PAD, 8, seen), want);
    stoke_loader_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    assert_int_equal(st.skipped_samples, RN - want);
    stoke_loader_destroy(l);
}

/* Device copies (simdev): each field's collated bytes read back from the device; the lengths
 * and offsets stay readable on the host after the staging slot went back to the pool. */
static void test_ragged_device(void **state)
{
    (void)state;
    tu_use_simdev();
    for (int collate = 0; collate < 2; collate++) {
        rds r;
        stoke_dataset ds;
        r_make(&r, &ds, collate, 16, 0);
        stoke_loader_opts o = r_opts(2, STOKE_WORKER_THREADS);
        o.pin_memory = 1;
        o.device = "simdev";
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        static unsigned char buf[3][8192];
        void *data[3] = {buf[0], buf[1], buf[2]};
        unsigned char seen[RN] = {0};
        stoke_batch *b;
        size_t got = 0;
        while (stoke_loader_next(l, &b) == STOKE_OK) {
            assert_int_equal(stoke_batch_device_wait(b), STOKE_OK);
            for (int f = 0; f < 3; f++)
                assert_int_equal(stoke_batch_device_read(b, f, buf[f]), STOKE_OK);
            check_batch(b, collate, 16, data, seen);
            got += stoke_batch_count(b);
            stoke_batch_release(b);
        }
        assert_int_equal(got, RN);
        stoke_loader_destroy(l);
    }
    tu_use_none();
}

/* ---- pad values of every dtype ------------------------------------------------------------
 * Field f: a ragged field of dtype pads[f].dtype, sample i of length i + 1 (1 or 2) filled
 * with 0x11 bytes; in a batch of both, sample 0's second element is the pad value. */

static const struct {
    int dtype;
    double pad;
    unsigned char want[8]; /* little-endian bytes of the pad element */
} PADS[] = {
    {STOKE_DTYPE_BOOL, 3.0, {1}},
    {STOKE_DTYPE_U8, 7.0, {7}},
    {STOKE_DTYPE_I8, -2.0, {0xfe}},
    {STOKE_DTYPE_U16, -1.0, {0xff, 0xff}}, /* wraps, as numpy's astype */
    {STOKE_DTYPE_I16, -3.0, {0xfd, 0xff}},
    {STOKE_DTYPE_U32, 258.0, {2, 1, 0, 0}},
    {STOKE_DTYPE_I32, -1.0, {0xff, 0xff, 0xff, 0xff}},
    {STOKE_DTYPE_U64, 1.0, {1, 0, 0, 0, 0, 0, 0, 0}},
    {STOKE_DTYPE_I64, -2.0, {0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}},
    {STOKE_DTYPE_F16, 2.0, {0x00, 0x40}},
    {STOKE_DTYPE_BF16, 1.0, {0x80, 0x3f}},
    {STOKE_DTYPE_F32, 1.5, {0x00, 0x00, 0xc0, 0x3f}},
    {STOKE_DTYPE_F64, -2.25, {0, 0, 0, 0, 0, 0, 0x02, 0xc0}},
};
enum { NPAD = sizeof(PADS) / sizeof(PADS[0]) };

static uint64_t pad_length(void *user)
{
    (void)user;
    return 2;
}

static int pad_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    (void)user, (void)worker, (void)msg, (void)msg_len;
    for (int f = 0; f < NPAD; f++) {
        lens[f] = (int64_t)index + 1;
        memset(dst[f], 0x11, (size_t)lens[f] * stoke_dtype_size(PADS[f].dtype));
    }
    return STOKE_OK;
}

static void test_pad_values(void **state)
{
    (void)state;
    static const int one = 1;
    if (*(const unsigned char *)&one != 1)
        tu_skip("the expected bytes are little-endian");
    stoke_dataset ds;
    stoke_dataset_init(&ds);
    ds.kind = STOKE_DATASET_MAP;
    snprintf(ds.name, sizeof(ds.name), "pads");
    ds.nfields = NPAD;
    for (int f = 0; f < NPAD; f++) {
        stoke_field *fd = &TU_F(&ds)[f];
        snprintf(fd->name, sizeof(fd->name), "%s", stoke_dtype_name(PADS[f].dtype));
        fd->dtype = PADS[f].dtype;
        fd->ndim = 1;
        TU_SHAPE(&ds, f)[0] = STOKE_DIM_VAR;
        fd->max_len = 4;
        fd->pad_value = PADS[f].pad;
    }
    ds.length = pad_length;
    ds.get = pad_get;
    stoke_loader_opts o = r_opts(0, STOKE_WORKER_THREADS);
    o.batch_size = 2;
    o.shuffle = 0;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    for (int f = 0; f < NPAD; f++) {
        size_t is = stoke_dtype_size(PADS[f].dtype);
        const unsigned char *d = stoke_batch_data(b, f);
        assert_int_equal(stoke_batch_field_bytes(b, f), 4 * is); /* [2, 2] */
        for (size_t k = 0; k < is; k++) {
            assert_int_equal(d[k], 0x11);                 /* sample 0's one element */
            assert_int_equal(d[is + k], PADS[f].want[k]); /* its pad */
            assert_int_equal(d[2 * is + k], 0x11);        /* sample 1's two */
            assert_int_equal(d[3 * is + k], 0x11);
        }
    }
    stoke_batch_release(b);
    stoke_loader_destroy(l);
}

/* ---- 64 fields -------------------------------------------------------------------------- */

enum { NF = 64 };

static int f64_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    (void)user, (void)lens, (void)worker, (void)msg, (void)msg_len;
    for (int f = 0; f < NF; f++)
        for (int k = 0; k <= f; k++)
            ((unsigned char *)dst[f])[k] = (unsigned char)(index * 3 + (uint64_t)f * 5 + k);
    return STOKE_OK;
}

static void test_64_fields(void **state)
{
    (void)state;
    for (int workers = 0; workers <= 2; workers += 2) {
        stoke_dataset ds;
        stoke_dataset_init(&ds);
        ds.kind = STOKE_DATASET_MAP;
        snprintf(ds.name, sizeof(ds.name), "wide");
        ds.nfields = NF;
        for (int f = 0; f < NF; f++) {
            stoke_field *fd = &TU_F(&ds)[f];
            snprintf(fd->name, sizeof(fd->name), "f%d", f);
            fd->dtype = STOKE_DTYPE_U8;
            fd->ndim = 1;
            TU_SHAPE(&ds, f)[0] = f + 1;
        }
        ds.length = r_length;
        ds.get = f64_get;
        stoke_loader_opts o = r_opts(workers, STOKE_WORKER_THREADS);
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b;
        size_t got = 0;
        while (stoke_loader_next(l, &b) == STOKE_OK) {
            assert_int_equal(stoke_batch_num_fields(b), NF);
            for (int f = 0; f < NF; f++) {
                const unsigned char *d = stoke_batch_data(b, f);
                assert_string_equal(stoke_batch_field(b, f)->name, TU_F(&ds)[f].name);
                assert_int_equal(stoke_batch_field_bytes(b, f),
                                 stoke_batch_count(b) * (size_t)(f + 1));
                for (size_t j = 0; j < stoke_batch_count(b); j++)
                    for (int k = 0; k <= f; k++)
                        assert_int_equal(d[j * (size_t)(f + 1) + (size_t)k],
                                         (unsigned char)(stoke_batch_indices(b)[j] * 3 +
                                                         (uint64_t)f * 5 + (uint64_t)k));
            }
            got += stoke_batch_count(b);
            stoke_batch_release(b);
        }
        assert_int_equal(got, RN);
        stoke_loader_destroy(l);
    }
}

/* ---- the size tag and bad fields --------------------------------------------------------- */

static void test_size_tag(void **state)
{
    (void)state;
    rds r;
    stoke_dataset ds;
    r_make(&r, &ds, STOKE_COLLATE_PAD, 16, 0);
    stoke_loader_opts o = r_opts(0, STOKE_WORKER_THREADS);
    stoke_loader *l = (stoke_loader *)&o; /* set to NULL on failure */
    ds.size = 0;                          /* a struct never initialized */
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_null(l);
    assert_non_null(strstr(stoke_last_error(), "dataset 'ragged' has size 0"));
    assert_non_null(strstr(stoke_last_error(), "stoke_dataset_init"));
    /* another header: version 1 (before describe was appended) or any other size */
    for (int k = 0; k < 2; k++) {
        ds.size = (uint32_t)offsetof(stoke_dataset, describe) - (k ? 8 : 0);
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
        assert_non_null(strstr(stoke_last_error(), "built against another version"));
        assert_non_null(strstr(stoke_last_error(), "rebuild it against this one"));
    }
    ds.size = (uint32_t)sizeof(ds);
    /* a ragged field without max_len, a variable dimension other than the first */
    TU_F(&ds)[0].max_len = 0;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "needs max_len >= 1"));
    TU_F(&ds)[0].max_len = 16;
    TU_SHAPE(&ds, 1)[1] = STOKE_DIM_VAR;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "only the first may vary"));
    TU_SHAPE(&ds, 1)[1] = 3;
    ds.nfields = 0;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    ds.nfields = 3;
    TU_F(&ds)[2].bytes = 9; /* a size its dtype and shape do not make */
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "says 9 bytes per sample, its dtype and shape "
                                               "make 8"));
    TU_F(&ds)[2].bytes = 8;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_loader_destroy(l);
}

/* A length below 0 is a bad sample naming the field (STOKE_EDATA); under on_error=skip with
 * read(), a batch with a bad length is read again sample by sample, and the samples cut to
 * max_len are counted once (not again for those taken before the bad one). */
static void test_ragged_bad_lengths(void **state)
{
    (void)state;
    rds r;
    stoke_dataset ds;
    r_make(&r, &ds, STOKE_COLLATE_PAD, 16, 0);
    r.neg_at = 4;
    stoke_loader_opts o = r_opts(0, STOKE_WORKER_THREADS);
    o.shuffle = 0;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(r_until_error(l), STOKE_EDATA);
    assert_non_null(strstr(stoke_loader_last_error(l), "sample 4 "));
    assert_non_null(strstr(stoke_loader_last_error(l), "field 'tok': the sample reported "
                                                       "length -1"));
    stoke_loader_destroy(l);

    for (int workers = 0; workers <= 2; workers += 2) {
        r_make(&r, &ds, STOKE_COLLATE_PACK, 8, 1);
        ds.read = r_read;
        /* in order, batch 1 is samples 5..9 of lengths 9, 3, 10, 4, 11: 5 and 7 are cut, then
         * 9 reports -1 after read() returned (its lengths are taken then) */
        r.neg_at = 9;
        o = r_opts(workers, STOKE_WORKER_THREADS);
        o.shuffle = 0;
        assert_int_equal(stoke_on_error_parse("skip", &o), STOKE_OK);
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        uint64_t want = RN - 1, cut = 0;
        for (uint64_t i = 0; i < RN; i++)
            cut += tok_len(i) > 8 && i != 9;
        unsigned char seen[RN] = {0};
        assert_int_equal(r_epoch(l, STOKE_COLLATE_PACK, 8, seen), want);
        stoke_loader_stats st = {.size = sizeof(st)};
        assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
        assert_true(atomic_load(&r.reads) > 0);
        assert_int_equal(st.skipped_samples, RN - want);
        assert_int_equal(st.truncated_samples, cut);
        stoke_loader_destroy(l);
    }
}

/* ---- fork hooks ---------------------------------------------------------------------------
 * Every call is logged in shared memory with its process: prepare and parent in the process
 * that forks (the caller's at create: the zygote; the zygote: each worker), child first thing
 * in the new process (-1 in the zygote, the worker id in a worker). */

enum { EV_PREPARE = 1, EV_PARENT, EV_CHILD, EV_GET };
typedef struct fk_ev {
    int kind, pid, ppid, worker;
} fk_ev;
typedef struct fk_log {
    atomic_int n;
    fk_ev ev[4096];
} fk_log;
static fk_log *g_fk;

static void fk_add(int kind, int worker)
{
    int i = atomic_fetch_add(&g_fk->n, 1);
    if (i < 4096)
        g_fk->ev[i] = (fk_ev){kind, (int)getpid(), (int)getppid(), worker};
}
static void fk_prepare(void *user)
{
    (void)user;
    fk_add(EV_PREPARE, 0);
}
static void fk_parent(void *user)
{
    (void)user;
    fk_add(EV_PARENT, 0);
}
static void fk_child(void *user, int worker)
{
    (void)user;
    fk_add(EV_CHILD, worker);
}
static int fk_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                  char *msg, size_t msg_len)
{
    fk_add(EV_GET, worker);
    return r_get(user, index, dst, lens, worker, msg, msg_len);
}

static void test_fork_hooks(void **state)
{
    (void)state;
    g_fk = mmap(NULL, sizeof(*g_fk), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(g_fk != MAP_FAILED);
    rds r;
    stoke_dataset ds;
    r_make(&r, &ds, STOKE_COLLATE_PACK, 16, 0);
    ds.get = fk_get;
    ds.fork_prepare = fk_prepare;
    ds.fork_parent = fk_parent;
    ds.fork_child = fk_child;
    stoke_loader_opts o = r_opts(2, STOKE_WORKER_PROCESSES);
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    assert_int_equal(r_epoch(l, STOKE_COLLATE_PACK, 16, NULL), RN);
    stoke_loader_destroy(l);
    int n = atomic_load(&g_fk->n), me = (int)getpid();
    assert_true(n < 4096);
    /* the zygote: the caller's prepare, then the zygote's child(-1) and the caller's parent */
    int zygote = 0, first_child = -1, parent_at = -1;
    for (int i = 0; i < n; i++) {
        const fk_ev *e = &g_fk->ev[i];
        if (e->kind == EV_CHILD && e->worker == -1) {
            assert_int_equal(e->ppid, me);
            zygote = e->pid;
            first_child = i;
        }
        if (e->kind == EV_PARENT && e->pid == me)
            parent_at = i;
    }
    assert_true(zygote > 0);
    assert_true(parent_at >= 0);
    assert_int_equal(g_fk->ev[0].kind, EV_PREPARE);
    assert_int_equal(g_fk->ev[0].pid, me);
    assert_true(first_child > 0);
    /* each worker process (a worker is spawned at its first batch: on a busy machine one may
     * take them all): its child(w) once, forked by the zygote after a prepare there, before any
     * of its gets; every get in a worker process */
    int spawned = 0;
    for (int c = 0; c < n; c++) {
        const fk_ev *ce = &g_fk->ev[c];
        if (ce->kind != EV_CHILD || ce->worker < 0)
            continue;
        spawned++;
        assert_true(ce->worker < 2);
        assert_int_equal(ce->ppid, zygote);
        int prep = -1;
        for (int i = 0; i < c; i++)
            if (g_fk->ev[i].kind == EV_PREPARE && g_fk->ev[i].pid == zygote)
                prep = i;
        assert_true(prep >= 0);
        for (int i = 0; i < n; i++) {
            const fk_ev *e = &g_fk->ev[i];
            if (e->pid != ce->pid)
                continue;
            assert_true(e->kind == EV_GET || i == c); /* its child hook once, then gets */
            assert_true(i >= c);
        }
    }
    assert_true(spawned >= 1);
    for (int i = 0; i < n; i++) { /* every get in a process whose child hook ran first */
        const fk_ev *e = &g_fk->ev[i];
        int known = e->kind != EV_GET;
        for (int c = 0; !known && c < i; c++)
            known = g_fk->ev[c].kind == EV_CHILD && g_fk->ev[c].pid == e->pid &&
                    g_fk->ev[c].worker >= 0;
        assert_true(known);
    }
    /* the caller made no get (every sample in a worker process) */
    for (int i = 0; i < n; i++)
        assert_false(g_fk->ev[i].kind == EV_GET && g_fk->ev[i].pid == me);
    /* prepare and parent pair up in each forking process */
    int pairs[2] = {0, 0}; /* caller, zygote */
    for (int i = 0; i < n; i++) {
        const fk_ev *e = &g_fk->ev[i];
        int who = e->pid == me ? 0 : e->pid == zygote ? 1 : -1;
        if (who >= 0 && e->kind == EV_PREPARE)
            pairs[who]++;
        if (who >= 0 && e->kind == EV_PARENT)
            pairs[who]--;
    }
    assert_int_equal(pairs[0], 0);
    assert_int_equal(pairs[1], 0);
    munmap(g_fk, sizeof(*g_fk));
    g_fk = NULL;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ragged_modes),  cmocka_unit_test(test_ragged_truncation),
        cmocka_unit_test(test_ragged_device), cmocka_unit_test(test_64_fields),
        cmocka_unit_test(test_size_tag),      cmocka_unit_test(test_fork_hooks),
        cmocka_unit_test(test_pad_values),    cmocka_unit_test(test_ragged_bad_lengths),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
