/* The .npy header parser (see npy_header.h).  Depends on libc only: the fuzz target compiles
 * this file by itself.
 *
 * Format (numpy/lib/format.py): "\x93NUMPY", major, minor, header length (uint16 LE for 1.0,
 * uint32 LE for 2.0 and 3.0), then a Python dict literal padded with spaces and a newline:
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
 * Version 3.0 only changes the header's encoding to UTF-8 (structured field names); we accept
 * any bytes inside quoted strings and reject structured dtypes, so 1.0 and 3.0 parse alike. */
#include "sources/npy_header.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "stoke/dataset.h"
#include "stoke/status.h"

typedef struct parser {
    const unsigned char *p, *end, *start; /* start: beginning of the file, for offsets */
    char *err;
    size_t err_len;
} parser;

static int perr(parser *ps, const char *fmt, ...)
{
    if (ps->err && ps->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ps->err, ps->err_len, fmt, ap);
        va_end(ap);
    }
    return STOKE_EFORMAT;
}

static size_t off(const parser *ps) { return (size_t)(ps->p - ps->start); }

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

/* Describes the byte at the cursor for messages. */
static const char *what(const parser *ps, char *buf, size_t n)
{
    if (ps->p >= ps->end)
        return "the end of the header";
    unsigned char c = *ps->p;
    if (c >= 0x20 && c < 0x7f)
        snprintf(buf, n, "'%c'", c);
    else
        snprintf(buf, n, "byte 0x%02x", c);
    return buf;
}

static int expect(parser *ps, char c, const char *context)
{
    char b[16];
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == (unsigned char)c) {
        ps->p++;
        return 0;
    }
    return perr(ps, "malformed header dict: expected '%c' %s at byte %zu, found %s", c, context,
                off(ps), what(ps, b, sizeof(b)));
}

/* A quoted string without escapes, copied into out (truncated copies are flagged by *trunc). */
static int parse_string(parser *ps, char *out, size_t out_len, int *trunc, const char *context)
{
    char b[16];
    skip_ws(ps);
    if (ps->p >= ps->end || (*ps->p != '\'' && *ps->p != '"'))
        return perr(ps, "malformed header dict: expected a quoted %s at byte %zu, found %s",
                    context, off(ps), what(ps, b, sizeof(b)));
    unsigned char q = *ps->p++;
    size_t n = 0;
    *trunc = 0;
    for (;;) {
        if (ps->p >= ps->end)
            return perr(ps, "malformed header dict: unterminated string (%s)", context);
        unsigned char c = *ps->p++;
        if (c == q)
            break;
        if (c == '\\')
            return perr(ps, "malformed header dict: escape sequence in a string at byte %zu",
                        off(ps) - 1);
        if (c == '\n' || c == 0)
            return perr(ps, "malformed header dict: unterminated string (%s)", context);
        if (n + 1 < out_len)
            out[n++] = (char)c;
        else
            *trunc = 1;
    }
    if (out_len)
        out[n] = 0;
    return 0;
}

static int parse_bool(parser *ps, int *out)
{
    char b[16];
    skip_ws(ps);
    size_t left = (size_t)(ps->end - ps->p);
    if (left >= 4 && memcmp(ps->p, "True", 4) == 0) {
        ps->p += 4;
        *out = 1;
        return 0;
    }
    if (left >= 5 && memcmp(ps->p, "False", 5) == 0) {
        ps->p += 5;
        *out = 0;
        return 0;
    }
    return perr(ps, "malformed header dict: 'fortran_order' must be True or False (byte %zu: %s)",
                off(ps), what(ps, b, sizeof(b)));
}

static int parse_shape(parser *ps, stoke__npy_header *h)
{
    char b[16];
    skip_ws(ps);
    if (ps->p >= ps->end || *ps->p != '(')
        return perr(ps, "malformed header dict: 'shape' must be a tuple, found %s at byte %zu",
                    what(ps, b, sizeof(b)), off(ps));
    ps->p++;
    int n = 0, commas = 0;
    for (;;) {
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ')') {
            ps->p++;
            break;
        }
        if (ps->p < ps->end && *ps->p == '-')
            return perr(ps, "negative dimension in 'shape' at byte %zu", off(ps));
        if (ps->p >= ps->end || *ps->p < '0' || *ps->p > '9')
            return perr(ps, "malformed header dict: expected a dimension in 'shape' at byte %zu, "
                            "found %s",
                        off(ps), what(ps, b, sizeof(b)));
        uint64_t v = 0;
        while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
            unsigned d = (unsigned)(*ps->p - '0');
            if (v > ((uint64_t)INT64_MAX - d) / 10)
                return perr(ps, "dimension in 'shape' at byte %zu overflows 64 bits", off(ps));
            v = v * 10 + d;
            ps->p++;
        }
        if (ps->p < ps->end && (*ps->p == 'L' || *ps->p == 'l')) /* Python 2 long */
            ps->p++;
        if (n >= STOKE__NPY_MAX_NDIM)
            return perr(ps, "'shape' has more than %d dimensions", STOKE__NPY_MAX_NDIM);
        h->shape[n++] = (int64_t)v;
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            commas++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == ')') {
            ps->p++;
            break;
        }
        return perr(ps, "malformed header dict: expected ',' or ')' in 'shape' at byte %zu, "
                        "found %s",
                    off(ps), what(ps, b, sizeof(b)));
    }
    if (n == 1 && commas == 0)
        return perr(ps, "'shape' (%lld) is not a tuple (a 1-tuple needs a trailing comma)",
                    (long long)h->shape[0]);
    h->ndim = n;
    return 0;
}

static int host_little(void)
{
    const uint16_t one = 1;
    unsigned char c;
    memcpy(&c, &one, 1);
    return c == 1;
}

/* Maps a descr string ("<f4") to dtype, itemsize and byte-swap unit. */
static int parse_descr(parser *ps, stoke__npy_header *h)
{
    const char *s = h->descr;
    char order = '|';
    if (*s == '<' || *s == '>' || *s == '|' || *s == '=')
        order = *s++;
    char kind = *s;
    if (!kind)
        return perr(ps, "empty dtype descr '%s'", h->descr);
    s++;
    uint64_t n = 0;
    int digits = 0;
    while (*s >= '0' && *s <= '9' && digits < 12) {
        n = n * 10 + (uint64_t)(*s - '0');
        s++;
        digits++;
    }
    if (!digits || *s)
        return perr(ps, "unsupported dtype descr '%s' (need a fixed-size type such as '<f4')",
                    h->descr);
    int dt = -1;
    size_t unit = 0; /* byte-swap unit for non-native order */
    switch (kind) {
    case 'b':
        if (n == 1)
            dt = STOKE_DTYPE_BOOL;
        break;
    case 'i':
        dt = n == 1 ? STOKE_DTYPE_I8 : n == 2 ? STOKE_DTYPE_I16 : n == 4 ? STOKE_DTYPE_I32
             : n == 8 ? STOKE_DTYPE_I64 : -1;
        unit = (size_t)n;
        break;
    case 'u':
        dt = n == 1 ? STOKE_DTYPE_U8 : n == 2 ? STOKE_DTYPE_U16 : n == 4 ? STOKE_DTYPE_U32
             : n == 8 ? STOKE_DTYPE_U64 : -1;
        unit = (size_t)n;
        break;
    case 'f':
        dt = n == 2 ? STOKE_DTYPE_F16 : n == 4 ? STOKE_DTYPE_F32 : n == 8 ? STOKE_DTYPE_F64 : -1;
        unit = (size_t)n;
        break;
    case 'c':
        dt = n == 8 ? STOKE_DTYPE_C64 : n == 16 ? STOKE_DTYPE_C128 : -1;
        unit = (size_t)n / 2;
        break;
    case 'V':
    case 'S':
    case 'a':
        if (n >= 1 && n <= ((uint64_t)1 << 31))
            dt = STOKE_DTYPE_RAW;
        unit = 1;
        break;
    case 'O':
        return perr(ps, "object arrays ('%s') are not supported: they hold pickled Python "
                        "objects, not fixed-size data",
                    h->descr);
    default:
        break;
    }
    if (dt < 0)
        return perr(ps, "unsupported dtype descr '%s'", h->descr);
    h->dtype = dt;
    h->itemsize = (size_t)n;
    h->swap = 0;
    if (unit > 1 && order != '|' && order != '=') {
        int file_little = order == '<';
        if (file_little != host_little())
            h->swap = unit;
    }
    return 0;
}

static void format_shape(const stoke__npy_header *h, char *buf, size_t n)
{
    size_t k = 0;
    int w = snprintf(buf, n, "(");
    k = w > 0 ? (size_t)w : 0;
    for (int i = 0; i < h->ndim && k < n; i++) {
        w = snprintf(buf + k, n - k, "%s%lld", i ? ", " : "", (long long)h->shape[i]);
        if (w < 0)
            break;
        k += (size_t)w;
    }
    if (k < n)
        snprintf(buf + k, n - k, h->ndim == 1 ? ",)" : ")");
}

enum { KEY_DESCR = 1, KEY_FORTRAN = 2, KEY_SHAPE = 4 };

int stoke__npy_parse_header(const void *buf, size_t len, uint64_t file_size,
                            stoke__npy_header *h, char *err, size_t err_len)
{
    static const unsigned char magic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
    const unsigned char *b = buf;
    parser ps = {b, b + len, b, err, err_len};
    if (err && err_len)
        err[0] = 0;
    if (!h || (!buf && len))
        return perr(&ps, "internal error: NULL argument");
    memset(h, 0, sizeof(*h));
    if (len > file_size)
        len = (size_t)file_size, ps.end = b + len;

    size_t m = len < 6 ? len : 6;
    if (m && memcmp(b, magic, m) != 0)
        return perr(&ps, "not a .npy file (bad magic: the file must start with \\x93NUMPY)");
    if (len < 8) {
        return perr(&ps, "truncated: the file has %llu bytes, fewer than the 8-byte .npy "
                         "preamble",
                    (unsigned long long)file_size);
    }
    h->major = b[6];
    h->minor = b[7];
    if (h->major < 1 || h->major > 3 || h->minor != 0)
        return perr(&ps, "unsupported .npy format version %d.%d (1.0, 2.0 and 3.0 are read)",
                    h->major, h->minor);
    size_t pre = h->major == 1 ? 10 : 12;
    if (len < pre)
        return perr(&ps, "truncated: the file has %llu bytes, fewer than the %zu-byte .npy "
                         "%d.0 preamble",
                    (unsigned long long)file_size, pre, h->major);
    uint64_t hlen = h->major == 1 ? (uint64_t)b[8] | (uint64_t)b[9] << 8
                                  : (uint64_t)b[8] | (uint64_t)b[9] << 8 |
                                        (uint64_t)b[10] << 16 | (uint64_t)b[11] << 24;
    if (hlen > STOKE__NPY_MAX_HEADER)
        return perr(&ps, "header length %llu exceeds the %u-byte limit", (unsigned long long)hlen,
                    STOKE__NPY_MAX_HEADER);
    if (pre + hlen > file_size)
        return perr(&ps, "truncated header: header length %llu runs past the end of the file "
                         "(%llu bytes)",
                    (unsigned long long)hlen, (unsigned long long)file_size);
    if (pre + hlen > len)
        return perr(&ps, "internal error: %zu header bytes supplied, %llu needed", len,
                    (unsigned long long)(pre + hlen));
    h->data_offset = pre + (size_t)hlen;

    ps.p = b + pre;
    ps.end = b + h->data_offset;
    int rc, seen = 0;
    if ((rc = expect(&ps, '{', "to open the header dict")))
        return rc;
    for (;;) {
        skip_ws(&ps);
        if (ps.p < ps.end && *ps.p == '}') {
            ps.p++;
            break;
        }
        char key[32];
        int trunc;
        size_t key_at = off(&ps);
        if ((rc = parse_string(&ps, key, sizeof(key), &trunc, "key")))
            return rc;
        int k = trunc                               ? 0
                : strcmp(key, "descr") == 0         ? KEY_DESCR
                : strcmp(key, "fortran_order") == 0 ? KEY_FORTRAN
                : strcmp(key, "shape") == 0         ? KEY_SHAPE
                                                    : 0;
        if (!k)
            return perr(&ps, "malformed header dict: unexpected key '%s%s' at byte %zu", key,
                        trunc ? "..." : "", key_at);
        if (seen & k)
            return perr(&ps, "malformed header dict: duplicate key '%s'", key);
        seen |= k;
        if ((rc = expect(&ps, ':', "after a key")))
            return rc;
        if (k == KEY_DESCR) {
            skip_ws(&ps);
            if (ps.p < ps.end && *ps.p == '[')
                return perr(&ps, "structured dtypes (a list 'descr') are not supported");
            if ((rc = parse_string(&ps, h->descr, sizeof(h->descr), &trunc, "'descr'")))
                return rc;
            if (trunc)
                return perr(&ps, "unsupported dtype descr '%s...' (too long)", h->descr);
        } else if (k == KEY_FORTRAN) {
            if ((rc = parse_bool(&ps, &h->fortran_order)))
                return rc;
        } else if ((rc = parse_shape(&ps, h))) {
            return rc;
        }
        skip_ws(&ps);
        if (ps.p < ps.end && *ps.p == ',') {
            ps.p++;
            continue;
        }
        if ((rc = expect(&ps, '}', "or ',' after a value")))
            return rc;
        break;
    }
    skip_ws(&ps);
    if (ps.p < ps.end) {
        char wb[16];
        return perr(&ps, "malformed header: %s after the header dict at byte %zu",
                    what(&ps, wb, sizeof(wb)), off(&ps));
    }
    if (!(seen & KEY_DESCR))
        return perr(&ps, "malformed header dict: missing key 'descr'");
    if (!(seen & KEY_FORTRAN))
        return perr(&ps, "malformed header dict: missing key 'fortran_order'");
    if (!(seen & KEY_SHAPE))
        return perr(&ps, "malformed header dict: missing key 'shape'");
    if ((rc = parse_descr(&ps, h)))
        return rc;

    /* numpy's rule: the bytes of the non-zero dimensions must fit in a signed 64-bit size,
     * even when another dimension is 0 (so a shape numpy cannot make is refused whichever
     * dimension is 0: (0, 2**62, 8) and (3, 0, 2**62, 8) alike) */
    uint64_t count = 1, nonzero = h->itemsize ? h->itemsize : 1;
    int overflow = 0;
    for (int i = 0; i < h->ndim; i++) {
        uint64_t d = (uint64_t)h->shape[i];
        if (!d) {
            count = 0;
            continue;
        }
        if (nonzero > (uint64_t)INT64_MAX / d)
            overflow = 1;
        else
            nonzero *= d;
        count *= d;
    }
    char shape[96];
    format_shape(h, shape, sizeof(shape));
    if (overflow)
        return perr(&ps, "shape %s of '%s' overflows 63 bits of bytes (numpy refuses it too)",
                    shape, h->descr);
    h->count = count;
    h->data_bytes = count * h->itemsize;
    if (h->fortran_order)
        return perr(&ps, "Fortran-order arrays are not supported (fortran_order is True; save "
                         "a C-order array, e.g. np.ascontiguousarray(a))");
    uint64_t avail = file_size - h->data_offset;
    if (h->data_bytes > avail)
        return perr(&ps, "data truncated: shape %s of '%s' needs %llu bytes after the "
                         "%zu-byte header, the file has %llu",
                    shape, h->descr, (unsigned long long)h->data_bytes, h->data_offset,
                    (unsigned long long)avail);
    return 0;
}
