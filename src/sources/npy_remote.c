/* The npy source's io=remote: a .npy behind an http://, https:// or s3:// URL, read by byte
 * range through the remote engine (remote.h; docs/sources.md, "Remote data").
 *
 * The open reads the first min(size, STOKE__NPY_PREFIX_MAX) bytes with one range request (the
 * answer's Content-Range gives the file's size) and parses the header from them (npy.c).  get()
 * then reads a sample's row with one range request through the worker's slot; get_batch() sorts
 * the batch's rows and sends one request per run of rows consecutive in the file (at most
 * STOKE__NPY_RUN_MAX bytes each, wherever the rows sit in the batch), the batch's requests in
 * flight together (stoke__remote_read_many).  Nothing is cached.  Each answer's Content-Range
 * stands in for the local modes' fstat(): a size other than the one at open, or a body shorter than
 * asked for, is "file changed while loading".  The pool belongs to the dataset (npy.c makes the
 * fork hooks); the file structs are read-only once open, so gets need no lock of their own. */
#define _GNU_SOURCE /* qsort_r */
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "sources/npy_internal.h"
#include "stoke/sources.h"

#define WHY_MAX 512

int stoke__npy_remote_head(stoke__npy_file *f, const char *url, stoke__remote_pool **pool,
                           unsigned char **head, size_t *got)
{
    char why[WHY_MAX];
    int rc;
    *head = NULL;
    *got = 0;
    if (!*pool && (rc = stoke__remote_pool_create(pool, why, sizeof(why))) != STOKE_OK)
        return stoke__fail(rc, "npy %s: %s", f->path, why);
    rc = stoke__remote_file_init(*pool, url, &f->rf, why, sizeof(why));
    if (!rc) /* the rows are read at the offsets of this read's header: its version's */
        rc = stoke__remote_file_pin(&f->rf, why, sizeof(why));
    if (rc)
        return stoke__fail(rc, "npy %s: %s", f->path, why);
    f->remote = 1;
    unsigned char *b = malloc(STOKE__NPY_PREFIX_MAX);
    if (!b)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", f->path);
    uint64_t total = UINT64_MAX;
    size_t n = 0;
    rc = stoke__remote_read(*pool, 0, &f->rf, b, STOKE__NPY_PREFIX_MAX, 0, &n, &total, why,
                            sizeof(why));
    if (rc) {
        free(b);
        return stoke__fail(rc, "npy %s: %s", f->path, why);
    }
    if (total == UINT64_MAX) {
        free(b);
        return stoke__fail(STOKE_EIO,
                           "npy %s: the server did not say the file's size (no Content-Range: "
                           "range requests are needed)",
                           f->path);
    }
    uint64_t want = total < STOKE__NPY_PREFIX_MAX ? total : STOKE__NPY_PREFIX_MAX;
    if (n < want) {
        free(b);
        return stoke__fail(STOKE_EIO,
                           "npy %s: the first %llu bytes were asked for, %zu came (the file is "
                           "%llu bytes): file changed while loading",
                           f->path, (unsigned long long)want, n, (unsigned long long)total);
    }
    f->size = total;
    *head = b;
    *got = n;
    return STOKE_OK;
}

/* An answer of `got` bytes to a request of `want` at `at` for sample `index`, the file `total`
 * bytes (UINT64_MAX: not said): STOKE_OK, or STOKE_EIO "file changed while loading". */
static int check_answer(const stoke__npy_file *f, uint64_t index, uint64_t at, size_t got,
                        size_t want, uint64_t total, char *msg, size_t msg_len)
{
    char why[128];
    if (total != UINT64_MAX && total != f->size) {
        stoke__fmt(why, sizeof(why), "now %llu bytes, %llu when opened", (unsigned long long)total,
                   (unsigned long long)f->size);
        return stoke__npy_changed(f, index, msg, msg_len, why);
    }
    if (got != want) {
        stoke__fmt(why, sizeof(why), "it ends at byte %llu: truncated",
                   (unsigned long long)(at + got));
        return stoke__npy_changed(f, index, msg, msg_len, why);
    }
    return STOKE_OK;
}

int stoke__npy_remote_row(const stoke__npy_ds *ds, const stoke__npy_file *f, uint64_t index,
                          uint64_t at, void *dst, int worker, char *msg, size_t msg_len)
{
    char why[WHY_MAX];
    size_t got = 0;
    uint64_t total = UINT64_MAX;
    int rc = stoke__remote_read(ds->pool, worker, &f->rf, dst, f->row_bytes, at, &got, &total, why,
                                sizeof(why));
    /* (a read that failed on another version of the file says its size: a changed one is
     * check_answer's to word) */
    if (rc && (total == UINT64_MAX || total == f->size)) {
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: %s", f->path, (unsigned long long)index,
                   why);
        return rc;
    }
    return check_answer(f, index, at, got, f->row_bytes, total, msg, msg_len);
}

/* A batch's rows are requested in index order: rows consecutive in the file, wherever they sit
 * in the batch (a block shuffle mixes a few blocks into each batch), are one request.  A group
 * whose slots are consecutive too is read straight into them; another is read into a bounce
 * buffer (at most BOUNCE_MAX bytes per batch, the rest one request per slot) and copied. */
#define BOUNCE_MAX ((size_t)16 << 20)

typedef struct group {
    int k;
    uint64_t lo, hi; /* rows lo..hi of file k */
    size_t s0, s1;   /* the batch positions ord[s0, s1) */
    unsigned char *buf;
    int bounce; /* buf is the bounce buffer: copy each position's row out of it */
} group;

static int by_index(const void *a, const void *b, void *idx)
{
    const uint64_t *x = idx;
    size_t i = *(const size_t *)a, j = *(const size_t *)b;
    return x[i] < x[j] ? -1 : x[i] > x[j] ? 1 : (i > j) - (i < j);
}

int stoke__npy_batch_remote(const stoke__npy_ds *ds, const uint64_t *idx, size_t count,
                            void *const dst[], int worker, char *msg, size_t msg_len,
                            uint64_t *err_index)
{
    const size_t cap = count * (size_t)ds->nfiles;
    size_t *ord = malloc(count * sizeof(*ord));
    group *g = malloc(cap * sizeof(*g));
    stoke__remote_req *rq = malloc(cap * sizeof(*rq));
    unsigned char *bounce = NULL;
    int rc = STOKE_OK;
    if (!ord || !g || !rq) {
        *err_index = idx[0];
        stoke__fmt(msg, msg_len, "npy %s: out of memory for a batch of %zu", ds->f[0].path, count);
        rc = STOKE_ENOMEM;
        goto done;
    }
    for (size_t j = 0; j < count; j++)
        ord[j] = j;
    qsort_r(ord, count, sizeof(*ord), by_index, (void *)idx);
    /* the groups, and the bounce buffer's size */
    size_t n = 0, need = 0;
    for (int k = 0; k < ds->nfiles; k++) {
        const stoke__npy_file *f = &ds->f[k];
        const size_t rb = f->row_bytes, most = stoke__npy_run_most(rb);
        if (!dst[k] || !rb)
            continue;
        for (size_t s0 = 0, s1; s0 < count; s0 = s1) {
            uint64_t lo = idx[ord[s0]], hi = lo;
            int direct = 1;
            for (s1 = s0 + 1; s1 < count; s1++) {
                uint64_t x = idx[ord[s1]];
                if ((x != hi && x != hi + 1) || (x == hi + 1 && hi - lo + 1 >= most))
                    break;
                direct &= x == hi + 1 && ord[s1] == ord[s1 - 1] + 1;
                hi = x;
            }
            size_t len = (size_t)(hi - lo + 1) * rb;
            int bounce_it = !direct && need + len <= BOUNCE_MAX;
            if (!direct && !bounce_it) { /* one request per position, straight into its slot */
                for (size_t s = s0; s < s1; s++)
                    g[n++] = (group){k, idx[ord[s]], idx[ord[s]],
                                     s, s + 1,       (unsigned char *)dst[k] + ord[s] * rb,
                                     0};
                continue;
            }
            g[n++] = (group){k,        lo, hi,
                             s0,       s1, direct ? (unsigned char *)dst[k] + ord[s0] * rb : NULL,
                             bounce_it};
            if (bounce_it)
                need += len;
        }
    }
    if (need && !(bounce = malloc(need))) {
        *err_index = idx[0];
        stoke__fmt(msg, msg_len, "npy %s: out of memory for a batch of %zu", ds->f[0].path, count);
        rc = STOKE_ENOMEM;
        goto done;
    }
    size_t at = 0;
    for (size_t j = 0; j < n; j++) {
        const stoke__npy_file *f = &ds->f[g[j].k];
        size_t len = (size_t)(g[j].hi - g[j].lo + 1) * f->row_bytes;
        if (g[j].bounce) {
            g[j].buf = bounce + at;
            at += len;
        }
        rq[j] = (stoke__remote_req){.f = &f->rf,
                                    .buf = g[j].buf,
                                    .n = len,
                                    .off = f->h.data_offset + g[j].lo * (uint64_t)f->row_bytes,
                                    .total = UINT64_MAX};
    }
    char why[WHY_MAX];
    size_t failed = 0;
    if (n == 1) /* on the slot's own connection */
        rc = stoke__remote_read(ds->pool, worker, rq[0].f, rq[0].buf, rq[0].n, rq[0].off,
                                &rq[0].got, &rq[0].total, why, sizeof(why));
    else if (n > 1)
        rc = stoke__remote_read_many(ds->pool, worker, rq, n, &failed, why, sizeof(why));
    if (rc && failed < n && rq[failed].total != UINT64_MAX &&
        rq[failed].total != ds->f[g[failed].k].size) { /* the size that changed, as below */
        *err_index = g[failed].lo;
        rc = check_answer(&ds->f[g[failed].k], g[failed].lo, rq[failed].off, rq[failed].got,
                          rq[failed].n, rq[failed].total, msg, msg_len);
        goto done;
    }
    if (rc) {
        const group *e = &g[failed < n ? failed : 0];
        *err_index = e->lo;
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: %s", ds->f[e->k].path,
                   (unsigned long long)e->lo, why);
        goto done;
    }
    for (size_t j = 0; j < n && !rc; j++) {
        const stoke__npy_file *f = &ds->f[g[j].k];
        const size_t rb = f->row_bytes;
        uint64_t bad = g[j].lo + (rq[j].got < rq[j].n ? rq[j].got / rb : g[j].hi - g[j].lo);
        rc = check_answer(f, bad, rq[j].off, rq[j].got, rq[j].n, rq[j].total, msg, msg_len);
        if (rc) {
            *err_index = bad;
            break;
        }
        for (size_t s = g[j].s0; g[j].bounce && s < g[j].s1; s++)
            memcpy((unsigned char *)dst[g[j].k] + ord[s] * rb,
                   g[j].buf + (idx[ord[s]] - g[j].lo) * rb, rb);
    }
done:
    free(bounce);
    free(rq);
    free(g);
    free(ord);
    return rc;
}
