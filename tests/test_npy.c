/* The npy source: format versions, dtypes, byte order, labels, I/O modes, and every kind of
 * malformed file (each must give an error naming the file and the problem, never a crash).
 * Every .npy file is written byte by byte by the test itself. */
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sources/npy_header.h"
#include "stoke/stoke.h"

/* ---- writing .npy files ------------------------------------------------------------------- */

static char *tmp(const char *name)
{
    static char bufs[4][512];
    static int k;
    char n[256];
    snprintf(n, sizeof(n), "npy_%d_%s", (int)getpid(), name);
    char *b = bufs[k++ % 4];
    tu_tmp_path(n, b, 512);
    return b;
}

/* Builds the preamble + header for `dict` (padded with spaces and '\n' to a multiple of 64,
 * as numpy does) into out; returns its length. */
static size_t npy_head(unsigned char *out, size_t cap, int major, const char *dict)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = pre + dl + 1;
    total = (total + 63) / 64 * 64;
    size_t hlen = total - pre;
    assert_true(total <= cap);
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (unsigned char)major;
    out[7] = 0;
    out[8] = (unsigned char)(hlen & 0xff);
    out[9] = (unsigned char)(hlen >> 8);
    if (major != 1) {
        out[10] = (unsigned char)(hlen >> 16);
        out[11] = (unsigned char)(hlen >> 24);
    }
    memcpy(out + pre, dict, dl);
    memset(out + pre + dl, ' ', hlen - dl - 1);
    out[total - 1] = '\n';
    return total;
}

static void write_bytes(const char *path, const void *a, size_t an, const void *b, size_t bn)
{
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    if (an)
        assert_int_equal(fwrite(a, 1, an, f), an);
    if (bn)
        assert_int_equal(fwrite(b, 1, bn, f), bn);
    assert_int_equal(fclose(f), 0);
}

static void write_npy(const char *path, int major, const char *dict, const void *data,
                      size_t data_len)
{
    unsigned char head[4096];
    size_t n = npy_head(head, sizeof(head), major, dict);
    write_bytes(path, head, n, data, data_len);
}

static void fill_pattern(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed * 7u + (i >> 8));
}

/* ---- good files --------------------------------------------------------------------------- */

static void check_rows(stoke_dataset *ds, const unsigned char *data, uint64_t rows,
                       size_t row_bytes)
{
    assert_int_equal(ds->length(ds->user), rows);
    assert_int_equal(ds->fields[0].bytes, row_bytes);
    unsigned char *buf = malloc(row_bytes + 1);
    for (uint64_t i = 0; i < rows; i++) {
        void *dst[STOKE_MAX_FIELDS] = {buf};
        char msg[128] = "";
        assert_int_equal(ds->get(ds->user, i, dst, 0, msg, sizeof(msg)), STOKE_OK);
        assert_memory_equal(buf, data + i * row_bytes, row_bytes);
    }
    free(buf);
}

static void test_versions(void **state)
{
    unsigned char data[5 * 2 * 3];
    fill_pattern(data, sizeof(data), 1);
    for (int major = 1; major <= 3; major++) {
        char name[32];
        snprintf(name, sizeof(name), "v%d.npy", major);
        const char *p = tmp(name);
        write_npy(p, major, "{'descr': '|u1', 'fortran_order': False, 'shape': (5, 2, 3), }",
                  data, sizeof(data));
        stoke_dataset ds;
        assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
        assert_int_equal(ds.kind, STOKE_DATASET_MAP);
        assert_int_equal(ds.nfields, 1);
        assert_string_equal(ds.fields[0].name, "data");
        assert_int_equal(ds.fields[0].dtype, STOKE_DTYPE_U8);
        assert_int_equal(ds.fields[0].ndim, 2);
        assert_int_equal(ds.fields[0].shape[0], 2);
        assert_int_equal(ds.fields[0].shape[1], 3);
        assert_non_null(strstr(ds.name, "npy:"));
        check_rows(&ds, data, 5, 6);
        stoke_dataset_close(&ds);
        assert_null(ds.get);
        unlink(p);
    }
}

/* Version 3.0: UTF-8 header; also double quotes, no trailing comma, Python 2 longs, tabs. */
static void test_v3_utf8_and_syntax_variants(void **state)
{
    unsigned char data[4 * 2 * 2];
    fill_pattern(data, sizeof(data), 2);
    const char *p = tmp("v3var.npy");
    write_npy(p, 3, "{\"shape\": (4L,\t2L), \"fortran_order\": False, \"descr\": \"<u2\"}", data,
              sizeof(data));
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
    assert_int_equal(ds.fields[0].dtype, STOKE_DTYPE_U16);
    assert_int_equal(ds.fields[0].ndim, 1);
    assert_int_equal(ds.fields[0].shape[0], 2);
    check_rows(&ds, data, 4, 4);
    stoke_dataset_close(&ds);
    /* UTF-8 inside a string of a 3.0 header: read, then rejected as a dtype, not a crash */
    write_npy(p, 3, "{'descr': '<\xc3\xbc" "4', 'fortran_order': False, 'shape': (4, 2), }", data,
              sizeof(data));
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_EFORMAT);
    assert_non_null(strstr(stoke_last_error(), "unsupported dtype"));
    assert_non_null(strstr(stoke_last_error(), p));
    unlink(p);
}

static const struct {
    const char *descr;
    int dtype;
    size_t itemsize;
} DTYPES[] = {
    {"|b1", STOKE_DTYPE_BOOL, 1},   {"|i1", STOKE_DTYPE_I8, 1},    {"|u1", STOKE_DTYPE_U8, 1},
    {"<i2", STOKE_DTYPE_I16, 2},    {"<u2", STOKE_DTYPE_U16, 2},   {"<i4", STOKE_DTYPE_I32, 4},
    {"<u4", STOKE_DTYPE_U32, 4},    {"<i8", STOKE_DTYPE_I64, 8},   {"<u8", STOKE_DTYPE_U64, 8},
    {"<f2", STOKE_DTYPE_F16, 2},    {"<f4", STOKE_DTYPE_F32, 4},   {"<f8", STOKE_DTYPE_F64, 8},
    {"<c8", STOKE_DTYPE_C64, 8},    {"<c16", STOKE_DTYPE_C128, 16}, {"|V3", STOKE_DTYPE_RAW, 3},
    {"|V16", STOKE_DTYPE_RAW, 16},  {"|S5", STOKE_DTYPE_RAW, 5},   {"u1", STOKE_DTYPE_U8, 1},
    {"=i4", STOKE_DTYPE_I32, 4},
};

static void test_every_dtype(void **state)
{
    for (size_t k = 0; k < sizeof(DTYPES) / sizeof(DTYPES[0]); k++) {
        size_t is = DTYPES[k].itemsize, row = 2 * is;
        unsigned char data[3 * 2 * 16];
        fill_pattern(data, 3 * row, (unsigned)k);
        char dict[160];
        snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': (3, 2), }",
                 DTYPES[k].descr);
        const char *p = tmp("dtype.npy");
        write_npy(p, 1, dict, data, 3 * row);
        stoke_dataset ds;
        int rc = stoke_npy_open(p, NULL, &ds);
        if (rc)
            fail_msg("%s: %s", DTYPES[k].descr, stoke_last_error());
        assert_int_equal(ds.fields[0].dtype, DTYPES[k].dtype);
        assert_int_equal(ds.fields[0].itemsize, is);
        assert_int_equal(ds.fields[0].bytes, row);
        if (DTYPES[k].dtype != STOKE_DTYPE_RAW)
            assert_int_equal(stoke_dtype_size(DTYPES[k].dtype), is);
        check_rows(&ds, data, 3, row);
        stoke_dataset_close(&ds);
        unlink(p);
    }
}

static void test_big_endian_is_swapped(void **state)
{
    /* '>u4' 2 rows of 2: 0x01020304 0x0a0b0c0d / 0xdeadbeef 0x00000001 */
    const unsigned char be[] = {1, 2, 3, 4, 0xa, 0xb, 0xc, 0xd, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1};
    const char *p = tmp("be.npy");
    write_npy(p, 1, "{'descr': '>u4', 'fortran_order': False, 'shape': (2, 2), }", be, sizeof(be));
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
    uint32_t row[2];
    void *dst[STOKE_MAX_FIELDS] = {row};
    char msg[64];
    assert_int_equal(ds.get(ds.user, 1, dst, 0, msg, sizeof(msg)), STOKE_OK);
    assert_int_equal(row[0], 0xdeadbeefu);
    assert_int_equal(row[1], 1u);
    stoke_dataset_close(&ds);

    /* '>c8': each 4-byte half is swapped on its own. */
    float f[2] = {1.5f, -2.25f};
    unsigned char cbe[8];
    for (int h = 0; h < 2; h++) {
        unsigned char le[4];
        memcpy(le, &f[h], 4);
        for (int i = 0; i < 4; i++)
            cbe[4 * h + i] = le[3 - i];
    }
    write_npy(p, 2, "{'descr': '>c8', 'fortran_order': False, 'shape': (1,), }", cbe, 8);
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
    float got[2];
    dst[0] = got;
    assert_int_equal(ds.get(ds.user, 0, dst, 0, msg, sizeof(msg)), STOKE_OK);
    assert_true(got[0] == 1.5f && got[1] == -2.25f);
    stoke_dataset_close(&ds);
    unlink(p);
}

static void test_scalar_and_empty(void **state)
{
    const char *p = tmp("scalar.npy");
    const unsigned char v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    write_npy(p, 1, "{'descr': '<f8', 'fortran_order': False, 'shape': (), }", v, 8);
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
    assert_int_equal(ds.fields[0].ndim, 0);
    check_rows(&ds, v, 1, 8);
    stoke_dataset_close(&ds);

    write_npy(p, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 3, 32, 32), }", NULL,
              0);
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 0);
    assert_int_equal(ds.fields[0].bytes, 3 * 32 * 32);
    stoke_dataset_close(&ds);
    unlink(p);
}

static void test_out_of_range_index(void **state)
{
    unsigned char data[6] = {0};
    const char *p = tmp("range.npy");
    write_npy(p, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2), }", data, 6);
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(p, NULL, &ds), STOKE_OK);
    unsigned char row[2];
    void *dst[STOKE_MAX_FIELDS] = {row};
    char msg[256] = "";
    assert_int_equal(ds.get(ds.user, 3, dst, 0, msg, sizeof(msg)), STOKE_ERANGE);
    assert_non_null(strstr(msg, p));
    assert_non_null(strstr(msg, "out of range"));
    stoke_dataset_close(&ds);
    unlink(p);
}

/* ---- labels ------------------------------------------------------------------------------- */

static void test_labels(void **state)
{
    unsigned char data[4 * 3];
    fill_pattern(data, sizeof(data), 3);
    int64_t labels[4] = {7, -1, 3, 1000000000000LL};
    const char *dp = tmp("ldata.npy"), *lp = tmp("labels.npy");
    write_npy(dp, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 3), }", data, 12);
    const char *shapes[] = {"(4,)", "(4, 1)"};
    for (int s = 0; s < 2; s++) {
        char dict[128];
        snprintf(dict, sizeof(dict), "{'descr': '<i8', 'fortran_order': False, 'shape': %s, }",
                 shapes[s]);
        write_npy(lp, 1, dict, labels, sizeof(labels));
        stoke_dataset ds;
        assert_int_equal(stoke_npy_open(dp, lp, &ds), STOKE_OK);
        assert_int_equal(ds.nfields, 2);
        assert_string_equal(ds.fields[1].name, "label");
        assert_int_equal(ds.fields[1].dtype, STOKE_DTYPE_I64);
        assert_int_equal(ds.fields[1].ndim, 0);
        assert_int_equal(ds.fields[1].bytes, 8);
        for (uint64_t i = 0; i < 4; i++) {
            unsigned char row[3];
            int64_t lab = 0;
            void *dst[STOKE_MAX_FIELDS] = {row, &lab};
            char msg[64];
            assert_int_equal(ds.get(ds.user, i, dst, 1, msg, sizeof(msg)), STOKE_OK);
            assert_memory_equal(row, data + 3 * i, 3);
            assert_int_equal(lab, labels[i]);
        }
        stoke_dataset_close(&ds);
    }

    /* Through the spec string too. */
    char spec[1200];
    snprintf(spec, sizeof(spec), "npy:%s,labels=%s", dp, lp);
    stoke_dataset ds;
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    assert_int_equal(ds.nfields, 2);
    stoke_dataset_close(&ds);
    unlink(dp);
    unlink(lp);
}

static void test_labels_mismatch(void **state)
{
    unsigned char data[4 * 3] = {0};
    int64_t labels[8] = {0};
    const char *dp = tmp("mdata.npy"), *lp = tmp("mlabels.npy");
    write_npy(dp, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (4, 3), }", data, 12);
    stoke_dataset ds;

    write_npy(lp, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }", labels, 40);
    assert_int_equal(stoke_npy_open(dp, lp, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), lp));
    assert_non_null(strstr(stoke_last_error(), dp));
    assert_non_null(strstr(stoke_last_error(), "5 rows"));
    assert_null(ds.get);
    stoke_dataset_close(&ds); /* safe on a failed open */

    write_npy(lp, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4, 2), }", labels, 64);
    assert_int_equal(stoke_npy_open(dp, lp, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), lp));
    assert_non_null(strstr(stoke_last_error(), "1-D"));

    write_npy(lp, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (), }", labels, 8);
    assert_int_equal(stoke_npy_open(dp, lp, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), lp));

    write_npy(lp, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (4,), }", labels, 16);
    assert_int_equal(stoke_npy_open(dp, lp, &ds), STOKE_EFORMAT);
    assert_non_null(strstr(stoke_last_error(), lp));
    assert_non_null(strstr(stoke_last_error(), "data truncated"));

    assert_int_equal(stoke_npy_open(dp, tmp("no-such-labels.npy"), &ds), STOKE_ENOENT);
    assert_non_null(strstr(stoke_last_error(), "no-such-labels.npy"));
    unlink(dp);
    unlink(lp);
}

/* ---- malformed files ---------------------------------------------------------------------- */

static void expect_fail(const char *path, int code, const char *needle)
{
    stoke_dataset ds;
    int rc = stoke_npy_open(path, NULL, &ds);
    if (rc != code || !strstr(stoke_last_error(), path) ||
        (needle && !strstr(stoke_last_error(), needle)))
        fail_msg("%s: expected %s with \"%s\", got %s: \"%s\"", needle ? needle : "",
                 stoke_err_name(code), needle ? needle : "", stoke_err_name(rc),
                 stoke_last_error());
    assert_null(ds.get);
    assert_null(ds.user);
}

static void test_fortran_rejected(void **state)
{
    unsigned char data[6] = {0};
    const char *p = tmp("fortran.npy");
    write_npy(p, 1, "{'descr': '<u2', 'fortran_order': True, 'shape': (3, 1), }", data, 6);
    expect_fail(p, STOKE_EFORMAT, "Fortran");
    unlink(p);
}

static const struct {
    const char *dict;   /* header dict, or NULL when raw bytes are given */
    size_t data_len;    /* data bytes after the header */
    const char *needle; /* in the message */
} BAD_DICTS[] = {
    {"{'descr': '|u1' 'fortran_order': False, 'shape': (3,), }", 3, "malformed header dict"},
    {"hello", 3, "malformed header dict"},
    {"", 0, "malformed header dict"},
    {"{'descr': '|u1', 'fortran_order': False, }", 3, "missing key 'shape'"},
    {"{'fortran_order': False, 'shape': (3,), }", 3, "missing key 'descr'"},
    {"{'descr': '|u1', 'shape': (3,), }", 3, "missing key 'fortran_order'"},
    {"{'descr': '|u1', 'descr': '|u1', 'fortran_order': False, 'shape': (3,)}", 3, "duplicate"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3,), 'extra': 1}", 3, "unexpected key"},
    {"{'descr': '<u3', 'fortran_order': False, 'shape': (3,), }", 9, "unsupported dtype"},
    {"{'descr': '<f16', 'fortran_order': False, 'shape': (3,), }", 48, "unsupported dtype"},
    {"{'descr': '|O', 'fortran_order': False, 'shape': (3,), }", 24, "unsupported dtype"},
    {"{'descr': '|O8', 'fortran_order': False, 'shape': (3,), }", 24, "object"},
    {"{'descr': '<M8[ns]', 'fortran_order': False, 'shape': (3,), }", 24, "unsupported dtype"},
    {"{'descr': '', 'fortran_order': False, 'shape': (3,), }", 3, "empty dtype"},
    {"{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (3,), }", 12, "structured"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (-1, 3), }", 3, "negative"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (4611686018427387904, 8), }", 3,
     "overflows"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (99999999999999999999,), }", 3,
     "overflows"},
    {"{'descr': '<f8', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }", 3,
     "overflows"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3), }", 3, "not a tuple"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': [3], }", 3, "must be a tuple"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3,,), }", 3, "malformed"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3 4), }", 12, "malformed"},
    {"{'descr': '|u1', 'fortran_order': maybe, 'shape': (3,), }", 3, "True or False"},
    {"{'descr': '|u1, 'fortran_order': False, 'shape': (3,), }", 3, "malformed"},
    {"{'descr': '|u\\x31', 'fortran_order': False, 'shape': (3,), }", 3, "escape"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3,), } junk", 3, "after the header"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3,) ", 3, "expected '}'"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (10, 3), }", 29, "data truncated"},
    {"{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1, 1, 1, 1, 1, 1, 1, 1, 1), }", 8,
     "dimensions"},
};

static void test_malformed_dicts(void **state)
{
    static unsigned char zeros[64];
    const char *p = tmp("bad.npy");
    for (size_t k = 0; k < sizeof(BAD_DICTS) / sizeof(BAD_DICTS[0]); k++) {
        for (int major = 1; major <= 3; major += 2) {
            write_npy(p, major, BAD_DICTS[k].dict, zeros, BAD_DICTS[k].data_len);
            expect_fail(p, STOKE_EFORMAT, BAD_DICTS[k].needle);
        }
    }
    unlink(p);
}

static void test_malformed_preamble(void **state)
{
    const char *p = tmp("pre.npy");
    unsigned char good[128];
    size_t n = npy_head(good, sizeof(good), 1,
                        "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }");
    unsigned char b[256];

    write_bytes(p, NULL, 0, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "truncated");
    write_bytes(p, good, 5, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "truncated");
    write_bytes(p, good, 9, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "truncated");
    write_bytes(p, "PK\x03\x04 this is a zip", 18, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "bad magic");
    memcpy(b, good, n);
    b[5] = 'X';
    write_bytes(p, b, n + 3, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "bad magic");
    memcpy(b, good, n);
    b[6] = 4;
    write_bytes(p, b, n + 3, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "version 4.0");
    memcpy(b, good, n);
    b[7] = 1;
    write_bytes(p, b, n + 3, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "version 1.1");
    memcpy(b, good, n);
    b[6] = 0;
    write_bytes(p, b, n + 3, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "version 0.0");
    /* header length past EOF */
    write_bytes(p, good, n - 10, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "runs past the end");
    memcpy(b, good, n);
    b[8] = 0xff, b[9] = 0x7f;
    write_bytes(p, b, n + 3, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "runs past the end");
    /* v2 with an absurd header length */
    size_t n2 = npy_head(b, sizeof(b), 2,
                         "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }");
    b[11] = 0x40;
    write_bytes(p, b, n2 + 3, NULL, 0);
    expect_fail(p, STOKE_EFORMAT, "exceeds");
    /* a directory */
    expect_fail(getenv("STOKE_TEST_TMP") ? getenv("STOKE_TEST_TMP") : "/tmp", STOKE_EIO,
                "regular file");
    /* a missing file */
    expect_fail(tmp("does-not-exist.npy"), STOKE_ENOENT, "cannot open");
    unlink(p);
}

/* Every prefix of a valid file, and random corruptions of its header, through the pure parser
 * and through the file path: errors, never a crash (the libFuzzer target does this at scale). */
static void test_truncations_and_corruptions(void **state)
{
    unsigned char file[256];
    size_t hn = npy_head(file, sizeof(file), 2,
                         "{'descr': '<i2', 'fortran_order': False, 'shape': (3, 2), }");
    fill_pattern(file + hn, 12, 5);
    size_t n = hn + 12;
    stoke__npy_header h;
    char err[256];
    assert_int_equal(stoke__npy_parse_header(file, n, n, &h, err, sizeof(err)), 0);
    assert_int_equal(h.data_offset, hn);
    assert_int_equal(h.data_bytes, 12);
    for (size_t len = 0; len < n; len++) {
        assert_int_equal(stoke__npy_parse_header(file, len, len, &h, err, sizeof(err)),
                         STOKE_EFORMAT);
        assert_true(err[0] != 0);
    }
    const char *p = tmp("prefix.npy");
    for (size_t len = 0; len < n; len += 7) {
        write_bytes(p, file, len, NULL, 0);
        expect_fail(p, STOKE_EFORMAT, NULL);
    }
    uint64_t x = 12345;
    unsigned char mut[256];
    int ok = 0;
    for (int it = 0; it < 20000; it++) {
        memcpy(mut, file, n);
        int flips = 1 + it % 4;
        for (int f = 0; f < flips; f++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            mut[x % hn] = (unsigned char)(x >> 32);
        }
        int rc = stoke__npy_parse_header(mut, n, n, &h, err, sizeof(err));
        assert_true(rc == 0 || rc == STOKE_EFORMAT);
        if (rc == 0) {
            assert_true(h.data_offset + h.data_bytes <= n);
            ok++;
        } else {
            assert_true(err[0] != 0);
        }
    }
    assert_true(ok > 0); /* some flips land in padding */
    unlink(p);
}

/* ---- I/O modes, concurrency, spec strings ------------------------------------------------- */

static void test_pread_matches_mmap(void **state)
{
    enum { ROWS = 64, ROW = 300 };
    unsigned char *data = malloc(ROWS * ROW);
    fill_pattern(data, ROWS * ROW, 9);
    const char *p = tmp("io.npy");
    write_npy(p, 1, "{'descr': '<u2', 'fortran_order': False, 'shape': (64, 150), }", data,
              ROWS * ROW);
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    o.io = STOKE_NPY_IO_PREAD;
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open_opts(p, &o, &ds), STOKE_OK);
    check_rows(&ds, data, ROWS, ROW);
    stoke_dataset_close(&ds);
    char spec[700];
    snprintf(spec, sizeof(spec), "npy:%s,io=pread", p);
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    check_rows(&ds, data, ROWS, ROW);
    stoke_dataset_close(&ds);
    o.io = 7;
    assert_int_equal(stoke_npy_open_opts(p, &o, &ds), STOKE_EINVAL);
    o.size = 0;
    assert_int_equal(stoke_npy_open_opts(p, &o, &ds), STOKE_EINVAL);
    free(data);
    unlink(p);
}

typedef struct reader {
    stoke_dataset *ds;
    const unsigned char *data;
    int worker, bad;
} reader;

static void *reader_main(void *arg)
{
    reader *r = arg;
    unsigned char row[512];
    for (uint64_t k = 0; k < 2000; k++) {
        uint64_t i = (k * 7919 + (uint64_t)r->worker * 31) % 100;
        void *dst[STOKE_MAX_FIELDS] = {row};
        char msg[64];
        if (r->ds->get(r->ds->user, i, dst, r->worker, msg, sizeof(msg)) != STOKE_OK ||
            memcmp(row, r->data + i * 512, 512) != 0)
            r->bad++;
    }
    return NULL;
}

static void test_concurrent_get(void **state)
{
    unsigned char *data = malloc(100 * 512);
    fill_pattern(data, 100 * 512, 11);
    const char *p = tmp("conc.npy");
    write_npy(p, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (100, 512), }", data,
              100 * 512);
    for (int io = 0; io < 2; io++) {
        stoke_npy_opts o;
        stoke_npy_opts_init(&o);
        o.io = io;
        stoke_dataset ds;
        assert_int_equal(stoke_npy_open_opts(p, &o, &ds), STOKE_OK);
        pthread_t t[4];
        reader r[4];
        for (int w = 0; w < 4; w++) {
            r[w] = (reader){&ds, data, w, 0};
            assert_int_equal(pthread_create(&t[w], NULL, reader_main, &r[w]), 0);
        }
        for (int w = 0; w < 4; w++) {
            pthread_join(t[w], NULL);
            assert_int_equal(r[w].bad, 0);
        }
        stoke_dataset_close(&ds);
    }
    free(data);
    unlink(p);
}

static void test_npy_spec_errors(void **state)
{
    stoke_dataset ds;
    assert_int_equal(stoke_source_open("npy:", &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "no file name"));
    assert_int_equal(stoke_source_open("npy", &ds), STOKE_EINVAL);
    assert_int_equal(stoke_source_open("npy:,labels=x.npy", &ds), STOKE_EINVAL);
    assert_int_equal(stoke_source_open("npy:/x.npy,io=bogus", &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "io=bogus"));
    assert_int_equal(stoke_source_open("npy:/x.npy,labels=", &ds), STOKE_EINVAL);
    /* a comma that starts no option belongs to the path */
    assert_int_equal(stoke_source_open("npy:/nonexistent/a,b.npy", &ds), STOKE_ENOENT);
    assert_non_null(strstr(stoke_last_error(), "/nonexistent/a,b.npy"));
    assert_int_equal(stoke_source_open("npy:/nonexistent/a.npy,labels=/l.npy,io=pread", &ds),
                     STOKE_ENOENT);
    assert_non_null(strstr(stoke_last_error(), "/nonexistent/a.npy"));
    assert_int_equal(stoke_npy_open(NULL, NULL, &ds), STOKE_EINVAL);
    assert_int_equal(stoke_npy_open("x.npy", NULL, NULL), STOKE_EINVAL);
    assert_null(ds.get);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_versions),
        cmocka_unit_test(test_v3_utf8_and_syntax_variants),
        cmocka_unit_test(test_every_dtype),
        cmocka_unit_test(test_big_endian_is_swapped),
        cmocka_unit_test(test_scalar_and_empty),
        cmocka_unit_test(test_out_of_range_index),
        cmocka_unit_test(test_labels),
        cmocka_unit_test(test_labels_mismatch),
        cmocka_unit_test(test_fortran_rejected),
        cmocka_unit_test(test_malformed_dicts),
        cmocka_unit_test(test_malformed_preamble),
        cmocka_unit_test(test_truncations_and_corruptions),
        cmocka_unit_test(test_pread_matches_mmap),
        cmocka_unit_test(test_concurrent_get),
        cmocka_unit_test(test_npy_spec_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
