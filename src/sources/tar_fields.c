/* The tar source's fields: what a member becomes in the batch, by extension (.cls, .npy,
 * .jpg/.jpeg through the image hook, anything else raw bytes), and reading one at get() time.
 *
 * The image hook: the JPEG decoder lives in the images module (src/sources/image.h).  When a
 * build has it, STOKE__TAR_WITH_IMAGES connects the hook below to stoke__image_*; without it a
 * .jpg / .jpeg field is refused at open with STOKE_ENOTSUP ("tar: .jpg fields need the images
 * module"). */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/image.h" /* STOKE__IMAGE_FILE_MAX; the decoder only with libjpeg */
#include "sources/npy_header.h"
#include "sources/tar_internal.h"

#ifdef STOKE_HAVE_LIBJPEG /* the images module's decoder is in this build */
#define STOKE__TAR_WITH_IMAGES 1
#endif

#ifdef STOKE__TAR_WITH_IMAGES
static void img_init(void *o)
{
    stoke__image_opts_init(o);
}
static int img_parse(void *o, const char *key, const char *val, char *msg, size_t msg_len)
{
    return stoke__image_parse_opt(o, key, val, msg, msg_len);
}
static int img_field(const void *o, stoke_field *f, int64_t shape[3])
{
    return stoke__image_field(o, f, shape);
}
static int img_decode(const void *o, const void *jpeg, size_t len, uint64_t epoch, uint64_t index,
                      void *dst, char *msg, size_t msg_len)
{
    return stoke__image_decode(o, jpeg, len, epoch, index, dst, msg, msg_len);
}
static const stoke__tar_image_hook IMAGE_HOOK = {sizeof(stoke__image_opts), img_init, img_parse,
                                                 img_field, img_decode};
const stoke__tar_image_hook *stoke__tar_image_hook_get(void)
{
    return &IMAGE_HOOK;
}
#else
const stoke__tar_image_hook *stoke__tar_image_hook_get(void)
{
    return NULL;
}
#endif

int stoke__tar_field_kind(const char *ext)
{
    /* in any case, as images: matches .JPG files and WebDataset's decoders extensions */
    if (strcasecmp(ext, "cls") == 0)
        return STOKE__TAR_CLS;
    if (strcasecmp(ext, "npy") == 0)
        return STOKE__TAR_NPY;
    if (strcasecmp(ext, "jpg") == 0 || strcasecmp(ext, "jpeg") == 0)
        return STOKE__TAR_IMAGE;
    return STOKE__TAR_RAW;
}

int stoke__tar_set_epoch(void *user, uint64_t epoch)
{
    stoke__tar_ds *t = user;
    atomic_store_explicit(&t->epoch, epoch, memory_order_relaxed);
    return 0;
}

/* "tar SHARD@HDR: sample 'KEY'" of sample i into buf: HDR is field k's member's header, or
 * (k < 0, or the sample lacks it) the sample's first member's. */
static void where(const stoke__tar_ds *t, uint64_t i, int k, char *buf, size_t n)
{
    const stoke__tar_loc *L = &t->loc[i * (uint64_t)t->nf];
    uint64_t hdr = L[0].hdr;
    if (k >= 0 && L[k].off != UINT64_MAX)
        hdr = L[k].hdr;
    else
        for (int j = 0; j < t->nf; j++) /* the sample's first member */
            if (L[j].off != UINT64_MAX) {
                hdr = L[j].hdr;
                break;
            }
    stoke__fmt_short(buf, n, "tar %s@%" PRIu64 ": sample '%s'", t->shards[t->shard_of[i]].path,
                     hdr, t->keys + t->key_at[i]);
}

int stoke__tar_describe(void *user, uint64_t index, char *buf, size_t n)
{
    const stoke__tar_ds *t = user;
    if (index >= t->n)
        return STOKE_ERANGE;
    where(t, index, -1, buf, n);
    return STOKE_OK;
}

/* "tar SHARD@HDR: sample 'KEY' field 'EXT': <fmt>" into msg; returns code. */
static int field_fail(const stoke__tar_ds *t, uint64_t i, int k, char *msg, size_t msg_len,
                      int code, const char *fmt, ...) STOKE__PRINTF(7, 8);
static int field_fail(const stoke__tar_ds *t, uint64_t i, int k, char *msg, size_t msg_len,
                      int code, const char *fmt, ...)
{
    char at[STOKE__MSG_MAX / 2], why[STOKE__MSG_MAX];
    where(t, i, k, at, sizeof(at));
    va_list ap;
    va_start(ap, fmt);
    stoke__vfmt_short(why, sizeof(why), fmt, ap);
    va_end(ap);
    stoke__fmt_short(msg, msg_len, "%s field '%s': %s", at, t->f[k].ext, why);
    return code;
}

/* pread of exactly n bytes at off from shard s: 0, or -errno (EIO-like -ENODATA for a short
 * read: the shard shrank). */
static int pread_exact(int fd, void *buf, size_t n, uint64_t off)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            return -ENODATA;
        done += (size_t)r;
    }
    return 0;
}

static int read_fail(const stoke__tar_ds *t, uint64_t i, int k, int e, char *msg, size_t msg_len)
{
    if (e == -ENODATA)
        return field_fail(t, i, k, msg, msg_len, STOKE_EIO,
                          "the shard changed while loading (it is shorter than at open)");
    return field_fail(t, i, k, msg, msg_len, STOKE_EIO, "read failed: %s", strerror(-e));
}

/* The size the server says now (total; UINT64_MAX: not said) must be the shard's at open (its
 * sidecar index's, or the one its walk was told), else the offsets are another file's
 * (STOKE_EIO with why).  Checked after a read that failed too (its answer's size is set when
 * the shard's validator did not match, remote.h): a size says more than an ETag, and a stale
 * index's message says what to do. */
static int index_stale(const stoke__tar_shard *s, uint64_t total, char *why, size_t why_len)
{
    if (total == UINT64_MAX || total == s->size)
        return STOKE_OK;
    if (!s->idx_url) {
        stoke__fmt(why, why_len,
                   "GET %s: the shard changed since the open: it is %" PRIu64
                   " bytes, not %" PRIu64,
                   s->rf.url, total, s->size);
        return STOKE_EIO;
    }
    stoke__fmt(why, why_len,
               "index %s is stale: the shard is %" PRIu64 " bytes, not %" PRIu64
               " (run `stoke index` again)",
               s->idx_url, total, s->size);
    return STOKE_EIO;
}

/* Reads exactly n bytes at off of sample i's shard (pread, or for a remote shard: from io's
 * window when it holds them, else a range read through the pool's slot of io->worker, or the
 * local copy in the cache): STOKE_OK, or the error in msg. */
static int shard_read(const stoke__tar_ds *t, uint64_t i, int k, void *buf, size_t n, uint64_t off,
                      const stoke__tar_io *io, char *msg, size_t msg_len)
{
    const stoke__tar_shard *s = &t->shards[t->shard_of[i]];
    if (io->win && off >= io->win_off && off - io->win_off <= io->win_len &&
        n <= io->win_len - (off - io->win_off)) { /* (a stream's sample: local shards too) */
        memcpy(buf, io->win + (off - io->win_off), n);
        return STOKE_OK;
    }
    if (!s->remote) {
        int e = pread_exact(s->fd, buf, n, off);
        return e ? read_fail(t, i, k, e, msg, msg_len) : STOKE_OK;
    }
    int worker = io->worker;
    char why[STOKE__MSG_MAX];
    size_t got = 0;
    uint64_t total = UINT64_MAX;
    int rc = t->cache ? stoke__cache_read(t->cache, t->pool, worker, &s->rf, s->size, buf, n, off,
                                          &got, NULL, why, sizeof(why))
                      : stoke__remote_read(t->pool, worker, &s->rf, buf, n, off, &got, &total, why,
                                           sizeof(why));
    if (index_stale(s, total, why, sizeof(why)))
        rc = STOKE_EIO;
    if (rc) /* the request's code: STOKE_ENOENT for a shard gone (404, 410), else STOKE_EIO */
        return field_fail(t, i, k, msg, msg_len, rc, "%s", why);
    return got < n ? read_fail(t, i, k, -ENODATA, msg, msg_len) : STOKE_OK;
}

/* A sample's window: at most this many bytes, of which at most COALESCE_GAP not asked for
 * (headers, padding, members of fields not read). */
#define COALESCE_MAX ((uint64_t)8 << 20)
#define COALESCE_GAP ((uint64_t)64 << 10)
/* A batch's neighbours go in requests of about its bytes / (this x STOKE_REMOTE_CONNECTIONS):
 * each connection has a few, and one that ends early takes the next (with one request per
 * connection the largest one held every batch back: behind nginx's limit_rate 20m, 290-320
 * MB/s against 376-412 for one request per sample and 431-434 with 4; on loopback without a
 * limit 730-821, 439-509 and 708-777 MB/s). */
#define COALESCE_PER_CONNECTION 4

/* The bytes [*lo, *hi) of sample i's members that get() reads (dst[k] not NULL) in one request,
 * *first the field of the lowest: 1 when they are worth one request (two or more close
 * together; with single, one is enough), else 0. */
static int sample_span(const stoke__tar_ds *t, uint64_t i, void *const dst[], int single,
                       uint64_t *lo_, uint64_t *hi_, int *first_)
{
    uint64_t lo = UINT64_MAX, hi = 0, want = 0;
    int n = 0, first = 0;
    for (int k = 0; k < t->nf; k++) {
        const stoke__tar_loc *L = &t->loc[i * (uint64_t)t->nf + (uint64_t)k];
        if (!dst[k] || L->off == UINT64_MAX)
            continue;
        n++;
        want += L->size;
        if (L->off < lo)
            lo = L->off, first = k;
        if (L->off + L->size > hi)
            hi = L->off + L->size;
    }
    *lo_ = lo, *hi_ = hi, *first_ = first;
    return n >= (single ? 1 : 2) && hi > lo && hi - lo <= COALESCE_MAX &&
           hi - lo <= want + COALESCE_GAP;
}

int stoke__tar_fetch_sample(const stoke__tar_ds *t, uint64_t i, void *const dst[],
                            stoke__tar_io *io, char *msg, size_t msg_len)
{
    const stoke__tar_shard *s = &t->shards[t->shard_of[i]];
    uint64_t lo, hi;
    int first;
    if (!s->remote || t->cache || !sample_span(t, i, dst, 0, &lo, &hi, &first))
        return STOKE_OK;
    char *buf = malloc((size_t)(hi - lo));
    if (!buf) /* a request per field instead */
        return STOKE_OK;
    char why[STOKE__MSG_MAX];
    size_t got = 0;
    uint64_t total = UINT64_MAX;
    int rc = stoke__remote_read(t->pool, io->worker, &s->rf, buf, (size_t)(hi - lo), lo, &got,
                                &total, why, sizeof(why));
    if (index_stale(s, total, why, sizeof(why)))
        rc = STOKE_EIO;
    if (rc) {
        free(buf);
        return field_fail(t, i, first, msg, msg_len, rc, "%s", why);
    }
    io->win = buf; /* a read past got (the shard shrank) goes to the server and fails there */
    io->win_off = lo;
    io->win_len = got;
    return STOKE_OK;
}

/* A sample of a batch read (fetch_batch): its place j in the batch, its shard, the bytes
 * [lo, hi) of the members read and the field of the first. */
typedef struct span {
    size_t j;
    int shard, first;
    uint64_t lo, hi;
} span;

static int span_order(const void *a_, const void *b_)
{
    const span *a = a_, *b = b_;
    if (a->shard != b->shard)
        return a->shard < b->shard ? -1 : 1;
    if (a->lo != b->lo)
        return a->lo < b->lo ? -1 : 1;
    return a->j < b->j ? -1 : a->j > b->j;
}

/* The end of the request that starts at sp[a] (sorted by shard and offset): the neighbours
 * after it in its shard while each is at most COALESCE_GAP past the bytes before it, the
 * window stays within COALESCE_MAX and the bytes asked for are below share (a run of
 * neighbours makes requests of about share each). */
static size_t span_run(const span *sp, size_t m, size_t a, uint64_t share, uint64_t *hi_)
{
    uint64_t lo = sp[a].lo, hi = sp[a].hi, want = hi - lo;
    size_t b = a + 1;
    for (; b < m && sp[b].shard == sp[a].shard && sp[b].lo <= hi + COALESCE_GAP; b++) {
        uint64_t end = sp[b].hi > hi ? sp[b].hi : hi, n = sp[b].hi - sp[b].lo;
        if (end - lo > COALESCE_MAX || want >= share)
            break;
        hi = end;
        want += n;
    }
    *hi_ = hi;
    return b;
}

int stoke__tar_fetch_batch(const stoke__tar_ds *t, const uint64_t *idx, size_t count,
                           void *const *dst, stoke__tar_io *io, char *msg, size_t msg_len,
                           size_t *bad)
{
    *bad = count;
    span *sp = calloc(count ? count : 1, sizeof(*sp));
    size_t m = 0;
    uint64_t bytes = 0;
    for (size_t j = 0; sp && j < count; j++) {
        uint64_t i = idx[j];
        if (i >= t->n)
            continue;
        const stoke__tar_shard *s = &t->shards[t->shard_of[i]];
        span v = {.j = j, .shard = t->shard_of[i]};
        if (!s->remote || t->cache ||
            !sample_span(t, i, dst + j * (size_t)t->nf, 1, &v.lo, &v.hi, &v.first))
            continue;
        sp[m++] = v;
        bytes += v.hi - v.lo;
    }
    /* requests: runs of neighbours, each about a connection's share of the batch's bytes */
    stoke__remote_req *r = calloc(m ? m : 1, sizeof(*r));
    size_t *run = calloc(2 * m + 1, sizeof(*run)); /* request q: sp[run[2q] .. run[2q + 1]) */
    size_t nr = 0;
    if (sp && r && run) {
        const int conns = stoke__remote_pool_connections(t->pool);
        const uint64_t parts = (uint64_t)conns * COALESCE_PER_CONNECTION;
        const uint64_t share = (bytes + parts - 1) / parts;
        qsort(sp, m, sizeof(*sp), span_order);
        for (size_t a = 0, b; a < m; a = b) {
            uint64_t hi;
            b = span_run(sp, m, a, share, &hi);
            char *buf = malloc((size_t)(hi - sp[a].lo));
            if (!buf) /* these samples are read field by field by get's path */
                continue;
            r[nr] = (stoke__remote_req){.f = &t->shards[sp[a].shard].rf,
                                        .buf = buf,
                                        .n = (size_t)(hi - sp[a].lo),
                                        .off = sp[a].lo};
            run[2 * nr] = a;
            run[2 * nr++ + 1] = b;
        }
    }
    int rc = STOKE_OK;
    if (nr) {
        char why[STOKE__MSG_MAX];
        size_t failed = nr;
        rc = stoke__remote_read_many(t->pool, io[0].worker, r, nr, &failed, why, sizeof(why));
        if (rc && failed < nr) /* its size, when it is another (index_stale) */
            index_stale(&t->shards[sp[run[2 * failed]].shard], r[failed].total, why, sizeof(why));
        for (size_t q = 0; !rc && q < nr; q++) {
            rc = index_stale(&t->shards[sp[run[2 * q]].shard], r[q].total, why, sizeof(why));
            if (rc)
                failed = q;
        }
        if (rc) {
            const span *f = &sp[run[2 * (failed < nr ? failed : 0)]];
            *bad = f->j;
            rc = field_fail(t, idx[f->j], f->first, msg, msg_len, rc, "%s", why);
        }
        for (size_t q = 0; q < nr; q++) {
            if (rc) {
                free(r[q].buf);
                continue;
            }
            for (size_t k = run[2 * q]; k < run[2 * q + 1]; k++) {
                size_t d = (size_t)(sp[k].lo - r[q].off);
                io[sp[k].j] = (stoke__tar_io){.worker = io[sp[k].j].worker,
                                              .win = (const char *)r[q].buf + d,
                                              .win_off = sp[k].lo,
                                              .win_len = r[q].got > d ? r[q].got - d : 0,
                                              .borrowed = k != run[2 * q]};
            }
        }
    }
    free(r);
    free(run);
    free(sp);
    return rc;
}

/* .cls: optional spaces, a decimal integer (optional sign), optional spaces / newline. */
static int parse_cls(const char *s, size_t n, int64_t *out)
{
    size_t i = 0;
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    int neg = 0;
    if (i < n && (s[i] == '-' || s[i] == '+'))
        neg = s[i++] == '-';
    uint64_t v = 0;
    size_t d = 0;
    for (; i < n && s[i] >= '0' && s[i] <= '9'; i++, d++) {
        if (v > (UINT64_C(1) << 63) / 10)
            return -1;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    while (i < n && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r'))
        i++;
    if (!d || i != n || v > (uint64_t)INT64_MAX + (uint64_t)neg)
        return -1;
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 0;
}

static int read_cls(const stoke__tar_ds *t, uint64_t i, int k, const stoke__tar_loc *L, void *dst,
                    const stoke__tar_io *io, char *msg, size_t msg_len)
{
    char buf[64];
    if (L->size >= sizeof(buf) || L->size == 0)
        return field_fail(t, i, k, msg, msg_len, STOKE_EFORMAT,
                          "a .cls member of %" PRIu64 " bytes is not a class number", L->size);
    int rc = shard_read(t, i, k, buf, (size_t)L->size, L->off, io, msg, msg_len);
    if (rc)
        return rc;
    int64_t v;
    if (parse_cls(buf, (size_t)L->size, &v) != 0)
        return field_fail(t, i, k, msg, msg_len, STOKE_EFORMAT,
                          "'%.*s' is not a decimal class number", (int)L->size, buf);
    memcpy(dst, &v, sizeof(v));
    return STOKE_OK;
}

/* Reads and parses the .npy header of member L into *h. */
static int npy_header(const stoke__tar_ds *t, uint64_t i, int k, const stoke__tar_loc *L,
                      stoke__npy_header *h, const stoke__tar_io *io, char *msg, size_t msg_len)
{
    unsigned char pre[12];
    size_t np = L->size < sizeof(pre) ? (size_t)L->size : sizeof(pre);
    int rc = shard_read(t, i, k, pre, np, L->off, io, msg, msg_len);
    if (rc)
        return rc;
    size_t need = np;
    if (np == sizeof(pre) && memcmp(pre, "\x93NUMPY", 6) == 0)
        need = pre[6] == 1 ? 10u + (pre[8] | (size_t)pre[9] << 8)
                           : 12u + (pre[8] | (size_t)pre[9] << 8 | (size_t)pre[10] << 16 |
                                    (size_t)pre[11] << 24);
    if (need > STOKE__NPY_PREFIX_MAX)
        need = STOKE__NPY_PREFIX_MAX;
    if (need > L->size)
        need = (size_t)L->size;
    unsigned char *buf = malloc(need ? need : 1);
    if (!buf)
        return field_fail(t, i, k, msg, msg_len, STOKE_ENOMEM, "out of memory");
    char why[200];
    rc = shard_read(t, i, k, buf, need, L->off, io, msg, msg_len);
    if (!rc && stoke__npy_parse_header(buf, need, L->size, h, why, sizeof(why)) != 0)
        rc = field_fail(t, i, k, msg, msg_len, STOKE_EFORMAT, "bad .npy member: %s", why);
    free(buf);
    return rc;
}

static int read_npy(const stoke__tar_ds *t, uint64_t i, int k, const stoke__tar_loc *L, void *dst,
                    int64_t *len, const stoke__tar_io *io, char *msg, size_t msg_len)
{
    stoke__npy_header h;
    int rc = npy_header(t, i, k, L, &h, io, msg, msg_len);
    if (rc)
        return rc;
    const stoke_field *f = &t->fields[k];
    int ragged = t->f[k].ragged != 0; /* the first dimension may differ */
    /* the byte order may differ (swapped below), not the type */
    int same = h.dtype == f->dtype && h.itemsize == f->itemsize && h.ndim == f->ndim;
    for (int d = ragged; same && d < h.ndim; d++)
        same = h.shape[d] == f->shape[d];
    if (!same)
        return field_fail(t, i, k, msg, msg_len, STOKE_EFORMAT,
                          "array %s of %d dimension(s) differs from the first sample's (dtype "
                          "%s, %d dimension(s)): every sample needs the same dtype and shape%s",
                          h.descr, h.ndim, t->f[k].npy_descr, f->ndim,
                          ragged ? " but for the first dimension" : "");
    size_t bytes = f->bytes;
    if (ragged) { /* at most max_len rows (the slot): the loader cuts or refuses the rest by
                     the length, which is the member's */
        size_t unit = f->bytes / (size_t)f->max_len;
        if (h.shape[0] > f->max_len && !len)
            return field_fail(t, i, k, msg, msg_len, STOKE_ELIMIT,
                              "%lld rows, more than the field's max_len %lld",
                              (long long)h.shape[0], (long long)f->max_len);
        bytes = (size_t)(h.shape[0] < f->max_len ? h.shape[0] : f->max_len) * unit;
        if (len)
            *len = h.shape[0];
    }
    rc = shard_read(t, i, k, dst, bytes, L->off + h.data_offset, io, msg, msg_len);
    if (rc)
        return rc;
    if (h.swap) {
        unsigned char *p = dst;
        for (size_t o = 0; o + h.swap <= bytes; o += h.swap)
            for (size_t a = 0, b = h.swap - 1; a < b; a++, b--) {
                unsigned char c = p[o + a];
                p[o + a] = p[o + b];
                p[o + b] = c;
            }
    }
    return STOKE_OK;
}

static int read_image(const stoke__tar_ds *t, uint64_t i, int k, const stoke__tar_loc *L, void *dst,
                      const stoke__tar_io *io, char *msg, size_t msg_len)
{
    const stoke__tar_image_hook *hk = stoke__tar_image_hook_get();
    if (!hk)
        return field_fail(t, i, k, msg, msg_len, STOKE_ENOTSUP,
                          "tar: .jpg fields need the images module");
    if (L->size > STOKE__IMAGE_FILE_MAX) /* from the header: nothing allocated or read */
        return field_fail(t, i, k, msg, msg_len, STOKE_ELIMIT,
                          "member '%s.%s' of %" PRIu64 " bytes is larger than the limit for an "
                          "image (%zu bytes, as for images:)",
                          t->keys + t->key_at[i], t->f[k].ext, L->size, STOKE__IMAGE_FILE_MAX);
    void *buf = malloc(L->size ? (size_t)L->size : 1);
    if (!buf)
        return field_fail(t, i, k, msg, msg_len, STOKE_ENOMEM, "out of memory");
    int rc = shard_read(t, i, k, buf, (size_t)L->size, L->off, io, msg, msg_len);
    if (!rc) {
        char why[200] = "";
        uint64_t ep = atomic_load_explicit(&((stoke__tar_ds *)t)->epoch, memory_order_relaxed);
        rc = hk->decode(t->image_opts, buf, (size_t)L->size, ep, t->index_base + i, dst, why,
                        sizeof(why));
        if (rc)
            rc = field_fail(t, i, k, msg, msg_len, rc < 0 ? rc : STOKE_EDATA, "%s",
                            why[0] ? why : "cannot decode the image");
    }
    free(buf);
    return rc;
}

int stoke__tar_read_field(const stoke__tar_ds *t, uint64_t i, int k, void *dst, int64_t *len,
                          const stoke__tar_io *io, char *msg, size_t msg_len)
{
    const stoke__tar_loc *L = &t->loc[i * (uint64_t)t->nf + (uint64_t)k];
    if (L->off == UINT64_MAX)
        return field_fail(t, i, k, msg, msg_len, STOKE_EDATA, "the sample has no '%s' member",
                          t->f[k].ext);
    switch (t->f[k].kind) {
    case STOKE__TAR_CLS: return read_cls(t, i, k, L, dst, io, msg, msg_len);
    case STOKE__TAR_NPY: return read_npy(t, i, k, L, dst, len, io, msg, msg_len);
    case STOKE__TAR_IMAGE: return read_image(t, i, k, L, dst, io, msg, msg_len);
    default: break;
    }
    if (t->f[k].ragged) { /* at most max_len bytes (the slot): the loader cuts or refuses the
                             rest by the length, which is the member's */
        uint64_t room = (uint64_t)t->fields[k].max_len;
        if (L->size > room && !len)
            return field_fail(t, i, k, msg, msg_len, STOKE_ELIMIT,
                              "member of %" PRIu64 " bytes, more than the field's max_len %" PRIu64,
                              L->size, room);
        if (len)
            *len = (int64_t)L->size;
        return shard_read(t, i, k, dst, (size_t)(L->size < room ? L->size : room), L->off, io, msg,
                          msg_len);
    }
    if (L->size != t->fields[k].bytes)
        return field_fail(t, i, k, msg, msg_len, STOKE_EFORMAT,
                          "member of %" PRIu64 " bytes, but the field has %zu (the size of the "
                          "first sample's): raw fields need one size",
                          L->size, t->fields[k].bytes);
    return shard_read(t, i, k, dst, (size_t)L->size, L->off, io, msg, msg_len);
}

/* The size of field k's largest member (0: none). */
static uint64_t longest_member(const stoke__tar_ds *t, int k)
{
    uint64_t most = 0;
    for (uint64_t i = 0; i < t->n; i++) {
        const stoke__tar_loc *M = &t->loc[i * (uint64_t)t->nf + (uint64_t)k];
        if (M->off != UINT64_MAX && M->size > most)
            most = M->size;
    }
    return most;
}

/* A ragged field's max_len: max_len= where given (mode=stream: as given; with the index: at
 * most the units the longest member holds, `most`), else `most`; at least 1. */
static int64_t ragged_room(const stoke__tar_ds *t, int k, uint64_t most)
{
    uint64_t room = most;
    if (t->f[k].max_len && (t->stream || (uint64_t)t->f[k].max_len < most))
        room = (uint64_t)t->f[k].max_len;
    return room ? (int64_t)room : 1;
}

int stoke__tar_describe_field(stoke__tar_ds *t, int k, const char *spec, const stoke__tar_io *io)
{
    const stoke__tar_io none = {0};
    if (!io)
        io = &none;
    stoke_field *f = &t->fields[k];
    memset(f, 0, sizeof(*f));
    stoke__strlcpy(f->name, t->f[k].ext, sizeof(f->name));
    f->shape = t->shapes[k];
    uint64_t first = UINT64_MAX;
    for (uint64_t i = 0; i < t->n && first == UINT64_MAX; i++)
        if (t->loc[i * (uint64_t)t->nf + (uint64_t)k].off != UINT64_MAX)
            first = i;
    if (first == UINT64_MAX)
        return stoke__fail(STOKE_EFORMAT, "source '%s': no sample has a '%s' member", spec,
                           t->f[k].ext);
    const stoke__tar_loc *L = &t->loc[first * (uint64_t)t->nf + (uint64_t)k];
    char msg[512];
    switch (t->f[k].kind) {
    case STOKE__TAR_CLS:
        f->dtype = STOKE_DTYPE_I64;
        f->ndim = 0;
        break;
    case STOKE__TAR_NPY: {
        stoke__npy_header h;
        int rc = npy_header(t, first, k, L, &h, io, msg, sizeof(msg));
        if (rc)
            return stoke__fail(rc, "source '%s': %s", spec, msg);
        f->dtype = h.dtype;
        f->itemsize = h.itemsize;
        f->ndim = h.ndim;
        memcpy(t->shapes[k], h.shape, sizeof(int64_t) * (size_t)h.ndim);
        stoke__strlcpy(t->f[k].npy_descr, h.descr, sizeof(t->f[k].npy_descr));
        if (t->f[k].ragged) { /* rows vary: as many as the longest member could hold */
            if (h.ndim < 1)
                return stoke__fail(STOKE_EINVAL,
                                   "source '%s': .npy field '%s' is a scalar: a ragged field "
                                   "needs a first dimension",
                                   spec, t->f[k].ext);
            uint64_t unit = h.itemsize, most = longest_member(t, k);
            for (int d = 1; d < h.ndim; d++)
                unit *= (uint64_t)h.shape[d];
            /* the data of a member follows at least its 10-byte preamble */
            uint64_t rows = unit && most > 10 ? (most - 10) / unit : 1;
            t->shapes[k][0] = STOKE_DIM_VAR;
            f->max_len = ragged_room(t, k, rows);
            f->collate = t->f[k].ragged - 1;
            f->truncate = t->truncate;
        }
        break;
    }
    case STOKE__TAR_IMAGE: {
        const stoke__tar_image_hook *hk = stoke__tar_image_hook_get();
        if (!hk)
            return stoke__fail(STOKE_ENOTSUP,
                               "source '%s': tar: .jpg fields need the images "
                               "module (field '%s'; not in this build)",
                               spec, t->f[k].ext);
        int rc = hk->field(t->image_opts, f, t->shapes[k]);
        if (rc)
            return stoke__fail(rc, "source '%s': image field '%s': %s", spec, t->f[k].ext,
                               stoke_last_error());
        stoke__strlcpy(f->name, t->f[k].ext, sizeof(f->name));
        return STOKE_OK;
    }
    default:
        if (L->size > (uint64_t)INT64_MAX)
            return stoke__fail(STOKE_ELIMIT, "source '%s': member too large", spec);
        f->dtype = STOKE_DTYPE_U8;
        f->ndim = 1;
        t->shapes[k][0] = (int64_t)L->size;
        if (t->f[k].ragged) { /* as long as the longest member */
            t->shapes[k][0] = STOKE_DIM_VAR;
            f->max_len = ragged_room(t, k, longest_member(t, k));
            f->collate = t->f[k].ragged - 1;
            f->truncate = t->truncate;
        }
        break;
    }
    int rc = stoke_field_finish(f);
    if (rc)
        return stoke__fail(rc, "source '%s': field '%s': bad size", spec, t->f[k].ext);
    return STOKE_OK;
}
