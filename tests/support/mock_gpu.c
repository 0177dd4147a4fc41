/* The mock GPU shared by the cuda and hip mocks: see mock_gpu.h. */
#define _GNU_SOURCE
#include "mock_gpu.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_BLOCKS 256
#define MAX_PINS   256

enum { OP_COPY, OP_MARK };

/* A queued operation: a copy, or the mark an event record leaves in the stream. */
typedef struct op {
    int kind;
    void *dst;
    const void *src;
    size_t n;
    mg_event *ev;      /* OP_MARK */
    unsigned long gen; /* OP_MARK: which record of ev this is */
    struct op *next;
} op;

struct mg_stream {
    op *head, *tail; /* head runs first (and is the one running, if any) */
    mg_stream *next; /* in G.streams */
};

struct mg_event {
    unsigned long gen;      /* records so far */
    unsigned long done_gen; /* the latest record that has run */
    int pending;            /* marks still queued */
};

/* Locking: G.mu protects everything here, the queues included; the engine thread drops it
 * only to sleep and copy (the op it runs stays at the head of its queue until done). */
static struct {
    pthread_mutex_t mu;
    pthread_cond_t work; /* engine: something was queued, or the hold was lifted */
    pthread_cond_t done; /* waiters: an op completed */
    pthread_t thread;
    int started, stop, held;
    unsigned delay_us;
    mg_stream *streams; /* served in turn: a stream served moves to the back */
    unsigned long copies;
    int hazards;
    struct {
        char *base;
        size_t size;
        int dev;
    } blocks[MAX_BLOCKS];
    struct {
        uintptr_t base;
        size_t size;
        int kind;
    } pins[MAX_PINS];
} G = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .work = PTHREAD_COND_INITIALIZER,
       .done = PTHREAD_COND_INITIALIZER};

static int overlap(uintptr_t a, size_t an, uintptr_t b, size_t bn)
{
    return a < b + bn && b < a + an;
}

/* ---- the engine --------------------------------------------------------------------------- */

/* (mu) The first stream with work, moved to the back of the list. */
static mg_stream *next_ready(void)
{
    mg_stream **pp = &G.streams;
    while (*pp && !(*pp)->head)
        pp = &(*pp)->next;
    mg_stream *s = *pp;
    if (!s || !s->next)
        return s;
    *pp = s->next;
    mg_stream **tail = pp;
    while (*tail)
        tail = &(*tail)->next;
    *tail = s;
    s->next = NULL;
    return s;
}

static void *engine(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&G.mu);
    for (;;) {
        mg_stream *s = NULL;
        while (!G.stop && (G.held || !(s = next_ready())))
            pthread_cond_wait(&G.work, &G.mu);
        if (G.stop)
            break;
        op *o = s->head;
        unsigned delay = G.delay_us;
        pthread_mutex_unlock(&G.mu);
        if (o->kind == OP_COPY) {
            if (delay)
                usleep(delay);
            memcpy(o->dst, o->src, o->n);
        }
        pthread_mutex_lock(&G.mu);
        s->head = o->next;
        if (!s->head)
            s->tail = NULL;
        if (o->kind == OP_COPY) {
            G.copies++;
        } else {
            if (o->gen > o->ev->done_gen)
                o->ev->done_gen = o->gen;
            o->ev->pending--;
        }
        free(o);
        pthread_cond_broadcast(&G.done);
    }
    pthread_mutex_unlock(&G.mu);
    return NULL;
}

static void engine_stop(void)
{
    pthread_mutex_lock(&G.mu);
    G.stop = 1;
    pthread_cond_broadcast(&G.work);
    pthread_mutex_unlock(&G.mu);
    pthread_join(G.thread, NULL);
}

/* (mu) Appends o to s, starting the engine on first use. */
static int enqueue(mg_stream *s, op *o)
{
    if (!G.started) {
        if (pthread_create(&G.thread, NULL, engine, NULL) != 0)
            return -1;
        G.started = 1;
        atexit(engine_stop);
    }
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    pthread_cond_broadcast(&G.work);
    return 0;
}

/* (mu) 1 if a queued copy reads or writes [p, p+n). */
static int in_use(uintptr_t p, size_t n)
{
    for (mg_stream *s = G.streams; s; s = s->next)
        for (op *o = s->head; o; o = o->next)
            if (o->kind == OP_COPY &&
                (overlap((uintptr_t)o->dst, o->n, p, n) || overlap((uintptr_t)o->src, o->n, p, n)))
                return 1;
    return 0;
}

/* (mu) Waits until no queued copy uses [p, p+n), counting a hazard if one did. */
static void quiesce(uintptr_t p, size_t n)
{
    if (in_use(p, n))
        G.hazards++;
    while (in_use(p, n))
        pthread_cond_wait(&G.done, &G.mu);
}

void mg_set_delay_us(unsigned us)
{
    pthread_mutex_lock(&G.mu);
    G.delay_us = us;
    pthread_mutex_unlock(&G.mu);
}

void mg_hold(int on)
{
    pthread_mutex_lock(&G.mu);
    G.held = on;
    pthread_cond_broadcast(&G.work);
    pthread_mutex_unlock(&G.mu);
}

mg_stream *mg_stream_create(void)
{
    mg_stream *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    pthread_mutex_lock(&G.mu);
    s->next = G.streams;
    G.streams = s;
    pthread_mutex_unlock(&G.mu);
    return s;
}

void mg_stream_destroy(mg_stream *s)
{
    pthread_mutex_lock(&G.mu);
    while (s->head)
        pthread_cond_wait(&G.done, &G.mu);
    mg_stream **pp = &G.streams;
    while (*pp != s)
        pp = &(*pp)->next;
    *pp = s->next;
    pthread_mutex_unlock(&G.mu);
    free(s);
}

int mg_copy(mg_stream *s, void *dst, const void *src, size_t n)
{
    op *o = calloc(1, sizeof(*o));
    if (!o)
        return -1;
    o->kind = OP_COPY;
    o->dst = dst;
    o->src = src;
    o->n = n;
    pthread_mutex_lock(&G.mu);
    int rc = enqueue(s, o);
    pthread_mutex_unlock(&G.mu);
    if (rc != 0)
        free(o);
    return rc;
}

void mg_stream_sync(mg_stream *s)
{
    pthread_mutex_lock(&G.mu);
    while (s->head)
        pthread_cond_wait(&G.done, &G.mu);
    pthread_mutex_unlock(&G.mu);
}

mg_event *mg_event_create(void)
{
    return calloc(1, sizeof(mg_event));
}

void mg_event_destroy(mg_event *e)
{
    pthread_mutex_lock(&G.mu);
    while (e->pending)
        pthread_cond_wait(&G.done, &G.mu);
    pthread_mutex_unlock(&G.mu);
    free(e);
}

int mg_event_record(mg_event *e, mg_stream *s)
{
    op *o = calloc(1, sizeof(*o));
    if (!o)
        return -1;
    o->kind = OP_MARK;
    o->ev = e;
    pthread_mutex_lock(&G.mu);
    o->gen = e->gen + 1;
    int rc = enqueue(s, o);
    if (rc == 0) {
        e->gen++;
        e->pending++;
    }
    pthread_mutex_unlock(&G.mu);
    if (rc != 0)
        free(o);
    return rc;
}

int mg_event_done(mg_event *e)
{
    pthread_mutex_lock(&G.mu);
    int done = e->done_gen == e->gen;
    pthread_mutex_unlock(&G.mu);
    return done;
}

void mg_event_sync(mg_event *e)
{
    pthread_mutex_lock(&G.mu);
    while (e->done_gen != e->gen)
        pthread_cond_wait(&G.done, &G.mu);
    pthread_mutex_unlock(&G.mu);
}

unsigned long mg_copies_run(void)
{
    pthread_mutex_lock(&G.mu);
    unsigned long n = G.copies;
    pthread_mutex_unlock(&G.mu);
    return n;
}

int mg_hazards(void)
{
    pthread_mutex_lock(&G.mu);
    int n = G.hazards;
    pthread_mutex_unlock(&G.mu);
    return n;
}

/* ---- memory ------------------------------------------------------------------------------- */

void mg_reset(void)
{
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < MAX_BLOCKS; i++)
        free(G.blocks[i].base);
    memset(G.blocks, 0, sizeof(G.blocks));
    memset(G.pins, 0, sizeof(G.pins));
    G.copies = 0;
    G.hazards = 0;
    G.delay_us = 0;
    G.held = 0;
    pthread_cond_broadcast(&G.work);
    pthread_mutex_unlock(&G.mu);
}

void *mg_dev_alloc(int dev, size_t n)
{
    char *p = malloc(n ? n : 1);
    if (!p)
        return NULL;
    pthread_mutex_lock(&G.mu);
    int i = 0;
    while (i < MAX_BLOCKS && G.blocks[i].base)
        i++;
    if (i < MAX_BLOCKS) {
        G.blocks[i].base = p;
        G.blocks[i].size = n;
        G.blocks[i].dev = dev;
    }
    pthread_mutex_unlock(&G.mu);
    if (i == MAX_BLOCKS) {
        free(p);
        return NULL;
    }
    return p;
}

int mg_dev_find(const void *p, size_t *off, int *dev, size_t *size)
{
    uintptr_t a = (uintptr_t)p;
    int found = -1;
    pthread_mutex_lock(&G.mu);
    /* A block holding p; only failing that, one ending at p (blocks may be adjacent). */
    for (int i = 0; i < MAX_BLOCKS; i++) {
        uintptr_t b = (uintptr_t)G.blocks[i].base;
        if (b && a >= b && a < b + G.blocks[i].size) {
            found = i;
            break;
        }
        if (b && a == b + G.blocks[i].size)
            found = i;
    }
    if (found >= 0) {
        *off = a - (uintptr_t)G.blocks[found].base;
        *dev = G.blocks[found].dev;
        *size = G.blocks[found].size;
    }
    pthread_mutex_unlock(&G.mu);
    return found >= 0;
}

int mg_dev_free(void *p)
{
    pthread_mutex_lock(&G.mu);
    int i = 0;
    while (i < MAX_BLOCKS && (!p || G.blocks[i].base != p))
        i++;
    if (i < MAX_BLOCKS) {
        quiesce((uintptr_t)p, G.blocks[i].size);
        G.blocks[i].base = NULL;
    }
    pthread_mutex_unlock(&G.mu);
    if (i == MAX_BLOCKS)
        return -1;
    free(p);
    return 0;
}

int mg_pin_add(void *p, size_t n, int kind)
{
    int free_slot = -1, clash = 0;
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < MAX_PINS; i++) {
        if (!G.pins[i].kind) {
            if (free_slot < 0)
                free_slot = i;
        } else if (overlap(G.pins[i].base, G.pins[i].size, (uintptr_t)p, n ? n : 1)) {
            clash = 1;
        }
    }
    if (!clash && free_slot >= 0) {
        G.pins[free_slot].base = (uintptr_t)p;
        G.pins[free_slot].size = n ? n : 1;
        G.pins[free_slot].kind = kind;
    }
    pthread_mutex_unlock(&G.mu);
    return clash || free_slot < 0 ? -1 : 0;
}

int mg_pin_remove(void *p, int kind)
{
    int rc = -1;
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < MAX_PINS && rc; i++)
        if (G.pins[i].kind == kind && G.pins[i].base == (uintptr_t)p) {
            quiesce(G.pins[i].base, G.pins[i].size);
            G.pins[i].kind = 0;
            rc = 0;
        }
    pthread_mutex_unlock(&G.mu);
    return rc;
}

int mg_pin_kind(const void *p)
{
    int kind = 0;
    pthread_mutex_lock(&G.mu);
    for (int i = 0; i < MAX_PINS && !kind; i++)
        if (G.pins[i].kind && overlap(G.pins[i].base, G.pins[i].size, (uintptr_t)p, 1))
            kind = G.pins[i].kind;
    pthread_mutex_unlock(&G.mu);
    return kind;
}
