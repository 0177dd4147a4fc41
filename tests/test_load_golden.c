/* Golden outputs of `stoke load`: samples, batches, index_sum, content_hash and order_hash of
 * every loading mode, compared with the values recorded in tests/golden/ from the loader as it
 * was before its rewrite (issue 26), so that a rewrite shows it delivers the same bytes in the
 * same order.
 *
 * Every case loads 2 epochs with a partial last batch, in every mode: workers 0/1/2/auto as
 * threads and 1/2/auto as processes.  Each source (synthetic, npy with io=mmap, tar) in random
 * order (seed 7) in and out of order, with host batches and with device copies on simdev read
 * back (--device simdev --verify), and in sequential order; variants in fewer combinations
 * (the suite also runs under the sanitizers): a block shuffle of the npy file, io=pread and
 * io=uring, --drop-last and a distributed rank.  Run with the argument `images` (CTest's
 * test_load_golden_images) it covers the sources that decode JPEGs instead: images: and tar
 * .jpg members with train crops, which differ by epoch (and epoch 0 alone, as content_hash sums
 * over the epochs).  Out of order, which batch comes first depends on timing: order_hash is not
 * compared (samples, batches, index_sum and content_hash are).  A case this machine cannot run
 * (io=uring refused by the kernel) is reported as skipped and keeps its golden line.
 *
 * The fixtures are written here, deterministically: a .npy file of rows of a fixed
 * pseudo-random stream, two ustar shards, and grayscale JPEGs (libjpeg's compressor, quality
 * 100) made of flat 8x8 blocks, whose decode is exact whatever the IDCT (DC coefficients
 * only, quantized by 1), so that the golden hashes do not depend on libjpeg's version.
 *
 * STOKE_GOLDEN_UPDATE=1 writes the golden file from this build instead of comparing (only on
 * purpose: docs/loader.md, "Golden outputs"). */
#include "testutil.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifdef STOKE_TEST_HAVE_JPEG
#include <jpeglib.h>
#endif

#define N_ROWS    203 /* synthetic, npy and tar samples: 12 batches of 16 and one of 11 */
#define BATCH     "16"
#define ROW_BYTES 35 /* an npy row (5 x 7 uint8) and a tar .bin member */
#define N_IMAGES  29 /* 3 batches of 8 and one of 5 */
#define IMG_BATCH "8"

static char g_dir[512]; /* this run's fixtures */
static char g_out[16384], g_err[16384];

/* ---- the golden file ---------------------------------------------------------------------- */

/* Lines "NAME VALUES"; '#' lines are comments.  `seen`: a case of this run had that name. */
typedef struct gline {
    char *name, *values;
    int seen;
} gline;

static struct {
    char path[1024];
    int update;
    gline *want; /* the file */
    size_t nwant;
    gline *got; /* this run, in case order (skipped cases keep the file's values) */
    size_t ngot;
    int bad;     /* mismatches and failed runs */
    int skipped; /* cases this machine cannot run */
} g;

static void push(gline **v, size_t *n, const char *name, const char *values)
{
    gline *p = realloc(*v, (*n + 1) * sizeof(**v));
    assert_non_null(p);
    *v = p;
    p[*n].name = strdup(name);
    p[*n].values = strdup(values);
    p[*n].seen = 0;
    assert_non_null(p[*n].name);
    assert_non_null(p[*n].values);
    (*n)++;
}

static void golden_load(const char *file)
{
    const char *dir = getenv("STOKE_GOLDEN_DIR");
    if (!dir || !*dir)
        fail_msg("STOKE_GOLDEN_DIR is not set (run the tests through ctest)");
    snprintf(g.path, sizeof(g.path), "%s/%s", dir, file);
    const char *u = getenv("STOKE_GOLDEN_UPDATE");
    g.update = u && *u && strcmp(u, "0") != 0;
    FILE *f = fopen(g.path, "r");
    if (!f) {
        if (!g.update)
            fail_msg("cannot read the golden file %s: %s (STOKE_GOLDEN_UPDATE=1 writes it)", g.path,
                     strerror(errno));
        return;
    }
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '#' || line[0] == '\0')
            continue;
        char *sp = strchr(line, ' ');
        if (!sp)
            fail_msg("%s: malformed line '%s'", g.path, line);
        *sp = '\0';
        push(&g.want, &g.nwant, line, sp + 1);
    }
    fclose(f);
}

static gline *golden_find(const char *name)
{
    for (size_t i = 0; i < g.nwant; i++)
        if (strcmp(g.want[i].name, name) == 0)
            return &g.want[i];
    return NULL;
}

/* A case's outcome: compared with the golden file, or kept for writing it. */
static void golden_check(const char *name, const char *values, const char *cmd)
{
    for (size_t i = 0; i < g.ngot; i++)
        if (strcmp(g.got[i].name, name) == 0)
            fail_msg("two cases are named %s", name);
    push(&g.got, &g.ngot, name, values);
    gline *w = golden_find(name);
    if (w)
        w->seen = 1;
    if (g.update)
        return;
    if (!w) {
        print_error("case %s: not in %s\n  got:      %s\n  command: %s\n", name, g.path, values,
                    cmd);
        g.bad++;
    } else if (strcmp(w->values, values) != 0) {
        print_error("case %s: differs from %s\n  expected: %s\n  got:      %s\n  command: %s\n",
                    name, g.path, w->values, values, cmd);
        g.bad++;
    }
}

/* A case that cannot run here: its golden line stays as it is. */
static void golden_skip(const char *name, const char *why)
{
    print_message("[  SKIP    ] case %s: %s\n", name, why);
    g.skipped++;
    gline *w = golden_find(name);
    if (w) {
        w->seen = 1;
        push(&g.got, &g.ngot, name, w->values);
    }
}

/* At the end of a source's test: fails it if one of its cases differed or failed since `bad`
 * (g.bad when it began). */
static void source_done(int bad)
{
    if (g.bad > bad)
        fail_msg("%d case(s) differ from %s or failed: see above", g.bad - bad, g.path);
}

/* After every case: writes the file (update), or fails on a golden line that no case produced
 * (a case that disappeared would otherwise go unnoticed; mismatches fail their source's test). */
static void golden_finish(void **state)
{
    if (g.update) {
        char tmp[1100];
        snprintf(tmp, sizeof(tmp), "%s.tmp", g.path);
        FILE *f = fopen(tmp, "w");
        if (!f)
            fail_msg("cannot write %s: %s", tmp, strerror(errno));
        fprintf(f,
                "# Golden outputs of `stoke load` (tests/test_load_golden.c): case, then samples,\n"
                "# batches, index_sum, content_hash and order_hash (- out of order).  Written by\n"
                "# STOKE_GOLDEN_UPDATE=1; see docs/loader.md, \"Golden outputs\".\n");
        for (size_t i = 0; i < g.ngot; i++)
            fprintf(f, "%s %s\n", g.got[i].name, g.got[i].values);
        assert_int_equal(fclose(f), 0);
        if (rename(tmp, g.path) != 0)
            fail_msg("cannot rename %s to %s: %s", tmp, g.path, strerror(errno));
        print_message("[  UPDATE  ] wrote %zu cases to %s\n", g.ngot, g.path);
        return;
    }
    int stale = 0;
    for (size_t i = 0; i < g.nwant; i++)
        if (!g.want[i].seen) {
            print_error("golden case %s (%s) was not run\n", g.want[i].name, g.path);
            stale++;
        }
    print_message("%zu cases compared with %s (%d skipped): %d differ or failed; %d golden "
                  "lines not run\n",
                  g.ngot - (size_t)g.skipped, g.path, g.skipped, g.bad, stale);
    if (stale)
        fail_msg("%d case(s) of %s were not run: see above", stale, g.path);
}

/* ---- running a case ----------------------------------------------------------------------- */

/* The JSON value of `key` without quotes, or "(absent)". */
static const char *jv(const char *json, const char *key, char *buf, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (!p) {
        snprintf(buf, len, "(absent)");
        return buf;
    }
    p += strlen(pat);
    if (*p == '"')
        p++;
    snprintf(buf, len, "%.*s", (int)strcspn(p, "\",}"), p);
    return buf;
}

typedef struct mode {
    const char *name, *workers;
    int procs;
} mode;

static const mode modes[] = {{"threads-w0", "0", 0},    {"threads-w1", "1", 0},
                             {"threads-w2", "2", 0},    {"threads-wauto", "auto", 0},
                             {"procs-w1", "1", 1},      {"procs-w2", "2", 1},
                             {"procs-wauto", "auto", 1}};
#define NMODES (sizeof(modes) / sizeof(modes[0]))

/* One way of loading a source. */
typedef struct lcase {
    const char *src; /* the case name's first part */
    const char *spec, *batch;
    const mode *m;
    int in_order;
    const char *shuffle; /* --shuffle=KIND */
    int device;          /* --device simdev --verify */
    const char *extra;   /* one more argument, or NULL */
    const char *epochs;  /* --epochs (NULL: 2) */
    const char *env[3];  /* more environment entries */
} lcase;

/* Runs `stoke load` for one case and checks its outcome. */
static void run_case(const lcase *c)
{
    char name[256];
    snprintf(name, sizeof(name), "%s/%s/%s/%s/%s", c->src, c->m->name,
             c->in_order ? "in-order" : "out-of-order", c->shuffle, c->device ? "simdev" : "host");
    char shuffle[64];
    snprintf(shuffle, sizeof(shuffle), "--shuffle=%s", c->shuffle);
    const char *args[TU_CLI_MAX_ARGS + 1];
    int n = 0;
    const char *epochs = c->epochs ? c->epochs : "2";
    const char *fixed[] = {c->spec, "--batch-size", c->batch,      "--epochs", epochs, "--seed",
                           "7",     "--workers",    c->m->workers, shuffle};
    for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
        args[n++] = fixed[i];
    if (c->m->procs)
        args[n++] = "--worker-mode=processes";
    if (!c->in_order)
        args[n++] = "--out-of-order";
    if (c->device) {
        args[n++] = "--device";
        args[n++] = "simdev";
        args[n++] = "--verify";
    }
    if (c->extra)
        args[n++] = c->extra;
    args[n++] = "--json";
    args[n] = NULL;
    char cmd[4096];
    size_t used = (size_t)snprintf(cmd, sizeof(cmd), "%s stoke load", tu_simdev_env());
    for (int i = 0; i < n && used < sizeof(cmd); i++)
        used += (size_t)snprintf(cmd + used, sizeof(cmd) - used, " %s", args[i]);
    for (int i = 0; i < 3 && c->env[i] && used < sizeof(cmd); i++)
        used += (size_t)snprintf(cmd + used, sizeof(cmd) - used, " (%s)", c->env[i]);

    /* simdev the accelerator (pinned batches, and the --device), nothing from the caller's
     * environment that changes simdev or splits the dataset into ranks */
    const char *env[] = {tu_simdev_env(),
                         "STOKE_ACCELERATOR=",
                         "STOKE_SIMDEV_DEVICES=",
                         "STOKE_SIMDEV_MEMORY=",
                         "STOKE_SIMDEV_FAIL_ALLOC=",
                         "STOKE_SIMDEV_FAIL_COPY=",
                         "STOKE_SIMDEV_COPY_DELAY_US=",
                         "STOKE_SIMDEV_PROBE_FAIL=",
                         "RANK=",
                         "WORLD_SIZE=",
                         "OMPI_COMM_WORLD_RANK=",
                         "OMPI_COMM_WORLD_SIZE=",
                         "SLURM_PROCID=",
                         "SLURM_NTASKS=",
                         c->env[0],
                         c->env[1],
                         c->env[2],
                         NULL};
    int st = tu_run_cli(env, "load", args, g_out, sizeof(g_out), g_err, sizeof(g_err));
    if (st != 0 && strstr(g_err, "io=uring is not available")) {
        golden_skip(name, "io=uring is not available here");
        return;
    }
    char v[6][128], ok[16], from[64], wm[32], acc[64], copies[32];
    jv(g_out, "ok", ok, sizeof(ok));
    jv(g_out, "content_hash_from", from, sizeof(from));
    jv(g_out, "worker_mode", wm, sizeof(wm));
    jv(g_out, "accelerator", acc, sizeof(acc));
    jv(g_out, "device_copies", copies, sizeof(copies));
    jv(g_out, "batches", v[1], sizeof(v[1]));
    /* the case ran as its name says: a failure here is not a golden mismatch */
    const char *why = st != 0                      ? "exit status not 0"
                      : strcmp(ok, "true") != 0    ? "\"ok\" is not true"
                      : strcmp(acc, "simdev") != 0 ? "simdev is not the accelerator"
                      : strcmp(wm, c->m->procs ? "processes" : "threads") != 0
                          ? "not the worker mode asked for"
                      : strcmp(from, c->device ? "device_readback" : "host_second_pass") != 0
                          ? "content_hash_from is not the one expected"
                      : c->device && strcmp(copies, v[1]) != 0 ? "device_copies is not batches"
                                                               : NULL;
    if (why) {
        print_error("case %s: %s (exit %d)\n  command: %s\n  stdout: %s  stderr: %s\n", name, why,
                    st, cmd, g_out, g_err);
        g.bad++;
        return;
    }
    jv(g_out, "samples", v[0], sizeof(v[0]));
    jv(g_out, "index_sum", v[2], sizeof(v[2]));
    jv(g_out, "content_hash", v[3], sizeof(v[3]));
    if (c->in_order)
        jv(g_out, "order_hash", v[4], sizeof(v[4]));
    else
        snprintf(v[4], sizeof(v[4]), "-"); /* depends on timing */
    char values[768];
    snprintf(values, sizeof(values),
             "samples=%s batches=%s index_sum=%s content_hash=%s "
             "order_hash=%s",
             v[0], v[1], v[2], v[3], v[4]);
    golden_check(name, values, cmd);
}

/* What run_matrix runs besides every mode: in order, out of order, host batches, device
 * copies. */
enum { IN = 1, OUT = 2, HOST = 4, DEV = 8, ALL = IN | OUT | HOST | DEV };

/* Every mode with --shuffle=`shuffle`, in order and/or out of order (`what`: IN, OUT), with
 * host batches and/or device copies (HOST, DEV).  The full product for the random order of
 * every source; the variants take fewer (the suite runs under the sanitizers too). */
static void run_matrix(lcase c, const char *shuffle, int what)
{
    c.shuffle = shuffle;
    for (size_t m = 0; m < NMODES; m++)
        for (int in = 1; in >= 0; in--)
            for (int dev = 0; dev <= 1; dev++)
                if ((what & (in ? IN : OUT)) && (what & (dev ? DEV : HOST))) {
                    c.m = &modes[m];
                    c.in_order = in;
                    c.device = dev;
                    run_case(&c);
                }
}

/* ---- fixtures ----------------------------------------------------------------------------- */

static uint64_t splitmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Byte k of row i of the npy file and of the tar .bin members. */
static unsigned char row_byte(uint64_t i, size_t k)
{
    return (unsigned char)(splitmix(i * 64 + k) >> 56);
}

static const char *fixture(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/%s", g_dir, name);
    return buf;
}

static void make_dir(const char *tag)
{
    char b[400];
    snprintf(g_dir, sizeof(g_dir), "%s", tu_tmp_path("golden", b, sizeof(b)));
    size_t n = strlen(g_dir);
    snprintf(g_dir + n, sizeof(g_dir) - n, "_%s_%d", tag, (int)getpid());
    char cmd[1200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", g_dir, g_dir);
    assert_int_equal(system(cmd), 0);
}

/* The fixtures stay after a failure, for the commands printed to run again. */
static int remove_dir(void **state)
{
    if (g.bad) {
        print_message("fixtures kept in %s\n", g_dir);
        return 0;
    }
    char cmd[2200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", g_dir);
    return system(cmd) == 0 ? 0 : -1;
}

static void write_npy(void)
{
    static unsigned char rows[N_ROWS * ROW_BYTES];
    int64_t labels[N_ROWS];
    for (uint64_t i = 0; i < N_ROWS; i++) {
        for (size_t k = 0; k < ROW_BYTES; k++)
            rows[i * ROW_BYTES + k] = row_byte(i, k);
        labels[i] = (int64_t)(i % 10); /* '<i8': this is a little-endian host (as npy's tests) */
    }
    char p[1100], dict[160];
    snprintf(dict, sizeof(dict), "{'descr': '|u1', 'fortran_order': False, 'shape': (%d, 5, 7), }",
             N_ROWS);
    tu_npy_write(fixture("data.npy", p, sizeof(p)), dict, rows, sizeof(rows));
    snprintf(dict, sizeof(dict), "{'descr': '<i8', 'fortran_order': False, 'shape': (%d,), }",
             N_ROWS);
    tu_npy_write(fixture("labels.npy", p, sizeof(p)), dict, labels, sizeof(labels));
}

/* A ustar member (a name of at most 100 bytes) and its data padded to 512 bytes. */
static void tar_member(FILE *f, const char *name, const void *data, size_t n)
{
    unsigned char b[512] = {0};
    assert_true(strlen(name) <= 100);
    memcpy(b, name, strlen(name));
    snprintf((char *)b + 100, 8, "%07o", 0644);
    snprintf((char *)b + 108, 8, "%07o", 1000);
    snprintf((char *)b + 116, 8, "%07o", 1000);
    snprintf((char *)b + 124, 12, "%011zo", n);
    snprintf((char *)b + 136, 12, "%011o", 1700000000);
    b[156] = '0';
    memcpy(b + 257, "ustar", 6);
    memcpy(b + 263, "00", 2);
    memset(b + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += b[i];
    snprintf((char *)b + 148, 8, "%06o", sum);
    assert_int_equal(fwrite(b, 1, 512, f), 512);
    static const unsigned char zero[512];
    if (n)
        assert_int_equal(fwrite(data, 1, n, f), n);
    if (n % 512)
        assert_int_equal(fwrite(zero, 1, 512 - n % 512, f), 512 - n % 512);
}

static void tar_end(FILE *f)
{
    static const unsigned char zero[1024];
    assert_int_equal(fwrite(zero, 1, sizeof(zero), f), sizeof(zero));
    assert_int_equal(fclose(f), 0);
}

/* Two shards, tar/shard-0.tar with samples 0..100 and shard-1.tar with the rest: KEY.bin (the
 * npy file's row) and KEY.cls. */
static void write_tar(void)
{
    char p[1100];
    assert_int_equal(mkdir(fixture("tar", p, sizeof(p)), 0755), 0);
    FILE *f = NULL;
    for (int i = 0; i < N_ROWS; i++) {
        if (i == 0 || i == 101) {
            if (f)
                tar_end(f);
            char shard[64];
            snprintf(shard, sizeof(shard), "tar/shard-%d.tar", i ? 1 : 0);
            f = fopen(fixture(shard, p, sizeof(p)), "wb");
            assert_non_null(f);
        }
        unsigned char row[ROW_BYTES];
        for (size_t k = 0; k < ROW_BYTES; k++)
            row[k] = row_byte((uint64_t)i, k);
        char name[64], cls[16];
        snprintf(name, sizeof(name), "s%05d.bin", i);
        tar_member(f, name, row, sizeof(row));
        snprintf(name, sizeof(name), "s%05d.cls", i);
        int n = snprintf(cls, sizeof(cls), "%d\n", i % 7);
        tar_member(f, name, cls, (size_t)n);
    }
    tar_end(f);
}

/* ---- the core group: synthetic, npy, tar -------------------------------------------------- */

static int core_setup(void **state)
{
    make_dir("core");
    write_npy();
    write_tar();
    golden_load("load.txt");
    return 0;
}

static void test_synthetic(void **state)
{
    int bad = g.bad;
    char spec[64];
    snprintf(spec, sizeof(spec), "synthetic:%d,shape=3x8x8,classes=10,seed=5", N_ROWS);
    lcase c = {.src = "synthetic", .spec = spec, .batch = BATCH};
    run_matrix(c, "random", ALL);
    run_matrix(c, "none", IN | HOST);
    /* a dropped partial batch, and rank 1 of 2 (DistributedSampler's padded share) */
    for (size_t m = 0; m < NMODES; m++) {
        lcase d = {.src = "synthetic-drop-last",
                   .spec = spec,
                   .batch = BATCH,
                   .m = &modes[m],
                   .in_order = 1,
                   .shuffle = "random",
                   .extra = "--drop-last"};
        run_case(&d);
        lcase r = {.src = "synthetic-rank1of2",
                   .spec = spec,
                   .batch = BATCH,
                   .m = &modes[m],
                   .in_order = 1,
                   .shuffle = "random",
                   .extra = "--distributed",
                   .env = {"RANK=1", "WORLD_SIZE=2"}};
        run_case(&r);
    }
    source_done(bad);
}

static void test_npy(void **state)
{
    int bad = g.bad;
    char d[1100], l[1100], spec[2400];
    fixture("data.npy", d, sizeof(d));
    fixture("labels.npy", l, sizeof(l));
    /* io=auto picks by page-cache residency: each mode is named */
    snprintf(spec, sizeof(spec), "npy:%s,labels=%s,io=mmap", d, l);
    lcase c = {.src = "npy-mmap", .spec = spec, .batch = BATCH};
    run_matrix(c, "random", ALL);
    run_matrix(c, "none", IN | HOST);
    /* a block shuffle (its read-ahead and block buffers): blocks of 16 rows, 4 at a time */
    run_matrix(c, "block:16:4", IN | OUT | HOST);
    run_matrix(c, "block:16:4", IN | DEV);
    char spec2[2400];
    snprintf(spec2, sizeof(spec2), "npy:%s,labels=%s,io=pread", d, l);
    lcase p = {.src = "npy-pread", .spec = spec2, .batch = BATCH};
    run_matrix(p, "random", IN | HOST);
    run_matrix(p, "block:16:4", IN | HOST);
    char spec3[2400];
    snprintf(spec3, sizeof(spec3), "npy:%s,labels=%s,io=uring", d, l);
    lcase u = {.src = "npy-uring", .spec = spec3, .batch = BATCH};
    run_matrix(u, "random", IN | HOST);
    source_done(bad);
}

static void test_tar(void **state)
{
    int bad = g.bad;
    char p[1100], spec[1200];
    snprintf(spec, sizeof(spec), "tar:%s/shard-{0..1}.tar,fields=bin:cls",
             fixture("tar", p, sizeof(p)));
    lcase c = {.src = "tar", .spec = spec, .batch = BATCH};
    run_matrix(c, "random", ALL);
    run_matrix(c, "none", IN | HOST);
    source_done(bad);
}

/* ---- the images group: images: and tar .jpg members --------------------------------------- */

#ifdef STOKE_TEST_HAVE_JPEG
/* Grey level of pixel (x, y) of image i: one per 8x8 block. */
static unsigned char grey(int i, int x, int y)
{
    return (unsigned char)(16 + splitmix((uint64_t)i * 4096 + (uint64_t)(y / 8) * 64 +
                                         (uint64_t)(x / 8)) %
                                    224);
}

/* The premise of the golden hashes of images: this libjpeg decodes the JPEG exactly. */
static void check_exact(int i, unsigned char *jpg, unsigned long n, int W, int H)
{
    struct jpeg_decompress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_decompress(&ci);
    jpeg_mem_src(&ci, jpg, n);
    jpeg_read_header(&ci, TRUE);
    jpeg_start_decompress(&ci);
    assert_int_equal(ci.output_components, 1);
    unsigned char row[64];
    for (int y = 0; y < H; y++) {
        JSAMPROW r = row;
        assert_int_equal(jpeg_read_scanlines(&ci, &r, 1), 1);
        for (int x = 0; x < W; x++)
            if (row[x] != grey(i, x, y))
                fail_msg("image %d: pixel (%d, %d) decodes to %d, not %d: the fixture's JPEGs "
                         "are not decoded exactly by this libjpeg",
                         i, x, y, row[x], grey(i, x, y));
    }
    jpeg_finish_decompress(&ci);
    jpeg_destroy_decompress(&ci);
}

/* Image i: W x H, multiples of 8, in flat 8x8 blocks of grey; a baseline grayscale JPEG at
 * quality 100 (every quantizer 1), so every block is a DC coefficient alone, which any IDCT
 * decodes exactly.  Returns the JPEG (malloc'd) and its size. */
static unsigned char *make_jpeg(int i, unsigned long *size)
{
    const int W = 24 + 8 * (i % 3), H = 16 + 8 * (i % 4);
    struct jpeg_compress_struct ci;
    struct jpeg_error_mgr jerr;
    ci.err = jpeg_std_error(&jerr);
    jpeg_create_compress(&ci);
    unsigned char *buf = NULL;
    *size = 0;
    jpeg_mem_dest(&ci, &buf, size);
    ci.image_width = (JDIMENSION)W;
    ci.image_height = (JDIMENSION)H;
    ci.input_components = 1;
    ci.in_color_space = JCS_GRAYSCALE;
    jpeg_set_defaults(&ci);
    jpeg_set_quality(&ci, 100, TRUE);
    jpeg_start_compress(&ci, TRUE);
    unsigned char row[64];
    for (int y = 0; y < H; y++) {
        for (int x = 0; x < W; x++)
            row[x] = grey(i, x, y);
        JSAMPROW r = row;
        jpeg_write_scanlines(&ci, &r, 1);
    }
    jpeg_finish_compress(&ci);
    jpeg_destroy_compress(&ci);
    check_exact(i, buf, *size, W, H);
    return buf;
}

/* images/c{0,1,2}/imgNN.jpg (10, 10 and 9 images: the labels) and tarimg/shard-{0,1}.tar with
 * the same JPEGs as KEY.jpg and KEY.cls. */
static void write_images(void)
{
    char p[1100];
    assert_int_equal(mkdir(fixture("images", p, sizeof(p)), 0755), 0);
    assert_int_equal(mkdir(fixture("tarimg", p, sizeof(p)), 0755), 0);
    FILE *t = NULL;
    for (int i = 0; i < N_IMAGES; i++) {
        char rel[128];
        if (i % 10 == 0) {
            snprintf(rel, sizeof(rel), "images/c%d", i / 10);
            assert_int_equal(mkdir(fixture(rel, p, sizeof(p)), 0755), 0);
        }
        if (i == 0 || i == 15) {
            if (t)
                tar_end(t);
            snprintf(rel, sizeof(rel), "tarimg/shard-%d.tar", i ? 1 : 0);
            t = fopen(fixture(rel, p, sizeof(p)), "wb");
            assert_non_null(t);
        }
        unsigned long n;
        unsigned char *jpg = make_jpeg(i, &n);
        snprintf(rel, sizeof(rel), "images/c%d/img%02d.jpg", i / 10, i);
        FILE *f = fopen(fixture(rel, p, sizeof(p)), "wb");
        assert_non_null(f);
        assert_int_equal(fwrite(jpg, 1, n, f), n);
        assert_int_equal(fclose(f), 0);
        char name[64], cls[16];
        snprintf(name, sizeof(name), "k%05d.jpg", i);
        tar_member(t, name, jpg, n);
        snprintf(name, sizeof(name), "k%05d.cls", i);
        int len = snprintf(cls, sizeof(cls), "%d\n", i / 10);
        tar_member(t, name, cls, (size_t)len);
        free(jpg);
    }
    tar_end(t);
}

static int images_setup(void **state)
{
    make_dir("images");
    write_images();
    golden_load("load_images.txt");
    return 0;
}

static void test_images(void **state)
{
    int bad = g.bad;
    char p[1100], spec[1200];
    /* train: a random crop and flip per (seed, epoch, index), so epochs differ */
    snprintf(spec, sizeof(spec), "images:%s,size=16,train,seed=3", fixture("images", p, sizeof(p)));
    lcase c = {.src = "images-train", .spec = spec, .batch = IMG_BATCH};
    run_matrix(c, "random", ALL);
    run_matrix(c, "none", IN | HOST);
    /* content_hash sums over both epochs: epoch 0 alone pins which epoch's crops each got */
    lcase e = {.src = "images-train-epoch0", .spec = spec, .batch = IMG_BATCH, .epochs = "1"};
    run_matrix(e, "random", IN | HOST);
    source_done(bad);
}

static void test_tar_jpg(void **state)
{
    int bad = g.bad;
    char p[1100], spec[1200];
    snprintf(spec, sizeof(spec), "tar:%s/shard-{0..1}.tar,fields=jpg:cls,size=16,train,seed=3",
             fixture("tarimg", p, sizeof(p)));
    lcase c = {.src = "tar-jpg-train", .spec = spec, .batch = IMG_BATCH};
    run_matrix(c, "random", IN | HOST | DEV);
    source_done(bad);
}
#endif

int main(int argc, char **argv)
{
    if (argc > 1 && strcmp(argv[1], "images") == 0) {
#ifdef STOKE_TEST_HAVE_JPEG
        const struct CMUnitTest tests[] = {cmocka_unit_test(test_images),
                                           cmocka_unit_test(test_tar_jpg),
                                           cmocka_unit_test(golden_finish)};
        return tu_exit_status(cmocka_run_group_tests(tests, images_setup, remove_dir));
#else
        print_message("[  SKIP    ] the images: and tar .jpg cases: built without libjpeg-turbo\n");
        return TU_SKIP_EXIT;
#endif
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_synthetic), cmocka_unit_test(test_npy),
                                       cmocka_unit_test(test_tar), cmocka_unit_test(golden_finish)};
    return tu_exit_status(cmocka_run_group_tests(tests, core_setup, remove_dir));
}
