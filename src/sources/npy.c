/* The npy source: rows of a .npy file are samples, copied straight into the loader's slots.
 *
 * Lifetime: stoke_npy_open_opts opens (and, for IO_MMAP, maps) the data file and the optional
 * labels file; everything is released by the dataset's close callback.  get() only reads the
 * immutable npy_file structs, so concurrent calls from workers need no lock.
 *
 * A file changed by someone else while it is loaded is STOKE_EIO "file changed while loading"
 * in every I/O mode, never a crash: IO_MMAP copies under the SIGBUS guard of fault_guard.h (a
 * page past a new end of file faults), IO_PREAD sees a short read, and both compare the file's
 * size and mtime with those seen at open every STAT_EVERY samples (see docs/sources.md). */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/fault_guard.h"
#include "sources/npy_header.h"
#include "stoke/sources.h"

/* get() of a sample whose index is a multiple of this fstat()s the file: at least once per
 * epoch that visits sample 0, one system call per STAT_EVERY samples otherwise. */
#define STAT_EVERY 256

typedef struct npy_file {
    char *path;
    int fd;
    const unsigned char *map; /* IO_MMAP: the whole file */
    size_t map_len;
    stoke__npy_header h;
    uint64_t rows;
    size_t row_bytes;
    uint64_t size;         /* st_size at open */
    struct timespec mtime; /* st_mtim at open */
} npy_file;

typedef struct npy_ds {
    int io;
    int nfiles; /* 1 (data) or 2 (data, labels) */
    npy_file f[2];
} npy_ds;

static void npy_file_close(npy_file *f)
{
    if (f->map)
        munmap((void *)f->map, f->map_len);
    if (f->fd >= 0)
        close(f->fd);
    free(f->path);
    memset(f, 0, sizeof(*f));
    f->fd = -1;
}

static int read_full(int fd, void *buf, size_t n, uint64_t at, size_t *got)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

static const char *file_kind(mode_t m)
{
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISDIR(m)  ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "something else";
}

/* Opens `path` read-only into f->fd and records its size and mtime; anything but a regular
 * file is refused.  O_NONBLOCK keeps open() from waiting for a writer on a FIFO (or a carrier
 * on a device), O_NOCTTY from acquiring a terminal; the descriptor is made blocking again
 * before any read. */
static int open_regular(npy_file *f, const char *path)
{
    f->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    struct stat st;
    if (f->fd < 0) {
        int e = errno;
        if (e != ENOENT && stat(path, &st) == 0 && !S_ISREG(st.st_mode))
            return stoke__fail(STOKE_EIO, "npy %s: is %s, not a regular file", path,
                               file_kind(st.st_mode));
        return stoke__fail(e == ENOENT ? STOKE_ENOENT : STOKE_EIO, "npy %s: cannot open: %s", path,
                           strerror(e));
    }
    if (fstat(f->fd, &st) != 0)
        return stoke__fail(STOKE_EIO, "npy %s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode))
        return stoke__fail(STOKE_EIO, "npy %s: is %s, not a regular file", path,
                           file_kind(st.st_mode));
    int fl = fcntl(f->fd, F_GETFL);
    if (fl < 0 || fcntl(f->fd, F_SETFL, fl & ~O_NONBLOCK) != 0)
        return stoke__fail(STOKE_EIO, "npy %s: fcntl: %s", path, strerror(errno));
    f->size = (uint64_t)st.st_size;
    f->mtime = st.st_mtim;
    return STOKE_OK;
}

static int npy_file_open(npy_file *f, const char *path, int io)
{
    memset(f, 0, sizeof(*f));
    f->fd = -1;
    f->path = strdup(path);
    if (!f->path)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", path);
    int rc = open_regular(f, path);
    if (rc)
        return rc;
    uint64_t size = f->size;

    size_t want = size < STOKE__NPY_PREFIX_MAX ? (size_t)size : STOKE__NPY_PREFIX_MAX;
    unsigned char *head = malloc(want ? want : 1);
    if (!head)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", path);
    size_t got = 0;
    int e = read_full(f->fd, head, want, 0, &got);
    if (e) {
        free(head);
        return stoke__fail(STOKE_EIO, "npy %s: cannot read: %s", path, strerror(-e));
    }
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
        if (h->ndim - 1 > STOKE_MAX_DIMS)
            return stoke__fail(STOKE_EFORMAT,
                               "npy %s: %d dimensions: a sample (row) has %d, at most %d are "
                               "supported",
                               path, h->ndim, h->ndim - 1, STOKE_MAX_DIMS);
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
    if (io == STOKE_NPY_IO_MMAP && size > 0) {
        if (size > SIZE_MAX)
            return stoke__fail(STOKE_ELIMIT, "npy %s: file too large to map", path);
        e = stoke__fault_guard_install();
        if (e)
            return stoke__fail(STOKE_EIO,
                               "npy %s: cannot install the SIGBUS handler that guards "
                               "mappings: %s",
                               path, strerror(-e));
        void *m = mmap(NULL, (size_t)size, PROT_READ, MAP_SHARED, f->fd, 0);
        if (m == MAP_FAILED)
            return stoke__fail(STOKE_EIO, "npy %s: mmap of %llu bytes failed: %s", path,
                               (unsigned long long)size, strerror(errno));
        f->map = m;
        f->map_len = (size_t)size;
        /* No madvise: samples are read in sampler order, which the dataset does not know, and
         * the kernel's default readahead serves both sequential reads and shuffled reads of a
         * file already in the page cache; MADV_RANDOM would slow the sequential case. */
    }
    return STOKE_OK;
}

static void swap_bytes(unsigned char *p, size_t n, size_t unit)
{
    for (size_t i = 0; i + unit <= n; i += unit) {
        if (unit == 2) {
            uint16_t v;
            memcpy(&v, p + i, 2);
            v = __builtin_bswap16(v);
            memcpy(p + i, &v, 2);
        } else if (unit == 4) {
            uint32_t v;
            memcpy(&v, p + i, 4);
            v = __builtin_bswap32(v);
            memcpy(p + i, &v, 4);
        } else if (unit == 8) {
            uint64_t v;
            memcpy(&v, p + i, 8);
            v = __builtin_bswap64(v);
            memcpy(p + i, &v, 8);
        }
    }
}

static uint64_t npy_length(void *user)
{
    return ((const npy_ds *)user)->f[0].rows;
}

/* "file changed while loading": the one message for a file modified under a load. */
static int changed(const npy_file *f, uint64_t index, char *msg, size_t msg_len, const char *why)
{
    stoke__fmt(msg, msg_len, "npy %s: sample %llu: file changed while loading (%s)", f->path,
               (unsigned long long)index, why);
    return STOKE_EIO;
}

/* Compares the file's size and mtime with those seen at open. */
static int check_unchanged(const npy_file *f, uint64_t index, char *msg, size_t msg_len)
{
    struct stat st;
    if (fstat(f->fd, &st) != 0) {
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: cannot stat: %s", f->path,
                   (unsigned long long)index, strerror(errno));
        return STOKE_EIO;
    }
    char why[128];
    if ((uint64_t)st.st_size != f->size) {
        stoke__fmt(why, sizeof(why), "now %llu bytes, %llu when opened",
                   (unsigned long long)st.st_size, (unsigned long long)f->size);
        return changed(f, index, msg, msg_len, why);
    }
    if (st.st_mtim.tv_sec != f->mtime.tv_sec || st.st_mtim.tv_nsec != f->mtime.tv_nsec)
        return changed(f, index, msg, msg_len, "modified after it was opened");
    return STOKE_OK;
}

/* IO_MMAP: one memcpy from the mapping, under the SIGBUS guard. */
static int read_row_mmap(const npy_file *f, uint64_t index, uint64_t at, void *dst, char *msg,
                         size_t msg_len)
{
    if (stoke__guarded_copy(dst, f->map + at, f->row_bytes, f->map, f->map_len) != 0)
        return changed(f, index, msg, msg_len, "its mapped pages are gone: truncated");
    return STOKE_OK;
}

/* IO_PREAD: pread straight into the slot. */
static int read_row_pread(const npy_file *f, uint64_t index, uint64_t at, void *dst, char *msg,
                          size_t msg_len)
{
    size_t got = 0;
    int e = read_full(f->fd, dst, f->row_bytes, at, &got);
    if (e) {
        stoke__fmt(msg, msg_len, "npy %s: sample %llu: read failed: %s", f->path,
                   (unsigned long long)index, strerror(-e));
        return STOKE_EIO;
    }
    if (got != f->row_bytes) {
        char why[128];
        stoke__fmt(why, sizeof(why), "it ends at byte %llu: truncated",
                   (unsigned long long)(at + got));
        return changed(f, index, msg, msg_len, why);
    }
    return STOKE_OK;
}

static int npy_get(void *user, uint64_t index, void *const dst[], int worker, char *msg,
                   size_t msg_len)
{
    (void)worker;
    const npy_ds *ds = user;
    if (index >= ds->f[0].rows) {
        stoke__fmt(msg, msg_len, "npy %s: index %llu out of range (%llu rows)", ds->f[0].path,
                   (unsigned long long)index, (unsigned long long)ds->f[0].rows);
        return STOKE_ERANGE;
    }
    for (int k = 0; k < ds->nfiles; k++) {
        const npy_file *f = &ds->f[k];
        int rc = index % STAT_EVERY == 0 ? check_unchanged(f, index, msg, msg_len) : STOKE_OK;
        if (rc)
            return rc;
        if (!dst[k] || !f->row_bytes)
            continue;
        uint64_t at = f->h.data_offset + index * (uint64_t)f->row_bytes;
        switch (ds->io) {
        case STOKE_NPY_IO_MMAP: rc = read_row_mmap(f, index, at, dst[k], msg, msg_len); break;
        default: rc = read_row_pread(f, index, at, dst[k], msg, msg_len); break;
        }
        if (rc)
            return rc;
        if (f->h.swap)
            swap_bytes(dst[k], f->row_bytes, f->h.swap);
    }
    return STOKE_OK;
}

static void npy_close(void *user)
{
    npy_ds *ds = user;
    if (!ds)
        return;
    for (int k = 0; k < 2; k++)
        npy_file_close(&ds->f[k]);
    free(ds);
}

static void fill_field(stoke_field *fl, const char *name, const npy_file *f, int scalar)
{
    stoke__strlcpy(fl->name, name, sizeof(fl->name));
    fl->dtype = f->h.dtype;
    fl->itemsize = f->h.itemsize;
    fl->ndim = 0;
    if (!scalar && f->h.ndim > 1) {
        fl->ndim = f->h.ndim - 1;
        for (int d = 1; d < f->h.ndim; d++)
            fl->shape[d - 1] = f->h.shape[d];
    }
    fl->bytes = f->row_bytes;
}

void stoke_npy_opts_init(stoke_npy_opts *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof(*opts));
    opts->size = (uint32_t)sizeof(*opts);
    opts->io = STOKE_NPY_IO_MMAP;
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
    if (opts->size < sizeof(stoke_npy_opts))
        return stoke__fail(STOKE_EINVAL,
                           "npy %s: opts->size %u is not sizeof(stoke_npy_opts) (call "
                           "stoke_npy_opts_init)",
                           path, (unsigned)opts->size);
    if (opts->io != STOKE_NPY_IO_MMAP && opts->io != STOKE_NPY_IO_PREAD)
        return stoke__fail(STOKE_EINVAL, "npy %s: unknown io mode %d", path, opts->io);

    npy_ds *ds = calloc(1, sizeof(*ds));
    if (!ds)
        return stoke__fail(STOKE_ENOMEM, "npy %s: out of memory", path);
    ds->f[0].fd = ds->f[1].fd = -1;
    ds->io = opts->io;
    int rc = npy_file_open(&ds->f[0], path, opts->io);
    if (rc)
        goto fail;
    ds->nfiles = 1;
    const char *lp = opts->labels_path;
    if (lp && *lp) {
        rc = npy_file_open(&ds->f[1], lp, opts->io);
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
                             lp, lh->ndim, lh->ndim == 1 ? "" : "s", shape);
            goto fail;
        }
        if (ds->f[1].rows != ds->f[0].rows) {
            rc = stoke__fail(STOKE_EINVAL, "npy %s: labels have %llu rows but data %s has %llu", lp,
                             (unsigned long long)ds->f[1].rows, path,
                             (unsigned long long)ds->f[0].rows);
            goto fail;
        }
    }

    stoke_dataset d;
    stoke_dataset_init(&d);
    d.kind = STOKE_DATASET_MAP;
    d.nfields = ds->nfiles;
    fill_field(&d.fields[0], "data", &ds->f[0], 0);
    if (ds->nfiles == 2)
        fill_field(&d.fields[1], "label", &ds->f[1], 1);
    stoke__fmt(d.name, sizeof(d.name), "npy:%s", path);
    d.user = ds;
    d.length = npy_length;
    d.get = npy_get;
    d.close = npy_close;
    *out = d;
    stoke__log(STOKE_LOG_DEBUG, "npy %s: v%d.0 '%s' %llu rows of %zu bytes%s%s", path,
               ds->f[0].h.major, ds->f[0].h.descr, (unsigned long long)ds->f[0].rows,
               ds->f[0].row_bytes, ds->f[0].h.swap ? " (byte-swapped)" : "",
               ds->io == STOKE_NPY_IO_PREAD ? " (pread)" : "");
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
