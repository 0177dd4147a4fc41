/* Samplers, a batch at once: stoke__sampler_fill against stoke_sampler_index for every kind, and
 * the block shuffle (bijection, determinism, locality). */
#include "testutil.h"

#include <stdlib.h>
#include <string.h>

#include "loader/loader_internal.h"
#include "stoke/stoke.h"
#include "test_loader_ds.h"

#define BIG_N ((1ull << 20) + 7)

static uint64_t fnv_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        h ^= (v >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    return h;
}

/* One sampler configuration. */
typedef struct cfg {
    int kind;
    int shuffle;             /* SUBSET */
    uint64_t brows, bwin;    /* BLOCK */
    int dist, drop;
    int64_t rank, world;
} cfg;

/* A sampler over n positions (SUBSET: n entries of a dataset of n + 5; WEIGHTED: n weights and
 * n draws).  The caller frees *keep after destroying the sampler. */
static stoke_sampler *make(const cfg *c, uint64_t n, void **keep)
{
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    o.kind = c->kind;
    uint64_t len = n;
    *keep = NULL;
    if (c->kind == STOKE_SAMPLER_SUBSET) {
        uint64_t *idx = malloc((n ? n : 1) * sizeof(*idx));
        assert_non_null(idx);
        len = n + 5;
        for (uint64_t i = 0; i < n; i++)
            idx[i] = (i * 7 + 3) % len;
        o.indices = idx;
        o.num_indices = n;
        o.shuffle = c->shuffle;
        *keep = idx;
    } else if (c->kind == STOKE_SAMPLER_WEIGHTED) {
        double *w = malloc(n * sizeof(*w));
        assert_non_null(w);
        for (uint64_t i = 0; i < n; i++)
            w[i] = (double)((i + 1) % 5) + (i % 3 ? 0.5 : 0.0); /* some 0 */
        o.weights = w;
        o.num_weights = n;
        *keep = w;
    }
    o.block_rows = c->brows;
    o.block_window = c->bwin;
    o.distributed = c->dist;
    o.rank = c->rank;
    o.world_size = c->world;
    o.drop_last = c->drop;
    stoke_sampler *s = NULL;
    assert_int_equal(stoke_sampler_create(&o, len, &s), STOKE_OK);
    return s;
}

/* When set, the fills below tabulate their epoch's permutation first (where it has one), as a
 * loader's threads do. */
static int tabulate;
static uint16_t tab[STOKE__FEISTEL_TAB_LEN];

static void epoch_init(stoke__sampler_epoch *e, const stoke_sampler *s, uint64_t seed,
                       uint64_t epoch)
{
    assert_int_equal(stoke__sampler_epoch_init(e, s, seed, epoch), STOKE_OK);
    if (tabulate)
        (void)stoke__sampler_epoch_tabulate(e, tab, STOKE__ARRAY_LEN(tab));
}

/* The per-sample order of a whole epoch (malloc'd). */
static uint64_t *order_by_index(const stoke_sampler *s, uint64_t seed, uint64_t epoch)
{
    uint64_t len = stoke_sampler_length(s);
    uint64_t *v = malloc((len ? len : 1) * sizeof(*v));
    assert_non_null(v);
    int bad = 0;
    for (uint64_t p = 0; p < len; p++)
        bad |= stoke_sampler_index(s, seed, epoch, p, &v[p]) != STOKE_OK;
    assert_false(bad);
    return v;
}

/* The same, filled in batches of `bs` (the last one short). */
static uint64_t *order_by_fill(const stoke_sampler *s, uint64_t seed, uint64_t epoch, size_t bs)
{
    uint64_t len = stoke_sampler_length(s);
    uint64_t *v = malloc((len ? len : 1) * sizeof(*v));
    assert_non_null(v);
    stoke__sampler_epoch e;
    epoch_init(&e, s, seed, epoch);
    for (uint64_t p = 0; p < len; p += bs) {
        size_t c = len - p < bs ? (size_t)(len - p) : bs;
        assert_int_equal(stoke__sampler_fill(s, &e, p, c, v + p), STOKE_OK);
    }
    return v;
}

static uint64_t order_hash(const uint64_t *v, uint64_t len)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (uint64_t p = 0; p < len; p++)
        h = fnv_u64(h, v[p]);
    return h;
}

/* fill(pos0, count) equals index at each of those positions. */
static void check_range(const stoke_sampler *s, uint64_t seed, uint64_t epoch, uint64_t pos0,
                        size_t count)
{
    uint64_t *v = malloc((count ? count : 1) * sizeof(*v));
    assert_non_null(v);
    stoke__sampler_epoch e;
    epoch_init(&e, s, seed, epoch);
    assert_int_equal(stoke__sampler_fill(s, &e, pos0, count, v), STOKE_OK);
    for (size_t i = 0; i < count; i++) {
        uint64_t want = 0;
        assert_int_equal(stoke_sampler_index(s, seed, epoch, pos0 + i, &want), STOKE_OK);
        if (v[i] != want)
            fail_msg("position %llu: fill gave %llu, index %llu", (unsigned long long)(pos0 + i),
                     (unsigned long long)v[i], (unsigned long long)want);
    }
    free(v);
}

/* Whole epochs (small n) in several batch sizes, or chosen ranges (large n). */
static void check_cfg(const cfg *c, uint64_t n)
{
    void *keep;
    stoke_sampler *s = make(c, n, &keep);
    uint64_t len = stoke_sampler_length(s);
    if (n <= 1000) {
        uint64_t *ref = order_by_index(s, 17, 2);
        static const size_t sizes[] = {1, 2, 3, 7, 64, 1000, 1024};
        for (size_t k = 0; k < STOKE__ARRAY_LEN(sizes); k++) {
            uint64_t *got = order_by_fill(s, 17, 2, sizes[k]);
            assert_memory_equal(got, ref, len * sizeof(*ref));
            free(got);
        }
        free(ref);
    } else {
        check_range(s, 17, 2, 0, 300);
        check_range(s, 17, 2, len / 2 - 150, 300);
        check_range(s, 17, 2, len / 3 + 1, 1);
        check_range(s, 17, 2, len - 300, 300); /* ends exactly at the end */
    }
    stoke_sampler_destroy(s);
    free(keep);
}

static const cfg kinds[] = {
    {.kind = STOKE_SAMPLER_SEQUENTIAL},
    {.kind = STOKE_SAMPLER_RANDOM},
    {.kind = STOKE_SAMPLER_SUBSET},
    {.kind = STOKE_SAMPLER_SUBSET, .shuffle = 1},
    {.kind = STOKE_SAMPLER_WEIGHTED},
    {.kind = STOKE_SAMPLER_BLOCK},
    {.kind = STOKE_SAMPLER_BLOCK, .brows = 3, .bwin = 2},
    {.kind = STOKE_SAMPLER_BLOCK, .brows = 64, .bwin = 5},
};

static void test_fill_equals_index(void **state)
{
    static const uint64_t sizes[] = {1, 2, 3, 1000, BIG_N};
    /* Not distributed; then ranks of 3 and of 7 (more ranks than some datasets have samples),
     * padded and truncated. */
    static const int64_t ranks[][2] = {{-2, 0}, {0, 3}, {1, 3}, {2, 3}, {4, 7}, {6, 7}};
    for (size_t k = 0; k < STOKE__ARRAY_LEN(kinds); k++)
        for (size_t z = 0; z < STOKE__ARRAY_LEN(sizes); z++)
            for (size_t r = 0; r < STOKE__ARRAY_LEN(ranks); r++)
                for (int drop = 0; drop < 2; drop++) {
                    cfg c = kinds[k];
                    if (ranks[r][0] >= 0) {
                        c.dist = 1;
                        c.rank = ranks[r][0];
                        c.world = ranks[r][1];
                        c.drop = drop;
                    } else if (drop) {
                        continue;
                    }
                    if (c.dist && c.drop && sizes[z] < (uint64_t)c.world)
                        continue; /* no positions at all: covered by the ERANGE test */
                    if (sizes[z] == BIG_N && r != 0 && r != 2)
                        continue; /* one rank is enough at that size (and it is slow) */
                    check_cfg(&c, sizes[z]);
                }
}

/* The batch walk (sampler.c, feistel_walk_all), with and without the table, gives the
 * per-sample indices: whole RANDOM epochs of sizes with much cycle walking (a domain up to 4n)
 * and with little (just below a power of four), in batches around its chunk of 256 (the sweeps
 * of one chunk, the chunk after it, a short last one). */
static void test_fill_walk_equals_index(void **state)
{
    (void)state;
    static const uint64_t sizes[] = {
        2, 3, 5, 17, 63, 100, 1000, 4097, 100003, (1u << 18) + 1, (1u << 20) - 3};
    static const size_t batches[] = {1, 2, 16, 64, 255, 256, 257, 511, 1000};
    stoke__feistel_simd = 0; /* fills without the table walk too (not the AVX2 lanes) */
    for (int with = 0; with <= 1; with++) {
        tabulate = with;
        for (size_t z = 0; z < STOKE__ARRAY_LEN(sizes); z++) {
            cfg c = {.kind = STOKE_SAMPLER_RANDOM};
            void *keep;
            stoke_sampler *s = make(&c, sizes[z], &keep);
            uint64_t *ref = order_by_index(s, 5, 1);
            for (size_t k = 0; k < STOKE__ARRAY_LEN(batches); k++) {
                if (sizes[z] > 5000 && batches[k] != 1 && batches[k] != 257)
                    continue; /* the big sizes: a walk of one, and chunks with a short last */
                uint64_t *a = order_by_fill(s, 5, 1, batches[k]);
                for (uint64_t i = 0; i < sizes[z]; i++)
                    if (a[i] != ref[i])
                        fail_msg("n %llu, batch %zu, table %d, position %llu: fill %llu, index "
                                 "%llu",
                                 (unsigned long long)sizes[z], batches[k], with,
                                 (unsigned long long)i, (unsigned long long)a[i],
                                 (unsigned long long)ref[i]);
                free(a);
            }
            free(ref);
            stoke_sampler_destroy(s);
            free(keep);
        }
    }
    tabulate = 0;
    stoke__feistel_simd = 1;
}

/* The AVX2 lanes (fills of 16 or more without the table, where the build and the CPU have AVX2)
 * give the walk's indices: whole RANDOM epochs of sizes around the lane count and with much
 * cycle walking, in batches around one and two groups of lanes (the refill, its last sweep and
 * the groups after it); then every kind of test_fill_equals_index both ways. */
static void test_fill_avx2_equals_walk(void **state)
{
    (void)state;
    stoke__feistel_simd = 1;
    if (!stoke__feistel_simd_in_use())
        print_message("note: no AVX2 lanes on this build and CPU: the walk alone\n");
    static const uint64_t sizes[] = {
        2, 5, 8, 9, 15, 16, 17, 63, 65, 100, 4097, 100003, (1u << 18) + 1};
    static const size_t batches[] = {1000, 16, 17, 31, 32, 33, 47, 48, 49, 256};
    for (size_t z = 0; z < STOKE__ARRAY_LEN(sizes); z++) {
        cfg c = {.kind = STOKE_SAMPLER_RANDOM};
        void *keep;
        stoke_sampler *s = make(&c, sizes[z], &keep);
        stoke__feistel_simd = 0;
        uint64_t *ref = order_by_fill(s, 5, 1, 1000);
        stoke__feistel_simd = 1;
        for (size_t k = 0; k < STOKE__ARRAY_LEN(batches); k++) {
            if (sizes[z] > 5000 && k > 0 && batches[k] != 256)
                continue; /* the big sizes: the two batch sizes that matter for speed */
            uint64_t *a = order_by_fill(s, 5, 1, batches[k]);
            for (uint64_t i = 0; i < sizes[z]; i++)
                if (a[i] != ref[i])
                    fail_msg("n %llu, batch %zu, position %llu: lanes %llu, walk %llu",
                             (unsigned long long)sizes[z], batches[k], (unsigned long long)i,
                             (unsigned long long)a[i], (unsigned long long)ref[i]);
            free(a);
        }
        free(ref);
        stoke_sampler_destroy(s);
        free(keep);
    }
    for (int way = 0; way <= 1; way++) {
        stoke__feistel_simd = way;
        test_fill_equals_index(NULL);
    }
    stoke__feistel_simd = 1;
}

static void test_golden_orders(void **state);

/* A tabulated permutation (stoke__sampler_epoch_tabulate, what a loader's threads fill from)
 * gives the same indices: which contexts get a table, then every kind and size of
 * test_fill_equals_index, batches of several sizes over much cycle walking, the largest
 * tabulated size (2^24: 12 bits per half) and the golden orders, all tabulated. */
static void test_fill_table_equals_index(void **state)
{
    static const struct {
        cfg c;
        uint64_t n;
        int want;
    } who[] = {
        {{.kind = STOKE_SAMPLER_RANDOM}, 1000, 1},
        {{.kind = STOKE_SAMPLER_RANDOM}, 1ull << 24, 1},
        {{.kind = STOKE_SAMPLER_RANDOM}, (1ull << 24) + 1, 0}, /* 13 bits per half */
        {{.kind = STOKE_SAMPLER_RANDOM}, 1, 0},                /* no network */
        {{.kind = STOKE_SAMPLER_SUBSET, .shuffle = 1}, 1000, 1},
        {{.kind = STOKE_SAMPLER_SUBSET}, 1000, 0},
        {{.kind = STOKE_SAMPLER_BLOCK, .brows = 3, .bwin = 2}, 1000, 1},
        {{.kind = STOKE_SAMPLER_SEQUENTIAL}, 1000, 0},
        {{.kind = STOKE_SAMPLER_WEIGHTED}, 1000, 0},
    };
    for (size_t k = 0; k < STOKE__ARRAY_LEN(who); k++) {
        void *keep;
        stoke_sampler *s = make(&who[k].c, who[k].n, &keep);
        stoke__sampler_epoch e, before;
        assert_int_equal(stoke__sampler_epoch_init(&e, s, 3, 4), STOKE_OK);
        before = e;
        /* a table too short for it is refused, and the context is left as it was */
        assert_int_equal(stoke__sampler_epoch_tabulate(&e, tab, 6), 0);
        assert_memory_equal(&e, &before, sizeof(e));
        assert_int_equal(stoke__sampler_epoch_tabulate(&e, tab, STOKE__ARRAY_LEN(tab)),
                         who[k].want);
        assert_true(e.perm.tab == (who[k].want ? tab : NULL));
        stoke_sampler_destroy(s);
        free(keep);
    }
    assert_int_equal(stoke__sampler_epoch_tabulate(NULL, tab, STOKE__ARRAY_LEN(tab)), 0);

    tabulate = 1;
    test_fill_equals_index(NULL);
    static const uint64_t sizes[] = {2, 9, 17, 100003, (1u << 18) + 1, 1u << 24};
    static const size_t batches[] = {1, 7, 8, 15, 16, 17, 63, 64, 65, 1000};
    for (size_t z = 0; z < STOKE__ARRAY_LEN(sizes); z++) {
        cfg c = {.kind = STOKE_SAMPLER_RANDOM};
        void *keep;
        stoke_sampler *s = make(&c, sizes[z], &keep);
        for (size_t k = 0; k < STOKE__ARRAY_LEN(batches); k++) {
            size_t b = batches[k] < sizes[z] ? batches[k] : (size_t)sizes[z];
            check_range(s, 8, 1, 0, b);
            check_range(s, 8, 1, sizes[z] / 2, b < sizes[z] / 2 ? b : 1);
            check_range(s, 8, 1, sizes[z] - b, b);
        }
        stoke_sampler_destroy(s);
        free(keep);
    }
    test_golden_orders(NULL);
    tabulate = 0;
}

/* Whole epochs filled per batch hash as the per-sample orders do (RANDOM over 2^20 + 7 is in
 * test_golden_orders). */
static void test_full_epoch_hash(void **state)
{
    static const struct {
        cfg c;
        uint64_t n;
    } big[] = {
        {{.kind = STOKE_SAMPLER_BLOCK, .brows = 1000, .bwin = 8}, BIG_N},
        {{.kind = STOKE_SAMPLER_RANDOM, .dist = 1, .rank = 1, .world = 3}, 100003},
        {{.kind = STOKE_SAMPLER_BLOCK, .brows = 7, .bwin = 3, .dist = 1, .rank = 2, .world = 5,
          .drop = 1},
         100003},
    };
    for (size_t k = 0; k < STOKE__ARRAY_LEN(big); k++) {
        void *keep;
        stoke_sampler *s = make(&big[k].c, big[k].n, &keep);
        uint64_t len = stoke_sampler_length(s);
        uint64_t *a = order_by_index(s, 42, 3), *b = order_by_fill(s, 42, 3, 1024);
        assert_int_equal(order_hash(a, len), order_hash(b, len));
        free(a);
        free(b);
        stoke_sampler_destroy(s);
        free(keep);
    }
}

/* Orders computed by the per-sample code before the batch path existed: the permutations must
 * never change (saved positions and published order hashes depend on them). */
static void test_golden_orders(void **state)
{
    static const struct {
        cfg c;
        uint64_t n, seed, epoch, hash;
    } g[] = {
        {{.kind = STOKE_SAMPLER_RANDOM}, 1000, 1, 0, 0x9d8a9ff4535b90f9ull},
        {{.kind = STOKE_SAMPLER_RANDOM}, BIG_N, 42, 3, 0xde5d32ffcace4e9aull},
        {{.kind = STOKE_SAMPLER_RANDOM, .dist = 1, .rank = 2, .world = 3}, 1001, 5, 1,
         0x887afc19b0d5c201ull},
        {{.kind = STOKE_SAMPLER_RANDOM, .dist = 1, .rank = 2, .world = 3, .drop = 1}, 1001, 5, 1,
         0x929427122083107cull},
    };
    for (size_t k = 0; k < STOKE__ARRAY_LEN(g); k++) {
        void *keep;
        stoke_sampler *s = make(&g[k].c, g[k].n, &keep);
        uint64_t len = stoke_sampler_length(s);
        uint64_t *a = order_by_index(s, g[k].seed, g[k].epoch);
        uint64_t *b = order_by_fill(s, g[k].seed, g[k].epoch, 100);
        assert_int_equal(order_hash(a, len), g[k].hash);
        assert_int_equal(order_hash(b, len), g[k].hash);
        free(a);
        free(b);
        stoke_sampler_destroy(s);
        free(keep);
    }
    /* SUBSET (shuffled) and WEIGHTED, built as they were then. */
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    uint64_t idx[100];
    for (int i = 0; i < 100; i++)
        idx[i] = (uint64_t)(i * 37) % 211;
    o.kind = STOKE_SAMPLER_SUBSET;
    o.indices = idx;
    o.num_indices = 100;
    o.shuffle = 1;
    stoke_sampler *s = NULL;
    assert_int_equal(stoke_sampler_create(&o, 211, &s), STOKE_OK);
    uint64_t *v = order_by_fill(s, 9, 2, 30);
    assert_int_equal(order_hash(v, 100), 0xeb51075e51c6a098ull);
    free(v);
    stoke_sampler_destroy(s);
    stoke_sampler_opts_init(&o);
    double w[50];
    for (int i = 0; i < 50; i++)
        w[i] = i % 7;
    o.kind = STOKE_SAMPLER_WEIGHTED;
    o.weights = w;
    o.num_weights = 50;
    o.num_samples = 500;
    assert_int_equal(stoke_sampler_create(&o, 50, &s), STOKE_OK);
    v = order_by_fill(s, 11, 4, 64);
    assert_int_equal(order_hash(v, 500), 0x170b042b02e36c60ull);
    free(v);
    stoke_sampler_destroy(s);
}

static void test_fill_errors(void **state)
{
    for (size_t k = 0; k < STOKE__ARRAY_LEN(kinds); k++) {
        void *keep;
        stoke_sampler *s = make(&kinds[k], 10, &keep);
        stoke__sampler_epoch e;
        assert_int_equal(stoke__sampler_epoch_init(&e, s, 1, 1), STOKE_OK);
        uint64_t v[12];
        for (int i = 0; i < 12; i++)
            v[i] = 777;
        assert_int_equal(stoke__sampler_fill(s, &e, 5, 6, v), STOKE_ERANGE);
        assert_int_equal(stoke__sampler_fill(s, &e, 11, 0, v), STOKE_ERANGE);
        assert_int_equal(stoke__sampler_fill(s, &e, 1, SIZE_MAX, v), STOKE_ERANGE);
        assert_int_equal(stoke__sampler_fill(s, &e, UINT64_MAX, 2, v), STOKE_ERANGE);
        for (int i = 0; i < 12; i++)
            assert_int_equal(v[i], 777); /* nothing written */
        assert_int_equal(stoke__sampler_fill(s, &e, 10, 0, v), STOKE_OK);
        assert_int_equal(stoke__sampler_fill(s, &e, 0, 10, v), STOKE_OK);
        assert_int_equal(v[10], 777);
        assert_int_equal(stoke__sampler_fill(NULL, &e, 0, 1, v), STOKE_EINVAL);
        assert_int_equal(stoke__sampler_fill(s, NULL, 0, 1, v), STOKE_EINVAL);
        assert_int_equal(stoke__sampler_fill(s, &e, 0, 1, NULL), STOKE_EINVAL);
        assert_int_equal(stoke__sampler_epoch_init(NULL, s, 1, 1), STOKE_EINVAL);
        assert_int_equal(stoke__sampler_epoch_init(&e, NULL, 1, 1), STOKE_EINVAL);
        /* A context made for another sampler is refused. */
        void *keep2;
        stoke_sampler *s2 = make(&kinds[k], 10, &keep2);
        assert_int_equal(stoke__sampler_fill(s2, &e, 0, 1, v), STOKE_EINVAL);
        stoke_sampler_destroy(s2);
        free(keep2);
        stoke_sampler_destroy(s);
        free(keep);
    }
    /* An empty epoch: a distributed, truncated sampler with fewer samples than ranks. */
    cfg c = {.kind = STOKE_SAMPLER_BLOCK, .dist = 1, .rank = 1, .world = 4, .drop = 1};
    void *keep;
    stoke_sampler *s = make(&c, 3, &keep);
    assert_int_equal(stoke_sampler_length(s), 0);
    stoke__sampler_epoch e;
    stoke__sampler_epoch_init(&e, s, 1, 1);
    uint64_t v = 0;
    assert_int_equal(stoke__sampler_fill(s, &e, 0, 0, &v), STOKE_OK);
    assert_int_equal(stoke__sampler_fill(s, &e, 0, 1, &v), STOKE_ERANGE);
    stoke_sampler_destroy(s);
    free(keep);
}

/* ---- block shuffle ------------------------------------------------------------------------ */

static stoke_sampler *make_block(uint64_t n, uint64_t rows, uint64_t win)
{
    cfg c = {.kind = STOKE_SAMPLER_BLOCK, .brows = rows, .bwin = win};
    void *keep;
    stoke_sampler *s = make(&c, n, &keep);
    assert_null(keep);
    return s;
}

/* Every index of [0, n) exactly once; each block's rows within one span of win * rows positions;
 * cut where every block seen so far is complete, the order falls into runs of at most `win`
 * blocks (a window holds whole blocks and nothing else). */
static void check_block_order(const uint64_t *v, uint64_t n, uint64_t rows, uint64_t win)
{
    if (rows > n)
        rows = n; /* one block */
    uint64_t nb = (n + rows - 1) / rows;
    unsigned char *seen = calloc(n, 1);
    uint64_t *first = malloc(nb * sizeof(*first)), *last = malloc(nb * sizeof(*last));
    uint64_t *left = malloc(nb * sizeof(*left));
    assert_true(seen && first && last && left);
    for (uint64_t b = 0; b < nb; b++) {
        first[b] = UINT64_MAX;
        left[b] = b + 1 < nb ? rows : n - b * rows;
    }
    uint64_t open_blocks = 0, run_blocks = 0;
    for (uint64_t p = 0; p < n; p++) {
        assert_true(v[p] < n);
        if (seen[v[p]])
            fail_msg("n %llu rows %llu win %llu: index %llu twice", (unsigned long long)n,
                     (unsigned long long)rows, (unsigned long long)win, (unsigned long long)v[p]);
        seen[v[p]] = 1;
        uint64_t b = v[p] / rows;
        if (first[b] == UINT64_MAX) {
            first[b] = p;
            open_blocks++;
            run_blocks++;
        }
        last[b] = p;
        if (--left[b] == 0)
            open_blocks--;
        assert_true(run_blocks <= win);
        if (open_blocks == 0)
            run_blocks = 0;
    }
    for (uint64_t b = 0; b < nb; b++)
        assert_true(last[b] - first[b] < win * rows);
    free(seen);
    free(first);
    free(last);
    free(left);
}

static void test_block_bijection_and_locality(void **state)
{
    static const uint64_t ns[] = {1, 2, 3, 5, 17, 100, 1000, 4097, 10007};
    static const uint64_t rows[] = {1, 2, 3, 7, 64, 1000, 5000};
    static const uint64_t wins[] = {1, 2, 3, 4, 16, 1000};
    for (size_t a = 0; a < STOKE__ARRAY_LEN(ns); a++)
        for (size_t b = 0; b < STOKE__ARRAY_LEN(rows); b++)
            for (size_t c = 0; c < STOKE__ARRAY_LEN(wins); c++) {
                stoke_sampler *s = make_block(ns[a], rows[b], wins[c]);
                assert_int_equal(stoke_sampler_length(s), ns[a]);
                for (uint64_t epoch = 0; epoch < 2; epoch++) {
                    uint64_t *v = order_by_fill(s, 99, epoch, 256);
                    check_block_order(v, ns[a], rows[b], wins[c]);
                    if (ns[a] <= 100) { /* and the per-sample path agrees */
                        uint64_t *r = order_by_index(s, 99, epoch);
                        assert_memory_equal(v, r, ns[a] * sizeof(*v));
                        free(r);
                    }
                    free(v);
                }
                stoke_sampler_destroy(s);
            }
}

/* The defaults (4096 rows, 16 blocks) hold the same properties on a larger dataset. */
static void test_block_defaults(void **state)
{
    uint64_t n = 40 * 4096 + 123;
    stoke_sampler *s = make_block(n, 0, 0);
    uint64_t *v = order_by_fill(s, 5, 0, 1000);
    check_block_order(v, n, STOKE_SAMPLER_BLOCK_ROWS_DEFAULT, STOKE_SAMPLER_BLOCK_WINDOW_DEFAULT);
    /* Not trivially met: 41 blocks, and the first 15 blocks' worth of positions (inside the
     * first window even when the short block is in it) mix rows of all 16 of its blocks. */
    uint64_t blocks_in_first = 0;
    unsigned char in_first[41] = {0};
    for (uint64_t p = 0; p < 15 * 4096; p++) {
        blocks_in_first += !in_first[v[p] / 4096];
        in_first[v[p] / 4096] = 1;
    }
    assert_int_equal(blocks_in_first, 16);
    free(v);
    stoke_sampler_destroy(s);
}

static void test_block_determinism(void **state)
{
    uint64_t n = 100003;
    stoke_sampler *s1 = make_block(n, 500, 4), *s2 = make_block(n, 500, 4);
    uint64_t *a = order_by_fill(s1, 7, 0, 333), *b = order_by_fill(s2, 7, 0, 4096);
    uint64_t *c = order_by_fill(s1, 7, 1, 333), *d = order_by_fill(s1, 8, 0, 333);
    assert_memory_equal(a, b, n * sizeof(*a));
    uint64_t same_c = 0, same_d = 0;
    for (uint64_t p = 0; p < n; p++) {
        same_c += a[p] == c[p];
        same_d += a[p] == d[p];
    }
    assert_true(same_c < n / 100);
    assert_true(same_d < n / 100);
    /* Epochs visit the blocks in different orders: the first window (at least 1503 positions:
     * 4 blocks of 500, one of which may be the 3-row last block) holds other blocks. */
    unsigned char ba[201] = {0}, bc[201] = {0};
    for (uint64_t p = 0; p < 1500; p++) {
        ba[a[p] / 500] = 1;
        bc[c[p] / 500] = 1;
    }
    assert_memory_not_equal(ba, bc, sizeof(ba));
    free(a);
    free(b);
    free(c);
    free(d);
    stoke_sampler_destroy(s1);
    stoke_sampler_destroy(s2);
}

/* Distributed: ranks' shares (padded) cover every index; each rank's positions in a window still
 * come from that window's blocks. */
static void test_block_distributed(void **state)
{
    uint64_t n = 10007, rows = 100, win = 4, world = 3;
    unsigned char *seen = calloc(n, 1);
    assert_non_null(seen);
    stoke_sampler *all = make_block(n, rows, win);
    uint64_t *ref = order_by_fill(all, 3, 1, 512);
    for (int64_t r = 0; r < (int64_t)world; r++) {
        cfg c = {.kind = STOKE_SAMPLER_BLOCK, .brows = rows, .bwin = win, .dist = 1,
                 .rank = r, .world = (int64_t)world};
        void *keep;
        stoke_sampler *s = make(&c, n, &keep);
        uint64_t len = stoke_sampler_length(s);
        assert_int_equal(len, (n + world - 1) / world);
        uint64_t *v = order_by_fill(s, 3, 1, 100);
        for (uint64_t p = 0; p < len; p++) {
            assert_int_equal(v[p], ref[((uint64_t)r + p * world) % n]);
            seen[v[p]] = 1;
        }
        free(v);
        stoke_sampler_destroy(s);
    }
    for (uint64_t i = 0; i < n; i++)
        assert_int_equal(seen[i], 1);
    free(ref);
    free(seen);
    stoke_sampler_destroy(all);
}

/* The statistic docs/loader.md quotes: blocks touched by a batch and by a window's worth of
 * positions, block shuffle against RANDOM, on 64 blocks of 1024 rows with windows of 4. */
static void test_block_sequentialness(void **state)
{
    uint64_t n = 65536, rows = 1024, win = 4, bs = 256;
    stoke_sampler *blk = make_block(n, rows, win);
    cfg rc = {.kind = STOKE_SAMPLER_RANDOM};
    void *keep;
    stoke_sampler *rnd = make(&rc, n, &keep);
    uint64_t *vb = order_by_fill(blk, 1, 0, bs), *vr = order_by_fill(rnd, 1, 0, bs);
    uint64_t max_blk = 0, min_rnd = UINT64_MAX;
    for (uint64_t p0 = 0; p0 < n; p0 += win * rows) {
        unsigned char tb[64] = {0}, tr[64] = {0};
        uint64_t db = 0, dr = 0;
        for (uint64_t p = p0; p < p0 + win * rows; p++) {
            db += !tb[vb[p] / rows];
            dr += !tr[vr[p] / rows];
            tb[vb[p] / rows] = tr[vr[p] / rows] = 1;
        }
        max_blk = db > max_blk ? db : max_blk;
        min_rnd = dr < min_rnd ? dr : min_rnd;
    }
    assert_int_equal(max_blk, win); /* exactly the window's blocks (64 divides evenly) */
    assert_true(min_rnd >= 60);     /* RANDOM touches nearly every block */
    /* Consecutive positions in the same block: about 1 / win for the block shuffle. */
    uint64_t same = 0;
    for (uint64_t p = 1; p < n; p++)
        same += vb[p] / rows == vb[p - 1] / rows;
    double frac = (double)same / (double)(n - 1);
    assert_true(frac > 0.5 / (double)win && frac < 2.0 / (double)win);
    free(vb);
    free(vr);
    stoke_sampler_destroy(blk);
    stoke_sampler_destroy(rnd);
    free(keep);
}

static void test_block_create_errors(void **state)
{
    stoke_sampler_opts o;
    stoke_sampler_opts_init(&o);
    assert_int_equal(o.block_rows, 0);
    assert_int_equal(o.block_window, 0);
    o.kind = STOKE_SAMPLER_BLOCK;
    stoke_sampler *s = (stoke_sampler *)1;
    o.block_rows = (1ull << 48) + 1;
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_EINVAL);
    assert_null(s);
    assert_non_null(strstr(stoke_last_error(), "block_rows"));
    o.block_rows = 0;
    o.block_window = UINT64_MAX;
    assert_int_equal(stoke_sampler_create(&o, 100, &s), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "2^48"));
    o.block_window = 0;
    assert_int_equal(stoke_sampler_create(&o, (1ull << 62) + 1, &s), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "over 2^62"));
    /* Limits themselves are fine, and so is an empty dataset. */
    o.block_rows = 1ull << 48;
    o.block_window = 1ull << 48;
    assert_int_equal(stoke_sampler_create(&o, 1ull << 62, &s), STOKE_OK);
    uint64_t v = 0;
    assert_int_equal(stoke_sampler_index(s, 1, 1, (1ull << 62) - 1, &v), STOKE_OK);
    assert_true(v < (1ull << 62));
    stoke_sampler_destroy(s);
    assert_int_equal(stoke_sampler_create(&o, 0, &s), STOKE_OK);
    assert_int_equal(stoke_sampler_length(s), 0);
    assert_int_equal(stoke_sampler_index(s, 1, 1, 0, &v), STOKE_ERANGE);
    stoke_sampler_destroy(s);
}

/* Through the loader's C API today: the batches of a BLOCK loader follow the sampler's order,
 * with 0 and 2 workers, and hold the right samples. */
static void test_block_through_loader(void **state)
{
    tu_use_none();
    uint64_t n = 1000;
    stoke_sampler *ref = make_block(n, 64, 3);
    uint64_t *want = order_by_fill(ref, 77, 1, 128);
    for (int workers = 0; workers <= 2; workers += 2) {
        tds t;
        stoke_dataset ds;
        tds_make(&t, &ds, n);
        stoke_loader_opts o;
        stoke_loader_opts_init(&o);
        o.batch_size = 96;
        o.num_workers = workers;
        o.pin_memory = 0;
        o.shuffle = 1; /* leaves BLOCK as it is */
        o.seed = 77;
        o.epoch = 1;
        o.sampler.kind = STOKE_SAMPLER_BLOCK;
        o.sampler.block_rows = 64;
        o.sampler.block_window = 3;
        stoke_loader *l = NULL;
        assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
        uint64_t got = 0;
        stoke_batch *b;
        int rc;
        while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
            const uint64_t *idx = stoke_batch_indices(b);
            for (size_t j = 0; j < stoke_batch_count(b); j++, got++) {
                assert_true(got < n);
                assert_int_equal(idx[j], want[got]);
            }
            assert_true(tds_batch_ok(b));
            stoke_batch_release(b);
        }
        assert_int_equal(rc, STOKE_EEND);
        assert_int_equal(got, n);
        stoke_loader_destroy(l);
        tds_free(&t);
    }
    free(want);
    stoke_sampler_destroy(ref);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fill_equals_index),
        cmocka_unit_test(test_fill_walk_equals_index),
        cmocka_unit_test(test_fill_avx2_equals_walk),
        cmocka_unit_test(test_fill_table_equals_index),
        cmocka_unit_test(test_full_epoch_hash),
        cmocka_unit_test(test_golden_orders),
        cmocka_unit_test(test_fill_errors),
        cmocka_unit_test(test_block_bijection_and_locality),
        cmocka_unit_test(test_block_defaults),
        cmocka_unit_test(test_block_determinism),
        cmocka_unit_test(test_block_distributed),
        cmocka_unit_test(test_block_sequentialness),
        cmocka_unit_test(test_block_create_errors),
        cmocka_unit_test(test_block_through_loader),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
