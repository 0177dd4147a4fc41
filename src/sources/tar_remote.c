/* The tar source's remote shards at open (tar_internal.h): the dataset's pool and cache, each
 * shard's request, its member index -- fetched from the sidecar index SHARD.idx in one request
 * when the server has one (tar_index.c parses it), else built by walking the shard's headers
 * (tar_header.c) through a window of range reads or the cache's local copy -- and the shards'
 * order given to the cache for its read-ahead.  Reading samples is tar_fields.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "sources/cache.h"
#include "sources/remote.h"
#include "sources/tar_header.h"
#include "sources/tar_index.h"
#include "sources/tar_internal.h"

/* The walk over a remote shard reads its headers through a window of the file fetched with one
 * range request: members smaller than the window cost no request of their own. */
#define REMOTE_WINDOW ((size_t)1 << 20)

int stoke__tar_read_remote(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    stoke__tar_rlocal *w = ctx; /* the shard's local copy (cache.h), through slot 0 */
    int rc = stoke__cache_read(w->t->cache, w->t->pool, 0, &w->s->rf, w->s->size, buf, n, off, got,
                               NULL, w->why, sizeof(w->why));
    return rc == STOKE_OK ? 0 : rc == STOKE_ENOMEM ? -ENOMEM : -EIO;
}

/* URL + ".idx", before its query string if any ("https://h/a.tar?x=1" -> "/a.tar.idx?x=1"):
 * malloc'd, or NULL. */
static char *index_url(const char *url)
{
    size_t q = stoke__remote_is_url(url) && strncmp(url, "s3://", 5) != 0 ? strcspn(url, "?")
                                                                          : strlen(url);
    char *u = malloc(strlen(url) + 5);
    if (u)
        sprintf(u, "%.*s.idx%s", (int)q, url, url + q);
    return u;
}

/* Whether shard URL `url` (not s3://) has a query: a presigned or otherwise signed URL's
 * signature covers the shard's path, so the same query on URL.idx is refused by the store (S3:
 * 403 SignatureDoesNotMatch), and such a failure means no usable index, as a 404 does. */
static int signed_query(const char *url)
{
    return strncmp(url, "s3://", 5) != 0 && strchr(url, '?') != NULL;
}

/* Indexes fetched ahead at once (shards of one open), and the most of each such a fetch reads
 * (a longer index is fetched again on its own). */
#define AHEAD_SHARDS STOKE__TAR_INDEX_AHEAD
#define AHEAD_BYTES  ((size_t)256 << 10)

/* Fetches the whole of remote file f through slot 0 (one request when it is at most a window):
 * 0 with *buf (malloc'd) and *len, or remote_read's error with why. */
static int fetch_whole(stoke__tar_ds *t, const stoke__remote_file *f, char **buf, size_t *len,
                       char *why, size_t why_len)
{
    size_t cap = REMOTE_WINDOW, n = 0;
    uint64_t total = UINT64_MAX;
    char *b = NULL;
    for (;;) {
        char *nb = realloc(b, cap);
        if (!nb) {
            free(b);
            stoke__fmt(why, why_len, "GET %s: out of memory for %zu bytes", f->url, cap);
            return STOKE_ENOMEM;
        }
        b = nb;
        size_t got = 0;
        int rc = stoke__remote_read(t->pool, 0, f, b + n, cap - n, n, &got, &total, why, why_len);
        if (rc) {
            free(b);
            return rc;
        }
        n += got;
        if (n < cap || (total != UINT64_MAX && n >= total))
            break;
        if (cap >= STOKE__TAR_INDEX_REMOTE_MAX ||
            (total != UINT64_MAX && total > STOKE__TAR_INDEX_REMOTE_MAX)) {
            free(b);
            stoke__fmt(why, why_len, "GET %s: more than %zu bytes: not an index", f->url,
                       STOKE__TAR_INDEX_REMOTE_MAX);
            return STOKE_EFORMAT;
        }
        cap = total != UINT64_MAX && total > cap      ? (size_t)total
              : cap * 2 > STOKE__TAR_INDEX_REMOTE_MAX ? STOKE__TAR_INDEX_REMOTE_MAX
                                                      : cap * 2;
    }
    *buf = b;
    *len = n;
    return STOKE_OK;
}

/* Reads remote shard s's sidecar index URL.idx (docs/sources.md, "Sidecar indexes"), its
 * members given to member(ctx, ...): 1 when it was there (s->size and s->idx_url set), 0 when
 * the server has none (404: the shard is walked), or an error naming the index (a malformed
 * one, a failed request). */
static int open_index(const char *spec, stoke__tar_ds *t, stoke__tar_shard *s,
                      stoke__tar_member_fn member, void *ctx)
{
    char why[STOKE__MSG_MAX];
    /* the shard's request and URL with ".idx": what stoke__remote_file_init makes of the
     * given URL + ".idx" (an s3:// key is percent-encoded, ".idx" unchanged) */
    stoke__remote_file f = {
        .url = index_url(s->rf.url), .req = index_url(s->rf.req), .s3 = s->rf.s3};
    char *buf = s->idx_ahead;
    size_t len = s->idx_ahead_len;
    int rc = STOKE_OK;
    s->idx_ahead = NULL;
    if (!f.url || !f.req) {
        free(buf);
        stoke__remote_file_free(&f);
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    }
    if (s->idx_missing) /* a 404 when it was asked for ahead */
        rc = STOKE_ENOENT;
    else if (!buf)
        rc = fetch_whole(t, &f, &buf, &len, why, sizeof(why));
    if (rc == STOKE_ENOENT) {
        stoke__log(STOKE_LOG_DEBUG, "%s: no index at %s: walking the shard", spec, f.url);
        stoke__remote_file_free(&f);
        return 0;
    }
    if (rc == STOKE_EIO && signed_query(s->rf.req)) {
        stoke__log(STOKE_LOG_DEBUG,
                   "%s: index of %s: %s: walking the shard (the URL's query signs the shard, "
                   "not its index)",
                   spec, s->rf.url, why);
        stoke__remote_file_free(&f);
        return 0;
    }
    if (rc) {
        rc = stoke__fail(rc, "source '%s': index of %s: %s", spec, s->path, why);
        stoke__remote_file_free(&f);
        return rc;
    }
    uint64_t size = 0;
    int64_t crc = -1;
    rc = stoke__tar_index_parse(buf, len, &size, &crc, member, ctx, why, sizeof(why));
    free(buf);
    if (rc == STOKE_EFORMAT)
        rc = stoke__fail(rc,
                         "source '%s': index %s: %s (write it again with `stoke index`, or "
                         "remove it)",
                         spec, f.url, why);
    else if (rc)
        rc = stoke__fail(rc, "source '%s': index %s: %s", spec, f.url, why);
    if (!rc) {
        s->size = size;
        s->rf.has_crc = crc >= 0;
        s->rf.crc = (uint32_t)(crc >= 0 ? crc : 0);
        s->idx_url = f.url;
        f.url = NULL;
    }
    stoke__remote_file_free(&f);
    return rc ? rc : 1;
}

/* Fetches the sidecar indexes of remote shards [from, from + AHEAD_SHARDS) at once (read_each:
 * STOKE_REMOTE_CONNECTIONS in flight) into their idx_ahead, so that an open over thousands of
 * shards waits for a round trip per AHEAD_SHARDS / connections shards, not per shard; a 404
 * marks the shard's idx_missing (it is walked without asking again).  Best effort: a shard
 * whose index is longer than AHEAD_BYTES, or whose request failed otherwise, or all of them
 * when the batch itself failed, keep nothing, and open_index asks again on its own (which
 * reports or walks as it would have). */
static void index_ahead(const char *spec, stoke__tar_ds *t, int from)
{
    stoke__remote_file f[AHEAD_SHARDS];
    stoke__remote_req r[AHEAD_SHARDS];
    int at[AHEAD_SHARDS];
    size_t n = 0;
    for (int i = from; i < t->nshards && n < AHEAD_SHARDS; i++) {
        stoke__tar_shard *s = &t->shards[i];
        if (!s->remote && stoke__remote_is_url(s->path) && stoke__tar_remote_init(spec, t, s))
            break; /* its open reports it */
        if (!s->remote || s->idx_ahead || s->idx_missing ||
            (t->cache && stoke__cache_has(t->cache, &s->rf)))
            continue;
        f[n] = (stoke__remote_file){
            .url = index_url(s->rf.url), .req = index_url(s->rf.req), .s3 = s->rf.s3};
        r[n] = (stoke__remote_req){.f = &f[n], .buf = malloc(AHEAD_BYTES), .n = AHEAD_BYTES};
        at[n] = i;
        n++;
        if (!f[n - 1].url || !f[n - 1].req || !r[n - 1].buf)
            break;
    }
    int ok = n > 1;
    for (size_t j = 0; j < n && ok; j++)
        ok = f[j].url && f[j].req && r[j].buf;
    char why[STOKE__MSG_MAX];
    if (ok && stoke__remote_read_each(t->pool, 0, r, n, why, sizeof(why)) != STOKE_OK) {
        stoke__log(STOKE_LOG_DEBUG, "tar: indexes fetched ahead: %s: each asked on its own", why);
        ok = 0;
    }
    for (size_t j = 0; j < n; j++) {
        stoke__tar_shard *s = &t->shards[at[j]];
        if (ok && !r[j].rc && (r[j].got < r[j].n || r[j].total == r[j].got)) {
            s->idx_ahead = r[j].buf;
            s->idx_ahead_len = r[j].got;
        } else {
            s->idx_missing = ok && (r[j].rc == STOKE_ENOENT ||
                                    (r[j].rc == STOKE_EIO && signed_query(s->rf.req)));
            free(r[j].buf);
        }
        stoke__remote_file_free(&f[j]);
    }
}

void stoke__tar_index_ahead(const char *spec, stoke__tar_ds *t, int from)
{
    if (t->pool && t->nshards - from > 1)
        index_ahead(spec, t, from);
}

/* The pool, and the cache when STOKE_CACHE_DIR is set, made once. */
static int remote_pool(const char *spec, stoke__tar_ds *t)
{
    if (t->pool)
        return STOKE_OK;
    char why[STOKE__MSG_MAX];
    int rc = stoke__remote_pool_create(&t->pool, why, sizeof(why));
    if (!rc)
        rc = stoke__cache_create(&t->cache, why, sizeof(why));
    if (rc) {
        stoke__remote_pool_destroy(t->pool);
        t->pool = NULL;
        return stoke__fail(rc, "source '%s': %s", spec, why);
    }
    return STOKE_OK;
}

/* Makes remote shard s's request (the pool, and the cache when STOKE_CACHE_DIR is set, made
 * by the first); s->path becomes the URL without credentials.  Nothing changes on a
 * failure. */
int stoke__tar_remote_init(const char *spec, stoke__tar_ds *t, stoke__tar_shard *s)
{
    char why[STOKE__MSG_MAX];
    int rc = remote_pool(spec, t);
    if (rc)
        return rc;
    rc = stoke__remote_file_init(t->pool, s->path, &s->rf, why, sizeof(why));
    /* map mode reads at the offsets of the open's walk or index: every read must be of the
     * version the open saw (mode=stream reads each shard front to back: a pass's own) */
    if (!rc && !t->stream)
        rc = stoke__remote_file_pin(&s->rf, why, sizeof(why));
    if (rc) {
        stoke__remote_file_free(&s->rf);
        return stoke__fail(rc, "source '%s': %s", spec, why);
    }
    char *shown = strdup(s->rf.url); /* messages name the URL without credentials */
    if (!shown) {
        stoke__remote_file_free(&s->rf);
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    }
    free(s->path);
    s->path = shown;
    s->remote = 1;
    return STOKE_OK;
}

int stoke__tar_remote_order(const char *spec, stoke__tar_ds *t, int sized)
{
    int first = 0;
    while (first < t->nshards && !stoke__remote_is_url(t->shards[first].path))
        first++;
    if (first == t->nshards)
        return STOKE_OK;
    int rc = remote_pool(spec, t);
    if (rc || !t->cache) /* without a cache the shards' requests are made as they are opened */
        return rc;
    const stoke__remote_file **f = calloc((size_t)t->nshards, sizeof(*f));
    uint64_t *size = calloc((size_t)t->nshards, sizeof(*size));
    if (!f || !size) {
        free(f);
        free(size);
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    }
    size_t n = 0;
    for (int i = first; i < t->nshards && !rc; i++) {
        stoke__tar_shard *s = &t->shards[i];
        if (!s->remote && stoke__remote_is_url(s->path))
            rc = stoke__tar_remote_init(spec, t, s);
        if (!rc && s->remote) {
            size[n] = sized ? s->size : 0;
            f[n++] = &s->rf;
        }
    }
    if (!rc && stoke__cache_set_order(t->cache, f, size, n) != STOKE_OK)
        rc = stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    free(f);
    free(size);
    return rc;
}

int stoke__tar_open_remote(const char *spec, stoke__tar_ds *t, stoke__tar_shard *s,
                           stoke__tar_rlocal *w, stoke__tar_member_fn member, void *ctx, int *how)
{
    int rc = STOKE_OK;
    *how = STOKE__TAR_WALK_LATER;
    if (!s->remote) {
        rc = stoke__tar_remote_init(spec, t, s);
        if (rc)
            return rc;
    }
    rc = t->cache && stoke__cache_has(t->cache, &s->rf) ? 0 : open_index(spec, t, s, member, ctx);
    if (rc < 0)
        return rc;
    if (rc > 0) {
        *how = STOKE__TAR_INDEXED;
        return STOKE_OK;
    }
    if (!t->cache) /* walked with the others: stoke__tar_walk_remote */
        return STOKE_OK;
    *how = STOKE__TAR_WALK_NOW;
    *w = (stoke__tar_rlocal){.t = t, .s = s};
    uint64_t total = UINT64_MAX;
    size_t got;
    rc = stoke__cache_read(t->cache, t->pool, 0, &s->rf, 0, NULL, 0, 0, &got, &total, w->why,
                           sizeof(w->why));
    if (rc)
        return stoke__fail(rc, "source '%s': %s", spec, w->why);
    if (total == UINT64_MAX)
        return stoke__fail(STOKE_EIO,
                           "source '%s': GET %s: the server did not say the file's size "
                           "(no Content-Range: range requests are needed)",
                           spec, s->path);
    s->size = total;
    return STOKE_OK;
}

/* ---- the walk of many remote shards at once ---------------------------------------------- */

/* Shards walked at once: each has a window (REMOTE_WINDOW, more for a longer extension
 * header) and a request in each round, STOKE_REMOTE_CONNECTIONS of them in flight. */
#define WALK_SHARDS 32

/* The windows after a walk's first: a request costs its latency, which is worth latency x rate
 * bytes of a connection's transfer; a window of that many bytes reads through members smaller
 * than that (cheaper than a request of their own) and skips larger ones (cheaper than reading
 * them), within twice the best of either.  Both measured on the walk's own requests (libcurl's
 * times): the latency from each round's median time from a request sent to its first byte
 * (smoothed over the rounds), the rate as the median of a round's bodies of WALK_RATE_BYTES or
 * more (the first windows', and any later one that long). */
#define WALK_MIN        ((size_t)4 << 10)
#define WALK_RATE_BYTES ((size_t)64 << 10)

typedef struct walk_cost {
    uint64_t latency_us; /* 0: not measured yet */
    double rate;         /* bytes per microsecond; 0: not measured yet */
} walk_cost;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The costs seen in a round of k requests q. */
static void cost_update(walk_cost *c, const stoke__remote_req *q, size_t k)
{
    double lat[WALK_SHARDS], rate[WALK_SHARDS];
    size_t nl = 0, nr = 0;
    for (size_t j = 0; j < k; j++) {
        if (q[j].total_us == 0)
            continue;
        lat[nl++] = (double)q[j].first_us;
        if (q[j].got >= WALK_RATE_BYTES && q[j].total_us > q[j].first_us)
            rate[nr++] = (double)q[j].got / (double)(q[j].total_us - q[j].first_us);
    }
    if (nl) { /* smoothed: a round's median still jumps with the CPUs' load */
        qsort(lat, nl, sizeof(*lat), cmp_double);
        uint64_t m = (uint64_t)lat[nl / 2] + 1;
        c->latency_us = c->latency_us ? (3 * c->latency_us + m) / 4 : m;
    }
    if (nr) {
        qsort(rate, nr, sizeof(*rate), cmp_double);
        c->rate = rate[nr / 2];
    }
}

/* The window of a walk's next request: latency x rate bytes, in whole blocks, within
 * [WALK_MIN, REMOTE_WINDOW] (REMOTE_WINDOW until both are measured). */
static size_t cost_window(const walk_cost *c)
{
    if (!c->latency_us || c->rate <= 0)
        return REMOTE_WINDOW;
    double w = (double)c->latency_us * c->rate;
    if (w >= (double)REMOTE_WINDOW)
        return REMOTE_WINDOW;
    size_t b = (size_t)w / STOKE__TAR_BLOCK * STOKE__TAR_BLOCK;
    return b < WALK_MIN ? WALK_MIN : b;
}

/* One shard's walk: its iterator reads from the window, and a read outside it (-EAGAIN) leaves
 * the range to fetch in `want` for the next round. */
typedef struct rwalk {
    int shard;
    stoke__tar_shard *s;
    stoke__tar_scan sc; /* its members */
    stoke__tar_iter it;
    int started, done;
    char *buf;
    size_t cap, len; /* buf holds the file's [start, start + len) */
    uint64_t start;
    uint64_t want_off; /* the next request: [want_off, want_off + max(want_n, window)) */
    size_t want_n;
    int rc;                   /* the shard's error (recorded when it is the first in order) */
    char msg[STOKE__MSG_MAX]; /* its message */
    char err[512];            /* the iterator's */
} rwalk;

/* The iterator's read (stoke__tar_read_fn): from the window, or -EAGAIN with the range to
 * fetch (as one read of the shard: up to its end, fewer bytes only there). */
static int rwalk_read(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    rwalk *r = ctx;
    uint64_t end = r->start + r->len;
    if (off >= r->start && off <= end && (off + n <= end || end >= r->s->size)) {
        size_t have = n < end - off ? n : (size_t)(end - off);
        memcpy(buf, r->buf + (off - r->start), have);
        *got = have;
        return 0;
    }
    r->want_off = off;
    r->want_n = n;
    return -EAGAIN;
}

/* Fails walk r with code and the message (the shard's open's, as the one-shard walk words it). */
static void rwalk_fail(rwalk *r, int code, const char *fmt, ...) STOKE__PRINTF(3, 4);
static void rwalk_fail(rwalk *r, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->msg, sizeof(r->msg), fmt, ap);
    va_end(ap);
    r->rc = code;
    r->done = 1;
}

/* Walks r's shard on from its window until the window lacks bytes (want set), the end, or an
 * error. */
static void rwalk_step(const char *spec, rwalk *r)
{
    for (;;) {
        const char *path;
        uint64_t hdr, data, size;
        int rc = stoke__tar_iter_next(&r->it, &path, &hdr, &data, &size);
        if (rc == STOKE_EBUSY)
            return;
        if (rc == STOKE_EEND) {
            r->done = 1;
            return;
        }
        uint64_t at = r->it.err_off;
        if (!rc && (rc = stoke__tar_on_member(&r->sc, path, hdr, data, size)) != 0)
            at = hdr;
        if (rc == STOKE_ENOMEM)
            rwalk_fail(r, rc, "source '%s': tar %s: out of memory", spec, r->s->path);
        else if (rc)
            rwalk_fail(r, rc, "source '%s': tar %s: at byte %" PRIu64 ": %s", spec, r->s->path, at,
                       r->err);
        if (rc)
            return;
    }
}

/* The window fetched by request q of walk r: the shard's size from the first, then the walk on. */
static void rwalk_got(const char *spec, rwalk *r, const stoke__remote_req *q)
{
    r->start = q->off;
    r->len = q->got;
    if (!r->started) {
        if (q->total == UINT64_MAX) {
            rwalk_fail(r, STOKE_EIO,
                       "source '%s': GET %s: the server did not say the file's size "
                       "(no Content-Range: range requests are needed)",
                       spec, r->s->path);
            return;
        }
        r->s->size = q->total;
        r->started = 1;
        if (stoke__tar_iter_init(&r->it, r->s->size, rwalk_read, r, r->err, sizeof(r->err)) ||
            stoke__tar_iter_resumable(&r->it)) {
            rwalk_fail(r, STOKE_ENOMEM, "source '%s': tar %s: out of memory", spec, r->s->path);
            return;
        }
    } else if ((q->total != UINT64_MAX && q->total != r->s->size) ||
               (q->got < q->n && q->off + q->got < r->s->size)) {
        /* the file changed under the walk: the same request would come back short forever */
        rwalk_fail(r, STOKE_EIO,
                   "source '%s': tar %s: the file changed while its headers were read (%" PRIu64
                   " bytes, now %s; %zu of %zu bytes at %" PRIu64 ")",
                   spec, r->s->path, r->s->size,
                   q->total == UINT64_MAX ? "unknown" : "another size", q->got, q->n, q->off);
        return;
    }
    rwalk_step(spec, r);
}

/* Makes walk r's next request into *q: from where its iterator starts again (the member's
 * first header: its extension headers are read again with it) to the end of the read that
 * waits, at least `window` bytes (its buffer grown to it): 0, or STOKE_ENOMEM (r failed). */
static int rwalk_request(const char *spec, rwalk *r, size_t window, stoke__remote_req *q)
{
    uint64_t from = r->started && r->it.off < r->want_off ? r->it.off : r->want_off;
    size_t want = (size_t)(r->want_off - from) + r->want_n;
    want = want > window ? want : window;
    if (want > r->cap) {
        char *b = realloc(r->buf, want);
        if (!b) {
            rwalk_fail(r, STOKE_ENOMEM,
                       "source '%s': tar %s: out of memory for a window of %zu "
                       "bytes",
                       spec, r->s->path, want);
            return STOKE_ENOMEM;
        }
        r->buf = b;
        r->cap = want;
    }
    r->len = 0; /* the window is the request's until it is back */
    *q = (stoke__remote_req){.f = &r->s->rf, .buf = r->buf, .n = want, .off = from};
    return STOKE_OK;
}

static void rwalk_free(rwalk *r)
{
    stoke__tar_iter_free(&r->it);
    free(r->buf);
    r->buf = NULL;
    r->cap = 0;
}

/* Appends the members of walks w[0 .. n) (in shard order) into sc, keeping sc's order by
 * shard: 0 or STOKE_ENOMEM. */
static int merge(stoke__tar_scan *sc, rwalk *w, int n)
{
    size_t add = 0;
    for (int k = 0; k < n; k++)
        add += w[k].sc.n;
    if (!add)
        return STOKE_OK;
    stoke__tar_member *m = malloc((sc->n + add) * sizeof(*m));
    if (!m)
        return STOKE_ENOMEM;
    size_t a = 0, o = 0;
    for (int k = 0; k < n; k++) {
        while (a < sc->n && sc->m[a].shard < (uint32_t)w[k].shard)
            m[o++] = sc->m[a++];
        if (w[k].sc.n)
            memcpy(m + o, w[k].sc.m, w[k].sc.n * sizeof(*m));
        o += w[k].sc.n;
        w[k].sc.n = 0; /* the paths are sc's now */
    }
    while (a < sc->n)
        m[o++] = sc->m[a++];
    free(sc->m);
    sc->m = m;
    sc->n = sc->cap = o;
    return STOKE_OK;
}

int stoke__tar_walk_remote(const char *spec, stoke__tar_ds *t, const int *which, int n,
                           stoke__tar_scan *sc)
{
    if (n == 0)
        return STOKE_OK;
    rwalk *w = calloc((size_t)n, sizeof(*w));
    stoke__remote_req q[WALK_SHARDS];
    int at[WALK_SHARDS];
    if (!w)
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    for (int k = 0; k < n; k++) {
        w[k].shard = which[k];
        w[k].s = &t->shards[which[k]];
        w[k].sc = (stoke__tar_scan){.spec = spec, .sh = t->shards, .shard = (uint32_t)which[k]};
        w[k].want_n = REMOTE_WINDOW; /* the first window, from byte 0: the size comes with it */
    }
    /* rounds: the next request of each walk in flight (the first `live` not done, before the
     * first failed one: walks after it are not needed), read together */
    int first_bad = n, from = 0, rounds = 0;
    uint64_t requests = 0;
    walk_cost cost = {0};
    for (;;) {
        size_t k = 0;
        while (from < n && w[from].done)
            from++;
        for (int j = from; j < first_bad && k < WALK_SHARDS; j++) {
            if (w[j].done)
                continue;
            size_t win = w[j].started ? cost_window(&cost) : REMOTE_WINDOW;
            if (rwalk_request(spec, &w[j], win, &q[k]) != STOKE_OK) {
                first_bad = j < first_bad ? j : first_bad;
                continue;
            }
            at[k++] = j;
        }
        if (k == 0)
            break;
        size_t failed = 0;
        char why[STOKE__MSG_MAX];
        int rc = stoke__remote_read_many(t->pool, 0, q, k, &failed, why, sizeof(why));
        rounds++;
        requests += k;
        if (rc && failed < k) { /* that shard fails; the others ask again (their windows
                                   may be partial) */
            rwalk_fail(&w[at[failed]], rc, "source '%s': %s", spec, why);
        } else if (rc) { /* out of memory before any request: the first fails */
            rwalk_fail(&w[at[0]], rc, "source '%s': %s", spec, why);
        } else {
            cost_update(&cost, q, k);
            for (size_t j = 0; j < k; j++)
                rwalk_got(spec, &w[at[j]], &q[j]);
        }
        for (size_t j = 0; j < k; j++) {
            rwalk *r = &w[at[j]];
            if (r->done)
                rwalk_free(r);
            if (r->rc && at[j] < first_bad)
                first_bad = at[j];
        }
    }
    int rc = STOKE_OK;
    if (first_bad < n)
        rc = stoke__fail(w[first_bad].rc, "%s", w[first_bad].msg);
    else if (merge(sc, w, n) != STOKE_OK)
        rc = stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    else
        stoke__log(STOKE_LOG_DEBUG,
                   "%s: %d shard(s) walked at once: %" PRIu64 " request(s) in %d round(s), "
                   "windows of %zu bytes (latency %" PRIu64 " us, %.1f MB/s per connection)",
                   spec, n, requests, rounds, cost_window(&cost), cost.latency_us, cost.rate);
    for (int k = 0; k < n; k++) {
        rwalk_free(&w[k]);
        for (size_t j = 0; j < w[k].sc.n; j++)
            free(w[k].sc.m[j].path);
        free(w[k].sc.m);
    }
    free(w);
    return rc;
}
