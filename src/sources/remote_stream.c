/* Streams (remote.h, stoke__remote_stream_*): a file read front to back with one whole-file
 * GET through a libcurl multi handle of the stream's own, the body read by the caller as it
 * arrives, a failed try retried with remote.c's engine (try_begin / try_end / backoff) from the
 * first byte not yet received. */
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
void stoke__remote_stream_start(stoke__remote_stream *st, const stoke__remote_file *f)
{
    (void)st, (void)f;
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

/* A stream (stoke__remote_stream_*): one whole-file GET through a multi handle of its own, read
 * by the caller as the body arrives; bytes received and not yet read wait in the queue. */
struct stoke__remote_stream {
    stoke__remote_pool *p;
    CURLM *m;
    CURL *h;
    char err[CURL_ERROR_SIZE];
    const stoke__remote_file *f; /* NULL: no file started */
    xfer *x;
    char *q; /* the queue: q[head, head + len) */
    size_t cap, head, len;
    int running;      /* a try of x is in m */
    int ended;        /* the file came whole */
    int failed;       /* the file failed for good: every read returns it */
    unsigned attempt; /* tries made of this file, less one */
    uint64_t rng;
};

int stoke__remote_stream_append(struct stoke__remote_stream *st, const char *data, size_t n)
{
    if (st->head + st->len + n > st->cap && st->head) {
        memmove(st->q, st->q + st->head, st->len);
        st->head = 0;
    }
    if (st->len + n > st->cap) {
        size_t cap = st->cap ? st->cap : (size_t)1 << 16;
        while (cap < st->len + n)
            cap *= 2;
        char *q = realloc(st->q, cap);
        if (!q)
            return -1;
        st->q = q;
        st->cap = cap;
    }
    memcpy(st->q + st->head + st->len, data, n);
    st->len += n;
    return 0;
}

/* ---- streams ------------------------------------------------------------------------------ */

int stoke__remote_stream_create(stoke__remote_pool *p, stoke__remote_stream **out, char *why,
                                size_t why_len)
{
    *out = NULL;
    stoke__remote_stream *st = calloc(1, sizeof(*st));
    xfer *x = calloc(1, sizeof(*x));
    CURLM *m = st && x ? curl_multi_init() : NULL;
    CURL *h = m ? stoke__remote_handle_new(p, &(slot){0}) : NULL;
    if (!h) {
        if (m)
            curl_multi_cleanup(m);
        free(x);
        free(st);
        stoke__fmt(why, why_len, "out of memory for a stream (libcurl handles)");
        return STOKE_ENOMEM;
    }
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, st->err);
    st->p = p;
    st->m = m;
    st->h = h;
    st->x = x;
    st->rng = (stoke__now_ns() ^ (uint64_t)(uintptr_t)st * 0x9E3779B97F4A7C15u) | 1;
    *out = st;
    return STOKE_OK;
}

/* Ends the try in flight, if any: counted as a request, with the bytes it brought. */
static void stream_stop(stoke__remote_stream *st)
{
    if (!st->running)
        return;
    curl_multi_remove_handle(st->m, st->h);
    st->running = 0;
    atomic_fetch_add(&st->p->n->requests, 1);
    atomic_fetch_add(&st->p->n->bytes, (uint64_t)(st->x->got - st->x->before));
}

void stoke__remote_stream_start(stoke__remote_stream *st, const stoke__remote_file *f)
{
    stream_stop(st);
    *st->x = (xfer){.fd = -1, .q = st, .n = SIZE_MAX};
    st->f = f;
    st->head = st->len = 0;
    st->ended = st->failed = 0;
    st->attempt = 0;
    st->err[0] = 0;
}

/* One round of the transfer: starts a try when none runs, lets libcurl work (waiting up to a
 * second for the socket), and handles a try that ended: 0 (go on), or the file's error. */
static int stream_pump(stoke__remote_stream *st, char *why, size_t why_len)
{
    stoke__remote_pool *p = st->p;
    xfer *x = st->x;
    if (!st->running) {
        st->err[0] = 0;
        stoke__remote_try_begin(p, st->h, st->f, x);
        if (curl_multi_add_handle(st->m, st->h) != CURLM_OK) {
            stoke__fmt_short(why, why_len, "GET %s: libcurl refused the request", st->f->url);
            return STOKE_EIO;
        }
        st->running = 1;
    }
    int still = 0, left = 0;
    curl_multi_perform(st->m, &still);
    CURLMsg *msg;
    int done = 0;
    CURLcode c = CURLE_OK;
    while ((msg = curl_multi_info_read(st->m, &left)) != NULL)
        if (msg->msg == CURLMSG_DONE && msg->easy_handle == st->h) {
            done = 1;
            c = msg->data.result;
        }
    if (!done) {
        if (still)
            curl_multi_poll(st->m, NULL, 0, 1000, NULL);
        return STOKE_OK;
    }
    curl_multi_remove_handle(st->m, st->h);
    st->running = 0;
    int rc = stoke__remote_try_end(p, st->f, x, c, st->err, why, why_len);
    if (rc == 0) {
        st->ended = 1;
        return STOKE_OK;
    }
    if (rc < 0)
        return rc;
    if (st->attempt >= p->retries) { /* as retry_loop's */
        size_t l = strlen(why);
        stoke__fmt(why + l, why_len - l, " (after %u tries)", st->attempt + 1);
        return STOKE_EIO;
    }
    atomic_fetch_add(&p->n->retries_done, 1);
    stoke__log(STOKE_LOG_DEBUG, "remote: %s; retry %u of %u", why, st->attempt + 1, p->retries);
    stoke__remote_backoff(st->attempt, x->retry_after, &st->rng, x);
    st->attempt++;
    return STOKE_OK; /* the next round starts the next try, from the first byte missing */
}

int stoke__remote_stream_read(stoke__remote_stream *st, void *buf, size_t n, size_t *got, char *why,
                              size_t why_len)
{
    *got = 0;
    if (!st->f) {
        stoke__fmt(why, why_len, "stream: no file started");
        return STOKE_EINVAL;
    }
    if (st->failed) {
        stoke__fmt_short(why, why_len, "%s", st->err[0] ? st->err : "GET failed");
        return st->failed;
    }
    uint64_t t0 = stoke__now_ns();
    int rc = STOKE_OK;
    while (st->len < n && !st->ended && rc == STOKE_OK)
        rc = stream_pump(st, why, why_len);
    atomic_fetch_add(&st->p->n->wait_ns, stoke__now_ns() - t0);
    if (rc) { /* sticky: the file's later reads fail the same way */
        stream_stop(st);
        st->failed = rc;
        stoke__fmt_short(st->err, sizeof(st->err), "%s", why);
        return rc;
    }
    size_t k = n < st->len ? n : st->len;
    if (k)
        memcpy(buf, st->q + st->head, k);
    st->head += k;
    st->len -= k;
    *got = k;
    return STOKE_OK;
}

void stoke__remote_stream_destroy(stoke__remote_stream *st)
{
    if (!st)
        return;
    stream_stop(st);
    curl_easy_cleanup(st->h);
    curl_multi_cleanup(st->m);
    free(st->q);
    free(st->x);
    free(st);
}

#endif /* STOKE_HAVE_LIBCURL */
