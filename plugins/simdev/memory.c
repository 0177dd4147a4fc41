/* simdev — pinned host memory, device memory, and sharing both with other processes.
 *
 * Pinned host memory: host_alloc maps a fresh memfd (shared, so that it can be exported) with
 * MAP_POPULATE (every page is faulted in up front, as a driver that page-locks memory does),
 * keeps the memfd open and records the block in a table of pinned ranges; host_register
 * records caller memory in the same table, and so does an IPC import of a host block.  When no
 * memfd can be made (out of file descriptors) the block is anonymous memory that cannot be
 * exported.  The table is
 * an array sorted by start address, so is_pinned is a binary search under a read lock: true for
 * every byte inside a block or range, false one past its end.  Ranges never overlap (a
 * register that overlaps an existing range fails with STOKE_EBUSY).
 *
 * Device memory the CPU cannot touch: each device_alloc creates a memfd and maps it twice:
 * a PROT_NONE view whose address is the handle the host sees (any CPU access through it faults,
 * as a GPU pointer would), and a read-write view that only the copy engine (stream.c) uses.
 * Buffers are reference-counted: a queued copy holds a reference, so a buffer freed while a
 * copy on it is still queued is unmapped only after that copy ran.  The memfd stays open for
 * export; an imported device buffer maps the exporter's memfd the same two ways.
 *
 * IPC: a handle carries a dup of the memfd (the kernel keeps the pages while any descriptor or
 * mapping exists, so the memory outlives an exporter that exits) and a simdev_ipc_blob that
 * the importer checks against the memfd's size.  Every memfd is sealed at its final size
 * (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) before it can be exported, so an importer cannot
 * truncate it under the exporter (SIGBUS); an import of an unsealed memfd is refused.  Nothing
 * is created under /dev/shm.
 *
 * Locking: `pinned_lock` (rwlock) guards the pinned table; simdev__lock guards the device
 * buffer table, per-device usage and the counters.  The two are never held together.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "simdev_int.h"

/* ---- pinned host ranges ------------------------------------------------------------------- */

enum { RANGE_ALLOC = 0, RANGE_REGISTER = 1, RANGE_IMPORT = 2 };

typedef struct pinned_range {
    uintptr_t base;
    size_t size;   /* bytes that count as pinned (the requested size) */
    size_t mapped; /* bytes mapped (alloc and import: size rounded up to pages; register: 0) */
    int dev;
    int kind; /* RANGE_*: host_alloc (ours), host_register (caller's), IPC import (mapped) */
    int fd;   /* RANGE_ALLOC: the memfd behind it, -1 when anonymous; else -1 */
} pinned_range;

static pthread_rwlock_t pinned_lock = PTHREAD_RWLOCK_INITIALIZER;
static pinned_range *pinned; /* sorted by base; guarded by pinned_lock */

void simdev__pinned_table_lock_init(void)
{
    pthread_rwlock_init(&pinned_lock, NULL);
}
static size_t npinned, cappinned;

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

/* Index of the first range with base > p (callers hold pinned_lock). */
static size_t upper_bound(uintptr_t p)
{
    size_t lo = 0, hi = npinned;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pinned[mid].base <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Index of the range containing p, or -1 (callers hold pinned_lock). */
static long find_containing(uintptr_t p)
{
    size_t i = upper_bound(p);
    if (i == 0)
        return -1;
    const pinned_range *r = &pinned[i - 1];
    return p - r->base < r->size ? (long)(i - 1) : -1;
}

/* Inserts r unless it overlaps a range: STOKE_OK, STOKE_EBUSY, STOKE_ENOMEM.  Takes the lock. */
static int pinned_insert(const pinned_range *r)
{
    int rc = STOKE_OK;
    pthread_rwlock_wrlock(&pinned_lock);
    size_t i = upper_bound(r->base);
    if ((i > 0 && r->base - pinned[i - 1].base < pinned[i - 1].size) ||
        (i < npinned && pinned[i].base - r->base < r->size)) {
        rc = STOKE_EBUSY;
        goto out;
    }
    if (npinned == cappinned) {
        size_t cap = cappinned ? 2 * cappinned : 64;
        pinned_range *grown = realloc(pinned, cap * sizeof(*grown));
        if (!grown) {
            rc = STOKE_ENOMEM;
            goto out;
        }
        pinned = grown;
        cappinned = cap;
    }
    memmove(&pinned[i + 1], &pinned[i], (npinned - i) * sizeof(*pinned));
    pinned[i] = *r;
    npinned++;
out:
    pthread_rwlock_unlock(&pinned_lock);
    return rc;
}

/* Removes the range starting exactly at `base` of the given kind; copies it to *out.
 * STOKE_OK or STOKE_EINVAL.  Takes the lock. */
static int pinned_remove(uintptr_t base, int kind, pinned_range *out)
{
    int rc = STOKE_EINVAL;
    pthread_rwlock_wrlock(&pinned_lock);
    size_t i = upper_bound(base);
    if (i > 0 && pinned[i - 1].base == base && pinned[i - 1].kind == kind) {
        *out = pinned[i - 1];
        memmove(&pinned[i - 1], &pinned[i], (npinned - i) * sizeof(*pinned));
        npinned--;
        rc = STOKE_OK;
    }
    pthread_rwlock_unlock(&pinned_lock);
    return rc;
}

/* Seals a memfd of its final size before it can be exported: no importer can shrink it under
 * the exporter's mapping (SIGBUS there) or grow it, nor change the seals.  0 or -1 (errno). */
static int seal_fd(int fd)
{
    return fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
}

/* A memfd of `size` bytes for memory that may be exported, or -1 (logged at DEBUG: the memory
 * is then anonymous and simply cannot be shared). */
static int shareable_fd(size_t size)
{
    int fd = memfd_create("simdev-pinned", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd >= 0 && ftruncate(fd, (off_t)size) == 0 && seal_fd(fd) == 0)
        return fd;
    int err = errno;
    if (fd >= 0)
        close(fd);
    simdev__log(STOKE_LOG_DEBUG, "host_alloc: no memfd (%s): the block cannot be exported",
                strerror(err));
    return -1;
}

static void count_failed_alloc(void)
{
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.allocs_failed++;
    pthread_mutex_unlock(&simdev__lock);
}

int simdev__host_alloc(int dev, size_t size, void **out)
{
    if (!out)
        return STOKE_EINVAL;
    *out = NULL;
    int rc = simdev__check_dev(dev, "host_alloc");
    if (rc != STOKE_OK)
        return rc;
    if (size == 0) {
        simdev__log(STOKE_LOG_WARN, "host_alloc: size 0 on device %d", dev);
        return STOKE_EINVAL;
    }
    rc = simdev__alloc_attempt("host_alloc", dev, size);
    if (rc != STOKE_OK)
        return rc;
    size_t ps = page_size();
    if (size > SIZE_MAX - ps) {
        count_failed_alloc();
        return STOKE_ENOMEM;
    }
    size_t mapped = (size + ps - 1) / ps * ps;
    int fd = shareable_fd(mapped);
    /* MAP_POPULATE faults every page in now, as cuMemHostAlloc's page-locking does. */
    void *p = fd >= 0 ? mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0)
                      : mmap(NULL, mapped, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (p == MAP_FAILED) {
        int err = errno;
        if (fd >= 0)
            close(fd);
        count_failed_alloc();
        simdev__log(STOKE_LOG_WARN, "host_alloc: mmap of %zu bytes failed: %s", mapped,
                    strerror(err));
        return STOKE_ENOMEM;
    }
    pinned_range r = {.base = (uintptr_t)p,
                      .size = size,
                      .mapped = mapped,
                      .dev = dev,
                      .kind = RANGE_ALLOC,
                      .fd = fd};
    rc = pinned_insert(&r);
    if (rc != STOKE_OK) { /* EBUSY cannot happen for a fresh mapping; ENOMEM can */
        munmap(p, mapped);
        if (fd >= 0)
            close(fd);
        count_failed_alloc();
        return STOKE_ENOMEM;
    }
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.host_allocs++;
    simdev__ctr.live_host_blocks++;
    simdev__ctr.live_host_bytes += size;
    pthread_mutex_unlock(&simdev__lock);
    *out = p;
    return STOKE_OK;
}

int simdev__host_free(int dev, void *ptr)
{
    (void)dev; /* like cuMemFreeHost, the block is found by address alone */
    if (!ptr)
        return STOKE_OK;
    pinned_range r;
    if (pinned_remove((uintptr_t)ptr, RANGE_ALLOC, &r) != STOKE_OK) {
        simdev__log(STOKE_LOG_WARN, "host_free: %p is not a block from simdev host_alloc", ptr);
        return STOKE_EINVAL;
    }
    munmap((void *)r.base, r.mapped);
    if (r.fd >= 0)
        close(r.fd);
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.host_frees++;
    simdev__ctr.live_host_blocks--;
    simdev__ctr.live_host_bytes -= r.size;
    pthread_mutex_unlock(&simdev__lock);
    return STOKE_OK;
}

int simdev__host_register(int dev, void *ptr, size_t size)
{
    if (!ptr || size == 0 || (uintptr_t)ptr > UINTPTR_MAX - size) {
        simdev__log(STOKE_LOG_WARN, "host_register: invalid range %p + %zu", ptr, size);
        return STOKE_EINVAL;
    }
    int rc = simdev__check_dev(dev, "host_register");
    if (rc != STOKE_OK)
        return rc;
    rc = simdev__alloc_attempt("host_register", dev, size);
    if (rc != STOKE_OK)
        return rc;
    pinned_range r = {
        .base = (uintptr_t)ptr, .size = size, .dev = dev, .kind = RANGE_REGISTER, .fd = -1};
    rc = pinned_insert(&r);
    if (rc != STOKE_OK) {
        count_failed_alloc();
        if (rc == STOKE_EBUSY)
            simdev__log(STOKE_LOG_WARN,
                        "host_register: [%p, +%zu) overlaps memory already pinned by simdev", ptr,
                        size);
        return rc;
    }
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.host_registers++;
    simdev__ctr.live_registered++;
    simdev__ctr.live_registered_bytes += size;
    pthread_mutex_unlock(&simdev__lock);
    return STOKE_OK;
}

int simdev__host_unregister(int dev, void *ptr)
{
    (void)dev;
    pinned_range r;
    if (!ptr || pinned_remove((uintptr_t)ptr, RANGE_REGISTER, &r) != STOKE_OK) {
        simdev__log(STOKE_LOG_WARN, "host_unregister: %p is not the start of a registered range",
                    ptr);
        return STOKE_EINVAL;
    }
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.host_unregisters++;
    simdev__ctr.live_registered--;
    simdev__ctr.live_registered_bytes -= r.size;
    pthread_mutex_unlock(&simdev__lock);
    return STOKE_OK;
}

int simdev__is_pinned(const void *ptr, int *out)
{
    if (!out)
        return STOKE_EINVAL;
    pthread_rwlock_rdlock(&pinned_lock);
    *out = ptr && find_containing((uintptr_t)ptr) >= 0;
    pthread_rwlock_unlock(&pinned_lock);
    return STOKE_OK;
}

int simdev__range_pinned(const void *p, size_t n)
{
    if (!p)
        return 0;
    pthread_rwlock_rdlock(&pinned_lock);
    long i = find_containing((uintptr_t)p);
    int in = i >= 0 && n <= pinned[i].size - ((uintptr_t)p - pinned[i].base);
    pthread_rwlock_unlock(&pinned_lock);
    return in;
}

/* ---- device memory ------------------------------------------------------------------------ */

struct simdev_dbuf {
    unsigned char *handle; /* PROT_NONE view: what the host sees */
    unsigned char *rw;     /* read-write view: the copy engine's */
    size_t size, mapped;
    int dev;
    int refs;     /* the table's reference (until device_free) + one per queued copy */
    int fd;       /* the memfd behind both views (kept for export) */
    int imported; /* 1: an IPC import (ipc_close_mem frees it, device_free refuses it) */
};

/* Guarded by simdev__lock. */
static simdev_dbuf **dbufs;
static size_t ndbufs, capdbufs;
static uint64_t dev_used[SIMDEV_MAX_DEVICES];

static void dbuf_unmap(simdev_dbuf *b)
{
    munmap(b->handle, b->mapped);
    munmap(b->rw, b->mapped);
    if (b->fd >= 0)
        close(b->fd);
    free(b);
}

int simdev__device_alloc(int dev, size_t size, void **out)
{
    if (!out)
        return STOKE_EINVAL;
    *out = NULL;
    int rc = simdev__check_dev(dev, "device_alloc");
    if (rc != STOKE_OK)
        return rc;
    if (size == 0) {
        simdev__log(STOKE_LOG_WARN, "device_alloc: size 0 on device %d", dev);
        return STOKE_EINVAL;
    }
    rc = simdev__alloc_attempt("device_alloc", dev, size);
    if (rc != STOKE_OK)
        return rc;

    /* Reserve the bytes against the device's memory first (and give them back on failure). */
    pthread_mutex_lock(&simdev__lock);
    uint64_t total = simdev__cfg.memory, used = dev_used[dev];
    int fits = size <= total && used <= total - size;
    if (fits)
        dev_used[dev] += size;
    else
        simdev__ctr.allocs_failed++;
    pthread_mutex_unlock(&simdev__lock);
    if (!fits) {
        simdev__log(STOKE_LOG_WARN,
                    "device_alloc: out of memory on device %d: %zu bytes asked, %llu of %llu in "
                    "use (STOKE_SIMDEV_MEMORY)",
                    dev, size, (unsigned long long)used, (unsigned long long)total);
        return STOKE_ENOMEM;
    }

    const char *what = "malloc";
    int err = 0, fd = -1;
    size_t ps = page_size();
    simdev_dbuf *b = calloc(1, sizeof(*b));
    if (!b)
        goto fail;
    b->size = size;
    b->mapped = (size + ps - 1) / ps * ps;
    b->dev = dev;
    b->refs = 1;
    b->fd = -1;
    b->handle = b->rw = MAP_FAILED;
    what = "memfd_create";
    fd = memfd_create("simdev-device-memory", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        goto fail;
    what = "ftruncate";
    if (ftruncate(fd, (off_t)b->mapped) != 0)
        goto fail;
    what = "F_ADD_SEALS";
    if (seal_fd(fd) != 0)
        goto fail;
    what = "mmap";
    b->handle = mmap(NULL, b->mapped, PROT_NONE, MAP_SHARED, fd, 0);
    if (b->handle == MAP_FAILED)
        goto fail;
    b->rw = mmap(NULL, b->mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (b->rw == MAP_FAILED)
        goto fail;
    b->fd = fd; /* kept for export */
    fd = -1;

    pthread_mutex_lock(&simdev__lock);
    if (ndbufs == capdbufs) {
        size_t cap = capdbufs ? 2 * capdbufs : 32;
        simdev_dbuf **grown = realloc(dbufs, cap * sizeof(*grown));
        if (!grown) {
            pthread_mutex_unlock(&simdev__lock);
            what = "realloc";
            errno = ENOMEM;
            goto fail;
        }
        dbufs = grown;
        capdbufs = cap;
    }
    dbufs[ndbufs++] = b;
    simdev__ctr.device_allocs++;
    simdev__ctr.live_device_buffers++;
    simdev__ctr.live_device_bytes += size;
    pthread_mutex_unlock(&simdev__lock);
    *out = b->handle;
    return STOKE_OK;

fail:
    err = errno;
    if (fd >= 0)
        close(fd);
    if (b) {
        if (b->handle != MAP_FAILED)
            munmap(b->handle, b->mapped);
        if (b->rw != MAP_FAILED)
            munmap(b->rw, b->mapped);
        free(b);
    }
    pthread_mutex_lock(&simdev__lock);
    dev_used[dev] -= size;
    simdev__ctr.allocs_failed++;
    pthread_mutex_unlock(&simdev__lock);
    simdev__log(STOKE_LOG_WARN, "device_alloc: %s failed for %zu bytes on device %d: %s", what,
                size, dev, strerror(err));
    return STOKE_ENOMEM;
}

/* Index of `handle` in the table or -1 (simdev__lock held). */
static long dbuf_find(const void *handle)
{
    for (size_t i = 0; i < ndbufs; i++)
        if (dbufs[i]->handle == handle)
            return (long)i;
    return -1;
}

int simdev__device_free(int dev, void *handle)
{
    if (!handle)
        return STOKE_OK;
    pthread_mutex_lock(&simdev__lock);
    long i = dbuf_find(handle);
    simdev_dbuf *b = i >= 0 ? dbufs[i] : NULL;
    if (b && (b->dev != dev || b->imported))
        b = NULL;
    int last = 0;
    if (b) {
        dbufs[i] = dbufs[--ndbufs];
        dev_used[b->dev] -= b->size;
        simdev__ctr.device_frees++;
        simdev__ctr.live_device_buffers--;
        simdev__ctr.live_device_bytes -= b->size;
        last = --b->refs == 0;
    }
    pthread_mutex_unlock(&simdev__lock);
    if (!b) {
        simdev__log(STOKE_LOG_WARN,
                    "device_free: %p is not a simdev buffer of device %d (an "
                    "imported buffer is closed with ipc_close_mem)",
                    handle, dev);
        return STOKE_EINVAL;
    }
    if (last)
        dbuf_unmap(b);
    return STOKE_OK;
}

int simdev__dbuf_acquire(void *handle, int dev, size_t off, size_t n, simdev_dbuf **out,
                         unsigned char **rw)
{
    pthread_mutex_lock(&simdev__lock);
    long i = dbuf_find(handle);
    simdev_dbuf *b = i >= 0 ? dbufs[i] : NULL;
    int rc = STOKE_OK;
    size_t size = 0;
    int bdev = -1;
    if (!b || b->dev != dev) {
        rc = STOKE_EINVAL;
        bdev = b ? b->dev : -1;
    } else if (off > b->size || n > b->size - off) {
        rc = STOKE_ERANGE;
        size = b->size;
    } else {
        b->refs++;
        *out = b;
        *rw = b->rw + off;
    }
    pthread_mutex_unlock(&simdev__lock);
    if (rc == STOKE_EINVAL && bdev >= 0)
        simdev__log(STOKE_LOG_WARN, "copy: buffer %p belongs to device %d, the stream to device %d",
                    handle, bdev, dev);
    else if (rc == STOKE_EINVAL)
        simdev__log(STOKE_LOG_WARN, "copy: %p is not a simdev device buffer", handle);
    else if (rc == STOKE_ERANGE)
        simdev__log(STOKE_LOG_WARN,
                    "copy: %zu bytes at offset %zu exceed the %zu-byte device buffer %p", n, off,
                    size, handle);
    return rc;
}

void simdev__dbuf_release(simdev_dbuf *b)
{
    pthread_mutex_lock(&simdev__lock);
    int last = --b->refs == 0;
    pthread_mutex_unlock(&simdev__lock);
    if (last)
        dbuf_unmap(b);
}

void simdev__memory_shutdown(void)
{
    pthread_mutex_lock(&simdev__lock);
    simdev_dbuf **bufs = dbufs;
    size_t n = ndbufs;
    dbufs = NULL;
    ndbufs = capdbufs = 0;
    memset(dev_used, 0, sizeof(dev_used));
    pthread_mutex_unlock(&simdev__lock);
    /* Stream threads are joined: only the table's references remain. */
    for (size_t i = 0; i < n; i++)
        dbuf_unmap(bufs[i]);
    free(bufs);

    pthread_rwlock_wrlock(&pinned_lock);
    for (size_t i = 0; i < npinned; i++) {
        if (pinned[i].kind != RANGE_REGISTER)
            munmap((void *)pinned[i].base, pinned[i].mapped);
        if (pinned[i].fd >= 0)
            close(pinned[i].fd);
    }
    free(pinned);
    pinned = NULL;
    npinned = cappinned = 0;
    pthread_rwlock_unlock(&pinned_lock);
}

/* ---- IPC ------------------------------------------------------------------------------------ */

#define SIMDEV_IPC_MAGIC 0x53444950u /* "PIDS" */

/* simdev's part of a handle (h->blob); h->fd is a dup of the memfd. */
typedef struct simdev_ipc_blob {
    uint32_t magic;  /* SIMDEV_IPC_MAGIC */
    uint32_t kind;   /* STOKE_IPC_HOST / STOKE_IPC_DEVICE, as h->kind */
    uint64_t mapped; /* bytes of the memfd (the exporter's mapping) */
} simdev_ipc_blob;

static void count_ipc(uint64_t *ctr, int delta)
{
    pthread_mutex_lock(&simdev__lock);
    *ctr += (uint64_t)(int64_t)delta;
    pthread_mutex_unlock(&simdev__lock);
}

/* Fills the handle's descriptor and blob for a memfd of `mapped` bytes. */
static int export_fd(stoke_ipc_handle *h, int fd, size_t mapped)
{
    int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (dup_fd < 0) {
        simdev__log(STOKE_LOG_WARN, "ipc export: cannot duplicate the memfd: %s", strerror(errno));
        return STOKE_EIO;
    }
    simdev_ipc_blob blob = {.magic = SIMDEV_IPC_MAGIC, .kind = h->kind, .mapped = mapped};
    memcpy(h->blob, &blob, sizeof(blob));
    h->blob_len = sizeof(blob);
    h->fd = dup_fd;
    count_ipc(&simdev__ctr.ipc_exports, 1);
    return STOKE_OK;
}

static int export_host(int dev, stoke_ipc_handle *h, void *ptr)
{
    int rc = STOKE_OK, fd = -1, bdev = -1;
    size_t size = 0, mapped = 0;
    pthread_rwlock_rdlock(&pinned_lock);
    size_t i = upper_bound((uintptr_t)ptr);
    const pinned_range *r = i > 0 ? &pinned[i - 1] : NULL;
    if (!r || r->base != (uintptr_t)ptr || r->kind != RANGE_ALLOC) {
        rc = STOKE_EINVAL;
    } else {
        bdev = r->dev, size = r->size, mapped = r->mapped;
        fd = fcntl(r->fd, F_DUPFD_CLOEXEC, 0); /* under the lock: host_free closes r->fd */
    }
    pthread_rwlock_unlock(&pinned_lock);
    if (rc != STOKE_OK) {
        simdev__log(STOKE_LOG_WARN,
                    "ipc export: %p is not the start of a simdev host_alloc "
                    "block",
                    ptr);
        return rc;
    }
    if (fd < 0 || bdev != dev || h->size > size) {
        if (fd >= 0)
            close(fd);
        if (bdev != dev)
            simdev__log(STOKE_LOG_WARN, "ipc export: block %p belongs to device %d, not %d", ptr,
                        bdev, dev);
        else if (h->size > size)
            simdev__log(STOKE_LOG_WARN, "ipc export: %llu bytes asked, block %p holds %zu",
                        (unsigned long long)h->size, ptr, size);
        else
            simdev__log(STOKE_LOG_WARN,
                        "ipc export: block %p has no memfd (it was made when "
                        "none could be created), so it cannot be shared",
                        ptr);
        return STOKE_EINVAL;
    }
    rc = export_fd(h, fd, mapped);
    close(fd);
    return rc;
}

static int export_device(int dev, stoke_ipc_handle *h, void *handle)
{
    pthread_mutex_lock(&simdev__lock);
    long i = dbuf_find(handle);
    simdev_dbuf *b = i >= 0 ? dbufs[i] : NULL;
    int ok = b && b->dev == dev && h->size <= b->size && b->fd >= 0;
    size_t size = b ? b->size : 0, mapped = b ? b->mapped : 0;
    int fd = ok ? fcntl(b->fd, F_DUPFD_CLOEXEC, 0) : -1;
    pthread_mutex_unlock(&simdev__lock);
    if (!ok) {
        simdev__log(STOKE_LOG_WARN,
                    "ipc export: %p is not a simdev device buffer of device %d "
                    "with %llu bytes (it has %zu)",
                    handle, dev, (unsigned long long)h->size, size);
        return STOKE_EINVAL;
    }
    if (fd < 0) {
        simdev__log(STOKE_LOG_WARN, "ipc export: cannot duplicate the memfd: %s", strerror(errno));
        return STOKE_EIO;
    }
    int rc = export_fd(h, fd, mapped);
    close(fd);
    return rc;
}

int simdev__ipc_export(int dev, stoke_ipc_handle *h, void *ptr)
{
    int rc = simdev__check_dev(dev, "ipc_export_mem");
    if (rc != STOKE_OK)
        return rc;
    if (!h || !ptr)
        return STOKE_EINVAL;
    return h->kind == STOKE_IPC_HOST ? export_host(dev, h, ptr) : export_device(dev, h, ptr);
}

/* Checks the blob and the descriptor of a handle; *mapped = bytes to map. */
static int check_import(const stoke_ipc_handle *h, size_t *mapped)
{
    simdev_ipc_blob blob;
    if (h->blob_len != sizeof(blob)) {
        simdev__log(STOKE_LOG_WARN, "ipc import: the handle's blob has %u bytes, simdev's has %zu",
                    (unsigned)h->blob_len, sizeof(blob));
        return STOKE_EINVAL;
    }
    memcpy(&blob, h->blob, sizeof(blob));
    if (blob.magic == SIMDEV_IPC_MAGIC && blob.kind == h->kind && blob.mapped < h->size) {
        simdev__log(STOKE_LOG_WARN,
                    "ipc import: the handle says %llu bytes, but the shared "
                    "memory has only %llu",
                    (unsigned long long)h->size, (unsigned long long)blob.mapped);
        return STOKE_EINVAL;
    }
    if (blob.magic != SIMDEV_IPC_MAGIC || blob.kind != h->kind || blob.mapped > SIZE_MAX) {
        simdev__log(STOKE_LOG_WARN,
                    "ipc import: the handle's blob is not simdev's (magic "
                    "0x%08x, kind %u, %llu bytes mapped for %llu shared)",
                    (unsigned)blob.magic, (unsigned)blob.kind, (unsigned long long)blob.mapped,
                    (unsigned long long)h->size);
        return STOKE_EINVAL;
    }
    struct stat st;
    if (h->fd < 0 || fstat(h->fd, &st) != 0 || st.st_size < 0 ||
        (uint64_t)st.st_size < blob.mapped) {
        simdev__log(STOKE_LOG_WARN,
                    "ipc import: the handle's descriptor %d is not a memfd of "
                    "%llu bytes",
                    (int)h->fd, (unsigned long long)blob.mapped);
        return STOKE_EINVAL;
    }
    int seals = fcntl(h->fd, F_GET_SEALS);
    if (seals < 0 || (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
        simdev__log(STOKE_LOG_WARN,
                    "ipc import: the handle's memfd (process %lld) is not sealed "
                    "against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW%s): a holder "
                    "could truncate it under this mapping; refused",
                    (long long)h->pid, seals < 0 ? ": not a sealable memfd" : "");
        return STOKE_EINVAL;
    }
    *mapped = (size_t)blob.mapped;
    return STOKE_OK;
}

static int import_host(int dev, const stoke_ipc_handle *h, size_t mapped, void **out)
{
    void *p = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, h->fd, 0);
    if (p == MAP_FAILED) {
        simdev__log(STOKE_LOG_WARN, "ipc import: mmap of %zu bytes failed: %s", mapped,
                    strerror(errno));
        return STOKE_ENOMEM;
    }
    pinned_range r = {.base = (uintptr_t)p,
                      .size = (size_t)h->size,
                      .mapped = mapped,
                      .dev = dev,
                      .kind = RANGE_IMPORT,
                      .fd = -1};
    if (pinned_insert(&r) != STOKE_OK) {
        munmap(p, mapped);
        return STOKE_ENOMEM;
    }
    pthread_mutex_lock(&simdev__lock);
    simdev__ctr.ipc_imports++;
    simdev__ctr.live_host_imports++;
    pthread_mutex_unlock(&simdev__lock);
    *out = p;
    return STOKE_OK;
}

static int import_device(int dev, const stoke_ipc_handle *h, size_t mapped, void **out)
{
    simdev_dbuf *b = calloc(1, sizeof(*b));
    if (!b)
        return STOKE_ENOMEM;
    *b = (simdev_dbuf){
        .size = (size_t)h->size, .mapped = mapped, .dev = dev, .refs = 1, .imported = 1, .fd = -1};
    b->handle = mmap(NULL, mapped, PROT_NONE, MAP_SHARED, h->fd, 0);
    b->rw = mmap(NULL, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, 0);
    if (b->handle != MAP_FAILED && b->rw != MAP_FAILED)
        b->fd = fcntl(h->fd, F_DUPFD_CLOEXEC, 0); /* so that the import can be exported too */
    if (b->handle == MAP_FAILED || b->rw == MAP_FAILED || b->fd < 0) {
        int err = errno;
        if (b->handle != MAP_FAILED)
            munmap(b->handle, mapped);
        if (b->rw != MAP_FAILED)
            munmap(b->rw, mapped);
        free(b);
        simdev__log(STOKE_LOG_WARN, "ipc import: mapping %zu bytes of device memory failed: %s",
                    mapped, strerror(err));
        return STOKE_ENOMEM;
    }
    pthread_mutex_lock(&simdev__lock);
    int rc = STOKE_OK;
    if (ndbufs == capdbufs) {
        size_t cap = capdbufs ? 2 * capdbufs : 32;
        simdev_dbuf **grown = realloc(dbufs, cap * sizeof(*grown));
        if (!grown)
            rc = STOKE_ENOMEM;
        else
            dbufs = grown, capdbufs = cap;
    }
    if (rc == STOKE_OK) {
        dbufs[ndbufs++] = b;
        simdev__ctr.ipc_imports++;
        simdev__ctr.live_device_imports++;
    }
    pthread_mutex_unlock(&simdev__lock);
    if (rc != STOKE_OK) {
        dbuf_unmap(b);
        return rc;
    }
    *out = b->handle;
    return STOKE_OK;
}

int simdev__ipc_import(int dev, const stoke_ipc_handle *h, void **out)
{
    int rc = simdev__check_dev(dev, "ipc_import_mem");
    if (rc != STOKE_OK)
        return rc;
    if (!h || !out)
        return STOKE_EINVAL;
    size_t mapped = 0;
    rc = check_import(h, &mapped);
    if (rc != STOKE_OK)
        return rc;
    return h->kind == STOKE_IPC_HOST ? import_host(dev, h, mapped, out)
                                     : import_device(dev, h, mapped, out);
}

static int close_device(int dev, void *handle)
{
    pthread_mutex_lock(&simdev__lock);
    long i = dbuf_find(handle);
    simdev_dbuf *b = i >= 0 ? dbufs[i] : NULL;
    if (b && (!b->imported || b->dev != dev))
        b = NULL;
    int last = 0;
    if (b) {
        dbufs[i] = dbufs[--ndbufs];
        simdev__ctr.live_device_imports--;
        last = --b->refs == 0;
    }
    pthread_mutex_unlock(&simdev__lock);
    if (!b) {
        simdev__log(STOKE_LOG_WARN, "ipc close: %p is not a device buffer imported on device %d",
                    handle, dev);
        return STOKE_EINVAL;
    }
    if (last)
        dbuf_unmap(b);
    return STOKE_OK;
}

int simdev__ipc_close(int dev, int kind, void *ptr)
{
    if (kind == STOKE_IPC_DEVICE)
        return close_device(dev, ptr);
    pinned_range r;
    if (!ptr || pinned_remove((uintptr_t)ptr, RANGE_IMPORT, &r) != STOKE_OK) {
        simdev__log(STOKE_LOG_WARN, "ipc close: %p is not an imported host block", ptr);
        return STOKE_EINVAL;
    }
    munmap((void *)r.base, r.mapped);
    count_ipc(&simdev__ctr.live_host_imports, -1);
    return STOKE_OK;
}
