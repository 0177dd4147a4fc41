/* The npy source: rows of a .npy file are samples, copied straight into the loader's slots.
 *
 * Lifetime: stoke_npy_open_opts opens (and, for IO_MMAP, maps) the data file and the optional
 * labels file; everything is released by the dataset's close callback.  get() only reads the
 * immutable file structs, so concurrent calls from workers need no lock; get_batch()
 * (npy_read.c) also takes the worker's ring under its lock with io=uring (npy_uring.c).
 *
 * io=auto is resolved here, once, at open: the data file is mapped and a sample of its pages
 * checked with mincore (see choose_io); the mode stays for the dataset's life.
 *
 * A file changed by someone else while it is loaded is STOKE_EIO "file changed while loading"
 * in every I/O mode, never a crash: IO_MMAP copies under the SIGBUS guard of fault_guard.h (a
 * page past a new end of file faults), IO_PREAD and IO_URING see a short read, and all compare
 * the file's size and mtime with those seen at open every STOKE__NPY_STAT_EVERY samples (batches:
 * STOKE__NPY_STAT_EVERY_BATCH; see docs/sources.md).
 *
 * A URL is IO_REMOTE (npy_remote.c): no fd and no mapping; the dataset owns a remote pool, whose
 * fork hooks it exports, and every read is a range request checked against the size at open. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/fault_guard.h"
#include "sources/npy_header.h"
#include "sources/npy_internal.h"
#include "sources/regular.h"
#include "sources/remote.h"
#include "stoke/sources.h"

/* io=auto maps the file when at least this share (in %) of the sampled pages is resident. */
#define AUTO_RESIDENT_PCT 99
/* io=auto samples at most AUTO_WINDOWS windows of AUTO_WINDOW_PAGES pages (all pages of a
 * file of up to AUTO_WINDOWS * AUTO_WINDOW_PAGES pages). */
#define AUTO_WINDOWS      256
#define AUTO_WINDOW_PAGES 16

typedef stoke__npy_file npy_file;
typedef stoke__npy_ds npy_ds;

static void npy_file_close(npy_file *f)
{
    if (f->map)
        munmap((void *)f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    stoke__remote_file_free(&f->rf);
    memset(f, 0, sizeof(*f));
    f->fd = -1;
}

/* Opens `path` read-only into f->fd (regular.h: O_NONBLOCK while opening, anything but a
 * regular file refused before any read) and records its size and mtime. */
static int open_regular(npy_file *f, const char *path)
{
    struct stat st;
    char why[160];
    int fd = stoke__open_regular(AT_FDCWD, path, &st, why, sizeof(why));
    if (fd < 0)
        return stoke__fail(fd, "npy %s: %s", path, why);
    f->fd = fd;
    f->size = (uint64_t)st.st_size;
    f->mtime = st.st_mtim;
    f->mincore_ok = st.st_uid == geteuid() || geteuid() == 0 ||
                    faccessat(AT_FDCWD, path, W_OK, AT_EACCESS) == 0;
    return STOKE_OK;
}

/* Maps the whole file read-only under the SIGBUS guard, for random access (MADV_RANDOM: a
 * fault reads its page, not a read-ahead window; get_batch() asks for runs of consecutive
 * rows with MADV_WILLNEED instead, see docs/sources.md). */
static int map_file(npy_file *f)
{
    if (f->size > SIZE_MAX)
        return stoke__fail(STOKE_ELIMIT, "npy %s: file too large to map", f->path);
    int e = stoke__fault_guard_install();
    if (e)
        return stoke__fail(STOKE_EIO,
                           "npy %s: cannot install the SIGBUS handler that guards "
                           "mappings: %s",
                           f->path, strerror(-e));
    void *m = mmap(NULL, (size_t)f->size, PROT_READ, MAP_SHARED, f->fd, 0);
    if (m == MAP_FAILED)
        return stoke__fail(STOKE_EIO, "npy %s: mmap of %llu bytes failed: %s", f->path,
                           (unsigned long long)f->size, strerror(errno));
    f->map = m;
    f->map_len = (size_t)f->size;
    if (madvise(m, f->map_len, MADV_RANDOM) != 0)
        stoke__log(STOKE_LOG_DEBUG, "npy %s: madvise(MADV_RANDOM): %s", f->path, strerror(errno));
    return STOKE_OK;
}

static void unmap_file(npy_file *f)
{
    if (f->map)
        munmap((void *)f->map, f->map_len);
    f->map = NULL;
    f->map_len = 0;
}

/* Reads (pread, io_uring) of random rows: no read-ahead window per read (runs of consecutive
 * rows are read with one request of their full length anyway). */
static void read_hint(const npy_file *f)
{
    int e = posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM);
    if (e)
        stoke__log(STOKE_LOG_DEBUG, "npy %s: posix_fadvise(RANDOM): %s", f->path, strerror(e));
}

/* The first min(size, STOKE__NPY_PREFIX_MAX) bytes of local file f (opened): 0 with *head
 * (malloc'd) and *got, or an error with the message set. */
static int local_head(npy_file *f, unsigned char **head, size_t *got)
{
    size_t want = f->size < STOKE__NPY_PREFIX_MAX ? (size_t)f->size : STOKE__NPY_PREFIX_MAX;
    *head = malloc(want ? want : 1);
    if (!*head)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", f->path);
    int e = stoke__pread_full(f->fd, *head, want, 0, got);
    if (e) {
        free(*head);
        *head = NULL;
        return stoke__fail(STOKE_EIO, "npy %s: cannot read: %s", f->path, strerror(-e));
    }
    return STOKE_OK;
}

/* Opens `path` for mode io: a URL (io is IO_REMOTE then) through *pool (made when NULL). */
static int npy_file_open(npy_file *f, const char *path, int io, stoke__remote_pool **pool)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    char shown[4096]; /* for messages: a URL without user:password@ */
    stoke__remote_redact(shown, sizeof(shown), path);
    f->path = strdup(shown);
    if (!f->path)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", shown);
    const char *given = path; /* what is opened: credentials included */
    path = f->path;
    unsigned char *head = NULL;
    size_t got = 0;
    int rc = io == STOKE_NPY_IO_REMOTE ? stoke__npy_remote_head(f, given, pool, &head, &got)
                                       : open_regular(f, given);
    if (!rc && !head)
        rc = local_head(f, &head, &got);
    if (rc)
        return rc;
    uint64_t size = f->size;
    char why[256];
    rc = stoke__npy_parse_header(head, got, size, &f->h, why, sizeof(why));
    free(head);
    if (rc)
        return stoke__fail(rc, "npy %s: %s", path, why);

    const stoke__npy_header *h = &f->h;
    if (h->ndim == 0) {
        f->rows = 1;
        f->row_bytes = h->itemsize;
    } else {
        f->rows = (uint64_t)h->shape[0];
        uint64_t rb = h->itemsize;
        for (int d = 1; d < h->ndim; d++)
            rb *= (uint64_t)h->shape[d]; /* <= data_bytes, checked by the parser */
        if (f->rows == 0) {              /* rows of an empty array: the product may not fit */
            rb = h->itemsize;
            for (int d = 1; d < h->ndim; d++) {
                uint64_t n = (uint64_t)h->shape[d];
                if (n && rb > SIZE_MAX / n)
                    return stoke__fail(STOKE_EFORMAT, "npy %s: row size overflows", path);
                rb *= n;
            }
        }
        if (rb > SIZE_MAX)
            return stoke__fail(STOKE_EFORMAT, "npy %s: row size overflows", path);
        f->row_bytes = (size_t)rb;
    }
    if ((io == STOKE_NPY_IO_MMAP || io == STOKE_NPY_IO_AUTO) && size > 0)
        return map_file(f); /* auto: choose_io needs the mapping */
    if (io == STOKE_NPY_IO_PREAD || io == STOKE_NPY_IO_URING)
        read_hint(f);
    return STOKE_OK;
}

/* Resident pages among those sampled from f's mapping: evenly spread windows, all pages of a
 * small file.  mincore where it is truthful, else a 1-byte preadv2(RWF_NOWAIT) per window,
 * which fails with EAGAIN when the page is not cached.  Returns 0 and *hit / *seen, or -1. */
static int sample_resident(const npy_file *f, size_t *hit, size_t *seen)
{
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    size_t pages = (f->map_len + pg - 1) / pg;
    size_t win = AUTO_WINDOW_PAGES, nwin = (pages + win - 1) / win;
    if (nwin > AUTO_WINDOWS)
        nwin = AUTO_WINDOWS;
    int truthful = f->mincore_ok;
    unsigned char vec[AUTO_WINDOW_PAGES];
    *hit = *seen = 0;
    for (size_t w = 0; w < nwin; w++) {
        size_t first = pages <= AUTO_WINDOWS * win
                           ? w * win
                           : (size_t)((uint64_t)w * (pages - win) / (nwin - 1 ? nwin - 1 : 1));
        size_t n = first + win <= pages ? win : pages - first;
        if (truthful) {
            if (mincore((void *)(f->map + first * pg),
                        n * pg < f->map_len - first * pg ? n * pg : f->map_len - first * pg,
                        vec) != 0)
                return -1;
            for (size_t i = 0; i < n; i++)
                *hit += vec[i] & 1;
            *seen += n;
        } else {
            char b;
            struct iovec iov = {&b, 1};
            ssize_t r = preadv2(f->fd, &iov, 1, (off_t)(first * pg), RWF_NOWAIT);
            if (r < 0 && errno != EAGAIN)
                return -1;
            *hit += r == 1;
            *seen += 1;
        }
    }
    return 0;
}

/* io=auto chose the mapping of a resident file: fills its page tables now, in one call
 * (MADV_POPULATE_READ, Linux 5.14), rather than with one page fault per 4 KiB (16 with
 * fault-around) during the first epoch — on a virtual machine a fault costs microseconds, and a
 * shuffled first epoch of small rows was spending most of its time in them.  It costs 8 bytes of
 * page table per 4 KiB of file and a one-time pass at open (about 10 ms per 300 MB here).  Pages
 * that are not resident are read in (the file was sampled ≥ 99% resident).  An older kernel
 * (EINVAL) just faults as before; the time is logged at DEBUG. */
static void populate(npy_file *f)
{
#ifdef MADV_POPULATE_READ
    uint64_t t0 = stoke__now_ns();
    if (f->map_len && madvise((void *)f->map, f->map_len, MADV_POPULATE_READ) != 0) {
        stoke__log(STOKE_LOG_DEBUG, "npy %s: madvise(MADV_POPULATE_READ): %s", f->path,
                   strerror(errno));
        return;
    }
    f->populated = 1;
    stoke__log(STOKE_LOG_DEBUG, "npy %s: page tables filled in %.1f ms", f->path,
               (double)(stoke__now_ns() - t0) / 1e6);
#else
    (void)f;
#endif
}

/* io=auto: the mapping when the data file is resident, else queued reads (uring when this
 * build and the kernel allow it, else pread).  Logs the choice at INFO. */
static int choose_io(const npy_file *f)
{
    size_t hit = 0, seen = 0;
    int io = STOKE_NPY_IO_MMAP;
    char why[96] = "empty file";
    if (f->map_len) {
        if (sample_resident(f, &hit, &seen) != 0) {
            stoke__fmt(why, sizeof(why), "residency unknown (%s)", strerror(errno));
            io = STOKE_NPY_IO_PREAD;
        } else {
            stoke__fmt(why, sizeof(why), "%zu of %zu sampled pages resident", hit, seen);
            if (hit * 100 < seen * AUTO_RESIDENT_PCT)
                io = STOKE_NPY_IO_PREAD;
        }
        char ignored[8];
        if (io == STOKE_NPY_IO_PREAD && stoke__npy_uring_probe(ignored, sizeof(ignored)) == 0)
            io = STOKE_NPY_IO_URING;
    }
    stoke__log(STOKE_LOG_INFO, "npy %s: io=auto chose io=%s: %s", f->path, stoke_npy_io_name(io),
               why);
    return io;
}

static uint64_t npy_length(void *user)
{
    return ((const npy_ds *)user)->f[0].rows;
}

/* IO_MMAP: one memcpy from the mapping, under the SIGBUS guard. */
static int read_row_mmap(const npy_file *f, uint64_t index, uint64_t at, void *dst, char *msg,
                         size_t msg_len)
{
    uint64_t err_index;
    int rc = stoke__npy_rows_within(f, &index, 1, 0, msg, msg_len, &err_index);
    if (rc != STOKE_OK)
        return rc;
    if (stoke__guarded_copy(dst, f->map + at, f->row_bytes, f->map, f->map_len) != 0) {
        rc = stoke__npy_rows_within(f, &index, 1, 1, msg, msg_len, &err_index);
        return rc ? rc
                  : stoke__npy_changed(f, index, msg, msg_len,
                                       "its mapped pages are gone: truncated");
    }
    return STOKE_OK;
}

/* IO_PREAD (and IO_URING: one sample gains nothing from a queue): pread into the slot. */
static int read_row_pread(const npy_file *f, uint64_t index, uint64_t at, void *dst, char *msg,
                          size_t msg_len)
{
    size_t got = 0;
    int e = stoke__pread_full(f->fd, dst, f->row_bytes, at, &got);
    if (e || got != f->row_bytes)
        return stoke__npy_read_failed(f, index, at + got, e, msg, msg_len);
    return STOKE_OK;
}

static int npy_get(void *user, uint64_t index, void *const dst[], int64_t len[], int worker,
                   char *msg, size_t msg_len)
{
    (void)len;
    const npy_ds *ds = user;
    if (index >= ds->f[0].rows) {
        stoke__fmt(msg, msg_len, "npy %s: index %llu out of range (%llu rows)", ds->f[0].path,
                   (unsigned long long)index, (unsigned long long)ds->f[0].rows);
        return STOKE_ERANGE;
    }
    for (int k = 0; k < ds->nfiles; k++) {
        const npy_file *f = &ds->f[k];
        int rc = index % STOKE__NPY_STAT_EVERY == 0
                     ? stoke__npy_check_unchanged(f, index, msg, msg_len)
                     : STOKE_OK;
        if (rc)
            return rc;
        if (!dst[k] || !f->row_bytes)
            continue;
        uint64_t at = f->h.data_offset + index * (uint64_t)f->row_bytes;
        switch (ds->io) {
        case STOKE_NPY_IO_MMAP: rc = read_row_mmap(f, index, at, dst[k], msg, msg_len); break;
        case STOKE_NPY_IO_REMOTE:
            rc = stoke__npy_remote_row(ds, f, index, at, dst[k], worker, msg, msg_len);
            break;
        default: rc = read_row_pread(f, index, at, dst[k], msg, msg_len); break;
        }
        if (rc)
            return rc;
        if (f->h.swap)
            stoke__npy_swap(dst[k], f->row_bytes, f->h.swap);
    }
    return STOKE_OK;
}

static void npy_close(void *user)
{
    npy_ds *ds = user;
    if (!ds)
        return;
    stoke__npy_rings_free(ds);
    stoke__npy_stages_free(ds);
    for (int k = 0; k < 2; k++)
        npy_file_close(&ds->f[k]);
    stoke__remote_pool_destroy(ds->pool);
    free(ds);
}

/* Fork hooks: with io=remote a worker process opens connections of its own (remote.h); with
 * io=uring it makes rings of its own (npy_uring.c: the parent's are never submitted to). */
static void npy_fork_prepare(void *user)
{
    stoke__remote_pool_fork_prepare(((npy_ds *)user)->pool);
}

static void npy_fork_parent(void *user)
{
    stoke__remote_pool_fork_parent(((npy_ds *)user)->pool);
}

static void npy_fork_child(void *user, int worker)
{
    (void)worker;
    stoke__npy_rings_forked(user);
    stoke__remote_pool_fork_child(((npy_ds *)user)->pool);
}

static void fill_field(stoke_field *fl, const char *name, const npy_file *f, int scalar)
{
    memset(fl, 0, sizeof(*fl));
    stoke__strlcpy(fl->name, name, sizeof(fl->name));
    fl->dtype = f->h.dtype;
    fl->itemsize = f->h.itemsize;
    fl->ndim = 0;
    if (!scalar && f->h.ndim > 1) {
        fl->ndim = f->h.ndim - 1;
        fl->shape = f->h.shape + 1; /* the header lives as long as the dataset */
    }
    fl->bytes = f->row_bytes;
}

/* The dataset's read(): one run of slots (a batch) goes to get_batch, which merges runs of
 * neighbouring rows; a group of small batches (a run each) to get_scattered. */
static int npy_read(void *user, const uint64_t *indices, size_t count, const stoke_slots *dst,
                    int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    const npy_ds *ds = user;
    if (dst->nruns <= 1) /* one batch's slots */
        return stoke__npy_get_batch(user, indices, count, dst->base, worker, msg, msg_len,
                                    err_index);
    /* a group of small batches: each sample's slots, for the scattered copy */
    const size_t nf = (size_t)ds->nfiles;
    void *small[128], **each = count * nf <= 128 ? small : malloc(count * nf * sizeof(*each));
    if (!each) {
        stoke__fmt(msg, msg_len, "npy %s: out of memory", ds->f[0].path);
        *err_index = count ? indices[0] : 0;
        return STOKE_ENOMEM;
    }
    for (size_t r = 0; r < dst->nruns; r++)
        for (size_t j = dst->start[r]; j < dst->start[r + 1]; j++)
            for (size_t k = 0; k < nf; k++) {
                unsigned char *b = dst->base[r * nf + k];
                each[j * nf + k] = b ? b + (j - dst->start[r]) * ds->f[k].row_bytes : NULL;
            }
    int rc = stoke__npy_get_scattered(user, indices, count, each, worker, msg, msg_len, err_index);
    if (each != small)
        free(each);
    return rc;
}

static void npy_hint(void *user, const stoke_hint *h)
{
    if (((const npy_ds *)user)->io == STOKE_NPY_IO_REMOTE)
        return; /* no block read-ahead or prefetch over the network (yet) */
    if (h->kind == STOKE_HINT_ORDER)
        stoke__npy_access_hint(user, h->sampler_kind, h->block_rows, h->block_window);
    else if (h->kind == STOKE_HINT_NEXT)
        stoke__npy_prefetch(user, h->indices, h->count);
}

void stoke_npy_opts_init(stoke_npy_opts *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->size = (uint32_t)sizeof(*opts);
    opts->io = STOKE_NPY_IO_AUTO;
}

int stoke_npy_open_opts(const char *path, const stoke_npy_opts *opts, stoke_dataset *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "npy: NULL dataset");
    stoke_dataset_init(out);
    if (!path || !*path)
        return stoke__fail(STOKE_EINVAL, "npy: no file name given");
    stoke_npy_opts def;
    if (!opts) {
        stoke_npy_opts_init(&def);
        opts = &def;
    }
    char shown[256]; /* for messages: a URL without user:password@ */
    stoke__remote_redact(shown, sizeof(shown), path);
    if (opts->size < offsetof(stoke_npy_opts, io) + sizeof(opts->io))
        return stoke__fail(STOKE_EINVAL,
                           "npy %s: opts->size %u is too small for stoke_npy_opts (call "
                           "stoke_npy_opts_init)",
                           shown, (unsigned)opts->size);
    if (opts->io < STOKE_NPY_IO_MMAP || opts->io > STOKE_NPY_IO_REMOTE)
        return stoke__fail(STOKE_EINVAL, "npy %s: unknown io mode %d", shown, opts->io);
    const char *lp = opts->labels_path;
    int url = stoke__remote_is_url(path);
    if (url && opts->io != STOKE_NPY_IO_AUTO && opts->io != STOKE_NPY_IO_REMOTE)
        return stoke__fail(STOKE_EINVAL,
                           "npy %s: io=%s reads local files only: a URL is read by HTTP range "
                           "requests (io=remote, what io=auto picks for it)",
                           shown, stoke_npy_io_name(opts->io));
    if (!url && opts->io == STOKE_NPY_IO_REMOTE)
        return stoke__fail(STOKE_EINVAL,
                           "npy %s: io=remote reads http://, https:// and s3:// URLs, not local "
                           "files",
                           shown);
    if (lp && *lp && stoke__remote_is_url(lp) != url) {
        char lshown[256];
        stoke__remote_redact(lshown, sizeof(lshown), lp);
        return stoke__fail(STOKE_EINVAL,
                           "npy %s: labels %s: the data and the labels must both be URLs or both "
                           "local files",
                           shown, lshown);
    }
    int direct = opts->size >= offsetof(stoke_npy_opts, direct) + sizeof(opts->direct)
                     ? opts->direct
                     : STOKE_NPY_DIRECT_AUTO;
    if (direct < STOKE_NPY_DIRECT_AUTO || direct > STOKE_NPY_DIRECT_OFF)
        return stoke__fail(STOKE_EINVAL, "npy %s: unknown direct mode %d", shown, direct);
    if (opts->io == STOKE_NPY_IO_URING && stoke_npy_io_available(STOKE_NPY_IO_URING) != STOKE_OK) {
        char why[256];
        stoke__strlcpy(why, stoke_last_error(), sizeof(why));
        return stoke__fail(STOKE_ENOTSUP, "npy %s: %s", shown, why);
    }

    npy_ds *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", shown);
    ds->f[0].fd = ds->f[1].fd = -1;
    ds->io = url ? STOKE_NPY_IO_REMOTE : opts->io;
    int rc = npy_file_open(&ds->f[0], path, ds->io, &ds->pool);
    if (rc)
        goto fail;
    if (direct == STOKE_NPY_DIRECT_AUTO) {
        uint64_t phys = stoke__physical_memory();
        direct = phys && ds->f[0].size > phys / 2 ? STOKE_NPY_DIRECT_ON : STOKE_NPY_DIRECT_OFF;
    }
    ds->direct = direct == STOKE_NPY_DIRECT_ON;
    if (ds->io == STOKE_NPY_IO_AUTO) {
        ds->io = choose_io(&ds->f[0]);
        if (ds->io != STOKE_NPY_IO_MMAP) {
            unmap_file(&ds->f[0]);
            read_hint(&ds->f[0]);
        } else {
            populate(&ds->f[0]);
        }
    }
    ds->nfiles = 1;
    if (lp && *lp) {
        rc = npy_file_open(&ds->f[1], lp, ds->io, &ds->pool);
        if (rc)
            goto fail;
        ds->nfiles = 2;
        const stoke__npy_header *lh = &ds->f[1].h;
        if (lh->ndim == 0 || lh->ndim > 2 || (lh->ndim == 2 && lh->shape[1] != 1)) {
            char shape[64] = "()";
            if (lh->ndim >= 1)
                stoke__fmt(shape, sizeof(shape), "(%lld%s%s)", (long long)lh->shape[0],
                           lh->ndim == 1 ? "," : ", ", lh->ndim >= 2 ? "..." : "");
            rc = stoke__fail(STOKE_EINVAL,
                             "npy %s: labels must be 1-D (N,) or (N, 1), this file has %d "
                             "dimension%s %s",
                             ds->f[1].path, lh->ndim, lh->ndim == 1 ? "" : "s", shape);
            goto fail;
        }
        if (ds->f[1].rows != ds->f[0].rows) {
            rc = stoke__fail(STOKE_EINVAL, "npy %s: labels have %llu rows but data %s has %llu",
                             ds->f[1].path, (unsigned long long)ds->f[1].rows, ds->f[0].path,
                             (unsigned long long)ds->f[0].rows);
            goto fail;
        }
    }

    stoke_dataset d;
    stoke_dataset_init(&d);
    d.kind = STOKE_DATASET_MAP;
    d.nfields = ds->nfiles;
    fill_field(&ds->fields[0], "data", &ds->f[0], 0);
    if (ds->nfiles == 2)
        fill_field(&ds->fields[1], "label", &ds->f[1], 1);
    d.fields = ds->fields;
    stoke__fmt_short(d.name, sizeof(d.name), "npy:%s", ds->f[0].path);
    d.user = ds;
    d.length = npy_length;
    d.get = npy_get;
    d.read = npy_read;
    d.close = npy_close;
    d.set_epoch = stoke__npy_set_epoch;
    d.hint = npy_hint;
    /* a forked worker opens connections and io_urings of its own */
    d.fork_prepare = npy_fork_prepare;
    d.fork_parent = npy_fork_parent;
    d.fork_child = npy_fork_child;
    *out = d;
    stoke__log(STOKE_LOG_DEBUG, "npy %s: v%d.0 '%s' %llu rows of %zu bytes%s, io=%s", shown,
               ds->f[0].h.major, ds->f[0].h.descr, (unsigned long long)ds->f[0].rows,
               ds->f[0].row_bytes, ds->f[0].h.swap ? " (byte-swapped)" : "",
               stoke_npy_io_name(ds->io));
    return STOKE_OK;
fail:
    npy_close(ds);
    return rc;
}

int stoke_npy_open(const char *path, const char *labels_path, stoke_dataset *out)
{
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    o.labels_path = labels_path;
    return stoke_npy_open_opts(path, &o, out);
}

int stoke_npy_io_used(const stoke_dataset *ds)
{
    if (!ds || ds->get != npy_get || !ds->user)
        return stoke__fail(STOKE_EINVAL, "stoke_npy_io_used: not an open npy dataset");
    return ((const npy_ds *)ds->user)->io;
}

int stoke_npy_block_stats(const stoke_dataset *ds, uint64_t *read_ahead, uint64_t *resident)
{
    if (!ds || ds->get != npy_get || !ds->user || !read_ahead || !resident)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_npy_block_stats: not an open npy dataset, or NULL output");
    stoke__npy_stage_stats(ds->user, read_ahead, resident);
    return STOKE_OK;
}

int stoke_npy_block_staged(const stoke_dataset *ds, uint64_t *blocks, uint64_t *direct,
                           uint64_t *rows)
{
    if (!ds || ds->get != npy_get || !ds->user || !blocks || !direct || !rows)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_npy_block_staged: not an open npy dataset, or NULL output");
    stoke__npy_stage_staged(ds->user, blocks, direct, rows);
    return STOKE_OK;
}

int stoke_npy_remote_stats(const stoke_dataset *ds, stoke_remote_stats *out)
{
    if (!ds || ds->get != npy_get || !ds->user || !out || out->size == 0)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_npy_remote_stats: not an open npy dataset, or NULL output");
    const npy_ds *d = ds->user;
    stoke_remote_stats s = {0};
    for (int k = 0; k < d->nfiles; k++)
        s.shards += (uint64_t)d->f[k].remote;
    stoke__remote_stats r = {0};
    if (d->pool)
        stoke__remote_pool_stats(d->pool, &r);
    s.requests = r.requests;
    s.retries = r.retries;
    s.bytes = r.bytes;
    s.network_wait_s = (double)r.wait_ns / 1e9;
    uint32_t keep = out->size;
    memcpy(out, &s, keep < sizeof(s) ? keep : sizeof(s));
    out->size = keep;
    return STOKE_OK;
}

const char *stoke_npy_io_name(int io)
{
    switch (io) {
    case STOKE_NPY_IO_MMAP: return "mmap";
    case STOKE_NPY_IO_PREAD: return "pread";
    case STOKE_NPY_IO_URING: return "uring";
    case STOKE_NPY_IO_AUTO: return "auto";
    case STOKE_NPY_IO_REMOTE: return "remote";
    default: return "unknown";
    }
}

int stoke_npy_io_available(int io)
{
    if (io == STOKE_NPY_IO_MMAP || io == STOKE_NPY_IO_PREAD || io == STOKE_NPY_IO_AUTO)
        return STOKE_OK;
    if (io == STOKE_NPY_IO_REMOTE) {
        stoke__remote_pool *p = NULL;
        char why[256];
        int e = stoke__remote_pool_create(&p, why, sizeof(why));
        stoke__remote_pool_destroy(p);
        return e ? stoke__fail(e, "io=remote is not available: %s", why) : STOKE_OK;
    }
    if (io != STOKE_NPY_IO_URING)
        return stoke__fail(STOKE_EINVAL, "npy: unknown io mode %d", io);
    if (!stoke__npy_uring_built())
        return stoke__fail(STOKE_ENOTSUP,
                           "io=uring is not available: stoke was built without liburing "
                           "(install liburing-dev and reconfigure; io=mmap and io=pread work)");
    char why[160];
    int e = stoke__npy_uring_probe(why, sizeof(why));
    if (e)
        return stoke__fail(STOKE_ENOTSUP, "io=uring is not available: %s", why);
    return STOKE_OK;
}
