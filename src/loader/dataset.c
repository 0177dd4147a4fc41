/* stoke — dataset helpers: init/close, field geometry, dtype names and sizes. */
#include <stdint.h>
#include <string.h>

#include "common/internal.h"
#include "stoke/dataset.h"

typedef struct dtype_info {
    const char *name;
    size_t size;
} dtype_info;

/* Indexed by stoke_dtype. */
static const dtype_info DTYPES[] = {
    [STOKE_DTYPE_RAW] = {"raw", 0}, [STOKE_DTYPE_BOOL] = {"bool", 1},
    [STOKE_DTYPE_U8] = {"u8", 1},   [STOKE_DTYPE_I8] = {"i8", 1},
    [STOKE_DTYPE_U16] = {"u16", 2}, [STOKE_DTYPE_I16] = {"i16", 2},
    [STOKE_DTYPE_U32] = {"u32", 4}, [STOKE_DTYPE_I32] = {"i32", 4},
    [STOKE_DTYPE_U64] = {"u64", 8}, [STOKE_DTYPE_I64] = {"i64", 8},
    [STOKE_DTYPE_F16] = {"f16", 2}, [STOKE_DTYPE_BF16] = {"bf16", 2},
    [STOKE_DTYPE_F32] = {"f32", 4}, [STOKE_DTYPE_F64] = {"f64", 8},
    [STOKE_DTYPE_C64] = {"c64", 8}, [STOKE_DTYPE_C128] = {"c128", 16},
};

static int dtype_known(int dtype)
{
    return dtype >= 0 && (size_t)dtype < STOKE__ARRAY_LEN(DTYPES);
}

const char *stoke_dtype_name(int dtype)
{
    return dtype_known(dtype) ? DTYPES[dtype].name : "unknown";
}

size_t stoke_dtype_size(int dtype)
{
    return dtype_known(dtype) ? DTYPES[dtype].size : 0;
}

void stoke_dataset_init(stoke_dataset *ds)
{
    if (!ds)
        return;
    memset(ds, 0, sizeof(*ds));
    ds->size = (uint32_t)sizeof(*ds);
}

void stoke_dataset_close(stoke_dataset *ds)
{
    if (!ds)
        return;
    if (ds->close)
        ds->close(ds->user);
    memset(ds, 0, sizeof(*ds));
}

int stoke_field_finish(stoke_field *field)
{
    if (!field)
        return stoke__fail(STOKE_EINVAL, "field: NULL");
    const char *name = field->name;
    if (!dtype_known(field->dtype))
        return stoke__fail(STOKE_EINVAL, "field '%.64s': unknown dtype %d", name, field->dtype);
    if (field->dtype != STOKE_DTYPE_RAW)
        field->itemsize = DTYPES[field->dtype].size;
    else if (field->itemsize == 0)
        return stoke__fail(STOKE_EINVAL, "field '%.64s': raw dtype needs an itemsize", name);
    if (field->ndim < 0 || (field->ndim > 0 && !field->shape))
        return stoke__fail(STOKE_EINVAL, "field '%.64s': ndim %d %s", name, field->ndim,
                           field->ndim < 0 ? "is negative" : "without a shape");
    int ragged = field->ndim > 0 && field->shape[0] == STOKE_DIM_VAR;
    if (ragged && (field->max_len < 1 || field->multiple_of < 0 ||
                   (field->collate != STOKE_COLLATE_PAD && field->collate != STOKE_COLLATE_PACK)))
        return stoke__fail(STOKE_EINVAL,
                           "field '%.64s': a ragged field needs max_len >= 1 (got %lld), "
                           "multiple_of >= 0 and collate PAD or PACK",
                           name, (long long)field->max_len);
    size_t bytes = field->itemsize;
    for (int d = 0; d < field->ndim; d++) {
        int64_t n = d == 0 && ragged ? field->max_len : field->shape[d];
        if (n < 0)
            return stoke__fail(STOKE_EINVAL, "field '%.64s': dimension %d is %lld%s", name, d,
                               (long long)n,
                               n == STOKE_DIM_VAR ? " (only the first may vary)" : "");
        if (n > 0 && bytes > SIZE_MAX / (uint64_t)n)
            return stoke__fail(STOKE_ERANGE, "field '%.64s': sample size overflows", name);
        bytes *= (size_t)n;
    }
    field->bytes = bytes;
    return STOKE_OK;
}

void stoke_slots_sample(const stoke_slots *s, int nfields, const stoke_field *fields, size_t j,
                        void **dst)
{
    size_t lo = 0, hi = s->nruns; /* the run holding j: start[lo] <= j < start[lo + 1] */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->start[mid] <= j)
            lo = mid;
        else
            hi = mid;
    }
    size_t k = j - s->start[lo];
    for (int f = 0; f < nfields; f++) {
        unsigned char *b = s->base[lo * (size_t)nfields + (size_t)f];
        dst[f] = b ? b + k * fields[f].bytes : NULL;
    }
}
