/* The synthetic source: sample i's bytes are a pure function of (seed, i).
 *
 * key(seed, i) = mix(mix(seed) ^ i); word w of the sample = mix(key + G * (w + 1)), stored
 * little-endian; a tail shorter than 8 bytes takes the low bytes of the next word.  mix is the
 * splitmix64 finaliser (a bijection), so for one seed distinct indices give distinct keys and
 * the words of a sample are independent: any worker can fill any sample, and the loop has no
 * carried dependency (8 bytes per mix, several mixes in flight). */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "stoke/sources.h"

#define SYN_GOLDEN 0x9E3779B97F4A7C15ull

typedef struct syn {
    uint64_t seed, length;
    uint32_t classes;
    size_t bytes;
    uint64_t delay_index;
    uint32_t delay_us;
    stoke_field fields[2]; /* data, label */
    int64_t shape[STOKE_SYNTHETIC_MAX_DIMS];
} syn;

static inline uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static int host_little(void)
{
    const uint16_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
}

static inline uint64_t to_le(uint64_t v, int little)
{
    return little ? v : __builtin_bswap64(v);
}

void stoke_synthetic_fill(uint64_t seed, uint64_t index, void *dst, size_t bytes)
{
    unsigned char *d = dst;
    const uint64_t key = mix64(mix64(seed) ^ index);
    const int little = host_little();
    size_t words = bytes / 8, w = 0;
    for (; w + 4 <= words; w += 4) {
        uint64_t v0 = mix64(key + SYN_GOLDEN * (w + 1));
        uint64_t v1 = mix64(key + SYN_GOLDEN * (w + 2));
        uint64_t v2 = mix64(key + SYN_GOLDEN * (w + 3));
        uint64_t v3 = mix64(key + SYN_GOLDEN * (w + 4));
        v0 = to_le(v0, little), v1 = to_le(v1, little);
        v2 = to_le(v2, little), v3 = to_le(v3, little);
        memcpy(d + 8 * w, &v0, 8);
        memcpy(d + 8 * w + 8, &v1, 8);
        memcpy(d + 8 * w + 16, &v2, 8);
        memcpy(d + 8 * w + 24, &v3, 8);
    }
    for (; w < words; w++) {
        uint64_t v = to_le(mix64(key + SYN_GOLDEN * (w + 1)), little);
        memcpy(d + 8 * w, &v, 8);
    }
    size_t tail = bytes - 8 * words;
    if (tail) {
        uint64_t v = mix64(key + SYN_GOLDEN * (words + 1));
        for (size_t k = 0; k < tail; k++)
            d[8 * words + k] = (unsigned char)(v >> (8 * k));
    }
}

static uint64_t syn_length(void *user)
{
    return ((const syn *)user)->length;
}

static int syn_get(void *user, uint64_t index, void *const dst[], int64_t len[], int worker,
                   char *msg, size_t msg_len)
{
    (void)len;
    const syn *s = user;
    if (index >= s->length) {
        stoke__fmt(msg, msg_len, "synthetic: index %llu out of range (length %llu)",
                   (unsigned long long)index, (unsigned long long)s->length);
        return STOKE_ERANGE;
    }
    if (s->delay_us && index == s->delay_index) {
        struct timespec ts = {(time_t)(s->delay_us / 1000000u),
                              (long)(s->delay_us % 1000000u) * 1000};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
            ;
    }
    if (dst[0])
        stoke_synthetic_fill(s->seed, index, dst[0], s->bytes);
    if (s->classes && dst[1]) {
        int64_t label = (int64_t)(index % s->classes);
        memcpy(dst[1], &label, sizeof(label));
    }
    return STOKE_OK;
}

static void syn_close(void *user)
{
    free(user);
}

void stoke_synthetic_opts_init(stoke_synthetic_opts *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->size = (uint32_t)sizeof(*opts);
    opts->length = 50000;
    opts->dtype = STOKE_DTYPE_U8;
    opts->ndim = 3;
    opts->shape[0] = 3;
    opts->shape[1] = 32;
    opts->shape[2] = 32;
}

int stoke_synthetic_open(const stoke_synthetic_opts *opts, stoke_dataset *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "synthetic: NULL dataset");
    stoke_dataset_init(out);
    stoke_synthetic_opts def;
    if (!opts) {
        stoke_synthetic_opts_init(&def);
        opts = &def;
    }
    if (opts->size < offsetof(stoke_synthetic_opts, delay_index))
        return stoke__fail(STOKE_EINVAL,
                           "synthetic: opts->size %u is not sizeof(stoke_synthetic_opts) "
                           "(call stoke_synthetic_opts_init)",
                           (unsigned)opts->size);
    int has_delay = opts->size >= offsetof(stoke_synthetic_opts, delay_us) + sizeof(uint32_t);
    stoke_dataset ds;
    stoke_dataset_init(&ds);
    ds.kind = STOKE_DATASET_MAP;
    syn t;
    memset(&t, 0, sizeof(t));
    stoke_field *f = &t.fields[0];
    stoke__strlcpy(f->name, "data", sizeof(f->name));
    f->dtype = opts->dtype;
    f->itemsize = opts->itemsize;
    f->ndim = opts->ndim;
    if (opts->ndim < 0 || opts->ndim > STOKE_SYNTHETIC_MAX_DIMS)
        return stoke__fail(STOKE_EINVAL, "synthetic: ndim %d not in 0..%d", opts->ndim,
                           STOKE_SYNTHETIC_MAX_DIMS);
    for (int d = 0; d < opts->ndim; d++) {
        if (opts->shape[d] <= 0)
            return stoke__fail(STOKE_EINVAL, "synthetic: dimension %d is %lld (must be > 0)", d,
                               (long long)opts->shape[d]);
        t.shape[d] = opts->shape[d];
    }
    f->shape = t.shape;
    int rc = stoke_field_finish(f);
    if (rc) {
        char why[256];
        stoke__strlcpy(why, stoke_last_error(), sizeof(why));
        return stoke__fail(rc, "synthetic: %s", why);
    }
    ds.nfields = 1;
    if (opts->classes) {
        stoke_field *l = &t.fields[1];
        stoke__strlcpy(l->name, "label", sizeof(l->name));
        l->dtype = STOKE_DTYPE_I64;
        l->ndim = 0;
        if ((rc = stoke_field_finish(l)))
            return rc;
        ds.nfields = 2;
    }
    syn *s = calloc(1, sizeof(*s));
    if (!s)
        return stoke__fail(STOKE_ENOMEM, "synthetic: out of memory");
    *s = t;
    s->fields[0].shape = s->shape;
    ds.fields = s->fields;
    s->seed = opts->seed;
    s->length = opts->length;
    s->classes = opts->classes;
    s->bytes = s->fields[0].bytes;
    if (has_delay && opts->delay_us) {
        s->delay_index = opts->delay_index;
        s->delay_us = opts->delay_us;
    }
    stoke__fmt(ds.name, sizeof(ds.name), "synthetic:%llu", (unsigned long long)opts->length);
    ds.user = s;
    ds.length = syn_length;
    ds.get = syn_get;
    ds.close = syn_close;
    *out = ds;
    return STOKE_OK;
}
