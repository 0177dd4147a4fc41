/* The local cache of remote files (cache.h): whole-file downloads into STOKE_CACHE_DIR, one
 * per file across the processes of a node (flock), least recently used copies evicted under
 * STOKE_CACHE_LIMIT.  The read-ahead (background downloads of the next files) is
 * cache_ahead.c's. */
#define _GNU_SOURCE
#include "sources/cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/internal.h"
#include "sources/cache_internal.h"
#include "sources/tar_index.h"

#define DIR_LOCK "stoke-cache.lock"
/* Every file of the directory is opened without following a link, and without waiting on a
 * FIFO: the directory is the caller's own and no one else's to write (private_dir), and
 * nothing in it is taken for a copy unless it is a regular file (open_copy). */
#define FILE_FLAGS (O_NOFOLLOW | O_NONBLOCK)
/* a copy's version: the validator its download's answers repeated (keep_version) */
#define VERSION_ATTR "user.stoke.version"

/* ---- locks -------------------------------------------------------------------------------- */

static int flock_retry(int fd, int op)
{
    int r;
    while ((r = flock(fd, op)) != 0 && errno == EINTR) {
    }
    return r ? -errno : 0;
}

/* Locks lock file `name` exclusively (creating it): 0 and *out, -EWOULDBLOCK (nonblock, held
 * by another), or -errno.  A lock file can be removed by an eviction (which holds it while it
 * unlinks it): a lock taken on a file that is no longer the one under that name is dropped
 * and taken again, so two processes never hold "the" lock of one name at once. */
static int lock_name(int dfd, const char *name, int nonblock, int *out)
{
    for (;;) {
        int fd = openat(dfd, name, O_RDWR | O_CREAT | O_CLOEXEC | FILE_FLAGS, 0600);
        if (fd < 0)
            return -errno;
        int e = flock_retry(fd, LOCK_EX | (nonblock ? LOCK_NB : 0));
        struct stat a, b;
        if (!e && fstat(fd, &a) == 0 && fstatat(dfd, name, &b, 0) == 0 && a.st_ino == b.st_ino &&
            a.st_dev == b.st_dev) {
            *out = fd;
            return 0;
        }
        close(fd);
        if (e)
            return e;
    }
}

/* Releases lock fd of `name`, removing the file first (safe while held: see lock_name), so
 * that lock files exist only while they are used. */
static void unlock_name(int dfd, const char *name, int fd)
{
    unlinkat(dfd, name, 0);
    close(fd);
}

/* Removes lock file `name` when no one holds it. */
static void drop_lock_file(int dfd, const char *name)
{
    int fd;
    if (lock_name(dfd, name, 1, &fd) == 0)
        unlock_name(dfd, name, fd);
}

/* ---- the directory: scan, evict, clear ---------------------------------------------------- */

typedef struct ent {
    char name[STOKE__CACHE_NAME_MAX + 1];
    uint64_t size;
    int64_t atime_ns;
} ent;

typedef struct listing {
    ent *e; /* the complete copies */
    size_t n, cap;
    uint64_t total, partial;
    uint64_t floor;     /* in: a .part counts as at least this (the size a download may reach) */
    uint64_t part_disk; /* the bytes the .part files hold on disk (a reserved one is sparse) */
    size_t parts;       /* downloads in progress (their .part files) */
    uint64_t stale;     /* (SCAN_LOOK) the bytes of .part files no process downloads */
} listing;

/* Whether the download of .part `lk`'s shard is under way: its lock file exists and is held.
 * Takes and creates nothing lasting (a listing writes nothing): the file opened read-only. */
static int part_alive(int dfd, const char *lk)
{
    int fd = openat(dfd, lk, O_RDONLY | O_CLOEXEC | FILE_FLAGS);
    if (fd < 0)
        return 0; /* (lock files exist only while held) */
    int held = flock_retry(fd, LOCK_EX | LOCK_NB) == -EWOULDBLOCK;
    close(fd);
    return held;
}

enum { SCAN_COUNT = 0, SCAN_CLEAN = 1, SCAN_LOOK = 2 };

/* Lists dfd's copies into *l.  The temporary files of downloads no process runs (their lock is
 * free: the process died): SCAN_CLEAN removes them; SCAN_LOOK counts them in l->stale, apart
 * from the downloads under way (l->partial); SCAN_COUNT counts them all in l->partial. */
static int scan(int dfd, listing *l, int clean)
{
    int fd = openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (!d) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return -e;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        int k = stoke__cache_kind_of(de->d_name);
        struct stat st;
        if (k == K_OTHER || k == K_LOCK || strlen(de->d_name) > STOKE__CACHE_NAME_MAX ||
            fstatat(dfd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        if (k == K_PART) {
            char lk[STOKE__CACHE_HEXLEN + 6];
            snprintf(lk, sizeof(lk), "%.*s.lock", STOKE__CACHE_HEXLEN, de->d_name);
            int lfd;
            if (clean == SCAN_LOOK && !part_alive(dfd, lk)) {
                l->stale += (uint64_t)st.st_size;
            } else if (clean == SCAN_CLEAN && lock_name(dfd, lk, 1, &lfd) == 0) {
                unlinkat(dfd, de->d_name, 0); /* nobody downloads it */
                unlock_name(dfd, lk, lfd);
            } else {
                uint64_t sz = (uint64_t)st.st_size;
                l->partial += sz > l->floor ? sz : l->floor;
                l->part_disk += (uint64_t)st.st_blocks * 512u;
                l->parts++;
            }
            continue;
        }
        if (l->n == l->cap) {
            size_t cap = l->cap ? 2 * l->cap : 64;
            ent *e = realloc(l->e, cap * sizeof(*e));
            if (!e) {
                closedir(d);
                return -ENOMEM;
            }
            l->e = e;
            l->cap = cap;
        }
        ent *e = &l->e[l->n++];
        stoke__strlcpy(e->name, de->d_name, sizeof(e->name));
        e->size = (uint64_t)st.st_size;
        e->atime_ns = (int64_t)st.st_atim.tv_sec * 1000000000 + st.st_atim.tv_nsec;
        l->total += e->size;
    }
    closedir(d);
    return 0;
}

static int by_atime(const void *a, const void *b)
{
    const ent *x = a, *y = b;
    return x->atime_ns < y->atime_ns ? -1 : x->atime_ns > y->atime_ns;
}

/* Removes copy `name` unless a reader holds it: 1 removed, 0 in use or gone. */
static int evict(int dfd, const char *name)
{
    int fd = openat(dfd, name, O_RDONLY | O_CLOEXEC | FILE_FLAGS);
    if (fd < 0)
        return 0;
    int done = 0;
    if (flock_retry(fd, LOCK_EX | LOCK_NB) == 0) {
        done = unlinkat(dfd, name, 0) == 0;
        char lk[STOKE__CACHE_HEXLEN + 6];
        snprintf(lk, sizeof(lk), "%.*s.lock", STOKE__CACHE_HEXLEN, name);
        drop_lock_file(dfd, lk);
    }
    close(fd);
    return done;
}

/* Takes the directory's eviction lock: its fd, or -errno. */
static int dir_lock(int dfd)
{
    int g = openat(dfd, DIR_LOCK, O_RDWR | O_CREAT | O_CLOEXEC | FILE_FLAGS, 0600);
    if (g < 0)
        return -errno;
    int e = flock_retry(g, LOCK_EX);
    if (e) {
        close(g);
        return e;
    }
    return g;
}

/* The default cap: what the copies may grow to while a tenth of the file system stays free. */
static uint64_t default_cap(int dfd, uint64_t total)
{
    struct statvfs v;
    if (fstatvfs(dfd, &v) != 0)
        return UINT64_MAX;
    uint64_t avail = (uint64_t)v.f_bavail * v.f_frsize, fs = (uint64_t)v.f_blocks * v.f_frsize;
    return total + avail > fs / 10 ? total + avail - fs / 10 : 0;
}

/* What room() does beside measuring. */
typedef enum room_mode {
    ROOM_EVICT,   /* a read's download: evict until it fits (never for one over the cap) */
    ROOM_RESERVE, /* a background download: only when it fits without evicting */
    ROOM_CHECK    /* neither: does what is there fit */
} room_mode;

/* The one accounting of the cap, under stoke-cache.lock: the copies, the downloads in progress
 * (a .part counts as at least the largest file seen: it grows to about that; one reserved
 * counts at its full size) and `need` more bytes, against the cap (STOKE_CACHE_LIMIT, or
 * default_cap from what is on disk: a reserved .part is sparse, its unwritten rest not yet out
 * of the free space).  ROOM_EVICT removes least recently used copies not in use until they fit
 * (or nothing more can go; failures only log: a cache over its cap still works), ROOM_RESERVE
 * evicts nothing and ROOM_CHECK neither cleans nor counts a floor.  With nm, HASH.part is
 * created under the same lock, at size `need` (so that every later scan counts it in full):
 * by ROOM_EVICT always (at size 0 when need is 0 or over the cap), by ROOM_RESERVE only when
 * it fits (and need is not 0).  Returns the .part's fd, or -1 (errno set); without nm, 1 when
 * it fits, else 0. */
static int room(stoke__cache *c, const stoke__cache_names *nm, uint64_t need, room_mode mode)
{
    int g = dir_lock(c->dfd);
    if (g < 0 && mode == ROOM_EVICT)
        stoke__log(STOKE_LOG_WARN, "cache %s: cannot lock %s: %s", c->dir, DIR_LOCK, strerror(-g));
    listing l = {.floor = mode == ROOM_CHECK ? 0 : atomic_load(&c->largest)};
    int e = g < 0 ? g : scan(c->dfd, &l, mode != ROOM_CHECK);
    if (e && mode == ROOM_EVICT && g >= 0)
        stoke__log(STOKE_LOG_WARN, "cache %s: cannot list it: %s", c->dir, strerror(-e));
    uint64_t have = l.total + l.partial;
    uint64_t cap = c->limit ? c->limit : default_cap(c->dfd, l.total + l.part_disk);
    int over = need > cap, fit = !e && !over && have <= cap - need;
    if (mode == ROOM_RESERVE && !need) /* nothing to reserve by: no guess of its size yet */
        fit = 0;
    if (!e && mode == ROOM_EVICT && over)
        stoke__log(STOKE_LOG_WARN,
                   "cache %s: a file of %" PRIu64 " bytes is over the cap (%" PRIu64
                   "): nothing evicted for it before it is downloaded",
                   c->dir, need, cap);
    else if (!e && mode == ROOM_EVICT && !fit) {
        if (l.n)
            qsort(l.e, l.n, sizeof(*l.e), by_atime);
        for (size_t i = 0; i < l.n && have + need > cap; i++)
            if (evict(c->dfd, l.e[i].name)) {
                have -= l.e[i].size;
                atomic_fetch_add(&c->n->evictions, 1);
                stoke__log(STOKE_LOG_DEBUG, "cache %s: evicted %s (%" PRIu64 " bytes)", c->dir,
                           l.e[i].name, l.e[i].size);
            }
    }
    free(l.e);
    int fd = -1;
    if (nm && (mode == ROOM_EVICT || fit)) {
        fd = openat(c->dfd, nm->part, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | FILE_FLAGS, 0600);
        uint64_t at = mode == ROOM_EVICT && over ? 0 : need;
        if (fd >= 0 && at && ftruncate(fd, (off_t)at) != 0) {
            int keep = errno;
            unlinkat(c->dfd, nm->part, 0);
            close(fd);
            fd = -1;
            errno = keep;
        }
    } else if (nm) {
        errno = EBUSY;
    }
    if (g >= 0)
        close(g);
    return nm ? fd : fit;
}

static void note_size(stoke__cache *c, uint64_t size)
{
    uint64_t cur = atomic_load(&c->largest);
    while (size > cur && !atomic_compare_exchange_weak(&c->largest, &cur, size)) {
    }
}

/* ---- one file ----------------------------------------------------------------------------- */

/* Opens the complete copy, locked shared: its fd (and *size), -ENOENT, or -errno.  A copy
 * evicted between the open and the lock (no link left) counts as missing. */
static int open_copy(const stoke__cache *c, const stoke__cache_names *nm, int touch, uint64_t *size)
{
    for (int i = 0; i < 16; i++) {
        int fd = openat(c->dfd, nm->data, O_RDONLY | O_CLOEXEC | FILE_FLAGS);
        if (fd < 0)
            return -errno;
        struct stat st;
        if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) { /* (the directory is private) */
            close(fd);
            return -EINVAL;
        }
        int e = flock_retry(fd, LOCK_SH);
        if (!e && fstat(fd, &st) == 0 && st.st_nlink > 0) {
            *size = (uint64_t)st.st_size;
            /* the access time orders the eviction: set it, whatever the mount's atime rule
             * (not for a read-ahead's look: the copy is not read) */
            const struct timespec ts[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
            if (touch)
                futimens(fd, ts);
            return fd;
        }
        close(fd);
        if (e)
            return e;
    }
    return -ENOENT;
}

static int read_fd(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    ssize_t r;
    do
        r = pread(*(const int *)ctx, buf, n, (off_t)off);
    while (r < 0 && errno == EINTR);
    *got = r > 0 ? (size_t)r : 0;
    return r < 0 ? -errno : 0;
}

/* A download's CRC-32 against f's (its sidecar index's): 0, or STOKE_EIO with why naming both
 * (the .part is then removed; in a build without zlib nothing is checked). */
static int check_crc(stoke__cache *c, const stoke__remote_file *f, int fd, uint64_t size, char *why,
                     size_t why_len)
{
    uint32_t crc;
    char err[256];
    int rc = stoke__crc32_of(read_fd, &fd, size, &crc, err, sizeof(err));
    if (rc == STOKE_ENOTSUP)
        return 0;
    if (rc) {
        stoke__fmt(why, why_len, "cache %s: reading back %s: %s", c->dir, f->url, err);
        return STOKE_EIO;
    }
    if (crc == f->crc)
        return 0;
    stoke__fmt_short(why, why_len,
                     "GET %s: the download's CRC-32 is %08" PRIx32 ", its index says %08" PRIx32
                     " (the shard changed after `stoke index`: run it again)",
                     f->url, crc, f->crc);
    return STOKE_EIO;
}

/* Keeps the version a download was of (its answers' validator, remote.h: stoke__remote_tag)
 * with the copy, in its VERSION_ATTR, before the copy has its name: an open that later walks
 * the copy reads nothing from the server, and learns its version there (same_version).  A
 * download that learnt none (no validator in the answers, STOKE_REMOTE_CHECK_VERSION=0) removes
 * the attribute: the .part may be a killed download's, truncated, which keeps its attributes.
 * Best effort: a file system without user attributes keeps none (said once, at debug level). */
static void keep_version(stoke__cache *c, int fd, const stoke__remote_tag *t)
{
    const char *v = atomic_load(&t->v);
    if (!v) {
        (void)fremovexattr(fd, VERSION_ATTR);
        return;
    }
    if (fsetxattr(fd, VERSION_ATTR, v, strlen(v), 0) != 0 && !atomic_exchange(&c->no_attr, 1))
        stoke__log(STOKE_LOG_DEBUG,
                   "cache %s: a copy keeps no version (%s: %s): a same-size rewrite of a shard "
                   "whose copy is walked on disk is not told from the copy",
                   c->dir, VERSION_ATTR, strerror(errno));
}

/* Whether the complete copy fd is of f's version, when f is pinned (map mode: the open's
 * offsets are of one version) and the pool compares them: a file with none yet takes the
 * copy's when `adopt` (a read: the open walks the copy and asks the server nothing, so a
 * download after the copy's eviction is compared with it; not a read-ahead's look, before the
 * open reached the file); one with another (the file rewritten, and downloaded again by another
 * process after an eviction) fails STOKE_EIO with why set.  0 also when the copy keeps no
 * version. */
static int same_version(const stoke__cache *c, const stoke__remote_pool *p,
                        const stoke__remote_file *f, int fd, int adopt, char *why, size_t why_len)
{
    if (!f->tag || !stoke__remote_pool_checks(p))
        return 0;
    char v[512];
    ssize_t n = fgetxattr(fd, VERSION_ATTR, v, sizeof(v) - 1);
    if (n <= STOKE__REMOTE_TAG_KEY || (v[0] != 'E' && v[0] != 'L'))
        return 0;
    v[n] = 0;
    const char *had;
    if (!stoke__remote_tag_differs(f->tag, v, adopt, &had))
        return 0;
    stoke__fmt_short(why, why_len,
                     "cache %s: the copy of %s is of another version than the open's (the file "
                     "changed since the open): its %s is %s, it was %s",
                     c->dir, f->url, v[0] == 'E' ? "ETag" : "Last-Modified",
                     v + STOKE__REMOTE_TAG_KEY, had + STOKE__REMOTE_TAG_KEY);
    return STOKE_EIO;
}

/* Downloads f into HASH.part and renames it HASH-BASE once complete (the caller holds
 * HASH.lock): 0 with *out the copy, locked shared, or the error. */
static int download(stoke__cache *c, stoke__remote_pool *p, int slot, const stoke__remote_file *f,
                    const stoke__cache_names *nm, uint64_t expect, int *out, uint64_t *size,
                    char *why, size_t why_len)
{
    int bg = slot < 0; /* a background download: made only where it evicts nothing */
    uint64_t need = expect ? expect : atomic_load(&c->largest);
    for (int i = 0; bg && !need && i < 1000 && !__atomic_load_n(&c->d.stop, __ATOMIC_RELAXED);
         i++) { /* the first shard's headers say it soon; the cache's close stops the wait */
        const struct timespec ms5 = {0, 5000000};
        nanosleep(&ms5, NULL);
        need = atomic_load(&c->largest);
    }
    /* a read's download is reserved at its size when known (as a background one always is):
     * downloads started after it count it in full, not as the few bytes it has so far */
    int fd = room(c, nm, bg ? need : expect, bg ? ROOM_RESERVE : ROOM_EVICT);
    if (fd < 0 && bg) {
        stoke__fmt(why, why_len, "cache %s: no room for %s without evicting", c->dir, f->url);
        return STOKE_EBUSY;
    }
    if (fd < 0) {
        stoke__fmt(why, why_len, "cache %s: cannot create %s for %s: %s", c->dir, nm->part, f->url,
                   strerror(errno));
        return STOKE_EIO;
    }
    if (!bg) /* after the room taken above: the read-ahead gets what is left of the cap */
        stoke__cache_ahead(c, p, f);
    stoke__log(STOKE_LOG_DEBUG, "cache %s: downloading %s into %s", c->dir, f->url, nm->data);
    /* an unpinned file's download still learns its version, kept with the copy for a later
     * open in map mode (its chunks are compared with one another, as the fetch's own) */
    stoke__remote_tag own = {.pass = 1};
    stoke__remote_file tagged = *f;
    if (!tagged.tag)
        tagged.tag = &own;
    /* (a file over the cap is still kept, alone: its bound is the disk's, not the cap) */
    int rc = stoke__remote_fetch(p, slot, &tagged, fd, expect, 0, NULL, &c->largest,
                                 bg ? &c->d.stop : NULL, size, why, why_len);
    if (!rc)
        keep_version(c, fd, tagged.tag);
    free(atomic_load(&own.v));
    if (!rc && bg && !expect && ftruncate(fd, (off_t)*size) != 0) { /* reserved at a guess */
        stoke__fmt(why, why_len, "cache %s: cannot size %s: %s", c->dir, nm->part, strerror(errno));
        rc = STOKE_EIO;
    }
    /* bigger than reserved: never evicted for */
    if (!rc && bg && *size > need && !room(c, NULL, 0, ROOM_CHECK)) {
        stoke__fmt(why, why_len,
                   "cache %s: %s has %" PRIu64 " bytes, more than the %" PRIu64
                   " reserved, and no room without evicting",
                   c->dir, f->url, *size, need);
        rc = STOKE_EBUSY;
    }
    struct stat st = {0};
    if (!rc && (fstat(fd, &st) != 0 || (uint64_t)st.st_size != *size)) {
        stoke__fmt(why, why_len, "cache %s: %s holds %lld bytes of the %" PRIu64 " of %s", c->dir,
                   nm->part, (long long)st.st_size, *size, f->url);
        rc = STOKE_EIO;
    }
    if (!rc && f->has_crc)
        rc = check_crc(c, f, fd, *size, why, why_len);
    int e = rc ? 0 : flock_retry(fd, LOCK_SH); /* in use from the moment it has its name */
    const char *step = "lock";
    if (!rc && !e) {
        step = "rename";
        /* renamed under stoke-cache.lock: a scan running beside a rename may see neither
         * name (readdir's order is the names' hashes), and would count the room as free */
        int g = dir_lock(c->dfd);
        e = renameat(c->dfd, nm->part, c->dfd, nm->data) != 0 ? -errno : 0;
        if (g >= 0)
            close(g);
    }
    if (!rc && e) {
        stoke__fmt(why, why_len, "cache %s: cannot %s %s: %s", c->dir, step, nm->part,
                   strerror(-e));
        rc = STOKE_EIO;
    }
    if (rc) {
        unlinkat(c->dfd, nm->part, 0);
        close(fd);
        return rc;
    }
    atomic_fetch_add(&c->n->misses, 1);
    atomic_fetch_add(&c->n->bytes, *size);
    note_size(c, *size);
    /* its size is known now; and a copy over the cap, complete (its size was no index's
     * claim), evicts every copy not in use: kept alone, else a cap below every shard let the
     * directory grow without bound */
    if (!bg && (!expect || !room(c, NULL, 0, ROOM_CHECK)))
        room(c, NULL, 0, ROOM_EVICT);
    *out = fd;
    return STOKE_OK;
}

int stoke__cache_acquire(stoke__cache *c, stoke__remote_pool *p, int slot,
                         const stoke__remote_file *f, uint64_t expect, int *out, uint64_t *size,
                         char *why, size_t why_len)
{
    int bg = slot < 0;
    stoke__cache_names nm;
    stoke__cache_names_of(f, &nm);
    int fd = open_copy(c, &nm, !bg, size);
    if (fd >= 0 && (!expect || *size == expect)) {
        int rc = same_version(c, p, f, fd, !bg, why, why_len);
        if (rc) {
            close(fd);
            return rc;
        }
        if (!bg)
            atomic_fetch_add(&c->n->hits, 1);
        note_size(c, *size);
        *out = fd;
        return STOKE_OK;
    }
    if (fd >= 0)
        close(fd);
    else if (fd != -ENOENT) {
        stoke__fmt(why, why_len, "cache %s: cannot open %s: %s", c->dir, nm.data, strerror(-fd));
        return STOKE_EIO;
    }
    /* a read waits for f: the files after it in the order are fetched meanwhile (queued once
     * this read's own download has its room, in download(), or here when another has f) */
    uint64_t t0 = stoke__now_ns();
    int lk, e = lock_name(c->dfd, nm.lock, 1, &lk);
    if (bg && e == -EWOULDBLOCK)
        return STOKE_EBUSY;
    if (e == -EWOULDBLOCK) {
        stoke__cache_ahead(c, p, f);
        e = lock_name(c->dfd, nm.lock, 0, &lk);
    }
    if (e) {
        stoke__fmt(why, why_len, "cache %s: cannot lock %s: %s", c->dir, nm.lock, strerror(-e));
        return STOKE_EIO;
    }
    fd = open_copy(c, &nm, !bg, size); /* another process may have finished it meanwhile */
    if (fd >= 0 && (!expect || *size == expect)) {
        int rc = same_version(c, p, f, fd, !bg, why, why_len);
        if (rc) {
            close(fd);
            unlock_name(c->dfd, nm.lock, lk);
            return rc;
        }
        if (!bg) {
            atomic_fetch_add(&c->n->wait_ns, stoke__now_ns() - t0);
            atomic_fetch_add(&c->n->hits, 1);
        }
        unlock_name(c->dfd, nm.lock, lk);
        *out = fd;
        return STOKE_OK;
    }
    if (fd >= 0) { /* a copy of another size than the index was made from: replaced */
        stoke__log(STOKE_LOG_WARN,
                   "cache %s: %s is %" PRIu64 " bytes, %" PRIu64 " expected: downloading %s again",
                   c->dir, nm.data, *size, expect, f->url);
        close(fd);
        unlinkat(c->dfd, nm.data, 0);
    }
    int rc = download(c, p, slot, f, &nm, expect, out, size, why, why_len);
    unlock_name(c->dfd, nm.lock, lk);
    return rc;
}

int stoke__cache_has(stoke__cache *c, const stoke__remote_file *f)
{
    stoke__cache_names nm;
    stoke__cache_names_of(f, &nm);
    uint64_t size;
    int fd = open_copy(c, &nm, 0, &size);
    if (fd < 0)
        return 0;
    close(fd);
    note_size(c, size);
    return 1;
}

int stoke__cache_read(stoke__cache *c, stoke__remote_pool *p, int slot, const stoke__remote_file *f,
                      uint64_t expect, void *buf, size_t n, uint64_t off, size_t *got,
                      uint64_t *size, char *why, size_t why_len)
{
    stoke__cache_held *h = &c->h[(unsigned)slot % STOKE__CACHE_SLOTS];
    *got = 0;
    pthread_mutex_lock(&h->lock);
    int rc = STOKE_OK;
    if (h->f != f || h->fd < 0) {
        if (h->fd >= 0) /* the copy read before: no longer in use by this slot */
            close(h->fd);
        h->fd = -1;
        h->f = NULL;
        int fd;
        uint64_t sz;
        rc = stoke__cache_acquire(c, p, slot, f, expect, &fd, &sz, why, why_len);
        if (!rc) {
            h->f = f;
            h->fd = fd;
            h->size = sz;
        }
    }
    size_t done = 0;
    while (!rc && done < n && off + done < h->size) {
        ssize_t r = pread(h->fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            stoke__fmt(why, why_len, "cache %s: reading the copy of %s: %s", c->dir, f->url,
                       strerror(errno));
            rc = STOKE_EIO;
        }
        if (r <= 0)
            break;
        done += (size_t)r;
    }
    if (!rc && size)
        *size = h->size;
    pthread_mutex_unlock(&h->lock);
    *got = done;
    return rc;
}

int stoke__cache_forget(stoke__cache *c, const stoke__remote_file *f)
{
    for (int i = 0; i < STOKE__CACHE_SLOTS; i++) { /* no slot reads the copy any more */
        stoke__cache_held *h = &c->h[i];
        pthread_mutex_lock(&h->lock);
        if (h->f == f && h->fd >= 0) {
            close(h->fd);
            h->fd = -1;
            h->f = NULL;
        }
        pthread_mutex_unlock(&h->lock);
    }
    stoke__cache_names nm;
    stoke__cache_names_of(f, &nm);
    int lk, e = lock_name(c->dfd, nm.lock, 0, &lk); /* (not beside its download's rename) */
    if (e)
        return e;
    e = unlinkat(c->dfd, nm.data, 0) != 0 && errno != ENOENT ? -errno : 0;
    unlock_name(c->dfd, nm.lock, lk);
    return e;
}

/* ---- the object --------------------------------------------------------------------------- */

/* mkdir -p */
static int make_dirs(const char *dir)
{
    char *p = strdup(dir);
    if (!p)
        return -ENOMEM;
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = 0;
        if (mkdir(p, 0777) != 0 && errno != EEXIST) {
            int e = errno;
            free(p);
            return -e;
        }
        *s = '/';
    }
    int e = mkdir(p, 0700) != 0 && errno != EEXIST ? -errno : 0; /* (private_dir) */
    free(p);
    return e;
}

/* 0 when the directory fd is the caller's own and no one else may write in it, else the error
 * in why.  Anyone who can put a file in it could have this process read it as a shard (a
 * forged copy), write the shard's bytes through a link, or hold its locks. */
static int private_dir(int dfd, const char *dir, char *why, size_t why_len)
{
    struct stat st;
    if (fstat(dfd, &st) != 0) {
        stoke__fmt(why, why_len, "STOKE_CACHE_DIR=%s: %s", dir, strerror(errno));
        return STOKE_EIO;
    }
    if (st.st_uid != geteuid()) {
        stoke__fmt(why, why_len,
                   "STOKE_CACHE_DIR=%s is owned by uid %u, not by this process's (%u): a cache "
                   "directory must be your own (another user could put files in it that would be "
                   "read as shards)",
                   dir, (unsigned)st.st_uid, (unsigned)geteuid());
        return STOKE_EIO;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        stoke__fmt(why, why_len,
                   "STOKE_CACHE_DIR=%s is writable by %s (mode %04o): a cache directory must be "
                   "writable by its owner only (another user could put files in it that would "
                   "be read as shards): chmod go-w it, or use another",
                   dir, st.st_mode & S_IWOTH ? "others" : "its group",
                   (unsigned)(st.st_mode & 07777));
        return STOKE_EIO;
    }
    return 0;
}

/* STOKE_CACHE_LIMIT, else 0 with *dflt = 1 (the default cap: default_cap). */
static uint64_t cache_limit(int *dflt)
{
    uint64_t v = 0;
    int set = stoke__env_size(STOKE_ENV_CACHE_LIMIT, &v);
    *dflt = !set || v == 0;
    return *dflt ? 0 : v;
}

int stoke__cache_create(stoke__cache **out, char *why, size_t why_len)
{
    *out = NULL;
    const char *dir = stoke__env_str(STOKE_ENV_CACHE_DIR);
    if (!dir)
        return STOKE_OK;
    int e = make_dirs(dir);
    stoke__cache *c = e ? NULL : calloc(1, sizeof(*c));
    if (!c) {
        stoke__fmt(why, why_len, "STOKE_CACHE_DIR=%s: %s", dir, e ? strerror(-e) : "out of memory");
        return e == -ENOMEM || !e ? STOKE_ENOMEM : STOKE_EIO;
    }
    c->dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    int oerr = errno;
    c->dir = strdup(dir);
    c->n = mmap(NULL, sizeof(*c->n), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    int priv = c->dfd >= 0 ? private_dir(c->dfd, dir, why, why_len) : 0;
    if (c->dfd < 0 || priv || !c->dir || c->n == MAP_FAILED) {
        if (!priv)
            stoke__fmt(why, why_len, "STOKE_CACHE_DIR=%s: %s", dir,
                       c->dfd < 0 ? strerror(oerr) : "out of memory");
        if (c->n == MAP_FAILED)
            c->n = NULL;
        e = c->dfd < 0 || priv ? STOKE_EIO : STOKE_ENOMEM;
        for (int i = 0; i < STOKE__CACHE_SLOTS; i++) /* destroy's view of the slots */
            c->h[i].fd = -1, pthread_mutex_init(&c->h[i].lock, NULL);
        stoke__cache_destroy(c);
        return e;
    }
    int dflt;
    c->limit = cache_limit(&dflt);
    uint64_t conn = STOKE__REMOTE_CONNECTIONS_DEFAULT;
    if (stoke__env_u64(STOKE_ENV_REMOTE_CONNECTIONS, &conn) && conn > STOKE__REMOTE_BG_MAX)
        conn = STOKE__REMOTE_BG_MAX; /* (the pool, made with the source, said so) */
    c->connections = (int)conn;
    stoke__cache_ahead_init(c);
    for (int i = 0; i < STOKE__CACHE_SLOTS; i++) {
        pthread_mutex_init(&c->h[i].lock, NULL);
        c->h[i].fd = -1;
    }
    stoke__log(STOKE_LOG_DEBUG, "cache %s: limit %s%" PRIu64 " bytes", dir,
               dflt ? "(a tenth of the file system kept free) " : "", c->limit);
    *out = c;
    return STOKE_OK;
}

void stoke__cache_destroy(stoke__cache *c)
{
    if (!c)
        return;
    stoke__cache_stats st;
    stoke__cache_stats_get(c, &st);
    if (st.hits || st.misses)
        stoke__log(STOKE_LOG_DEBUG,
                   "cache %s: %" PRIu64 " hit(s), %" PRIu64 " download(s) of %" PRIu64
                   " bytes, %" PRIu64 " eviction(s)",
                   c->dir, st.hits, st.misses, st.bytes, st.evictions);
    stoke__cache_ahead_destroy(c);
    for (int i = 0; i < STOKE__CACHE_SLOTS; i++) {
        if (c->h[i].fd >= 0)
            close(c->h[i].fd);
        pthread_mutex_destroy(&c->h[i].lock);
    }
    if (c->dfd >= 0)
        close(c->dfd);
    if (c->n)
        munmap(c->n, sizeof(*c->n));
    free(c->dir);
    free(c);
}

void stoke__cache_fork_prepare(stoke__cache *c)
{
    for (int i = 0; c && i < STOKE__CACHE_SLOTS; i++)
        pthread_mutex_lock(&c->h[i].lock);
    if (c) /* after the slots: no download half done in the child */
        stoke__cache_ahead_fork_prepare(c);
}

void stoke__cache_fork_parent(stoke__cache *c)
{
    if (c)
        stoke__cache_ahead_fork_parent(c);
    for (int i = 0; c && i < STOKE__CACHE_SLOTS; i++)
        pthread_mutex_unlock(&c->h[i].lock);
}

void stoke__cache_fork_child(stoke__cache *c)
{
    if (c)
        stoke__cache_ahead_fork_child(c);
    for (int i = 0; c && i < STOKE__CACHE_SLOTS; i++) {
        if (c->h[i].fd >= 0) /* the parent's stays open and locked in the parent */
            close(c->h[i].fd);
        c->h[i].fd = -1;
        c->h[i].f = NULL;
        pthread_mutex_unlock(&c->h[i].lock);
    }
}

void stoke__cache_stats_get(const stoke__cache *c, stoke__cache_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!c || !c->n)
        return;
    out->hits = atomic_load(&c->n->hits);
    out->misses = atomic_load(&c->n->misses);
    out->evictions = atomic_load(&c->n->evictions);
    out->bytes = atomic_load(&c->n->bytes);
    out->wait_ns = atomic_load(&c->n->wait_ns);
}

/* ---- listing and clearing a directory (stoke cache ls / clear) ---------------------------- */

/* The directory `dir` (NULL: STOKE_CACHE_DIR) opened: its fd, or the error, recorded. */
static int open_dir(const char *fn, const char **dir)
{
    if (!*dir)
        *dir = stoke__env_str(STOKE_ENV_CACHE_DIR);
    if (!*dir)
        return stoke__fail(STOKE_EINVAL,
                           "%s: no cache directory given, and STOKE_CACHE_DIR is not set", fn);
    int dfd = open(*dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        return stoke__fail(e == ENOENT ? STOKE_ENOENT : STOKE_EIO, "cache %s: %s", *dir,
                           strerror(e));
    }
    return dfd;
}

int stoke_cache_list(const char *dir, int (*fn)(void *ctx, const stoke_cache_entry *e), void *ctx,
                     stoke_cache_info *info)
{
    if (info && info->size == 0)
        return stoke__fail(STOKE_EINVAL, "stoke_cache_list: info->size is 0");
    int dfd = open_dir("stoke_cache_list", &dir);
    if (dfd < 0)
        return dfd;
    listing l = {0};
    int e = scan(dfd, &l, SCAN_LOOK), rc = STOKE_OK;
    if (e)
        rc =
            stoke__fail(e == -ENOMEM ? STOKE_ENOMEM : STOKE_EIO, "cache %s: %s", dir, strerror(-e));
    if (l.n)
        qsort(l.e, l.n, sizeof(*l.e), by_atime);
    for (size_t i = 0; !rc && fn && i < l.n; i++) {
        int fd = openat(dfd, l.e[i].name, O_RDONLY | O_CLOEXEC | FILE_FLAGS);
        int busy = fd >= 0 && flock_retry(fd, LOCK_EX | LOCK_NB) != 0;
        if (fd >= 0)
            close(fd);
        stoke_cache_entry ce = {l.e[i].name, l.e[i].size, l.e[i].atime_ns / 1000000000, busy};
        rc = fn(ctx, &ce);
    }
    if (info && !e) {
        int dflt;
        stoke_cache_info in = {
            .entries = l.n, .bytes = l.total, .partial_bytes = l.partial, .stale_bytes = l.stale};
        in.limit = cache_limit(&dflt);
        in.limit_default = (uint32_t)dflt;
        if (dflt)
            in.limit = default_cap(dfd, l.total + l.partial + l.stale);
        stoke__strlcpy(in.dir, dir, sizeof(in.dir));
        uint32_t keep = info->size;
        memcpy(info, &in, keep < sizeof(in) ? keep : sizeof(in));
        info->size = keep;
    }
    free(l.e);
    close(dfd);
    return rc;
}

int stoke_cache_clear(const char *dir, uint64_t *removed, uint64_t *kept)
{
    int dfd = open_dir("stoke_cache_clear", &dir);
    if (dfd < 0)
        return dfd;
    int g = dir_lock(dfd);
    listing l = {0};
    int e = g < 0 ? g : scan(dfd, &l, 1), rc = STOKE_OK;
    if (e)
        rc =
            stoke__fail(e == -ENOMEM ? STOKE_ENOMEM : STOKE_EIO, "cache %s: %s", dir, strerror(-e));
    uint64_t gone = 0;
    for (size_t i = 0; !rc && i < l.n; i++)
        gone += (uint64_t)evict(dfd, l.e[i].name);
    int fd = rc ? -1 : openat(dfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
    if (fd >= 0 && !d)
        close(fd);
    for (struct dirent *de; d && (de = readdir(d)) != NULL;) /* locks left by killed runs */
        if (stoke__cache_kind_of(de->d_name) == K_LOCK)
            drop_lock_file(dfd, de->d_name);
    if (d)
        closedir(d);
    if (removed)
        *removed = gone;
    if (kept)
        *kept = l.n - gone;
    free(l.e);
    if (g >= 0)
        close(g);
    close(dfd);
    return rc;
}
