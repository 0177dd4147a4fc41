/* Loader with ITERABLE datasets and variable-size (ragged, packed) samples. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "test_loader_ds.h"

/* One epoch: checks the round-robin layout; returns samples and fills seen[]. */
static uint64_t it_epoch(stoke_loader *l, int workers, size_t bs, unsigned char *seen)
{
    uint64_t shards = workers ? (uint64_t)workers : 1, n = 0, last_seq = 0, nb = 0;
    stoke_batch *b;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        assert_true(tds_batch_ok(b));
        uint64_t seq = stoke_batch_seq(b);
        if (nb++)
            assert_true(seq > last_seq);
        last_seq = seq;
        assert_true(stoke_batch_count(b) >= 1 && stoke_batch_count(b) <= bs);
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            uint64_t i = stoke_batch_indices(b)[j];
            assert_int_equal(i % shards, seq % shards); /* produced by worker seq % W */
            assert_int_equal(seen[i]++, 0);
            n++;
        }
        stoke_batch_release(b);
    }
    assert_int_equal(rc, STOKE_EEND);
    return n;
}

static void test_iterable(void **state)
{
    static const struct {
        uint64_t n;
        int workers;
        size_t bs;
    } cases[] = {
        {40, 2, 5},                        /* every share ends on a batch boundary */
        {43, 3, 4}, {10, 0, 3}, {5, 4, 8}, /* shares shorter than a batch; one worker has nothing */
        {0, 2, 4},
    };
    for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
        for (int drop = 0; drop < 2; drop++) {
            itds t;
            stoke_dataset ds;
            it_make(&t, &ds, cases[c].n);
            stoke_loader_opts o;
            stoke_loader_opts_init(&o);
            o.pin_memory = 0;
            o.batch_size = cases[c].bs;
            o.num_workers = cases[c].workers;
            o.drop_last = drop;
            o.persistent_workers = (int)(c & 1);
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            assert_int_equal(stoke_loader_num_batches(l), 0);
            uint64_t shards = cases[c].workers ? (uint64_t)cases[c].workers : 1, expect = 0;
            for (uint64_t w = 0; w < shards; w++) {
                uint64_t share = cases[c].n / shards + (w < cases[c].n % shards);
                expect += drop ? share / cases[c].bs * cases[c].bs : share;
            }
            for (int e = 0; e < 2; e++) {
                if (e) {
                    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
                    assert_int_equal(t.last_reset_epoch, 1);
                }
                unsigned char seen[64] = {0};
                assert_int_equal(it_epoch(l, cases[c].workers, cases[c].bs, seen), expect);
            }
            assert_int_equal(atomic_load(&t.resets), 2); /* create's and next_epoch's */
            stoke_loader_state st;
            assert_int_equal(stoke_loader_save_state(l, &st), STOKE_OK); /* (the epoch's end) */
            assert_int_equal(st.epoch, 1);
            stoke_loader_destroy(l);
        }
    }
}

static void test_iterable_rejects_samplers(void **state)
{
    itds t;
    stoke_dataset ds;
    it_make(&t, &ds, 10);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.pin_memory = 0;
    o.shuffle = 1;
    stoke_loader *l = NULL;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "iterable"));
    /* out of order and early destroy */
    o.shuffle = 0;
    o.in_order = 0;
    o.num_workers = 3;
    o.batch_size = 2;
    it_make(&t, &ds, 60);
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    tu_seen seen;
    tu_seen_init(&seen, 60);
    stoke_batch *b;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        for (size_t j = 0; j < stoke_batch_count(b); j++)
            tu_seen_add(&seen, stoke_batch_indices(b)[j]);
        stoke_batch_release(b);
    }
    tu_seen_check_all(&seen);
    tu_seen_free(&seen);
    assert_int_equal(stoke_loader_next_epoch(l), STOKE_OK);
    assert_int_equal(stoke_loader_next(l, &b), STOKE_OK);
    stoke_batch_release(b);
    stoke_loader_destroy(l);
}

/* ---- variable-size samples: sample i has i % 7 + 1 bytes ---------------------------------- */

typedef struct vds {
    uint64_t n;
    unsigned char *bytes; /* n * 7 */
    atomic_int gets;
} vds;

static size_t v_len(uint64_t i)
{
    return (size_t)(i % 7 + 1);
}

static uint64_t v_length(void *user)
{
    return ((vds *)user)->n;
}

/* Writes as much of the sample as the slot holds (lens[0] on entry), reports its length. */
static int v_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                 char *msg, size_t msg_len)
{
    vds *t = user;
    atomic_fetch_add(&t->gets, 1);
    size_t n = v_len(index), room = (size_t)lens[0];
    memcpy(dst[0], t->bytes + index * 7, n < room ? n : room);
    lens[0] = (int64_t)n;
    return STOKE_OK;
}

static void v_make(vds *t, stoke_dataset *ds, uint64_t n, size_t max)
{
    memset(t, 0, sizeof(*t));
    t->n = n;
    t->bytes = malloc(n * 7 + 1);
    for (uint64_t i = 0; i < n; i++)
        for (size_t k = 0; k < 7; k++)
            t->bytes[i * 7 + k] = tds_byte(i, k);
    memset(ds, 0, sizeof(*ds));
    ds->size = sizeof(*ds);
    ds->kind = STOKE_DATASET_MAP;
    snprintf(ds->name, sizeof(ds->name), "vards");
    ds->user = t;
    ds->nfields = 1;
    snprintf(TU_F(ds)[0].name, sizeof(TU_F(ds)[0].name), "bytes");
    TU_F(ds)[0].dtype = STOKE_DTYPE_RAW;
    TU_F(ds)[0].itemsize = 1;
    TU_F(ds)[0].ndim = 1;
    TU_SHAPE(ds, 0)[0] = STOKE_DIM_VAR;
    TU_F(ds)[0].max_len = (int64_t)max;
    TU_F(ds)[0].collate = STOKE_COLLATE_PACK;
    ds->length = v_length;
    ds->get = v_get;
}

static void check_var_batch(const stoke_batch *b, const unsigned char *data)
{
    const int64_t *off = stoke_batch_offsets(b, 0), *len = stoke_batch_lengths(b, 0);
    assert_non_null(off);
    assert_non_null(len);
    assert_int_equal(off[0], 0);
    for (size_t j = 0; j < stoke_batch_count(b); j++) {
        uint64_t i = stoke_batch_indices(b)[j];
        assert_int_equal(off[j + 1] - off[j], v_len(i));
        assert_int_equal(len[j], v_len(i));
        for (size_t k = 0; k < v_len(i); k++)
            assert_int_equal(data[off[j] + k], tds_byte(i, k));
    }
    assert_int_equal(stoke_batch_field_bytes(b, 0), off[stoke_batch_count(b)]);
}

static void test_map_var(void **state)
{
    for (int workers = 0; workers <= 2; workers += 2) {
        vds t;
        stoke_dataset ds;
        v_make(&t, &ds, 100, 7);
        stoke_loader_opts o;
        stoke_loader_opts_init(&o);
        o.pin_memory = 0;
        o.batch_size = 6;
        o.num_workers = workers;
        o.shuffle = 1;
        stoke_loader *l;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        stoke_batch *b;
        uint64_t n = 0, bytes = 0;
        while (stoke_loader_next(l, &b) == STOKE_OK) {
            check_var_batch(b, stoke_batch_data(b, 0));
            n += stoke_batch_count(b);
            bytes += stoke_batch_field_bytes(b, 0);
            stoke_batch_release(b);
        }
        assert_int_equal(n, 100);
        stoke_loader_stats st = {.size = sizeof(st)};
        stoke_loader_get_stats(l, &st);
        assert_int_equal(st.bytes, bytes);
        stoke_loader_destroy(l);
        assert_int_equal(atomic_load(&t.gets), 100);
        free(t.bytes);
    }
}

static void test_map_var_too_big_and_device(void **state)
{
    vds t;
    stoke_dataset ds;
    v_make(&t, &ds, 20, 3); /* sample 3 has 4 bytes > 3 */
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.pin_memory = 0;
    o.batch_size = 1;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    int rc;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK)
        stoke_batch_release(b);
    assert_int_equal(rc, STOKE_ELIMIT);
    assert_non_null(strstr(stoke_loader_last_error(l), "sample 3 "));
    stoke_loader_destroy(l);
    free(t.bytes);

    /* to the device: read back the packed bytes */
    tu_use_simdev();
    v_make(&t, &ds, 50, 7);
    o.batch_size = 8;
    o.num_workers = 2;
    o.pin_memory = 1;
    o.device = "simdev";
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    unsigned char buf[8 * 7];
    uint64_t n = 0;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        assert_int_equal(stoke_batch_device_wait(b), STOKE_OK);
        assert_int_equal(stoke_batch_device_read(b, 0, buf), STOKE_OK);
        check_var_batch(b, buf);
        n += stoke_batch_count(b);
        stoke_batch_release(b);
    }
    assert_int_equal(n, 50);
    stoke_loader_destroy(l);
    free(t.bytes);
    tu_use_none();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_iterable),
        cmocka_unit_test(test_iterable_rejects_samplers),
        cmocka_unit_test(test_map_var),
        cmocka_unit_test(test_map_var_too_big_and_device),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
