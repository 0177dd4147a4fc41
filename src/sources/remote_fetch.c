/* Whole-file fetches (remote.h, stoke__remote_fetch): a file downloaded into an fd as chunks,
 * range requests of STOKE_STREAM_AHEAD / (2 x STOKE_REMOTE_CONNECTIONS) bytes (as a stream's),
 * written at their offsets (pwrite).  The chunks of every fetch of a pool in progress (the
 * cache's reader and its background downloaders, each in its own thread) share one libcurl multi
 * handle with STOKE_REMOTE_CONNECTIONS transfers at most: so the pool's connections stay that
 * many (the multi handle's connections are reused from chunk to chunk, whichever fetch they
 * served), and they stay busy while any fetch has a chunk left, the last shard's tail included.
 * A try that fails in a way that can pass is retried after the backoff of a read, from the
 * chunk's first missing byte (remote.c's try_begin / try_end).
 *
 * Locking: p->fe_lock guards the fetcher and its jobs.  The threads that wait for a fetch take
 * turns at driving the transfers: one at a time (fetcher.driving) runs the multi handle
 * (curl_multi_perform / poll, without the lock: the callbacks touch only the lanes' xfers,
 * which only the driver touches), the others wait on p->fe_cond; a driver whose own fetch ended
 * gives the transfers up (broadcast) and another waiting thread takes them.  A fetch holds its
 * slot's lock throughout (stoke__remote_slot_take): the pool's fork hook, which takes every
 * slot, so finds no fetch running and the fetcher idle. */
#define _GNU_SOURCE
#include "sources/remote.h"

#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

#ifdef STOKE_HAVE_LIBCURL

#include "sources/remote_internal.h"

#define LANES_MAX STOKE__REMOTE_BG_MAX
#define CHUNK_MIN ((uint64_t)64 << 10) /* as a stream's chunks */
#define CHUNK_MAX ((uint64_t)64 << 20)

/* One fetch: a file into fd, its chunks [0, next) handed to lanes so far. */
typedef struct fjob {
    const stoke__remote_file *f;
    int fd;
    _Atomic uint64_t *seen;
    const int *stop;
    uint64_t total; /* the file's size, when known */
    int known;
    int ranged;       /* a response said 206 with the size: the chunks after the first may go */
    uint64_t next;    /* the first byte no lane was given */
    uint64_t written; /* bytes of the chunks that ended */
    int nrun;         /* lanes on this job (running, or waiting to retry) */
    int fg;           /* a worker's (someone waits on it): served before the background's */
    int rc;           /* its error (the first), with msg */
    int told;         /* its thread was woken to see it over (it waits unless it drives) */
    char msg[STOKE__MSG_MAX];
    struct fjob *link; /* the jobs in the order they are served: fetches of workers first */
} fjob;

/* A lane: one chunk's transfer on an easy handle of the multi handle. */
typedef struct flane {
    CURL *h;
    char err[CURL_ERROR_SIZE];
    fjob *j; /* NULL: idle */
    xfer x;
    int running;       /* a try is in the multi handle */
    unsigned attempt;  /* tries made of the chunk, less one */
    uint64_t retry_at; /* stoke__now_ns() before which the next try does not start */
} flane;

typedef struct fetcher {
    CURLM *m;
    flane ln[LANES_MAX];
    int nl;         /* lanes (connections at most) */
    uint64_t chunk; /* a chunk's bytes; UINT64_MAX: whole files (one request each) */
    fjob *jobs;
    int driving; /* a thread runs the transfers */
    uint64_t rng;
} fetcher;

void stoke__remote_fetcher_free(stoke__remote_pool *p, int child)
{
    fetcher *fe = p->fe;
    p->fe = NULL;
    if (child) { /* its handles and connections are the parent's: dropped, not closed */
        pthread_mutex_init(&p->fe_lock, NULL);
        pthread_cond_init(&p->fe_cond, NULL);
        return;
    }
    if (!fe)
        return;
    for (int i = 0; i < fe->nl; i++) {
        if (fe->ln[i].running)
            curl_multi_remove_handle(fe->m, fe->ln[i].h);
        curl_easy_cleanup(fe->ln[i].h);
    }
    curl_multi_cleanup(fe->m);
    free(fe);
}

/* The pool's fetcher, made by the first fetch (fe_lock held): it, or NULL (out of memory). */
static fetcher *fetcher_get(stoke__remote_pool *p)
{
    if (p->fe)
        return p->fe;
    fetcher *fe = calloc(1, sizeof(*fe));
    if (!fe || !(fe->m = curl_multi_init())) {
        free(fe);
        return NULL;
    }
    /* keep the connections between chunks and fetches (the default cap follows the handles) */
    curl_multi_setopt(fe->m, CURLMOPT_MAXCONNECTS, (long)LANES_MAX);
    int k = stoke__remote_pool_connections(p);
    fe->nl = k > LANES_MAX ? LANES_MAX : k;
    if (fe->nl < 2) {
        fe->chunk = UINT64_MAX;
    } else {
        uint64_t c = (p->stream_ahead ? p->stream_ahead : 1) / (2 * (uint64_t)fe->nl);
        fe->chunk = c < CHUNK_MIN ? CHUNK_MIN : c > CHUNK_MAX ? CHUNK_MAX : c;
    }
    for (int i = 0; i < fe->nl; i++) {
        slot tmp = {0};
        fe->ln[i].h = stoke__remote_handle_new(p, &tmp);
        if (!fe->ln[i].h) {
            fe->nl = i;
            break;
        }
        curl_easy_setopt(fe->ln[i].h, CURLOPT_ERRORBUFFER, fe->ln[i].err);
        curl_easy_setopt(fe->ln[i].h, CURLOPT_PRIVATE, (char *)&fe->ln[i]);
    }
    if (fe->nl == 0) {
        curl_multi_cleanup(fe->m);
        free(fe);
        return NULL;
    }
    fe->rng = (stoke__now_ns() ^ (uint64_t)(uintptr_t)fe * 0x9E3779B97F4A7C15u) | 1;
    p->fe = fe;
    return fe;
}

static int job_stopped(const fjob *j)
{
    return j->stop && __atomic_load_n(j->stop, __ATOMIC_RELAXED);
}

static void job_fail(fjob *j, int rc, const char *msg)
{
    if (j->rc)
        return;
    j->rc = rc;
    stoke__shorten(j->msg, sizeof(j->msg), msg);
}

/* Whether j has no lane and no chunk left: its outcome is final. */
static int job_over(const fjob *j)
{
    if (j->nrun)
        return 0;
    return j->rc || job_stopped(j) || (j->known && j->next >= j->total);
}

/* Ends lane l's try in flight, if any: counted as a request, with the bytes it brought. */
static void lane_stop(stoke__remote_pool *p, fetcher *fe, flane *l)
{
    if (!l->running)
        return;
    curl_multi_remove_handle(fe->m, l->h);
    l->running = 0;
    atomic_fetch_add(&p->n->requests, 1);
    atomic_fetch_add(&p->n->bytes, (uint64_t)(l->x.got - l->x.before));
}

static void lane_release(flane *l)
{
    l->j->nrun--;
    l->j = NULL;
}

/* The size j's responses said, from lane l's (a 206's Content-Range). */
static void job_learn(fjob *j, const flane *l)
{
    if (!l->x.has_total || !l->x.has_cr || j->rc)
        return;
    if (!j->known) {
        j->known = 1, j->total = l->x.total;
    } else if (l->x.total != j->total) {
        char msg[STOKE__MSG_MAX];
        stoke__fmt_short(msg, sizeof(msg),
                         "GET %s: the file changed while it was read (%" PRIu64 " bytes, %" PRIu64
                         " before)",
                         j->f->url, l->x.total, j->total);
        job_fail(j, STOKE_EIO, msg);
        return;
    }
    j->ranged = 1;
}

/* A try of lane l that ended with c. */
static void lane_done(stoke__remote_pool *p, fetcher *fe, flane *l, CURLcode c)
{
    fjob *j = l->j;
    curl_multi_remove_handle(fe->m, l->h);
    l->running = 0;
    char msg[STOKE__MSG_MAX] = "";
    int rc = stoke__remote_try_end(p, j->f, &l->x, c, l->err, msg, sizeof(msg));
    if (rc >= 0)
        job_learn(j, l);
    if (rc == 0) {
        j->written += l->x.got;
        if (!j->known && l->x.has_total) { /* a 200: the whole file came; or a 416 */
            j->known = 1;
            j->total = l->x.total;
        } else if (!j->known && l->x.got < l->x.n) { /* no size said: the file ended here */
            j->known = 1;
            j->total = l->x.off + l->x.got;
        }
        if (j->known && (!j->ranged || j->next > j->total)) /* a 200 brought it all */
            j->next = j->total;
        lane_release(l);
    } else if (rc < 0) {
        job_fail(j, rc, msg);
        lane_release(l);
    } else if (l->attempt >= p->retries) { /* as retry_loop's */
        size_t n = strlen(msg);
        stoke__fmt(msg + n, sizeof(msg) - n, " (after %u tries)", l->attempt + 1);
        job_fail(j, STOKE_EIO, msg);
        lane_release(l);
    } else {
        atomic_fetch_add(&p->n->retries_done, 1);
        stoke__log(STOKE_LOG_DEBUG, "remote: %s; retry %u of %u", msg, l->attempt + 1, p->retries);
        l->retry_at = stoke__now_ns() +
                      stoke__remote_backoff_ms(l->attempt, l->x.retry_after, &fe->rng) * 1000000u;
        l->attempt++;
    }
}

/* The next chunk to fetch, of the first job (in order) that has one: 1 with *jo, *off, *n. */
static int next_chunk(fetcher *fe, fjob **jo, uint64_t *off, uint64_t *n)
{
    for (fjob *j = fe->jobs; j; j = j->link) {
        if (j->rc || job_stopped(j) || j->next == UINT64_MAX)
            continue;
        if (j->next == 0) { /* the first chunk: its response says whether ranges are served */
            *n = fe->chunk;
        } else if (j->known && j->ranged) {
            if (j->next >= j->total)
                continue;
            *n = j->total - j->next < fe->chunk ? j->total - j->next : fe->chunk;
        } else if (!j->known && !j->nrun && !j->ranged) {
            *n = fe->chunk; /* 206s without the size: one chunk after the other */
        } else {
            continue;
        }
        *jo = j;
        *off = j->next;
        return 1;
    }
    return 0;
}

/* One round of the transfers (fe_lock held; released while libcurl works): lanes of stopped or
 * failed jobs ended, retries due started, idle lanes given the next chunks, libcurl let work
 * (waiting up to 50 ms, or to the next retry, for a socket), the tries that ended handled. */
static void drive(stoke__remote_pool *p, fetcher *fe)
{
    uint64_t now = stoke__now_ns(), soonest = UINT64_MAX;
    for (int i = 0; i < fe->nl; i++) { /* what the jobs' news changes */
        flane *l = &fe->ln[i];
        if (!l->j)
            continue;
        if (l->running && !l->j->known)
            job_learn(l->j, l); /* the first chunk's header said the size: the others may go */
        if (l->j->rc || job_stopped(l->j)) {
            lane_stop(p, fe, l);
            if (!l->j->rc) {
                char msg[STOKE__MSG_MAX];
                stoke__fmt_short(msg, sizeof(msg), "GET %s: stopped (the dataset is closing)",
                                 l->j->f->url);
                job_fail(l->j, STOKE_EIO, msg);
            }
            lane_release(l);
        }
    }
    for (int i = 0; i < fe->nl; i++) {
        flane *l = &fe->ln[i];
        if (l->running)
            continue;
        if (!l->j) {
            fjob *j;
            uint64_t off, n;
            if (!next_chunk(fe, &j, &off, &n))
                continue;
            l->j = j;
            j->nrun++;
            j->next = n == UINT64_MAX ? UINT64_MAX : off + n;
            l->x = (xfer){.fd = j->fd,
                          .off = off,
                          .n = n == UINT64_MAX ? SIZE_MAX : (size_t)n,
                          .seen = j->seen,
                          .stop = j->stop};
            l->attempt = 0;
            l->retry_at = 0;
        }
        if (now < l->retry_at) {
            soonest = l->retry_at < soonest ? l->retry_at : soonest;
            continue;
        }
        l->err[0] = 0;
        stoke__remote_try_begin(p, l->h, l->j->f, &l->x);
        if (curl_multi_add_handle(fe->m, l->h) != CURLM_OK) {
            char msg[STOKE__MSG_MAX];
            stoke__fmt_short(msg, sizeof(msg), "GET %s: libcurl refused the request",
                             l->j->f->url);
            job_fail(l->j, STOKE_EIO, msg);
            lane_release(l);
            continue;
        }
        l->running = 1;
    }
    pthread_mutex_unlock(&p->fe_lock);
    int still = 0, ms = 50;
    if (soonest != UINT64_MAX && (soonest - now) / 1000000u < 50)
        ms = (int)((soonest - now) / 1000000u) + 1;
    curl_multi_perform(fe->m, &still);
    curl_multi_poll(fe->m, NULL, 0, ms, NULL);
    curl_multi_perform(fe->m, &still);
    pthread_mutex_lock(&p->fe_lock);
    CURLMsg *msg;
    int left = 0;
    while ((msg = curl_multi_info_read(fe->m, &left)) != NULL) {
        char *l = NULL;
        if (msg->msg != CURLMSG_DONE)
            continue;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &l);
        if (l)
            lane_done(p, fe, (flane *)l, msg->data.result);
    }
    int wake = 0; /* the threads of fetches that are over see it */
    for (fjob *j = fe->jobs; j; j = j->link)
        if (!j->told && job_over(j))
            j->told = wake = 1;
    if (wake)
        pthread_cond_broadcast(&p->fe_cond);
}

int stoke__remote_fetch(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f, int fd,
                        uint64_t expect, _Atomic uint64_t *seen, const int *stop, uint64_t *size,
                        char *why, size_t why_len)
{
    *size = 0;
    uint64_t t0 = stoke__now_ns();
    slot *s = stoke__remote_slot_take(p, slot_i, f, why, why_len);
    if (!s)
        return STOKE_ENOMEM;
    fjob j = {.f = f, .fd = fd, .seen = seen, .stop = stop, .fg = slot_i >= 0};
    pthread_mutex_lock(&p->fe_lock);
    fetcher *fe = fetcher_get(p);
    int rc = STOKE_OK;
    if (!fe) {
        stoke__fmt_short(why, why_len, "GET %s: out of memory for its transfers", f->url);
        rc = STOKE_ENOMEM;
    } else { /* a worker's fetch before the background ones (someone waits on it) */
        fjob **at = &fe->jobs;
        while (*at && (slot_i < 0 || (*at)->fg))
            at = &(*at)->link;
        j.link = *at;
        *at = &j;
        while (!job_over(&j)) {
            if (!fe->driving) {
                fe->driving = 1;
                while (!job_over(&j))
                    drive(p, fe);
                fe->driving = 0;
                pthread_cond_broadcast(&p->fe_cond); /* another fetch takes the transfers */
                break;
            }
            pthread_cond_wait(&p->fe_cond, &p->fe_lock);
        }
        for (fjob **q = &fe->jobs; *q; q = &(*q)->link)
            if (*q == &j) {
                *q = j.link;
                break;
            }
        pthread_cond_broadcast(&p->fe_cond); /* the driver's jobs changed; or it was this one */
    }
    pthread_mutex_unlock(&p->fe_lock);
    pthread_mutex_unlock(&s->lock);
    if (slot_i >= 0) /* a background download is no one's wait */
        atomic_fetch_add(&p->n->wait_ns, stoke__now_ns() - t0);
    if (rc)
        return rc;
    if (!j.rc && job_stopped(&j)) {
        j.rc = STOKE_EIO;
        stoke__fmt_short(j.msg, sizeof(j.msg), "GET %s: stopped (the dataset is closing)", f->url);
    }
    if (j.rc) {
        stoke__shorten(why, why_len, j.msg);
        return j.rc;
    }
    if ((expect && j.total != expect) || j.written != j.total) {
        stoke__fmt_short(why, why_len,
                         "GET %s: the file is %" PRIu64 " bytes, %" PRIu64 " came (%" PRIu64
                         " expected)",
                         f->url, j.total, j.written, expect ? expect : j.total);
        return STOKE_EIO;
    }
    *size = j.total;
    return STOKE_OK;
}

#endif /* STOKE_HAVE_LIBCURL */
