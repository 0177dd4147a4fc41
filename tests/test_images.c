/* The images: source and the JPEG decode/transform module (src/sources/image*.c), and the
 * dataset's set_epoch callback.
 *
 * Every JPEG is written here with libjpeg's compressor (baseline, progressive, grayscale,
 * Adobe CMYK, 4:4:4, odd and tiny sizes, a large one for DCT scaling).  Decoded outputs are
 * compared with a reference made the straightforward way: a full decode, then an area-averaging
 * resize of the crop box (a fractional box weighted by overlap), by the mean absolute error. */
#include "testutil.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/image.h"
#include "sources/image_internal.h"
#include "stoke/stoke.h"

#ifdef STOKE_TEST_HAVE_JPEG
#include <jpeglib.h>
#endif

/* ---- the set_epoch callback (any build) ---- */

typedef struct epoch_ds {
    uint64_t calls[16];
    int ncalls;
    int fail;
    uint64_t current;
} epoch_ds;

static uint64_t ep_length(void *user)
{
    return 10;
}

static int ep_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                  char *msg, size_t msg_len)
{
    epoch_ds *e = user;
    uint64_t v = e->current * 1000 + index;
    memcpy(dst[0], &v, 8);
    return STOKE_OK;
}

static int ep_set_epoch(void *user, uint64_t epoch)
{
    epoch_ds *e = user;
    if (e->ncalls < 16)
        e->calls[e->ncalls++] = epoch;
    e->current = epoch;
    return e->fail ? STOKE_EIO : STOKE_OK;
}

static void ep_dataset(stoke_dataset *ds, epoch_ds *e)
{
    stoke_dataset_init(ds);
    ds->kind = STOKE_DATASET_MAP;
    stoke__strlcpy(ds->name, "epochs", sizeof(ds->name));
    ds->user = e;
    ds->nfields = 1;
    stoke__strlcpy(TU_F(ds)[0].name, "data", sizeof(TU_F(ds)[0].name));
    TU_F(ds)[0].dtype = STOKE_DTYPE_U64;
    assert_int_equal(stoke_field_finish(&TU_F(ds)[0]), STOKE_OK);
    ds->length = ep_length;
    ds->get = ep_get;
    ds->set_epoch = ep_set_epoch;
}

/* First sample value of the next batch (epoch * 1000 + index). */
static uint64_t ep_first(stoke_loader *l)
{
    stoke_batch *b = NULL;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    uint64_t v;
    memcpy(&v, stoke_batch_data(b, 0), 8);
    stoke_batch_release(b);
    return v;
}

static void test_set_epoch_calls(void **state)
{
    for (int workers = 0; workers <= 2; workers++) {
        epoch_ds e = {{0}, 0, 0, 0};
        stoke_dataset ds;
        ep_dataset(&ds, &e);
        stoke_loader_opts o;
        stoke_loader_opts_init(&o);
        o.batch_size = 2;
        o.num_workers = workers;
        o.pin_memory = 0;
        o.epoch = 3;
        stoke_loader *l = NULL;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        assert_int_equal(e.ncalls, 1); /* before any sample */
        assert_int_equal(e.calls[0], 3);
        assert_int_equal(ep_first(l), 3000);
        assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
        assert_int_equal(e.ncalls, 2);
        assert_int_equal(e.calls[1], 4);
        assert_int_equal(ep_first(l), 4000);
        assert_int_equal(stoke_loader_set_epoch(l, 9), STOKE_OK);
        assert_int_equal(e.calls[2], 9);
        assert_int_equal(ep_first(l), 9000);
        e.fail = 1;
        assert_int_equal(stoke_loader_set_epoch(l, 10), STOKE_EIO);
        assert_non_null(strstr(stoke_last_error(), "set_epoch"));
        stoke_loader_destroy(l);
    }
    /* a failing set_epoch fails create with its code */
    epoch_ds e = {{0}, 0, 1, 0};
    stoke_dataset ds;
    ep_dataset(&ds, &e);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.pin_memory = 0;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EIO);
    assert_null(l);
    assert_non_null(strstr(stoke_last_error(), "set_epoch(0) of dataset epochs failed"));
    /* a dataset whose size tag is not this library's is refused, never called */
    e.fail = 0;
    ds.size = (uint32_t)offsetof(stoke_dataset, set_epoch);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_null(l);
    assert_non_null(strstr(stoke_last_error(), "built against another version"));
    assert_int_equal(e.ncalls, 1); /* only the failed create above */
}

#ifndef STOKE_TEST_HAVE_JPEG

static void test_not_supported(void **state)
{
    stoke_dataset ds;
    assert_int_equal(stoke_images_open(".", NULL, &ds), STOKE_ENOTSUP);
    assert_non_null(strstr(stoke_last_error(), "libjpeg"));
    tu_skip("built without libjpeg-turbo: the JPEG checks need it");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_epoch_calls),
        cmocka_unit_test(test_not_supported),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}

#else

/* ---- scratch tree and test images ---- */

static char g_root[512]; /* this run's scratch directory, removed at the end */

static const char *path_in(char *buf, size_t len, const char *rel)
{
    stoke__fmt(buf, len, "%s/%s", g_root, rel);
    return buf;
}

static void mkdirs(const char *rel)
{
    char p[1024];
    path_in(p, sizeof(p), rel);
    for (char *c = p + strlen(g_root) + 1; *c; c++)
        if (*c == '/') {
            *c = 0;
            mkdir(p, 0755);
            *c = '/';
        }
    if (mkdir(p, 0755) != 0 && errno != EEXIST)
        fail_msg("mkdir %s: %s", p, strerror(errno));
}

static void write_bytes(const char *rel, const void *data, size_t len)
{
    char p[1024];
    FILE *f = fopen(path_in(p, sizeof(p), rel), "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
}

static unsigned char *read_bytes(const char *rel, size_t *len)
{
    char p[1024];
    FILE *f = fopen(path_in(p, sizeof(p), rel), "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = malloc((size_t)n + 1);
    assert_non_null(b);
    assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* K_H2V1 .. K_H2V4: the luma's blocks per MCU (4:2:2, 4:1:0, and 2x4), with noise in every
 * channel, so that a chroma sample taken from the wrong column shows */
enum kind { K_BASELINE, K_PROGRESSIVE, K_GRAY, K_CMYK, K_444, K_H2V1, K_H4V2, K_H2V4 };
#define CMYK_K 191 /* the stored (Adobe-inverted) K of the CMYK test image */

/* A smooth pattern with features in proportion to the image (so the reference's area filter
 * and the decoder's triangle filter agree closely), asymmetric in x and y. */
static unsigned char pattern(int x, int y, int W, int H, int c)
{
    const double u = (x + 0.5) / W, v = (y + 0.5) / H, tau = 6.283185307179586;
    double r;
    if (c == 0)
        r = 30 + 190 * u + 25 * sin(tau * 2 * v);
    else if (c == 1)
        r = 30 + 190 * v + 25 * sin(tau * 2 * u);
    else
        r = 128 + 90 * sin(tau * 1.5 * (u + v));
    return (unsigned char)(r < 0 ? 0 : r > 255 ? 255 : lround(r));
}

static void write_jpeg(const char *rel, int W, int H, enum kind k, int quality)
{
    char p[1024];
    FILE *f = fopen(path_in(p, sizeof(p), rel), "wb");
    assert_non_null(f);
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    jpeg_stdio_dest(&ci, f);
    ci.image_width = (JDIMENSION)W;
    ci.image_height = (JDIMENSION)H;
    ci.input_components = k == K_GRAY ? 1 : k == K_CMYK ? 4 : 3;
    ci.in_color_space = k == K_GRAY ? JCS_GRAYSCALE : k == K_CMYK ? JCS_CMYK : JCS_RGB;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, quality, TRUE);
    if (k == K_PROGRESSIVE)
        jpeg_simple_progression(&ci);
    if (k == K_444)
        ci.comp_info[0].h_samp_factor = ci.comp_info[0].v_samp_factor = 1;
    const int noisy = k == K_H2V1 || k == K_H4V2 || k == K_H2V4;
    if (noisy) {
        ci.comp_info[0].h_samp_factor = k == K_H4V2 ? 4 : 2;
        ci.comp_info[0].v_samp_factor = k == K_H2V1 ? 1 : k == K_H4V2 ? 2 : 4;
    }
    jpeg_start_compress(&ci, TRUE);
    const int nc = ci.input_components;
    unsigned char *row = malloc((size_t)W * (size_t)nc);
    assert_non_null(row);
    for (int y = 0; y < H; y++) {
        for (int x = 0; x < W; x++)
            for (int c = 0; c < nc; c++) {
                int v = k == K_GRAY ? pattern(x, y, W, H, 0)
                        : c == 3    ? CMYK_K /* Adobe: stored inverted */
                                    : pattern(x, y, W, H, c);
                if (noisy) /* +-48, a hash of (x, y, c) */
                    v += (int)((((uint32_t)x * 73856093u) ^ ((uint32_t)y * 19349663u) ^
                                ((uint32_t)c * 83492791u)) *
                                   2654435761u >>
                               25) -
                         64;
                row[x * nc + c] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        JSAMPROW r = row;
        jpeg_write_scanlines(&ci, &r, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    free(row);
    fclose(f);
}

/* The straightforward full decode: W x H RGB. */
static unsigned char *ref_decode(const unsigned char *data, size_t len, int *W, int *H)
{
    struct jpeg_decompress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, data, (unsigned long)len);
    jpeg_read_header(&ci, TRUE);
    int cmyk = ci.jpeg_color_space == JCS_CMYK || ci.jpeg_color_space == JCS_YCCK;
    ci.out_color_space = cmyk                                   ? JCS_CMYK
                         : ci.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE
                                                                : JCS_RGB;
    jpeg_start_decompress(&ci);
    *W = (int)ci.output_width, *H = (int)ci.output_height;
    const int nc = ci.output_components;
    unsigned char *rgb = malloc((size_t)*W * (size_t)*H * 3), *row = malloc((size_t)*W * 4);
    assert_non_null(rgb);
    assert_non_null(row);
    for (int y = 0; y < *H; y++) {
        JSAMPROW r = row;
        jpeg_read_scanlines(&ci, &r, 1);
        for (int x = 0; x < *W; x++)
            for (int c = 0; c < 3; c++) {
                unsigned v = row[x * nc + (nc == 1 ? 0 : c)];
                if (cmyk) /* Adobe inverted: 255 is no ink */
                    v = (v * row[x * nc + 3] + 127) / 255;
                rgb[((size_t)y * (size_t)*W + (size_t)x) * 3 + (size_t)c] = (unsigned char)v;
            }
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
    free(row);
    return rgb;
}

/* Overlap of [a0, a1) with pixel [p, p + 1). */
static double overlap(double a0, double a1, int p)
{
    double lo = a0 > p ? a0 : p, hi = a1 < p + 1 ? a1 : p + 1;
    return hi > lo ? hi - lo : 0;
}

/* Area-averaging resize of the box (bx, by, bw, bh) of rgb to S x S (HWC doubles), mirrored
 * when flip.  A box narrower than a pixel takes the pixel under it. */
static double *ref_resize(const unsigned char *rgb, int W, int H, double bx, double by, double bw,
                          double bh, int S, int flip)
{
    double *out = calloc((size_t)S * (size_t)S * 3, sizeof(double));
    assert_non_null(out);
    for (int oy = 0; oy < S; oy++) {
        double y0 = by + oy * bh / S, y1 = by + (oy + 1) * bh / S;
        for (int ox = 0; ox < S; ox++) {
            double x0 = bx + ox * bw / S, x1 = bx + (ox + 1) * bw / S, sum[3] = {0}, wsum = 0;
            for (int y = (int)floor(y0); y < (int)ceil(y1) && y < H; y++)
                for (int x = (int)floor(x0); x < (int)ceil(x1) && x < W; x++) {
                    double w = overlap(y0, y1, y) * overlap(x0, x1, x);
                    for (int c = 0; c < 3; c++)
                        sum[c] += w * rgb[((size_t)y * (size_t)W + (size_t)x) * 3 + (size_t)c];
                    wsum += w;
                }
            int tx = flip ? S - 1 - ox : ox;
            for (int c = 0; c < 3; c++)
                out[((size_t)oy * (size_t)S + (size_t)tx) * 3 + (size_t)c] = sum[c] / wsum;
        }
    }
    return out;
}

/* Mean absolute error of u8 output (CHW or HWC) against the HWC reference. */
static double mae(const unsigned char *got, int chw, const double *ref, int S)
{
    double e = 0;
    const size_t n = (size_t)S * (size_t)S;
    for (size_t i = 0; i < n; i++)
        for (size_t c = 0; c < 3; c++)
            e += fabs((chw ? got[c * n + i] : got[i * 3 + c]) - ref[i * 3 + c]);
    return e / (double)(n * 3);
}

/* The eval box, computed here from torchvision's definition: Resize(S / 0.875) of the short
 * side (long side truncated), CenterCrop(S). */
static void eval_box(int W, int H, int S, double box[4])
{
    int s = (int)(S / 0.875), rw, rh;
    if (W <= H)
        rw = s, rh = (int)((double)s * H / W);
    else
        rh = s, rw = (int)((double)s * W / H);
    /* CenterCrop's offsets: Python's round() of half the margin, halves to even */
    int mx = rw - S, my = rh - S;
    double left = mx / 2 + (mx % 2 && (mx / 2) % 2), top = my / 2 + (my % 2 && (my / 2) % 2);
    box[0] = left * W / rw, box[1] = top * H / rh;
    box[2] = (double)S * W / rw, box[3] = (double)S * H / rh;
}

static void decode_ok(const stoke__image_opts *o, const unsigned char *jpg, size_t len,
                      uint64_t epoch, uint64_t index, void *dst)
{
    char msg[256] = "";
    int rc = stoke__image_decode(o, jpg, len, epoch, index, dst, msg, sizeof(msg));
    if (rc)
        fail_msg("decode: %s: %s", stoke_err_name(rc), msg);
}

/* ---- decode vs reference ---- */

typedef struct case_ {
    const char *name;
    int W, H;
    enum kind k;
} case_;

static const case_ CASES[] = {
    {"baseline.jpg", 400, 300, K_BASELINE},
    {"progressive.jpg", 333, 517, K_PROGRESSIVE},
    {"gray.jpg", 250, 190, K_GRAY},
    {"cmyk.jpg", 160, 120, K_CMYK},
    {"odd444.jpg", 97, 61, K_444},
    {"large.jpg", 1500, 1000, K_BASELINE},
    {"large_prog.jpg", 1000, 1500, K_PROGRESSIVE},
};

static void write_cases(void)
{
    mkdirs("cases");
    for (size_t i = 0; i < STOKE__ARRAY_LEN(CASES); i++) {
        char rel[256];
        stoke__fmt(rel, sizeof(rel), "cases/%s", CASES[i].name);
        write_jpeg(rel, CASES[i].W, CASES[i].H, CASES[i].k, 95);
    }
}

#define MAE_MAX 1.5

static void test_eval_matches_reference(void **state)
{
    write_cases();
    const int sizes[] = {64, 224};
    for (size_t i = 0; i < STOKE__ARRAY_LEN(CASES); i++)
        for (size_t s = 0; s < 2; s++) {
            char rel[256];
            size_t len;
            stoke__fmt(rel, sizeof(rel), "cases/%s", CASES[i].name);
            unsigned char *jpg = read_bytes(rel, &len);
            int W, H;
            unsigned char *full = ref_decode(jpg, len, &W, &H);
            stoke__image_opts o;
            stoke__image_opts_init(&o);
            o.size = sizes[s];
            double box[4];
            eval_box(W, H, o.size, box);
            double *ref = ref_resize(full, W, H, box[0], box[1], box[2], box[3], o.size, 0);
            unsigned char *got = malloc((size_t)o.size * (size_t)o.size * 3);
            assert_non_null(got);
            decode_ok(&o, jpg, len, 0, 7, got);
            double e = mae(got, 1, ref, o.size);
            if (getenv("TEST_IMAGES_VERBOSE"))
                printf("eval %s size %d: MAE %.3f\n", CASES[i].name, o.size, e);
            if (e > MAE_MAX)
                fail_msg("%s size %d: MAE %.3f vs reference > %.1f", CASES[i].name, o.size, e,
                         MAE_MAX);
            /* the check can fail: the mirror image is far from the reference */
            double *mirror = ref_resize(full, W, H, box[0], box[1], box[2], box[3], o.size, 1);
            assert_true(mae(got, 1, mirror, o.size) > 4 * MAE_MAX);
            free(mirror);
            free(ref);
            free(got);
            free(full);
            free(jpg);
        }
}

/* The eval box of the commonest photo shapes, where the center crop's margin is odd (Resize(256)
 * of 500x375 is 341x256: 117 columns to share): torchvision's round() keeps 58 on the left. */
static void test_eval_center_rounding(void **state)
{
    stoke__image_opts o;
    stoke__image_opts_init(&o);
    const struct {
        int W, H, left, top, rw, rh;
    } cases[] = {{500, 375, 58, 16, 341, 256}, {375, 500, 16, 58, 256, 341},
                 {640, 480, 58, 16, 341, 256}, {500, 333, 80, 16, 384, 256},
                 {341, 256, 58, 16, 341, 256}, {343, 256, 60, 16, 343, 256}};
    for (size_t i = 0; i < STOKE__ARRAY_LEN(cases); i++) {
        stoke__image_crop c = stoke__image_crop_for(&o, cases[i].W, cases[i].H, 0, 0);
        assert_true(fabs(c.x - (double)cases[i].left * cases[i].W / cases[i].rw) < 1e-9);
        assert_true(fabs(c.y - (double)cases[i].top * cases[i].H / cases[i].rh) < 1e-9);
        assert_true(fabs(c.w - 224.0 * cases[i].W / cases[i].rw) < 1e-9);
    }
}

/* Decoding only the crop's columns (jpeg_crop_scanline) gives the bytes of a full-width decode,
 * for every chroma subsampling and DCT scale: no chroma repeated at the crop's edges (4:2:0,
 * 4:2:2), and none of libjpeg-turbo's wrong columns at 4:1:0 and luma 2x4 when scaled. */
static void test_crop_equals_full_width(void **state)
{
    mkdirs("sampling");
    const enum kind kinds[] = {K_BASELINE, K_H2V1, K_H4V2, K_H2V4, K_444, K_PROGRESSIVE};
    const int sizes[] = {48, 160};
    unsigned char *a = malloc(160 * 160 * 3), *b = malloc(160 * 160 * 3);
    assert_non_null(a);
    assert_non_null(b);
    int scales[9] = {0};
    for (size_t k = 0; k < STOKE__ARRAY_LEN(kinds); k++) {
        write_jpeg("sampling/s.jpg", 600, 450, kinds[k], 92);
        size_t len;
        unsigned char *jpg = read_bytes("sampling/s.jpg", &len);
        for (size_t s = 0; s < STOKE__ARRAY_LEN(sizes); s++)
            for (int train = 0; train <= 1; train++)
                for (uint64_t idx = 0; idx < (train ? 24u : 1u); idx++) {
                    stoke__image_opts o;
                    stoke__image_opts_init(&o);
                    o.size = sizes[s];
                    o.train = train;
                    o.seed = 5;
                    const size_t n = (size_t)o.size * (size_t)o.size * 3;
                    decode_ok(&o, jpg, len, 1, idx, a);
                    o.full_width = 1;
                    decode_ok(&o, jpg, len, 1, idx, b);
                    if (memcmp(a, b, n) != 0) {
                        size_t at = 0;
                        while (a[at] == b[at])
                            at++;
                        fail_msg("kind %d size %d %s index %llu: the cropped decode differs "
                                 "from the full width's at byte %zu (%d vs %d)",
                                 (int)kinds[k], o.size, train ? "train" : "eval",
                                 (unsigned long long)idx, at, a[at], b[at]);
                    }
                    stoke__image_crop c = stoke__image_crop_for(&o, 600, 450, 1, idx);
                    for (int m = 1; m <= 8; m *= 2) /* the scale dct_scale picks */
                        if ((c.w * m / 8 >= o.size && c.h * m / 8 >= o.size) || m == 8) {
                            scales[m]++;
                            break;
                        }
                }
        free(jpg);
    }
    /* the crops covered every DCT scale */
    assert_true(scales[1] > 0 && scales[2] > 0 && scales[4] > 0 && scales[8] > 0);
    free(a);
    free(b);
}

/* Train crops (RandomResizedCrop + flip, decoded through crop/skip/DCT scaling) against the
 * reference of the same box. */
static void test_train_matches_reference(void **state)
{
    write_cases();
    int flips[2] = {0, 0}, small = 0, big = 0;
    for (size_t i = 0; i < STOKE__ARRAY_LEN(CASES); i++) {
        char rel[256];
        size_t len;
        stoke__fmt(rel, sizeof(rel), "cases/%s", CASES[i].name);
        unsigned char *jpg = read_bytes(rel, &len);
        int W, H;
        unsigned char *full = ref_decode(jpg, len, &W, &H);
        stoke__image_opts o;
        stoke__image_opts_init(&o);
        o.size = 64;
        o.train = 1;
        o.seed = 11;
        unsigned char got[64 * 64 * 3];
        for (uint64_t idx = 0; idx < 12; idx++) {
            uint64_t epoch = idx % 3;
            stoke__image_crop c = stoke__image_crop_for(&o, W, H, epoch, idx);
            /* RandomResizedCrop's box: whole pixels, inside the image, 8%..100% of the area,
             * aspect ratio 3/4..4/3 (or the clamped center crop) */
            assert_true(c.x == floor(c.x) && c.w == floor(c.w) && c.w >= 1 && c.h >= 1);
            assert_true(c.x >= 0 && c.y >= 0 && c.x + c.w <= W && c.y + c.h <= H);
            double frac = c.w * c.h / ((double)W * H), ar = c.w / c.h;
            assert_true(frac >= 0.07 && frac <= 1.0 && ar > 0.74 && ar < 1.34);
            flips[c.flip]++;
            small += frac < 0.3;
            big += frac > 0.6;
            decode_ok(&o, jpg, len, epoch, idx, got);
            double *ref = ref_resize(full, W, H, c.x, c.y, c.w, c.h, o.size, c.flip);
            double e = mae(got, 1, ref, o.size);
            if (getenv("TEST_IMAGES_VERBOSE"))
                printf("train %s index %llu: %gx%g at %g,%g flip %d: MAE %.3f\n", CASES[i].name,
                       (unsigned long long)idx, c.w, c.h, c.x, c.y, c.flip, e);
            if (e > MAE_MAX)
                fail_msg("%s index %llu: crop %gx%g at %g,%g flip %d: MAE %.3f > %.1f",
                         CASES[i].name, (unsigned long long)idx, c.w, c.h, c.x, c.y, c.flip, e,
                         MAE_MAX);
            free(ref);
            unsigned char again[64 * 64 * 3];
            decode_ok(&o, jpg, len, epoch, idx, again);
            assert_memory_equal(got, again, sizeof(got));
        }
        free(full);
        free(jpg);
    }
    assert_true(flips[0] > 10 && flips[1] > 10);
    assert_true(small > 5 && big > 5);
}

/* 1x1 (train and eval: a constant image of its pixel), 1x9 and 9x1. */
static void test_tiny(void **state)
{
    mkdirs("tiny");
    const int dims[][2] = {{1, 1}, {1, 9}, {9, 1}, {2, 3}};
    for (size_t d = 0; d < STOKE__ARRAY_LEN(dims); d++)
        for (int train = 0; train <= 1; train++) {
            write_jpeg("tiny/t.jpg", dims[d][0], dims[d][1], K_BASELINE, 90);
            size_t len;
            unsigned char *jpg = read_bytes("tiny/t.jpg", &len);
            int W, H;
            unsigned char *full = ref_decode(jpg, len, &W, &H);
            stoke__image_opts o;
            stoke__image_opts_init(&o);
            o.size = 16;
            o.train = train;
            o.chw = 0;
            unsigned char got[16 * 16 * 3];
            decode_ok(&o, jpg, len, 0, 3, got);
            if (W == 1 && H == 1)
                for (size_t i = 0; i < sizeof(got); i++)
                    assert_int_equal(got[i], full[i % 3]);
            free(full);
            free(jpg);
        }
}

/* HWC is the transpose of CHW; f32 is u8 / 255, normalized as (v / 255 - mean) / std. */
static void test_layouts_and_dtypes(void **state)
{
    write_cases();
    size_t len;
    unsigned char *jpg = read_bytes("cases/baseline.jpg", &len);
    enum { S = 48, N = S * S };
    stoke__image_opts o;
    stoke__image_opts_init(&o);
    o.size = S;
    o.train = 1;
    o.seed = 5;
    static unsigned char chw[3 * N], hwc[3 * N];
    static float f[3 * N], fn[3 * N], fh[3 * N];
    decode_ok(&o, jpg, len, 2, 9, chw);
    o.chw = 0;
    decode_ok(&o, jpg, len, 2, 9, hwc);
    o.dtype = STOKE_DTYPE_F32;
    decode_ok(&o, jpg, len, 2, 9, fh);
    o.chw = 1;
    decode_ok(&o, jpg, len, 2, 9, f);
    const float mean[3] = {0.485f, 0.456f, 0.406f}, sd[3] = {0.229f, 0.224f, 0.225f};
    char msg[128];
    assert_int_equal(stoke__image_parse_opt(&o, "mean", "0.485:0.456:0.406", msg, sizeof(msg)), 1);
    assert_int_equal(stoke__image_parse_opt(&o, "std", "0.229:0.224:0.225", msg, sizeof(msg)), 1);
    decode_ok(&o, jpg, len, 2, 9, fn);
    int varied = 0;
    for (int c = 0; c < 3; c++)
        for (int i = 0; i < N; i++) {
            unsigned char v = chw[c * N + i];
            assert_int_equal(hwc[i * 3 + c], v);
            assert_true(fabsf(f[c * N + i] - v / 255.0f) < 1e-6f);
            assert_true(fabsf(fh[i * 3 + c] - v / 255.0f) < 1e-6f);
            assert_true(fabsf(fn[c * N + i] - (v / 255.0f - mean[c]) / sd[c]) < 1e-5f);
            varied += v != chw[0];
        }
    assert_true(varied > N);
    free(jpg);
}

/* Under ThreadSanitizer a third of the crops: the test runs one thread, where TSan has nothing
 * to look at and the instrumented resampler is ~10x slower (37 s of test_images' 57 there, run
 * four times in CI); ASan and the plain build run them all. */
#ifdef __SANITIZE_THREAD__
#define KERNEL_CROPS 1
#else
#define KERNEL_CROPS 3
#endif

/* The AVX2 kernels (where this CPU has them) and the portable ones give the same bytes: sizes
 * that are and are not multiples of the kernels' groups (8 pixels, 32 bytes), shrinking and
 * enlarging (tiny and large images), every layout and dtype, flips (train), CMYK and gray. */
static void test_kernels_agree(void **state)
{
    write_cases();
    const int sizes[] = {1, 13, 61, 224};
    enum { SMAX = 224 * 224 * 3 };
    float *a = malloc(SMAX * sizeof(float)), *b = malloc(SMAX * sizeof(float));
    assert_non_null(a);
    assert_non_null(b);
    int differ = 0;
    for (size_t i = 0; i < STOKE__ARRAY_LEN(CASES); i++) {
        char rel[256];
        size_t len;
        stoke__fmt(rel, sizeof(rel), "cases/%s", CASES[i].name);
        unsigned char *jpg = read_bytes(rel, &len);
        for (size_t s = 0; s < STOKE__ARRAY_LEN(sizes); s++)
            for (int v = 0; v < 8; v++) {
                stoke__image_opts o;
                stoke__image_opts_init(&o);
                o.size = sizes[s];
                o.train = v & 1;
                o.chw = (v >> 1) & 1;
                o.dtype = v & 4 ? STOKE_DTYPE_F32 : STOKE_DTYPE_U8;
                o.seed = 3;
                const size_t bytes = (size_t)o.size * (size_t)o.size * 3 * (v & 4 ? 4 : 1);
                for (uint64_t idx = 0; idx < KERNEL_CROPS; idx++) {
                    memset(a, 0xA5, bytes);
                    memset(b, 0x5A, bytes);
                    o.kernel = STOKE__RS_AUTO;
                    decode_ok(&o, jpg, len, 0, idx, a);
                    o.kernel = STOKE__RS_SCALAR;
                    decode_ok(&o, jpg, len, 0, idx, b);
                    if (memcmp(a, b, bytes) != 0)
                        fail_msg("%s size %d variant %d index %llu: the kernels differ",
                                 CASES[i].name, o.size, v, (unsigned long long)idx);
                    differ += memcmp(a, b, bytes) != 0;
                }
            }
        free(jpg);
    }
    assert_int_equal(differ, 0);
    free(a);
    free(b);
}

/* decode_only (the probe of bench/bench_decode.c) decodes and writes nothing; a corrupt file
 * still fails. */
static void test_decode_only(void **state)
{
    write_cases();
    size_t len;
    unsigned char *jpg = read_bytes("cases/large.jpg", &len);
    stoke__image_opts o;
    stoke__image_opts_init(&o);
    o.train = 1;
    o.decode_only = 1;
    static unsigned char dst[224 * 224 * 3];
    memset(dst, 0x77, sizeof(dst));
    for (uint64_t idx = 0; idx < 4; idx++)
        decode_ok(&o, jpg, len, 0, idx, dst);
    for (size_t i = 0; i < sizeof(dst); i++)
        assert_int_equal(dst[i], 0x77);
    char msg[256] = "";
    assert_int_equal(stoke__image_decode(&o, jpg, len / 3, 0, 0, dst, msg, sizeof(msg)),
                     STOKE_EFORMAT);
    free(jpg);
}

/* Seeded corruptions of valid files (bytes changed, cut short, a marker's length broken): each
 * decode succeeds or fails with STOKE_EFORMAT / STOKE_ELIMIT and a message; never a crash, an
 * exit() or (under the sanitizers) a bad access. */
static void test_corruptions(void **state)
{
    write_cases();
    const char *files[] = {"cases/baseline.jpg", "cases/progressive.jpg", "cases/cmyk.jpg",
                           "cases/gray.jpg"};
    uint64_t r = 0x1234567;
    int failed = 0, ok = 0;
    for (size_t f = 0; f < STOKE__ARRAY_LEN(files); f++) {
        size_t len;
        unsigned char *orig = read_bytes(files[f], &len);
        unsigned char *buf = malloc(len);
        assert_non_null(buf);
        for (int k = 0; k < 60; k++) {
            memcpy(buf, orig, len);
            size_t n = len;
            int edits = 1 + k % 4;
            for (int e = 0; e < edits; e++) {
                r = r * 6364136223846793005ull + 1442695040888963407ull;
                size_t at = 2 + (size_t)(r >> 33) % (len - 2);
                if (k % 7 == 6)
                    n = at; /* cut */
                else
                    buf[at] ^= (unsigned char)(1 + (r >> 20) % 255);
            }
            stoke__image_opts o;
            stoke__image_opts_init(&o);
            o.size = 32;
            o.train = k % 2;
            unsigned char out[32 * 32 * 3];
            char msg[256] = "";
            int rc = stoke__image_decode(&o, buf, n, 0, (uint64_t)k, out, msg, sizeof(msg));
            if (rc == STOKE_OK) {
                ok++;
                continue;
            }
            if (rc != STOKE_EFORMAT && rc != STOKE_ELIMIT && rc != STOKE_ENOTSUP)
                fail_msg("%s edit %d: %s '%s'", files[f], k, stoke_err_name(rc), msg);
            assert_true(msg[0] != 0);
            failed++;
        }
        free(buf);
        free(orig);
    }
    assert_true(failed > 20); /* the corruptions are seen */
    assert_true(ok + failed == 240);
}

/* A well-formed JPEG libjpeg-turbo's 8-bit decoder cannot take is STOKE_ENOTSUP, "unsupported
 * JPEG", not a corrupt one: 12-bit samples (SOF0's precision byte) and the lossless process
 * (SOF3). */
static void test_unsupported_jpeg(void **state)
{
    write_cases();
    size_t len;
    unsigned char *orig = read_bytes("cases/baseline.jpg", &len);
    size_t sof = 0;
    for (size_t i = 2; i + 4 < len && !sof; i++)
        if (orig[i] == 0xff && orig[i + 1] == 0xc0)
            sof = i;
    assert_true(sof > 0);
    for (int k = 0; k < 2; k++) {
        unsigned char *buf = malloc(len);
        assert_non_null(buf);
        memcpy(buf, orig, len);
        if (k == 0)
            buf[sof + 4] = 12; /* the sample precision, after the marker and the length */
        else
            buf[sof + 1] = 0xc3;
        stoke__image_opts o;
        stoke__image_opts_init(&o);
        o.size = 32;
        unsigned char out[32 * 32 * 3];
        char msg[256] = "";
        assert_int_equal(stoke__image_decode(&o, buf, len, 0, 0, out, msg, sizeof(msg)),
                         STOKE_ENOTSUP);
        assert_non_null(strstr(msg, "unsupported JPEG: "));
        assert_non_null(strstr(msg, k == 0 ? "precision 12" : "SOF type 0xc3"));
        free(buf);
    }
    free(orig);
}

static void test_options(void **state)
{
    stoke__image_opts o;
    stoke__image_opts_init(&o);
    assert_int_equal(o.size, 224);
    assert_int_equal(o.train, 0);
    assert_int_equal(o.chw, 1);
    assert_int_equal(o.dtype, STOKE_DTYPE_U8);
    char msg[128] = "";
    assert_int_equal(stoke__image_parse_opt(&o, "train", NULL, msg, sizeof(msg)), 1);
    assert_int_equal(o.train, 1);
    assert_int_equal(stoke__image_parse_opt(&o, "train", NULL, msg, sizeof(msg)), 1);
    assert_int_equal(stoke__image_parse_opt(&o, "eval", NULL, msg, sizeof(msg)), STOKE_EINVAL);
    assert_string_equal(msg, "'train' and 'eval' are alternatives: give one");
    stoke__image_opts_init(&o);
    assert_int_equal(stoke__image_parse_opt(&o, "eval", NULL, msg, sizeof(msg)), 1);
    assert_int_equal(o.train, 0);
    assert_int_equal(stoke__image_parse_opt(&o, "size", "96", msg, sizeof(msg)), 1);
    assert_int_equal(o.size, 96);
    assert_int_equal(stoke__image_parse_opt(&o, "layout", "hwc", msg, sizeof(msg)), 1);
    assert_int_equal(o.chw, 0);
    assert_int_equal(stoke__image_parse_opt(&o, "seed", "123", msg, sizeof(msg)), 1);
    assert_int_equal(o.seed, 123);
    assert_int_equal(o.max_decode, (uint64_t)256 << 20);
    assert_int_equal(stoke__image_parse_opt(&o, "max_decode_bytes", "64M", msg, sizeof(msg)), 1);
    assert_int_equal(o.max_decode, (uint64_t)64 << 20);
    assert_int_equal(stoke__image_parse_opt(&o, "io", "mmap", msg, sizeof(msg)), 0);
    assert_int_equal(stoke__image_parse_opt(&o, "labels", "x", msg, sizeof(msg)), 0);
    const char *bad[][2] = {{"size", "0"},
                            {"size", "x"},
                            {"size", "9000"},
                            {"layout", "chwx"},
                            {"dtype", "f16"},
                            {"mean", "1:2"},
                            {"std", "1:0:1"},
                            {"mean", "1:2:3:4"},
                            {"train", "1"},
                            {"size", NULL},
                            {"seed", "-1"},
                            {"max_decode_bytes", "512K"},
                            {"max_decode_bytes", "x"}};
    for (size_t k = 0; k < STOKE__ARRAY_LEN(bad); k++) {
        msg[0] = 0;
        assert_int_equal(stoke__image_parse_opt(&o, bad[k][0], bad[k][1], msg, sizeof(msg)),
                         STOKE_EINVAL);
        assert_true(msg[0] != 0);
    }
    stoke_field f;
    int64_t fshape[3];
    stoke__image_opts_init(&o);
    assert_int_equal(stoke__image_field(&o, &f, fshape), STOKE_OK);
    assert_string_equal(f.name, "data");
    assert_int_equal(f.ndim, 3);
    assert_int_equal(f.shape[0], 3);
    assert_int_equal(f.shape[1], 224);
    assert_int_equal(f.bytes, 3 * 224 * 224);
    o.chw = 0, o.dtype = STOKE_DTYPE_F32, o.size = 10;
    assert_int_equal(stoke__image_field(&o, &f, fshape), STOKE_OK);
    assert_int_equal(f.shape[2], 3);
    assert_int_equal(f.bytes, 4 * 3 * 100);
    o.dtype = STOKE_DTYPE_U8, o.normalize = 1;
    assert_int_equal(stoke__image_field(&o, &f, fshape), STOKE_EINVAL);
}

/* ---- the folder source ---- */

/* root/{bee,ant,cat-2,cat}: odd names, extension cases, a nested directory, ignored files. */
static void write_tree(const char *root)
{
    char rel[256];
    const char *files[] = {"bee/b2.JPG", "bee/a1.jpeg", "ant/z.jpg",  "ant/sub/a.jpg",
                           "ant/A.Jpg",  "cat/x.jpg",   "cat-2/y.jpg"};
    stoke__fmt(rel, sizeof(rel), "%s/ant/sub", root);
    mkdirs(rel);
    for (size_t k = 0; k < STOKE__ARRAY_LEN(files); k++) {
        stoke__fmt(rel, sizeof(rel), "%s/%s", root, files[k]);
        char *slash = strrchr(rel, '/');
        *slash = 0;
        mkdirs(rel);
        *slash = '/';
        write_jpeg(rel, 40 + 8 * (int)k, 30 + 4 * (int)k, k % 2 ? K_PROGRESSIVE : K_BASELINE, 90);
    }
    stoke__fmt(rel, sizeof(rel), "%s/bee/notes.txt", root);
    write_bytes(rel, "hello", 5);
    stoke__fmt(rel, sizeof(rel), "%s/bee/pic.png", root);
    write_bytes(rel, "\x89PNG\r\n\x1a\n0000", 12);
    stoke__fmt(rel, sizeof(rel), "%s/stray.jpg", root); /* not in a class: ignored */
    write_bytes(rel, "x", 1);
}

static void open_dir(const char *rel_root, const char *opts, stoke_dataset *ds)
{
    char spec[1024];
    stoke__fmt(spec, sizeof(spec), "images:%s/%s%s", g_root, rel_root, opts);
    int rc = stoke_source_open(spec, ds);
    if (rc)
        fail_msg("%s: %s %s", spec, stoke_err_name(rc), stoke_last_error());
}

static void test_folder_order_and_labels(void **state)
{
    write_tree("tree");
    tu_log_capture();
    stoke_dataset ds;
    open_dir("tree", ",size=32", &ds);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "1 files with other image extensions"), 1);
    assert_int_equal(ds.kind, STOKE_DATASET_MAP);
    assert_int_equal(ds.nfields, 2);
    assert_string_equal(ds.fields[1].name, "label");
    assert_int_equal(ds.fields[1].dtype, STOKE_DTYPE_I64); /* torchvision's targets */
    assert_int_equal(ds.fields[1].ndim, 0);
    assert_int_equal(ds.fields[0].shape[0], 3);
    assert_int_equal(ds.fields[0].shape[1], 32);
    assert_int_equal(ds.length(ds.user), 7);
    assert_int_equal(stoke_images_num_classes(&ds), 4);
    const char *classes[] = {"ant", "bee", "cat", "cat-2"};
    for (uint32_t c = 0; c < 4; c++)
        assert_string_equal(stoke_images_class_name(&ds, c), classes[c]);
    assert_null(stoke_images_class_name(&ds, 4));
    const char *order[] = {"ant/A.Jpg",  "ant/sub/a.jpg", "ant/z.jpg",  "bee/a1.jpeg",
                           "bee/b2.JPG", "cat/x.jpg",     "cat-2/y.jpg"};
    const int64_t labels[] = {0, 0, 0, 1, 1, 2, 3};
    for (uint64_t i = 0; i < 7; i++) {
        assert_string_equal(stoke_images_path(&ds, i), order[i]);
        unsigned char data[3 * 32 * 32];
        int64_t label = -1;
        void *dst[TU_FIELDS] = {data, &label};
        char msg[256] = "";
        assert_int_equal(ds.get(ds.user, i, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
        assert_int_equal(label, labels[i]);
    }
    assert_null(stoke_images_path(&ds, 7));
    void *dst[TU_FIELDS] = {NULL, NULL};
    char msg[256] = "";
    assert_int_equal(ds.get(ds.user, 7, dst, NULL, 0, msg, sizeof(msg)), STOKE_ERANGE);
    stoke_dataset_close(&ds);
    assert_int_equal(stoke_images_num_classes(&ds), 0);
    /* names that are only the extension are JPEGs too, as ImageFolder takes them */
    mkdirs("dotnames/c");
    write_jpeg("dotnames/c/.jpg", 16, 12, K_BASELINE, 90);
    write_jpeg("dotnames/c/.JPEG", 16, 12, K_BASELINE, 90);
    open_dir("dotnames", ",size=8", &ds);
    assert_int_equal(ds.length(ds.user), 2);
    assert_string_equal(stoke_images_path(&ds, 0), "c/.JPEG");
    assert_string_equal(stoke_images_path(&ds, 1), "c/.jpg");
    stoke_dataset_close(&ds);
}

/* Sample bytes by index of one epoch read through a loader (shuffled, `workers` threads). */
static unsigned char *load_epoch(const char *spec, int workers, uint64_t epoch, int via_set,
                                 size_t *n_out, size_t *bytes_out)
{
    stoke_dataset ds;
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    const size_t n = (size_t)ds.length(ds.user), bytes = ds.fields[0].bytes;
    unsigned char *out = calloc(n, bytes);
    assert_non_null(out);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 3;
    o.num_workers = workers;
    o.shuffle = 1;
    o.seed = 77;
    o.pin_memory = 0;
    o.epoch = via_set ? 0 : epoch;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    if (via_set)
        assert_int_equal(stoke_loader_set_epoch(l, epoch), STOKE_OK);
    tu_seen seen;
    tu_seen_init(&seen, n);
    stoke_batch *b = NULL;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        const uint64_t *ix = stoke_batch_indices(b);
        const unsigned char *d = stoke_batch_data(b, 0);
        const int64_t *lab = stoke_batch_data(b, 1);
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            tu_seen_add(&seen, ix[j]);
            memcpy(out + ix[j] * bytes, d + j * bytes, bytes);
            if (!stoke_images_num_classes(&ds))
                continue; /* a tar: dataset */
            /* the label is the class directory the file is in */
            const char *cls = stoke_images_class_name(&ds, (uint32_t)lab[j]);
            const char *path = stoke_images_path(&ds, ix[j]);
            assert_non_null(cls);
            assert_true(strncmp(path, cls, strlen(cls)) == 0 && path[strlen(cls)] == '/');
        }
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    tu_seen_check_all(&seen);
    tu_seen_free(&seen);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    *n_out = n, *bytes_out = bytes;
    return out;
}

/* Train augmentation: identical bytes for 0, 1 and 2 workers, for an epoch set at create or by
 * set_epoch; different bytes in another epoch. */
static void test_train_workers_and_epochs(void **state)
{
    write_tree("tree");
    char spec[1024];
    stoke__fmt(spec, sizeof(spec), "images:%s/tree,train,size=24,seed=9", g_root);
    size_t n, bytes;
    unsigned char *e0[3], *e1, *e1s, *e0again;
    for (int w = 0; w <= 2; w++) {
        e0[w] = load_epoch(spec, w, 0, 0, &n, &bytes);
        if (w)
            assert_memory_equal(e0[w], e0[0], n * bytes);
    }
    e1 = load_epoch(spec, 2, 1, 0, &n, &bytes);
    e1s = load_epoch(spec, 1, 1, 1, &n, &bytes);
    assert_memory_equal(e1, e1s, n * bytes);
    e0again = load_epoch(spec, 2, 0, 1, &n, &bytes); /* set_epoch(0) after create */
    assert_memory_equal(e0again, e0[0], n * bytes);
    size_t differ = 0;
    for (size_t i = 0; i < n; i++)
        differ += memcmp(e0[0] + i * bytes, e1 + i * bytes, bytes) != 0;
    assert_true(differ >= n - 1); /* a new crop for (nearly) every sample */
    /* another seed: other crops */
    stoke__fmt(spec, sizeof(spec), "images:%s/tree,train,size=24,seed=10", g_root);
    unsigned char *other = load_epoch(spec, 0, 0, 0, &n, &bytes);
    assert_memory_not_equal(other, e0[0], n * bytes);
    /* eval does not depend on the epoch */
    stoke__fmt(spec, sizeof(spec), "images:%s/tree,eval,size=24", g_root);
    unsigned char *v0 = load_epoch(spec, 2, 0, 0, &n, &bytes);
    unsigned char *v1 = load_epoch(spec, 0, 5, 1, &n, &bytes);
    assert_memory_equal(v0, v1, n * bytes);
    for (int w = 0; w <= 2; w++)
        free(e0[w]);
    free(e1), free(e1s), free(e0again), free(other), free(v0), free(v1);
}

/* The same JPEGs as .jpg members of a WebDataset tar shard (with .cls labels): the tar:
 * source decodes them through this module with the same options, so a loader gives the same
 * bytes by index as images: does, for train (the epoch reaches the tar dataset through
 * set_epoch) and eval, and the labels match. */
static void test_tar_jpg_members(void **state)
{
    write_tree("tartree");
    stoke_dataset ds;
    open_dir("tartree", "", &ds);
    const uint64_t n = ds.length(ds.user);
    char rel[512], stage[1024], shard[1024];
    stoke__fmt(rel, sizeof(rel), "tarstage");
    mkdirs(rel);
    path_in(stage, sizeof(stage), "tarstage");
    path_in(shard, sizeof(shard), "shard.tar");
    const char *argv[64] = {"/bin/tar", "--format=ustar", "-cf", shard, "-C", stage};
    int argc = 6;
    static char names[32][16];
    assert_true(2 * n < 32);
    for (uint64_t i = 0; i < n; i++) {
        size_t len;
        stoke__fmt(rel, sizeof(rel), "tartree/%s", stoke_images_path(&ds, i));
        unsigned char *jpg = read_bytes(rel, &len);
        int64_t label = 0;
        void *dst[2] = {NULL, &label};
        char msg[256];
        /* the label as images: gives it, through get() with a scratch data slot */
        unsigned char *scratch = malloc(ds.fields[0].bytes);
        dst[0] = scratch;
        assert_int_equal(ds.get(ds.user, i, dst, NULL, 0, msg, sizeof(msg)), STOKE_OK);
        free(scratch);
        char cls[32];
        int cl = snprintf(cls, sizeof(cls), "%lld", (long long)label);
        stoke__fmt(names[2 * i], sizeof(names[0]), "s%03d.cls", (int)i);
        stoke__fmt(names[2 * i + 1], sizeof(names[0]), "s%03d.jpg", (int)i);
        stoke__fmt(rel, sizeof(rel), "tarstage/%s", names[2 * i]);
        write_bytes(rel, cls, (size_t)cl);
        stoke__fmt(rel, sizeof(rel), "tarstage/%s", names[2 * i + 1]);
        write_bytes(rel, jpg, len);
        free(jpg);
        argv[argc++] = names[2 * i];
        argv[argc++] = names[2 * i + 1];
    }
    argv[argc] = NULL;
    stoke_dataset_close(&ds);
    char out[256], err[512];
    if (tu_run(argv, NULL, out, sizeof(out), err, sizeof(err)) != 0)
        fail_msg("tar: %s", err);
    static const char *const modes[] = {"train,size=24,seed=9", "eval,size=24"};
    for (size_t m = 0; m < STOKE__ARRAY_LEN(modes); m++) {
        char ispec[1200], tspec[1200];
        stoke__fmt(ispec, sizeof(ispec), "images:%s/tartree,%s", g_root, modes[m]);
        stoke__fmt(tspec, sizeof(tspec), "tar:%s,fields=jpg:cls,%s", shard, modes[m]);
        for (uint64_t epoch = 0; epoch < 2; epoch++) {
            size_t ni, nt, bi, bt;
            unsigned char *a = load_epoch(ispec, 1, epoch, 0, &ni, &bi);
            unsigned char *b = load_epoch(tspec, 2, epoch, (int)epoch, &nt, &bt);
            assert_int_equal(ni, nt);
            assert_int_equal(bi, bt);
            assert_memory_equal(a, b, ni * bi);
            free(a), free(b);
        }
    }
    /* the labels: .cls members equal the class indices */
    stoke_dataset td, id;
    char tspec[1200];
    stoke__fmt(tspec, sizeof(tspec), "tar:%s,fields=jpg:cls,eval,size=8", shard);
    assert_int_equal(stoke_source_open(tspec, &td), STOKE_OK);
    open_dir("tartree", ",eval,size=8", &id);
    for (uint64_t i = 0; i < n; i++) {
        unsigned char d1[3 * 8 * 8], d2[3 * 8 * 8];
        int64_t l1 = -1, l2 = -2;
        void *x1[2] = {d1, &l1}, *x2[2] = {d2, &l2};
        char msg[256];
        assert_int_equal(td.get(td.user, i, x1, NULL, 0, msg, sizeof(msg)), STOKE_OK);
        assert_int_equal(id.get(id.user, i, x2, NULL, 0, msg, sizeof(msg)), STOKE_OK);
        assert_int_equal(l1, l2);
        assert_memory_equal(d1, d2, sizeof(d1));
    }
    stoke_dataset_close(&td);
    stoke_dataset_close(&id);
    /* the same members with their extensions in capitals (.JPG, .CLS): decoded the same */
    const char *argv2[64] = {"/bin/tar", "--format=ustar", "-cf", shard, "-C", stage};
    argc = 6;
    for (uint64_t i = 0; i < 2 * n; i++) {
        char from[1024], to[1024];
        path_in(from, sizeof(from), "tarstage");
        stoke__fmt(from + strlen(from), sizeof(from) - strlen(from), "/%s", names[i]);
        for (char *e = strrchr(names[i], '.'); *e; e++)
            *e = (char)toupper((unsigned char)*e);
        path_in(to, sizeof(to), "tarstage");
        stoke__fmt(to + strlen(to), sizeof(to) - strlen(to), "/%s", names[i]);
        assert_int_equal(rename(from, to), 0);
        argv2[argc++] = names[i];
    }
    argv2[argc] = NULL;
    if (tu_run(argv2, NULL, out, sizeof(out), err, sizeof(err)) != 0)
        fail_msg("tar: %s", err);
    char ispec[1200];
    stoke__fmt(ispec, sizeof(ispec), "images:%s/tartree,eval,size=24", g_root);
    stoke__fmt(tspec, sizeof(tspec), "tar:%s,fields=JPG:CLS,eval,size=24", shard);
    size_t ni, nt, bi, bt;
    unsigned char *a = load_epoch(ispec, 1, 0, 0, &ni, &bi);
    unsigned char *b = load_epoch(tspec, 2, 0, 0, &nt, &bt);
    assert_int_equal(ni, nt);
    assert_int_equal(bi, bt);
    assert_memory_equal(a, b, ni * bi);
    free(a), free(b);
}

/* One epoch of `spec` under on_error `policy` with `workers`: the indices and the data bytes
 * delivered, in order (caller frees), their count, and the quarantine's first entry. */
static size_t policy_epoch(const char *spec, const char *policy, int workers, uint64_t **idx_out,
                           unsigned char **data_out, stoke_bad_sample *q0, uint64_t *nbad)
{
    stoke_dataset ds;
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    const size_t n = (size_t)ds.length(ds.user), bytes = ds.fields[0].bytes;
    uint64_t *idx = calloc(2 * n, sizeof(uint64_t));
    unsigned char *data = calloc(2 * n, bytes);
    assert_non_null(idx);
    assert_non_null(data);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    assert_int_equal(stoke_on_error_parse(policy, &o), STOKE_OK);
    o.batch_size = 3;
    o.num_workers = workers;
    o.pin_memory = 0;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b = NULL;
    size_t k = 0;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        if (strcmp(policy, "replace") == 0) /* 7 samples: batches of 3, 3, 1, none shorter */
            assert_int_equal(stoke_batch_count(b), n - k < 3 ? n - k : 3);
        for (size_t j = 0; j < stoke_batch_count(b); j++, k++) {
            idx[k] = stoke_batch_indices(b)[j];
            memcpy(data + k * bytes, (unsigned char *)stoke_batch_data(b, 0) + j * bytes, bytes);
        }
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    stoke_loader_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_loader_get_stats(l, &st), STOKE_OK);
    *nbad = st.bad_samples;
    if (st.quarantined)
        assert_int_equal(stoke_loader_quarantine(l, 0, q0), STOKE_OK);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    *idx_out = idx;
    *data_out = data;
    return k;
}

/* A corrupt JPEG under each bad-sample policy: error names the file; skip delivers every other
 * image, in order, and quarantines the file; replace keeps the batch size and is the same for
 * 0 and 2 workers. */
static void test_corrupt_jpeg_policies(void **state)
{
    mkdirs("pol/c");
    for (int i = 0; i < 7; i++) {
        char rel[64];
        stoke__fmt(rel, sizeof(rel), "pol/c/%d.jpg", i);
        write_jpeg(rel, 40 + 4 * i, 30 + 2 * i, K_BASELINE, 90);
    }
    size_t len;
    unsigned char *jpg = read_bytes("pol/c/3.jpg", &len);
    write_bytes("pol/c/3.jpg", jpg, len / 3); /* truncated */
    free(jpg);
    char spec[1024];
    stoke__fmt(spec, sizeof(spec), "images:%s/pol,eval,size=16", g_root);

    /* error: the epoch ends at the batch holding sample 3, the message names the file */
    stoke_dataset ds;
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 3;
    o.num_workers = 2;
    o.pin_memory = 0;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b = NULL;
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK); /* 0, 1, 2 */
    stoke_batch_release(b);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_EFORMAT);
    assert_non_null(strstr(stoke_loader_last_error(l), "pol/c/3.jpg"));
    assert_non_null(strstr(stoke_loader_last_error(l), "sample 3"));
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);

    /* skip: 6 images, the others in order, 3 quarantined with its file */
    uint64_t *idx, nbad;
    unsigned char *data;
    stoke_bad_sample q;
    memset(&q, 0, sizeof(q));
    size_t k = policy_epoch(spec, "skip", 2, &idx, &data, &q, &nbad);
    assert_int_equal(k, 6);
    static const uint64_t want[] = {0, 1, 2, 4, 5, 6};
    assert_memory_equal(idx, want, sizeof(want));
    assert_int_equal(nbad, 1);
    assert_int_equal(q.index, 3);
    assert_non_null(strstr(q.source, "pol/c/3.jpg"));
    assert_non_null(strstr(q.reason, "corrupt JPEG"));
    free(idx), free(data);

    /* replace: 7 samples in batches of 3, 3, 1; the same bytes for 0 and 2 workers */
    uint64_t *i0, *i2;
    unsigned char *d0, *d2;
    size_t k0 = policy_epoch(spec, "replace", 0, &i0, &d0, &q, &nbad);
    size_t k2 = policy_epoch(spec, "replace", 2, &i2, &d2, &q, &nbad);
    assert_int_equal(k0, 7);
    assert_int_equal(k2, 7);
    assert_memory_equal(i0, i2, 7 * sizeof(uint64_t));
    assert_memory_equal(d0, d2, 7 * 3 * 16 * 16);
    assert_int_equal(nbad, 1);
    assert_int_equal(q.index, 3);
    free(i0), free(i2), free(d0), free(d2);
}

/* The spec string gives what the opts struct gives; a comma may belong to DIR. */
static void test_spec_options(void **state)
{
    write_tree("with,comma");
    stoke_dataset a, b;
    open_dir("with,comma",
             ",train,size=20,layout=hwc,dtype=f32,mean=0.5:0.4:0.3,std=0.2:0.25:0.3,seed=4", &a);
    assert_int_equal(a.fields[0].dtype, STOKE_DTYPE_F32);
    assert_int_equal(a.fields[0].shape[0], 20);
    assert_int_equal(a.fields[0].shape[2], 3);
    assert_int_equal(a.length(a.user), 7);
    stoke_images_opts o;
    stoke_images_opts_init(&o);
    assert_int_equal(o.size, sizeof(o));
    assert_int_equal(o.image_size, 224);
    assert_int_equal(o.layout, STOKE_IMAGES_CHW);
    o.image_size = 20, o.train = 1, o.layout = STOKE_IMAGES_HWC, o.dtype = STOKE_DTYPE_F32;
    o.normalize = 1, o.seed = 4;
    const float mean[3] = {0.5f, 0.4f, 0.3f}, sd[3] = {0.2f, 0.25f, 0.3f};
    memcpy(o.mean, mean, sizeof(mean)), memcpy(o.std, sd, sizeof(sd));
    char dir[1024];
    assert_int_equal(stoke_images_open(path_in(dir, sizeof(dir), "with,comma"), &o, &b), STOKE_OK);
    static float x[20 * 20 * 3], y[20 * 20 * 3];
    for (uint64_t i = 0; i < 7; i++) {
        void *dx[TU_FIELDS] = {x, NULL}, *dy[TU_FIELDS] = {y, NULL};
        char msg[256];
        assert_int_equal(a.get(a.user, i, dx, NULL, 1, msg, sizeof(msg)), STOKE_OK);
        assert_int_equal(b.get(b.user, i, dy, NULL, 0, msg, sizeof(msg)), STOKE_OK);
        assert_memory_equal(x, y, sizeof(x));
    }
    stoke_dataset_close(&a);
    stoke_dataset_close(&b);
}

static void expect_get_error(stoke_dataset *ds, uint64_t i, int code, const char *file,
                             const char *why)
{
    unsigned char data[3 * 32 * 32];
    void *dst[TU_FIELDS] = {data, NULL};
    char msg[256] = "";
    int rc = ds->get(ds->user, i, dst, NULL, 0, msg, sizeof(msg));
    if (rc != code || !strstr(msg, file) || !strstr(msg, why))
        fail_msg("sample %llu: got %s '%s', expected %s naming %s with '%s'", (unsigned long long)i,
                 stoke_err_name(rc), msg, stoke_err_name(code), file, why);
}

/* Corrupt, truncated, non-JPEG and empty files: errors that name the file, through get() and
 * through the loader. */
static void test_bad_files(void **state)
{
    mkdirs("bad/c");
    write_jpeg("bad/c/0good.jpg", 64, 48, K_BASELINE, 90);
    write_jpeg("bad/c/big.jpg", 300, 200, K_BASELINE, 90);
    write_jpeg("bad/c/bigp.jpg", 300, 200, K_PROGRESSIVE, 90);
    size_t len, plen;
    unsigned char *big = read_bytes("bad/c/big.jpg", &len);
    unsigned char *bigp = read_bytes("bad/c/bigp.jpg", &plen);
    write_bytes("bad/c/trunc.jpg", big, len / 2);
    write_bytes("bad/c/truncp.jpg", bigp, plen * 2 / 3);
    unsigned char garbage[600];
    for (size_t i = 0; i < sizeof(garbage); i++)
        garbage[i] = (unsigned char)(i * 131 + 7);
    write_bytes("bad/c/garbage.jpg", garbage, sizeof(garbage));
    memcpy(garbage, "\xFF\xD8\xFF\xE0", 4); /* a JPEG start, then nonsense */
    write_bytes("bad/c/garbage2.jpg", garbage, sizeof(garbage));
    write_bytes("bad/c/image.jpg", "\x89PNG\r\n\x1a\n\0\0\0\rIHDR", 16);
    write_bytes("bad/c/zero.jpg", "", 0);
    free(big);
    free(bigp);
    stoke_dataset ds;
    open_dir("bad", ",size=32", &ds);
    /* sorted: 0good big bigp garbage garbage2 image trunc truncp zero */
    assert_int_equal(ds.length(ds.user), 9);
    expect_get_error(&ds, 3, STOKE_EFORMAT, "bad/c/garbage.jpg", "not a JPEG (unknown data)");
    expect_get_error(&ds, 4, STOKE_EFORMAT, "bad/c/garbage2.jpg", "corrupt JPEG");
    expect_get_error(&ds, 5, STOKE_EFORMAT, "bad/c/image.jpg", "not a JPEG (PNG image)");
    expect_get_error(&ds, 6, STOKE_EFORMAT, "bad/c/trunc.jpg", "corrupt JPEG: Premature end");
    expect_get_error(&ds, 7, STOKE_EFORMAT, "bad/c/truncp.jpg", "corrupt JPEG");
    expect_get_error(&ds, 8, STOKE_EFORMAT, "bad/c/zero.jpg", "not a JPEG (empty file)");
    char p[1024];
    unlink(path_in(p, sizeof(p), "bad/c/big.jpg")); /* gone since open */
    expect_get_error(&ds, 1, STOKE_ENOENT, "bad/c/big.jpg", "cannot open");

    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 4;
    o.num_workers = 2;
    o.pin_memory = 0;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b = NULL;
    int rc = stoke_loader_next(l, &b);
    assert_int_not_equal(rc, STOKE_OK);
    assert_non_null(strstr(stoke_last_error(), "bad/c/big.jpg"));
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
}

/* ---- a file replaced by a FIFO after the scan (issue 25, item 8) ---- */

typedef struct fifo_run {
    stoke_dataset *ds;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int done;
    int get_rc, next_rc;
    char get_msg[512], next_msg[512];
} fifo_run;

/* get() of sample 1, then an epoch through a loader with a worker thread, then its destroy. */
static void *fifo_reader(void *arg)
{
    fifo_run *r = arg;
    unsigned char data[3 * 16 * 16];
    int64_t label;
    void *dst[TU_FIELDS] = {data, &label};
    r->get_rc = r->ds->get(r->ds->user, 1, dst, NULL, 0, r->get_msg, sizeof(r->get_msg));
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 2;
    o.num_workers = 1;
    o.pin_memory = 0;
    stoke_loader *l = NULL;
    r->next_rc = stoke_loader_create(&o, r->ds, &l);
    if (r->next_rc == STOKE_OK) {
        stoke_batch *b = NULL;
        r->next_rc = stoke_loader_next(l, &b);
        stoke__strlcpy(r->next_msg, stoke_last_error(), sizeof(r->next_msg));
        if (r->next_rc == STOKE_OK)
            stoke_batch_release(b);
        stoke_loader_destroy(l);
    }
    pthread_mutex_lock(&r->mu);
    r->done = 1;
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* Waits up to `seconds` for r->done; 1 when done. */
static int fifo_wait(fifo_run *r, int seconds)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += seconds;
    pthread_mutex_lock(&r->mu);
    while (!r->done && pthread_cond_timedwait(&r->cv, &r->mu, &until) == 0)
        ;
    int done = r->done;
    pthread_mutex_unlock(&r->mu);
    return done;
}

/* A JPEG replaced by a FIFO after the scan: get() fails at once naming the file (a blocking
 * open() would hang the worker, the loader's destroy and the process's exit), and a loader
 * reading it returns the error and can be destroyed.  Bounded: if the reader is still blocked
 * after 30 s, the watchdog opens the FIFO's write end (releasing any reader blocked in open)
 * and the test fails. */
static void test_fifo_after_scan(void **state)
{
    mkdirs("fifo/c");
    write_jpeg("fifo/c/a.jpg", 40, 30, K_BASELINE, 90);
    write_jpeg("fifo/c/b.jpg", 40, 30, K_BASELINE, 90);
    stoke_dataset ds;
    open_dir("fifo", ",size=16", &ds);
    assert_int_equal(ds.length(ds.user), 2);
    char p[1024];
    path_in(p, sizeof(p), "fifo/c/b.jpg");
    assert_int_equal(unlink(p), 0);
    assert_int_equal(mkfifo(p, 0600), 0);
    fifo_run r;
    memset(&r, 0, sizeof(r));
    r.ds = &ds;
    pthread_mutex_init(&r.mu, NULL);
    pthread_cond_init(&r.cv, NULL);
    pthread_t th;
    assert_int_equal(pthread_create(&th, NULL, fifo_reader, &r), 0);
    int hung = !fifo_wait(&r, 30);
    for (int k = 0; hung && k < 600 && !fifo_wait(&r, 0); k++) {
        int fd = open(p, O_WRONLY | O_NONBLOCK | O_CLOEXEC); /* ENXIO while no reader waits */
        if (fd >= 0)
            close(fd);
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    assert_true(fifo_wait(&r, 30));
    pthread_join(th, NULL);
    pthread_cond_destroy(&r.cv);
    pthread_mutex_destroy(&r.mu);
    stoke_dataset_close(&ds);
    if (hung)
        fail_msg("get() on a file replaced by a FIFO blocked (released by the watchdog)");
    if (r.get_rc != STOKE_EIO || !strstr(r.get_msg, "fifo/c/b.jpg") ||
        !strstr(r.get_msg, "is a FIFO, not a regular file"))
        fail_msg("get: %s '%s'", stoke_err_name(r.get_rc), r.get_msg);
    if (r.next_rc != STOKE_EIO || !strstr(r.next_msg, "fifo/c/b.jpg") ||
        !strstr(r.next_msg, "FIFO"))
        fail_msg("loader: %s '%s'", stoke_err_name(r.next_rc), r.next_msg);
}

/* ---- decode memory (issue 25, item 14) ---- */

/* One flat colour (compresses to almost nothing however large), progressive or baseline,
 * 4:4:4 or 4:2:0; into memory (caller frees). */
/* A compressor of a W x H image of `comps` components in `cs` into memory (*buf, *n once
 * finished), its defaults set. */
static void mem_compress_begin(struct jpeg_compress_struct *ci, struct jpeg_error_mgr *jerr,
                               unsigned char **buf, unsigned long *n, int W, int H, int comps,
                               J_COLOR_SPACE cs)
{
    ci->err = jpeg_std_error(jerr);
    jpeg_create_compress(ci);
    *buf = NULL;
    *n = 0;
    jpeg_mem_dest(ci, buf, n);
    ci->image_width = (JDIMENSION)W;
    ci->image_height = (JDIMENSION)H;
    ci->input_components = comps;
    ci->in_color_space = cs;
    jpeg_set_defaults(ci);
}

static unsigned char *flat_jpeg(int W, int H, int progressive, int s444, size_t *len)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    unsigned char *buf;
    unsigned long n;
    mem_compress_begin(&ci, &jerr, &buf, &n, W, H, 3, JCS_RGB);
    if (progressive)
        jpeg_simple_progression(&ci);
    if (s444)
        ci.comp_info[0].h_samp_factor = ci.comp_info[0].v_samp_factor = 1;
    jpeg_start_compress(&ci, TRUE);
    unsigned char *row = malloc((size_t)W * 3);
    assert_non_null(row);
    for (int x = 0; x < W; x++)
        row[3 * x] = 200, row[3 * x + 1] = 120, row[3 * x + 2] = 40;
    for (int y = 0; y < H; y++) {
        JSAMPROW r = row;
        jpeg_write_scanlines(&ci, &r, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    free(row);
    *len = n;
    return buf;
}

/* Rewrites the dimensions in the frame header (SOF0..SOF2) of a JPEG. */
static void set_dimensions(unsigned char *j, size_t len, int W, int H)
{
    for (size_t i = 2; i + 9 < len; i++)
        if (j[i] == 0xFF && j[i + 1] >= 0xC0 && j[i + 1] <= 0xC2) {
            j[i + 5] = (unsigned char)(H >> 8), j[i + 6] = (unsigned char)H;
            j[i + 7] = (unsigned char)(W >> 8), j[i + 8] = (unsigned char)W;
            return;
        }
    fail_msg("no frame header");
}

static int get_one(const char *spec, uint64_t i, char *msg, size_t msg_len)
{
    stoke_dataset ds;
    int rc = stoke_source_open(spec, &ds);
    if (rc)
        fail_msg("%s: %s %s", spec, stoke_err_name(rc), stoke_last_error());
    unsigned char *data = malloc(ds.fields[0].bytes);
    assert_non_null(data);
    int64_t label;
    void *dst[TU_FIELDS] = {data, ds.nfields > 1 ? &label : NULL};
    msg[0] = 0;
    rc = ds.get(ds.user, i, dst, NULL, 0, msg, msg_len);
    free(data);
    stoke_dataset_close(&ds);
    return rc;
}

static void expect_limit(const char *spec, uint64_t i, const char *file, const char *dims,
                         const char *limit)
{
    char msg[512];
    int rc = get_one(spec, i, msg, sizeof(msg));
    /* "needs about": refused from the header's estimate, before libjpeg's own bound */
    if (rc != STOKE_ELIMIT || !strstr(msg, file) || !strstr(msg, dims) || !strstr(msg, limit) ||
        !strstr(msg, "needs about"))
        fail_msg("%s [%llu]: got %s '%s', expected STOKE_ELIMIT naming %s, %s and %s", spec,
                 (unsigned long long)i, stoke_err_name(rc), msg, file, dims, limit);
}

static void expect_decodes(const char *spec, uint64_t i)
{
    char msg[512];
    int rc = get_one(spec, i, msg, sizeof(msg));
    if (rc != STOKE_OK)
        fail_msg("%s [%llu]: %s '%s'", spec, (unsigned long long)i, stoke_err_name(rc), msg);
}

/* A progressive JPEG keeps every coefficient of the image while it decodes (6 bytes per pixel
 * at 4:4:4): one whose decode needs more than max_decode_bytes is refused from its header,
 * naming the file, its dimensions and the option -- under a lower limit set by the option, and
 * under the default (256M) for a 9000x9000 header; a baseline JPEG of the same size needs only
 * a few rows and still decodes under the lower limit, and so does everything under the
 * default.  The same option through tar: for a .jpg member. */
static void test_decode_memory_limit(void **state)
{
    mkdirs("bomb/c");
    size_t n;
    unsigned char *j = flat_jpeg(1024, 1024, 1, 1, &n); /* 6 MiB of coefficients */
    write_bytes("bomb/c/p444.jpg", j, n);
    set_dimensions(j, n, 9000, 9000); /* 486 MB: above the default; refused before a scan */
    write_bytes("bomb/c/q_huge.jpg", j, n);
    free(j);
    j = flat_jpeg(1024, 1024, 0, 0, &n);
    write_bytes("bomb/c/base.jpg", j, n);
    free(j);
    /* sorted: base p444 q_huge */
    char spec[1200];
    stoke__fmt(spec, sizeof(spec), "images:%s/bomb,size=32,max_decode_bytes=4M", g_root);
    expect_limit(spec, 1, "bomb/c/p444.jpg", "1024x1024", "max_decode_bytes=4M");
    expect_decodes(spec, 0);
    stoke__fmt(spec, sizeof(spec), "images:%s/bomb,train,size=32", g_root);
    expect_decodes(spec, 0);
    expect_decodes(spec, 1);
    expect_limit(spec, 2, "bomb/c/q_huge.jpg", "9000x9000", "max_decode_bytes=256M");

    /* the C API: the default, an old caller's shorter struct, a bad value */
    stoke_images_opts o;
    stoke_images_opts_init(&o);
    assert_int_equal(o.max_decode_bytes, (uint64_t)256 << 20);
    char dir[1024];
    path_in(dir, sizeof(dir), "bomb");
    stoke_dataset ds;
    o.max_decode_bytes = 512 << 10;
    assert_int_equal(stoke_images_open(dir, &o, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "max_decode_bytes"));
    o.size = (uint32_t)offsetof(stoke_images_opts, max_decode_bytes); /* ignored: default */
    assert_int_equal(stoke_images_open(dir, &o, &ds), STOKE_OK);
    stoke_dataset_close(&ds);

    /* tar: the same option for .jpg members */
    char shard[1024], out[256], err[512];
    path_in(shard, sizeof(shard), "bomb.tar");
    const char *argv[] = {"/bin/tar", "--format=ustar", "--sort=name", "-cf", shard, "-C", dir, "c",
                          NULL};
    if (tu_run(argv, NULL, out, sizeof(out), err, sizeof(err)) != 0)
        fail_msg("tar: %s", err);
    stoke__fmt(spec, sizeof(spec), "tar:%s,fields=jpg,size=32,max_decode_bytes=4M", shard);
    expect_limit(spec, 1, "c/p444", "1024x1024", "max_decode_bytes=4M");
    expect_decodes(spec, 0);
}

/* A grayscale JPEG of noise, in memory (caller frees): progressive with the scans DC, then AC
 * 1..63 at full precision (a script whose AC scan may be repeated: each repeat expects the
 * bits the last left, so libjpeg warns of no bogus progression), or arithmetic-coded. */
static unsigned char *gray_jpeg(int W, int H, int arith, size_t *len)
{
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    unsigned char *buf;
    unsigned long n;
    mem_compress_begin(&ci, &jerr, &buf, &n, W, H, 1, JCS_GRAYSCALE);
    static const jpeg_scan_info script[2] = {{1, {0}, 0, 0, 0, 0}, {1, {0}, 1, 63, 0, 0}};
    if (arith) {
        ci.arith_code = TRUE;
    } else {
        ci.scan_info = script;
        ci.num_scans = 2;
    }
    jpeg_start_compress(&ci, TRUE);
    unsigned char *row = malloc((size_t)W);
    assert_non_null(row);
    uint64_t r = 0x9e3779b97f4a7c15ull;
    for (int y = 0; y < H; y++) {
        for (int x = 0; x < W; x++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            row[x] = (unsigned char)(x + y + (int)(r >> 60));
        }
        JSAMPROW rp = row;
        jpeg_write_scanlines(&ci, &rp, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    free(row);
    *len = n;
    return buf;
}

/* A progressive JPEG whose AC scan is repeated: `copies` scans of it in all (libjpeg decodes
 * each, a pass over every block: 10,000 of a 8192x8192 image, 1.3 MB, took 48 s of CPU within
 * the memory limit).  Up to 256 scans decode; more are STOKE_ELIMIT naming the count. */
static void test_too_many_scans(void **state)
{
    size_t n;
    unsigned char *j = gray_jpeg(256, 256, 0, &n);
    size_t sos2 = 0, sos = 0;
    for (size_t i = 2; i + 1 < n; i++)
        if (j[i] == 0xFF && j[i + 1] == 0xDA && (sos++ == 1))
            sos2 = i;
    assert_true(sos2 > 0 && j[n - 2] == 0xFF && j[n - 1] == 0xD9);
    const size_t seg = n - 2 - sos2; /* the AC scan: its SOS to the EOI */
    for (int copies = 255; copies <= 256; copies++) {
        size_t len = sos2 + seg * (size_t)copies + 2;
        unsigned char *b = malloc(len);
        assert_non_null(b);
        memcpy(b, j, sos2);
        for (int k = 0; k < copies; k++)
            memcpy(b + sos2 + seg * (size_t)k, j + sos2, seg);
        memcpy(b + len - 2, "\xFF\xD9", 2);
        stoke__image_opts o;
        stoke__image_opts_init(&o);
        o.size = 32;
        unsigned char out[32 * 32 * 3];
        char msg[256] = "";
        int rc = stoke__image_decode(&o, b, len, 0, 0, out, msg, sizeof(msg));
        if (copies == 255) { /* 256 scans with the DC's */
            if (rc != STOKE_OK)
                fail_msg("256 scans: %s '%s'", stoke_err_name(rc), msg);
        } else if (rc != STOKE_ELIMIT || !strstr(msg, "more than 256 scans") ||
                   !strstr(msg, "256x256")) {
            fail_msg("257 scans: %s '%s', expected STOKE_ELIMIT", stoke_err_name(rc), msg);
        }
        free(b);
    }
    free(j);
}

/* Arithmetic-coded data that libjpeg finds bad ("bad arithmetic code", a warning: the rest of
 * the image came out as bands of wrong colour, and the sample was delivered as good) is
 * STOKE_EFORMAT: of 40 seeded corruptions of the entropy data, some are said so, and none of
 * the others is an error of another code. */
static void test_arith_bad_code(void **state)
{
    size_t n;
    unsigned char *j = gray_jpeg(256, 256, 1, &n);
    size_t sos = 0;
    for (size_t i = 2; i + 1 < n && !sos; i++)
        if (j[i] == 0xFF && j[i + 1] == 0xDA)
            sos = i;
    assert_true(sos > 0 && n > sos + 600);
    unsigned char *b = malloc(n);
    assert_non_null(b);
    uint64_t r = 0x5eed;
    int said = 0;
    for (int k = 0; k < 40; k++) {
        memcpy(b, j, n);
        for (int e = 0; e < 8; e++) { /* bytes of the scan's data, never a marker's 0xFF */
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            size_t at = sos + 20 + (size_t)(r >> 33) % (n - sos - 40);
            if (b[at] != 0xFF && b[at - 1] != 0xFF)
                b[at] = (unsigned char)((b[at] ^ (1 + (r >> 20) % 254)) & 0xFE);
        }
        stoke__image_opts o;
        stoke__image_opts_init(&o);
        o.size = 32;
        unsigned char out[32 * 32 * 3];
        char msg[256] = "";
        int rc = stoke__image_decode(&o, b, n, 0, 0, out, msg, sizeof(msg));
        if (rc != STOKE_OK && rc != STOKE_EFORMAT)
            fail_msg("corruption %d: %s '%s'", k, stoke_err_name(rc), msg);
        said += rc == STOKE_EFORMAT && strstr(msg, "bad arithmetic code") != NULL;
    }
    assert_true(said > 0);
    free(b);
    free(j);
}

static void expect_open_error(const char *rel, const char *opts, int code, const char *why)
{
    char spec[1024];
    stoke__fmt(spec, sizeof(spec), "images:%s/%s%s", g_root, rel, opts);
    stoke_dataset ds;
    int rc = stoke_source_open(spec, &ds);
    if (rc != code || !strstr(stoke_last_error(), why))
        fail_msg("%s: got %s '%s', expected %s with '%s'", spec, stoke_err_name(rc),
                 stoke_last_error(), stoke_err_name(code), why);
    assert_null(ds.get);
}

static void test_open_errors(void **state)
{
    mkdirs("noclass");
    write_jpeg("noclass/top.jpg", 8, 8, K_BASELINE, 90);
    expect_open_error("noclass", "", STOKE_ENOENT, "no class directories");
    mkdirs("emptyclass/a");
    mkdirs("emptyclass/b");
    write_jpeg("emptyclass/a/x.jpg", 8, 8, K_BASELINE, 90);
    expect_open_error("emptyclass", "", STOKE_ENOENT, "class directory 'b' has no .jpg/.jpeg");
    mkdirs("pngonly/a");
    write_bytes("pngonly/a/x.png", "\x89PNG\r\n\x1a\n", 8);
    expect_open_error("pngonly", "", STOKE_ENOENT, "only JPEG");
    expect_open_error("missing", "", STOKE_ENOENT, "missing");
    /* a symlink loop is said at once, naming the link and the directory it leads back to (two
     * links to "." walked 2^32 paths' worth of a tree before: one error at depth 32 only
     * because the walk stops at the first) */
    char p[1024];
    mkdirs("loop/a");
    write_jpeg("loop/a/x.jpg", 8, 8, K_BASELINE, 90);
    assert_int_equal(symlink(".", path_in(p, sizeof(p), "loop/a/here")), 0);
    assert_int_equal(symlink(".", path_in(p, sizeof(p), "loop/a/there")), 0);
    expect_open_error("loop", "", STOKE_ELIMIT, "is a again: a symlink loop");
    mkdirs("loopup/a/deep");
    write_jpeg("loopup/a/x.jpg", 8, 8, K_BASELINE, 90);
    assert_int_equal(symlink("../..", path_in(p, sizeof(p), "loopup/a/deep/up")), 0);
    expect_open_error("loopup", "", STOKE_ELIMIT, "a/deep/up/a is a again");
    /* a link to another class's directory is no loop: its files count under this class too,
     * as torchvision's ImageFolder (os.walk(followlinks=True)) counts them */
    mkdirs("linked/a");
    mkdirs("linked/b");
    write_jpeg("linked/a/x.jpg", 8, 8, K_BASELINE, 90);
    write_jpeg("linked/b/y.jpg", 8, 8, K_BASELINE, 90);
    assert_int_equal(symlink("../a", path_in(p, sizeof(p), "linked/b/froma")), 0);
    char spec[1100];
    stoke__fmt(spec, sizeof(spec), "images:%s/linked", g_root);
    stoke_dataset ds;
    assert_int_equal(stoke_source_open(spec, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 3);
    ds.close(ds.user);
    memset(&ds, 0, sizeof(ds));
    expect_open_error("noclass/top.jpg", "", STOKE_EIO, "not a directory");
    expect_open_error("emptyclass", ",size=0", STOKE_EINVAL, "bad size '0'");
    /* the options listed are those the parser takes, from the one list */
    expect_open_error("emptyclass", ",train,bogus=1", STOKE_EINVAL,
                      "unknown option 'bogus' (size=, train, eval, layout=, dtype=, mean=, "
                      "std=, seed=, max_decode_bytes=)");
    expect_open_error("emptyclass", ",trian", STOKE_ENOENT,
                      ",trian', and 'trian' is no images: option (size=, train, eval, layout=, "
                      "dtype=, mean=, std=, seed=, max_decode_bytes=): a misspelt option?");
    expect_open_error("emptyclass", ",max_decode_byte=9", STOKE_ENOENT,
                      "'max_decode_byte=9' is no images: option");
    expect_open_error("emptyclass", ",mean=0.1:0.2:0.3", STOKE_EINVAL, "dtype=f32");
    expect_open_error("emptyclass", ",seed=x", STOKE_EINVAL, "bad seed");
    expect_open_error("emptyclass", ",layout=nchw", STOKE_EINVAL, "bad layout");
    /* alternatives given both: refused (the last one silently won) */
    expect_open_error("emptyclass", ",train,eval", STOKE_EINVAL,
                      "'train' and 'eval' are alternatives: give one");
    expect_open_error("emptyclass", ",eval,size=8,train", STOKE_EINVAL,
                      "'train' and 'eval' are alternatives: give one");
    assert_int_equal(stoke_source_open("images:", &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "no directory"));
    assert_int_equal(stoke_images_open(NULL, NULL, &ds), STOKE_EINVAL);
    stoke_images_opts o;
    stoke_images_opts_init(&o);
    o.size = 4;
    assert_int_equal(stoke_images_open(g_root, &o, &ds), STOKE_EINVAL);
}

/* `stoke load images:...` through the CLI: canonical indices in the JSON. */
static void test_cli(void **state)
{
    write_tree("tree");
    char spec[1024], out[8192], err[4096];
    stoke__fmt(spec, sizeof(spec), "images:%s/tree,train,size=16", g_root);
    const char *args[] = {spec, "--workers", "2", "--batch-size", "3", "--json", NULL};
    int st = tu_run_cli(NULL, "load", args, out, sizeof(out), err, sizeof(err));
    if (st != 0)
        fail_msg("stoke load: status %d: %s %s", st, out, err);
    assert_non_null(strstr(out, "\"samples\": 7"));
    assert_non_null(strstr(out, "\"index_sum\": 21")); /* 0 + 1 + ... + 6 */
}

static int setup(void **state)
{
    const char *tmp = getenv("STOKE_TEST_TMP");
    stoke__fmt(g_root, sizeof(g_root), "%s/images.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (!mkdtemp(g_root))
        return -1;
    return 0;
}

static int teardown(void **state)
{
    const char *argv[] = {"/bin/rm", "-rf", g_root, NULL};
    char out[256], err[256];
    return tu_run(argv, NULL, out, sizeof(out), err, sizeof(err)) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_set_epoch_calls),
        cmocka_unit_test(test_options),
        cmocka_unit_test(test_eval_matches_reference),
        cmocka_unit_test(test_eval_center_rounding),
        cmocka_unit_test(test_crop_equals_full_width),
        cmocka_unit_test(test_train_matches_reference),
        cmocka_unit_test(test_tiny),
        cmocka_unit_test(test_corruptions),
        cmocka_unit_test(test_unsupported_jpeg),
        cmocka_unit_test(test_layouts_and_dtypes),
        cmocka_unit_test(test_kernels_agree),
        cmocka_unit_test(test_decode_only),
        cmocka_unit_test(test_folder_order_and_labels),
        cmocka_unit_test(test_train_workers_and_epochs),
        cmocka_unit_test(test_spec_options),
        cmocka_unit_test(test_tar_jpg_members),
        cmocka_unit_test(test_corrupt_jpeg_policies),
        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_fifo_after_scan),
        cmocka_unit_test(test_decode_memory_limit),
        cmocka_unit_test(test_too_many_scans),
        cmocka_unit_test(test_arith_bad_code),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_cli),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, setup, teardown));
}

#endif
