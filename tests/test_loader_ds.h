/* An in-test map-style dataset for the loader tests: sample i has a "data" field of DS_BYTES
 * bytes, byte k = (i * 131 + k * 7 + 1) & 0xff, and a "label" field (i64) = i.  Hooks: one slow
 * sample that blocks on a gate, one failing sample, a worker_init counter and one worker whose
 * worker_init fails. */
#ifndef TEST_LOADER_DS_H
#define TEST_LOADER_DS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "stoke/stoke.h"
#include "testutil.h"

#define DS_BYTES 24
#define DS_NONE  UINT64_MAX

typedef struct tds {
    uint64_t n;
    uint64_t slow_index; /* get() of this index waits until tds_open_gate (or 20 s) */
    uint64_t fail_index; /* get() of this index fails with STOKE_EDATA */
    unsigned sleep_us;   /* every get() sleeps this long first (0: none) */
    atomic_int inits;    /* worker_init calls */
    int init_fail;       /* worker_init of worker init_fail - 1 fails with STOKE_EIO, after
                            sleeping init_fail_us (0: none fails); init_slow_only: it only
                            sleeps, and succeeds */
    unsigned init_fail_us;
    int init_slow_only;
    atomic_int gets;
    /* tds_get_scattered (the dataset's read): every call; those of 2 samples or more, the
     * samples they carried, the most in one call */
    atomic_int read_calls, scatter_calls, scatter_samples, scatter_max;
    const stoke_field *fields; /* the dataset's (for read()'s slots) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int gate_open;
} tds;

static inline unsigned char tds_byte(uint64_t i, size_t k)
{
    return (unsigned char)((i * 131u + k * 7u + 1u) & 0xffu);
}

static uint64_t tds_length(void *user)
{
    return ((tds *)user)->n;
}

static void tds_wait_gate(tds *t)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 20; /* safety net only: tests open the gate */
    pthread_mutex_lock(&t->mu);
    while (!t->gate_open)
        if (pthread_cond_timedwait(&t->cv, &t->mu, &ts) != 0)
            break;
    pthread_mutex_unlock(&t->mu);
}

static inline void tds_open_gate(tds *t)
{
    pthread_mutex_lock(&t->mu);
    t->gate_open = 1;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static int tds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                   char *msg, size_t msg_len)
{
    tds *t = user;
    atomic_fetch_add(&t->gets, 1);
    if (index == t->fail_index) {
        snprintf(msg, msg_len, "row %llu is corrupt", (unsigned long long)index);
        return STOKE_EDATA;
    }
    if (index == t->slow_index)
        tds_wait_gate(t);
    if (t->sleep_us) {
        struct timespec nap = {(time_t)(t->sleep_us / 1000000u),
                               (long)(t->sleep_us % 1000000u) * 1000};
        nanosleep(&nap, NULL);
    }
    unsigned char *d = dst[0];
    for (size_t k = 0; k < DS_BYTES; k++)
        d[k] = tds_byte(index, k);
    int64_t label = (int64_t)index;
    memcpy(dst[1], &label, sizeof(label));
    return STOKE_OK;
}

/* read() by tds_get sample by sample (its fail and slow hooks apply), counted. */
static inline int tds_get_scattered(void *user, const uint64_t *idx, size_t count,
                                    const stoke_slots *dst, int worker, char *msg, size_t msg_len,
                                    uint64_t *err_index)
{
    tds *t = user;
    atomic_fetch_add(&t->read_calls, 1);
    if (count >= 2) { /* batch size 1 (the group tests): a call for a group of batches */
        atomic_fetch_add(&t->scatter_calls, 1);
        atomic_fetch_add(&t->scatter_samples, (int)count);
    }
    int most = atomic_load(&t->scatter_max);
    while ((int)count > most && !atomic_compare_exchange_weak(&t->scatter_max, &most, (int)count))
        ;
    for (size_t j = 0; j < count; j++) {
        void *d[2];
        stoke_slots_sample(dst, 2, t->fields, j, d);
        int rc = tds_get(user, idx[j], d, NULL, worker, msg, msg_len);
        if (rc != STOKE_OK) {
            *err_index = idx[j];
            return rc;
        }
    }
    return STOKE_OK;
}

static int tds_worker_init(void *user, int worker, int num_workers)
{
    tds *t = user;
    (void)num_workers;
    atomic_fetch_add(&t->inits, 1);
    if (t->init_fail && worker == t->init_fail - 1) {
        struct timespec ts = {(time_t)(t->init_fail_us / 1000000u),
                              (long)(t->init_fail_us % 1000000u) * 1000};
        nanosleep(&ts, NULL);
        return t->init_slow_only ? STOKE_OK : STOKE_EIO;
    }
    return STOKE_OK;
}

/* Fills *ds with a dataset over *t of n samples. */
static inline void tds_make(tds *t, stoke_dataset *ds, uint64_t n)
{
    memset(t, 0, sizeof(*t));
    t->n = n;
    t->slow_index = DS_NONE;
    t->fail_index = DS_NONE;
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    memset(ds, 0, sizeof(*ds));
    ds->size = sizeof(*ds);
    ds->kind = STOKE_DATASET_MAP;
    snprintf(ds->name, sizeof(ds->name), "testds");
    ds->user = t;
    ds->nfields = 2;
    snprintf(TU_F(ds)[0].name, sizeof(TU_F(ds)[0].name), "data");
    TU_F(ds)[0].dtype = STOKE_DTYPE_U8;
    TU_F(ds)[0].itemsize = 1;
    TU_F(ds)[0].ndim = 1;
    TU_SHAPE(ds, 0)[0] = DS_BYTES;
    TU_F(ds)[0].bytes = DS_BYTES;
    snprintf(TU_F(ds)[1].name, sizeof(TU_F(ds)[1].name), "label");
    TU_F(ds)[1].dtype = STOKE_DTYPE_I64;
    TU_F(ds)[1].itemsize = 8;
    TU_F(ds)[1].ndim = 0;
    TU_F(ds)[1].bytes = 8;
    ds->length = tds_length;
    ds->get = tds_get;
    ds->worker_init = tds_worker_init;
    t->fields = ds->fields;
}

static inline void tds_free(tds *t)
{
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
}

/* Takes n batches from l, each STOKE_OK, and releases them (to move a loader along). */
static inline void tds_skip(stoke_loader *l, int n)
{
    for (int i = 0; i < n; i++) {
        stoke_batch *b = NULL;
        assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
        stoke_batch_release(b);
    }
}

/* 1 if the host data of batch b holds exactly the samples of its indices. */
static inline int tds_batch_ok(const stoke_batch *b)
{
    const unsigned char *d = stoke_batch_data(b, 0);
    const int64_t *lab = stoke_batch_data(b, 1);
    const uint64_t *idx = stoke_batch_indices(b);
    if (!d || !lab || !idx)
        return 0;
    for (size_t j = 0; j < stoke_batch_count(b); j++) {
        if ((uint64_t)lab[j] != idx[j])
            return 0;
        for (size_t k = 0; k < DS_BYTES; k++)
            if (d[j * DS_BYTES + k] != tds_byte(idx[j], k))
                return 0;
    }
    return 1;
}

/* Waits for the device copy of batch b (of at most 64 samples), then reads both fields back
 * from the device: they must hold the samples its indices name. */
static inline void tds_check_device_batch(stoke_batch *b)
{
    size_t n = stoke_batch_count(b);
    unsigned char data[64 * DS_BYTES];
    int64_t labels[64];
    assert_true(n <= 64);
    assert_int_equal(stoke_batch_device_wait(b), STOKE_OK);
    assert_int_equal(stoke_event_query(stoke_batch_device_event(b)), STOKE_OK);
    assert_int_equal(stoke_batch_device_read(b, 0, data), STOKE_OK);
    assert_int_equal(stoke_batch_device_read(b, 1, labels), STOKE_OK);
    const uint64_t *idx = stoke_batch_indices(b);
    for (size_t j = 0; j < n; j++) {
        if ((uint64_t)labels[j] != idx[j])
            fail_msg("batch %llu sample %zu: device label %lld, expected %llu",
                     (unsigned long long)stoke_batch_seq(b), j, (long long)labels[j],
                     (unsigned long long)idx[j]);
        for (size_t k = 0; k < DS_BYTES; k++)
            if (data[j * DS_BYTES + k] != tds_byte(idx[j], k))
                fail_msg("batch %llu sample %zu byte %zu differs on the device",
                         (unsigned long long)stoke_batch_seq(b), j, k);
    }
}

/* A consumer that holds device batches while their copies may still be queued: of every three
 * batches it releases two at once (so their staging slots and buffers are recycled while copies
 * are in flight) and keeps the third until two more kept ones arrived, then checks it on the
 * device (tds_check_device_batch) and releases it.  Zero-initialize; `nb` counts the batches. */
typedef struct tds_keeper {
    stoke_batch *kept[2];
    uint64_t nb, nkept;
} tds_keeper;

static inline void tds_keeper_add(tds_keeper *k, stoke_batch *b)
{
    if (k->nb++ % 3) {
        stoke_batch_release(b);
        return;
    }
    stoke_batch *old = k->kept[k->nkept % 2];
    if (old) {
        tds_check_device_batch(old);
        stoke_batch_release(old);
    }
    k->kept[k->nkept++ % 2] = b;
}

/* Checks and releases the batches still kept. */
static inline void tds_keeper_finish(tds_keeper *k)
{
    for (int i = 0; i < 2; i++) {
        if (k->kept[i]) {
            tds_check_device_batch(k->kept[i]);
            stoke_batch_release(k->kept[i]);
            k->kept[i] = NULL;
        }
    }
}

/* ---- an ITERABLE dataset: worker w of W yields the indices i < n with i % W == w, in increasing
 * order -- */

typedef struct itds {
    uint64_t n;
    uint64_t cursor[16]; /* per worker: touched only by that worker (or by reset, quiesced) */
    atomic_int resets;
    uint64_t last_reset_epoch;
} itds;

static inline int it_next(void *user, int worker, int num_workers, void *const dst[],
                          int64_t lens[], uint64_t *index, char *msg, size_t msg_len)
{
    itds *t = user;
    (void)lens, (void)msg, (void)msg_len;
    uint64_t shards = num_workers ? (uint64_t)num_workers : 1;
    uint64_t i = (uint64_t)worker + t->cursor[worker] * shards;
    if (i >= t->n)
        return STOKE_EEND;
    t->cursor[worker]++;
    unsigned char *d = dst[0];
    for (size_t k = 0; k < DS_BYTES; k++)
        d[k] = tds_byte(i, k);
    int64_t label = (int64_t)i;
    memcpy(dst[1], &label, sizeof(label));
    *index = i;
    return STOKE_OK;
}

static inline int it_reset(void *user, uint64_t epoch)
{
    itds *t = user;
    memset(t->cursor, 0, sizeof(t->cursor));
    t->last_reset_epoch = epoch;
    atomic_fetch_add(&t->resets, 1);
    return STOKE_OK;
}

static inline void it_make(itds *t, stoke_dataset *ds, uint64_t n)
{
    static tds dummy;
    tds_make(&dummy, ds, 0); /* the field layout */
    memset(t, 0, sizeof(*t));
    t->n = n;
    ds->kind = STOKE_DATASET_ITERABLE;
    ds->user = t;
    ds->length = NULL;
    ds->get = NULL;
    ds->worker_init = NULL;
    ds->next = it_next;
    ds->set_epoch = it_reset;
}

#endif
