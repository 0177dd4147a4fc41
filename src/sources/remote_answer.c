/* One answer of the request engine (remote.c): libcurl's header and body callbacks for an xfer
 * (remote_internal.h) -- the status line, Content-Range / Content-Length, Retry-After, the
 * file's validators (ETag, Last-Modified) and the check that the answer is of the version the
 * file's first answer was (remote.h, stoke__remote_tag), then the body into the buffer, the
 * file or the stream lane's queue. */
#define _GNU_SOURCE
#include "sources/remote.h"

#ifdef STOKE_HAVE_LIBCURL

#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/remote_internal.h"

/* A validator header's value v[0 .. n) (spaces and the line's end trimmed): what messages show
 * into out (n bytes; a longer one's start and "..."), and the 64-bit FNV-1a of all of it --
 * for an ETag without a weak one's "W/" (RFC 9110's weak comparison: the same file's bytes may
 * be said to be weak by one answer and not by another, never another file's) -- which is what
 * answers are compared by, so that ETags of any length compare whole. */
static uint64_t validator(char *out, size_t out_n, const char *v, size_t n, int etag)
{
    while (n && (*v == ' ' || *v == '\t'))
        v++, n--;
    while (n && (v[n - 1] == '\r' || v[n - 1] == '\n' || v[n - 1] == ' ' || v[n - 1] == '\t'))
        n--;
    if (n < out_n) {
        memcpy(out, v, n);
        out[n] = 0;
    } else {
        memcpy(out, v, out_n - 4);
        memcpy(out + out_n - 4, "...", 4);
    }
    size_t at = etag && n >= 2 && v[0] == 'W' && v[1] == '/' ? 2 : 0;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = at; i < n; i++)
        h = (h ^ (unsigned char)v[i]) * 0x100000001b3ull;
    return h;
}

size_t stoke__remote_on_header(char *data, size_t size, size_t nmemb, void *ctx)
{
    xfer *x = ctx;
    size_t len = size * nmemb;
    char line[256];
    size_t n = len < sizeof(line) - 1 ? len : sizeof(line) - 1;
    memcpy(line, data, n);
    line[n] = 0;
    if (strncmp(line, "HTTP/", 5) == 0) { /* a new response (a redirect's, an interim one) */
        x->has_cr = x->cr_total = x->has_clen = x->encoded = 0;
        x->retry_after = -1;
        x->etag[0] = x->lastmod[0] = 0;
        return len;
    }
    unsigned long long a, b, t;
    if (strncasecmp(line, "content-range:", 14) == 0) {
        const char *v = line + 14;
        while (*v == ' ')
            v++;
        if (sscanf(v, "bytes %llu-%llu/%llu", &a, &b, &t) == 3) {
            x->cr_start = a, x->cr_end = b;
            x->has_cr = x->cr_total = 1;
            x->total = t;
            x->has_total = 1;
        } else if (strstr(v, "/*") && sscanf(v, "bytes %llu-%llu", &a, &b) == 2) {
            x->cr_start = a, x->cr_end = b; /* "bytes A-B/" and a star: the size not said */
            x->has_cr = 1;
        } else if (sscanf(v, "bytes */%llu", &t) == 1) {
            x->total = t;
            x->has_total = 1;
        }
    } else if (strncasecmp(line, "content-length:", 15) == 0) {
        if (sscanf(line + 15, " %llu", &t) == 1)
            x->clen = t, x->has_clen = 1;
    } else if (strncasecmp(line, "content-encoding:", 17) == 0) {
        const char *v = line + 17;
        while (*v == ' ')
            v++;
        x->encoded = strncasecmp(v, "identity", 8) != 0; /* its length is not the file's */
        stoke__fmt(x->encoding, sizeof(x->encoding), "%.*s", (int)strcspn(v, " \t\r\n;,"), v);
    } else if (strncasecmp(line, "retry-after:", 12) == 0) {
        if (sscanf(line + 12, " %llu", &a) == 1)
            x->retry_after = a > 3600 ? 3600 : (long)a;
    } else if (strncasecmp(line, "etag:", 5) == 0) { /* (from data: line may have cut it) */
        x->etag_hash = validator(x->etag, sizeof(x->etag), data + 5, len - 5, 1);
    } else if (strncasecmp(line, "last-modified:", 14) == 0) {
        x->lastmod_hash = validator(x->lastmod, sizeof(x->lastmod), data + 14, len - 14, 0);
    }
    return len;
}

/* "K" + 16 hex digits of the hash (validator) + what messages show, of x's ETag (K 'E') or
 * Last-Modified ('L') into out (TAG_MAX bytes). */
#define TAG_MAX (18 + sizeof(((xfer *)0)->etag))
static void tag_text(const xfer *x, int etag, char *out)
{
    snprintf(out, TAG_MAX, "%c%016" PRIx64 "%s", etag ? 'E' : 'L',
             etag ? x->etag_hash : x->lastmod_hash, etag ? x->etag : x->lastmod);
}

/* Whether the answer x's headers described is of the version x->tag holds (x->tag not NULL):
 * the first answer with a validator records its own (remote.h, stoke__remote_tag).  1 when it
 * is, or cannot be told (no such header; out of memory recording it; the pool's
 * STOKE_REMOTE_CHECK_VERSION=0). */
static int tag_same(xfer *x)
{
    if (!x->check)
        return 1;
    const char *had = atomic_load(&x->tag->v);
    int etag = had ? had[0] == 'E' : x->etag[0] != 0; /* (the recorded kind, else the ETag) */
    if (!(etag ? x->etag : x->lastmod)[0])
        return 1;
    char now[TAG_MAX];
    tag_text(x, etag, now);
    return !stoke__remote_tag_differs(x->tag, now, 1, NULL);
}

/* The size t a 206 taken said: x->seen and x->seen2 raised to it (x->said called after
 * seen2 rose).  Not from a header: an answer refused after it (a size over what the download
 * may take, a Content-Range that does not say its bytes, another version) would have raised
 * them (the cache's largest file: a bogus 2^64 - 1 stopped its read-ahead). */
static void said_size(xfer *x, uint64_t t)
{
    for (int k = 0; k < 2; k++) {
        _Atomic uint64_t *to = k ? x->seen2 : x->seen;
        uint64_t cur = to ? atomic_load(to) : UINT64_MAX;
        while (cur < t && !atomic_compare_exchange_weak(to, &cur, t)) {
        }
        if (k && cur < t && x->said)
            x->said(x->said_ctx);
    }
}

size_t stoke__remote_on_body(char *data, size_t size, size_t nmemb, void *ctx)
{
    xfer *x = ctx;
    size_t len = size * nmemb;
    if (!x->body) {
        x->body = 1;
        curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
        /* an encoded body is not the file's bytes (stoke asks for no encoding): none taken --
         * a stream would parse them as they come, before the answer ends */
        if (x->encoded && (x->status == 200 || x->status == 206))
            return 0;
        /* a 206 says which bytes it carries (RFC 9110: Content-Range, of the one range asked
         * for), in as many bytes as it says: one that does not (a multipart answer; a server
         * that sends the file from its start) is not taken, never assumed to start where the
         * range asked; nor one whose range ends at or past the size it says (RFC 9110's
         * invalid Content-Range: "bytes 10-59/10" said a size of 10 and took 50 bytes) */
        if (x->status == 206 &&
            (!x->has_cr || x->cr_end < x->cr_start || (x->cr_total && x->cr_end >= x->total) ||
             (x->has_clen && !x->encoded && x->clen != x->cr_end - x->cr_start + 1))) {
            x->bad_cr = 1;
            return 0;
        }
        x->pos = x->status == 206 ? x->cr_start : 0;
        /* ranges ignored: a stream's chunk, or a fetch's first chunk, takes the whole body --
         * the first chunk only while no 206 has said the size (seen2: the fetch's other chunks
         * may be out then; a retry answered with a 200 gives its own chunk's bytes, not the
         * whole file a second time) */
        if (x->status == 200 &&
            (x->q || (x->fd >= 0 && x->off == 0 && !(x->seen2 && atomic_load(x->seen2)))))
            x->n = SIZE_MAX;
        /* a server that ignores ranges still says the size (read once n is set: a stream
         * would ask for the next chunk of a file that comes whole) */
        if (x->status == 200 && x->has_clen && !x->encoded)
            x->total = x->clen, x->has_total = 1;
        if (x->most && x->has_total && x->total > x->most &&
            (x->status == 200 || x->status == 206)) { /* more than may be written: not begun */
            x->over = 1;
            return 0;
        }
        /* another version of the file than its first answer's: none of its bytes taken */
        if (x->tag && (x->status == 200 || x->status == 206) && !tag_same(x)) {
            x->changed = 1;
            return 0;
        }
        if (x->status == 206 && x->cr_total) /* the answer is taken: the size it says known */
            said_size(x, x->total);
    }
    if (x->status != 200 && x->status != 206) { /* keep the start of the error's text */
        size_t k = sizeof(x->err) - 1 - x->errlen;
        k = len < k ? len : k;
        memcpy(x->err + x->errlen, data, k);
        x->errlen += k;
        x->err[x->errlen] = 0;
        return len;
    }
    /* a stream's bytes ahead at their cap: these are delivered again once it resumes */
    if (x->q && stoke__remote_lane_full(x->q))
        return CURL_WRITEFUNC_PAUSE;
    uint64_t from = x->off + x->got; /* the next byte wanted */
    if (x->got == x->n) {
        x->enough = 1;
        return 0;
    }
    if (x->pos > from) {
        x->bad_range = 1;
        return 0;
    }
    /* a 206's body that goes on past the last byte its Content-Range says (no Content-Length
     * bounds a chunked one): those bytes are not said to be the file's, none taken */
    if (x->status == 206 && len && x->pos + len - 1 > x->cr_end) {
        x->bad_cr = 1;
        return 0;
    }
    if (x->pos + len <= from) { /* before what is wanted (a 200 from the start) */
        x->pos += len;
        return len;
    }
    size_t skip = (size_t)(from - x->pos), take = len - skip;
    if (take > x->n - x->got)
        take = x->n - x->got;
    if (x->most && from + take > x->most) { /* an endless body, or one that lied of its size */
        x->over = 1;
        return 0;
    }
    if (x->q) {
        if (stoke__remote_lane_append(x->q, data + skip, take) != 0) {
            x->werr = ENOMEM;
            return 0;
        }
    } else if (x->fd < 0) {
        memcpy(x->buf + x->got, data + skip, take);
    } else {
        for (size_t w = 0; w < take;) { /* a short write continues; an error stops the body */
            ssize_t r = pwrite(x->fd, data + skip + w, take - w, (off_t)(from + w));
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0) {
                x->werr = r < 0 ? errno : EIO;
                x->got += w;
                return 0;
            }
            w += (size_t)r;
        }
    }
    x->got += take;
    x->pos += len;
    return len;
}

#endif /* STOKE_HAVE_LIBCURL */
