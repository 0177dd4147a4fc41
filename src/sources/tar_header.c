/* The tar parser: header blocks, pax records, and the walk over an archive (tar_header.h). */
#include "sources/tar_header.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stoke/status.h"

/* A GNU sparse member (tar --sparse): its data is not the file's bytes. */
#define SPARSE_MSG                                                                                 \
    "a GNU sparse file (made by tar --sparse): its data is a map of the file's holes and its "     \
    "fragments, which stoke does not read; make the shard without --sparse"

static int ferr(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return STOKE_EFORMAT;
}

/* An octal field of n bytes: optional leading spaces / NULs, digits, then a space or NUL (or the
 * end of the field).  0 and *out, or -1. */
static int parse_octal(const unsigned char *p, size_t n, uint64_t *out)
{
    size_t i = 0;
    while (i < n && (p[i] == ' ' || p[i] == 0))
        i++;
    uint64_t v = 0;
    size_t digits = 0;
    for (; i < n && p[i] >= '0' && p[i] <= '7'; i++, digits++) {
        if (v >> 60)
            return -1;
        v = v << 3 | (uint64_t)(p[i] - '0');
    }
    for (; i < n; i++)
        if (p[i] != ' ' && p[i] != 0)
            return -1;
    *out = v;
    return digits || n ? 0 : -1;
}

/* A numeric field: octal, or GNU base-256 (first byte 0x80: a positive big-endian number in the
 * remaining bits; 0xff: negative, refused).  Values past 2^63 - 1 are refused. */
static int parse_number(const unsigned char *p, size_t n, uint64_t *out)
{
    if (!(p[0] & 0x80))
        return parse_octal(p, n, out);
    if (p[0] != 0x80)
        return -1; /* negative (0xff...) or an unknown encoding */
    uint64_t v = 0;
    for (size_t i = 1; i < n; i++) {
        if (v >> 55)
            return -1;
        v = v << 8 | p[i];
    }
    if (v > (uint64_t)INT64_MAX)
        return -1;
    *out = v;
    return 0;
}

/* Copies a field of at most n bytes (NUL-terminated unless full) to dst; returns its length. */
static size_t field_str(char *dst, const unsigned char *p, size_t n)
{
    size_t len = 0;
    while (len < n && p[len])
        len++;
    memcpy(dst, p, len);
    dst[len] = 0;
    return len;
}

int stoke__tar_parse_block(const unsigned char blk[STOKE__TAR_BLOCK], stoke__tar_block *out,
                           char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = 0;
    size_t i = 0;
    while (i < STOKE__TAR_BLOCK && blk[i] == 0)
        i++;
    if (i == STOKE__TAR_BLOCK)
        return STOKE_EEND;
    uint64_t want;
    if (parse_octal(blk + 148, 8, &want) != 0)
        return ferr(err, err_len, "bad header checksum field (not octal): not a tar header");
    uint64_t usum = 0;
    int64_t ssum = 0;
    for (i = 0; i < STOKE__TAR_BLOCK; i++) {
        unsigned char c = (i >= 148 && i < 156) ? ' ' : blk[i];
        usum += c;
        ssum += (signed char)c;
    }
    if (usum != want && (uint64_t)ssum != want)
        return ferr(err, err_len, "bad header checksum (stored %llu, computed %llu)",
                    (unsigned long long)want, (unsigned long long)usum);
    if (parse_number(blk + 124, 12, &out->size) != 0)
        return ferr(err, err_len, "bad size field (neither octal nor base-256, or too large)");
    out->type = blk[156] ? (char)blk[156] : '0';
    size_t len = 0;
    /* POSIX ustar ("ustar\0" "00") has a prefix; GNU ("ustar  \0") and v7 do not. */
    if (memcmp(blk + 257, "ustar", 6) == 0 && blk[345]) {
        len = field_str(out->name, blk + 345, 155);
        out->name[len++] = '/';
    }
    field_str(out->name + len, blk, 100);
    return 0;
}

int stoke__tar_parse_pax(const char *buf, size_t len, char *path, size_t path_len, uint64_t *size,
                         int *has_size, char *err, size_t err_len)
{
    size_t pos = 0;
    if (path_len)
        path[0] = 0;
    *has_size = 0;
    while (pos < len) {
        /* "LEN key=value\n": LEN counts the whole record, its own digits included */
        uint64_t rlen = 0;
        size_t p = pos;
        while (p < len && buf[p] >= '0' && buf[p] <= '9' && p - pos < 19)
            rlen = rlen * 10 + (uint64_t)(buf[p++] - '0');
        if (p == pos || p >= len || buf[p] != ' ')
            return ferr(err, err_len,
                        "bad pax record at byte %zu of the extended header: no "
                        "length",
                        pos);
        if (rlen < (uint64_t)(p - pos) + 4 || rlen > len - pos)
            return ferr(err, err_len,
                        "bad pax record at byte %zu of the extended header: length "
                        "%llu does not fit",
                        pos, (unsigned long long)rlen);
        size_t end = pos + (size_t)rlen; /* one past the '\n' */
        if (buf[end - 1] != '\n')
            return ferr(err, err_len,
                        "bad pax record at byte %zu of the extended header: no "
                        "newline at its end",
                        pos);
        const char *key = buf + p + 1;
        const char *eq = memchr(key, '=', (size_t)(buf + end - 1 - key));
        if (!eq || eq == key)
            return ferr(err, err_len,
                        "bad pax record at byte %zu of the extended header: no "
                        "key=value",
                        pos);
        size_t klen = (size_t)(eq - key), vlen = (size_t)(buf + end - 1 - (eq + 1));
        const char *val = eq + 1;
        if (klen > 11 && memcmp(key, "GNU.sparse.", 11) == 0) {
            /* the member's data is a sparse map and the file's fragments, under a made-up
             * name: read as a member, another sample's bytes (and the real one missing) */
            ferr(err, err_len, "%s", SPARSE_MSG);
            return STOKE_ENOTSUP;
        }
        if (klen == 4 && memcmp(key, "path", 4) == 0) {
            if (vlen >= path_len || memchr(val, 0, vlen))
                return ferr(err, err_len,
                            "pax path of %zu bytes is too long or holds a NUL "
                            "(at most %zu)",
                            vlen, path_len - 1);
            memcpy(path, val, vlen);
            path[vlen] = 0;
        } else if (klen == 4 && memcmp(key, "size", 4) == 0) {
            uint64_t v = 0;
            if (vlen == 0 || vlen > 19)
                return ferr(err, err_len, "bad pax size record");
            for (size_t i = 0; i < vlen; i++) {
                if (val[i] < '0' || val[i] > '9')
                    return ferr(err, err_len, "bad pax size record");
                v = v * 10 + (uint64_t)(val[i] - '0');
            }
            if (v > (uint64_t)INT64_MAX)
                return ferr(err, err_len, "bad pax size record");
            *size = v;
            *has_size = 1;
        }
        pos = end;
    }
    return 0;
}

/* ---- the walk --------------------------------------------------------------------------- */

typedef struct walk {
    uint64_t file_size;
    stoke__tar_read_fn read;
    void *ctx;
    char *err;
    size_t err_len;
    uint64_t *err_off;
} walk;

static int walk_fail(walk *w, uint64_t off, int code, const char *fmt, ...)
{
    *w->err_off = off;
    if (w->err && w->err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(w->err, w->err_len, fmt, ap);
        va_end(ap);
    }
    return code;
}

/* Reads exactly n bytes at off; a short read is a truncated archive. */
static int read_exact(walk *w, void *buf, size_t n, uint64_t off, const char *what)
{
    size_t got = 0;
    int e = w->read(w->ctx, buf, n, off, &got);
    if (e == -EAGAIN) /* not there yet: a resumable iterator goes back to where it began */
        return STOKE_EBUSY;
    if (e < 0)
        return walk_fail(w, off, STOKE_EIO, "read of %zu bytes at byte %llu failed: %s", n,
                         (unsigned long long)off, strerror(-e));
    if (got < n && w->file_size == UINT64_MAX) /* a stream: its size shows only here */
        return walk_fail(w, off, STOKE_EFORMAT,
                         "truncated: %s at byte %llu is cut short by the end of the file", what,
                         (unsigned long long)off);
    if (got < n)
        return walk_fail(w, off, STOKE_EFORMAT,
                         "truncated: %s at byte %llu is cut short by the "
                         "end of the file (%llu bytes)",
                         what, (unsigned long long)off, (unsigned long long)w->file_size);
    return 0;
}

/* Reads the data of an extension member ('x', 'g', 'L') of `size` bytes at `off` into a new
 * NUL-terminated buffer *out. */
static int read_ext(walk *w, uint64_t hdr_off, uint64_t off, uint64_t size, char **out)
{
    if (size > STOKE__TAR_EXT_MAX)
        return walk_fail(w, hdr_off, STOKE_EFORMAT,
                         "extension header of %llu bytes at byte %llu "
                         "exceeds the %zu-byte limit",
                         (unsigned long long)size, (unsigned long long)hdr_off, STOKE__TAR_EXT_MAX);
    char *buf = malloc((size_t)size + 1);
    if (!buf)
        return walk_fail(w, hdr_off, STOKE_ENOMEM, "out of memory");
    int rc = read_exact(w, buf, (size_t)size, off, "an extension header's data");
    if (rc) {
        free(buf);
        return rc;
    }
    buf[size] = 0;
    *out = buf;
    return 0;
}

/* The member's pending overrides from 'x' / 'L' headers. */
typedef struct pending {
    char path[STOKE__TAR_PATH_MAX];
    int has_path;
    uint64_t size;
    int has_size;
    uint64_t first_hdr; /* offset of the first header of this member (UINT64_MAX: none yet) */
} pending;

/* Handles an extension header (pax 'x' / 'g', GNU 'L' / 'K') whose data is at `data`. */
static int extension(walk *w, const stoke__tar_block *b, uint64_t hdr, uint64_t data, pending *pd)
{
    if (b->type == 'K') /* long link name: only links use it, and links are skipped */
        return 0;
    char *buf = NULL;
    int rc = read_ext(w, hdr, data, b->size, &buf);
    if (rc)
        return rc;
    if (b->type == 'L') {
        size_t n = strnlen(buf, (size_t)b->size);
        if (n == 0 || n >= sizeof(pd->path))
            rc = walk_fail(w, hdr, STOKE_EFORMAT,
                           "GNU long name at byte %llu is empty or longer "
                           "than %zu bytes",
                           (unsigned long long)hdr, sizeof(pd->path) - 1);
        else {
            memcpy(pd->path, buf, n + 1);
            pd->has_path = 1;
        }
    } else {
        char path[STOKE__TAR_PATH_MAX], msg[160];
        uint64_t size = 0;
        int has_size = 0;
        int prc = stoke__tar_parse_pax(buf, (size_t)b->size, path, sizeof(path), &size, &has_size,
                                       msg, sizeof(msg));
        if (prc != 0)
            rc = walk_fail(w, hdr, prc, "%s (pax header at byte %llu)", msg,
                           (unsigned long long)hdr);
        else if (b->type == 'x') { /* 'g': global, checked and ignored */
            if (path[0]) {
                memcpy(pd->path, path, strlen(path) + 1);
                pd->has_path = 1;
            }
            if (has_size) {
                pd->size = size;
                pd->has_size = 1;
            }
        }
    }
    free(buf);
    return rc;
}

static int is_regular(char t)
{
    return t == '0' || t == '7';
}

static int is_extension(char t)
{
    return t == 'x' || t == 'g' || t == 'L' || t == 'K';
}

int stoke__tar_iter_init(stoke__tar_iter *it, uint64_t file_size, stoke__tar_read_fn read,
                         void *read_ctx, char *err, size_t err_len)
{
    memset(it, 0, sizeof(*it));
    it->file_size = file_size;
    it->read = read;
    it->ctx = read_ctx;
    it->err = err;
    it->err_len = err_len;
    if (err && err_len)
        err[0] = 0;
    it->pd = calloc(1, sizeof(pending));
    it->b = malloc(sizeof(stoke__tar_block));
    if (!it->pd || !it->b) {
        stoke__tar_iter_free(it);
        return STOKE_ENOMEM;
    }
    ((pending *)it->pd)->first_hdr = UINT64_MAX;
    return 0;
}

void stoke__tar_iter_free(stoke__tar_iter *it)
{
    free(it->pd);
    free(it->b);
    free(it->mark);
    it->pd = it->b = it->mark = NULL;
}

/* What a resumable iterator goes back to: the next header, and the overrides pending. */
typedef struct mark {
    uint64_t off;
    int reported;
    pending pd;
} mark;

int stoke__tar_iter_resumable(stoke__tar_iter *it)
{
    if (!it->mark && !(it->mark = malloc(sizeof(mark))))
        return STOKE_ENOMEM;
    return 0;
}

/* Copies the pending overrides, of the path only its used bytes. */
static void pending_copy(pending *to, const pending *from)
{
    if (from->has_path)
        memcpy(to->path, from->path, strlen(from->path) + 1);
    to->has_path = from->has_path;
    to->size = from->size;
    to->has_size = from->has_size;
    to->first_hdr = from->first_hdr;
}

/* After the zero block at `off` (the end of the archive): an error when a header follows within
 * the record (20 blocks) it ends, where the members after it would be lost without a word (a
 * lone zero block; archives joined with cat, whose second one starts right after the first's
 * end); 0 when none does (zeros, other bytes: ignored, as tar does), or the file's size is
 * not known yet (a stream). */
static int after_end(walk *w, stoke__tar_block *b, uint64_t off)
{
    enum { LOOK = 19 };
    if (w->file_size == UINT64_MAX || off + STOKE__TAR_BLOCK >= w->file_size)
        return 0;
    uint64_t left = w->file_size - off - STOKE__TAR_BLOCK;
    size_t n = left < LOOK * STOKE__TAR_BLOCK ? (size_t)left / STOKE__TAR_BLOCK * STOKE__TAR_BLOCK
                                              : LOOK * STOKE__TAR_BLOCK;
    unsigned char rest[LOOK * STOKE__TAR_BLOCK];
    int rc = n ? read_exact(w, rest, n, off + STOKE__TAR_BLOCK, "the blocks after its end") : 0;
    if (rc)
        return rc;
    char msg[160];
    for (size_t k = 0; k < n; k += STOKE__TAR_BLOCK)
        if (stoke__tar_parse_block(rest + k, b, msg, sizeof(msg)) == 0)
            return walk_fail(w, off, STOKE_EFORMAT,
                             "the end-of-archive block, and a header after it at byte %llu: "
                             "the members from there would be lost (a lone zero block, or "
                             "archives joined with cat: tar -A joins them into one)",
                             (unsigned long long)(off + STOKE__TAR_BLOCK + k));
    return 0;
}

static int iter_step(stoke__tar_iter *it, const char **path, uint64_t *hdr_off, uint64_t *data_off,
                     uint64_t *size_out);

int stoke__tar_iter_next(stoke__tar_iter *it, const char **path, uint64_t *hdr_off,
                         uint64_t *data_off, uint64_t *size_out)
{
    mark *m = it->mark;
    if (!m || it->done)
        return iter_step(it, path, hdr_off, data_off, size_out);
    m->off = it->off;
    m->reported = it->reported;
    pending_copy(&m->pd, it->pd);
    int rc = iter_step(it, path, hdr_off, data_off, size_out);
    if (rc == STOKE_EBUSY) { /* a read must wait: back to where this call began */
        it->off = m->off;
        it->reported = m->reported;
        pending_copy(it->pd, &m->pd);
    }
    return rc;
}

static int iter_step(stoke__tar_iter *it, const char **path, uint64_t *hdr_off, uint64_t *data_off,
                     uint64_t *size_out)
{
    walk w = {it->file_size, it->read, it->ctx, it->err, it->err_len, &it->err_off};
    pending *pd = it->pd;
    stoke__tar_block *b = it->b;
    uint64_t file_size = it->file_size;
    if (it->done)
        return STOKE_EEND;
    if (it->reported) { /* the member reported last is behind us */
        memset(pd, 0, sizeof(*pd));
        pd->first_hdr = UINT64_MAX;
        it->reported = 0;
    }
    for (;;) {
        uint64_t off = it->off;
        unsigned char blk[STOKE__TAR_BLOCK];
        if (off == file_size)
            return walk_fail(&w, off, STOKE_EFORMAT,
                             "truncated: the archive ends at byte %llu "
                             "without its end-of-archive block",
                             (unsigned long long)off);
        int rc = read_exact(&w, blk, sizeof(blk), off, "a header");
        if (rc)
            return rc;
        char msg[160];
        rc = stoke__tar_parse_block(blk, b, msg, sizeof(msg));
        if (rc == STOKE_EEND) {
            if (pd->first_hdr != UINT64_MAX)
                return walk_fail(&w, off, STOKE_EFORMAT,
                                 "the archive ends at byte %llu right after an extension header",
                                 (unsigned long long)off);
            if ((rc = after_end(&w, b, off)) != 0)
                return rc;
            it->done = 1;
            return STOKE_EEND;
        }
        if (rc)
            return walk_fail(&w, off, rc, "%s at byte %llu", msg, (unsigned long long)off);
        uint64_t data = off + STOKE__TAR_BLOCK;
        if (pd->first_hdr == UINT64_MAX && b->type != 'g') /* 'g' belongs to no member */
            pd->first_hdr = off;
        uint64_t size = (!is_extension(b->type) && pd->has_size) ? pd->size : b->size;
        if (size > file_size - data)
            return walk_fail(&w, off, STOKE_EFORMAT,
                             "truncated: member '%s' at byte %llu has %llu "
                             "bytes of data but the file ends at byte %llu",
                             pd->has_path && !is_extension(b->type) ? pd->path : b->name,
                             (unsigned long long)off, (unsigned long long)size,
                             (unsigned long long)file_size);
        uint64_t next = data + (size + STOKE__TAR_BLOCK - 1) / STOKE__TAR_BLOCK * STOKE__TAR_BLOCK;
        it->off = next > file_size ? file_size : next;
        if (is_extension(b->type)) {
            if ((rc = extension(&w, b, off, data, pd)) != 0)
                return rc;
        } else if (b->type == 'S') {
            return walk_fail(&w, off, STOKE_ENOTSUP, "member '%s' at byte %llu is %s",
                             pd->has_path ? pd->path : b->name, (unsigned long long)off,
                             SPARSE_MSG);
        } else if (is_regular(b->type)) {
            *path = pd->has_path ? pd->path : b->name;
            *hdr_off = pd->first_hdr;
            *data_off = data;
            *size_out = size;
            it->reported = 1;
            return 0;
        } else {
            memset(pd, 0, sizeof(*pd));
            pd->first_hdr = UINT64_MAX;
        }
    }
}

int stoke__tar_walk(uint64_t file_size, stoke__tar_read_fn read, void *read_ctx,
                    stoke__tar_member_fn member, void *member_ctx, char *err, size_t err_len,
                    uint64_t *err_off)
{
    stoke__tar_iter it;
    *err_off = 0;
    if (stoke__tar_iter_init(&it, file_size, read, read_ctx, err, err_len) != 0) {
        if (err && err_len)
            snprintf(err, err_len, "out of memory");
        return STOKE_ENOMEM;
    }
    int rc;
    for (;;) {
        const char *path;
        uint64_t hdr, data, size;
        rc = stoke__tar_iter_next(&it, &path, &hdr, &data, &size);
        if (rc) {
            *err_off = it.err_off;
            break;
        }
        if ((rc = member(member_ctx, path, hdr, data, size)) != 0) {
            *err_off = hdr;
            break;
        }
    }
    stoke__tar_iter_free(&it);
    return rc == STOKE_EEND ? 0 : rc;
}
