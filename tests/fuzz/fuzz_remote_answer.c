/* libFuzzer target: one HTTP answer of the remote request engine (src/sources/remote_answer.c):
 * header lines through stoke__remote_on_header, then the body in chunks through
 * stoke__remote_on_body, into a buffer, a file (a cache download's pwrite, or one whose writes
 * fail) or a stream lane's queue, as libcurl would call them.
 * Built only with -DSTOKE_FUZZ=ON, clang and libcurl's headers (libcurl itself is not linked:
 * the one call remote_answer.c makes, curl_easy_getinfo, is answered here); run by
 * tests/fuzz/run.sh (target answer).
 *
 * The input: 8 bytes of settings (status, destination, offset, length, chunk size, the most a
 * download may take, the file's recorded version), then header lines ending in '\n' up to an
 * empty one, then the body.  Beyond "no crash, no sanitizer report" it checks what
 * remote_internal.h and remote_answer.c promise of what they take: every byte taken is the
 * body's byte at the file offset the answer says (a 206's Content-Range start, a 200's 0), in
 * order, inside [off, off + n) and under `most` (a file holds them at those offsets and nothing
 * else; one whose writes fail holds nothing, its body stopped, the errno kept); a 206 is taken
 * only with a Content-Range of one range whose bytes it carries and, with a size, inside that
 * size; nothing of an encoded answer, an answer of another version or an error's; the size it
 * says (seen) raised only by a 206 taken; the validators and the error text NUL-terminated
 * inside their arrays. */
#define _GNU_SOURCE /* memfd_create */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "fuzz_support.h"
#include "sources/remote_internal.h"

/* ---- what remote_answer.c calls besides its own ------------------------------------------ */

static long g_status; /* the answer's status, as libcurl would say it */

CURLcode curl_easy_getinfo(CURL *h, CURLINFO info, ...)
{
    (void)h;
    va_list ap;
    va_start(ap, info);
    if (info == CURLINFO_RESPONSE_CODE)
        *va_arg(ap, long *) = g_status;
    va_end(ap);
    return CURLE_OK;
}

/* The file's recorded version: compared by its key (remote.h, STOKE__REMOTE_TAG_KEY). */
static char g_adopted[512];
int stoke__remote_tag_differs(stoke__remote_tag *t, const char *v, int adopt, const char **had)
{
    char *cur = atomic_load(&t->v);
    if (!cur) {
        if (adopt) {
            snprintf(g_adopted, sizeof(g_adopted), "%s", v);
            atomic_store(&t->v, g_adopted);
        }
        return 0;
    }
    if (had)
        *had = cur;
    return cur[0] == v[0] && strncmp(cur, v, STOKE__REMOTE_TAG_KEY) != 0;
}

/* A stream lane: what was appended, and "full" on every third question (the transfer pauses,
 * and libcurl gives the same chunk again once it resumes). */
static char g_lane[1 << 16];
static size_t g_lane_n;
static unsigned g_asks;

int stoke__remote_lane_full(struct stoke__remote_lane *l)
{
    (void)l;
    return ++g_asks % 3 == 0;
}

int stoke__remote_lane_append(struct stoke__remote_lane *l, const char *data, size_t n)
{
    (void)l;
    if (n > sizeof(g_lane) - g_lane_n)
        return -1;
    memcpy(g_lane + g_lane_n, data, n);
    g_lane_n += n;
    return 0;
}

static unsigned g_said;
static void on_said(void *ctx)
{
    (void)ctx;
    g_said++;
}

/* A file destination (a cache download's): one memfd, emptied for each input, and the same
 * file opened read-only, where every pwrite fails (EBADF: a download whose writes fail). */
static int g_fd = -1, g_fd_ro = -1;
static void files_open(void)
{
    if (g_fd >= 0)
        return;
    g_fd = memfd_create("fuzz_remote_answer", 0);
    check(g_fd >= 0);
    char path[64];
    snprintf(path, sizeof(path), "/proc/self/fd/%d", g_fd);
    g_fd_ro = open(path, O_RDONLY);
    check(g_fd_ro >= 0);
}

/* ---- the target --------------------------------------------------------------------------- */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const long statuses[8] = {200, 206, 206, 206, 200, 416, 404, 503};
    if (size < 8)
        return 0;
    const uint8_t *cfg = data;
    data += 8, size -= 8;
    g_status = statuses[cfg[0] & 7];
    int lane = cfg[0] >> 3 & 1;   /* else a buffer, or a file: */
    int tagged = cfg[0] >> 4 & 3; /* 0: no tag, 1: none recorded, 2/3: another recorded */
    int file = !lane && cfg[0] >> 6 & 1; /* pwrite at the file's offsets */
    int file_fails = file && cfg[0] >> 7;  /* every pwrite fails */
    uint64_t off = cfg[1] | (uint64_t)(cfg[2] & 0x3f) << 8;
    size_t n = 1 + ((size_t)cfg[3] | (size_t)(cfg[2] >> 6) << 8); /* 1 .. 1024 */
    size_t chunk = 1 + (size_t)cfg[4];
    uint64_t most = cfg[5] ? (uint64_t)cfg[5] * 64 : 0;
    int first = cfg[6] & 1; /* a fetch's first chunk: a 200 takes the whole body */
    int seen2_set = cfg[6] >> 1 & 1;

    _Atomic uint64_t seen = 0, seen2 = seen2_set ? 1 : 0;
    stoke__remote_tag tag = {.pass = 0};
    char other[64];
    if (tagged >= 2) {
        snprintf(other, sizeof(other), "%c%016x%s", cfg[7] & 1 ? 'E' : 'L', 0x5eed, "\"x\"");
        atomic_store(&tag.v, other);
    }
    /* Exact-size heap blocks, so ASan sees a write past either. */
    char *buf = malloc(n);
    if (!buf)
        return 0;
    memset(buf, 0xa5, n);
    xfer *x = calloc(1, sizeof(*x));
    if (!x) {
        free(buf);
        return 0;
    }
    x->fd = -1;
    if (file) {
        files_open();
        check(ftruncate(g_fd, 0) == 0);
        x->fd = file_fails ? g_fd_ro : g_fd;
    }
    x->q = lane ? (struct stoke__remote_lane *)&g_lane : NULL;
    x->buf = lane || file ? NULL : buf;
    x->n = lane ? SIZE_MAX : n;
    x->off = lane ? 0 : off;
    x->most = most;
    x->retry_after = -1;
    x->seen = &seen;
    x->seen2 = first ? &seen2 : NULL;
    x->said = on_said;
    x->tag = tagged ? &tag : NULL;
    x->check = tagged != 0;
    if (first)
        x->off = 0;
    g_lane_n = 0;
    g_asks = 0;
    g_said = 0;

    /* Header lines, each with its '\n' (libcurl gives them so), up to an empty one. */
    size_t at = 0;
    while (at < size) {
        const uint8_t *nl = memchr(data + at, '\n', size - at);
        size_t len = nl ? (size_t)(nl - (data + at)) + 1 : size - at;
        char *line = malloc(len);
        if (!line)
            break;
        memcpy(line, data + at, len);
        at += len;
        int empty = len == 1 || (len == 2 && line[0] == '\r');
        check(stoke__remote_on_header(line, 1, len, x) == len);
        free(line);
        if (empty)
            break;
    }
    check(x->retry_after >= -1 && x->retry_after <= 3600);
    check(memchr(x->etag, 0, sizeof(x->etag)) && memchr(x->lastmod, 0, sizeof(x->lastmod)));
    check(memchr(x->encoding, 0, sizeof(x->encoding)) != NULL);

    /* The body in chunks, until a callback stops it (0: libcurl ends the transfer). */
    const uint8_t *body = data + at;
    size_t body_n = size - at, fed = 0;
    int stopped = 0;
    while (fed < body_n && !stopped) {
        size_t len = body_n - fed < chunk ? body_n - fed : chunk;
        char *c = malloc(len);
        if (!c)
            break;
        memcpy(c, body + fed, len);
        size_t r = stoke__remote_on_body(c, 1, len, x);
        free(c);
        if (r == CURL_WRITEFUNC_PAUSE) {
            check(lane); /* only a stream lane pauses; the same chunk comes again */
            continue;
        }
        check(r == len || r == 0);
        if (r == 0)
            stopped = 1;
        else
            fed += len;
    }

    /* What was taken, and from where: the answer's first byte is the file's byte `base`. */
    int ok_status = x->status == 200 || x->status == 206;
    size_t got = lane ? g_lane_n : x->got;
    const char *dst = lane ? g_lane : buf;
    check(lane || x->got <= x->n);
    char *back = NULL;
    if (file) {
        /* the file holds what was taken at its own offsets, [off, off + got), and nothing
         * else: no byte before off, none after; a file whose writes fail holds nothing,
         * stopped the body at its first byte taken and said why */
        struct stat st;
        check(fstat(g_fd, &st) == 0);
        check((uint64_t)st.st_size == (got ? x->off + got : 0));
        if (file_fails) {
            check(got == 0);
            check(x->werr == 0 || (x->werr == EBADF && stopped));
        } else {
            check(x->werr == 0);
        }
        back = malloc(got + 1);
        check(back != NULL);
        check(pread(g_fd, back, got, (off_t)x->off) == (ssize_t)got);
        dst = back;
        char z[256];
        for (uint64_t at0 = 0; at0 < x->off && got;) {
            size_t k = x->off - at0 < sizeof(z) ? (size_t)(x->off - at0) : sizeof(z);
            check(pread(g_fd, z, k, (off_t)at0) == (ssize_t)k);
            for (size_t i = 0; i < k; i++)
                check(z[i] == 0);
            at0 += k;
        }
    }
    if (!x->body)
        check(got == 0);
    /* (a 206 refused for its range or a download over `most` may have taken its bytes before
     * the refusal: those are checked below as any) */
    if (!ok_status || x->encoded || x->changed)
        check(got == 0);
    if (got > 0) {
        uint64_t base = x->status == 206 ? x->cr_start : 0;
        uint64_t from = x->off;
        check(from >= base);
        for (size_t i = 0; i < got; i++) {
            uint64_t j = from + i - base;
            check(j < fed && (uint8_t)dst[i] == body[j]);
        }
        if (x->most)
            check(from + got <= x->most);
        if (x->status == 206) {
            check(x->has_cr && x->cr_start <= x->cr_end);
            check(from + got - 1 <= x->cr_end); /* no byte the range did not say */
            if (x->has_clen && !x->encoded)
                check(x->clen == x->cr_end - x->cr_start + 1);
            if (x->cr_total)
                check(x->cr_end < x->total); /* RFC 9110: inside the size it says */
        }
    }
    /* The size said is a taken 206's, with a Content-Range that said it. */
    uint64_t s = atomic_load(&seen);
    if (s) {
        check(x->status == 206 && x->cr_total && s == x->total);
        check(!x->changed && !x->encoded); /* (a body too long is refused after it) */
        check(x->cr_start <= x->cr_end && x->cr_end < x->total);
    }
    if (g_said)
        check(first && x->status == 206);
    check(memchr(x->err, 0, sizeof(x->err)) != NULL && x->errlen < sizeof(x->err));
    free(back);
    free(x);
    free(buf);
    return 0;
}
