/* Streams (remote.h, stoke__remote_stream_*): files read front to back, each with one
 * whole-file GET through a libcurl multi handle of the stream's own, the body read by the
 * caller as it arrives; the files the caller reads next requested meanwhile (read-ahead), each
 * on a lane (a connection, a queue of the bytes received) of its own; a failed try retried with
 * remote.c's engine (try_begin / try_end / backoff_ms) from the first byte not yet received.
 * Everything runs in the thread that reads (one at a time per stream): no lock. */
#define _GNU_SOURCE
#include "sources/remote.h"

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
                                const stoke__remote_file *const *next, size_t nnext)
{
    (void)st, (void)f, (void)next, (void)nnext;
}
int stoke__remote_stream_read(stoke__remote_stream *st, void *buf, size_t n, size_t *got, char *why,
                              size_t why_len)
{
    (void)st, (void)buf, (void)n;
    *got = 0;
    return no_curl(why, why_len);
}
void stoke__remote_stream_destroy(stoke__remote_stream *st)
{
    (void)st;
}

#else /* STOKE_HAVE_LIBCURL */

#include "sources/remote_internal.h"

#define LANES_MAX STOKE__REMOTE_BG_MAX /* STOKE_REMOTE_CONNECTIONS's most */

/* A lane: one file's transfer and the bytes received and not read yet, on a handle (and so a
 * connection) of its own, kept from file to file. */
typedef struct stoke__remote_lane {
    struct stoke__remote_stream *st;
    CURL *h;
    char err[CURL_ERROR_SIZE];   /* libcurl's reason of the try that ended */
    const stoke__remote_file *f; /* NULL: idle */
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

/* ln[0] is the lane of the file read (when started), ln[1 .. nl) those of next[0 .. nl - 1),
 * ln[nl .. nalloc) spare lanes (their handles kept for their connections). */
struct stoke__remote_stream {
    stoke__remote_pool *p;
    CURLM *m;
    lane *ln[LANES_MAX];
    int nl, nalloc, max; /* max: transfers running at once (files whose bytes all came and
                            wait to be read do not count) */
    const stoke__remote_file *const *next; /* the files after ln[0]'s, in order */
    size_t nnext;
    uint64_t cap; /* bytes received and not read, in all lanes: the most (STOKE_STREAM_AHEAD) */
    uint64_t buffered; /* ... now */
    uint64_t largest;  /* the largest file size a response said: a file's guess before its own */
    size_t need;       /* bytes the read in progress asks of ln[0] */
    uint64_t rng;
};

int stoke__remote_lane_append(lane *l, const char *data, size_t n)
{
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

static void lane_free(lane *l)
{
    if (!l)
        return;
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

/* l for file f (NULL: idle), its bytes dropped. */
static void lane_reset(lane *l, const stoke__remote_file *f)
{
    lane_stop(l);
    l->x = (xfer){.fd = -1, .q = l, .n = SIZE_MAX};
    l->f = f;
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
    st->rng = (stoke__now_ns() ^ (uint64_t)(uintptr_t)st * 0x9E3779B97F4A7C15u) | 1;
    *out = st;
    return STOKE_OK;
}

/* Moves lane i to the spares (idle). */
static void lane_retire(stoke__remote_stream *st, int i)
{
    lane *l = st->ln[i];
    lane_reset(l, NULL);
    memmove(&st->ln[i], &st->ln[i + 1], (size_t)(st->nalloc - i - 1) * sizeof(*st->ln));
    st->ln[st->nalloc - 1] = l;
    st->nl--;
}

void stoke__remote_stream_start(stoke__remote_stream *st, const stoke__remote_file *f,
                                const stoke__remote_file *const *next, size_t nnext)
{
    int k = 1; /* f's lane, when its transfer runs ahead */
    while (k < st->nl && st->ln[k]->f != f)
        k++;
    if (k < st->nl) {
        while (k-- > 0)
            lane_retire(st, 0);
    } else {
        while (st->nl > 1)
            lane_retire(st, st->nl - 1);
        lane_reset(st->ln[0], f);
        st->nl = 1;
    }
    st->next = next;
    st->nnext = nnext;
    for (int i = 1; i < st->nl; i++) /* the lanes ahead must follow next, in order */
        if ((size_t)(i - 1) >= nnext || st->ln[i]->f != next[i - 1]) {
            while (st->nl > i)
                lane_retire(st, st->nl - 1);
            break;
        }
}

/* A try of l that ended with c. */
static void lane_done(stoke__remote_stream *st, lane *l, CURLcode c)
{
    stoke__remote_pool *p = st->p;
    curl_multi_remove_handle(st->m, l->h);
    l->running = l->paused = 0;
    int rc = stoke__remote_try_end(p, l->f, &l->x, c, l->err, l->msg, sizeof(l->msg));
    if (rc == 0) {
        l->ended = 1;
    } else if (rc < 0) {
        l->failed = rc;
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

/* Bytes l holds or will bring that the reader has not taken: the rest of its file when its
 * size is known, else a guess (the largest file seen; the whole cap before any). */
static uint64_t lane_owed(const stoke__remote_stream *st, const lane *l)
{
    if (l->ended || l->failed)
        return l->len;
    if (l->x.has_total)
        return l->x.total > l->taken ? l->x.total - l->taken : 0;
    return st->largest ? st->largest : st->cap;
}

/* One round of the transfers: lanes added for the files next while the cap allows, tries
 * started where none runs (after their backoff), paused ones resumed where the bytes were read,
 * libcurl let work, the tries that ended handled.  wait: when nothing ended, wait up to a
 * second for a socket (or the next backoff's end). */
static void stream_pump(stoke__remote_stream *st, int wait)
{
    uint64_t owed = 0; /* bytes in flight and not read: the cap bounds them */
    int active = 0;    /* transfers not ended: STOKE_REMOTE_CONNECTIONS bounds them */
    for (int i = 0; i < st->nl; i++) {
        const lane *l = st->ln[i];
        if (l->x.has_total && l->x.total > st->largest)
            st->largest = l->x.total;
        owed += lane_owed(st, l);
        active += !l->ended && !l->failed;
    }
    while (st->max > 1 && active < st->max && st->nl < LANES_MAX && (size_t)(st->nl - 1) < st->nnext &&
           owed < st->cap) {
        if (st->nl == st->nalloc) {
            lane *l = lane_new(st);
            if (!l)
                break; /* no read-ahead then */
            st->ln[st->nalloc++] = l;
        }
        lane_reset(st->ln[st->nl], st->next[st->nl - 1]);
        owed += lane_owed(st, st->ln[st->nl]);
        active++;
        st->nl++;
    }
    uint64_t now = stoke__now_ns(), soonest = UINT64_MAX;
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
    if (!wait || done)
        return;
    int ms = 1000;
    if (soonest != UINT64_MAX) {
        uint64_t d = (soonest - now) / 1000000u + 1;
        ms = d < 1000 ? (int)d : 1000;
    }
    curl_multi_poll(st->m, NULL, 0, ms, NULL);
}

int stoke__remote_stream_read(stoke__remote_stream *st, void *buf, size_t n, size_t *got, char *why,
                              size_t why_len)
{
    *got = 0;
    lane *l = st->ln[0];
    if (!l->f) {
        stoke__fmt(why, why_len, "stream: no file started");
        return STOKE_EINVAL;
    }
    uint64_t t0 = stoke__now_ns();
    st->need = n;
    if (st->max > 1) /* the transfers ahead move on while the caller has bytes to read */
        stream_pump(st, 0);
    while (l->len < n && !l->ended && !l->failed)
        stream_pump(st, 1);
    atomic_fetch_add(&st->p->n->wait_ns, stoke__now_ns() - t0);
    if (l->failed) { /* sticky: the file's later reads fail the same way */
        lane_stop(l);
        stoke__fmt_short(why, why_len, "%s", l->msg[0] ? l->msg : "GET failed");
        return l->failed;
    }
    size_t k = n < l->len ? n : l->len;
    if (k)
        memcpy(buf, l->q + l->head, k);
    l->head += k;
    l->len -= k;
    l->taken += k;
    st->buffered -= k;
    *got = k;
    return STOKE_OK;
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
