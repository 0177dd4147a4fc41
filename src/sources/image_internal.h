/* Private to image*.c: crop choice, the separable antialiased resampler and the writer of output
 * rows.
 *
 * The filter is a triangle (linear interpolation when enlarging) whose support is stretched by
 * the shrink factor when shrinking, so every source pixel under an output pixel contributes
 * (area-like antialiasing, as PIL's BILINEAR resize).  Weights are Q14 fixed point; the passes
 * work on 8-bit RGB with an 8-bit intermediate, rounding to nearest.  The horizontal pass runs
 * on each decoded row as it arrives, into a ring of intermediate rows laid out as the output
 * (planar for CHW, interleaved for HWC, already mirrored when flipped); each output row is made
 * as soon as its last source row is in, and written straight into the sample's slot. */
#ifndef STOKE_SOURCES_IMAGE_INTERNAL_H
#define STOKE_SOURCES_IMAGE_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "sources/image.h"

#define STOKE__RS_BITS 14

/* The weights of one axis: output i reads source samples first[i] .. first[i] + n[i] - 1
 * (indices into the caller's buffer) with weights w[i * taps ...]. */
typedef struct stoke__rs_axis {
    int out, taps;
    int *first, *n;
    int16_t *w;
} stoke__rs_axis;

/* Weights for resampling the source interval [b0, b0 + blen) to `out` samples.  Taps are
 * clamped to source samples lo .. hi - 1 (lo < hi); `base` is the source index of the caller's
 * buffer element 0.  Returns 0, or -1 when out of memory. */
int stoke__rs_axis_init(stoke__rs_axis *a, double b0, double blen, int lo, int hi, int base,
                        int out);
void stoke__rs_axis_free(stoke__rs_axis *a);

/* Kernels of stoke__rs_plan: STOKE__RS_AUTO picks the fastest this CPU runs (AVX2 on x86-64
 * when it has it), STOKE__RS_SCALAR the portable C ones (same bytes; tests compare them). */
enum { STOKE__RS_AUTO = 0, STOKE__RS_SCALAR = 1 };

/* One decode's resampling of the box's rows into a size x size sample: made in two steps,
 * stoke__rs_plan_rows (the vertical axis: how many source rows it reads, and keeps) and,
 * once the decoder's column crop is known, stoke__rs_plan_cols; then stoke__rs_push for each
 * source row in order.  Everything it holds is freed by stoke__rs_plan_free. */
typedef struct stoke__rs_plan {
    const stoke__image_opts *o;
    int size, simd;
    stoke__rs_axis ax, ay; /* ax in output order: mirrored when flipped */
    int *need;             /* output row y can be made once need[y] source rows are in */
    int nread;             /* source rows read in all (need[size - 1]) */
    int ring;              /* intermediate rows kept */
    int pairs;             /* horizontal taps per output pixel / 2 */
    int32_t *hoff;         /* per output pixel (groups of 8): byte offset of its first tap */
    int16_t *hw;           /* horizontal weights in the kernel's layout */
    size_t seg;            /* planar: bytes from one channel's segment to the next; else 0 */
    size_t rowb;           /* bytes of one intermediate row, padding included */
    size_t src_pad;        /* bytes past a source row's end the horizontal pass may read */
    uint8_t *rows;         /* ring of `ring` intermediate rows */
    uint8_t *tmp;          /* f32: one u8 output row */
    float *fa, *fb;        /* f32: value i of a row is u8 * fa[i] + fb[i] */
    const uint8_t **rp;    /* one output row's source rows (ring + 1) */
    int32_t *pw;           /* its weights as (w_k, w_k+1) word pairs */
    int in, y;             /* source rows pushed, output rows made */
} stoke__rs_plan;

/* The vertical step: the box [by, by + bh) of decoded rows, rows y0 .. y1 - 1 readable (y0 is
 * the first row pushed).  kernel: STOKE__RS_AUTO or STOKE__RS_SCALAR.  0, or -1 (no memory). */
int stoke__rs_plan_rows(stoke__rs_plan *p, const stoke__image_opts *o, int kernel, double by,
                        double bh, int y0, int y1);
/* The horizontal step: the box [bx, bx + bw), columns x0 .. x1 - 1 readable, xoff the decoded
 * column of a source row's first pixel; mirrored when flip.  0, or -1 (no memory). */
int stoke__rs_plan_cols(stoke__rs_plan *p, double bx, double bw, int x0, int x1, int xoff,
                        int flip);
/* Bytes of working memory a plan of these sizes holds (for the decode-memory estimate). */
size_t stoke__rs_plan_bytes(const stoke__rs_plan *p);
/* Takes the next source row (RGB, readable for p->src_pad bytes past its last pixel) and
 * writes every output row it completes into the sample at dst. */
void stoke__rs_push(stoke__rs_plan *p, const uint8_t *src, void *dst);
void stoke__rs_plan_free(stoke__rs_plan *p);

/* ---- image.c ---- */
/* The crop box in source pixels (fractional for eval) and whether to mirror it. */
typedef struct stoke__image_crop {
    double x, y, w, h;
    int flip;
} stoke__image_crop;
/* train: RandomResizedCrop + flip drawn from (o->seed, epoch, index); eval: the center box. */
stoke__image_crop stoke__image_crop_for(const stoke__image_opts *o, int W, int H, uint64_t epoch,
                                        uint64_t index);
/* What the first bytes say a non-JPEG file is ("PNG image"), or NULL for a JPEG start. */
const char *stoke__image_sniff(const unsigned char *p, size_t n);

#endif
