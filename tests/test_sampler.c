/* Samplers: permutation, subset, weighted, distributed shards. */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "stoke/stoke.h"

static void test_permute_is_bijection(void **state)
{
    static const uint64_t sizes[] = {1, 2, 3, 5, 16, 17, 100, 1000, 4097};
    for (size_t s = 0; s < sizeof(sizes) / sizeof(sizes[0]); s++) {
        uint64_t n = sizes[s];
        unsigned char *seen = calloc(n, 1);
        assert_non_null(seen);
        for (uint64_t x = 0; x < n; x++) {
            uint64_t y = stoke_permute(x, n, 12345);
            assert_true(y < n);
            assert_int_equal(seen[y], 0);
            seen[y] = 1;
        }
        free(seen);
    }
}

static stoke_sampler *make(int kind, uint64_t n)
{
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.kind = kind;
    stoke_sampler *s = NULL;
    assert_int_equal(stoke_sampler_create(&o, n, &s), STOKE_OK);
    return s;
}

static void test_sequential_and_random(void **state)
{
    stoke_sampler *seq = make(STOKE_SAMPLER_SEQUENTIAL, 50);
    stoke_sampler *rnd = make(STOKE_SAMPLER_RANDOM, 1000);
    assert_int_equal(stoke_sampler_length(seq), 50);
    uint64_t v;
    for (uint64_t p = 0; p < 50; p++) {
        assert_int_equal(stoke_sampler_index(seq, 7, 3, p, &v), STOKE_OK);
        assert_int_equal(v, p);
    }
    assert_int_equal(stoke_sampler_index(seq, 7, 3, 50, &v), STOKE_ERANGE);
    /* Random: every index once per epoch; epochs and seeds differ; same key, same order. */
    uint64_t a[1000], b[1000], c[1000];
    for (uint64_t p = 0; p < 1000; p++) {
        stoke_sampler_index(rnd, 1, 0, p, &a[p]);
        stoke_sampler_index(rnd, 1, 1, p, &b[p]);
        stoke_sampler_index(rnd, 2, 0, p, &c[p]);
        uint64_t again;
        stoke_sampler_index(rnd, 1, 0, p, &again);
        assert_int_equal(again, a[p]);
    }
    int same_ab = 0, same_ac = 0, moved = 0;
    unsigned char seen[1000] = {0};
    for (int p = 0; p < 1000; p++) {
        same_ab += a[p] == b[p];
        same_ac += a[p] == c[p];
        moved += a[p] != (uint64_t)p;
        assert_int_equal(seen[a[p]], 0);
        seen[a[p]] = 1;
    }
    assert_true(same_ab < 50);
    assert_true(same_ac < 50);
    assert_true(moved > 900);
    stoke_sampler_destroy(seq);
    stoke_sampler_destroy(rnd);
}

static void test_subset(void **state)
{
    uint64_t idx[] = {9, 3, 7, 1};
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.kind = STOKE_SAMPLER_SUBSET;
    o.indices = idx;
    o.num_indices = 4;
    stoke_sampler *s;
    assert_int_equal(stoke_sampler_create(&o, 10, &s), STOKE_OK);
    uint64_t v;
    for (uint64_t p = 0; p < 4; p++) {
        stoke_sampler_index(s, 0, 0, p, &v);
        assert_int_equal(v, idx[p]);
    }
    stoke_sampler_destroy(s);
    o.shuffle = 1;
    assert_int_equal(stoke_sampler_create(&o, 10, &s), STOKE_OK);
    int times[10] = {0}; /* a permutation of the subset: each of its indices exactly once */
    for (uint64_t p = 0; p < 4; p++) {
        assert_int_equal(stoke_sampler_index(s, 5, 2, p, &v), STOKE_OK);
        assert_true(v < 10);
        times[v]++;
    }
    for (int i = 0; i < 10; i++)
        assert_int_equal(times[i], i == 9 || i == 3 || i == 7 || i == 1);
    stoke_sampler_destroy(s);
    idx[2] = 10; /* out of range */
    o.shuffle = 0;
    assert_int_equal(stoke_sampler_create(&o, 10, &s), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "out of range"));
}

static void test_weighted(void **state)
{
    double w[4] = {0, 1, 0, 3};
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.kind = STOKE_SAMPLER_WEIGHTED;
    o.weights = w;
    o.num_weights = 4;
    o.num_samples = 4000;
    stoke_sampler *s;
    assert_int_equal(stoke_sampler_create(&o, 4, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_length(s), 4000);
    int count[4] = {0};
    for (uint64_t p = 0; p < 4000; p++) {
        uint64_t v, again;
        assert_int_equal(stoke_sampler_index(s, 3, 1, p, &v), STOKE_OK);
        stoke_sampler_index(s, 3, 1, p, &again);
        assert_int_equal(v, again);
        count[v]++;
    }
    assert_int_equal(count[0], 0);
    assert_int_equal(count[2], 0);
    assert_true(count[3] > 2700 && count[3] < 3300); /* 3000 expected */
    stoke_sampler_destroy(s);
    w[1] = -1;
    assert_int_equal(stoke_sampler_create(&o, 4, &s), STOKE_EINVAL);
    w[1] = 0;
    w[3] = 0;
    assert_int_equal(stoke_sampler_create(&o, 4, &s), STOKE_EINVAL);
}

/* Every rank of world W: lengths equal; union covers [0,n); pad repeats from the start; drop
 * truncates. */
static void check_shards(int kind, uint64_t n, uint64_t world, int drop)
{
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.kind = kind;
    o.distributed = 1;
    o.world_size = (int64_t)world;
    o.drop_last = drop;
    unsigned *seen = calloc(n, sizeof(unsigned));
    assert_non_null(seen);
    uint64_t total = 0, len0 = 0;
    for (uint64_t r = 0; r < world; r++) {
        o.rank = (int64_t)r;
        stoke_sampler *s;
        assert_int_equal(stoke_sampler_create(&o, n, &s), STOKE_OK);
        uint64_t len = stoke_sampler_length(s);
        if (r == 0)
            len0 = len;
        assert_int_equal(len, len0);
        assert_int_equal(len, drop ? n / world : (n + world - 1) / world);
        for (uint64_t p = 0; p < len; p++) {
            uint64_t v;
            assert_int_equal(stoke_sampler_index(s, 11, 4, p, &v), STOKE_OK);
            assert_true(v < n);
            seen[v]++;
            total++;
        }
        stoke_sampler_destroy(s);
    }
    uint64_t dup = 0, missing = 0;
    for (uint64_t i = 0; i < n; i++) {
        if (seen[i] == 0)
            missing++;
        if (seen[i] > 1)
            dup += seen[i] - 1;
    }
    if (drop) {
        assert_int_equal(dup, 0);             /* disjoint */
        assert_int_equal(missing, n % world); /* only the tail dropped */
    } else {
        assert_int_equal(missing, 0);         /* complete */
        assert_int_equal(dup, total - n);     /* only the padding repeats */
        assert_true(dup < world);
    }
    free(seen);
}

static void test_distributed(void **state)
{
    static const uint64_t worlds[] = {1, 2, 3, 4, 7, 8};
    for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]); w++) {
        for (int drop = 0; drop < 2; drop++) {
            check_shards(STOKE_SAMPLER_SEQUENTIAL, 103, worlds[w], drop);
            check_shards(STOKE_SAMPLER_RANDOM, 103, worlds[w], drop);
            check_shards(STOKE_SAMPLER_RANDOM, 96, worlds[w], drop);
        }
    }
    /* padding wraps around more than once when the world is larger than the dataset */
    check_shards(STOKE_SAMPLER_SEQUENTIAL, 3, 8, 0);
}

static void test_distributed_env(void **state)
{
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.distributed = 1;
    stoke_sampler *s;
    tu_env("RANK", NULL);
    tu_env("WORLD_SIZE", NULL);
    tu_env("OMPI_COMM_WORLD_RANK", "1");
    tu_env("OMPI_COMM_WORLD_SIZE", "4");
    tu_env("SLURM_PROCID", "2");
    tu_env("SLURM_NTASKS", "3");
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_rank(s), 1);
    assert_int_equal(stoke_sampler_world_size(s), 4);
    stoke_sampler_destroy(s);
    tu_env("RANK", "3"); /* torchrun first */
    tu_env("WORLD_SIZE", "5");
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_rank(s), 3);
    assert_int_equal(stoke_sampler_world_size(s), 5);
    uint64_t v;
    stoke_sampler_index(s, 0, 0, 2, &v);
    assert_int_equal(v, 3 + 2 * 5);
    stoke_sampler_destroy(s);
    o.rank = 0; /* the API wins */
    o.world_size = 2;
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_rank(s), 0);
    assert_int_equal(stoke_sampler_world_size(s), 2);
    stoke_sampler_destroy(s);
    o.rank = -1;
    o.world_size = 0;
    tu_env("RANK", "5"); /* rank >= world */
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_EINVAL);
    tu_env("RANK", "x"); /* not a number: an error, not ignored (the whole dataset per rank) */
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "RANK='x' is not a non-negative integer"));
    tu_env("RANK", "1");
    tu_env("WORLD_SIZE", "-2");
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "WORLD_SIZE='-2' is not"));
    tu_env("WORLD_SIZE", " 4\n"); /* spaces around it, as Python's int() takes it */
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_world_size(s), 4);
    assert_int_equal(stoke_sampler_length(s), 25);
    stoke_sampler_destroy(s);
    /* a world near 2^64: one position per rank (DistributedSampler's padding), not 0 from
     * an overflowed (len + world - 1) / world */
    tu_env("WORLD_SIZE", "18446744073709551615");
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_length(s), 1);
    stoke_sampler_destroy(s);
    tu_env("WORLD_SIZE", NULL); /* one of the pair: an error, not the next launcher's pair */
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "must both be set (only RANK is)"));
    tu_env("RANK", NULL);
    tu_env("WORLD_SIZE", NULL);
    tu_env("OMPI_COMM_WORLD_RANK", NULL);
    tu_env("OMPI_COMM_WORLD_SIZE", NULL);
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_rank(s), 2);
    assert_int_equal(stoke_sampler_world_size(s), 3);
    stoke_sampler_destroy(s);
    tu_env("SLURM_PROCID", NULL);
    tu_env("SLURM_NTASKS", NULL);
    /* none at all: rank 0 of 1 (the whole dataset), said once a process at WARN */
    tu_log_capture();
    tu_log_clear();
    for (int i = 0; i < 2; i++) {
        assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_OK);
        assert_int_equal(stoke_sampler_world_size(s), 1);
        stoke_sampler_destroy(s);
    }
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "this process loads the whole dataset"), 1);
    stoke_log_set_callback(NULL, NULL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_permute_is_bijection),
        cmocka_unit_test(test_sequential_and_random),
        cmocka_unit_test(test_subset),
        cmocka_unit_test(test_weighted),
        cmocka_unit_test(test_distributed),
        cmocka_unit_test(test_distributed_env),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
