/* Streams (remote.h, stoke__remote_stream_*): files read front to back through a libcurl multi
 * handle of the stream's own, the body read by the caller as it arrives.  With read-ahead, each
 * file is fetched as chunks (range requests of a few MiB), each on a lane (a connection, a queue
 * of the bytes received) of its own: the chunks after the one read, of the file read and of the
 * files the caller reads next, are requested meanwhile; without it, one whole-file GET.  A failed
 * try is retried with remote.c's engine (try_begin / try_end / backoff_ms) from the first byte not
 * yet received.  Everything runs in the thread that reads (one at a time per stream): no lock. */
#define _GNU_SOURCE
#include "sources/remote.h"

#include <inttypes.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

#ifndef STOKE_HAVE_LIBCURL

struct stoke__remote_stream {
    int unused;
};
static int no_curl(char *why, size_t why_len)
{
    stoke__remote_pool *none;
    return stoke__remote_pool_create(&none, why, why_len); /* STOKE_ENOTSUP, saying why */
}
int stoke__remote_stream_create(stoke__remote_pool *p, stoke__remote_stream **out, char *why,
                                size_t why_len)
{
    (void)p;
    *out = NULL;
    return no_curl(why, why_len);
}
void stoke__remote_stream_start(stoke__remote_stream *st, const stoke__remote_file *f,
                                const stoke__remote_file *const *next, size_t nnext, int ahead)
{
    (void)st, (void)f, (void)next, (void)nnext, (void)ahead;
}
int stoke__remote_stream_read(stoke__remote_stream *st, void *buf, size_t n, size_t *got, char *why,
                              size_t why_len)
{
    (void)st, (void)buf, (void)n;
    *got = 0;
    return no_curl(why, why_len);
}
void stoke__remote_stream_finish(stoke__remote_stream *st, size_t most)
{
    (void)st, (void)most;
}
void stoke__remote_stream_destroy(stoke__remote_stream *st)
{
    (void)st;
}

#else /* STOKE_HAVE_LIBCURL */

#include "sources/remote_internal.h"

#define LANES_MAX   STOKE__REMOTE_BG_MAX /* STOKE_REMOTE_CONNECTIONS's most */
#define CHUNK_MIN   ((size_t)64 << 10)   /* a chunk: STOKE_STREAM_AHEAD / (2 x connections), */
#define CHUNK_MAX   ((size_t)64 << 20)   /* ... within these */
#define CHUNK_FIRST ((size_t)64 << 10)   /* without read-ahead: the first chunk, doubled after */

/* The validator of one pass over a file (remote.h, stoke__remote_tag): shared by the lanes of
 * its chunks, so that they all come from the version of the first answer (an unpinned file's:
 * the next pass, a later epoch's, may read another). */
typedef struct passtag {
    stoke__remote_tag t;
    int refs;
} passtag;

/* A lane: one chunk's transfer (bytes [x.off, x.off + x.n) of file f; x.n SIZE_MAX: to the
 * file's end) and the bytes received and not read yet, on a handle (and so a connection) of its
 * own, kept from chunk to chunk. */
typedef struct stoke__remote_lane {
    struct stoke__remote_stream *st;
    CURL *h;
    char err[CURL_ERROR_SIZE];   /* libcurl's reason of the try that ended */
    const stoke__remote_file *f; /* NULL: idle */
    long fi;                     /* f is the file read (-1) or the stream's next[fi] */
    uint64_t ftotal;             /* f's size, when fknown (said by this or an earlier chunk) */
    int fknown;
    passtag *tag; /* the pass's validator (NULL: f is pinned, or out of memory: f->tag's) */
    xfer x;
    char *q; /* the queue: q[head, head + len) */
    size_t cap, head, len;
    uint64_t taken;    /* bytes read from the queue */
    int running;       /* a try of x is in the multi handle */
    int paused;        /* ... and paused by on_body (stoke__remote_lane_full) */
    int ended;         /* the file came whole */
    int failed;        /* the file failed for good: every read returns it, with msg */
    unsigned attempt;  /* tries made of this file, less one */
    uint64_t retry_at; /* stoke__now_ns() before which the next try does not start */
    char msg[STOKE__MSG_MAX];
} lane;

/* ln[0] is the lane of the chunk read (when started), ln[1 .. nl) those of the chunks after it
 * in the order they are read (the rest of its file, then next[0]'s, ...: each lane the chunk
 * after the one before it, lane_after), ln[nl .. nalloc) spare lanes (their handles kept for
 * their connections). */
struct stoke__remote_stream {
    stoke__remote_pool *p;
    CURLM *m;
    lane *ln[LANES_MAX];
    int nl, nalloc, max; /* max: transfers running at once (chunks whose bytes all came and
                            wait to be read do not count) */
    int ahead;           /* chunks after the one read are fetched meanwhile */
    size_t chunk;        /* bytes of a file's first chunk; SIZE_MAX: whole files */
    size_t chunk_ahead;  /* ... with read-ahead (then every chunk's); without, the most */
    const stoke__remote_file *const *next; /* the files after ln[0]'s, in order */
    size_t nnext;
    uint64_t cap; /* bytes received and not read, in all lanes: the most (STOKE_STREAM_AHEAD) */
    uint64_t buffered; /* ... now */
    uint64_t arrived;  /* deliveries of bytes into any lane (stream_pump: did any come?) */
    uint64_t largest;  /* the largest file size a response said: a file's guess before its own */
    size_t need;       /* bytes the read in progress asks of ln[0] */
    uint64_t rng;
};

int stoke__remote_lane_append(lane *l, const char *data, size_t n)
{
    l->st->arrived++;
    if (l->head + l->len + n > l->cap && l->head) {
        memmove(l->q, l->q + l->head, l->len);
        l->head = 0;
    }
    if (l->len + n > l->cap) {
        size_t cap = l->cap ? l->cap : (size_t)1 << 16;
        while (cap < l->len + n)
            cap *= 2;
        char *q = realloc(l->q, cap);
        if (!q)
            return -1;
        l->q = q;
        l->cap = cap;
    }
    memcpy(l->q + l->head + l->len, data, n);
    l->len += n;
    l->st->buffered += n;
    return 0;
}

/* Whether l must wait: a lane ahead while the stream holds its cap; the file read while it
 * alone holds the cap and what the read asks. */
static int lane_must_wait(const lane *l)
{
    const struct stoke__remote_stream *st = l->st;
    if (l == st->ln[0])
        return l->len >= st->cap && l->len >= st->need;
    return st->buffered >= st->cap;
}

int stoke__remote_lane_full(lane *l)
{
    if (!lane_must_wait(l))
        return 0;
    l->paused = 1;
    return 1;
}

/* ---- lanes -------------------------------------------------------------------------------- */

static lane *lane_new(stoke__remote_stream *st)
{
    lane *l = calloc(1, sizeof(*l));
    if (!l || !(l->h = stoke__remote_handle_new(st->p, &(slot){0}))) {
        free(l);
        return NULL;
    }
    curl_easy_setopt(l->h, CURLOPT_ERRORBUFFER, l->err);
    curl_easy_setopt(l->h, CURLOPT_PRIVATE, (char *)l);
    l->st = st;
    return l;
}

/* Drops l's share of its pass's validator. */
static void tag_drop(lane *l)
{
    passtag *t = l->tag;
    l->tag = NULL;
    if (t && --t->refs == 0) {
        free(atomic_load(&t->t.v));
        free(t);
    }
}

static void lane_free(lane *l)
{
    if (!l)
        return;
    tag_drop(l);
    curl_easy_cleanup(l->h);
    free(l->q);
    free(l);
}

/* Ends the try in flight, if any: counted as a request, with the bytes it brought. */
static void lane_stop(lane *l)
{
    if (!l->running)
        return;
    curl_multi_remove_handle(l->st->m, l->h);
    l->running = l->paused = 0;
    atomic_fetch_add(&l->st->p->n->requests, 1);
    atomic_fetch_add(&l->st->p->n->bytes, (uint64_t)(l->x.got - l->x.before));
}

/* l for bytes [off, off + n) of file f, the file read (fi -1) or next[fi] (f NULL: idle), its
 * bytes dropped; in the pass whose validator is `pass` (NULL: a new pass, f's first chunk). */
static void lane_reset(lane *l, const stoke__remote_file *f, long fi, uint64_t off, size_t n,
                       passtag *pass)
{
    lane_stop(l);
    if (pass) /* (before the drop: pass may be l's own) */
        pass->refs++;
    tag_drop(l);
    if (!pass && f && !f->tag && (pass = calloc(1, sizeof(*pass))) != NULL)
        *pass = (passtag){.t.pass = 1, .refs = 1};
    l->tag = pass;
    stoke__remote_tag *want = f && f->tag ? f->tag : pass ? &pass->t : NULL;
    l->x = (xfer){.fd = -1, .q = l, .off = off, .n = n, .tag = want};
    l->f = f;
    l->fi = fi;
    l->ftotal = 0;
    l->fknown = 0;
    l->st->buffered -= l->len;
    l->head = l->len = 0;
    l->taken = 0;
    l->ended = l->failed = 0;
    l->attempt = 0;
    l->retry_at = 0;
    l->err[0] = l->msg[0] = 0;
}

int stoke__remote_stream_create(stoke__remote_pool *p, stoke__remote_stream **out, char *why,
                                size_t why_len)
{
    *out = NULL;
    stoke__remote_stream *st = calloc(1, sizeof(*st));
    CURLM *m = st ? curl_multi_init() : NULL;
    if (m) {
        st->p = p;
        st->m = m;
        st->ln[0] = lane_new(st);
    }
    if (!m || !st->ln[0]) {
        if (m)
            curl_multi_cleanup(m);
        free(st);
        stoke__fmt(why, why_len, "out of memory for a stream (libcurl handles)");
        return STOKE_ENOMEM;
    }
    st->nalloc = 1;
    st->max = p->connections < 1 ? 1 : p->connections > LANES_MAX ? LANES_MAX : p->connections;
    st->cap = p->stream_ahead ? p->stream_ahead : 1;
    uint64_t c = st->cap / (2 * (uint64_t)st->max);
    st->chunk_ahead = c < CHUNK_MIN ? CHUNK_MIN : c > CHUNK_MAX ? CHUNK_MAX : (size_t)c;
    st->chunk = SIZE_MAX;
    st->rng = (stoke__now_ns() ^ (uint64_t)(uintptr_t)st * 0x9E3779B97F4A7C15u) | 1;
    *out = st;
    return STOKE_OK;
}

/* Moves lane i to the spares (idle). */
static void lane_retire(stoke__remote_stream *st, int i)
{
    lane *l = st->ln[i];
    lane_reset(l, NULL, 0, 0, SIZE_MAX, NULL);
    memmove(&st->ln[i], &st->ln[i + 1], (size_t)(st->nalloc - i - 1) * sizeof(*st->ln));
    st->ln[st->nalloc - 1] = l;
    st->nl--;
}

/* f's size as l knows it: 1 and *total, or 0 when no response has said it yet. */
static int lane_total(lane *l, uint64_t *total)
{
    if (!l->fknown && l->x.has_total) {
        l->fknown = 1;
        l->ftotal = l->x.total;
    }
    *total = l->ftotal;
    return l->fknown;
}

/* The chunk read after l's: 1 with *f, *fi, *off (the file read or next[*fi], from *off), 0 when
 * there is none (l's file ends with it and no file is next), -1 when it is not known yet (l's
 * file's size is not, and l has neither ended nor failed).  *same: the chunk is of l's file. */
static int lane_after(stoke__remote_stream *st, lane *l, const stoke__remote_file **f, long *fi,
                      uint64_t *off, int *same)
{
    uint64_t total, end = l->x.n == SIZE_MAX ? UINT64_MAX : l->x.off + l->x.n;
    int more; /* l's file goes on after l's chunk */
    if (end == UINT64_MAX)
        more = 0;
    else if (lane_total(l, &total))
        more = end < total;
    else if (l->ended)
        more = l->x.got == l->x.n; /* no size said (Content-Range "bytes A-B/ *"): ask on */
    else if (l->failed)
        more = 0; /* its file's reads fail with it: the next file's chunks come next */
    else
        return -1;
    *same = more;
    if (more) {
        *f = l->f, *fi = l->fi, *off = end;
        return 1;
    }
    long k = l->fi + 1;
    if ((size_t)k >= st->nnext)
        return 0;
    *f = st->next[k], *fi = k, *off = 0;
    return 1;
}

/* l (which may be prev) set to the chunk after prev's: f from off (as lane_after said).  A chunk
 * is st->chunk bytes, or, without read-ahead, twice the one before in the same file (up to
 * chunk_ahead): a caller that reads a file's start makes few requests and drains little. */
static void lane_follow(stoke__remote_stream *st, lane *prev, lane *l, const stoke__remote_file *f,
                        long fi, uint64_t off, int same)
{
    uint64_t total = 0;
    int known = same && lane_total(prev, &total);
    size_t n = st->chunk;
    if (same && !st->ahead && n != SIZE_MAX)
        n = prev->x.n < st->chunk_ahead / 2 ? prev->x.n * 2 : st->chunk_ahead;
    if (known && n != SIZE_MAX && total - off < n)
        n = (size_t)(total - off);
    lane_reset(l, f, fi, off, n, same ? prev->tag : NULL);
    if (known)
        l->fknown = 1, l->ftotal = total;
}

/* The lanes after the first kept while each is the chunk after the one before it (their files
 * renumbered for the stream's next); from the first that is not, they go to the spares. */
static void lanes_check(stoke__remote_stream *st)
{
    for (int i = 1; i < st->nl; i++) {
        const stoke__remote_file *f;
        long fi;
        uint64_t off;
        int same;
        lane *l = st->ln[i];
        if (lane_after(st, st->ln[i - 1], &f, &fi, &off, &same) == 1 && l->f == f &&
            l->x.off == off) {
            l->fi = fi;
            continue;
        }
        while (st->nl > i)
            lane_retire(st, st->nl - 1);
        break;
    }
}

void stoke__remote_stream_start(stoke__remote_stream *st, const stoke__remote_file *f,
                                const stoke__remote_file *const *next, size_t nnext, int ahead)
{
    int k = 1; /* the lane of f's first chunk, when its transfer runs ahead */
    while (k < st->nl && !(st->ln[k]->f == f && st->ln[k]->x.off == 0))
        k++;
    st->next = next;
    st->nnext = nnext;
    st->ahead = ahead && st->max > 1;
    st->chunk = st->ahead ? st->chunk_ahead : ahead ? SIZE_MAX : CHUNK_FIRST;
    if (k < st->nl) {
        while (k-- > 0)
            lane_retire(st, 0);
        st->ln[0]->fi = -1;
        lanes_check(st); /* the lanes ahead must follow next, in order */
    } else {
        while (st->nl > 1)
            lane_retire(st, st->nl - 1);
        lane_reset(st->ln[0], f, -1, 0, st->chunk, NULL);
        st->nl = 1;
    }
}

/* A try of l that ended with c. */
static void lane_done(stoke__remote_stream *st, lane *l, CURLcode c)
{
    stoke__remote_pool *p = st->p;
    curl_multi_remove_handle(st->m, l->h);
    l->running = l->paused = 0;
    int rc = stoke__remote_try_end(p, l->f, &l->x, c, l->err, l->msg, sizeof(l->msg));
    if (rc >= 0 && l->fknown && l->x.has_total && l->x.total != l->ftotal) {
        stoke__fmt_short(l->msg, sizeof(l->msg),
                         "GET %s: the file changed while it was read (%" PRIu64 " bytes, %" PRIu64
                         " before)",
                         l->f->url, l->x.total, l->ftotal);
        l->failed = STOKE_EIO;
    } else if (rc == 0) {
        l->ended = 1;
    } else if (rc < 0) {
        l->failed = rc;
    } else if (l->x.capped) { /* progress (as retry_loop's): the rest at once, not a retry */
        l->retry_at = 0;
        l->msg[0] = 0;
    } else if (l->attempt >= p->retries) { /* as retry_loop's */
        size_t n = strlen(l->msg);
        stoke__fmt(l->msg + n, sizeof(l->msg) - n, " (after %u tries)", l->attempt + 1);
        l->failed = STOKE_EIO;
    } else {
        atomic_fetch_add(&p->n->retries_done, 1);
        stoke__log(STOKE_LOG_DEBUG, "remote: %s; retry %u of %u", l->msg, l->attempt + 1,
                   p->retries);
        l->retry_at = stoke__now_ns() +
                      stoke__remote_backoff_ms(l->attempt, l->x.retry_after, &st->rng) * 1000000u;
        l->attempt++;
        l->msg[0] = 0; /* the next round starts the next try, from the first byte missing */
    }
}

/* Bytes l holds or will bring that the reader has not taken: the rest of its chunk (of its
 * file for a whole-file lane, when its size is known, else a guess: the largest file seen; the
 * whole cap before any). */
static uint64_t lane_owed(const stoke__remote_stream *st, lane *l)
{
    if (l->ended || l->failed)
        return l->len;
    uint64_t total, span;
    int known = lane_total(l, &total);
    if (l->x.n != SIZE_MAX)
        span = known && total - l->x.off < l->x.n ? total - l->x.off : l->x.n;
    else if (known)
        span = total > l->x.off ? total - l->x.off : 0;
    else
        span = st->largest ? st->largest : st->cap;
    return span > l->taken ? span - l->taken : 0;
}

/* One round of the transfers: lanes added for the files next while the cap allows, tries
 * started where none runs (after their backoff), paused ones resumed where the bytes were read,
 * libcurl let work, the tries that ended handled.  wait: when nothing ended, wait up to a
 * second for a socket (or the next backoff's end). */
static void stream_pump(stoke__remote_stream *st, int wait)
{
    lanes_check(st);   /* a chunk answered with the whole file (200) ends its file's lanes */
    uint64_t owed = 0; /* bytes in flight and not read: the cap bounds them */
    int active = 0;    /* transfers not ended: STOKE_REMOTE_CONNECTIONS bounds them */
    for (int i = 0; i < st->nl; i++) {
        lane *l = st->ln[i];
        if (l->x.has_total && l->x.total > st->largest)
            st->largest = l->x.total;
        owed += lane_owed(st, l);
        active += !l->ended && !l->failed;
    }
    const stoke__remote_file *f;
    long fi;
    uint64_t off;
    int same;
    while (st->ahead && active < st->max && st->nl < LANES_MAX && owed < st->cap &&
           lane_after(st, st->ln[st->nl - 1], &f, &fi, &off, &same) == 1) {
        if (st->nl == st->nalloc) {
            lane *l = lane_new(st);
            if (!l)
                break; /* no read-ahead then */
            st->ln[st->nalloc++] = l;
        }
        lane_follow(st, st->ln[st->nl - 1], st->ln[st->nl], f, fi, off, same);
        owed += lane_owed(st, st->ln[st->nl]);
        active++;
        st->nl++;
    }
    uint64_t now = stoke__now_ns(), soonest = UINT64_MAX;
    uint64_t arrived = st->arrived; /* (a resume delivers what libcurl held, in the call) */
    for (int i = 0; i < st->nl; i++) {
        lane *l = st->ln[i];
        if (l->running) {
            if (l->paused && !lane_must_wait(l)) {
                l->paused = 0;
                curl_easy_pause(l->h, CURLPAUSE_CONT);
            }
            continue;
        }
        if (l->ended || l->failed)
            continue;
        if (now < l->retry_at) {
            soonest = l->retry_at < soonest ? l->retry_at : soonest;
            continue;
        }
        l->err[0] = 0;
        stoke__remote_try_begin(st->p, l->h, l->f, &l->x);
        if (curl_multi_add_handle(st->m, l->h) != CURLM_OK) {
            stoke__fmt_short(l->msg, sizeof(l->msg), "GET %s: libcurl refused the request",
                             l->f->url);
            l->failed = STOKE_EIO;
            continue;
        }
        l->running = 1;
    }
    int still = 0, left = 0, done = 0;
    curl_multi_perform(st->m, &still);
    CURLMsg *msg;
    while ((msg = curl_multi_info_read(st->m, &left)) != NULL) {
        char *l = NULL;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &l);
        if (l) {
            lane_done(st, (lane *)l, msg->data.result);
            done = 1;
        }
    }
    /* bytes that came are maybe what the reader waits for: it looks before any wait (the
     * poll slept a second with them queued when the lane had paused on them) */
    if (!wait || done || st->arrived != arrived)
        return;
    int ms = 1000;
    if (soonest != UINT64_MAX) {
        uint64_t d = (soonest - now) / 1000000u + 1;
        ms = d < 1000 ? (int)d : 1000;
    }
    curl_multi_poll(st->m, NULL, 0, ms, NULL);
}

/* The chunk read done (ended, all its bytes taken): ln[0] becomes the next chunk of its file.
 * 0 when the file ends with it. */
static int lane_advance(stoke__remote_stream *st)
{
    const stoke__remote_file *f;
    long fi;
    uint64_t off;
    int same;
    lanes_check(st);
    if (lane_after(st, st->ln[0], &f, &fi, &off, &same) != 1 || !same)
        return 0;
    if (st->nl > 1) { /* lanes_check: ln[1] is that chunk */
        lane_retire(st, 0);
        return 1;
    }
    if (st->nl == st->nalloc) { /* a lane for it, then ln[0]'s to the spares */
        lane *l = lane_new(st);
        if (!l) { /* the chunk on ln[0]'s handle */
            lane_follow(st, st->ln[0], st->ln[0], f, fi, off, same);
            return 1;
        }
        st->ln[st->nalloc++] = l;
    }
    lane_follow(st, st->ln[0], st->ln[1], f, fi, off, same);
    st->nl = 2;
    lane_retire(st, 0);
    return 1;
}

int stoke__remote_stream_read(stoke__remote_stream *st, void *buf, size_t n, size_t *got, char *why,
                              size_t why_len)
{
    *got = 0;
    if (!st->ln[0]->f) {
        stoke__fmt(why, why_len, "stream: no file started");
        return STOKE_EINVAL;
    }
    uint64_t t0 = stoke__now_ns();
    size_t k = 0;  /* bytes given */
    if (st->ahead) /* the transfers ahead move on while the caller has bytes to read */
        stream_pump(st, 0);
    for (;;) {
        lane *l = st->ln[0];
        st->need = n - k;
        if (l->failed) { /* sticky: the file's later reads fail the same way */
            lane_stop(l);
            atomic_fetch_add(&st->p->n->wait_ns, stoke__now_ns() - t0);
            stoke__fmt_short(why, why_len, "%s", l->msg[0] ? l->msg : "GET failed");
            return l->failed;
        }
        if (l->len >= n - k || (l->ended && l->len)) {
            size_t c = n - k < l->len ? n - k : l->len;
            memcpy((char *)buf + k, l->q + l->head, c);
            l->head += c;
            l->len -= c;
            l->taken += c;
            st->buffered -= c;
            k += c;
            if (k == n)
                break;
        }
        if (l->ended && !l->len) {
            if (!lane_advance(st))
                break; /* the file ends */
            continue;
        }
        stream_pump(st, 1);
    }
    atomic_fetch_add(&st->p->n->wait_ns, stoke__now_ns() - t0);
    *got = k;
    return STOKE_OK;
}

void stoke__remote_stream_finish(stoke__remote_stream *st, size_t most)
{
    while (st->nl > 1)
        lane_retire(st, st->nl - 1);
    lane *l = st->ln[0];
    if (l->f && !l->ended && !l->failed && l->x.n != SIZE_MAX && lane_owed(st, l) - l->len <= most)
        while (!l->ended && !l->failed) {
            /* nobody reads what is drained: dropped, and no read's need pauses the lane (a
             * STOKE_STREAM_AHEAD under what the lane held paused it here for ever) */
            st->need = SIZE_MAX;
            st->buffered -= l->len;
            l->taken += l->len;
            l->head = l->len = 0;
            stream_pump(st, 1);
        }
    /* a transfer still running ends: its connection too */
    lane_reset(l, NULL, 0, 0, SIZE_MAX, NULL);
}

void stoke__remote_stream_destroy(stoke__remote_stream *st)
{
    if (!st)
        return;
    for (int i = 0; i < st->nalloc; i++) {
        lane_stop(st->ln[i]);
        lane_free(st->ln[i]);
    }
    curl_multi_cleanup(st->m);
    free(st);
}

#endif /* STOKE_HAVE_LIBCURL */
