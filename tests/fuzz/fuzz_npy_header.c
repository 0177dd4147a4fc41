/* libFuzzer target: the .npy header parser (src/sources/npy_header.c) over arbitrary bytes.
 * Built only with -DSTOKE_FUZZ=ON and clang; run by tests/fuzz/run.sh.  Beyond "no crash, no
 * sanitizer report" it checks the parser's promises on success and on failure. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sources/npy_header.h"
#include "stoke/dataset.h"
#include "stoke/status.h"

static void check(int ok)
{
    if (!ok)
        abort();
}

static size_t elem_size(int dtype)
{
    switch (dtype) {
    case STOKE_DTYPE_BOOL: case STOKE_DTYPE_U8: case STOKE_DTYPE_I8: return 1;
    case STOKE_DTYPE_U16: case STOKE_DTYPE_I16: case STOKE_DTYPE_F16: return 2;
    case STOKE_DTYPE_U32: case STOKE_DTYPE_I32: case STOKE_DTYPE_F32: return 4;
    case STOKE_DTYPE_U64: case STOKE_DTYPE_I64: case STOKE_DTYPE_F64: case STOKE_DTYPE_C64: return 8;
    case STOKE_DTYPE_C128: return 16;
    default: return 0;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size heap block so ASan sees any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    stoke__npy_header h;
    char err[256];
    memset(err, 'x', sizeof(err));
    int rc = stoke__npy_parse_header(buf, size, size, &h, err, sizeof(err));
    check(rc == 0 || rc == STOKE_EFORMAT);
    check(memchr(err, 0, sizeof(err)) != NULL);
    if (rc == 0) {
        check(h.major >= 1 && h.major <= 3 && h.minor == 0);
        check(h.fortran_order == 0);
        check(h.ndim >= 0 && h.ndim <= STOKE__NPY_MAX_NDIM);
        check(h.itemsize > 0);
        check(h.data_offset <= size);
        check(h.data_bytes <= size - h.data_offset);
        check(h.dtype == STOKE_DTYPE_RAW || h.itemsize == elem_size(h.dtype));
        uint64_t count = 1;
        for (int i = 0; i < h.ndim; i++) {
            check(h.shape[i] >= 0);
            count *= (uint64_t)h.shape[i];
        }
        check(count == h.count);
        check(h.swap == 0 || h.swap == 2 || h.swap == 4 || h.swap == 8);
    } else {
        check(err[0] != 0);
    }
    /* The same bytes seen as a prefix of a larger file: must not read past `size`. */
    rc = stoke__npy_parse_header(buf, size, (uint64_t)size + 4096, &h, err, sizeof(err));
    check(rc == 0 || rc == STOKE_EFORMAT);
    free(buf);
    return 0;
}
