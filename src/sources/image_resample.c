/* The antialiased separable resampler of the image decoder and the output-row writer (see
 * image_internal.h). */
#include "sources/image_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/dataset.h"

static double triangle(double x)
{
    x = fabs(x);
    return x < 1.0 ? 1.0 - x : 0.0;
}

void stoke__rs_axis_free(stoke__rs_axis *a)
{
    free(a->first);
    free(a->n);
    free(a->w);
    memset(a, 0, sizeof(*a));
}

/* Rounds the weights of one output to Q14 so that they sum to exactly 1 << STOKE__RS_BITS (a
 * flat region stays exactly flat): the rounding error goes to the largest weight. */
static void quantize(const double *wd, int n, double sum, int16_t *w)
{
    int total = 0, big = 0;
    for (int k = 0; k < n; k++) {
        w[k] = (int16_t)lround(wd[k] / sum * (1 << STOKE__RS_BITS));
        total += w[k];
        if (w[k] > w[big])
            big = k;
    }
    w[big] = (int16_t)(w[big] + ((1 << STOKE__RS_BITS) - total));
}

int stoke__rs_axis_init(stoke__rs_axis *a, double b0, double blen, int lo, int hi, int base,
                        int out)
{
    memset(a, 0, sizeof(*a));
    double scale = blen / out;
    double fs = scale > 1.0 ? scale : 1.0; /* filter stretch when shrinking */
    double support = fs;                   /* the triangle's radius is 1 */
    int taps = (int)ceil(support) * 2 + 2;
    if (taps > hi - lo)
        taps = hi - lo;
    a->out = out;
    a->taps = taps;
    a->first = malloc((size_t)out * sizeof(int));
    a->n = malloc((size_t)out * sizeof(int));
    a->w = calloc((size_t)out * (size_t)taps, sizeof(int16_t));
    double *wd = malloc((size_t)taps * sizeof(double));
    if (!a->first || !a->n || !a->w || !wd) {
        free(wd);
        stoke__rs_axis_free(a);
        return -1;
    }
    for (int i = 0; i < out; i++) {
        double center = b0 + (i + 0.5) * scale;
        int x0 = (int)floor(center - support + 0.5), x1 = (int)floor(center + support + 0.5);
        if (x0 < lo)
            x0 = lo;
        if (x1 > hi)
            x1 = hi;
        if (x1 - x0 > taps)
            x1 = x0 + taps;
        if (x1 <= x0) { /* the whole interval lies outside [lo, hi): the nearest sample */
            x0 = center < lo ? lo : hi - 1;
            x1 = x0 + 1;
        }
        double sum = 0;
        for (int x = x0; x < x1; x++)
            sum += wd[x - x0] = triangle((x + 0.5 - center) / fs);
        if (sum <= 0) { /* no tap under the filter (rounding at an edge): the nearest one */
            int nearest = (int)floor(center);
            x0 = nearest < lo ? lo : nearest >= hi ? hi - 1 : nearest;
            x1 = x0 + 1;
            wd[0] = sum = 1;
        }
        a->first[i] = x0 - base;
        a->n[i] = x1 - x0;
        quantize(wd, x1 - x0, sum, a->w + (size_t)i * (size_t)taps);
    }
    free(wd);
    return 0;
}

static inline uint8_t clamp8(int32_t v)
{
    v >>= STOKE__RS_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

void stoke__rs_row(const stoke__rs_axis *a, const uint8_t *src, uint8_t *dst)
{
    const int32_t half = 1 << (STOKE__RS_BITS - 1);
    for (int i = 0; i < a->out; i++) {
        const int16_t *w = a->w + (size_t)i * (size_t)a->taps;
        const uint8_t *s = src + 3 * (size_t)a->first[i];
        int32_t r = half, g = half, b = half;
        for (int k = 0; k < a->n[i]; k++, s += 3) {
            r += w[k] * s[0];
            g += w[k] * s[1];
            b += w[k] * s[2];
        }
        dst[3 * i] = clamp8(r);
        dst[3 * i + 1] = clamp8(g);
        dst[3 * i + 2] = clamp8(b);
    }
}

void stoke__rs_col(const stoke__rs_axis *a, int y, const uint8_t *rows, size_t stride, size_t width,
                   int32_t *acc, uint8_t *dst)
{
    const int16_t *w = a->w + (size_t)y * (size_t)a->taps;
    const uint8_t *r0 = rows + (size_t)a->first[y] * stride;
    for (size_t x = 0; x < width; x++)
        acc[x] = 1 << (STOKE__RS_BITS - 1);
    for (int k = 0; k < a->n[y]; k++) {
        const uint8_t *r = r0 + (size_t)k * stride;
        const int32_t wk = w[k];
        for (size_t x = 0; x < width; x++)
            acc[x] += wk * r[x];
    }
    for (size_t x = 0; x < width; x++)
        dst[x] = clamp8(acc[x]);
}

void stoke__image_lut(const stoke__image_opts *o, float *lut)
{
    for (int c = 0; c < 3; c++)
        for (int v = 0; v < 256; v++) {
            float f = (float)v / 255.0f;
            if (o->normalize)
                f = (f - o->mean[c]) / o->std[c];
            lut[c * 256 + v] = f;
        }
}

void stoke__image_store_row(const stoke__image_opts *o, const uint8_t *row, int y, int flip,
                            const float *lut, void *dst)
{
    const size_t n = (size_t)o->size, plane = n * n;
    if (o->dtype == STOKE_DTYPE_U8) {
        uint8_t *d = dst;
        if (!o->chw) {
            uint8_t *out = d + (size_t)y * n * 3;
            if (!flip) {
                memcpy(out, row, n * 3);
                return;
            }
            for (size_t x = 0; x < n; x++)
                memcpy(out + 3 * x, row + 3 * (n - 1 - x), 3);
            return;
        }
        for (int c = 0; c < 3; c++) {
            uint8_t *out = d + (size_t)c * plane + (size_t)y * n;
            for (size_t x = 0; x < n; x++)
                out[x] = row[3 * (flip ? n - 1 - x : x) + (size_t)c];
        }
        return;
    }
    float *f = dst;
    for (size_t x = 0; x < n; x++) {
        const uint8_t *p = row + 3 * (flip ? n - 1 - x : x);
        for (int c = 0; c < 3; c++) {
            float v = lut[c * 256 + p[c]];
            if (o->chw)
                f[(size_t)c * plane + (size_t)y * n + x] = v;
            else
                f[((size_t)y * n + x) * 3 + (size_t)c] = v;
        }
    }
}
