/* The antialiased separable resampler of the image decoder (see image_internal.h and
 * docs/sources.md, "Resampling").
 *
 * Two sets of kernels compute the same integers: portable C, and AVX2 (x86-64, chosen at run
 * time with __builtin_cpu_supports; functions built with target("avx2"), so the rest of the
 * library keeps the baseline ISA).  Horizontal AVX2 pass: output pixels in groups of 8, pixel
 * j of a group in the low 128-bit lane and pixel j + 4 in the high one; per pair of taps one
 * 8-byte load per lane, a byte shuffle to (p0.r p1.r p0.g p1.g p0.b p1.b 0 0) as 16-bit words
 * and one pmaddwd with (w0 w1 w0 w1 w0 w1 0 0) give the pair's R, G, B sums; the group's 8
 * pixels are then packed to bytes and shuffled into the layout of the output (planar or
 * interleaved).  Vertical AVX2 pass: 32 bytes at a time, two rows interleaved bytewise, widened
 * to words and multiplied by a (w_k, w_k+1) word pair (pmaddwd), 4 x 8 sums packed back. */
#include "sources/image_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/dataset.h"

#if defined(__x86_64__) && defined(__GNUC__)
#define RS_X86 1
#include <immintrin.h>
#endif

#define RS_HALF (1 << (STOKE__RS_BITS - 1))

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
    const double to_q = (1 << STOKE__RS_BITS) / sum;
    for (int k = 0; k < n; k++) {
        w[k] = (int16_t)(wd[k] * to_q + 0.5); /* wd[k] >= 0: rounds half up, as lround */
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
    const double inv_fs = 1.0 / fs;
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
            sum += wd[x - x0] = triangle((x + 0.5 - center) * inv_fs);
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

/* Output i becomes output out - 1 - i. */
static void axis_mirror(stoke__rs_axis *a)
{
    const size_t t = (size_t)a->taps;
    for (int i = 0, j = a->out - 1; i < j; i++, j--) {
        int f = a->first[i], n = a->n[i];
        a->first[i] = a->first[j], a->n[i] = a->n[j];
        a->first[j] = f, a->n[j] = n;
        for (size_t k = 0; k < t; k++) {
            int16_t w = a->w[(size_t)i * t + k];
            a->w[(size_t)i * t + k] = a->w[(size_t)j * t + k];
            a->w[(size_t)j * t + k] = w;
        }
    }
}

static inline uint8_t clamp8(int32_t v)
{
    v >>= STOKE__RS_BITS;
    return (uint8_t)(v < 0 ? 0 : v > 255 ? 255 : v);
}

static size_t round_up(size_t n, size_t to)
{
    return (n + to - 1) / to * to;
}

/* ---- portable kernels ---- */

/* Horizontal: one RGB source row into an intermediate row (planar segments seg bytes apart,
 * or interleaved when seg is 0). */
static void h_scalar(const stoke__rs_plan *p, const uint8_t *src, uint8_t *dst)
{
    const stoke__rs_axis *a = &p->ax;
    const size_t seg = p->seg;
    for (int i = 0; i < a->out; i++) {
        const int16_t *w = a->w + (size_t)i * (size_t)a->taps;
        const uint8_t *s = src + 3 * (size_t)a->first[i];
        int32_t r = RS_HALF, g = RS_HALF, b = RS_HALF;
        for (int k = 0; k < a->n[i]; k++, s += 3) {
            r += w[k] * s[0];
            g += w[k] * s[1];
            b += w[k] * s[2];
        }
        if (seg) {
            dst[i] = clamp8(r);
            dst[seg + (size_t)i] = clamp8(g);
            dst[2 * seg + (size_t)i] = clamp8(b);
        } else {
            dst[3 * i] = clamp8(r);
            dst[3 * i + 1] = clamp8(g);
            dst[3 * i + 2] = clamp8(b);
        }
    }
}

/* Vertical: len bytes from offset off of the rows r[0 .. n-1], weighted by w. */
static void v_scalar(const uint8_t *const *r, const int16_t *w, int n, size_t off, size_t len,
                     uint8_t *dst)
{
    for (size_t x = 0; x < len; x++) {
        int32_t acc = RS_HALF;
        for (int k = 0; k < n; k++)
            acc += w[k] * r[k][off + x];
        dst[x] = clamp8(acc);
    }
}

static void to_f32_scalar(const uint8_t *u, const float *a, const float *b, float *out, size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (float)u[i] * a[i] + b[i];
}

/* ---- AVX2 kernels ---- */

#ifdef RS_X86
#define RS_AVX2 __attribute__((target("avx2")))

/* Horizontal weights of the AVX2 pass: per group of 8 outputs, per pair of taps q, per j in
 * 0..3, 16 words: (w0 w1 w0 w1 w0 w1 0 0) of output j, then the same of output j + 4. */
static void h_table(stoke__rs_plan *p, int groups)
{
    const stoke__rs_axis *a = &p->ax;
    for (int g = 0; g < groups; g++)
        for (int q = 0; q < p->pairs; q++)
            for (int j = 0; j < 8; j++) {
                int i = 8 * g + j;
                int16_t *v =
                    p->hw +
                    (((size_t)g * (size_t)p->pairs + (size_t)q) * 4 + (size_t)(j & 3)) * 16 +
                    (j >> 2) * 8;
                for (int t = 0; t < 2; t++) {
                    int k = 2 * q + t;
                    int16_t w =
                        i < a->out && k < a->n[i] ? a->w[(size_t)i * (size_t)a->taps + k] : 0;
                    v[t] = v[2 + t] = v[4 + t] = w;
                }
                v[6] = v[7] = 0;
            }
}

RS_AVX2 static void h_avx2(const stoke__rs_plan *p, const uint8_t *src, uint8_t *dst)
{
    const int groups = (p->size + 7) / 8, pairs = p->pairs;
    const __m256i pick = _mm256_setr_epi8(0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1,
                                          0, -1, 3, -1, 1, -1, 4, -1, 2, -1, 5, -1, -1, -1, -1, -1);
    const __m256i half = _mm256_set1_epi32(RS_HALF);
    const size_t seg = p->seg;
    __m256i order, gather;
    if (seg) { /* bytes (r g b 0) x 4 per lane -> r0-3 g0-3 b0-3; dwords -> R0-7 G0-7 B0-7 */
        order = _mm256_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12,
                                 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        gather = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    } else { /* -> (r g b) x 4 per lane; dwords -> 24 bytes of 8 pixels */
        order = _mm256_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14, 3, 7, 11, 15, 0, 1, 2, 4,
                                 5, 6, 8, 9, 10, 12, 13, 14, 3, 7, 11, 15);
        gather = _mm256_setr_epi32(0, 1, 2, 4, 5, 6, 3, 7);
    }
    const __m256i pick2 =
        _mm256_setr_epi8(6, -1, 9, -1, 7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1, 6, -1, 9, -1,
                         7, -1, 10, -1, 8, -1, 11, -1, -1, -1, -1, -1);
    const __m256i *w = (const __m256i *)(const void *)p->hw;
    for (int g = 0; g < groups; g++) {
        const int32_t *off = p->hoff + 8 * g;
        __m256i acc[4] = {half, half, half, half};
        int q = 0;
        /* two pairs (4 taps, 12 bytes) from one 16-byte load per pixel */
        for (; q + 1 < pairs; q += 2, w += 8) {
            const size_t t = 6 * (size_t)q;
            for (int j = 0; j < 4; j++) {
                __m128i lo = _mm_loadu_si128((const __m128i *)(const void *)(src + off[j] + t));
                __m128i hi = _mm_loadu_si128((const __m128i *)(const void *)(src + off[j + 4] + t));
                __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
                __m256i s0 =
                    _mm256_madd_epi16(_mm256_shuffle_epi8(v, pick), _mm256_loadu_si256(w + j));
                __m256i s1 =
                    _mm256_madd_epi16(_mm256_shuffle_epi8(v, pick2), _mm256_loadu_si256(w + 4 + j));
                acc[j] = _mm256_add_epi32(acc[j], _mm256_add_epi32(s0, s1));
            }
        }
        if (q < pairs) { /* the last pair: an 8-byte load */
            const size_t t = 6 * (size_t)q;
            for (int j = 0; j < 4; j++) {
                __m128i lo = _mm_loadl_epi64((const __m128i *)(const void *)(src + off[j] + t));
                __m128i hi = _mm_loadl_epi64((const __m128i *)(const void *)(src + off[j + 4] + t));
                __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
                v = _mm256_shuffle_epi8(v, pick);
                acc[j] = _mm256_add_epi32(acc[j], _mm256_madd_epi16(v, _mm256_loadu_si256(w + j)));
            }
            w += 4;
        }
        for (int j = 0; j < 4; j++)
            acc[j] = _mm256_srai_epi32(acc[j], STOKE__RS_BITS);
        __m256i px = _mm256_packus_epi16(_mm256_packs_epi32(acc[0], acc[1]),
                                         _mm256_packs_epi32(acc[2], acc[3]));
        px = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(px, order), gather);
        if (seg) {
            __m128i rg = _mm256_castsi256_si128(px), b = _mm256_extracti128_si256(px, 1);
            uint8_t *d = dst + 8 * (size_t)g;
            _mm_storel_epi64((__m128i *)(void *)d, rg);
            _mm_storeh_pd((double *)(void *)(d + seg), _mm_castsi128_pd(rg));
            _mm_storel_epi64((__m128i *)(void *)(d + 2 * seg), b);
        } else {
            _mm256_storeu_si256((__m256i *)(void *)(dst + 24 * (size_t)g), px);
        }
    }
}

/* 32 bytes of output x .. x + 31 into out. */
RS_AVX2 static inline __m256i v_avx2_32(const uint8_t *const *r, const int32_t *pw, int n,
                                        size_t at)
{
    const __m256i zero = _mm256_setzero_si256(), half = _mm256_set1_epi32(RS_HALF);
    __m256i a0 = half, a1 = half, a2 = half, a3 = half;
    for (int k = 0; k < n; k += 2) {
        const __m256i wv = _mm256_set1_epi32(pw[k / 2]);
        __m256i s0 = _mm256_loadu_si256((const __m256i *)(const void *)(r[k] + at));
        __m256i s1 = _mm256_loadu_si256((const __m256i *)(const void *)(r[k + 1] + at));
        __m256i lo = _mm256_unpacklo_epi8(s0, s1), hi = _mm256_unpackhi_epi8(s0, s1);
        a0 = _mm256_add_epi32(a0, _mm256_madd_epi16(_mm256_unpacklo_epi8(lo, zero), wv));
        a1 = _mm256_add_epi32(a1, _mm256_madd_epi16(_mm256_unpackhi_epi8(lo, zero), wv));
        a2 = _mm256_add_epi32(a2, _mm256_madd_epi16(_mm256_unpacklo_epi8(hi, zero), wv));
        a3 = _mm256_add_epi32(a3, _mm256_madd_epi16(_mm256_unpackhi_epi8(hi, zero), wv));
    }
    a0 = _mm256_srai_epi32(a0, STOKE__RS_BITS);
    a1 = _mm256_srai_epi32(a1, STOKE__RS_BITS);
    a2 = _mm256_srai_epi32(a2, STOKE__RS_BITS);
    a3 = _mm256_srai_epi32(a3, STOKE__RS_BITS);
    return _mm256_packus_epi16(_mm256_packs_epi32(a0, a1), _mm256_packs_epi32(a2, a3));
}

/* Vertical: as v_scalar, with the weights as (w_k, w_k+1) word pairs pw and n rounded up to
 * even (r[n] readable, its weight 0).  Reads up to 31 bytes past off + len of each row. */
RS_AVX2 static void v_avx2(const uint8_t *const *r, const int32_t *pw, int n, size_t off,
                           size_t len, uint8_t *dst)
{
    size_t x = 0;
    for (; x + 32 <= len; x += 32)
        _mm256_storeu_si256((__m256i *)(void *)(dst + x), v_avx2_32(r, pw, n, off + x));
    if (x < len) {
        uint8_t tail[32];
        _mm256_storeu_si256((__m256i *)(void *)tail, v_avx2_32(r, pw, n, off + x));
        memcpy(dst + x, tail, len - x);
    }
}

RS_AVX2 static void to_f32_avx2(const uint8_t *u, const float *a, const float *b, float *out,
                                size_t n)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (float)u[i] * a[i] + b[i];
}

static int have_avx2(void)
{
    return __builtin_cpu_supports("avx2");
}
#else
static int have_avx2(void)
{
    return 0;
}
#endif

/* ---- the plan ---- */

void stoke__rs_plan_free(stoke__rs_plan *p)
{
    stoke__rs_axis_free(&p->ax);
    stoke__rs_axis_free(&p->ay);
    free(p->need);
    free(p->hoff);
    free(p->hw);
    free(p->rows);
    free(p->tmp);
    free(p->fa);
    free(p->fb);
    free(p->rp);
    free(p->pw);
    memset(p, 0, sizeof(*p));
}

int stoke__rs_plan_rows(stoke__rs_plan *p, const stoke__image_opts *o, int kernel, double by,
                        double bh, int y0, int y1)
{
    memset(p, 0, sizeof(*p));
    p->o = o;
    p->size = o->size;
    p->simd = kernel == STOKE__RS_AUTO && have_avx2();
    if (stoke__rs_axis_init(&p->ay, by, bh, y0, y1, y0, o->size) != 0)
        return -1;
    p->need = malloc((size_t)o->size * sizeof(int));
    if (!p->need)
        return -1;
    /* need: the rows output y and every row before it read; ring: the rows kept for that */
    int need = 0, ring = 1;
    for (int y = 0; y < o->size; y++) {
        int end = p->ay.first[y] + p->ay.n[y];
        need = end > need ? end : need;
        p->need[y] = need;
        if (need - p->ay.first[y] > ring)
            ring = need - p->ay.first[y];
    }
    p->nread = need;
    p->ring = ring;
    p->rp = malloc(((size_t)ring + 1) * sizeof(*p->rp));
    p->pw = malloc(((size_t)ring / 2 + 1) * sizeof(*p->pw));
    if (!p->rp || !p->pw)
        return -1;
    const size_t s = (size_t)o->size;
    p->seg = o->chw ? round_up(s, 8) : 0;
    /* planar: three segments; interleaved: 3 * size bytes and the 8 the AVX2 store runs over;
     * then the 32 bytes the vertical pass may read past the end */
    p->rowb = round_up(3 * round_up(s, 8) + 64, 32);
    return 0;
}

size_t stoke__rs_plan_bytes(const stoke__rs_plan *p)
{
    const size_t s = (size_t)p->size;
    return (size_t)p->ring * p->rowb + p->rowb + 2 * 3 * s * sizeof(float) +
           s * (size_t)(p->ay.taps + 8) * 4;
}

int stoke__rs_plan_cols(stoke__rs_plan *p, double bx, double bw, int x0, int x1, int xoff, int flip)
{
    const stoke__image_opts *o = p->o;
    const size_t s = (size_t)p->size;
    if (stoke__rs_axis_init(&p->ax, bx, bw, x0, x1, xoff, p->size) != 0)
        return -1;
    if (flip)
        axis_mirror(&p->ax);
    int maxn = 1;
    for (int i = 0; i < p->size; i++)
        maxn = p->ax.n[i] > maxn ? p->ax.n[i] : maxn;
    p->pairs = (maxn + 1) / 2;
    p->src_pad = 6 * (size_t)p->pairs + 16;
    p->rows = malloc((size_t)p->ring * p->rowb);
    if (!p->rows)
        return -1;
    /* the padding is read (and multiplied by 0) by the AVX2 passes: keep it defined */
    memset(p->rows, 0, (size_t)p->ring * p->rowb);
    if (o->dtype == STOKE_DTYPE_F32) {
        p->tmp = malloc(p->rowb);
        p->fa = malloc(3 * s * sizeof(float));
        p->fb = malloc(3 * s * sizeof(float));
        if (!p->tmp || !p->fa || !p->fb)
            return -1;
        for (size_t i = 0; i < 3 * s; i++) {
            size_t c = o->chw ? i / s : i % 3;
            double sd = o->normalize ? o->std[c] : 1.0, mean = o->normalize ? o->mean[c] : 0.0;
            p->fa[i] = (float)(1.0 / (255.0 * sd));
            p->fb[i] = (float)(-mean / sd);
        }
    }
#ifdef RS_X86
    if (p->simd) {
        const int groups = (p->size + 7) / 8;
        p->hoff = calloc((size_t)groups * 8, sizeof(int32_t));
        p->hw = malloc((size_t)groups * (size_t)p->pairs * 4 * 16 * sizeof(int16_t));
        if (!p->hoff || !p->hw)
            return -1;
        for (int i = 0; i < p->size; i++)
            p->hoff[i] = 3 * p->ax.first[i];
        h_table(p, groups);
    }
#endif
    return 0;
}

/* Output row y (its source rows all in the ring) into the sample at dst. */
static void emit(stoke__rs_plan *p, int y, void *dst)
{
    const stoke__image_opts *o = p->o;
    const size_t s = (size_t)p->size, plane = s * s;
    const stoke__rs_axis *a = &p->ay;
    const int n = a->n[y];
    const int16_t *w = a->w + (size_t)y * (size_t)a->taps;
    const uint8_t **rp = p->rp;
    int32_t *pw = p->pw;
    for (int k = 0; k < n; k++)
        rp[k] = p->rows + (size_t)((a->first[y] + k) % p->ring) * p->rowb;
    rp[n] = rp[n - 1];
    for (int k = 0; k < n; k += 2)
        pw[k / 2] = (int32_t)((uint32_t)(uint16_t)w[k] |
                              (uint32_t)(uint16_t)(k + 1 < n ? w[k + 1] : 0) << 16);
    const int segs = o->chw ? 3 : 1;
    const size_t len = o->chw ? s : 3 * s;
    for (int c = 0; c < segs; c++) {
        const size_t off = (size_t)c * p->seg;
        uint8_t *u =
            o->dtype == STOKE_DTYPE_U8
                ? (uint8_t *)dst + (o->chw ? (size_t)c * plane + (size_t)y * s : (size_t)y * 3 * s)
                : p->tmp;
#ifdef RS_X86
        if (p->simd)
            v_avx2(rp, pw, n, off, len, u);
        else
#endif
            v_scalar(rp, w, n, off, len, u);
        if (o->dtype == STOKE_DTYPE_F32) {
            float *f =
                (float *)dst + (o->chw ? (size_t)c * plane + (size_t)y * s : (size_t)y * 3 * s);
            const size_t at = o->chw ? (size_t)c * s : 0;
#ifdef RS_X86
            if (p->simd)
                to_f32_avx2(u, p->fa + at, p->fb + at, f, len);
            else
#endif
                to_f32_scalar(u, p->fa + at, p->fb + at, f, len);
        }
    }
}

void stoke__rs_push(stoke__rs_plan *p, const uint8_t *src, void *dst)
{
    uint8_t *row = p->rows + (size_t)(p->in % p->ring) * p->rowb;
#ifdef RS_X86
    if (p->simd)
        h_avx2(p, src, row);
    else
#endif
        h_scalar(p, src, row);
    p->in++;
    while (p->y < p->size && p->need[p->y] <= p->in) {
        emit(p, p->y, dst);
        p->y++;
    }
}
