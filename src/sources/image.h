/* Private: JPEG decode + transform into a sample slot, shared by the images: and tar: sources.
 *
 * One call decodes one JPEG (libjpeg-turbo's libjpeg API), reading only what the output needs
 * (the crop's columns and rows, DCT-domain downscaling when the crop is much larger than the
 * output), converts it to RGB, resamples the crop to size x size with an antialiased separable
 * filter, optionally flips it, and writes it as u8 or normalized f32, CHW or HWC.  Random
 * choices (train) are a pure function of (seed, epoch, index).  See docs/sources.md. */
#ifndef STOKE_SOURCES_IMAGE_H
#define STOKE_SOURCES_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/dataset.h"

/* Files (images:) and .jpg members (tar:) larger than this are refused before they are read. */
#define STOKE__IMAGE_FILE_MAX ((size_t)256 << 20)
/* The default of max_decode_bytes=: the working memory one decode may need (docs/sources.md). */
#define STOKE__IMAGE_DECODE_MAX ((uint64_t)256 << 20)

typedef struct stoke__image_opts {
    int size;      /* output side (default 224) */
    int train;     /* 1: RandomResizedCrop(size, scale=(0.08,1), ratio=(3/4,4/3)) + hflip; 0:
                      eval: short side to size/0.875, center crop */
    int mode_given; /* 't' or 'e' once train or eval was given (the other is then refused) */
    int chw;       /* 1: layout CHW (default), 0: HWC */
    int dtype;     /* STOKE_DTYPE_U8 (default) or STOKE_DTYPE_F32 */
    int normalize; /* mean/std given (f32 only) */
    float mean[3], std[3];
    uint64_t seed;       /* augmentation seed */
    uint64_t max_decode; /* bytes one decode may use (default STOKE__IMAGE_DECODE_MAX) */
    int kernel;          /* resampler kernels: 0 the fastest here, 1 portable C (tests) */
    int decode_only;     /* 1: decode the rows a sample needs and write nothing (the probe of
                            bench/bench_decode.c); dst is not touched */
    int full_width;      /* 1: decode every column, not only the crop's (tests: the output must
                            be the same) */
} stoke__image_opts;

/* 1 when this build has libjpeg (otherwise stoke__image_decode returns STOKE_ENOTSUP). */
int stoke__image_available(void);

void stoke__image_opts_init(stoke__image_opts *o);
/* Parses one spec option ("size=224", "train", "eval", "layout=chw", "dtype=f32",
 * "mean=R:G:B", "std=R:G:B", also "seed=N", "max_decode_bytes=SIZE" (K/M/G); key without '=', val
 * the text after it, NULL or "" for a bare word): 1 consumed, 0 not an image option, <0
 * STOKE_EINVAL with msg written. */
int stoke__image_parse_opt(stoke__image_opts *o, const char *key, const char *val, char *msg,
                           size_t msg_len);
/* Fills the "data" field description for these options.  Returns STOKE_OK or STOKE_EINVAL
 * (options inconsistent: normalize with u8, size out of range). */
int stoke__image_field(const stoke__image_opts *o, stoke_field *f, int64_t shape[3]);
/* Decodes JPEG bytes and writes the transformed image into dst (f->bytes bytes).  Random
 * choices from (o->seed, epoch, index) only.  Errors: negative STOKE_E* code + message (what
 * is wrong with the image; the caller adds the file name): STOKE_ELIMIT, before anything is
 * decoded, for an image whose decode would need more than o->max_decode bytes (the message
 * names its dimensions, the estimate and max_decode_bytes=).  Thread-safe. */
int stoke__image_decode(const stoke__image_opts *o, const void *jpeg, size_t len, uint64_t epoch,
                        uint64_t index, void *dst, char *msg, size_t msg_len);

#endif
