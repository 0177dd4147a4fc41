/* The tar source: archive formats (ustar, pax, GNU), WebDataset grouping and fields, shard
 * lists, corrupt archives, and the dataset under the loader (workers, ranks).  Archives are
 * written here block by block (tw_*), and with GNU tar when it is installed. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sources/tar_header.h"
#include "sources/tar_internal.h"
#include "stoke/stoke.h"
#include "testutil.h"

/* ---- writing archives ------------------------------------------------------------------- */

typedef struct tw {
    FILE *f;
} tw;

static void tw_open(tw *w, const char *path)
{
    w->f = fopen(path, "wb");
    assert_non_null(w->f);
}

static void octal(unsigned char *p, size_t n, uint64_t v)
{
    snprintf((char *)p, n, "%0*" PRIo64, (int)n - 1, v);
}

/* One header block: name (split into prefix / name when longer than 100), size, type. */
static void tw_header(tw *w, const char *name, uint64_t size, char type, int base256)
{
    unsigned char b[512];
    memset(b, 0, sizeof(b));
    size_t n = strlen(name);
    if (n > 100) { /* ustar prefix: split at a '/' */
        const char *cut = name + n - 100;
        cut = strchr(cut, '/');
        assert_non_null(cut);
        memcpy(b + 345, name, (size_t)(cut - name));
        memcpy(b, cut + 1, strlen(cut + 1));
    } else {
        memcpy(b, name, n);
    }
    octal(b + 100, 8, 0644);
    octal(b + 108, 8, 1000);
    octal(b + 116, 8, 1000);
    if (base256) {
        b[124] = 0x80;
        for (int i = 0; i < 8; i++)
            b[135 - i] = (unsigned char)(size >> (8 * i));
    } else {
        octal(b + 124, 12, size);
    }
    octal(b + 136, 12, 1700000000);
    b[156] = (unsigned char)type;
    memcpy(b + 257, "ustar", 6);
    memcpy(b + 263, "00", 2);
    memset(b + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += b[i];
    snprintf((char *)b + 148, 8, "%06o", sum);
    assert_int_equal(fwrite(b, 1, 512, w->f), 512);
}

static void tw_data(tw *w, const void *data, size_t n)
{
    static const unsigned char zero[512];
    if (n)
        assert_int_equal(fwrite(data, 1, n, w->f), n);
    size_t pad = (512 - n % 512) % 512;
    if (pad)
        assert_int_equal(fwrite(zero, 1, pad, w->f), pad);
}

static void tw_file(tw *w, const char *name, const void *data, size_t n)
{
    tw_header(w, name, n, '0', 0);
    tw_data(w, data, n);
}

static void tw_str(tw *w, const char *name, const char *s)
{
    tw_file(w, name, s, strlen(s));
}

/* A pax 'x' header for the next member with records "path" and/or "size". */
static void tw_pax(tw *w, const char *path, int64_t size)
{
    char rec[8192];
    size_t used = 0;
    if (path) {
        size_t body = strlen(" path=\n") + strlen(path);
        size_t len = body + 1;
        while (snprintf(NULL, 0, "%zu", len) + body != len)
            len++;
        used += (size_t)snprintf(rec + used, sizeof(rec) - used, "%zu path=%s\n", len, path);
    }
    if (size >= 0) {
        char v[32];
        snprintf(v, sizeof(v), "%" PRId64, size);
        size_t body = strlen(" size=\n") + strlen(v);
        size_t len = body + 1;
        while (snprintf(NULL, 0, "%zu", len) + body != len)
            len++;
        used += (size_t)snprintf(rec + used, sizeof(rec) - used, "%zu size=%s\n", len, v);
    }
    tw_header(w, "PaxHeaders/x", used, 'x', 0);
    tw_data(w, rec, used);
}

static void tw_end(tw *w)
{
    static const unsigned char zero[1024];
    assert_int_equal(fwrite(zero, 1, sizeof(zero), w->f), sizeof(zero));
    assert_int_equal(fclose(w->f), 0);
    w->f = NULL;
}

/* A scratch directory of its own for each test. */
static const char *scratch(const char *name)
{
    static char dir[1024];
    char b[1024];
    snprintf(dir, sizeof(dir), "%s", tu_tmp_path(name, b, sizeof(b)));
    char cmd[2200];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s' && mkdir -p '%s'", dir, dir);
    assert_int_equal(system(cmd), 0);
    return dir;
}

static char *pathf(char *buf, size_t n, const char *dir, const char *file)
{
    snprintf(buf, n, "%s/%s", dir, file);
    return buf;
}

/* The dataset's sample i, all fields, into one buffer. */
static int get_sample(stoke_dataset *ds, uint64_t i, unsigned char *buf, char *msg, size_t n)
{
    void *dst[TU_FIELDS] = {0};
    size_t off = 0;
    for (int f = 0; f < ds->nfields; f++) {
        dst[f] = buf + off;
        off += ds->fields[f].bytes;
    }
    msg[0] = 0;
    return ds->get(ds->user, i, dst, NULL, 0, msg, n);
}

static int64_t get_cls(stoke_dataset *ds, uint64_t i, int field)
{
    unsigned char buf[4096];
    char msg[512];
    assert_int_equal(get_sample(ds, i, buf, msg, sizeof(msg)), STOKE_OK);
    size_t off = 0;
    for (int f = 0; f < field; f++)
        off += ds->fields[f].bytes;
    int64_t v;
    memcpy(&v, buf + off, 8);
    return v;
}

static int open_tar(const char *args, stoke_dataset *ds)
{
    char spec[2048];
    snprintf(spec, sizeof(spec), "tar:%s", args);
    return stoke_source_open(spec, ds);
}

/* ---- formats ----------------------------------------------------------------------------- */

/* ustar: grouping by key (directory included), default fields from the first sample, .cls and
 * raw fields, the prefix field for long paths, members of other types skipped. */
static void test_ustar_grouping(void **state)
{
    (void)state;
    const char *dir = scratch("tar_ustar");
    char p[1200], args[1300];
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    char longdir[200];
    memset(longdir, 'd', 120);
    strcpy(longdir + 120, "/s2"); /* 123 + ".cls": needs the prefix field */
    char name[260];
    tw_str(&w, "x/s0.cls", "7\n");
    tw_str(&w, "x/s0.bin", "AAAA");
    tw_header(&w, "x/dir", 0, '5', 0); /* a directory: skipped */
    tw_str(&w, "y/s0.cls", " -3 ");    /* another key: the directory is part of it */
    tw_str(&w, "y/s0.bin", "BBBB");
    tw_header(&w, "x/link.cls", 0, '2', 0); /* a symlink: skipped */
    snprintf(name, sizeof(name), "%s.bin", longdir);
    tw_str(&w, name, "CCCC");
    snprintf(name, sizeof(name), "%s.cls", longdir);
    tw_str(&w, name, "12");
    tw_str(&w, "x/s0.txt", "other"); /* an extension no field asks for... of a new sample */
    tw_str(&w, "z/s3.cls", "4");
    tw_str(&w, "z/s3.bin", "DDDD");
    tw_end(&w);

    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s/a.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.kind, STOKE_DATASET_MAP);
    assert_int_equal(ds.nfields, 2);
    assert_string_equal(ds.fields[0].name, "cls");
    assert_int_equal(ds.fields[0].dtype, STOKE_DTYPE_I64);
    assert_string_equal(ds.fields[1].name, "bin");
    assert_int_equal(ds.fields[1].dtype, STOKE_DTYPE_U8);
    assert_int_equal(ds.fields[1].bytes, 4);
    /* x/s0, y/s0, dddd/s2, x/s0 (the .txt: a sample without fields), z/s3 */
    assert_int_equal(ds.length(ds.user), 5);
    assert_int_equal(get_cls(&ds, 0, 0), 7);
    assert_int_equal(get_cls(&ds, 1, 0), -3);
    assert_int_equal(get_cls(&ds, 2, 0), 12);
    assert_int_equal(get_cls(&ds, 4, 0), 4);
    unsigned char buf[64];
    char msg[512];
    assert_int_equal(get_sample(&ds, 2, buf, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(buf + 8, "CCCC", 4);
    assert_int_equal(get_sample(&ds, 4, buf, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(buf + 8, "DDDD", 4);
    /* the x/s0.txt group has neither field */
    assert_int_equal(get_sample(&ds, 3, buf, msg, sizeof(msg)), STOKE_EDATA);
    assert_non_null(strstr(msg, "a.tar@"));
    assert_non_null(strstr(msg, "sample 'x/s0' field 'cls': the sample has no 'cls' member"));
    stoke_dataset_close(&ds);

    /* fields= picks and orders them */
    snprintf(args, sizeof(args), "%s/a.tar,fields=bin:cls", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.nfields, 2);
    assert_string_equal(ds.fields[0].name, "bin");
    assert_int_equal(get_sample(&ds, 1, buf, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(buf, "BBBB", 4);
    int64_t v;
    memcpy(&v, buf + 4, 8);
    assert_int_equal(v, -3);
    stoke_dataset_close(&ds);
}

/* pax: a long path and a size record overriding the header's (a header size of 0); GNU: a 'L'
 * long name, a 'K' long link (skipped with its symlink), a base-256 size field. */
static void test_pax_and_gnu(void **state)
{
    (void)state;
    const char *dir = scratch("tar_pax");
    char p[1200], args[1300];
    char longname[400];
    memset(longname, 'p', 300);
    strcpy(longname + 300, "/k0.bin");
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    unsigned char big[1500];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)(i * 7);
    tw_pax(&w, longname, (int64_t)sizeof(big));
    tw_header(&w, "ignored-name.bin", 0, '0', 0); /* pax size wins */
    tw_data(&w, big, sizeof(big));
    tw_header(&w, "././@LongLink", 0, 'g', 0); /* a global header with no records */
    char gnu[300];
    memset(gnu, 'g', 200);
    strcpy(gnu + 200, "/k1.bin");
    tw_header(&w, "././@LongLink", strlen(gnu) + 1, 'L', 0);
    tw_data(&w, gnu, strlen(gnu) + 1);
    tw_header(&w, "short-k1.bin", sizeof(big), '0', 1); /* base-256 size */
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)(i * 11);
    tw_data(&w, big, sizeof(big));
    tw_header(&w, "././@LongLink", 200, 'K', 0);
    char target[200];
    memset(target, 't', sizeof(target));
    tw_data(&w, target, sizeof(target));
    tw_header(&w, "k2.bin", 0, '2', 0);       /* the symlink the long link was for */
    tw_header(&w, "PaxHeaders/g", 0, 'g', 0); /* a global header right before the end */
    tw_end(&w);

    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s/a.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.nfields, 1);
    assert_int_equal(ds.length(ds.user), 2);
    assert_int_equal(ds.fields[0].bytes, sizeof(big));
    unsigned char buf[1500];
    char msg[512];
    assert_int_equal(get_sample(&ds, 0, buf, msg, sizeof(msg)), STOKE_OK);
    for (size_t i = 0; i < sizeof(buf); i++)
        assert_int_equal(buf[i], (unsigned char)(i * 7));
    assert_int_equal(get_sample(&ds, 1, buf, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(buf, big, sizeof(big));
    stoke_dataset_close(&ds);
}

/* The walk one member at a time, made resumable (the remote walk's, tar_remote.c): a read whose
 * bytes are not in the window returns -EAGAIN and next() STOKE_EBUSY, as before the call; once
 * the window holds them, next() goes on.  The members and errors equal the plain walk's, for
 * windows of one block (a pax record or long name read over several calls) and larger. */
typedef struct mem_tar {
    const unsigned char *b;
    size_t n;
    uint64_t start, len, want; /* the window [start, start + len); want: the end asked for */
    int waits;
} mem_tar;

static int mem_read_all(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    const mem_tar *m = ctx;
    size_t have = off >= m->n ? 0 : m->n - (size_t)off;
    *got = n < have ? n : have;
    memcpy(buf, m->b + off, *got);
    return 0;
}

static int mem_read_window(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    mem_tar *m = ctx;
    uint64_t end = m->start + m->len;
    if (off < m->start || off + n > end) {
        if (!(end >= m->n && off >= m->start && off <= end)) {
            m->want = off + n;
            m->waits++;
            return -EAGAIN;
        }
    }
    return mem_read_all(ctx, buf, n, off, got);
}

typedef struct walked {
    char text[16384];
    size_t used;
} walked;

static int walked_member(void *ctx, const char *path, uint64_t hdr, uint64_t data, uint64_t size)
{
    walked *w = ctx;
    w->used += (size_t)snprintf(w->text + w->used, sizeof(w->text) - w->used,
                                "%s %" PRIu64 " %" PRIu64 " %" PRIu64 ";", path, hdr, data, size);
    return 0;
}

/* The resumable walk of m with windows of `win` bytes: its members into *out; returns next()'s
 * last code (0 for the end), with the error's message and offset. */
static int walk_resumable(mem_tar *m, size_t win, walked *out, char *err, size_t err_len,
                          uint64_t *err_off)
{
    stoke__tar_iter it;
    m->start = m->len = 0;
    m->waits = 0;
    assert_int_equal(stoke__tar_iter_init(&it, m->n, mem_read_window, m, err, err_len), 0);
    assert_int_equal(stoke__tar_iter_resumable(&it), 0);
    int rc;
    for (;;) {
        const char *path;
        uint64_t hdr, data, size;
        rc = stoke__tar_iter_next(&it, &path, &hdr, &data, &size);
        if (rc == STOKE_EBUSY) { /* "fetch" from where it starts again, then again */
            assert_true(m->want > it.off);
            m->start = it.off;
            m->len = m->want - it.off > win ? m->want - it.off : win;
            if (m->start + m->len > m->n)
                m->len = m->n - m->start;
            continue;
        }
        if (rc)
            break;
        walked_member(out, path, hdr, data, size);
    }
    *err_off = it.err_off;
    stoke__tar_iter_free(&it);
    return rc == STOKE_EEND ? 0 : rc;
}

static void test_resumable_iter(void **state)
{
    (void)state;
    const char *dir = scratch("tar_resume");
    char p[1200];
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    char longname[400];
    memset(longname, 'p', 300);
    strcpy(longname + 300, "/k0.bin");
    unsigned char big[3000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (unsigned char)(i * 7);
    tw_pax(&w, longname, (int64_t)sizeof(big));
    tw_header(&w, "ignored-name.bin", 0, '0', 0);
    tw_data(&w, big, sizeof(big));
    tw_header(&w, "PaxHeaders/g", 0, 'g', 0);
    char gnu[1300];
    memset(gnu, 'g', 1200); /* a long name over three blocks */
    strcpy(gnu + 1200, "/k1.bin");
    tw_header(&w, "././@LongLink", strlen(gnu) + 1, 'L', 0);
    tw_data(&w, gnu, strlen(gnu) + 1);
    tw_header(&w, "short-k1.bin", sizeof(big), '0', 1);
    tw_data(&w, big, sizeof(big));
    tw_header(&w, "././@LongLink", 200, 'K', 0);
    tw_data(&w, big, 200);
    tw_header(&w, "k2.bin", 0, '2', 0);
    for (int i = 0; i < 20; i++) {
        char name[32];
        snprintf(name, sizeof(name), "s%02d.cls", i);
        tw_file(&w, name, big, (size_t)(i * 97));
    }
    tw_end(&w);
    FILE *f = fopen(p, "rb");
    assert_non_null(f);
    static unsigned char bytes[1 << 16];
    size_t n = fread(bytes, 1, sizeof(bytes), f);
    fclose(f);
    assert_true(n > 10000 && n < sizeof(bytes));

    /* the archive, then cut short, then with a bad checksum in the 12th member's header */
    uint64_t bad_at = 0;
    for (int variant = 0; variant < 3; variant++) {
        static unsigned char b[1 << 16];
        memcpy(b, bytes, n);
        mem_tar m = {.b = b, .n = n};
        if (variant == 1)
            m.n = n - 3000;
        walked plain = {.used = 0};
        char perr[512], rerr[512];
        uint64_t poff = 0, roff = 0;
        int prc = stoke__tar_walk(m.n, mem_read_all, &m, walked_member, &plain, perr, sizeof(perr),
                                  &poff);
        if (variant == 0) {
            assert_int_equal(prc, 0);
            assert_non_null(strstr(plain.text, "/k1.bin"));
            assert_non_null(strstr(plain.text, "s19.cls"));
            bad_at = strtoull(strstr(plain.text, "s12.cls") + 8, NULL, 10);
        } else if (variant == 2) {
            b[bad_at + 1] ^= 0x20;
            plain.used = 0;
            prc = stoke__tar_walk(m.n, mem_read_all, &m, walked_member, &plain, perr, sizeof(perr),
                                  &poff);
        }
        if (variant)
            assert_int_equal(prc, STOKE_EFORMAT);
        size_t wins[] = {512, 1024, 4096, 1 << 20};
        for (size_t k = 0; k < sizeof(wins) / sizeof(wins[0]); k++) {
            walked r = {.used = 0};
            int rrc = walk_resumable(&m, wins[k], &r, rerr, sizeof(rerr), &roff);
            assert_int_equal(rrc, prc);
            assert_string_equal(r.text, plain.text);
            if (prc) {
                assert_string_equal(rerr, perr);
                assert_int_equal(roff, poff);
            }
            if (wins[k] == 512) /* a block at a time: a wait for (about) every member */
                assert_true(m.waits > 20);
        }
    }
}

/* Members past the 8 GiB an octal size field holds (a pax size record; a base-256 size field),
 * in a sparse file: indexed without reading their data; 64-bit offsets in the messages. */
static void need_sparse_files(const char *dir)
{
    char p[1200];
    pathf(p, sizeof(p), dir, "probe");
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    assert_int_equal(ftruncate(fileno(f), (off_t)1 << 30), 0);
    fclose(f);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    unlink(p);
    if ((uint64_t)st.st_blocks * 512u > (1u << 20))
        tu_skip("the scratch file system has no sparse files");
}

static void test_big_sizes(void **state)
{
    (void)state;
    const char *dir = scratch("tar_big");
    char p[1200], args[1300];
    need_sparse_files(dir);
    const uint64_t big = (UINT64_C(9) << 30) + 3; /* 9 GiB + 3 */
    const uint64_t padded = (big + 511) / 512 * 512;
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    tw_pax(&w, NULL, (int64_t)big);
    tw_header(&w, "k0.bin", 0, '0', 0); /* pax size wins over 0: data at 1536 */
    assert_int_equal(fseeko(w.f, (off_t)(1536 + padded), SEEK_SET), 0);
    tw_header(&w, "k1.bin", big, '0', 1); /* base-256 */
    assert_int_equal(fseeko(w.f, (off_t)(1536 + padded + 512 + padded), SEEK_SET), 0);
    tw_str(&w, "k2.bin", "tiny");
    tw_end(&w);
    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s/a.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 3);
    assert_int_equal(ds.fields[0].bytes, big);
    assert_int_equal(ds.fields[0].shape[0], (int64_t)big);
    char msg[512], want[1400];
    void *dst[TU_FIELDS] = {msg};
    assert_int_equal(ds.get(ds.user, 2, dst, NULL, 0, msg, sizeof(msg)), STOKE_EFORMAT);
    snprintf(want, sizeof(want), "a.tar@%" PRIu64 ": sample 'k2' field 'bin': member of 4 bytes",
             1536 + padded + 512 + padded);
    if (!strstr(msg, want))
        fail_msg("%s\nwanted %s", msg, want);
    stoke_dataset_close(&ds);
    /* cut inside the second member's data: the offset of its header */
    assert_int_equal(truncate(p, (off_t)(1536 + padded + 512 + 100)), 0);
    assert_int_equal(open_tar(args, &ds), STOKE_EFORMAT);
    snprintf(want, sizeof(want), "at byte %" PRIu64 ": truncated: member 'k1.bin'", 1536 + padded);
    assert_non_null(strstr(stoke_last_error(), want));
    unlink(p);
}

/* A .jpg member over the images limit (256 MiB, as images: refuses files), in a sparse shard:
 * refused from its header's size (STOKE_ELIMIT naming shard, member and size) before anything
 * is allocated or read -- a shard of a few KB of data must not cost its members' sizes in
 * memory.  The member below the limit beside it still reaches the decoder. */
static void test_big_jpg_member(void **state)
{
    (void)state;
    if (!stoke__tar_image_hook_get())
        tu_skip("this build has no images module (.jpg fields are refused at open)");
    const char *dir = scratch("tar_bigjpg");
    need_sparse_files(dir);
    char p[1200], args[1300];
    const uint64_t big = ((uint64_t)256 << 20) + 1;
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    tw_str(&w, "k0.jpg", "\xff\xd8\xff"); /* header at 0 */
    tw_header(&w, "k1.jpg", big, '0', 0); /* header at 1024, data at 1536 */
    assert_int_equal(fseeko(w.f, (off_t)(1536 + (big + 511) / 512 * 512), SEEK_SET), 0);
    tw_end(&w);
    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s/a.tar,fields=jpg,size=8", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 2);
    unsigned char buf[3 * 8 * 8];
    char msg[512], want[1400];
    assert_int_equal(get_sample(&ds, 1, buf, msg, sizeof(msg)), STOKE_ELIMIT);
    snprintf(want, sizeof(want),
             "tar %s/a.tar@1024: sample 'k1' field 'jpg': member 'k1.jpg' of 268435457 bytes "
             "is larger than the limit",
             dir);
    if (!strstr(msg, want))
        fail_msg("%s\nwanted %s", msg, want);
    assert_int_equal(get_sample(&ds, 0, buf, msg, sizeof(msg)), STOKE_EFORMAT); /* decoded */
    assert_non_null(strstr(msg, "sample 'k0' field 'jpg': corrupt JPEG"));
    stoke_dataset_close(&ds);
}

/* The same members through GNU tar in its three formats (long names included): the same
 * samples, in member order. */
static void test_gnu_tar_formats(void **state)
{
    (void)state;
    if (system("tar --version >/dev/null 2>&1") != 0)
        tu_skip("GNU tar is not installed");
    const char *dir = scratch("tar_gnu");
    char cmd[4096], args[1300];
    char ldir[160];
    memset(ldir, 'L', 150);
    ldir[150] = 0;
    snprintf(cmd, sizeof(cmd),
             "cd '%s' && mkdir -p src/%s && cd src && for i in 0 1 2; do printf $i > "
             "%s/s$i.cls; printf \"data$i\" > %s/s$i.bin; done",
             dir, ldir, ldir, ldir);
    assert_int_equal(system(cmd), 0);
    const char *fmts[] = {"ustar", "pax", "gnu"};
    for (size_t k = 0; k < 3; k++) {
        snprintf(cmd, sizeof(cmd),
                 "cd '%s/src' && tar --format=%s -cf ../%s.tar %s/s0.cls %s/s0.bin %s/s1.cls "
                 "%s/s1.bin %s/s2.cls %s/s2.bin",
                 dir, fmts[k], fmts[k], ldir, ldir, ldir, ldir, ldir, ldir);
        if (k == 0) /* ustar cannot hold 150 + 7 characters without a '/' split: still fine */
            assert_int_equal(system(cmd), 0);
        else
            assert_int_equal(system(cmd), 0);
        stoke_dataset ds;
        snprintf(args, sizeof(args), "%s/%s.tar,fields=cls:bin", dir, fmts[k]);
        assert_int_equal(open_tar(args, &ds), STOKE_OK);
        assert_int_equal(ds.length(ds.user), 3);
        for (uint64_t i = 0; i < 3; i++) {
            unsigned char buf[64];
            char msg[512], want[8];
            assert_int_equal(get_sample(&ds, i, buf, msg, sizeof(msg)), STOKE_OK);
            int64_t v;
            memcpy(&v, buf, 8);
            assert_int_equal(v, (int64_t)i);
            snprintf(want, sizeof(want), "data%d", (int)i);
            assert_memory_equal(buf + 8, want, 5);
        }
        stoke_dataset_close(&ds);
    }
}

/* .npy members: dtype and shape from the first, data read past the header, big-endian swapped;
 * a different shape is the sample's error naming shard, key and field. */
static void npy_bytes(unsigned char *out, size_t *n, const char *descr, const char *shape,
                      const void *data, size_t len)
{
    char dict[128];
    int dl = snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                      descr, shape);
    size_t hlen = (size_t)dl + 1;
    while ((10 + hlen) % 64)
        hlen++;
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(hlen & 0xff);
    out[9] = (unsigned char)(hlen >> 8);
    memset(out + 10, ' ', hlen);
    memcpy(out + 10, dict, (size_t)dl);
    out[10 + hlen - 1] = '\n';
    memcpy(out + 10 + hlen, data, len);
    *n = 10 + hlen + len;
}

static void test_npy_fields(void **state)
{
    (void)state;
    const char *dir = scratch("tar_npy");
    char p[1200], args[1300];
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    unsigned char m[512];
    size_t n;
    float a0[6] = {0, 1, 2, 3, 4, 5}, a1[6] = {6, 7, 8, 9, 10, 11};
    npy_bytes(m, &n, "<f4", "(2, 3)", a0, sizeof(a0));
    tw_file(&w, "s0.npy", m, n);
    tw_str(&w, "s0.cls", "0");
    unsigned char be[24];
    for (int i = 0; i < 6; i++) { /* big-endian float 6..11 */
        uint32_t u;
        memcpy(&u, &a1[i], 4);
        for (int b = 0; b < 4; b++)
            be[i * 4 + b] = (unsigned char)(u >> (24 - 8 * b));
    }
    npy_bytes(m, &n, ">f4", "(2, 3)", be, sizeof(be));
    tw_file(&w, "s1.npy", m, n);
    tw_str(&w, "s1.cls", "1");
    npy_bytes(m, &n, "<f4", "(3, 2)", a0, sizeof(a0)); /* another shape */
    tw_file(&w, "s2.npy", m, n);
    tw_str(&w, "s2.cls", "2");
    tw_end(&w);
    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s/a.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_string_equal(ds.fields[0].name, "npy");
    assert_int_equal(ds.fields[0].dtype, STOKE_DTYPE_F32);
    assert_int_equal(ds.fields[0].ndim, 2);
    assert_int_equal(ds.fields[0].shape[0], 2);
    assert_int_equal(ds.fields[0].shape[1], 3);
    assert_int_equal(ds.fields[0].bytes, 24);
    unsigned char buf[64];
    char msg[512];
    assert_int_equal(get_sample(&ds, 0, buf, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(buf, a0, sizeof(a0));
    assert_int_equal(get_sample(&ds, 1, buf, msg, sizeof(msg)), STOKE_OK);
    assert_memory_equal(buf, a1, sizeof(a1));
    assert_int_equal(get_sample(&ds, 2, buf, msg, sizeof(msg)), STOKE_EFORMAT);
    assert_non_null(strstr(msg, "sample 's2' field 'npy'"));
    assert_non_null(strstr(msg, "differs from the first sample's"));
    stoke_dataset_close(&ds);
}

/* A raw member of another size, a .cls that is not a number, and .jpg without the images
 * module. */
static void test_field_errors(void **state)
{
    (void)state;
    const char *dir = scratch("tar_ferr");
    char p[1200], args[1300];
    tw w;
    tw_open(&w, pathf(p, sizeof(p), dir, "a.tar"));
    tw_str(&w, "s0.bin", "abcd");
    tw_str(&w, "s0.cls", "1");
    tw_str(&w, "s1.bin", "abcdef");
    tw_str(&w, "s1.cls", "2");
    tw_str(&w, "s2.bin", "wxyz");
    tw_str(&w, "s2.cls", "cat");
    tw_str(&w, "s3.jpg", "\xff\xd8\xff");
    tw_end(&w);
    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s/a.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    unsigned char buf[64];
    char msg[512], want[1400];
    assert_int_equal(get_sample(&ds, 1, buf, msg, sizeof(msg)), STOKE_EFORMAT);
    /* s1.bin's header is the third block of 512 bytes * 2 per member: at byte 2048 */
    snprintf(want, sizeof(want), "tar %s/a.tar@2048: sample 's1' field 'bin': member of 6 bytes",
             dir);
    assert_non_null(strstr(msg, want));
    assert_int_equal(get_sample(&ds, 2, buf, msg, sizeof(msg)), STOKE_EFORMAT);
    assert_non_null(strstr(msg, "sample 's2' field 'cls': 'cat' is not a decimal class number"));
    stoke_dataset_close(&ds);
    snprintf(args, sizeof(args), "%s/a.tar,fields=jpg", dir);
    if (!stoke__tar_image_hook_get()) { /* this build has no images module */
        assert_int_equal(open_tar(args, &ds), STOKE_ENOTSUP);
        assert_non_null(strstr(stoke_last_error(), "tar: .jpg fields need the images module"));
    }
    snprintf(args, sizeof(args), "%s/a.tar,size=224", dir);
    if (!stoke__tar_image_hook_get()) { /* this build has no images module */
        assert_int_equal(open_tar(args, &ds), STOKE_EINVAL);
        assert_non_null(strstr(stoke_last_error(), "unknown option 'size'"));
    }
    snprintf(args, sizeof(args), "%s/a.tar,fields=a:a", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_EINVAL);
    snprintf(args, sizeof(args), "%s/a.tar,fields=zzz", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_EFORMAT);
    assert_non_null(strstr(stoke_last_error(), "no sample has a 'zzz' member"));
}

/* ---- corrupt archives -------------------------------------------------------------------- */

static void write_plain(const char *path, int members)
{
    tw w;
    tw_open(&w, path);
    for (int i = 0; i < members; i++) {
        char name[32], data[700];
        snprintf(name, sizeof(name), "s%d.bin", i);
        memset(data, 'a' + i, sizeof(data));
        tw_file(&w, name, data, sizeof(data)); /* 512 + 1024 bytes per member */
    }
    tw_end(&w);
}

static void expect_open_error(const char *path, int code, const char *needle)
{
    stoke_dataset ds;
    char args[1300];
    snprintf(args, sizeof(args), "%s", path);
    int rc = open_tar(args, &ds);
    if (rc != code || !strstr(stoke_last_error(), needle) || !strstr(stoke_last_error(), path))
        fail_msg("open %s: %s (%s), wanted %s with '%s'", path, stoke_err_name(rc),
                 stoke_last_error(), stoke_err_name(code), needle);
    assert_int_equal(ds.user, NULL);
}

static void test_truncated(void **state)
{
    (void)state;
    const char *dir = scratch("tar_trunc");
    char p[1200];
    pathf(p, sizeof(p), dir, "a.tar");
    write_plain(p, 3); /* members at 0, 1536, 3072; end blocks at 4608 */
    assert_int_equal(truncate(p, 1536 + 512 + 100), 0); /* inside member 2's data */
    expect_open_error(p, STOKE_EFORMAT,
                      "at byte 1536: truncated: member 's1.bin' at byte 1536 "
                      "has 700 bytes of data but the file ends at byte 2148");
    write_plain(p, 3);
    assert_int_equal(truncate(p, 3072 + 200), 0); /* inside a header */
    expect_open_error(p, STOKE_EFORMAT,
                      "at byte 3072: truncated: a header at byte 3072 is cut "
                      "short");
    write_plain(p, 3);
    assert_int_equal(truncate(p, 4608), 0); /* no end-of-archive block */
    expect_open_error(p, STOKE_EFORMAT,
                      "at byte 4608: truncated: the archive ends at byte 4608 "
                      "without its end-of-archive block");
}

/* GNU sparse members (tar --sparse) are refused at open, STOKE_ENOTSUP naming the shard: a pax
 * member with GNU.sparse.* records (format 1.0: its data is a map and the fragments, under
 * ./GNUSparseFile.PID/NAME: read as another sample's bytes, the real one missing) and a GNU
 * 'S' member (it was skipped: the sample lost with "no 'bin' member"). */
static void test_sparse_members(void **state)
{
    (void)state;
    const char *dir = scratch("tar_sparse");
    char p[1200];
    static const char rec[] = "22 GNU.sparse.major=1\n22 GNU.sparse.minor=0\n"
                              "26 GNU.sparse.name=s0.bin\n";
    pathf(p, sizeof(p), dir, "pax.tar");
    tw w;
    tw_open(&w, p);
    tw_str(&w, "s0.cls", "1");
    tw_header(&w, "PaxHeaders/s0.bin", sizeof(rec) - 1, 'x', 0);
    tw_data(&w, rec, sizeof(rec) - 1);
    tw_str(&w, "GNUSparseFile.7/s0.bin", "1\n0\n5\n");
    tw_end(&w);
    expect_open_error(p, STOKE_ENOTSUP, "at byte 1024: a GNU sparse file (made by tar --sparse)");
    pathf(p, sizeof(p), dir, "gnu.tar");
    tw_open(&w, p);
    tw_str(&w, "s0.cls", "1");
    tw_header(&w, "s0.bin", 0, 'S', 0);
    tw_end(&w);
    expect_open_error(p, STOKE_ENOTSUP,
                      "member 's0.bin' at byte 1024 is a GNU sparse file (made by tar --sparse)");
}

static void patch(const char *path, long off, const void *bytes, size_t n)
{
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    assert_int_equal(fseek(f, off, SEEK_SET), 0);
    assert_int_equal(fwrite(bytes, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
}

/* n bytes 'q' written to path, opened with mode ("wb", "ab"). */
static void write_q(const char *path, const char *mode, int n)
{
    FILE *f = fopen(path, mode);
    assert_non_null(f);
    for (int i = 0; i < n; i++)
        fputc('q', f);
    assert_int_equal(fclose(f), 0);
}

static void test_corrupt_headers(void **state)
{
    (void)state;
    const char *dir = scratch("tar_corrupt");
    char p[1200];
    pathf(p, sizeof(p), dir, "a.tar");
    write_plain(p, 3);
    patch(p, 1536 + 10, "Z", 1); /* a name byte of member 2: checksum no longer matches */
    expect_open_error(p, STOKE_EFORMAT, "at byte 1536: bad header checksum");
    write_plain(p, 3);
    patch(p, 3072 + 124, "9", 1); /* a size digit that is not octal (checksum kept valid?) */
    expect_open_error(p, STOKE_EFORMAT, "at byte 3072: bad header checksum");
    /* a bad pax record: a length that does not fit */
    tw w;
    tw_open(&w, p);
    tw_header(&w, "PaxHeaders/x", 12, 'x', 0);
    tw_data(&w, "99 path=ab\n\n", 12);
    tw_str(&w, "s0.bin", "x");
    tw_end(&w);
    expect_open_error(p, STOKE_EFORMAT, "bad pax record at byte 0 of the extended header");
    expect_open_error(p, STOKE_EFORMAT, "(pax header at byte 0)");
    /* a long name with no member after it */
    tw_open(&w, p);
    tw_str(&w, "s0.bin", "x");
    tw_header(&w, "././@LongLink", 6, 'L', 0);
    tw_data(&w, "a.bin", 6);
    tw_end(&w);
    expect_open_error(p, STOKE_EFORMAT,
                      "at byte 2048: the archive ends at byte 2048 right after "
                      "an extension header");
    /* a lone zero block with members after it: they were lost without a word */
    static const unsigned char zeros[512];
    tw_open(&w, p);
    tw_str(&w, "s0.bin", "x");
    tw_data(&w, zeros, sizeof(zeros));
    tw_str(&w, "s1.bin", "y");
    tw_end(&w);
    expect_open_error(p, STOKE_EFORMAT,
                      "at byte 1024: the end-of-archive block, and a header after it at byte "
                      "1536: the members from there would be lost");
    /* the end, then bytes that are no header (garbage after a tar's end): read as tar does */
    tw_open(&w, p);
    tw_str(&w, "s0.bin", "x");
    tw_end(&w);
    write_q(p, "ab", 700);
    stoke_dataset ds;
    assert_int_equal(stoke_tar_open(p, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 1);
    stoke_dataset_close(&ds);
    /* not a tar file at all */
    write_q(p, "wb", 2048);
    expect_open_error(p, STOKE_EFORMAT, "at byte 0: bad header checksum field");
    pathf(p, sizeof(p), dir, "missing.tar");
    expect_open_error(p, STOKE_ENOENT, "cannot open");
}

/* A size field fixed up with a valid checksum: the octal parser itself must refuse it. */
static void test_parse_block(void **state)
{
    (void)state;
    unsigned char b[512];
    memset(b, 0, sizeof(b));
    memcpy(b, "a.bin", 5);
    memcpy(b + 124, "0000000001x", 11); /* not octal */
    b[156] = '0';
    memset(b + 148, ' ', 8);
    unsigned sum = 0;
    for (int i = 0; i < 512; i++)
        sum += b[i];
    snprintf((char *)b + 148, 8, "%06o", sum);
    stoke__tar_block blk;
    char err[160];
    assert_int_equal(stoke__tar_parse_block(b, &blk, err, sizeof(err)), STOKE_EFORMAT);
    assert_non_null(strstr(err, "bad size field"));
    /* base-256: a negative size (0xff...) and one past 2^63 are refused, 0x80... is read */
    const unsigned char neg[12] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
                                   0xff, 0xff, 0xff, 0xff, 0xff, 0xfe};
    const unsigned char huge[12] = {0x80, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0, 1};
    const unsigned char good[12] = {0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34};
    const unsigned char *sizes[3] = {neg, huge, good};
    for (int k = 0; k < 3; k++) {
        memcpy(b + 124, sizes[k], 12);
        memset(b + 148, ' ', 8);
        sum = 0;
        for (int i = 0; i < 512; i++)
            sum += b[i];
        snprintf((char *)b + 148, 8, "%06o", sum);
        int rc = stoke__tar_parse_block(b, &blk, err, sizeof(err));
        if (k < 2) {
            assert_int_equal(rc, STOKE_EFORMAT);
            assert_non_null(strstr(err, "bad size field"));
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(blk.size, 0x1234);
            assert_string_equal(blk.name, "a.bin");
        }
    }
    memset(b, 0, sizeof(b));
    assert_int_equal(stoke__tar_parse_block(b, &blk, err, sizeof(err)), STOKE_EEND);
    /* pax records */
    char path[64];
    uint64_t size = 0;
    int has = 0;
    const char *ok = "13 size=1234\n11 path=ab\n";
    assert_int_equal(
        stoke__tar_parse_pax(ok, strlen(ok), path, sizeof(path), &size, &has, err, sizeof(err)), 0);
    assert_int_equal(has, 1);
    assert_int_equal(size, 1234);
    assert_string_equal(path, "ab");
    const char *bad[] = {"x", "5 a=b\n", "12 size=12a\n", "6 =bb\n", "10 pathab\n", "8 a=bc\n"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_int_equal(stoke__tar_parse_pax(bad[i], strlen(bad[i]), path, sizeof(path), &size,
                                              &has, err, sizeof(err)),
                         STOKE_EFORMAT);
}

/* ---- shard lists ------------------------------------------------------------------------- */

static void write_shard(const char *path, int first, int n)
{
    tw w;
    tw_open(&w, path);
    for (int i = first; i < first + n; i++) {
        char name[64], v[32];
        snprintf(name, sizeof(name), "k%04d.cls", i);
        snprintf(v, sizeof(v), "%d", i);
        tw_str(&w, name, v);
        snprintf(name, sizeof(name), "k%04d.dat", i);
        char d[16];
        memset(d, 0, sizeof(d));
        memcpy(d, &i, sizeof(i));
        tw_file(&w, name, d, sizeof(d));
    }
    tw_end(&w);
}

static const char *make_shards(void)
{
    const char *dir = scratch("tar_shards");
    char p[1200];
    for (int s = 0; s < 12; s++) {
        char name[64];
        snprintf(name, sizeof(name), "train-%06d.tar", s);
        write_shard(pathf(p, sizeof(p), dir, name), s * 10, 7 + s % 3); /* 7..9 per shard */
    }
    return dir;
}

static void test_shard_lists(void **state)
{
    (void)state;
    const char *dir = make_shards();
    char args[1300];
    stoke_dataset ds;
    /* a zero-padded range, in range order: shards 2, 3, 4 */
    snprintf(args, sizeof(args), "%s/train-{000002..000004}.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 7 + 8 + 9 - 8 + 8 - 7 + 7); /* 9 + 7 + 8 */
    assert_int_equal(get_cls(&ds, 0, 0), 20);
    assert_int_equal(get_cls(&ds, 9, 0), 30);
    assert_int_equal(get_cls(&ds, 16, 0), 40);
    stoke_dataset_close(&ds);
    /* a descending range and a list: the order as written */
    snprintf(args, sizeof(args), "%s/train-{000001..000000}.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(get_cls(&ds, 0, 0), 10);
    stoke_dataset_close(&ds);
    snprintf(args, sizeof(args), "%s/train-00000{5,1}.tar,fields=dat", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.nfields, 1);
    assert_int_equal(ds.length(ds.user), 9 + 8);
    stoke_dataset_close(&ds);
    /* groups nested in a list, as braceexpand's: shards 5, 1, 11 */
    snprintf(args, sizeof(args), "%s/train-0000{0{5,1},11}.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.length(ds.user), 9 + 8 + 9);
    assert_int_equal(get_cls(&ds, 0, 0), 50);
    assert_int_equal(get_cls(&ds, 9, 0), 10);
    assert_int_equal(get_cls(&ds, 17, 0), 110);
    stoke_dataset_close(&ds);
    snprintf(args, sizeof(args), "%s/train-0000{0{5,1},11.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "'{' without '}'"));
    /* a glob: sorted */
    snprintf(args, sizeof(args), "%s/train-*.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    uint64_t n = ds.length(ds.user);
    assert_int_equal(n, 4 * (7 + 8 + 9));
    assert_int_equal(get_cls(&ds, 0, 0), 0);
    assert_int_equal(get_cls(&ds, n - 1, 0), 118);
    stoke_dataset_close(&ds);
    snprintf(args, sizeof(args), "%s/nothing-*.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_ENOENT);
    assert_non_null(strstr(stoke_last_error(), "no file matches"));
    snprintf(args, sizeof(args), "%s/train-{000010..000013}.tar", dir);
    assert_int_equal(open_tar(args, &ds), STOKE_ENOENT); /* 000012 does not exist */
    assert_non_null(strstr(stoke_last_error(), "train-000012.tar: cannot open"));
}

/* (index, content) of every delivered sample, in delivery order. */
typedef struct run_out {
    uint64_t n;
    uint64_t idx[512];
    int64_t cls[512];
} run_out;

static void run_loader(const char *args, int workers, int shuffle, int64_t rank, int64_t world,
                       run_out *out)
{
    stoke_dataset ds;
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 5;
    o.num_workers = workers;
    o.shuffle = shuffle;
    o.seed = 99;
    o.pin_memory = 0;
    if (world) {
        o.sampler.distributed = 1;
        o.sampler.rank = rank;
        o.sampler.world_size = world;
        o.sampler.drop_last = 1;
    }
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    int rc;
    out->n = 0;
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        const int64_t *cls = stoke_batch_data(b, 0);
        const unsigned char *dat = stoke_batch_data(b, 1);
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            assert_true(out->n < 512);
            int32_t v;
            memcpy(&v, dat + j * 16, 4);
            assert_int_equal(v, cls[j]); /* the two fields of one sample */
            out->idx[out->n] = stoke_batch_indices(b)[j];
            out->cls[out->n++] = cls[j];
        }
        stoke_batch_release(b);
    }
    if (rc != STOKE_EEND)
        fail_msg("loader: %s", stoke_loader_last_error(l));
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
}

/* Worker-count independence and distributed shares, exactly as for any map-style dataset. */
static void test_loader_workers_ranks(void **state)
{
    (void)state;
    const char *dir = make_shards();
    char args[1300];
    snprintf(args, sizeof(args), "%s/train-{000000..000011}.tar", dir);
    static run_out r0, r1, r2;
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        run_loader(args, 0, shuffle, 0, 0, &r0);
        run_loader(args, 1, shuffle, 0, 0, &r1);
        run_loader(args, 2, shuffle, 0, 0, &r2);
        assert_int_equal(r0.n, 96);
        assert_int_equal(r1.n, 96);
        assert_int_equal(r2.n, 96);
        assert_memory_equal(r0.idx, r1.idx, sizeof(uint64_t) * 96);
        assert_memory_equal(r0.idx, r2.idx, sizeof(uint64_t) * 96);
        assert_memory_equal(r0.cls, r2.cls, sizeof(int64_t) * 96);
        /* canonical index: shard order then member order; key k<10*s + j> */
        for (uint64_t i = 0; i < 96; i++) {
            uint64_t idx = r0.idx[i], s = 0, left = idx;
            while (left >= (uint64_t)(7 + s % 3))
                left -= 7 + s % 3, s++;
            assert_int_equal(r0.cls[i], (int64_t)(s * 10 + left));
        }
        if (!shuffle)
            for (uint64_t i = 0; i < 96; i++)
                assert_int_equal(r0.idx[i], i);
    }
    /* three ranks: disjoint shares covering the epoch (96 = 3 x 32) */
    unsigned char seen[96] = {0};
    for (int64_t rank = 0; rank < 3; rank++) {
        run_loader(args, (int)rank, 1, rank, 3, &r0);
        assert_int_equal(r0.n, 32);
        for (uint64_t i = 0; i < 32; i++) {
            assert_true(r0.idx[i] < 96);
            assert_int_equal(seen[r0.idx[i]], 0);
            seen[r0.idx[i]] = 1;
        }
    }
    for (int i = 0; i < 96; i++)
        assert_int_equal(seen[i], 1);
}

/* ragged=txt / packed=txt: .txt members of 0 to 40 bytes through the loader (1 and 2 workers),
 * each sample's bytes and length exact, padded with zeros to the batch's longest or packed with
 * offsets; max_len is the longest member; a .cls or unknown field is refused; without the option
 * the sizes must agree, as before. */
static void txt_of(int i, char *out, size_t *n)
{
    *n = (size_t)((i * 11) % 41); /* 0 .. 40 */
    for (size_t k = 0; k < *n; k++)
        out[k] = (char)('a' + (i + (int)k) % 26);
}

static void test_ragged_members(void **state)
{
    (void)state;
    const char *dir = scratch("ragged");
    char path[1200], name[64], txt[64], args[1400];
    enum { RN = 37 };
    tw w;
    tw_open(&w, pathf(path, sizeof(path), dir, "r.tar"));
    for (int i = 0; i < RN; i++) {
        size_t n;
        txt_of(i, txt, &n);
        snprintf(name, sizeof(name), "s%03d.txt", i);
        tw_file(&w, name, txt, n);
        snprintf(name, sizeof(name), "s%03d.cls", i);
        char cls[16];
        snprintf(cls, sizeof(cls), "%d", i);
        tw_str(&w, name, cls);
    }
    tw_end(&w);
    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s,fields=txt:cls", path);
    assert_int_equal(open_tar(args, &ds), STOKE_OK); /* without the option: one size needed */
    unsigned char buf[256];
    char msg[512];
    assert_int_equal(get_sample(&ds, 1, buf, msg, sizeof(msg)), STOKE_EFORMAT);
    assert_non_null(strstr(msg, "raw fields need one size"));
    stoke_dataset_close(&ds);
    snprintf(args, sizeof(args), "%s,fields=txt:cls,ragged=cls", path);
    assert_int_equal(open_tar(args, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "neither raw nor .npy"));
    snprintf(args, sizeof(args), "%s,fields=txt:cls,packed=json", path);
    assert_int_equal(open_tar(args, &ds), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "not a field"));
    for (int pack = 0; pack < 2; pack++)
        for (int workers = 1; workers <= 2; workers++) {
            snprintf(args, sizeof(args), "%s,fields=txt:cls,%s=txt", path,
                     pack ? "packed" : "ragged");
            assert_int_equal(open_tar(args, &ds), STOKE_OK);
            assert_int_equal(ds.fields[0].shape[0], STOKE_DIM_VAR);
            assert_int_equal(ds.fields[0].max_len, 40);
            assert_int_equal(ds.fields[0].collate, pack ? STOKE_COLLATE_PACK : STOKE_COLLATE_PAD);
            stoke_loader_opts o;
            stoke_loader_opts_init(&o);
            o.batch_size = 5;
            o.num_workers = workers;
            o.shuffle = 1;
            o.pin_memory = 0;
            stoke_loader *l;
            assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
            stoke_batch *b;
            int seen[RN] = {0};
            while (stoke_loader_next(l, &b) == STOKE_OK) {
                size_t c = stoke_batch_count(b);
                const unsigned char *d = stoke_batch_data(b, 0);
                const int64_t *len = stoke_batch_lengths(b, 0), *off = stoke_batch_offsets(b, 0);
                const int64_t *cls = stoke_batch_data(b, 1);
                int64_t shape[2];
                int nd;
                assert_int_equal(stoke_batch_shape(b, 0, shape, 2, &nd), STOKE_OK);
                int64_t longest = 0;
                for (size_t j = 0; j < c; j++)
                    longest = len[j] > longest ? len[j] : longest;
                assert_int_equal(shape[pack ? 0 : 1], pack ? off[c] : longest);
                for (size_t j = 0; j < c; j++) {
                    int i = (int)cls[j];
                    assert_int_equal((int)stoke_batch_indices(b)[j], i); /* key order */
                    seen[i]++;
                    size_t n;
                    txt_of(i, txt, &n);
                    assert_int_equal(len[j], (int64_t)n);
                    const unsigned char *p = pack ? d + off[j] : d + j * (size_t)longest;
                    assert_memory_equal(p, txt, n);
                    for (int64_t k = (int64_t)n; !pack && k < longest; k++)
                        assert_int_equal(p[k], 0);
                }
                stoke_batch_release(b);
            }
            for (int i = 0; i < RN; i++)
                assert_int_equal(seen[i], 1);
            stoke_loader_destroy(l);
            stoke_dataset_close(&ds);
        }
}

/* packed=npy: token arrays (.npy, int32, (n, 2)) of 0 to 6 rows, through the loader: each
 * sample's rows and length exact, big-endian members swapped; max_len from the members' sizes;
 * a member whose second dimension differs is the sample's error. */
static void test_ragged_npy(void **state)
{
    (void)state;
    const char *dir = scratch("ragged_npy");
    char path[1200], name[64], args[1400], shape[32];
    enum { RN = 20 };
    tw w;
    tw_open(&w, pathf(path, sizeof(path), dir, "t.tar"));
    for (int i = 0; i < RN; i++) {
        int rows = (i * 5) % 7; /* 0 .. 6 */
        int32_t v[12];
        unsigned char m[512];
        size_t n;
        for (int k = 0; k < 2 * rows; k++)
            v[k] = i * 100 + k;
        int big = i % 3 == 0;
        for (int k = 0; big && k < 2 * rows; k++)
            v[k] = (int32_t)__builtin_bswap32((uint32_t)v[k]);
        snprintf(shape, sizeof(shape), "(%d, 2)", rows);
        npy_bytes(m, &n, big ? ">i4" : "<i4", shape, v, (size_t)rows * 8);
        snprintf(name, sizeof(name), "s%03d.npy", i);
        tw_file(&w, name, m, n);
    }
    tw_end(&w);
    stoke_dataset ds;
    snprintf(args, sizeof(args), "%s,packed=npy", path);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    assert_int_equal(ds.fields[0].ndim, 2);
    assert_int_equal(ds.fields[0].shape[0], STOKE_DIM_VAR);
    assert_int_equal(ds.fields[0].shape[1], 2);
    assert_true(ds.fields[0].max_len >= 6);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 6;
    o.num_workers = 2;
    o.pin_memory = 0;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_OK);
    stoke_batch *b;
    size_t got = 0;
    while (stoke_loader_next(l, &b) == STOKE_OK) {
        const int32_t *d = stoke_batch_data(b, 0);
        const int64_t *len = stoke_batch_lengths(b, 0), *off = stoke_batch_offsets(b, 0);
        for (size_t j = 0; j < stoke_batch_count(b); j++) {
            int i = (int)stoke_batch_indices(b)[j];
            assert_int_equal(len[j], (i * 5) % 7);
            for (int64_t k = 0; k < 2 * len[j]; k++)
                assert_int_equal(d[off[j] * 2 + k], i * 100 + k);
            got++;
        }
        stoke_batch_release(b);
    }
    assert_int_equal(got, RN);
    stoke_loader_destroy(l);
    stoke_dataset_close(&ds);
    /* another second dimension: that sample fails, naming it */
    tw_open(&w, pathf(path, sizeof(path), dir, "u.tar"));
    int32_t v[6] = {1, 2, 3, 4, 5, 6};
    unsigned char m[512];
    size_t n;
    npy_bytes(m, &n, "<i4", "(3, 2)", v, 24);
    tw_file(&w, "a.npy", m, n);
    npy_bytes(m, &n, "<i4", "(2, 3)", v, 24);
    tw_file(&w, "b.npy", m, n);
    tw_end(&w);
    snprintf(args, sizeof(args), "%s,ragged=npy", path);
    assert_int_equal(open_tar(args, &ds), STOKE_OK);
    unsigned char buf[512];
    int64_t lens[1];
    void *dst[1] = {buf};
    char msg[512] = "";
    assert_int_equal(ds.get(ds.user, 0, dst, lens, 0, msg, sizeof(msg)), STOKE_OK);
    assert_int_equal(lens[0], 3);
    assert_int_equal(ds.get(ds.user, 1, dst, lens, 0, msg, sizeof(msg)), STOKE_EFORMAT);
    assert_non_null(strstr(msg, "but for the first dimension"));
    stoke_dataset_close(&ds);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ustar_grouping),
        cmocka_unit_test(test_pax_and_gnu),
        cmocka_unit_test(test_big_sizes),
        cmocka_unit_test(test_big_jpg_member),
        cmocka_unit_test(test_gnu_tar_formats),
        cmocka_unit_test(test_npy_fields),
        cmocka_unit_test(test_field_errors),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_sparse_members),
        cmocka_unit_test(test_corrupt_headers),
        cmocka_unit_test(test_parse_block),
        cmocka_unit_test(test_shard_lists),
        cmocka_unit_test(test_loader_workers_ranks),
        cmocka_unit_test(test_ragged_members),
        cmocka_unit_test(test_ragged_npy),
        cmocka_unit_test(test_resumable_iter),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
