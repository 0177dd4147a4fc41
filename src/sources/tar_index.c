/* Sidecar indexes of tar shards: writing one from a walk over a local shard, and parsing one
 * (the format: tar_index.h). */
#define _GNU_SOURCE
#include "sources/tar_index.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#ifdef STOKE_HAVE_ZLIB
#include <zlib.h>
#endif

#include "common/internal.h"

#define MAGIC "stoke-tar-index "

typedef struct wctx {
    FILE *f;
    uint64_t n;
} wctx;

static int put_member(void *ctx, const char *path, uint64_t hdr, uint64_t off, uint64_t size)
{
    wctx *w = ctx;
    if (fprintf(w->f, "%" PRIu64 " %" PRIu64 " %" PRIu64 " %zu %s\n", hdr, off, size, strlen(path),
                path) < 0)
        return STOKE_ENOMEM;
    w->n++;
    return 0;
}

int stoke__crc32_of(stoke__tar_read_fn read, void *ctx, uint64_t size, uint32_t *crc, char *why,
                    size_t why_len)
{
#ifdef STOKE_HAVE_ZLIB
    enum { CHUNK = 1 << 20 };
    unsigned char *buf = malloc(CHUNK);
    if (!buf) {
        stoke__fmt(why, why_len, "out of memory");
        return STOKE_ENOMEM;
    }
    uLong c = crc32(0L, Z_NULL, 0);
    int rc = 0;
    for (uint64_t at = 0; at < size && !rc;) {
        size_t want = size - at < CHUNK ? (size_t)(size - at) : CHUNK, got = 0;
        int e = read(ctx, buf, want, at, &got);
        if (e < 0 || got == 0) {
            stoke__fmt(why, why_len, "at byte %" PRIu64 " of %" PRIu64 ": %s", at, size,
                       e < 0 ? strerror(-e) : "the file ends there");
            rc = STOKE_EIO;
            break;
        }
        c = crc32(c, buf, (uInt)got);
        at += got;
    }
    free(buf);
    *crc = (uint32_t)c;
    return rc;
#else
    (void)read, (void)ctx, (void)size;
    *crc = 0;
    stoke__fmt(why, why_len, "built without zlib (Debian zlib1g-dev): no CRC-32");
    return STOKE_ENOTSUP;
#endif
}

int stoke__tar_index_write(const char *path, const char *out, uint64_t shard_size,
                           stoke__tar_read_fn read, void *read_ctx, uint64_t *members, char *why,
                           size_t why_len)
{
    char *body = NULL, *idx = NULL, *tmp = NULL;
    size_t body_len = 0;
    wctx w = {open_memstream(&body, &body_len), 0};
    if (!w.f) {
        stoke__fmt(why, why_len, "tar %s: out of memory", path);
        return STOKE_ENOMEM;
    }
    char err[512] = "";
    uint64_t at = 0;
    int rc = stoke__tar_walk(shard_size, read, read_ctx, put_member, &w, err, sizeof(err), &at);
    if (fclose(w.f) != 0 && !rc)
        rc = STOKE_ENOMEM;
    if (rc == STOKE_ENOMEM)
        stoke__fmt(why, why_len, "tar %s: out of memory", path);
    else if (rc)
        stoke__fmt(why, why_len, "tar %s: at byte %" PRIu64 ": %s", path, at, err);
    uint32_t crc = 0;
    int crc_rc = rc ? rc : stoke__crc32_of(read, read_ctx, shard_size, &crc, err, sizeof(err));
    if (crc_rc && crc_rc != STOKE_ENOTSUP && !rc) {
        stoke__fmt(why, why_len, "tar %s: %s", path, err);
        rc = crc_rc;
    }
    char head[128];
    int head_len = crc_rc ? snprintf(head, sizeof(head),
                                     MAGIC "1\nshard-bytes %" PRIu64 "\nmembers %" PRIu64 "\n",
                                     shard_size, w.n)
                          : snprintf(head, sizeof(head),
                                     MAGIC "2\nshard-bytes %" PRIu64 "\nshard-crc32 %08" PRIx32
                                           "\nmembers %" PRIu64 "\n",
                                     shard_size, crc, w.n);
    size_t plen = strlen(out ? out : path) + 4;
    if (!rc && ((idx = malloc(plen + 1)) == NULL || (tmp = malloc(plen + 40)) == NULL)) {
        stoke__fmt(why, why_len, "tar %s: out of memory", path);
        rc = STOKE_ENOMEM;
    }
    if (!rc) {
        snprintf(idx, plen + 1, "%s%s", out ? out : path, out ? "" : ".idx");
    }
    if (!rc) {
        /* a new file of a name no one could guess, never one that was there (another user's
         * link in a directory they can write would have had the index written through it) */
        int fd = -1;
        uint64_t r = 0;
        if (getrandom(&r, sizeof(r), GRND_NONBLOCK) != (ssize_t)sizeof(r)) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            r = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 30) ^ ((uint64_t)getpid() << 32);
        }
        for (int k = 0; k < 100 && fd < 0; k++) {
            r = r * 6364136223846793005ull + 1442695040888963407ull;
            snprintf(tmp, plen + 40, "%s.tmp.%ld.%016" PRIx64, idx, (long)getpid(), r);
            fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
            if (fd < 0 && errno != EEXIST)
                break;
        }
        int e = fd < 0 ? -errno : 0;
        if (!e)
            e = stoke__write_all(fd, head, (size_t)head_len);
        if (!e)
            e = stoke__write_all(fd, body ? body : "", body_len);
        if (!e)
            e = stoke__write_all(fd, "end\n", 4);
        if (!e && fsync(fd) != 0)
            e = -errno;
        if (fd >= 0 && close(fd) != 0 && !e)
            e = -errno;
        if (!e && rename(tmp, idx) != 0)
            e = -errno;
        if (e) {
            if (fd >= 0)
                unlink(tmp);
            stoke__fmt(why, why_len, "index %s: %s", idx, strerror(-e));
            rc = STOKE_EIO;
        }
    }
    if (!rc && members)
        *members = w.n;
    free(body);
    free(idx);
    free(tmp);
    return rc;
}

/* ---- parsing ------------------------------------------------------------------------------ */

typedef struct rd {
    const char *p, *end;
    uint64_t line;
} rd;

/* A decimal number (at most 19 digits) followed by `sep`: 0, or -1. */
static int num(rd *r, char sep, uint64_t *out)
{
    uint64_t v = 0;
    int d = 0;
    while (r->p < r->end && *r->p >= '0' && *r->p <= '9' && d < 19) {
        v = v * 10 + (uint64_t)(*r->p++ - '0');
        d++;
    }
    if (!d || r->p >= r->end || *r->p != sep)
        return -1;
    r->p++;
    *out = v;
    return 0;
}

static int word(rd *r, const char *w)
{
    size_t n = strlen(w);
    if ((size_t)(r->end - r->p) < n || memcmp(r->p, w, n) != 0)
        return -1;
    r->p += n;
    return 0;
}

#define BAD(...)                                                                                   \
    do {                                                                                           \
        char m_[256];                                                                              \
        stoke__fmt(m_, sizeof(m_), __VA_ARGS__);                                                   \
        stoke__fmt(why, why_len, "line %" PRIu64 ": %s", r.line, m_);                              \
        free(path);                                                                                \
        return STOKE_EFORMAT;                                                                      \
    } while (0)

/* 8 lowercase hex digits and '\n': 0, or -1. */
static int hex32(rd *r, int64_t *out)
{
    uint32_t v = 0;
    for (int i = 0; i < 8; i++, r->p++) {
        if (r->p >= r->end)
            return -1;
        const char c = *r->p;
        if (c >= '0' && c <= '9')
            v = v << 4 | (uint32_t)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v = v << 4 | (uint32_t)(c - 'a' + 10);
        else
            return -1;
    }
    if (r->p >= r->end || *r->p != '\n')
        return -1;
    r->p++;
    *out = v;
    return 0;
}

int stoke__tar_index_parse(const char *buf, size_t len, uint64_t *shard_size, int64_t *crc,
                           stoke__tar_member_fn member, void *ctx, char *why, size_t why_len)
{
    rd r = {buf, buf + len, 1};
    char *path = NULL;
    uint64_t size = 0, count = 0;
    int64_t sum = -1;
    if (word(&r, MAGIC) != 0)
        BAD("not a stoke tar index (it starts with 'stoke-tar-index 2')");
    uint64_t version;
    if (num(&r, '\n', &version) != 0 || (version != 1 && version != 2))
        BAD("not version 1 or 2 of the format (the ones this build reads)");
    r.line++;
    if (word(&r, "shard-bytes ") != 0 || num(&r, '\n', &size) != 0)
        BAD("expected 'shard-bytes SIZE'");
    r.line++;
    if (version == 2) {
        if (word(&r, "shard-crc32 ") != 0 || hex32(&r, &sum) != 0)
            BAD("expected 'shard-crc32 HEX' (8 lowercase hex digits)");
        r.line++;
    }
    if (word(&r, "members ") != 0 || num(&r, '\n', &count) != 0)
        BAD("expected 'members COUNT'");
    if (count > size / STOKE__TAR_BLOCK) /* a member is a header block at least */
        BAD("%" PRIu64 " members cannot fit in %" PRIu64 " bytes", count, size);
    path = malloc(STOKE__TAR_PATH_MAX + 1);
    if (!path) {
        stoke__fmt(why, why_len, "out of memory");
        return STOKE_ENOMEM;
    }
    uint64_t next = 0; /* the first byte a member's header may start at */
    for (uint64_t i = 0; i < count; i++) {
        r.line++;
        uint64_t hdr, off, sz, plen;
        if (num(&r, ' ', &hdr) || num(&r, ' ', &off) || num(&r, ' ', &sz) || num(&r, ' ', &plen))
            BAD("expected 'HDR DATA SIZE LEN PATH' (member %" PRIu64 " of %" PRIu64 ")", i + 1,
                count);
        if (plen == 0 || plen > STOKE__TAR_PATH_MAX || (uint64_t)(r.end - r.p) < plen + 1 ||
            r.p[plen] != '\n' || memchr(r.p, 0, (size_t)plen))
            BAD("a path of %" PRIu64 " bytes does not fit the line", plen);
        if (hdr < next || hdr % STOKE__TAR_BLOCK || off <= hdr || off % STOKE__TAR_BLOCK ||
            off > size || sz > size - off)
            BAD("member at %" PRIu64 " (data %" PRIu64 ", %" PRIu64 " bytes) does not fit a "
                "tar of %" PRIu64 " bytes after the member before",
                hdr, off, sz, size);
        next = off + sz;
        memcpy(path, r.p, (size_t)plen);
        path[plen] = 0;
        r.p += plen + 1;
        int rc = member(ctx, path, hdr, off, sz);
        if (rc) {
            free(path);
            stoke__fmt(why, why_len, "out of memory");
            return rc;
        }
    }
    r.line++;
    if (word(&r, "end\n") != 0 || r.p != r.end)
        BAD("expected 'end' and the end of the file (after %" PRIu64 " members)", count);
    free(path);
    *shard_size = size;
    *crc = sum;
    return STOKE_OK;
}
