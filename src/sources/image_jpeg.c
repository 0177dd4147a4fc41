/* JPEG decoding for stoke__image_decode (image.h; docs/sources.md).
 *
 * One decode: read the header; take the crop box in source pixels (image.c); pick the largest
 * DCT-domain reduction M/8 that keeps the box at least `size` pixels on both sides; start the
 * decompressor, restrict it to the box's columns (jpeg_crop_scanline), skip the rows above the
 * box (jpeg_skip_scanlines), read the rows the filter needs READ_ROWS at a time and hand them
 * to the resampler (image_resample.c: output rows go into the sample's slot as soon as they can
 * be made), and stop there (rows below are never decoded).  libjpeg errors, and the warnings
 * that mean corrupt or missing image data, come back through a setjmp error manager: never
 * exit(). */
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

#include <limits.h>
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

/* Scanlines decoded before the resampler reads them.  Row by row, decoder and resampler took
 * turns on every line: the resampler read each line while the decoder's stores of it were still
 * in flight, and the two evicted each other's code and tables; 16 at a time made the resampling
 * about half as costly (bench/bench_decode: stoke's decode + resample from ~930 to ~1,120
 * images per CPU-second, the decoder alone ~1,200). */
#define READ_ROWS        16

int stoke__image_available(void)
{
    return 1;
}

typedef struct jerr {
    struct jpeg_error_mgr pub;
    jmp_buf jb;
    char text[JMSG_LENGTH_MAX];
    int scans; /* the decode stopped at a scan past MAX_SCANS (on_progress) */
} jerr;

/* The most scans a JPEG may have.  A progressive file has about 10 (libjpeg's script), 20 at
 * most from the encoders in use; each scan is a pass over all the image's blocks, so a file
 * of a scan repeated thousands of times (75 bytes each) made one sample cost minutes of CPU
 * within the memory limit (libjpeg-turbo's advice for this: djpeg -maxscans). */
#define MAX_SCANS        256

/* Everything a decode owns, freed by dec_free whether it ended normally or by longjmp. */
typedef struct dec {
    struct jpeg_decompress_struct cinfo;
    jerr err;
    struct jpeg_progress_mgr progress; /* on_progress: the scans counted */
    int created;
    stoke__rs_plan rs;
    uint8_t *line; /* READ_ROWS decoded scanlines, `pitch` bytes apart */
    size_t pitch;  /* a line: 3 or 4 bytes per pixel and the resampler's pad, cache-aligned */
} dec;

static void on_error_exit(j_common_ptr c)
{
    jerr *e = (jerr *)c->err;
    c->err->format_message(c, e->text);
    longjmp(e->jb, 1);
}

/* libjpeg's errors for a well-formed JPEG this libjpeg cannot decode (12-bit samples, a
 * lossless or hierarchical process, a feature left out of the build), as opposed to a
 * malformed one. */
static int unsupported(int msg_code)
{
    return msg_code == JERR_BAD_PRECISION || msg_code == JERR_SOF_UNSUPPORTED ||
           msg_code == JERR_ARITH_NOTIMPL || msg_code == JERR_NOT_COMPILED;
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
#if JPEG_LIB_VERSION >= 70 || defined(D_ARITH_CODING_SUPPORTED) /* (else not in jerror.h) */
    case JWRN_ARITH_BAD_CODE:
#endif
    case JWRN_BOGUS_PROGRESSION:
    case JWRN_NOT_SEQUENTIAL: on_error_exit(c); break;
    default: break;
    }
}

/* libjpeg's progress hook, called as it reads the file's scans: a file of more than MAX_SCANS
 * ends the decode. */
static void on_progress(j_common_ptr c)
{
    if (c->is_decompressor && ((j_decompress_ptr)c)->input_scan_number > MAX_SCANS) {
        jerr *e = (jerr *)c->err;
        e->scans = 1;
        longjmp(e->jb, 1);
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
    stoke__rs_plan_free(&d->rs);
    free(d->line);
}

/* The smallest M in 1..8 with the box, scaled by M/8, at least `size` on both sides. */
static int dct_scale(const stoke__image_crop *c, int size)
{
    for (int m = 1; m < 8; m *= 2)
        if (c->w * m / 8 >= size && c->h * m / 8 >= size)
            return m;
    return 8;
}

#if JPEG_LIB_VERSION >= 70
#define DCT_H(c)      ((c)->DCT_h_scaled_size)
#define DCT_V(c)      ((c)->DCT_v_scaled_size)
#define MIN_DCT_H(ci) ((ci)->min_DCT_h_scaled_size)
#define MIN_DCT_V(ci) ((ci)->min_DCT_v_scaled_size)
#else
#define DCT_H(c)      ((c)->DCT_scaled_size)
#define DCT_V(c)      ((c)->DCT_scaled_size)
#define MIN_DCT_H(ci) ((ci)->min_DCT_scaled_size)
#define MIN_DCT_V(ci) ((ci)->min_DCT_scaled_size)
#endif

/* Whether jpeg_crop_scanline gives ci's columns as the full decode does (after
 * jpeg_calc_output_dimensions).  At a DCT scale below 8/8, libjpeg-turbo makes a subsampled
 * component's IDCT larger than the luma's to do some of its upsampling; when that does only
 * part of it (4:1:0, luma 4x2 or 2x4 blocks: a 2x IDCT and 2x upsampling left), libjpeg-turbo
 * 2.1's cropped rows are wrong from some column on, and read memory it never wrote.  Those
 * images are decoded at full width. */
static int crop_ok(j_decompress_ptr ci)
{
    for (int k = 0; k < ci->num_components; k++) {
        const jpeg_component_info *cp = &ci->comp_info[k];
        const int idct_h = DCT_H(cp) != MIN_DCT_H(ci), idct_v = DCT_V(cp) != MIN_DCT_V(ci);
        const int up_h = ci->max_h_samp_factor * MIN_DCT_H(ci) != cp->h_samp_factor * DCT_H(cp);
        const int up_v = ci->max_v_samp_factor * MIN_DCT_V(ci) != cp->v_samp_factor * DCT_V(cp);
        if ((idct_h || idct_v) && (up_h || up_v))
            return 0;
    }
    return 1;
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

/* The working memory of decoding ci (after jpeg_read_header, with the output scale set and
 * jpeg_calc_output_dimensions called): a multi-scan (progressive) JPEG keeps every DCT
 * coefficient of the image until its last scan (2 bytes each, whatever the output scale: 3
 * bytes per pixel at 4:2:0, 6 at 4:4:4); every JPEG needs a few rows of each component at
 * the output scale (libjpeg's strips; counted generously: 4 iMCU rows); and this decoder the
 * READ_ROWS output lines and the resampler's `rs` bytes (its ring of rows and tables). */
static uint64_t decode_bytes(j_decompress_ptr ci, size_t rs)
{
    uint64_t b = 0;
    if (jpeg_has_multiple_scans(ci))
        for (int k = 0; k < ci->num_components; k++) {
            const jpeg_component_info *cp = &ci->comp_info[k];
            uint64_t w = cp->width_in_blocks, h = cp->height_in_blocks;
            uint64_t hs = (uint64_t)cp->h_samp_factor, vs = (uint64_t)cp->v_samp_factor;
            w = (w + hs - 1) / hs * hs;
            h = (h + vs - 1) / vs * vs;
            b += w * h * DCTSIZE2 * sizeof(JCOEF);
        }
    const uint64_t ow = ci->output_width, comps = (uint64_t)ci->num_components;
    b += ow * comps * 4 * (uint64_t)ci->max_v_samp_factor * (uint64_t)ci->scale_num;
    b += (ow * (uint64_t)ci->output_components + 128) * READ_ROWS; /* lines, pad, alignment */
    b += (uint64_t)rs;
    return b;
}

/* n bytes as a size word max_decode_bytes= takes back ("256M", "1500K"; bytes otherwise). */
static const char *size_word(uint64_t n, char *buf, size_t len)
{
    static const char unit[] = "GMK";
    for (int k = 0; k < 3; k++) {
        const uint64_t u = (uint64_t)1 << (30 - 10 * k);
        if (n >= u && n % u == 0) {
            stoke__fmt(buf, len, "%llu%c", (unsigned long long)(n / u), unit[k]);
            return buf;
        }
    }
    stoke__fmt(buf, len, "%llu", (unsigned long long)n);
    return buf;
}

/* The decode proper: may longjmp to stoke__image_decode on a libjpeg error. */
static int run(dec *d, const stoke__image_opts *o, const unsigned char *data, size_t len,
               uint64_t epoch, uint64_t index, void *dst, char *msg, size_t msg_len)
{
    struct jpeg_decompress_struct *ci = &d->cinfo;
    jpeg_create_decompress(ci);
    d->created = 1;
    d->progress.progress_monitor = on_progress; /* (after the create, which zeroes ci) */
    ci->progress = &d->progress;
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
    jpeg_calc_output_dimensions(ci); /* what jpeg_start_decompress will decode */

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
    if (stoke__rs_plan_rows(&d->rs, o, o->kernel, by, bh, y0, y1) != 0) {
        stoke__fmt(msg, msg_len, "out of memory decoding a %dx%d image", W, H);
        return STOKE_ENOMEM;
    }
    const uint64_t need = decode_bytes(ci, stoke__rs_plan_bytes(&d->rs));
    if (need > o->max_decode) {
        char b[32];
        stoke__fmt(msg, msg_len,
                   "%sJPEG of %dx%d pixels needs about %.1f MiB to decode, more than the limit "
                   "max_decode_bytes=%s (an option of images: and tar:)",
                   jpeg_has_multiple_scans(ci) ? "progressive " : "", W, H,
                   (double)need / (1 << 20), size_word(o->max_decode, b, sizeof(b)));
        return STOKE_ELIMIT;
    }
    /* libjpeg's own bound on its whole-image buffers: the estimate above already covers them,
     * so this only holds if the estimate is ever short (JERR_NO_BACKING_STORE, below) */
    ci->mem->max_memory_to_use =
        o->max_decode > (uint64_t)LONG_MAX ? LONG_MAX : (long)o->max_decode;
    jpeg_start_decompress(ci);
    JDIMENSION xoff = 0, cw = (JDIMENSION)ow;
    if ((x0 > 0 || x1 < ow) && !o->full_width && crop_ok(ci)) {
        /* one column more on each side than the filter reads: at a crop's edges libjpeg's
         * fancy upsampling repeats the edge chroma, where the full decode blends in the next
         * column's */
        const int c0 = x0 > 0 ? x0 - 1 : 0, c1 = x1 < ow ? x1 + 1 : ow;
        xoff = (JDIMENSION)c0;
        cw = (JDIMENSION)(c1 - c0);
        jpeg_crop_scanline(ci, &xoff, &cw); /* widens to iMCU boundaries */
    }
    int ok = stoke__rs_plan_cols(&d->rs, bx, bw, x0, x1, (int)xoff, c.flip) == 0;
    if (ok) { /* src_pad is known now */
        const size_t bytes = (size_t)ci->output_width * (size_t)ci->output_components;
        d->pitch = (bytes + d->rs.src_pad + 63) & ~(size_t)63;
        ok = (d->line = aligned_alloc(64, d->pitch * READ_ROWS)) != NULL;
    }
    if (!ok) {
        stoke__fmt(msg, msg_len, "out of memory decoding a %dx%d image", W, H);
        return STOKE_ENOMEM;
    }
    if (y0 > 0 && jpeg_skip_scanlines(ci, (JDIMENSION)y0) != (JDIMENSION)y0) {
        stoke__fmt(msg, msg_len, "could not skip to row %d", y0);
        return STOKE_EFORMAT;
    }
    /* the padding the resampler reads (with weight 0) is defined */
    const size_t used = (size_t)ci->output_width * (size_t)ci->output_components;
    JSAMPROW rows[READ_ROWS];
    for (int i = 0; i < READ_ROWS; i++) {
        rows[i] = d->line + (size_t)i * d->pitch;
        memset(rows[i] + used, 0, d->pitch - used);
    }
    /* the rows the vertical pass reads (rows below them are never decoded) */
    for (int r = 0; r < d->rs.nread;) {
        const int want = d->rs.nread - r < READ_ROWS ? d->rs.nread - r : READ_ROWS;
        int got = 0;
        while (got < want) {
            JDIMENSION n = jpeg_read_scanlines(ci, rows + got, (JDIMENSION)(want - got));
            if (n == 0) {
                stoke__fmt(msg, msg_len, "corrupt JPEG: row %d of %d could not be read",
                           y0 + r + got, oh);
                return STOKE_EFORMAT;
            }
            got += (int)n;
        }
        for (int i = 0; i < got; i++) {
            if (cmyk)
                cmyk_to_rgb(rows[i], ci->output_width, inverted);
            if (!o->decode_only)
                stoke__rs_push(&d->rs, rows[i], dst);
        }
        r += got;
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
        if (d->err.scans) {
            stoke__fmt(msg, msg_len,
                       "progressive JPEG of %ux%u pixels has more than %d scans (a real one has "
                       "about 10; each is a pass over the whole image)",
                       (unsigned)d->cinfo.image_width, (unsigned)d->cinfo.image_height, MAX_SCANS);
            rc = STOKE_ELIMIT;
        } else if (d->err.pub.msg_code == JERR_NO_BACKING_STORE) { /* max_memory_to_use reached */
            char b[32];
            stoke__fmt(msg, msg_len,
                       "JPEG of %ux%u pixels needs more than the limit max_decode_bytes=%s",
                       (unsigned)d->cinfo.image_width, (unsigned)d->cinfo.image_height,
                       size_word(o->max_decode, b, sizeof(b)));
            rc = STOKE_ELIMIT;
        } else if (unsupported(d->err.pub.msg_code)) {
            stoke__fmt(msg, msg_len, "unsupported JPEG: %s", d->err.text);
            rc = STOKE_ENOTSUP;
        } else {
            stoke__fmt(msg, msg_len, "corrupt JPEG: %s", d->err.text);
            rc = STOKE_EFORMAT;
        }
    } else {
        rc = run(d, o, jpeg, len, epoch, index, dst, msg, msg_len);
    }
    dec_free(d);
    free(d);
    return rc;
}

#endif
