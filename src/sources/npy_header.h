/* The .npy header parser: a pure function over a byte buffer (no I/O, no allocation, no global
 * state), so that the libFuzzer target in tests/fuzz/ can drive it on its own. */
#ifndef STOKE_NPY_HEADER_H
#define STOKE_NPY_HEADER_H

#include <stddef.h>
#include <stdint.h>

#define STOKE__NPY_MAX_HEADER 65536u /* bytes of header dict we accept (numpy reads 10000) */
#define STOKE__NPY_MAX_NDIM 64       /* numpy 2's NPY_MAXDIMS */
#define STOKE__NPY_PREFIX_MAX (12u + STOKE__NPY_MAX_HEADER) /* bytes a caller must supply */

typedef struct stoke__npy_header {
    int major, minor;         /* format version: 1.0, 2.0 or 3.0 */
    size_t data_offset;       /* first byte of the array data */
    char descr[32];           /* as written: "<f4", "|u1", "|V16" */
    int dtype;                /* stoke_dtype (STOKE_DTYPE_RAW for V<n> / S<n>) */
    size_t itemsize;          /* bytes per element */
    size_t swap;              /* 0, or the unit (2/4/8) to byte-swap for native order */
    int fortran_order;        /* always 0 on success (Fortran order is rejected) */
    int ndim;                 /* 0..STOKE__NPY_MAX_NDIM */
    int64_t shape[STOKE__NPY_MAX_NDIM];
    uint64_t count;           /* elements = prod(shape) */
    uint64_t data_bytes;      /* count * itemsize */
} stoke__npy_header;

/* Parses the .npy preamble and header dict in buf[0, len) — the first `len` bytes of a file of
 * `file_size` bytes (len <= file_size; pass at least min(file_size, STOKE__NPY_PREFIX_MAX)).
 * Checks the magic, version, header length, the dict ({'descr': ..., 'fortran_order': ...,
 * 'shape': (...)} with exactly those keys), the dtype, the shape (no negative dimension, no
 * overflow) and that the file holds the data the shape calls for.
 * Returns 0 (STOKE_OK) and fills *h, or STOKE_EFORMAT with a NUL-terminated message (without
 * the file name) in err[0, err_len).  Never reads outside buf[0, len).  Thread-safe. */
int stoke__npy_parse_header(const void *buf, size_t len, uint64_t file_size,
                            stoke__npy_header *h, char *err, size_t err_len);

#endif
