/* The npy source: format versions, dtypes, byte order, labels, I/O modes, and every kind of
 * malformed file (each must give an error naming the file and the problem, never a crash).
 * Every .npy file is written byte by byte by the test itself. */
#include "testutil.h"

#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/types.h>
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
        void *dst[TU_FIELDS] = {buf};
        char msg[128] = "";
        assert_int_equal(ds->get(ds->user, i, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
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
        write_npy(p, major, "{'descr': '|u1', 'fortran_order': False, 'shape': (5, 2, 3), }", data,
                  sizeof(data));
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
    write_npy(p, 3,
              "{'descr': '<\xc3\xbc"
              "4', 'fortran_order': False, 'shape': (4, 2), }",
              data, sizeof(data));
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
    {"|b1", STOKE_DTYPE_BOOL, 1},  {"|i1", STOKE_DTYPE_I8, 1},     {"|u1", STOKE_DTYPE_U8, 1},
    {"<i2", STOKE_DTYPE_I16, 2},   {"<u2", STOKE_DTYPE_U16, 2},    {"<i4", STOKE_DTYPE_I32, 4},
    {"<u4", STOKE_DTYPE_U32, 4},   {"<i8", STOKE_DTYPE_I64, 8},    {"<u8", STOKE_DTYPE_U64, 8},
    {"<f2", STOKE_DTYPE_F16, 2},   {"<f4", STOKE_DTYPE_F32, 4},    {"<f8", STOKE_DTYPE_F64, 8},
    {"<c8", STOKE_DTYPE_C64, 8},   {"<c16", STOKE_DTYPE_C128, 16}, {"|V3", STOKE_DTYPE_RAW, 3},
    {"|V16", STOKE_DTYPE_RAW, 16}, {"|S5", STOKE_DTYPE_RAW, 5},    {"u1", STOKE_DTYPE_U8, 1},
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
    void *dst[TU_FIELDS] = {row};
    char msg[64];
    assert_int_equal(ds.get(ds.user, 1, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
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
    assert_int_equal(ds.get(ds.user, 0, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
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

    write_npy(p, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (0, 3, 32, 32), }", NULL, 0);
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
    void *dst[TU_FIELDS] = {row};
    char msg[256] = "";
    assert_int_equal(ds.get(ds.user, 3, dst, NULL, 0, msg, sizeof(msg)), STOKE_ERANGE);
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
            void *dst[TU_FIELDS] = {row, &lab};
            char msg[64];
            assert_int_equal(ds.get(ds.user, i, dst, NULL, 1, msg, sizeof(msg)), STOKE_OK);
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
    /* numpy refuses these too ("array is too big"): a 0 elsewhere does not make them fit */
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (0, 4611686018427387904, 8), }", 0,
     "overflows"},
    {"{'descr': '|u1', 'fortran_order': False, 'shape': (3, 0, 4611686018427387904, 8), }", 0,
     "overflows"},
    {"{'descr': '<f8', 'fortran_order': False, 'shape': (3, 0, 1152921504606846976), }", 0,
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
    /* the loader has no limit on dimensions; the format's parser stops at numpy's 64 */
    {"{'descr': '<i4', 'fortran_order': False, 'shape': (2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
     "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, "
     "1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1), }",
     8, "more than 64 dimensions"},
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
    size_t n2 =
        npy_head(b, sizeof(b), 2, "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }");
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

/* Opens `path` with io mode `io` (STOKE_NPY_IO_*); fails the test if it does not open. */
static void open_io(const char *path, int io, stoke_dataset *ds)
{
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    o.io = io;
    int rc = stoke_npy_open_opts(path, &o, ds);
    if (rc != STOKE_OK)
        fail_msg("%s (io %d): %s: %s", path, io, stoke_err_name(rc), stoke_last_error());
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
        void *dst[TU_FIELDS] = {row};
        char msg[64];
        if (r->ds->get(r->ds->user, i, dst, NULL, r->worker, msg, sizeof(msg)) != STOKE_OK ||
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
        stoke_dataset ds;
        open_io(p, io, &ds);
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

/* ---- hostile paths and files changing underneath ------------------------------------------ */

/* A FIFO as data or labels: refused at once, never a blocking open().  The alarm turns a
 * regression (open() waiting for a writer forever) into a failure instead of a hang. */
static void test_fifo_refused(void **state)
{
    const char *fifo = tmp("fifo.npy"), *dp = tmp("fifo-data.npy");
    unlink(fifo);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    unsigned char data[6] = {0};
    write_npy(dp, 1, "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 2), }", data, 6);
    alarm(60); /* default action: the test process dies, CTest reports a failure */
    stoke_dataset ds;
    for (int io = 0; io < 2; io++) {
        stoke_npy_opts o;
        stoke_npy_opts_init(&o);
        o.io = io;
        assert_int_equal(stoke_npy_open_opts(fifo, &o, &ds), STOKE_EIO);
        assert_non_null(strstr(stoke_last_error(), fifo));
        assert_non_null(strstr(stoke_last_error(), "is a FIFO, not a regular file"));
        assert_null(ds.get);
        o.labels_path = fifo;
        assert_int_equal(stoke_npy_open_opts(dp, &o, &ds), STOKE_EIO);
        assert_non_null(strstr(stoke_last_error(), fifo));
        assert_non_null(strstr(stoke_last_error(), "is a FIFO, not a regular file"));
        assert_null(ds.get);
    }
    char spec[1200];
    snprintf(spec, sizeof(spec), "npy:%s", fifo);
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_EIO);
    assert_non_null(strstr(stoke_last_error(), "is a FIFO, not a regular file"));
    snprintf(spec, sizeof(spec), "npy:%s,labels=%s", dp, fifo);
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_EIO);
    assert_non_null(strstr(stoke_last_error(), "is a FIFO, not a regular file"));
    alarm(0);
    /* a directory and a character device name what they are */
    const char *dir = getenv("STOKE_TEST_TMP") ? getenv("STOKE_TEST_TMP") : "/tmp";
    expect_fail(dir, STOKE_EIO, "is a directory, not a regular file");
    expect_fail("/dev/null", STOKE_EIO, "is a character device, not a regular file");
    unlink(fifo);
    unlink(dp);
}

enum { CH_ROWS = 64, CH_ROW = 4096 }; /* page-sized rows: a truncation unmaps whole rows */

/* A (CH_ROWS, CH_ROW) u1 file; returns the header size. */
static size_t write_changing(const char *path, unsigned seed)
{
    unsigned char *data = malloc(CH_ROWS * CH_ROW);
    fill_pattern(data, CH_ROWS * CH_ROW, seed);
    unsigned char head[256];
    size_t hn = npy_head(head, sizeof(head), 1,
                         "{'descr': '|u1', 'fortran_order': False, 'shape': (64, 4096), }");
    write_bytes(path, head, hn, data, CH_ROWS * CH_ROW);
    free(data);
    return hn;
}

static void expect_changed(stoke_dataset *ds, const char *path, uint64_t index, const char *why)
{
    unsigned char *row = malloc(CH_ROW);
    void *dst[TU_FIELDS] = {row};
    char msg[512] = "", want[64];
    int rc = ds->get(ds->user, index, dst, NULL, 0, msg, sizeof(msg));
    snprintf(want, sizeof(want), "sample %llu:", (unsigned long long)index);
    if (rc != STOKE_EIO || !strstr(msg, path) || !strstr(msg, want) ||
        !strstr(msg, "file changed while loading") || !strstr(msg, why))
        fail_msg("sample %llu: expected STOKE_EIO with \"%s\", got %s: \"%s\"",
                 (unsigned long long)index, why, stoke_err_name(rc), msg);
    free(row);
}

/* Truncated after open: io=mmap reports the fault of the copy (the SIGBUS guard) and the size
 * check; io=pread the short read and the size check.  The process goes on: the guard works
 * again (the signal mask was restored), and another file loads normally. */
static void test_truncated_after_open(void **state)
{
    const char *p = tmp("shrink.npy"), *good = tmp("shrink-good.npy");
    for (int round = 0; round < 2; round++) {
        for (int io = 0; io < 2; io++) {
            size_t hn = write_changing(p, 3);
            stoke_dataset ds;
            open_io(p, io, &ds);
            unsigned char row[CH_ROW];
            void *dst[TU_FIELDS] = {row};
            char msg[256];
            assert_int_equal(ds.get(ds.user, 10, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
            assert_int_equal(truncate(p, (off_t)(hn + CH_ROW)), 0);
            /* index 10 is not a multiple of 256: no size check, the read itself notices */
            expect_changed(&ds, p, 10,
                           io == STOKE_NPY_IO_MMAP ? "mapped pages are gone" : "ends at byte");
            /* (mmap: after the fault each read checks its row against the size first) */
            expect_changed(&ds, p, 63,
                           io == STOKE_NPY_IO_MMAP ? "when opened: truncated" : "ends at byte");
            /* sample 0 is still in the file, but the size check sees the change */
            expect_changed(&ds, p, 0, "when opened");
            stoke_dataset_close(&ds);
        }
    }
    unsigned char *data = malloc(CH_ROWS * CH_ROW);
    fill_pattern(data, CH_ROWS * CH_ROW, 4);
    write_changing(good, 4);
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(good, NULL, &ds), STOKE_OK);
    check_rows(&ds, data, CH_ROWS, CH_ROW);
    stoke_dataset_close(&ds);
    free(data);
    unlink(p);
    unlink(good);
}

/* Rewritten in place with the same size: the mtime check reports it at the next sample whose
 * index is a multiple of 256 (sample 0 here), and in get_batch() at the next batch holding a
 * multiple of 4096 (sample 0 again, in slot 1): a batch without one reads on. */
static void test_rewritten_in_place(void **state)
{
    const char *p = tmp("rewrite.npy");
    write_changing(p, 5);
    struct timespec old[2] = {{1000000000, 0}, {1000000000, 0}};
    assert_int_equal(utimensat(AT_FDCWD, p, old, 0), 0);
    for (int io = 0; io < 2; io++) {
        stoke_dataset ds;
        open_io(p, io, &ds);
        int fd = open(p, O_WRONLY);
        assert_true(fd >= 0);
        unsigned char junk[16] = {0};
        assert_int_equal(pwrite(fd, junk, sizeof(junk), 200), (ssize_t)sizeof(junk));
        close(fd); /* mtime is now, not 2001 */
        expect_changed(&ds, p, 0, "modified after it was opened");
        unsigned char *rows = malloc(3 * CH_ROW);
        void *dst[TU_FIELDS] = {rows};
        char msg[512] = "";
        uint64_t err = 99;
        const uint64_t without[3] = {5, 9, 33}, with[3] = {5, 0, 9};
        assert_int_equal(tu_read_batch(&ds, without, 3, dst, 0, msg, sizeof(msg), &err), STOKE_OK);
        assert_int_equal(tu_read_batch(&ds, with, 3, dst, 0, msg, sizeof(msg), &err), STOKE_EIO);
        assert_int_equal(err, 0);
        assert_non_null(strstr(msg, "sample 0:"));
        assert_non_null(strstr(msg, "modified after it was opened"));
        free(rows);
        stoke_dataset_close(&ds);
        assert_int_equal(utimensat(AT_FDCWD, p, old, 0), 0);
    }
    unlink(p);
}

/* A loader over `ds` in batches of `batch` with `workers` workers, not pinned; fails the test if
 * it cannot be created. */
static stoke_loader *host_loader(stoke_dataset *ds, size_t batch, int workers)
{
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = batch;
    o.num_workers = workers;
    o.pin_memory = 0;
    stoke_loader *l = NULL;
    if (stoke_loader_create(&o, ds, &l) != STOKE_OK)
        fail_msg("loader (batch %zu, %d workers): %s", batch, workers, stoke_last_error());
    return l;
}

/* Through the loader with worker threads: the file shrinks after the first batch; a later
 * batch fails with the source's error (file, sample, "file changed while loading"), the
 * loader shuts down cleanly, and the next loader over a good file delivers everything. */
static void test_loader_file_shrinks(void **state)
{
    const char *p = tmp("lshrink.npy"), *good = tmp("lshrink-good.npy");
    for (int io = 0; io < 2; io++) {
        size_t hn = write_changing(p, 6);
        stoke_dataset ds;
        open_io(p, io, &ds);
        stoke_loader *l = host_loader(&ds, 2, 2);
        stoke_batch *b;
        assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
        stoke_batch_release(b);
        assert_int_equal(truncate(p, (off_t)hn), 0);
        int rc, batches = 1;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            stoke_batch_release(b);
            batches++;
        }
        /* at most 2 workers x 2 prefetched + 2 batches were filled before the truncation */
        assert_true(batches < CH_ROWS / 2);
        assert_int_equal(rc, STOKE_EIO);
        const char *e = stoke_loader_last_error(l);
        if (!strstr(e, p) || !strstr(e, "file changed while loading") || !strstr(e, "sample "))
            fail_msg("io %d: %s", io, e);
        /* the worker, the file and the sample each named once */
        const char *s2 = strstr(strstr(e, "sample ") + 1, "sample ");
        if (strncmp(e, "worker ", 7) != 0 || s2 || strstr(strstr(e, p) + 1, p))
            fail_msg("io %d: named twice: %s", io, e);
        stoke_loader_destroy(l);
        stoke_dataset_close(&ds);
    }
    write_changing(good, 7);
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(good, NULL, &ds), STOKE_OK);
    stoke_loader *l = host_loader(&ds, 3, 2);
    unsigned char *data = malloc(CH_ROWS * CH_ROW);
    fill_pattern(data, CH_ROWS * CH_ROW, 7);
    unsigned char seen[CH_ROWS] = {0};
    stoke_batch *b;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        const uint64_t *idx = stoke_batch_indices(b);
        const unsigned char *mem = stoke_batch_data(b, 0);
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            assert_true(idx[j] < CH_ROWS && !seen[idx[j]]);
            seen[idx[j]] = 1;
            assert_memory_equal(mem + j * CH_ROW, data + idx[j] * CH_ROW, CH_ROW);
        }
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    for (int i = 0; i < CH_ROWS; i++)
        assert_int_equal(seen[i], 1);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    free(data);
    unlink(p);
    unlink(good);
}

/* ---- SIGBUS chaining, in a fresh child process (the guard is installed once per process) --- */

static const char *g_self; /* this executable, for the child runs */
static sigjmp_buf g_user_jb;
static volatile sig_atomic_t g_user_hits;
static const unsigned char *volatile g_user_lo;

static void user_sigbus(int sig, siginfo_t *si, void *uc)
{
    (void)sig, (void)uc;
    if (si->si_addr >= (const void *)g_user_lo && si->si_addr < (const void *)(g_user_lo + 8192)) {
        g_user_hits++;
        siglongjmp(g_user_jb, 1);
    }
    _exit(90); /* a SIGBUS the test did not expect */
}

/* A mapping of the child's own (not stoke's) whose file is then truncated: touching it faults. */
static const unsigned char *own_doomed_mapping(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0 || ftruncate(fd, 8192) != 0)
        _exit(80);
    void *m = mmap(NULL, 8192, PROT_READ, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED || ftruncate(fd, 0) != 0)
        _exit(81);
    close(fd);
    return m;
}

static int child_open_stoke(const char *npy, stoke_dataset *ds)
{
    if (stoke_npy_open(npy, NULL, ds) != STOKE_OK)
        return 0;
    unsigned char row[CH_ROW];
    void *dst[TU_FIELDS] = {row};
    char msg[256];
    return ds->get(ds->user, 1, dst, NULL, 0, msg, sizeof(msg)) == STOKE_OK;
}

/* argv: --sigbus-child MODE NPY SCRATCH.  Exit status: 0 = as expected. */
static int sigbus_child(const char *mode, const char *npy, const char *scratch)
{
    struct rlimit nocore = {0, 0};
    setrlimit(RLIMIT_CORE, &nocore);
    size_t hn = write_changing(npy, 8);
    stoke_dataset ds;
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sigemptyset(&sa.sa_mask);
    if (strcmp(mode, "handler") == 0) {
        /* A handler installed before stoke's still gets the SIGBUS faults that are not
         * stoke's, and stoke's guard still works afterwards. */
        sa.sa_sigaction = user_sigbus;
        sa.sa_flags = SA_SIGINFO;
        if (sigaction(SIGBUS, &sa, NULL) != 0)
            return 10;
        if (!child_open_stoke(npy, &ds))
            return 11;
        g_user_lo = own_doomed_mapping(scratch);
        if (sigsetjmp(g_user_jb, 1) == 0) {
            volatile unsigned char c = g_user_lo[100];
            (void)c;
            return 12; /* no fault at all */
        }
        if (g_user_hits != 1)
            return 13;
        if (truncate(npy, (off_t)hn) != 0)
            return 14;
        unsigned char row[CH_ROW];
        void *dst[TU_FIELDS] = {row};
        char msg[256] = "";
        if (ds.get(ds.user, 5, dst, NULL, 0, msg, sizeof(msg)) != STOKE_EIO ||
            !strstr(msg, "file changed while loading"))
            return 15;
        stoke_dataset_close(&ds);
        return g_user_hits == 1 ? 0 : 16;
    }
    if (strcmp(mode, "default") == 0 || strcmp(mode, "ignored") == 0) {
        /* Default before stoke: a foreign fault still ends the process by SIGBUS.  Ignored
         * before stoke: a sent SIGBUS stays ignored, a fault still ends the process. */
        sa.sa_handler = mode[0] == 'd' ? SIG_DFL : SIG_IGN;
        if (sigaction(SIGBUS, &sa, NULL) != 0)
            return 20;
        if (!child_open_stoke(npy, &ds))
            return 21;
        if (mode[0] == 'i' && raise(SIGBUS) != 0)
            return 22;
        const unsigned char *m = own_doomed_mapping(scratch);
        volatile unsigned char c = m[100];
        (void)c;
        return 23; /* survived a fault */
    }
    return 99;
}

static void run_sigbus_child(const char *mode, int want_status)
{
    char npy[512], scratch[512];
    snprintf(npy, sizeof(npy), "%s", tmp("child.npy"));
    snprintf(scratch, sizeof(scratch), "%s", tmp("child.scratch"));
    const char *argv[] = {g_self, "--sigbus-child", mode, npy, scratch, NULL};
    char out[4096], err[4096];
    int st = tu_run(argv, NULL, out, sizeof(out), err, sizeof(err));
    if (st != want_status)
        fail_msg("child %s: status %d, expected %d; stderr: %s", mode, st, want_status, err);
    unlink(npy);
    unlink(scratch);
}

static void test_sigbus_chains_to_previous_handler(void **state)
{
    run_sigbus_child("handler", 0);
}

static void test_sigbus_not_ours_keeps_default(void **state)
{
    run_sigbus_child("default", 128 + SIGBUS);
    run_sigbus_child("ignored", 128 + SIGBUS);
}

/* Writes `dp`, of shape (10, 0, 4) (10 samples of 0 bytes), and its labels `lp`, 10 i8 values
 * (also written to `labels`). */
static void write_zero_dim(const char *dp, const char *lp, int64_t labels[10])
{
    for (int i = 0; i < 10; i++)
        labels[i] = 100 + i * 7;
    write_npy(dp, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (10, 0, 4), }", NULL, 0);
    write_npy(lp, 1, "{'descr': '<i8', 'fortran_order': False, 'shape': (10,), }", labels,
              10 * sizeof(labels[0]));
}

/* A zero-length dimension: (10, 0, 4) is 10 samples of 0 bytes; labels still arrive. */
static void test_zero_length_dimension(void **state)
{
    const char *dp = tmp("zdim.npy"), *lp = tmp("zdim-labels.npy");
    int64_t labels[10];
    write_zero_dim(dp, lp, labels);
    for (int io = 0; io < 2; io++) {
        stoke_npy_opts o;
        stoke_npy_opts_init(&o);
        o.io = io;
        o.labels_path = lp;
        stoke_dataset ds;
        int rc = stoke_npy_open_opts(dp, &o, &ds);
        if (rc)
            fail_msg("%s", stoke_last_error());
        assert_int_equal(ds.length(ds.user), 10);
        assert_int_equal(ds.fields[0].bytes, 0);
        assert_int_equal(ds.fields[0].ndim, 2);
        assert_int_equal(ds.fields[0].shape[0], 0);
        assert_int_equal(ds.fields[0].shape[1], 4);
        for (uint64_t i = 0; i < 10; i++) {
            unsigned char canary[4] = {0xAA, 0xAA, 0xAA, 0xAA};
            int64_t lab = 0;
            void *dst[TU_FIELDS] = {canary, &lab};
            char msg[128] = "";
            assert_int_equal(ds.get(ds.user, i, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
            assert_int_equal(lab, labels[i]);
            assert_int_equal(canary[0], 0xAA); /* nothing written for 0 bytes */
        }
        stoke_dataset_close(&ds);
    }
    unlink(dp);
    unlink(lp);
}

/* Through the loader: 10 samples of 0 bytes are delivered with their labels. */
static void test_zero_length_dimension_loader(void **state)
{
    const char *dp = tmp("zdiml.npy"), *lp = tmp("zdiml-labels.npy");
    int64_t labels[10];
    write_zero_dim(dp, lp, labels);
    stoke_dataset ds;
    assert_int_equal(stoke_npy_open(dp, lp, &ds), STOKE_OK);
    for (int workers = 0; workers <= 2; workers += 2) {
        stoke_loader *l = host_loader(&ds, 3, workers);
        int rc;
        stoke_batch *b;
        uint64_t n = 0;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            assert_int_equal(stoke_batch_field_bytes(b, 0), 0);
            int64_t shape[TU_DIMS + 1];
            int ndim = 0;
            assert_int_equal(stoke_batch_shape(b, 0, shape, TU_DIMS + 1, &ndim), STOKE_OK);
            assert_int_equal(ndim, 3);
            assert_int_equal(shape[0], (int64_t)stoke_batch_count(b));
            assert_int_equal(shape[1], 0);
            assert_int_equal(shape[2], 4);
            const int64_t *lab = stoke_batch_data(b, 1);
            const uint64_t *idx = stoke_batch_indices(b);
            for (size_t j = 0; j < stoke_batch_count(b); j++, n++) {
                assert_int_equal(idx[j], n);
                assert_int_equal(lab[j], labels[n]);
            }
            stoke_batch_release(b);
        }
        assert_int_equal(rc, STOKE_EEND);
        assert_int_equal(n, 10);
        stoke_loader_destroy(l);
    }
    stoke_dataset_close(&ds);
    /* without labels a batch is 0 bytes: worker threads with the automatic prefetch sized
     * their window by dividing by it (SIGFPE) */
    assert_int_equal(stoke_npy_open(dp, NULL, &ds), STOKE_OK);
    stoke_loader *l = host_loader(&ds, 3, 2);
    stoke_batch *b;
    uint64_t n = 0;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_int_equal(stoke_batch_field_bytes(b, 0), 0);
        n += stoke_batch_count(b);
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    assert_int_equal(n, 10);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    unlink(dp);
    unlink(lp);
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "--sigbus-child") == 0)
        return sigbus_child(argv[2], argv[3], argv[4]);
    g_self = argv[0];
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
        cmocka_unit_test(test_fifo_refused),
        cmocka_unit_test(test_truncated_after_open),
        cmocka_unit_test(test_rewritten_in_place),
        cmocka_unit_test(test_loader_file_shrinks),
        cmocka_unit_test(test_sigbus_chains_to_previous_handler),
        cmocka_unit_test(test_sigbus_not_ours_keeps_default),
        cmocka_unit_test(test_zero_length_dimension),
        cmocka_unit_test(test_zero_length_dimension_loader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
