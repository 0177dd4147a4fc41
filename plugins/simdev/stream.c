/* simdev — streams, asynchronous copies and events.
 *
 * Each stream owns one thread ("simdev-s<N>") that runs the stream's operations in the order
 * they were queued.  An operation is a copy (host->device or device->host) or an event marker.
 * Before each copy the thread waits STOKE_SIMDEV_COPY_DELAY_US microseconds (a timed wait on the
 * stream's condition variable, so shutdown can cut it short), which makes copies observably
 * asynchronous: copy_*_async only validates its arguments, takes a reference on the device
 * buffer and queues the operation.  The queue is bounded (SIMDEV_QUEUE_MAX operations); a
 * submitter that finds it full waits for room, like a driver whose command buffer is full.
 *
 * Errors.  A copy that fails while it runs (STOKE_SIMDEV_FAIL_COPY) leaves its destination
 * untouched and sets the stream's pending error.  The pending error is delivered exactly once,
 * to the first marker after the failed copy in queue order: the next event recorded on the
 * stream (its query and synchronize then return STOKE_EBACKEND, as often as asked, until it is
 * recorded again) or, when no event follows, the next stream_synchronize.  Later work on the
 * stream runs normally.  The failed copy's message travels with the error (stream `err_msg`,
 * then event `msg`): the call that reports the error logs it as a warning from the caller's
 * thread, so the host can make it part of the caller's error; the stream thread itself only
 * logs it at DEBUG level when the copy fails.
 *
 * Locking.  Stream mutex `mu`: the queue, counts, pending error and stop flag.  Event mutex
 * `mu`: generation, done flag, status, references.  Lock order: a stream's mutex may be held
 * while taking an event's mutex (the stream thread completing a marker), never the reverse.
 * `objs_lock` guards the lists of live streams and events (for shutdown) and is taken alone.
 * Counters (simdev__lock) are updated without any of these held.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "simdev_int.h"

#define SIMDEV_QUEUE_MAX 1024
#define SIMDEV_MSG_MAX   256

typedef enum op_kind { OP_H2D, OP_D2H, OP_EVENT } op_kind;

typedef struct op {
    struct op *next;
    op_kind kind;
    /* copies */
    uint64_t copy_no;   /* 1-based copy number since probe */
    uint64_t delay_us;  /* STOKE_SIMDEV_COPY_DELAY_US when queued */
    int fail;           /* 1: injected failure */
    simdev_dbuf *buf;   /* reference held until the copy ran */
    unsigned char *dev; /* copy engine's view of the device bytes */
    unsigned char *host;
    size_t n;
    /* markers */
    stoke_backend_event *ev; /* reference held until the marker ran */
    uint64_t gen;
} op;

struct stoke_backend_stream {
    int dev;
    unsigned id;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work; /* the thread waits for operations (CLOCK_MONOTONIC, for the delay) */
    pthread_cond_t done; /* synchronize and full-queue submitters wait for progress */
    op *head, *tail;     /* guarded by mu */
    size_t queued;
    uint64_t submitted, completed;
    int err;                      /* first error not yet delivered to a marker */
    char err_msg[SIMDEV_MSG_MAX]; /* its reason */
    int stop; /* 1: finish the queue and exit; 2: cancel the queue and exit (shutdown) */
    struct stoke_backend_stream *prev, *next; /* objs_lock */
};

struct stoke_backend_event {
    int dev;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t gen;             /* number of records; 0: never recorded */
    int done;                 /* the latest record's marker ran */
    int status;               /* its outcome */
    char msg[SIMDEV_MSG_MAX]; /* the reason of a failed status */
    int refs;                 /* the owner's (until event_destroy) + one per queued marker */
    struct stoke_backend_event *prev, *next; /* objs_lock */
};

static pthread_mutex_t objs_lock = PTHREAD_MUTEX_INITIALIZER;
static stoke_backend_stream *streams; /* objs_lock */
static stoke_backend_event *events;   /* objs_lock */
static unsigned next_stream_id;       /* objs_lock */

void simdev__objs_lock_init(void)
{
    pthread_mutex_init(&objs_lock, NULL);
}

/* ---- events ------------------------------------------------------------------------------- */

static void event_free(stoke_backend_event *e)
{
    pthread_mutex_lock(&objs_lock);
    if (e->prev)
        e->prev->next = e->next;
    else
        events = e->next;
    if (e->next)
        e->next->prev = e->prev;
    pthread_mutex_unlock(&objs_lock);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->mu);
    free(e);
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.live_events--;
    pthread_mutex_unlock(&simdev__lock);
}

static void event_unref(stoke_backend_event *e)
{
    pthread_mutex_lock(&e->mu);
    int last = --e->refs == 0;
    pthread_mutex_unlock(&e->mu);
    if (last)
        event_free(e);
}

int simdev__event_create(int dev, stoke_backend_event **out)
{
    if (!out)
        return STOKE_EINVAL;
    *out = NULL;
    int rc = simdev__check_dev(dev, "event_create");
    if (rc != STOKE_OK)
        return rc;
    stoke_backend_event *e = calloc(1, sizeof(*e));
    if (!e)
        return STOKE_ENOMEM;
    e->dev = dev;
    e->refs = 1;
    if (pthread_mutex_init(&e->mu, NULL) != 0) {
        free(e);
        return STOKE_ENOMEM;
    }
    if (pthread_cond_init(&e->cv, NULL) != 0) {
        pthread_mutex_destroy(&e->mu);
        free(e);
        return STOKE_ENOMEM;
    }
    pthread_mutex_lock(&objs_lock);
    e->next = events;
    if (events)
        events->prev = e;
    events = e;
    pthread_mutex_unlock(&objs_lock);
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.live_events++;
    pthread_mutex_unlock(&simdev__lock);
    *out = e;
    return STOKE_OK;
}

int simdev__event_destroy(stoke_backend_event *e)
{
    if (e)
        event_unref(e); /* a marker still queued keeps it alive until it ran */
    return STOKE_OK;
}

/* Logs the reason of a failed status from the caller's thread (see the header comment). */
static void report_failure(int rc, const char *msg)
{
    if (rc != STOKE_OK && rc != STOKE_EBUSY && msg[0])
        simdev__log(STOKE_LOG_WARN, "%s", msg);
}

int simdev__event_query(stoke_backend_event *e)
{
    if (!e)
        return STOKE_EINVAL;
    char msg[SIMDEV_MSG_MAX];
    pthread_mutex_lock(&e->mu);
    int rc = e->gen == 0 || e->done ? e->status : STOKE_EBUSY;
    memcpy(msg, e->msg, sizeof(msg));
    pthread_mutex_unlock(&e->mu);
    report_failure(rc, msg);
    return rc;
}

int simdev__event_synchronize(stoke_backend_event *e)
{
    if (!e)
        return STOKE_EINVAL;
    pthread_mutex_lock(&e->mu);
    while (e->gen != 0 && !e->done)
        pthread_cond_wait(&e->cv, &e->mu);
    int rc = e->status;
    char msg[SIMDEV_MSG_MAX];
    memcpy(msg, e->msg, sizeof(msg));
    pthread_mutex_unlock(&e->mu);
    report_failure(rc, msg);
    return rc;
}

/* ---- the stream thread ------------------------------------------------------------------- */

static void deadline_after(struct timespec *ts, uint64_t us)
{
    clock_gettime(CLOCK_MONOTONIC, ts);
    ts->tv_sec += (time_t)(us / 1000000);
    ts->tv_nsec += (long)(us % 1000000) * 1000;
    if (ts->tv_nsec >= 1000000000L) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000L;
    }
}

/* Runs one copy (called without s->mu).  Returns its status; a failure's reason goes to
 * msg[SIMDEV_MSG_MAX]. */
static int run_copy(stoke_backend_stream *s, op *o, int canceled, char *msg)
{
    int rc = STOKE_OK;
    if (canceled) {
        rc = STOKE_ECANCELED;
    } else if (o->fail) {
        rc = STOKE_EBACKEND;
        snprintf(msg, SIMDEV_MSG_MAX,
                 "injected copy failure: copy #%llu (%s, %zu bytes) on stream simdev-s%u "
                 "failed (STOKE_SIMDEV_FAIL_COPY=%llu)",
                 (unsigned long long)o->copy_no, o->kind == OP_H2D ? "h2d" : "d2h", o->n, s->id,
                 (unsigned long long)o->copy_no);
        simdev__log(STOKE_LOG_DEBUG, "%s", msg);
    } else if (o->kind == OP_H2D) {
        memcpy(o->dev, o->host, o->n);
    } else {
        memcpy(o->host, o->dev, o->n);
    }
    simdev__dbuf_release(o->buf);
    pthread_mutex_lock(&simdev__lock);
    if (rc == STOKE_OK)
        simdev__ctr.copies_completed++;
    else
        simdev__ctr.copies_failed++;
    pthread_mutex_unlock(&simdev__lock);
    return rc;
}

static void *stream_main(void *arg)
{
    stoke_backend_stream *s = arg;
    char name[16];
    snprintf(name, sizeof(name), "simdev-s%u", s->id % 100000u);
    pthread_setname_np(pthread_self(), name);

    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->work, &s->mu);
        op *o = s->head;
        if (!o)
            break; /* stopping and drained */
        if (o->kind != OP_EVENT && o->delay_us && s->stop != 2) {
            /* The simulated transfer time.  A timed wait, not a sleep: shutdown cuts it short. */
            struct timespec until;
            deadline_after(&until, o->delay_us);
            while (s->stop != 2 && pthread_cond_timedwait(&s->work, &s->mu, &until) != ETIMEDOUT)
                ;
        }
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        s->queued--;
        int canceled = s->stop == 2;

        if (o->kind == OP_EVENT) {
            stoke_backend_event *e = o->ev;
            pthread_mutex_lock(&e->mu);
            if (e->gen == o->gen) { /* not re-recorded since: this marker is the live one */
                e->status = canceled ? STOKE_ECANCELED : s->err;
                if (canceled)
                    snprintf(e->msg, sizeof(e->msg), "event canceled: the stream was shut down");
                else
                    memcpy(e->msg, s->err_msg, sizeof(e->msg));
                s->err = STOKE_OK; /* delivered */
                s->err_msg[0] = '\0';
                e->done = 1;
                pthread_cond_broadcast(&e->cv);
            }
            pthread_mutex_unlock(&e->mu);
            s->completed++;
            pthread_cond_broadcast(&s->done);
            pthread_mutex_unlock(&s->mu);
            event_unref(e);
        } else {
            pthread_mutex_unlock(&s->mu);
            char msg[SIMDEV_MSG_MAX] = "";
            int rc = run_copy(s, o, canceled, msg);
            pthread_mutex_lock(&s->mu);
            if (rc != STOKE_OK && rc != STOKE_ECANCELED && s->err == STOKE_OK) {
                s->err = rc;
                memcpy(s->err_msg, msg, sizeof(s->err_msg));
            }
            s->completed++;
            pthread_cond_broadcast(&s->done);
            pthread_mutex_unlock(&s->mu);
        }
        free(o);
        pthread_mutex_lock(&s->mu);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- streams ------------------------------------------------------------------------------ */

int simdev__stream_create(int dev, stoke_backend_stream **out)
{
    if (!out)
        return STOKE_EINVAL;
    *out = NULL;
    int rc = simdev__check_dev(dev, "stream_create");
    if (rc != STOKE_OK)
        return rc;
    stoke_backend_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return STOKE_ENOMEM;
    s->dev = dev;
    pthread_condattr_t ca;
    int ok_mu = 0, ok_work = 0, ok_done = 0, err;
    if (pthread_condattr_init(&ca) != 0)
        goto fail;
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    ok_work = pthread_cond_init(&s->work, &ca) == 0;
    pthread_condattr_destroy(&ca);
    ok_mu = pthread_mutex_init(&s->mu, NULL) == 0;
    ok_done = pthread_cond_init(&s->done, NULL) == 0;
    if (!ok_mu || !ok_work || !ok_done)
        goto fail;

    pthread_mutex_lock(&objs_lock);
    s->id = next_stream_id++;
    pthread_mutex_unlock(&objs_lock);
    err = pthread_create(&s->thread, NULL, stream_main, s);
    if (err != 0) {
        simdev__log(STOKE_LOG_WARN, "stream_create: pthread_create failed: %s", strerror(err));
        goto fail;
    }
    pthread_mutex_lock(&objs_lock);
    s->next = streams;
    if (streams)
        streams->prev = s;
    streams = s;
    pthread_mutex_unlock(&objs_lock);
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.live_streams++;
    pthread_mutex_unlock(&simdev__lock);
    *out = s;
    return STOKE_OK;

fail:
    if (ok_work)
        pthread_cond_destroy(&s->work);
    if (ok_done)
        pthread_cond_destroy(&s->done);
    if (ok_mu)
        pthread_mutex_destroy(&s->mu);
    free(s);
    return STOKE_ENOMEM;
}

/* Stops the thread (`how`: 1 finish the queue, 2 cancel it), joins it and frees the stream.
 * The stream must already be off the list. */
static void stream_stop(stoke_backend_stream *s, int how)
{
    pthread_mutex_lock(&s->mu);
    s->stop = how;
    pthread_cond_broadcast(&s->work);
    pthread_cond_broadcast(&s->done);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->work);
    pthread_cond_destroy(&s->done);
    pthread_mutex_destroy(&s->mu);
    free(s);
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.live_streams--;
    pthread_mutex_unlock(&simdev__lock);
}

int simdev__stream_destroy(stoke_backend_stream *s)
{
    if (!s)
        return STOKE_OK;
    pthread_mutex_lock(&objs_lock);
    if (s->prev)
        s->prev->next = s->next;
    else
        streams = s->next;
    if (s->next)
        s->next->prev = s->prev;
    pthread_mutex_unlock(&objs_lock);
    stream_stop(s, 1); /* runs what is still queued, then joins */
    return STOKE_OK;
}

int simdev__stream_synchronize(stoke_backend_stream *s)
{
    if (!s)
        return STOKE_EINVAL;
    pthread_mutex_lock(&s->mu);
    uint64_t target = s->submitted;
    while (s->completed < target)
        pthread_cond_wait(&s->done, &s->mu);
    int rc = s->err;
    char msg[SIMDEV_MSG_MAX];
    memcpy(msg, s->err_msg, sizeof(msg));
    s->err = STOKE_OK; /* delivered */
    s->err_msg[0] = '\0';
    pthread_mutex_unlock(&s->mu);
    report_failure(rc, msg);
    return rc;
}

/* Appends o to s's queue, waiting while the queue is full. */
static void enqueue(stoke_backend_stream *s, op *o)
{
    pthread_mutex_lock(&s->mu);
    while (s->queued >= SIMDEV_QUEUE_MAX && !s->stop)
        pthread_cond_wait(&s->done, &s->mu);
    o->next = NULL;
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    s->queued++;
    s->submitted++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

static int queue_copy(op_kind kind, void *handle, size_t off, void *host, size_t n,
                      stoke_backend_stream *s)
{
    if (!s || (!host && n))
        return STOKE_EINVAL;
    simdev_dbuf *buf;
    unsigned char *dev;
    int rc = simdev__dbuf_acquire(handle, s->dev, off, n, &buf, &dev);
    if (rc != STOKE_OK)
        return rc;
    if (n == 0) { /* nothing to move; the handle and offset were valid */
        simdev__dbuf_release(buf);
        return STOKE_OK;
    }
    op *o = calloc(1, sizeof(*o));
    if (!o) {
        simdev__dbuf_release(buf);
        return STOKE_ENOMEM;
    }
    o->kind = kind;
    o->buf = buf;
    o->dev = dev;
    o->host = host;
    o->n = n;
    int pinned = simdev__range_pinned(host, n);

    pthread_mutex_lock(&simdev__lock);
    o->copy_no = ++simdev__copy_seq;
    o->fail = simdev__cfg.fail_copy != 0 && o->copy_no == simdev__cfg.fail_copy;
    o->delay_us = simdev__cfg.copy_delay_us;
    if (kind == OP_H2D) {
        simdev__ctr.h2d_copies++;
        simdev__ctr.h2d_bytes += n;
        if (pinned)
            simdev__ctr.h2d_pinned++;
        else
            simdev__ctr.h2d_pageable++;
    } else {
        simdev__ctr.d2h_copies++;
        simdev__ctr.d2h_bytes += n;
        if (pinned)
            simdev__ctr.d2h_pinned++;
        else
            simdev__ctr.d2h_pageable++;
    }
    pthread_mutex_unlock(&simdev__lock);
    enqueue(s, o);
    return STOKE_OK;
}

int simdev__copy_h2d_async(void *dst, size_t dst_offset, const void *src, size_t n,
                           stoke_backend_stream *s)
{
    /* The stream thread only reads through `host` for h2d: the cast drops const for storage. */
    return queue_copy(OP_H2D, dst, dst_offset, (void *)(uintptr_t)src, n, s);
}

int simdev__copy_d2h_async(void *dst, const void *src, size_t src_offset, size_t n,
                           stoke_backend_stream *s)
{
    return queue_copy(OP_D2H, (void *)(uintptr_t)src, src_offset, dst, n, s);
}

int simdev__event_record(stoke_backend_event *e, stoke_backend_stream *s)
{
    if (!e || !s)
        return STOKE_EINVAL;
    if (e->dev != s->dev) {
        simdev__log(STOKE_LOG_WARN, "event_record: event of device %d on a stream of device %d",
                    e->dev, s->dev);
        return STOKE_EINVAL;
    }
    op *o = calloc(1, sizeof(*o));
    if (!o)
        return STOKE_ENOMEM;
    pthread_mutex_lock(&e->mu);
    o->kind = OP_EVENT;
    o->ev = e;
    o->gen = ++e->gen;
    e->done = 0;
    e->status = STOKE_OK;
    e->msg[0] = '\0';
    e->refs++;
    pthread_mutex_unlock(&e->mu);
    enqueue(s, o);
    return STOKE_OK;
}

/* ---- shutdown ----------------------------------------------------------------------------- */

void simdev__streams_shutdown(void)
{
    pthread_mutex_lock(&objs_lock);
    stoke_backend_stream *s = streams;
    streams = NULL;
    pthread_mutex_unlock(&objs_lock);
    while (s) {
        stoke_backend_stream *next = s->next;
        stream_stop(s, 2); /* cancels what is queued: markers complete with STOKE_ECANCELED */
        s = next;
    }
    /* Every marker ran, so only owners' references remain: free the events nobody destroyed. */
    pthread_mutex_lock(&objs_lock);
    stoke_backend_event *e = events;
    events = NULL;
    next_stream_id = 0;
    pthread_mutex_unlock(&objs_lock);
    while (e) {
        stoke_backend_event *next = e->next;
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        free(e);
        e = next;
    }
}
