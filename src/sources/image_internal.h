/* Private to image*.c: crop choice, the separable antialiased resampler and the writer of output
 * rows.
 *
 * The filter is a triangle (linear interpolation when enlarging) whose support is stretched by
 * the shrink factor when shrinking, so every source pixel under an output pixel contributes
 * (area-like antialiasing, as PIL's BILINEAR resize).  Weights are Q14 fixed point; the passes
 * work on 8-bit RGB with an 8-bit intermediate, rounding to nearest. */
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

/* Horizontal pass of one RGB row (src: buffer of source samples) into a->out RGB pixels. */
void stoke__rs_row(const stoke__rs_axis *a, const uint8_t *src, uint8_t *dst);
/* Vertical pass for output row y: rows is the intermediate (row r at rows + r * stride), acc a
 * scratch of `width` ints; writes `width` bytes to dst. */
void stoke__rs_col(const stoke__rs_axis *a, int y, const uint8_t *rows, size_t stride, size_t width,
                   int32_t *acc, uint8_t *dst);

/* Writes output row y (size RGB pixels, HWC order in `row`) into the sample at dst in the
 * layout and dtype of o, mirrored when flip.  lut: 3 x 256 floats (f32 only). */
void stoke__image_store_row(const stoke__image_opts *o, const uint8_t *row, int y, int flip,
                            const float *lut, void *dst);
/* The f32 table of o: lut[c * 256 + v] = (v / 255 - mean[c]) / std[c] (or v / 255). */
void stoke__image_lut(const stoke__image_opts *o, float *lut);

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
