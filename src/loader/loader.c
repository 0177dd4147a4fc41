/* The data loader: a pool of batch buffers allocated once, worker threads that write each sample
 * straight into its slot of a batch, a reorder stage, and optional device transfer.
 *
 * Locking (docs/loader.md):
 * - `mu` protects every field marked (mu) below: the free lists, the done list, the epoch
 *   position, counters and statistics.  Workers hold it only to take and hand back work, never
 *   while producing samples or copying.
 * - `stream_mu` serializes use of the loader's device stream and of the events recorded on it
 *   (device.h objects are not locked).  Never taken while holding `mu`... except never: the two
 *   are never held together.
 * - The consumer thread alone calls next/set_epoch/restore; batches are released from any thread.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "registry/registry.h"
#include "stoke/accelerator.h"
#include "stoke/loader.h"
#include "stoke/pinned.h"

enum { ALLOC_PAGEABLE = 0, ALLOC_POOL = 1, ALLOC_BACKEND = 2 };

/* Host memory of one batch. */
typedef struct slot {
    unsigned char *mem;
    int pinned;
    stoke_event *ev; /* device transfer: completes when the copy out of `mem` did */
    struct slot *next;
} slot;

struct stoke_batch {
    stoke_loader *l;
    slot *host;       /* host mode: always this batch's slot; device mode: while filling */
    uint64_t *indices;
    uint64_t *offsets;  /* MAP_VAR: count + 1 byte offsets of the packed samples */
    size_t count;
    size_t bytes;       /* sample bytes in the batch, all fields */
    uint64_t seq, epoch, gen;
    uint64_t k;         /* ITERABLE: the producing worker's batch number */
    int end;            /* ITERABLE: the worker's share ended while filling it */
    int pinned;
    int status;       /* of producing it */
    int worker;
    uint64_t err_index;
    char err_msg[256];
    stoke_device_buffer *dbuf;
    stoke_event *ev;  /* device mode: the consumer's copy-complete event */
    int copied;       /* device mode: the copy was queued */
    struct stoke_batch *next;
};

typedef struct worker {
    stoke_loader *l;
    int id;
    pthread_t th;
    _Atomic uint64_t busy_since; /* start of the sample in progress (ns), 0 when idle */
    _Atomic uint64_t busy_index; /* its dataset index */
    /* ITERABLE (mu): this worker's batch number, end of its share, batches in flight */
    uint64_t k_next, end_at;
    int exhausted, outstanding;
} worker;

struct stoke_loader {
    /* Immutable after create. */
    stoke_loader_opts o;
    stoke_dataset ds;
    stoke_field fields[STOKE_MAX_FIELDS];
    size_t off[STOKE_MAX_FIELDS];
    size_t buf_bytes;       /* one batch buffer */
    size_t sample_bytes;    /* all fields of one sample */
    stoke_sampler *sampler;
    uint64_t nsamples;      /* positions per epoch */
    uint64_t nbatches;
    int nworkers;
    int nw1;                /* max(1, nworkers): producers of an ITERABLE dataset */
    int iterable, var;      /* dataset kind ITERABLE / MAP_VAR */
    int window;             /* batches dispatched and not yet delivered, at most */
    int nbuf;
    int alloc_kind;
    const stoke_backend *pin_vt; /* ALLOC_BACKEND */
    int pin_dev;
    char pin_backend[32];   /* "" when not pinned */
    int device_mode;
    stoke_stream *stream;
    stoke_event *read_ev;
    pthread_mutex_t stream_mu;

    stoke_batch *bat;       /* nbuf */
    slot *slots;            /* nbuf */
    worker *w;              /* nworkers */

    pthread_mutex_t mu;
    pthread_cond_t work_cv; /* workers: work may be available, or quit */
    pthread_cond_t done_cv; /* consumer: a batch completed */
    stoke_batch *free_b;    /* (mu) */
    slot *free_s;           /* (mu) device mode */
    slot *copy_head, *copy_tail; /* (mu) device mode: slots whose copy may still run, FIFO */
    stoke_batch *done;      /* (mu) completed, undelivered; FIFO by completion */
    stoke_batch **done_tail;/* (mu) */
    uint64_t seed, epoch, gen;     /* (mu) */
    uint64_t next_dispatch; /* (mu) next batch seq to hand out */
    uint64_t start_cursor;  /* (mu) where this run of the epoch started */
    uint64_t ndelivered;    /* (mu) delivered since start_cursor */
    uint64_t prefix;        /* (mu) lowest undelivered seq */
    unsigned char *bits;    /* (mu) in_order == 0: delivered seqs */
    int outstanding;        /* (mu) dispatched, not delivered (this gen) */
    int filling;            /* (mu) batches being produced (any gen) */
    int held;               /* (mu) delivered, not released */
    int ended;              /* (mu) EEND until a new epoch */
    int running;            /* (mu) worker threads started */
    int quit;               /* (mu) workers must exit */
    int init_failed;        /* (mu) a worker_init failed (status) */
    int caller_inited;      /* consumer only: worker_init done in the caller's thread */
    int quiesce;            /* (mu) set_epoch is waiting for batches in production */
    /* statistics (mu) */
    uint64_t st_samples, st_batches, st_bytes, st_pinned, st_pageable, st_dcopies, st_dbytes;
    uint64_t st_wait_ns, st_busy_ns;
    stoke__hist wait_hist;

    char err[512];          /* consumer only */
    int sync_ready;         /* consumer only: mu and the conditions exist */
};

/* ---------------------------------------------------------------------------------------- */

void stoke_loader_opts_init(stoke_loader_opts *o)
{
    if (!o)
        return;
    memset(o, 0, sizeof(*o));
    o->size = sizeof(*o);
    o->batch_size = 1;
    o->num_workers = 0;
    o->prefetch_factor = 2;
    o->in_order = 1;
    o->drop_last = 0;
    o->shuffle = 0;
    o->seed = 0;
    o->epoch = 0;
    o->pin_memory = 1;
    o->pin_memory_device = NULL;
    o->timeout_ms = 0;
    o->persistent_workers = 0;
    stoke_sampler_opts_init(&o->sampler);
    o->device = NULL;
}

static int fail_l(stoke_loader *l, int code, const char *fmt, ...) STOKE__PRINTF(3, 4);
static int fail_l(stoke_loader *l, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(l->err, sizeof(l->err), fmt, ap);
    va_end(ap);
    return stoke__fail(code, "%s", l->err);
}

static size_t align_up(size_t v, size_t a)
{
    return (v + a - 1) / a * a;
}

static void cond_init_mono(pthread_cond_t *c)
{
    pthread_condattr_t a;
    pthread_condattr_init(&a);
    pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
    pthread_cond_init(c, &a);
    pthread_condattr_destroy(&a);
}

/* ---- memory ------------------------------------------------------------------------------- */

static int slot_alloc(stoke_loader *l, slot *s)
{
    void *p = NULL;
    int rc = STOKE_OK;
    switch (l->alloc_kind) {
    case ALLOC_POOL:
        rc = stoke_pinned_alloc(l->buf_bytes, &p);
        if (rc == STOKE_OK)
            s->pinned = stoke_is_pinned(p);
        break;
    case ALLOC_BACKEND: {
        rc = l->pin_vt->host_alloc(l->pin_dev, l->buf_bytes, &p);
        int pinned = 0;
        if (rc == STOKE_OK && l->pin_vt->is_pinned && l->pin_vt->is_pinned(p, &pinned) == STOKE_OK)
            s->pinned = pinned;
        if (rc != STOKE_OK)
            rc = stoke__fail(rc, "%s: pinned allocation of %zu bytes failed", l->pin_vt->name,
                             l->buf_bytes);
        break;
    }
    default:
        if (posix_memalign(&p, 4096, l->buf_bytes) != 0) {
            p = NULL;
            rc = stoke__fail(STOKE_ENOMEM, "loader: cannot allocate a batch of %zu bytes",
                             l->buf_bytes);
        }
        s->pinned = 0;
        break;
    }
    s->mem = p;
    return rc;
}

static void slot_free(stoke_loader *l, slot *s)
{
    if (s->mem) {
        switch (l->alloc_kind) {
        case ALLOC_POOL: stoke_pinned_free(s->mem); break;
        case ALLOC_BACKEND: l->pin_vt->host_free(l->pin_dev, s->mem); break;
        default: free(s->mem); break;
        }
    }
    s->mem = NULL;
    stoke_event_destroy(s->ev);
    s->ev = NULL;
}

/* Decides where batches live; logs the warnings of the pin semantics. */
static int choose_pinning(stoke_loader *l)
{
    const stoke_loader_opts *o = &l->o;
    l->alloc_kind = ALLOC_PAGEABLE;
    l->pin_backend[0] = '\0';
    if (!o->pin_memory) {
        if (o->pin_memory_device)
            stoke__log(STOKE_LOG_WARN,
                       "pin_memory_device '%s' has no effect because pin_memory is off",
                       o->pin_memory_device);
        return STOKE_OK;
    }
    const stoke_backend *cur = NULL;
    int cdev = 0;
    const char *why = NULL;
    int crc = stoke__accel_current(&cur, &cdev, &why);
    if (crc != STOKE_OK && crc != STOKE_ENODEV)
        return crc;
    const char *want = o->pin_memory_device ? o->pin_memory_device : o->device;
    if (want) {
        char name[64];
        int index = -1;
        const stoke_backend *vt = NULL;
        int rc = stoke__parse_accel_spec(want, name, sizeof(name), &index);
        if (rc == STOKE_OK)
            rc = stoke__backend_lookup(name, &vt);
        if (rc == STOKE_OK) {
            if (vt == cur && (index < 0 || index == cdev)) {
                l->alloc_kind = ALLOC_POOL;
            } else {
                l->alloc_kind = ALLOC_BACKEND;
                l->pin_vt = vt;
                l->pin_dev = index < 0 ? 0 : index;
            }
            stoke__strlcpy(l->pin_backend, vt->name, sizeof(l->pin_backend));
            return STOKE_OK;
        }
        if (o->pin_memory_device) {
            const char *detail = stoke_last_error();
            if (crc == STOKE_OK)
                stoke__log(STOKE_LOG_WARN,
                           "pin_memory_device '%s' is not available (%s); pinning for the current "
                           "accelerator %s instead",
                           want, detail, cur->name);
            else
                stoke__log(STOKE_LOG_WARN,
                           "pin_memory_device '%s' is not available (%s); batches will not be "
                           "pinned",
                           want, detail);
            if (crc != STOKE_OK)
                return STOKE_OK;
        }
    }
    if (crc == STOKE_OK) {
        l->alloc_kind = ALLOC_POOL;
        stoke__strlcpy(l->pin_backend, cur->name, sizeof(l->pin_backend));
    } else if (!o->pin_memory_device) {
        stoke__log(STOKE_LOG_WARN,
                   "pin_memory is set but no accelerator was found; batches will not be pinned");
    }
    return STOKE_OK;
}

/* Creates the stream, events and device buffers of device transfer. */
static int setup_device(stoke_loader *l)
{
    char name[64];
    int index = -1;
    int rc = stoke__parse_accel_spec(l->o.device, name, sizeof(name), &index);
    if (rc != STOKE_OK)
        return fail_l(l, STOKE_EINVAL, "device '%s' is not name[:index]", l->o.device);
    const stoke_backend *vt = NULL, *cur = NULL;
    int cdev = 0;
    rc = stoke__backend_lookup(name, &vt);
    if (rc != STOKE_OK)
        return fail_l(l, rc, "device '%s': %s", l->o.device, stoke_last_error());
    int have_cur = stoke__accel_current(&cur, &cdev, NULL) == STOKE_OK;
    if (index >= 0 && index != (have_cur && cur == vt ? cdev : 0)) {
        if (!have_cur || cur != vt)
            return fail_l(l, STOKE_ENOTSUP,
                          "device '%s': a device index other than 0 needs %s to be the chosen "
                          "accelerator",
                          l->o.device, vt->name);
        rc = stoke_device_set(index);
        if (rc != STOKE_OK)
            return fail_l(l, rc, "device '%s': %s", l->o.device, stoke_last_error());
        rc = stoke_stream_create(name, &l->stream);
        stoke_device_set(cdev);
    } else {
        rc = stoke_stream_create(name, &l->stream);
    }
    if (rc != STOKE_OK)
        return fail_l(l, rc, "device '%s': %s", l->o.device, stoke_last_error());
    rc = stoke_event_create(l->stream, &l->read_ev);
    for (int i = 0; rc == STOKE_OK && i < l->nbuf; i++) {
        rc = stoke_device_buffer_create(l->stream, l->buf_bytes, &l->bat[i].dbuf);
        if (rc == STOKE_OK)
            rc = stoke_event_create(l->stream, &l->bat[i].ev);
        if (rc == STOKE_OK)
            rc = stoke_event_create(l->stream, &l->slots[i].ev);
    }
    if (rc != STOKE_OK)
        return fail_l(l, rc, "device '%s': %s", l->o.device, stoke_last_error());
    l->device_mode = 1;
    return STOKE_OK;
}

/* ---- producing batches -------------------------------------------------------------------- */

static size_t batch_count(const stoke_loader *l, uint64_t seq)
{
    uint64_t first = seq * l->o.batch_size;
    uint64_t left = l->nsamples - first;
    return left < l->o.batch_size ? (size_t)left : l->o.batch_size;
}

/* Calls the dataset for one sample of batch b (slot j), publishing it for the timeout check.
 * MAP / MAP_VAR: `idx` is the sample; ITERABLE: *idx receives it.  Returns the status. */
static int one_sample(stoke_loader *l, stoke_batch *b, worker *w, int wid, size_t j, uint64_t *idx,
                      char *msg, size_t msg_len)
{
    unsigned char *mem = b->host->mem;
    void *dst[STOKE_MAX_FIELDS];
    for (int f = 0; f < l->ds.nfields; f++)
        dst[f] = mem + l->off[f] + j * l->fields[f].bytes;
    msg[0] = '\0';
    uint64_t t0 = stoke__now_ns();
    if (w) {
        atomic_store(&w->busy_index, l->iterable ? UINT64_MAX : *idx);
        atomic_store(&w->busy_since, t0);
    }
    int rc;
    if (l->iterable) {
        rc = l->ds.next(l->ds.user, wid, l->nworkers, dst, idx, msg, msg_len);
    } else if (l->var) {
        const void *data = NULL;
        size_t len = 0;
        void *token = NULL;
        rc = l->ds.get_var(l->ds.user, *idx, &data, &len, &token, wid, msg, msg_len);
        if (rc == STOKE_OK) {
            uint64_t used = b->offsets[j];
            if (len > l->o.batch_size * l->fields[0].bytes - used) {
                rc = STOKE_ELIMIT;
                stoke__fmt(msg, msg_len,
                           "variable-size sample of %zu bytes does not fit: a batch holds %zu "
                           "(batch_size x fields[0].bytes)",
                           len, l->o.batch_size * l->fields[0].bytes);
            } else {
                if (len)
                    memcpy(mem + used, data, len);
                b->offsets[j + 1] = used + len;
            }
            if (l->ds.release_var)
                l->ds.release_var(l->ds.user, token);
        }
    } else {
        rc = l->ds.get(l->ds.user, *idx, dst, wid, msg, msg_len);
    }
    if (w)
        atomic_store(&w->busy_since, 0);
    if (rc == STOKE_OK && !w && l->o.timeout_ms &&
        stoke__now_ns() - t0 > (uint64_t)l->o.timeout_ms * 1000000u) {
        rc = STOKE_ETIMEDOUT;
        stoke__fmt(msg, msg_len, "took longer than the timeout of %u ms", l->o.timeout_ms);
    }
    return rc;
}

/* Writes batch `seq` into b->host; the caller owns b.  Sets b->status and the error fields
 * (ITERABLE: b->end when the worker's share ended). */
static void fill_batch(stoke_loader *l, stoke_batch *b, worker *w, int wid, uint64_t seed,
                       uint64_t epoch, uint64_t seq)
{
    b->seq = seq;
    b->epoch = epoch;
    b->count = l->iterable ? l->o.batch_size : batch_count(l, seq);
    b->status = STOKE_OK;
    b->worker = wid;
    b->copied = 0;
    b->end = 0;
    b->pinned = b->host->pinned;
    if (b->offsets)
        b->offsets[0] = 0;
    char msg[256];
    size_t j = 0;
    for (; j < b->count; j++) {
        uint64_t idx = 0;
        if (!l->iterable) {
            int rc = stoke_sampler_index(l->sampler, seed, epoch, seq * l->o.batch_size + j, &idx);
            if (rc != STOKE_OK) {
                b->status = rc;
                b->err_index = seq * l->o.batch_size + j;
                stoke__strlcpy(b->err_msg, "sampler position out of range", sizeof(b->err_msg));
                break;
            }
        }
        int rc = one_sample(l, b, w, wid, j, &idx, msg, sizeof(msg));
        if (rc == STOKE_EEND && l->iterable) {
            b->end = 1;
            break;
        }
        if (rc != STOKE_OK) {
            b->status = rc > 0 ? STOKE_EDATA : rc;
            b->err_index = idx;
            stoke__strlcpy(b->err_msg, msg[0] ? msg : stoke_strerror(b->status),
                           sizeof(b->err_msg));
            break;
        }
        b->indices[j] = idx;
    }
    b->count = j;
    b->bytes = l->var ? (size_t)b->offsets[j] : j * l->sample_bytes;
}

/* Device mode: queues the copy of a filled batch; the slot's event marks when it may be reused. */
static void copy_batch(stoke_loader *l, stoke_batch *b)
{
    slot *s = b->host;
    int rc = STOKE_OK;
    pthread_mutex_lock(&l->stream_mu);
    for (int f = 0; rc == STOKE_OK && f < l->ds.nfields; f++) {
        size_t n = l->var ? b->bytes : b->count * l->fields[f].bytes;
        if (n)
            rc = stoke_copy_h2d_async(b->dbuf, l->off[f], s->mem + l->off[f], n, l->stream);
    }
    if (rc == STOKE_OK)
        rc = stoke_event_record(b->ev, l->stream);
    if (rc == STOKE_OK)
        rc = stoke_event_record(s->ev, l->stream);
    if (rc == STOKE_OK && l->alloc_kind == ALLOC_POOL)
        stoke_pinned_record_stream(s->mem, l->stream);
    pthread_mutex_unlock(&l->stream_mu);
    b->copied = 1; /* something may have been queued: the slot waits for its event */
    if (rc != STOKE_OK) {
        b->status = rc;
        b->err_index = b->count ? b->indices[0] : 0;
        stoke__fmt(b->err_msg, sizeof(b->err_msg), "copy to device %s failed: %s", l->o.device,
                   stoke_last_error());
    }
}

/* (mu) Gives b (and in device mode its slot) back to the pools. */
static void recycle(stoke_loader *l, stoke_batch *b)
{
    if (l->device_mode && b->host) {
        slot *s = b->host;
        b->host = NULL;
        s->next = NULL;
        if (b->copied) {
            if (l->copy_tail)
                l->copy_tail->next = s;
            else
                l->copy_head = s;
            l->copy_tail = s;
        } else {
            s->next = l->free_s;
            l->free_s = s;
        }
    }
    b->next = l->free_b;
    l->free_b = b;
}

/* (mu) Device mode: a slot for a new batch; may drop `mu` to wait for an old copy. */
static slot *take_slot(stoke_loader *l)
{
    slot *s = l->free_s;
    if (s) {
        l->free_s = s->next;
        return s;
    }
    s = l->copy_head; /* never NULL: fewer batches are being filled than there are slots */
    l->copy_head = s->next;
    if (!l->copy_head)
        l->copy_tail = NULL;
    pthread_mutex_unlock(&l->mu);
    stoke_event_synchronize(s->ev); /* the pinned memory is reused only after its copy */
    pthread_mutex_lock(&l->mu);
    return s;
}

/* (mu) Hands a finished batch to the consumer, or recycles it if its epoch was abandoned.  In
 * device mode the staging slot leaves the batch here: it waits in the copy FIFO until its copy's
 * event completes, whatever the consumer does with the batch. */
static void complete(stoke_loader *l, stoke_batch *b, uint64_t gen, uint64_t busy_ns)
{
    l->st_busy_ns += busy_ns;
    l->filling--;
    b->gen = gen;
    pthread_cond_signal(&l->done_cv); /* also wakes a consumer quiescing for set_epoch */
    if (l->device_mode && b->host && b->copied) {
        slot *s = b->host;
        b->host = NULL;
        s->next = NULL;
        if (l->copy_tail)
            l->copy_tail->next = s;
        else
            l->copy_head = s;
        l->copy_tail = s;
    }
    if (gen != l->gen) {
        recycle(l, b);
        pthread_cond_broadcast(&l->work_cv);
        return;
    }
    if (l->iterable && b->status == STOKE_OK && b->end) {
        worker *w = &l->w[b->worker];
        int keep = b->count && !(l->o.drop_last && b->count < l->o.batch_size);
        w->exhausted = 1;
        w->end_at = keep ? b->k + 1 : b->k;
        if (!keep) { /* nothing to deliver: the share ended on a batch boundary or was dropped */
            w->outstanding--;
            l->outstanding--;
            recycle(l, b);
            pthread_cond_broadcast(&l->work_cv);
            return;
        }
    }
    b->next = NULL;
    *l->done_tail = b;
    l->done_tail = &b->next;
    pthread_cond_signal(&l->done_cv);
}

static int can_dispatch(const stoke_loader *l, const worker *w)
{
    if (l->ended || l->init_failed || !l->free_b || l->quiesce)
        return 0;
    if (l->iterable)
        return !w->exhausted && w->outstanding < l->o.prefetch_factor;
    return l->next_dispatch < l->nbatches && l->outstanding < l->window;
}

/* (mu) Takes the next batch for worker w (can_dispatch was true).  May drop `mu` briefly. */
static stoke_batch *dispatch(stoke_loader *l, worker *w, uint64_t *gen, uint64_t *seed,
                             uint64_t *epoch)
{
    stoke_batch *b = l->free_b;
    l->free_b = b->next;
    if (l->iterable) {
        b->k = w->k_next++;
        b->seq = b->k * (uint64_t)l->nw1 + (uint64_t)w->id;
        w->outstanding++;
    } else {
        b->seq = l->next_dispatch++;
    }
    *gen = l->gen;
    *seed = l->seed;
    *epoch = l->epoch;
    l->outstanding++;
    l->filling++;
    if (l->device_mode)
        b->host = take_slot(l);
    return b;
}

/* Produces a dispatched batch, without `mu`; returns the busy time. */
static uint64_t produce(stoke_loader *l, stoke_batch *b, worker *w, int wid, uint64_t seed,
                        uint64_t epoch)
{
    uint64_t t0 = stoke__now_ns();
    fill_batch(l, b, w, wid, seed, epoch, b->seq);
    if (l->device_mode && b->status == STOKE_OK && b->count)
        copy_batch(l, b);
    return stoke__now_ns() - t0;
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    stoke_loader *l = w->l;
    char name[16];
    snprintf(name, sizeof(name), "stoke-w%d", w->id);
    stoke__thread_name(name);
    if (l->ds.worker_init) {
        int rc = l->ds.worker_init(l->ds.user, w->id, l->nworkers);
        if (rc != STOKE_OK) {
            pthread_mutex_lock(&l->mu);
            if (!l->init_failed)
                l->init_failed = rc < 0 ? rc : STOKE_EDATA;
            pthread_cond_broadcast(&l->done_cv);
            pthread_mutex_unlock(&l->mu);
            stoke__log(STOKE_LOG_DEBUG, "loader: worker_init of worker %d failed (%s)", w->id,
                       stoke_err_name(rc));
            return NULL;
        }
    }
    pthread_mutex_lock(&l->mu);
    for (;;) {
        while (!l->quit && !can_dispatch(l, w))
            pthread_cond_wait(&l->work_cv, &l->mu);
        if (l->quit)
            break;
        uint64_t gen, seed, epoch;
        stoke_batch *b = dispatch(l, w, &gen, &seed, &epoch);
        pthread_mutex_unlock(&l->mu);
        uint64_t busy = produce(l, b, w, w->id, seed, epoch);
        pthread_mutex_lock(&l->mu);
        complete(l, b, gen, busy);
    }
    pthread_mutex_unlock(&l->mu);
    return NULL;
}

/* Consumer: starts the worker threads if they are not running. */
static int start_workers(stoke_loader *l)
{
    if (l->running || l->nworkers == 0)
        return STOKE_OK;
    l->quit = 0;
    for (int i = 0; i < l->nworkers; i++) {
        worker *w = &l->w[i];
        atomic_store(&w->busy_since, 0);
        int e = pthread_create(&w->th, NULL, worker_main, w);
        if (e) {
            pthread_mutex_lock(&l->mu);
            l->quit = 1;
            pthread_cond_broadcast(&l->work_cv);
            pthread_mutex_unlock(&l->mu);
            for (int j = 0; j < i; j++)
                pthread_join(l->w[j].th, NULL);
            l->quit = 0;
            return fail_l(l, STOKE_ENOMEM, "loader: cannot start worker %d: %s", i, strerror(e));
        }
    }
    l->running = 1;
    return STOKE_OK;
}

/* Consumer, without `mu`: asks the workers to exit and joins them. */
static void stop_workers(stoke_loader *l)
{
    if (!l->running)
        return;
    pthread_mutex_lock(&l->mu);
    l->quit = 1;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    for (int i = 0; i < l->nworkers; i++)
        pthread_join(l->w[i].th, NULL);
    pthread_mutex_lock(&l->mu);
    l->quit = 0;
    l->running = 0;
    l->init_failed = 0;
    pthread_mutex_unlock(&l->mu);
}

/* (mu) Abandons the current run: every batch not yet delivered goes back to the pools. */
static void abandon(stoke_loader *l)
{
    l->gen++;
    while (l->done) {
        stoke_batch *b = l->done;
        l->done = b->next;
        recycle(l, b);
    }
    l->done_tail = &l->done;
    l->outstanding = 0;
    for (int i = 0; l->iterable && i < l->nw1; i++)
        l->w[i].outstanding = 0;
    pthread_cond_broadcast(&l->work_cv);
}

/* (mu) 1 when the current epoch has nothing more to deliver. */
static int epoch_over(const stoke_loader *l)
{
    if (l->ended)
        return 1;
    if (!l->iterable)
        return l->ndelivered >= l->nbatches - l->start_cursor;
    for (int i = 0; i < l->nw1; i++)
        if (!l->w[i].exhausted)
            return 0;
    return l->outstanding == 0;
}

/* (mu) Moves to (epoch, cursor). */
static void set_position(stoke_loader *l, uint64_t epoch, uint64_t cursor)
{
    abandon(l);
    l->epoch = epoch;
    l->start_cursor = cursor;
    l->next_dispatch = cursor;
    l->prefix = cursor;
    l->ndelivered = 0;
    l->ended = 0;
    for (int i = 0; l->iterable && i < l->nw1; i++) {
        l->w[i].k_next = 0;
        l->w[i].end_at = 0;
        l->w[i].exhausted = 0;
    }
    if (l->bits)
        memset(l->bits, 0, (size_t)((l->nbatches + 7) / 8));
}

/* ---- create / destroy --------------------------------------------------------------------- */

static int check_dataset(stoke_loader *l, const stoke_dataset *ds)
{
    switch (ds->kind) {
    case STOKE_DATASET_MAP:
        if (!ds->length || !ds->get)
            return fail_l(l, STOKE_EINVAL, "loader: dataset %s has no length() or get()",
                          ds->name);
        break;
    case STOKE_DATASET_MAP_VAR:
        if (!ds->length || !ds->get_var)
            return fail_l(l, STOKE_EINVAL, "loader: dataset %s has no length() or get_var()",
                          ds->name);
        if (ds->nfields != 1)
            return fail_l(l, STOKE_EINVAL,
                          "loader: variable-size dataset %s must have exactly one field",
                          ds->name);
        break;
    case STOKE_DATASET_ITERABLE:
        if (!ds->next)
            return fail_l(l, STOKE_EINVAL, "loader: iterable dataset %s has no next()", ds->name);
        if (l->o.shuffle || l->o.sampler.kind != STOKE_SAMPLER_SEQUENTIAL ||
            l->o.sampler.distributed)
            return fail_l(l, STOKE_EINVAL,
                          "loader: iterable dataset %s: shuffle and samplers do not apply (the "
                          "dataset orders and shards itself)",
                          ds->name);
        break;
    default:
        return fail_l(l, STOKE_EINVAL, "loader: dataset %s has an unknown kind %d", ds->name,
                      ds->kind);
    }
    if (ds->nfields < 1 || ds->nfields > STOKE_MAX_FIELDS)
        return fail_l(l, STOKE_EINVAL, "loader: dataset %s has %d fields (1..%d)", ds->name,
                      ds->nfields, STOKE_MAX_FIELDS);
    for (int f = 0; f < ds->nfields; f++) {
        stoke_field *fd = &l->fields[f];
        *fd = ds->fields[f];
        if (!fd->bytes) {
            size_t n = fd->itemsize ? fd->itemsize : stoke_dtype_size(fd->dtype);
            if (fd->ndim < 0 || fd->ndim > STOKE_MAX_DIMS)
                n = 0;
            for (int d = 0; n && d < fd->ndim; d++)
                n = fd->shape[d] > 0 ? n * (size_t)fd->shape[d] : 0;
            fd->bytes = n;
            if (!fd->itemsize)
                fd->itemsize = stoke_dtype_size(fd->dtype);
        }
        if (!fd->bytes)
            return fail_l(l, STOKE_EINVAL,
                          "loader: dataset %s: field %d has no size%s", ds->name, f,
                          ds->kind == STOKE_DATASET_MAP_VAR
                              ? " (variable-size: bytes is the largest sample)"
                              : "");
    }
    return STOKE_OK;
}

int stoke_loader_create(const stoke_loader_opts *o, stoke_dataset *ds, stoke_loader **out)
{
    if (!o || !ds || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_create: NULL argument");
    *out = NULL;
    if (o->size == 0 || o->size > sizeof(stoke_loader_opts))
        return stoke__fail(STOKE_EINVAL, "stoke_loader_create: options not initialized with "
                                         "stoke_loader_opts_init");
    stoke_loader *l = calloc(1, sizeof(*l));
    if (!l)
        return STOKE_ENOMEM;
    stoke_loader_opts_init(&l->o);
    memcpy(&l->o, o, o->size);
    l->ds = *ds;
    pthread_mutex_init(&l->mu, NULL);
    pthread_mutex_init(&l->stream_mu, NULL);
    pthread_cond_init(&l->work_cv, NULL);
    cond_init_mono(&l->done_cv);
    l->done_tail = &l->done;
    l->sync_ready = 1;
    int rc;

    if (l->o.batch_size == 0 || l->o.num_workers < 0 || l->o.num_workers > 1024 ||
        l->o.prefetch_factor < 1) {
        rc = fail_l(l, STOKE_EINVAL, "loader: batch_size must be >= 1, num_workers in 0..1024, "
                                     "prefetch_factor >= 1");
        goto fail;
    }
    if ((rc = check_dataset(l, ds)) != STOKE_OK)
        goto fail;

    l->iterable = ds->kind == STOKE_DATASET_ITERABLE;
    l->var = ds->kind == STOKE_DATASET_MAP_VAR;
    stoke_sampler_opts so = l->o.sampler;
    if (l->o.shuffle) {
        if (so.kind == STOKE_SAMPLER_SEQUENTIAL)
            so.kind = STOKE_SAMPLER_RANDOM;
        else if (so.kind == STOKE_SAMPLER_SUBSET)
            so.shuffle = 1;
    }
    uint64_t len = l->iterable ? 0 : ds->length(ds->user);
    if ((rc = stoke_sampler_create(&so, len, &l->sampler)) != STOKE_OK) {
        fail_l(l, rc, "%s", stoke_last_error());
        goto fail;
    }
    l->nsamples = stoke_sampler_length(l->sampler);
    l->nbatches = l->o.drop_last ? l->nsamples / l->o.batch_size
                                 : (l->nsamples + l->o.batch_size - 1) / l->o.batch_size;
    if (l->o.drop_last)
        l->nsamples = l->nbatches * l->o.batch_size;

    l->nworkers = l->o.num_workers;
    l->nw1 = l->nworkers ? l->nworkers : 1;
    l->window = l->o.prefetch_factor * l->nw1;
    uint64_t nbuf = (uint64_t)l->window + 2;
    if (!l->iterable && nbuf > l->nbatches + 2)
        nbuf = l->nbatches + 2;
    l->nbuf = (int)nbuf;
    size_t off = 0;
    for (int f = 0; f < ds->nfields; f++) {
        l->off[f] = off;
        off = align_up(off + l->o.batch_size * l->fields[f].bytes, 256);
        l->sample_bytes += l->fields[f].bytes;
    }
    l->buf_bytes = align_up(off, 4096);

    l->bat = calloc((size_t)l->nbuf, sizeof(*l->bat));
    l->slots = calloc((size_t)l->nbuf, sizeof(*l->slots));
    l->w = calloc((size_t)l->nw1, sizeof(*l->w));
    if (!l->o.in_order && !l->iterable)
        l->bits = calloc((size_t)((l->nbatches + 7) / 8 + 1), 1);
    if (!l->bat || !l->slots || !l->w || (!l->o.in_order && !l->iterable && !l->bits)) {
        rc = STOKE_ENOMEM;
        goto fail;
    }
    for (int i = 0; i < l->nw1; i++) {
        l->w[i].l = l;
        l->w[i].id = i;
    }

    if ((rc = choose_pinning(l)) != STOKE_OK) {
        fail_l(l, rc, "loader: %s", stoke_last_error());
        goto fail;
    }
    for (int i = 0; i < l->nbuf; i++) {
        stoke_batch *b = &l->bat[i];
        b->l = l;
        b->indices = calloc(l->o.batch_size, sizeof(uint64_t));
        if (l->var)
            b->offsets = calloc(l->o.batch_size + 1, sizeof(uint64_t));
        if (!b->indices || (l->var && !b->offsets)) {
            rc = STOKE_ENOMEM;
            goto fail;
        }
        if ((rc = slot_alloc(l, &l->slots[i])) != STOKE_OK) {
            fail_l(l, rc, "loader: %s", stoke_last_error());
            goto fail;
        }
    }
    if (l->o.device && (rc = setup_device(l)) != STOKE_OK)
        goto fail;
    for (int i = l->nbuf - 1; i >= 0; i--) {
        stoke_batch *b = &l->bat[i];
        if (l->device_mode) {
            l->slots[i].next = l->free_s;
            l->free_s = &l->slots[i];
        } else {
            b->host = &l->slots[i];
        }
        b->next = l->free_b;
        l->free_b = b;
    }
    l->seed = l->o.seed;
    set_position(l, l->o.epoch, 0);
    stoke__log(STOKE_LOG_DEBUG,
               "loader: %s, %" PRIu64 " samples, %" PRIu64 " batches of %zu, %d workers, %d "
               "buffers of %zu bytes (%s)",
               ds->name, l->nsamples, l->nbatches, l->o.batch_size, l->nworkers, l->nbuf,
               l->buf_bytes, l->pin_backend[0] ? l->pin_backend : "pageable");
    *out = l;
    return STOKE_OK;
fail:
    stoke__fail(rc, "%s", l->err[0] ? l->err : stoke_last_error());
    stoke_loader_destroy(l);
    return rc;
}

void stoke_loader_destroy(stoke_loader *l)
{
    if (!l)
        return;
    if (l->sync_ready) {
        pthread_mutex_lock(&l->mu);
        abandon(l);
        pthread_mutex_unlock(&l->mu);
        stop_workers(l);
    }
    if (l->stream)
        stoke_stream_synchronize(l->stream);
    if (l->bat) {
        for (int i = 0; i < l->nbuf; i++) {
            free(l->bat[i].indices);
            free(l->bat[i].offsets);
            stoke_device_buffer_destroy(l->bat[i].dbuf);
            stoke_event_destroy(l->bat[i].ev);
        }
    }
    if (l->slots)
        for (int i = 0; i < l->nbuf; i++)
            slot_free(l, &l->slots[i]);
    stoke_event_destroy(l->read_ev);
    stoke_stream_destroy(l->stream);
    stoke_sampler_destroy(l->sampler);
    free(l->bat);
    free(l->slots);
    free(l->w);
    free(l->bits);
    pthread_cond_destroy(&l->work_cv);
    pthread_cond_destroy(&l->done_cv);
    pthread_mutex_destroy(&l->mu);
    pthread_mutex_destroy(&l->stream_mu);
    free(l);
}

/* ---- the consumer ------------------------------------------------------------------------- */

/* (mu) Records a delivered batch. */
static void delivered(stoke_loader *l, stoke_batch *b)
{
    l->outstanding--;
    l->held++;
    l->ndelivered++;
    if (l->iterable)
        l->w[b->worker].outstanding--;
    if (l->o.in_order) {
        l->prefix = b->seq + 1;
    } else if (l->bits) {
        l->bits[b->seq / 8] |= (unsigned char)(1u << (b->seq % 8));
        while (l->prefix < l->nbatches && (l->bits[l->prefix / 8] >> (l->prefix % 8)) & 1u)
            l->prefix++;
    }
    l->st_batches++;
    l->st_samples += b->count;
    l->st_bytes += b->bytes;
    if (b->pinned)
        l->st_pinned++;
    else
        l->st_pageable++;
    if (l->device_mode) {
        l->st_dcopies++;
        l->st_dbytes += b->bytes;
    }
    pthread_cond_broadcast(&l->work_cv);
}

/* (mu) The batch the consumer may take now, removed from the done list, or NULL. */
static stoke_batch *take_done(stoke_loader *l)
{
    /* ITERABLE in order: skip the seqs of workers whose share ended before them. */
    while (l->iterable && l->o.in_order && !epoch_over(l)) {
        const worker *w = &l->w[l->prefix % (uint64_t)l->nw1];
        if (!w->exhausted || l->prefix / (uint64_t)l->nw1 < w->end_at)
            break;
        l->prefix++;
    }
    for (stoke_batch **pp = &l->done; *pp; pp = &(*pp)->next) {
        stoke_batch *b = *pp;
        if (l->o.in_order && b->seq != l->prefix)
            continue;
        *pp = b->next;
        if (l->done_tail == &b->next)
            l->done_tail = pp;
        b->next = NULL;
        return b;
    }
    return NULL;
}

/* (mu) Ends the epoch with the error of batch b (recycled). */
static int batch_error(stoke_loader *l, stoke_batch *b)
{
    int rc = b->status;
    fail_l(l, rc, "worker %d: sample %" PRIu64 " of %s: %s (%s)", b->worker, b->err_index,
           l->ds.name, b->err_msg, stoke_err_name(rc));
    recycle(l, b);
    l->outstanding--;
    abandon(l);
    l->ended = 1;
    return rc;
}

/* (mu) A worker whose sample has run longer than the timeout, or -1. */
static int timed_out_worker(stoke_loader *l, uint64_t now, uint64_t *deadline)
{
    uint64_t lim = (uint64_t)l->o.timeout_ms * 1000000u;
    *deadline = now + lim;
    for (int i = 0; i < l->nworkers; i++) {
        uint64_t t = atomic_load(&l->w[i].busy_since);
        if (!t)
            continue;
        if (now > t && now - t > lim)
            return i;
        if (t + lim + 1000000u < *deadline)
            *deadline = t + lim + 1000000u;
    }
    return -1;
}

int stoke_loader_next(stoke_loader *l, stoke_batch **out)
{
    if (!l || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_next: NULL argument");
    *out = NULL;
    uint64_t t0 = stoke__now_ns();
    int rc = STOKE_OK;
    stoke_batch *b = NULL;

    if (l->nworkers == 0) {
        pthread_mutex_lock(&l->mu);
        int over = epoch_over(l);
        pthread_mutex_unlock(&l->mu);
        if (!over && l->ds.worker_init && !l->caller_inited) {
            rc = l->ds.worker_init(l->ds.user, 0, 0);
            if (rc != STOKE_OK)
                return fail_l(l, rc < 0 ? rc : STOKE_EDATA, "loader: worker_init failed (%s)",
                              stoke_err_name(rc));
            l->caller_inited = 1;
        }
        pthread_mutex_lock(&l->mu);
        for (;;) { /* more than once only when an iterable share ends on a batch boundary */
            if (epoch_over(l)) {
                l->ended = 1;
                pthread_mutex_unlock(&l->mu);
                return STOKE_EEND;
            }
            if (!l->free_b) {
                pthread_mutex_unlock(&l->mu);
                return fail_l(l, STOKE_ELIMIT,
                              "loader: all %d batch buffers are held by the caller; release "
                              "batches",
                              l->nbuf);
            }
            uint64_t gen, seed, epoch;
            b = dispatch(l, &l->w[0], &gen, &seed, &epoch);
            pthread_mutex_unlock(&l->mu);
            uint64_t busy = produce(l, b, NULL, 0, seed, epoch);
            pthread_mutex_lock(&l->mu);
            complete(l, b, gen, busy);
            b = take_done(l); /* the batch just made: nothing else is in flight */
            if (b)
                break;
        }
    } else {
        pthread_mutex_lock(&l->mu);
        int over = l->ended;
        pthread_mutex_unlock(&l->mu);
        if (over)
            return STOKE_EEND;
        if ((rc = start_workers(l)) != STOKE_OK)
            return rc;
        pthread_mutex_lock(&l->mu);
        for (;;) {
            if (l->ended) {
                rc = STOKE_EEND;
                break;
            }
            if (l->init_failed) {
                rc = l->init_failed;
                fail_l(l, rc, "loader: a worker_init of dataset %s failed (%s)", l->ds.name,
                       stoke_err_name(rc));
                abandon(l);
                l->ended = 1;
                break;
            }
            b = take_done(l);
            if (b)
                break;
            if (epoch_over(l)) {
                l->ended = 1;
                rc = STOKE_EEND;
                break;
            }
            if (l->held >= l->nbuf || (!l->free_b && l->filling == 0)) {
                rc = fail_l(l, STOKE_ELIMIT,
                            "loader: all %d batch buffers are held by the caller; release "
                            "batches",
                            l->nbuf);
                break;
            }
            if (l->o.timeout_ms) {
                uint64_t now = stoke__now_ns(), deadline;
                int w = timed_out_worker(l, now, &deadline);
                if (w >= 0) {
                    char what[48] = "its next sample";
                    uint64_t idx = atomic_load(&l->w[w].busy_index);
                    if (!l->iterable)
                        stoke__fmt(what, sizeof(what), "sample %" PRIu64, idx);
                    rc = fail_l(l, STOKE_ETIMEDOUT,
                                "worker %d: %s of %s took longer than the timeout of %u ms "
                                "(STOKE_ETIMEDOUT)",
                                w, what, l->ds.name, l->o.timeout_ms);
                    abandon(l);
                    l->ended = 1;
                    break;
                }
                struct timespec ts;
                ts.tv_sec = (time_t)(deadline / 1000000000u);
                ts.tv_nsec = (long)(deadline % 1000000000u);
                pthread_cond_timedwait(&l->done_cv, &l->mu, &ts);
            } else {
                pthread_cond_wait(&l->done_cv, &l->mu);
            }
        }
        if (rc != STOKE_OK) {
            pthread_mutex_unlock(&l->mu);
            if (rc == STOKE_EEND && !l->o.persistent_workers)
                stop_workers(l);
            return rc;
        }
    }
    /* (mu) held, b taken from the done list */
    if (b->status != STOKE_OK) {
        rc = batch_error(l, b);
        pthread_mutex_unlock(&l->mu);
        return rc;
    }
    delivered(l, b);
    uint64_t waited = stoke__now_ns() - t0;
    l->st_wait_ns += waited;
    stoke__hist_add(&l->wait_hist, waited);
    pthread_mutex_unlock(&l->mu);
    *out = b;
    return STOKE_OK;
}

/* Consumer: stops dispatching, abandons the run and waits until no batch is being produced, so
 * that nothing calls the dataset.  Returns with `mu` held and `quiesce` set. */
static void quiesce(stoke_loader *l)
{
    pthread_mutex_lock(&l->mu);
    l->quiesce = 1;
    abandon(l);
    while (l->filling > 0)
        pthread_cond_wait(&l->done_cv, &l->mu);
}

/* Consumer: moves to (seed, epoch, cursor); ITERABLE datasets are reset for the epoch. */
static int reposition(stoke_loader *l, uint64_t seed, uint64_t epoch, uint64_t cursor)
{
    quiesce(l);
    pthread_mutex_unlock(&l->mu);
    if (!l->o.persistent_workers) {
        stop_workers(l);
        l->caller_inited = 0;
    }
    int rc = STOKE_OK;
    if (l->iterable && l->ds.reset)
        rc = l->ds.reset(l->ds.user, epoch);
    pthread_mutex_lock(&l->mu);
    l->seed = seed;
    set_position(l, epoch, cursor);
    l->quiesce = 0;
    pthread_cond_broadcast(&l->work_cv);
    pthread_mutex_unlock(&l->mu);
    l->err[0] = '\0';
    if (rc != STOKE_OK)
        return fail_l(l, rc < 0 ? rc : STOKE_EDATA, "loader: reset(%" PRIu64 ") of dataset %s "
                      "failed (%s)", epoch, l->ds.name, stoke_err_name(rc));
    return STOKE_OK;
}

int stoke_loader_set_epoch(stoke_loader *l, uint64_t epoch)
{
    if (!l)
        return STOKE_EINVAL;
    pthread_mutex_lock(&l->mu);
    uint64_t seed = l->seed;
    pthread_mutex_unlock(&l->mu);
    return reposition(l, seed, epoch, 0);
}

int stoke_loader_next_epoch(stoke_loader *l)
{
    if (!l)
        return STOKE_EINVAL;
    return stoke_loader_set_epoch(l, stoke_loader_epoch(l) + 1);
}

uint64_t stoke_loader_epoch(const stoke_loader *l)
{
    if (!l)
        return 0;
    stoke_loader *m = (stoke_loader *)l;
    pthread_mutex_lock(&m->mu);
    uint64_t e = m->epoch;
    pthread_mutex_unlock(&m->mu);
    return e;
}

uint64_t stoke_loader_num_batches(const stoke_loader *l)
{
    return l ? l->nbatches : 0;
}

int stoke_loader_save_state(const stoke_loader *l, stoke_loader_state *out)
{
    if (!l || !out)
        return STOKE_EINVAL;
    stoke_loader *m = (stoke_loader *)l;
    memset(out, 0, sizeof(*out));
    if (l->iterable)
        return stoke__fail(STOKE_ENOTSUP, "loader: an iterable dataset has no restorable position");
    out->version = STOKE_LOADER_STATE_VERSION;
    pthread_mutex_lock(&m->mu);
    out->seed = m->seed;
    out->epoch = m->epoch;
    out->cursor = m->prefix;
    pthread_mutex_unlock(&m->mu);
    return STOKE_OK;
}

int stoke_loader_restore_state(stoke_loader *l, const stoke_loader_state *st)
{
    if (!l || !st)
        return STOKE_EINVAL;
    if (l->iterable)
        return fail_l(l, STOKE_ENOTSUP, "loader: an iterable dataset has no restorable position");
    if (st->version != STOKE_LOADER_STATE_VERSION)
        return fail_l(l, STOKE_EINVAL, "loader state: version %u, expected %u", st->version,
                      STOKE_LOADER_STATE_VERSION);
    if (st->cursor > l->nbatches)
        return fail_l(l, STOKE_EINVAL,
                      "loader state: cursor %" PRIu64 " is past the %" PRIu64 " batches of an "
                      "epoch",
                      st->cursor, l->nbatches);
    return reposition(l, st->seed, st->epoch, st->cursor);
}

int stoke_loader_get_stats(const stoke_loader *l, stoke_loader_stats *out)
{
    if (!l || !out || out->size == 0)
        return STOKE_EINVAL;
    stoke_loader *m = (stoke_loader *)l;
    stoke_loader_stats s;
    memset(&s, 0, sizeof(s));
    s.size = sizeof(s);
    pthread_mutex_lock(&m->mu);
    s.samples = m->st_samples;
    s.batches = m->st_batches;
    s.bytes = m->st_bytes;
    s.pinned_batches = m->st_pinned;
    s.pageable_batches = m->st_pageable;
    s.device_copies = m->st_dcopies;
    s.device_bytes = m->st_dbytes;
    s.wait_s = (double)m->st_wait_ns / 1e9;
    s.wait_p50_s = (double)stoke__hist_quantile(&m->wait_hist, 0.50) / 1e9;
    s.wait_p99_s = (double)stoke__hist_quantile(&m->wait_hist, 0.99) / 1e9;
    s.worker_busy_s = (double)m->st_busy_ns / 1e9;
    pthread_mutex_unlock(&m->mu);
    s.buffers = (uint64_t)l->nbuf;
    s.buffer_bytes = l->buf_bytes;
    size_t n = out->size < sizeof(s) ? out->size : sizeof(s);
    uint32_t keep = out->size;
    memcpy(out, &s, n);
    out->size = keep;
    return STOKE_OK;
}

const char *stoke_loader_last_error(const stoke_loader *l)
{
    return l ? l->err : "";
}

const char *stoke_loader_pinned_backend(const stoke_loader *l)
{
    return l && l->pin_backend[0] && l->slots && l->slots[0].pinned ? l->pin_backend : NULL;
}

/* ---- batches ------------------------------------------------------------------------------ */

size_t stoke_batch_count(const stoke_batch *b)
{
    return b ? b->count : 0;
}

const uint64_t *stoke_batch_indices(const stoke_batch *b)
{
    return b ? b->indices : NULL;
}

uint64_t stoke_batch_seq(const stoke_batch *b)
{
    return b ? b->seq : 0;
}

uint64_t stoke_batch_epoch(const stoke_batch *b)
{
    return b ? b->epoch : 0;
}

int stoke_batch_num_fields(const stoke_batch *b)
{
    return b ? b->l->ds.nfields : 0;
}

static int field_ok(const stoke_batch *b, int f)
{
    return b && f >= 0 && f < b->l->ds.nfields;
}

void *stoke_batch_data(const stoke_batch *b, int field)
{
    if (!field_ok(b, field) || b->l->device_mode || !b->host)
        return NULL;
    return b->host->mem + b->l->off[field];
}

size_t stoke_batch_field_bytes(const stoke_batch *b, int field)
{
    if (!field_ok(b, field))
        return 0;
    return b->l->var ? b->bytes : b->count * b->l->fields[field].bytes;
}

const stoke_field *stoke_batch_field(const stoke_batch *b, int field)
{
    return field_ok(b, field) ? &b->l->fields[field] : NULL;
}

int stoke_batch_shape(const stoke_batch *b, int field, int64_t *shape)
{
    if (!field_ok(b, field) || !shape)
        return -1;
    const stoke_field *fd = &b->l->fields[field];
    shape[0] = (int64_t)b->count;
    for (int d = 0; d < fd->ndim; d++)
        shape[d + 1] = fd->shape[d];
    return fd->ndim + 1;
}

const uint64_t *stoke_batch_offsets(const stoke_batch *b)
{
    return b && b->l->var ? b->offsets : NULL;
}

int stoke_batch_dtype(const stoke_batch *b, int field)
{
    return field_ok(b, field) ? b->l->fields[field].dtype : -1;
}

int stoke_batch_is_pinned(const stoke_batch *b)
{
    return b ? b->pinned : 0;
}

stoke_device_buffer *stoke_batch_device_buffer(const stoke_batch *b)
{
    return b && b->l->device_mode ? b->dbuf : NULL;
}

size_t stoke_batch_device_offset(const stoke_batch *b, int field)
{
    return field_ok(b, field) ? b->l->off[field] : 0;
}

stoke_event *stoke_batch_device_event(const stoke_batch *b)
{
    return b && b->l->device_mode ? b->ev : NULL;
}

int stoke_batch_device_wait(stoke_batch *b)
{
    if (!b)
        return STOKE_EINVAL;
    if (!b->l->device_mode)
        return stoke__fail(STOKE_ESTATE, "batch: device transfer is off");
    return stoke_event_synchronize(b->ev);
}

int stoke_batch_device_read(stoke_batch *b, int field, void *dst)
{
    if (!field_ok(b, field) || !dst)
        return STOKE_EINVAL;
    stoke_loader *l = b->l;
    if (!l->device_mode)
        return stoke__fail(STOKE_ESTATE, "batch: device transfer is off");
    size_t n = stoke_batch_field_bytes(b, field);
    if (!n)
        return STOKE_OK;
    pthread_mutex_lock(&l->stream_mu);
    int rc = stoke_copy_d2h_async(dst, b->dbuf, l->off[field], n, l->stream);
    if (rc == STOKE_OK)
        rc = stoke_event_record(l->read_ev, l->stream);
    if (rc == STOKE_OK)
        rc = stoke_event_synchronize(l->read_ev);
    pthread_mutex_unlock(&l->stream_mu);
    return rc;
}

void stoke_batch_release(stoke_batch *b)
{
    if (!b)
        return;
    stoke_loader *l = b->l;
    pthread_mutex_lock(&l->mu);
    l->held--;
    recycle(l, b);
    pthread_cond_broadcast(&l->work_cv);
    pthread_cond_signal(&l->done_cv);
    pthread_mutex_unlock(&l->mu);
}
