/* JPEG decoding for stoke__image_decode (image.h; docs/sources.md).
 *
 * One decode: read the header; take the crop box in source pixels (image.c); pick the largest
 * DCT-domain reduction M/8 that keeps the box at least `size` pixels on both sides; start the
 * decompressor, restrict it to the box's columns (jpeg_crop_scanline), skip the rows above the
 * box (jpeg_skip_scanlines), read the box's rows only, resampling each horizontally as it
 * arrives, and stop there (rows below the box are never decoded); then resample vertically and
 * write the rows into the sample's slot.  libjpeg errors, and the warnings that mean corrupt or
 * missing image data, come back through a setjmp error manager: never exit(). */
#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"
#include "sources/image_internal.h"

#ifndef STOKE_HAVE_LIBJPEG

int stoke__image_available(void)
{
    return 0;
}

int stoke__image_decode(const stoke__image_opts *o, const void *jpeg, size_t len, uint64_t epoch,
                        uint64_t index, void *dst, char *msg, size_t msg_len)
{
    stoke__fmt(msg, msg_len,
               "JPEG decoding is not available: stoke was built without libjpeg "
               "(Debian libjpeg62-turbo-dev)");
    return STOKE_ENOTSUP;
}

#else

#include <math.h>
#include <setjmp.h>
#include <stdio.h> /* jpeglib.h needs FILE */
#include <stdlib.h>
#include <string.h>

#include <jpeglib.h>
/* after jpeglib.h, which it depends on */
#include <jerror.h>

/* Pixels above which an image is refused (a progressive JPEG keeps all its coefficients). */
#define IMAGE_PIXELS_MAX ((uint64_t)1 << 27)

int stoke__image_available(void)
{
    return 1;
}

typedef struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char text[JMSG_LENGTH_MAX];
} jerr;

/* Everything a decode owns, freed by dec_free whether it ended normally or by longjmp. */
typedef struct dec {
    struct jpeg_decompress_struct cinfo;
    jerr err;
    int created;
    stoke__rs_axis ax, ay;
    uint8_t *line; /* one decoded scanline (3 or 4 bytes per pixel) */
    uint8_t *rows; /* the horizontally resampled rows: size * 3 bytes each */
    int32_t *acc;  /* vertical accumulator: size * 3 */
    uint8_t *out;  /* one output row, RGB */
} dec;

static void on_error_exit(j_common_ptr c)
{
    jerr *e = (jerr *)c->err;
    c->err->format_message(c, e->text);
    longjmp(e->jb, 1);
}

/* Warnings that mean image data is missing or corrupt end the decode; the others (extraneous
 * bytes between markers, an unknown JFIF revision or Adobe transform, a bad ICC marker) do
 * not change the pixels and are ignored. */
static void on_emit(j_common_ptr c, int level)
{
    if (level >= 0)
        return; /* trace messages */
    switch (c->err->msg_code) {
    case JWRN_JPEG_EOF:
    case JWRN_HIT_MARKER:
    case JWRN_MUST_RESYNC:
    case JWRN_HUFF_BAD_CODE:
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL: on_error_exit(c); break;
    default: break;
    }
}

static void on_output(j_common_ptr c)
{
    (void)c;
}

static void dec_free(dec *d)
{
    if (d->created)
        jpeg_destroy_decompress(&d->cinfo); /* also abandons a decode stopped early */
    stoke__rs_axis_free(&d->ax);
    stoke__rs_axis_free(&d->ay);
    free(d->line);
    free(d->rows);
    free(d->acc);
    free(d->out);
}

/* The smallest M in 1..8 with the box, scaled by M/8, at least `size` on both sides. */
static int dct_scale(const stoke__image_crop *c, int size)
{
    for (int m = 1; m < 8; m *= 2)
        if (c->w * m / 8 >= size && c->h * m / 8 >= size)
            return m;
    return 8;
}

/* CMYK (or YCCK decoded to CMYK) to RGB in place.  Adobe (Photoshop) files store the inks
 * inverted: 255 is no ink. */
static void cmyk_to_rgb(uint8_t *p, size_t n, int inverted)
{
    for (size_t i = 0; i < n; i++) {
        unsigned c = p[4 * i], m = p[4 * i + 1], y = p[4 * i + 2], k = p[4 * i + 3];
        if (!inverted)
            c = 255 - c, m = 255 - m, y = 255 - y, k = 255 - k;
        p[3 * i] = (uint8_t)((c * k + 127) / 255);
        p[3 * i + 1] = (uint8_t)((m * k + 127) / 255);
        p[3 * i + 2] = (uint8_t)((y * k + 127) / 255);
    }
}

static int set_color(dec *d, int *cmyk, char *msg, size_t msg_len)
{
    switch (d->cinfo.jpeg_color_space) {
    case JCS_GRAYSCALE:
    case JCS_YCbCr:
    case JCS_RGB:
#ifdef JCS_EXTENSIONS
        d->cinfo.out_color_space = JCS_EXT_RGB;
#else
        d->cinfo.out_color_space = JCS_RGB;
#endif
        *cmyk = 0;
        return STOKE_OK;
    case JCS_CMYK:
    case JCS_YCCK:
        d->cinfo.out_color_space = JCS_CMYK;
        *cmyk = 1;
        return STOKE_OK;
    default:
        stoke__fmt(msg, msg_len, "unsupported JPEG color space (%d components)",
                   d->cinfo.num_components);
        return STOKE_EFORMAT;
    }
}

/* The decode proper: may longjmp to stoke__image_decode on a libjpeg error. */
static int run(dec *d, const stoke__image_opts *o, const unsigned char *data, size_t len,
               uint64_t epoch, uint64_t index, void *dst, char *msg, size_t msg_len)
{
    struct jpeg_decompress_struct *ci = &d->cinfo;
    jpeg_create_decompress(ci);
    d->created = 1;
    jpeg_mem_src(ci, data, (unsigned long)len);
    jpeg_read_header(ci, TRUE);
    const int W = (int)ci->image_width, H = (int)ci->image_height, size = o->size;
    if ((uint64_t)W * (uint64_t)H > IMAGE_PIXELS_MAX) {
        stoke__fmt(msg, msg_len, "image of %dx%d pixels is larger than the limit (%llu pixels)", W,
                   H, (unsigned long long)IMAGE_PIXELS_MAX);
        return STOKE_ELIMIT;
    }
    int cmyk, rc = set_color(d, &cmyk, msg, msg_len);
    if (rc)
        return rc;
    const int inverted = cmyk && ci->saw_Adobe_marker;
    const stoke__image_crop c = stoke__image_crop_for(o, W, H, epoch, index);
    ci->scale_num = (unsigned)dct_scale(&c, size);
    ci->scale_denom = 8;
    jpeg_start_decompress(ci);

    /* The box in decoded (scaled) pixels, and the region read: the box, plus the filter's
     * reach on each side for eval (which resamples the whole image before its center crop). */
    const int ow = (int)ci->output_width, oh = (int)ci->output_height;
    /* An 8x8 block becomes MxM: source x maps to x * M / 8 (output_width, rounded up, is not
     * the scale) */
    const double fx = (double)ci->scale_num / ci->scale_denom, fy = fx;
    const double bx = c.x * fx, bw = c.w * fx, by = c.y * fy, bh = c.h * fy;
    const double mx = o->train ? 0 : fmax(bw / size, 1.0) + 1;
    const double my = o->train ? 0 : fmax(bh / size, 1.0) + 1;
    int x0 = (int)fmax(0, floor(bx - mx)), x1 = (int)fmin(ow, ceil(bx + bw + mx));
    int y0 = (int)fmax(0, floor(by - my)), y1 = (int)fmin(oh, ceil(by + bh + my));
    if (x1 <= x0)
        x1 = x0 + 1 <= ow ? x0 + 1 : ow, x0 = x1 - 1;
    if (y1 <= y0)
        y1 = y0 + 1 <= oh ? y0 + 1 : oh, y0 = y1 - 1;
    JDIMENSION xoff = 0, cw = (JDIMENSION)ow;
    if (x0 > 0 || x1 < ow) {
        xoff = (JDIMENSION)x0;
        cw = (JDIMENSION)(x1 - x0);
        jpeg_crop_scanline(ci, &xoff, &cw); /* widens to iMCU boundaries */
    }
    const size_t nrows = (size_t)(y1 - y0), rowb = (size_t)size * 3;
    d->line = malloc((size_t)ci->output_width * (size_t)ci->output_components);
    d->rows = malloc(nrows * rowb);
    d->acc = malloc(rowb * sizeof(int32_t));
    d->out = malloc(rowb);
    if (!d->line || !d->rows || !d->acc || !d->out ||
        stoke__rs_axis_init(&d->ax, bx, bw, x0, x1, (int)xoff, size) != 0 ||
        stoke__rs_axis_init(&d->ay, by, bh, y0, y1, y0, size) != 0) {
        stoke__fmt(msg, msg_len, "out of memory decoding a %dx%d image", W, H);
        return STOKE_ENOMEM;
    }
    if (y0 > 0 && jpeg_skip_scanlines(ci, (JDIMENSION)y0) != (JDIMENSION)y0) {
        stoke__fmt(msg, msg_len, "could not skip to row %d", y0);
        return STOKE_EFORMAT;
    }
    for (size_t r = 0; r < nrows; r++) {
        JSAMPROW row = d->line;
        if (jpeg_read_scanlines(ci, &row, 1) != 1) {
            stoke__fmt(msg, msg_len, "corrupt JPEG: row %zu of %d could not be read",
                       (size_t)y0 + r, oh);
            return STOKE_EFORMAT;
        }
        if (cmyk)
            cmyk_to_rgb(d->line, ci->output_width, inverted);
        stoke__rs_row(&d->ax, d->line, d->rows + r * rowb);
    }
    float lut[3 * 256];
    if (o->dtype == STOKE_DTYPE_F32)
        stoke__image_lut(o, lut);
    for (int y = 0; y < size; y++) {
        stoke__rs_col(&d->ay, y, d->rows, rowb, rowb, d->acc, d->out);
        stoke__image_store_row(o, d->out, y, c.flip, lut, dst);
    }
    return STOKE_OK;
}

int stoke__image_decode(const stoke__image_opts *o, const void *jpeg, size_t len, uint64_t epoch,
                        uint64_t index, void *dst, char *msg, size_t msg_len)
{
    const char *what = stoke__image_sniff(jpeg, len);
    if (what) {
        stoke__fmt(msg, msg_len, "not a JPEG (%s)", what);
        return STOKE_EFORMAT;
    }
    dec *d = calloc(1, sizeof(*d));
    if (!d) {
        stoke__fmt(msg, msg_len, "out of memory");
        return STOKE_ENOMEM;
    }
    d->cinfo.err = jpeg_std_error(&d->err.pub);
    d->err.pub.error_exit = on_error_exit;
    d->err.pub.emit_message = on_emit;
    d->err.pub.output_message = on_output;
    int rc;
    if (setjmp(d->err.jb)) {
        stoke__fmt(msg, msg_len, "corrupt JPEG: %s", d->err.text);
        rc = STOKE_EFORMAT;
    } else {
        rc = run(d, o, jpeg, len, epoch, index, dst, msg, msg_len);
    }
    dec_free(d);
    free(d);
    return rc;
}

#endif
