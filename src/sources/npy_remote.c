/* The npy source's io=remote: a .npy behind an http://, https:// or s3:// URL, read by byte
 * range through the remote engine (remote.h; docs/sources.md, "Remote data").
 *
 * The open reads the first min(size, STOKE__NPY_PREFIX_MAX) bytes with one range request (the
 * answer's Content-Range gives the file's size) and parses the header from them (npy.c).  get()
 * then reads a sample's row with one range request through the worker's slot; get_batch() cuts
 * the batch into runs of consecutive rows (stoke__npy_runs, at most STOKE__NPY_RUN_MAX bytes
 * each) and sends one request per run, the batch's requests in flight together
 * (stoke__remote_read_many).  Nothing is cached.  Each answer's Content-Range stands in for the
 * local modes' fstat(): a size other than the one at open, or a body shorter than asked for,
 * is "file changed while loading".  The pool belongs to the dataset (npy.c makes the fork
 * hooks); the file structs are read-only once open, so gets need no lock of their own. */
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
    if (rc) {
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: %s", f->path, (unsigned long long)index,
                   why);
        return rc;
    }
    return check_answer(f, index, at, got, f->row_bytes, total, msg, msg_len);
}

int stoke__npy_batch_remote(const stoke__npy_ds *ds, const uint64_t *idx, size_t count,
                            void *const dst[], int worker, char *msg, size_t msg_len,
                            uint64_t *err_index)
{
    enum { SMALL = 16 };
    size_t cap = count * (size_t)ds->nfiles;
    stoke__remote_req rq_small[SMALL];
    stoke__npy_run run_small[SMALL];
    stoke__remote_req *rq = rq_small;
    stoke__npy_run *runs = run_small;
    if (cap > SMALL) {
        rq = malloc(cap * sizeof(*rq));
        runs = malloc(cap * sizeof(*runs));
        if (!rq || !runs) {
            free(rq);
            free(runs);
            *err_index = idx[0];
            stoke__fmt(msg, msg_len, "npy %s: out of memory for a batch of %zu", ds->f[0].path,
                       count);
            return STOKE_ENOMEM;
        }
    }
    stoke__npy_runs it;
    stoke__npy_runs_init(&it, ds, idx, count, dst);
    size_t n = 0;
    while (n < cap && stoke__npy_runs_next(&it, &runs[n])) {
        rq[n] = (stoke__remote_req){.f = &ds->f[runs[n].k].rf,
                                    .buf = runs[n].dst,
                                    .n = runs[n].len,
                                    .off = runs[n].at,
                                    .total = UINT64_MAX};
        n++;
    }
    char why[WHY_MAX];
    size_t failed = 0;
    int rc = STOKE_OK;
    if (n == 1) /* on the slot's own connection */
        rc = stoke__remote_read(ds->pool, worker, rq[0].f, rq[0].buf, rq[0].n, rq[0].off,
                                &rq[0].got, &rq[0].total, why, sizeof(why));
    else if (n > 1)
        rc = stoke__remote_read_many(ds->pool, worker, rq, n, &failed, why, sizeof(why));
    if (rc) {
        const stoke__npy_run *r = &runs[failed < n ? failed : 0];
        *err_index = idx[r->pos];
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: %s", ds->f[r->k].path,
                   (unsigned long long)idx[r->pos], why);
    }
    for (size_t j = 0; j < n && !rc; j++) {
        const stoke__npy_run *r = &runs[j];
        const stoke__npy_file *f = &ds->f[r->k];
        size_t at = r->pos + (rq[j].got < r->len ? rq[j].got / f->row_bytes : r->n - 1);
        rc = check_answer(f, idx[at], r->at, rq[j].got, r->len, rq[j].total, msg, msg_len);
        if (rc)
            *err_index = idx[at];
    }
    if (rq != rq_small) {
        free(rq);
        free(runs);
    }
    return rc;
}
