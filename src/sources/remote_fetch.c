/* Whole-file fetches (remote.h, stoke__remote_fetch): a file downloaded into an fd as chunks,
 * range requests of STOKE_STREAM_AHEAD / (2 x STOKE_REMOTE_CONNECTIONS) bytes (as a stream's),
 * written at their offsets (pwrite).  The chunks of every fetch of a pool in progress (the
 * cache's reader and its background downloaders, each waiting in its own thread) are served by
 * one set of STOKE_REMOTE_CONNECTIONS lanes: threads of the pool, each with a libcurl handle
 * (and so a connection, kept from chunk to chunk whichever fetch it serves).  So the pool's
 * connections for fetches stay that many, and they stay busy while any fetch has a chunk left,
 * the last shard's tail included.  Fetches are served in the order they came, a worker's (one
 * waits on it) before the background ones.  A try that fails in a way that can pass is retried
 * with the backoff of a read, from the chunk's first missing byte (remote.c's tries).  With 0
 * or 1 connections a file is one request (Range: bytes=0-).  The first lane takes the handle of
 * the slot whose fetch made the lanes (the open's: its connection, which asked for the sidecar
 * indexes, carries chunks from then on), and the process's reads after it (stoke__remote_read:
 * the open's index asks) run on the lanes too (with 2 connections or more: chunks), first
 * served, each whole on one lane: the process's connections are the lanes' and no more.  When no
 * lane's thread can start, a fetch is made in the thread that asked (fetch_here).
 *
 * Locking: p->fe_lock guards the fetcher and its jobs; p->fe_cond is signalled when a job may
 * be over (its thread looks), fetcher.work when a chunk may be ready (a lane looks).  A lane
 * runs its chunk without the lock.  A fetch (and a read on the lanes) holds its slot's lock
 * throughout (stoke__remote_slot_take): the pool's fork hook, which takes every slot and then
 * fe_lock, so finds no fetch or read running and the lanes idle; the child has no lane (no thread
 * crossed the fork) and drops the fetcher. */
#define _GNU_SOURCE
#include "sources/remote.h"

#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

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
    _Atomic uint64_t said; /* the size a 206 taken said (raised by the lane's on_body) */
    uint64_t total;        /* the file's size, when known */
    int known;
    int ranged;       /* a 206 said the size: the chunks after the first may go */
    uint64_t next;    /* the first byte no lane was given (UINT64_MAX: the whole file was) */
    uint64_t written; /* bytes of the chunks that ended */
    int nrun;         /* lanes on this job */
    int fg;           /* a worker's (someone waits on it): served before the background's */
    xfer *rd;         /* a read (stoke__remote_lanes_read): this one transfer on one lane */
    uint64_t most;    /* the file's bytes past this are not taken (xfer.most), and why */
    const char *most_why;
    int rc; /* its error (the first), with msg */
    char msg[STOKE__MSG_MAX];
    struct fjob *link; /* the jobs in the order they are served */
    /* an unpinned file's validator, which its chunks must all repeat (job_tag) */
    stoke__remote_tag tag;
} fjob;

typedef struct fetcher fetcher;

/* A lane: a thread of the pool with its handle (in s). */
typedef struct flane {
    stoke__remote_pool *p;
    fetcher *fe;
    slot s;
    pthread_t th;
} flane;

struct fetcher {
    flane ln[LANES_MAX];
    int nl;         /* lanes running (connections at most) */
    uint64_t chunk; /* a chunk's bytes; UINT64_MAX: whole files (one request each) */
    fjob *jobs;
    pthread_cond_t work; /* a chunk may be ready, or quit */
    int quit;
    pid_t pid; /* the process the lanes run in */
};

static int job_stopped(const fjob *j)
{
    return j->stop && __atomic_load_n(j->stop, __ATOMIC_RELAXED);
}

static void job_fail(fjob *j, int rc, const char *msg)
{
    if (j->rc || !rc)
        return;
    j->rc = rc;
    stoke__shorten(j->msg, sizeof(j->msg), msg);
}

/* Whether j has no lane and no chunk left: its outcome is final. */
static int job_over(const fjob *j)
{
    if (j->nrun)
        return 0;
    if (j->rd) /* taken (next = UINT64_MAX) and ended */
        return j->next == UINT64_MAX;
    return j->rc || job_stopped(j) || (j->known && j->next >= j->total);
}

/* The size f's 206 responses said, from a chunk that ended (x) or a header (j->said). */
static void job_learn(fjob *j, uint64_t total)
{
    if (j->rc)
        return;
    if (!j->known) {
        j->known = 1, j->total = total;
    } else if (total != j->total) {
        char msg[STOKE__MSG_MAX];
        stoke__fmt_short(msg, sizeof(msg),
                         "GET %s: the file changed while it was read (%" PRIu64 " bytes, %" PRIu64
                         " before)",
                         j->f->url, total, j->total);
        job_fail(j, STOKE_EIO, msg);
        return;
    }
    j->ranged = 1;
}

/* The validator j's chunks are checked against: the file's when it is pinned (the version of
 * its open), else the fetch's own (the first chunk's answer's). */
static stoke__remote_tag *job_tag(fjob *j)
{
    return j->f->tag ? j->f->tag : &j->tag;
}

/* The next chunk to fetch, of the first job (in order) that has one: 1 with *jo, *off, *n. */
static int next_chunk(fetcher *fe, fjob **jo, uint64_t *off, uint64_t *n)
{
    for (fjob *j = fe->jobs; j; j = j->link) {
        if (j->rc || job_stopped(j) || j->next == UINT64_MAX)
            continue;
        if (j->rd) { /* a read: whole, at once */
            *jo = j;
            *off = j->rd->off;
            *n = UINT64_MAX;
            return 1;
        }
        uint64_t said = atomic_load(&j->said);
        if (!j->known && said)
            job_learn(j, said);
        /* every byte given: tested before next == 0, which a file of 0 bytes keeps (its
         * first chunk would be given again, forever) */
        if (j->known && j->next >= j->total)
            continue;
        if (j->next == 0) { /* the first chunk: its response says whether ranges are served */
            *n = fe->chunk;
        } else if (j->known && j->ranged) {
            *n = j->total - j->next < fe->chunk ? j->total - j->next : fe->chunk;
        } else if (!j->known && !j->nrun) {
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

/* A chunk of j that ended (fe_lock held): rc and msg its tries' outcome, x its transfer. */
static void chunk_done(fjob *j, const xfer *x, int rc, const char *msg)
{
    if (rc) {
        job_fail(j, rc, msg);
        return;
    }
    /* every answer that says the file's size says the one the first did: a 200 (the whole
     * file, by its Content-Length) to a chunk's range request, or a 416, of another size is
     * another version, and the bytes it gave at the chunk's offset are not the file's */
    if (x->has_total && (x->has_cr || j->known))
        job_learn(j, x->total);
    if (!j->rc && x->status == 200 && x->off > 0 && !x->has_total) {
        char m[STOKE__MSG_MAX]; /* (stopped at the chunk's end, without a Content-Length) */
        stoke__fmt_short(m, sizeof(m),
                         "GET %s: HTTP 200 (the whole file) to a range request from byte %" PRIu64
                         ", without its size: which version of the file it is cannot be told",
                         j->f->url, x->off);
        job_fail(j, STOKE_EIO, m);
    }
    if (j->rc)
        return;
    j->written += x->got;
    if (!j->known && x->has_total) { /* a 200: the whole file came; or a 416 */
        j->known = 1;
        j->total = x->total;
    } else if (!j->known && x->got < x->n) { /* no size said: the file ended here */
        j->known = 1;
        j->total = x->off + x->got;
    }
    if (j->known && (!j->ranged || j->next > j->total)) /* a 200 brought it all */
        j->next = j->total;
}

/* A first chunk's answer said its file's size (xfer.said, in the lane that runs it, without
 * fe_lock): the lanes waiting for its next chunks look again. */
static void lane_said(void *ctx)
{
    flane *l = ctx;
    pthread_mutex_lock(&l->p->fe_lock);
    pthread_cond_broadcast(&l->fe->work);
    pthread_mutex_unlock(&l->p->fe_lock);
}

static void *lane_main(void *arg)
{
    flane *l = arg;
    stoke__remote_pool *p = l->p;
    fetcher *fe = l->fe;
    char name[16];
    snprintf(name, sizeof(name), "stoke-fetch%d", (int)(l - fe->ln));
    pthread_setname_np(pthread_self(), name);
    pthread_mutex_lock(&p->fe_lock);
    while (!fe->quit) {
        fjob *j;
        uint64_t off, n;
        if (!next_chunk(fe, &j, &off, &n)) {
            pthread_cond_wait(&fe->work, &p->fe_lock); /* a chunk's end, or a size said */
            continue;
        }
        j->nrun++;
        j->next = n == UINT64_MAX ? UINT64_MAX : off + n;
        xfer x = {.fd = j->fd,
                  .off = off,
                  .n = n == UINT64_MAX ? SIZE_MAX : (size_t)n,
                  .seen = j->seen,
                  .seen2 = &j->said,
                  .said = lane_said,
                  .said_ctx = l,
                  .stop = j->stop,
                  .tag = job_tag(j),
                  .most = j->most,
                  .most_why = j->most_why};
        pthread_mutex_unlock(&p->fe_lock);
        char msg[STOKE__MSG_MAX] = "";
        int rc = stoke__remote_tries(p, &l->s, j->f, j->rd ? j->rd : &x, msg, sizeof(msg));
        pthread_mutex_lock(&p->fe_lock);
        if (j->rd)
            job_fail(j, rc, msg); /* nothing when rc is 0 */
        else
            chunk_done(j, &x, rc, msg);
        j->nrun--;
        if (job_over(j))
            pthread_cond_broadcast(&p->fe_cond);
        pthread_cond_broadcast(&fe->work); /* its size, or the end of a chunk, may free others */
    }
    pthread_mutex_unlock(&p->fe_lock);
    return NULL;
}

void stoke__remote_fetcher_free(stoke__remote_pool *p, int child)
{
    fetcher *fe = p->fe;
    p->fe = NULL;
    if (child) { /* its lanes are not here, its handles' connections are the parent's */
        pthread_mutex_init(&p->fe_lock, NULL);
        pthread_cond_init(&p->fe_cond, NULL);
        return;
    }
    if (!fe)
        return;
    if (fe->pid != getpid()) /* a fork the hooks did not see: the lanes are not here */
        return;
    pthread_mutex_lock(&p->fe_lock);
    fe->quit = 1;
    pthread_cond_broadcast(&fe->work);
    pthread_mutex_unlock(&p->fe_lock);
    for (int i = 0; i < fe->nl; i++) {
        pthread_join(fe->ln[i].th, NULL);
        curl_easy_cleanup(fe->ln[i].s.h);
    }
    pthread_cond_destroy(&fe->work);
    free(fe);
}

/* The pool's fetcher, made by the first fetch (fe_lock held), through slot s (locked): it, or
 * NULL with *err 0 (out of memory) or pthread_create's error (no lane's thread could start).
 * Its first lane takes s's handle, and with it the connection of s's reads before (the open's):
 * the process opens no more connections than lanes for its fetches and the reads after them
 * (stoke__remote_lanes_read). */
static fetcher *fetcher_get(stoke__remote_pool *p, slot *s, int *err)
{
    *err = 0;
    if (p->fe && p->fe->pid == getpid())
        return p->fe;
    p->fe = NULL; /* a fork the hooks did not see: the parent's, left alone */
    fetcher *fe = calloc(1, sizeof(*fe));
    if (!fe)
        return NULL;
    pthread_cond_init(&fe->work, NULL);
    fe->pid = getpid();
    int k = stoke__remote_pool_connections(p);
    k = k > LANES_MAX ? LANES_MAX : k;
    if (k < 2) {
        fe->chunk = UINT64_MAX;
    } else {
        uint64_t c = (p->stream_ahead ? p->stream_ahead : 1) / (2 * (uint64_t)k);
        fe->chunk = c < CHUNK_MIN ? CHUNK_MIN : c > CHUNK_MAX ? CHUNK_MAX : c;
    }
    for (int i = 0; i < k; i++) {
        flane *l = &fe->ln[i];
        l->p = p;
        l->fe = fe;
        if (i == 0 && s->h) {
            l->s.h = s->h;
            curl_easy_setopt(l->s.h, CURLOPT_ERRORBUFFER, l->s.err);
        } else if (!(l->s.h = stoke__remote_handle_new(p, &l->s))) {
            break;
        }
        int e = pthread_create(&l->th, NULL, lane_main, l);
        if (e != 0) {
            *err = e;
            if (l->s.h != s->h)
                curl_easy_cleanup(l->s.h);
            else /* the slot keeps its handle: its errors go to its own buffer, not into fe */
                curl_easy_setopt(s->h, CURLOPT_ERRORBUFFER, s->err);
            break;
        }
        if (l->s.h == s->h)
            s->h = NULL; /* the slot's next handle is made by its next take */
        fe->nl++;
    }
    if (fe->nl == 0) {
        pthread_cond_destroy(&fe->work);
        free(fe);
        return NULL;
    }
    p->fe = fe;
    return fe;
}

/* No lane's thread could start (pthread_create's error err: a limit on a process's threads, a
 * container's pids.max): the fetch of j made in the thread that asked, as a lane with one
 * connection makes it (one request for the whole file, a read's retries) but on its slot s
 * (locked); said once a pool.  j is not in the fetcher's jobs: chunk_done needs no fe_lock for
 * it.  A fetch that finds lanes again later uses them. */
static void fetch_here(stoke__remote_pool *p, slot *s, fjob *j, int err)
{
    if (!atomic_exchange(&p->fe_alone, 1))
        stoke__log(STOKE_LOG_WARN,
                   "remote: no thread could start for the downloads' connections (%s): %s, and "
                   "each download after it, is made whole in the thread that wants it",
                   strerror(err), j->f->url);
    xfer x = {.fd = j->fd,
              .n = SIZE_MAX,
              .seen = j->seen,
              .stop = j->stop,
              .tag = job_tag(j),
              .most = j->most,
              .most_why = j->most_why};
    char msg[STOKE__MSG_MAX] = "";
    int rc = stoke__remote_tries(p, s, j->f, &x, msg, sizeof(msg));
    chunk_done(j, &x, rc, msg);
}

/* The most bytes a fetch into fd may write when neither its size nor a cap is known: what its
 * file system has free when it starts, less a hundredth of the file system, so that an answer
 * that never ends (a 200 without a length) cannot fill the disk; all of the free space when
 * less than that hundredth is.  Not a tenth (the cache's default cap's floor): a cache at its
 * cap has a tenth free, and a download goes into that slack before the eviction after it.  0
 * (no bound) where the size is not known (statvfs fails; a tmpfs without a size says 0
 * blocks). */
static uint64_t fs_room(int fd)
{
    struct statvfs v;
    if (fstatvfs(fd, &v) != 0 || v.f_blocks == 0)
        return 0;
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, fs = (uint64_t)v.f_blocks * v.f_frsize;
    return avail > fs / 100 ? avail - fs / 100 : avail ? avail : 1;
}

int stoke__remote_fetch(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f, int fd,
                        uint64_t expect, uint64_t most, const char *most_why,
                        _Atomic uint64_t *seen, const int *stop, uint64_t *size, char *why,
                        size_t why_len)
{
    *size = 0;
    uint64_t t0 = stoke__now_ns();
    slot *s = stoke__remote_slot_take(p, slot_i, f, why, why_len);
    if (!s)
        return STOKE_ENOMEM;
    fjob j = {.f = f, .fd = fd, .seen = seen, .stop = stop, .fg = slot_i >= 0, .tag.pass = 1};
    if (expect) {
        j.most = expect;
        j.most_why = "the size its index says";
    } else if (most) {
        j.most = most;
        j.most_why = most_why;
    } else {
        j.most = fs_room(fd);
        j.most_why = "the free space of its file system, less a hundredth of it";
    }
    pthread_mutex_lock(&p->fe_lock);
    int no_fe;
    fetcher *fe = fetcher_get(p, s, &no_fe);
    int rc = STOKE_OK;
    if (!fe && !no_fe) {
        stoke__fmt_short(why, why_len, "GET %s: out of memory for its transfers", f->url);
        rc = STOKE_ENOMEM;
    } else if (!fe) {
        pthread_mutex_unlock(&p->fe_lock); /* (a transfer: other fetches go on meanwhile) */
        fetch_here(p, s, &j, no_fe);
        pthread_mutex_lock(&p->fe_lock);
    } else {
        fjob **at = &fe->jobs;
        while (*at && (slot_i < 0 || (*at)->fg))
            at = &(*at)->link;
        j.link = *at;
        *at = &j;
        pthread_cond_broadcast(&fe->work);
        while (!job_over(&j)) {
            if (!stop) {
                pthread_cond_wait(&p->fe_cond, &p->fe_lock);
                continue;
            }
            struct timespec ts; /* a stop is set without a signal: seen within 50 ms */
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50000000;
            if (ts.tv_nsec >= 1000000000)
                ts.tv_sec++, ts.tv_nsec -= 1000000000;
            pthread_cond_timedwait(&p->fe_cond, &p->fe_lock, &ts);
        }
        for (fjob **q = &fe->jobs; *q; q = &(*q)->link)
            if (*q == &j) {
                *q = j.link;
                break;
            }
    }
    pthread_mutex_unlock(&p->fe_lock);
    pthread_mutex_unlock(&s->lock);
    /* no lane runs a chunk of j any more */
    free(atomic_load(&j.tag.v));
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

int stoke__remote_lanes_read(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f,
                             xfer *x, int *rc, char *why, size_t why_len)
{
    pthread_mutex_lock(&p->fe_lock);
    /* with one connection a lane's request is a whole file: a read would wait for it */
    int lanes = p->fe && p->fe->pid == getpid() && p->fe->chunk != UINT64_MAX;
    pthread_mutex_unlock(&p->fe_lock);
    if (!lanes)
        return 0;
    slot *s = stoke__remote_slot_take(p, slot_i, f, why, why_len); /* as a fetch: the fork hook */
    if (!s) {
        *rc = STOKE_ENOMEM;
        return 1;
    }
    fjob j = {.f = f, .fd = -1, .rd = x, .fg = 1};
    pthread_mutex_lock(&p->fe_lock);
    fetcher *fe = p->fe; /* still there: only destroy and a fork's child drop it */
    j.link = fe->jobs;   /* the first served: a read is short, and someone waits on it */
    fe->jobs = &j;
    pthread_cond_broadcast(&fe->work);
    while (!job_over(&j))
        pthread_cond_wait(&p->fe_cond, &p->fe_lock);
    for (fjob **q = &fe->jobs; *q; q = &(*q)->link)
        if (*q == &j) {
            *q = j.link;
            break;
        }
    pthread_mutex_unlock(&p->fe_lock);
    pthread_mutex_unlock(&s->lock);
    *rc = j.rc;
    if (j.rc)
        stoke__shorten(why, why_len, j.msg);
    return 1;
}

#endif /* STOKE_HAVE_LIBCURL */
