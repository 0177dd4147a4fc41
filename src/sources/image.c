/* Image options, the spec words that set them, the output field, and the crop box of a decode
 * (RandomResizedCrop for train, the center box for eval).  The JPEG decoding itself is in
 * image_jpeg.c, the resampler in image_resample.c; docs/sources.md describes the whole. */
#include "sources/image.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "sources/image_internal.h"

#define IMAGE_SIZE_MAX   8192
#define IMAGE_DECODE_MIN ((uint64_t)1 << 20) /* max_decode_bytes= below this: refused */

void stoke__image_opts_init(stoke__image_opts *o)
{
    memset(o, 0, sizeof(*o));
    o->size = 224;
    o->train = 0;
    o->chw = 1;
    o->dtype = STOKE_DTYPE_U8;
    for (int c = 0; c < 3; c++)
        o->std[c] = 1.0f;
    o->max_decode = STOKE__IMAGE_DECODE_MAX;
}

/* "R:G:B" (three finite floats). */
static int parse_rgb(const char *s, float v[3])
{
    const char *p = s;
    for (int c = 0; c < 3; c++) {
        char *end;
        double d = strtod(p, &end);
        if (end == p || !isfinite(d) || *end != (c < 2 ? ':' : '\0'))
            return -1;
        v[c] = (float)d;
        p = end + 1;
    }
    return 0;
}

int stoke__image_parse_opt(stoke__image_opts *o, const char *key, const char *val, char *msg,
                           size_t msg_len)
{
    if (val && !*val)
        val = NULL;
    if (strcmp(key, "train") == 0 || strcmp(key, "eval") == 0) {
        if (val) {
            stoke__fmt(msg, msg_len, "'%s' takes no value", key);
            return STOKE_EINVAL;
        }
        if (o->mode_given && o->mode_given != key[0]) { /* (the last one silently won) */
            stoke__fmt(msg, msg_len, "'train' and 'eval' are alternatives: give one");
            return STOKE_EINVAL;
        }
        o->mode_given = key[0];
        o->train = key[0] == 't';
        return 1;
    }
    int known = strcmp(key, "size") == 0 || strcmp(key, "layout") == 0 ||
                strcmp(key, "dtype") == 0 || strcmp(key, "mean") == 0 || strcmp(key, "std") == 0 ||
                strcmp(key, "seed") == 0 || strcmp(key, "max_decode_bytes") == 0;
    if (!known)
        return 0;
    if (!val) {
        stoke__fmt(msg, msg_len, "option '%s' needs a value (%s=...)", key, key);
        return STOKE_EINVAL;
    }
    uint64_t v;
    if (strcmp(key, "size") == 0) {
        if (stoke__parse_u64(val, &v) != 0 || v == 0 || v > IMAGE_SIZE_MAX) {
            stoke__fmt(msg, msg_len, "bad size '%s' (1..%d)", val, IMAGE_SIZE_MAX);
            return STOKE_EINVAL;
        }
        o->size = (int)v;
    } else if (strcmp(key, "seed") == 0) {
        if (stoke__parse_u64(val, &o->seed) != 0) {
            stoke__fmt(msg, msg_len, "bad seed '%s'", val);
            return STOKE_EINVAL;
        }
    } else if (strcmp(key, "max_decode_bytes") == 0) {
        if (stoke__parse_size(val, &v) != 0 || v < IMAGE_DECODE_MIN) {
            stoke__fmt(msg, msg_len, "bad max_decode_bytes '%s' (bytes, with K/M/G; at least 1M)",
                       val);
            return STOKE_EINVAL;
        }
        o->max_decode = v;
    } else if (strcmp(key, "layout") == 0) {
        if (strcmp(val, "chw") != 0 && strcmp(val, "hwc") != 0) {
            stoke__fmt(msg, msg_len, "bad layout '%s' (chw or hwc)", val);
            return STOKE_EINVAL;
        }
        o->chw = val[0] == 'c';
    } else if (strcmp(key, "dtype") == 0) {
        if (strcmp(val, "u8") != 0 && strcmp(val, "f32") != 0) {
            stoke__fmt(msg, msg_len, "bad dtype '%s' (u8 or f32)", val);
            return STOKE_EINVAL;
        }
        o->dtype = val[0] == 'u' ? STOKE_DTYPE_U8 : STOKE_DTYPE_F32;
    } else {
        int is_std = key[0] == 's';
        float rgb[3];
        if (parse_rgb(val, rgb) != 0) {
            stoke__fmt(msg, msg_len, "bad %s '%s' (three numbers R:G:B, e.g. %s)", key, val,
                       is_std ? "0.229:0.224:0.225" : "0.485:0.456:0.406");
            return STOKE_EINVAL;
        }
        for (int c = 0; c < 3 && is_std; c++)
            if (!(rgb[c] > 0)) {
                stoke__fmt(msg, msg_len, "bad std '%s' (each value must be > 0)", val);
                return STOKE_EINVAL;
            }
        memcpy(is_std ? o->std : o->mean, rgb, sizeof(rgb));
        o->normalize = 1;
    }
    return 1;
}

int stoke__image_field(const stoke__image_opts *o, stoke_field *f, int64_t shape[3])
{
    if (o->size <= 0 || o->size > IMAGE_SIZE_MAX)
        return stoke__fail(STOKE_EINVAL, "image size %d not in 1..%d", o->size, IMAGE_SIZE_MAX);
    if (o->dtype != STOKE_DTYPE_U8 && o->dtype != STOKE_DTYPE_F32)
        return stoke__fail(STOKE_EINVAL, "image dtype %s: u8 or f32 only",
                           stoke_dtype_name(o->dtype));
    if (o->normalize && o->dtype != STOKE_DTYPE_F32)
        return stoke__fail(STOKE_EINVAL, "mean=/std= need dtype=f32 (u8 output is not "
                                         "normalized)");
    memset(f, 0, sizeof(*f));
    stoke__strlcpy(f->name, "data", sizeof(f->name));
    f->dtype = o->dtype;
    f->ndim = 3;
    shape[o->chw ? 0 : 2] = 3;
    shape[o->chw ? 1 : 0] = o->size;
    shape[o->chw ? 2 : 1] = o->size;
    f->shape = shape;
    return stoke_field_finish(f);
}

const char *stoke__image_sniff(const unsigned char *p, size_t n)
{
    if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF)
        return NULL;
    if (n == 0)
        return "empty file";
    if (n >= 8 && memcmp(p, "\x89PNG\r\n\x1a\n", 8) == 0)
        return "PNG image";
    if (n >= 6 && (memcmp(p, "GIF87a", 6) == 0 || memcmp(p, "GIF89a", 6) == 0))
        return "GIF image";
    if (n >= 12 && memcmp(p, "RIFF", 4) == 0 && memcmp(p + 8, "WEBP", 4) == 0)
        return "WebP image";
    if (n >= 4 && (memcmp(p, "II*\0", 4) == 0 || memcmp(p, "MM\0*", 4) == 0))
        return "TIFF image";
    if (n >= 2 && p[0] == 'B' && p[1] == 'M')
        return "BMP image";
    if (n >= 12 && memcmp(p + 4, "ftyp", 4) == 0)
        return "HEIF/AVIF or MP4 data";
    if (n >= 2 && p[0] == 0xFF && p[1] == 0xD8)
        return "truncated JPEG";
    return "unknown data";
}

/* ---- randomness: a pure function of (seed, epoch, index) ---- */

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

typedef struct rng {
    uint64_t s;
} rng;

static double rng_uniform(rng *r) /* [0, 1) */
{
    r->s += 0x9E3779B97F4A7C15ull;
    return (double)(mix64(r->s) >> 11) * 0x1.0p-53;
}

/* Uniform integer in 0..n (inclusive), as Python's randint(0, n). */
static int rng_int(rng *r, int n)
{
    int v = (int)(rng_uniform(r) * (n + 1));
    return v > n ? n : v;
}

typedef stoke__image_crop crop;

/* RandomResizedCrop(scale=(0.08, 1), ratio=(3/4, 4/3)): ten tries, then the center crop
 * clamped to the ratio range; then a fair coin for the flip. */
static crop train_crop(const stoke__image_opts *o, int W, int H, uint64_t epoch, uint64_t index)
{
    rng r = {mix64(mix64(o->seed ^ 0x2545F4914F6CDD1Dull) ^ (mix64(epoch) + index))};
    const double area = (double)W * H, lr0 = log(3.0 / 4.0), lr1 = log(4.0 / 3.0);
    crop c = {0, 0, W, H, 0};
    int found = 0;
    for (int t = 0; t < 10 && !found; t++) {
        double target = area * (0.08 + rng_uniform(&r) * 0.92);
        double ar = exp(lr0 + rng_uniform(&r) * (lr1 - lr0));
        int w = (int)lround(sqrt(target * ar)), h = (int)lround(sqrt(target / ar));
        if (w > 0 && w <= W && h > 0 && h <= H) {
            c.y = rng_int(&r, H - h);
            c.x = rng_int(&r, W - w);
            c.w = w, c.h = h;
            found = 1;
        }
    }
    if (!found) {
        double ratio = (double)W / H;
        int w = W, h = H;
        if (ratio < 3.0 / 4.0)
            h = (int)lround(W / (3.0 / 4.0));
        else if (ratio > 4.0 / 3.0)
            w = (int)lround(H * (4.0 / 3.0));
        h = h > H ? H : h < 1 ? 1 : h;
        w = w > W ? W : w < 1 ? 1 : w;
        c.x = (W - w) / 2, c.y = (H - h) / 2, c.w = w, c.h = h;
    }
    c.flip = rng_uniform(&r) < 0.5;
    return c;
}

/* x rounded to the nearest integer, halves to the even one (Python's round()). */
static double half_even(double x)
{
    double r = round(x); /* halves away from zero */
    return fabs(x - trunc(x)) == 0.5 ? 2.0 * round(x / 2.0) : r;
}

/* Resize(size / 0.875) (short side; long side truncated, as torchvision) then CenterCrop(size),
 * expressed as the box of source pixels the output covers. */
static crop eval_crop(const stoke__image_opts *o, int W, int H)
{
    int s = (int)(o->size / 0.875);
    int rw, rh;
    if (W <= H)
        rw = s, rh = (int)((double)s * H / W);
    else
        rh = s, rw = (int)((double)s * W / H);
    if (rw < 1)
        rw = 1;
    if (rh < 1)
        rh = 1;
    /* torchvision's CenterCrop rounds with Python's round(): halves to even (58.5 -> 58) */
    double left = half_even((rw - o->size) / 2.0), top = half_even((rh - o->size) / 2.0);
    double fx = (double)W / rw, fy = (double)H / rh;
    crop c = {left * fx, top * fy, o->size * fx, o->size * fy, 0};
    return c;
}

crop stoke__image_crop_for(const stoke__image_opts *o, int W, int H, uint64_t epoch, uint64_t index)
{
    return o->train ? train_crop(o, W, H, epoch, index) : eval_crop(o, W, H);
}
