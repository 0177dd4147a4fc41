/* The node-wide arena's shared header: its robust process-shared lock, first-fit allocation of
 * runs of chunks owned by slots, reclaiming the chunks of processes that are gone, and stats.
 * The layout and the liveness rule are described in arena_internal.h.
 *
 * Locking: h->lock (robust, PTHREAD_PROCESS_SHARED) guards the header's counters, procs[] and
 * the owner/run arrays, in every process.  A process that dies holding it leaves it to the
 * next locker with EOWNERDEAD: that locker reclaims every slot that is gone (the dead holder's
 * half-done update included, since every chunk it marked is owned by its slot) and marks the
 * lock consistent.  Waits for it are bounded (AR_LOCK_S). */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"

static uint64_t page_bytes(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (uint64_t)p : 4096;
}

static uint64_t round_up(uint64_t v, uint64_t a)
{
    return (v + a - 1) / a * a;
}

#define AR_MAX_CHUNKS (1u << 16) /* the chunk size grows with the arena to stay under this */

int stoke__arena_layout(uint64_t requested, uint64_t *chunk, uint64_t *nchunks, uint64_t *data_off,
                        uint64_t *map_len)
{
    if (requested > (1ull << 46))
        return stoke__fail(STOKE_ENOMEM,
                           "arena: %llu bytes is more than the largest arena (64 TiB)",
                           (unsigned long long)requested);
    uint64_t c = page_bytes();
    while (requested / c > AR_MAX_CHUNKS)
        c *= 2;
    uint64_t n = round_up(requested ? requested : 1, c) / c;
    uint64_t meta = sizeof(ar_hdr) + n * sizeof(uint8_t);
    meta = round_up(meta, sizeof(uint32_t)) + n * sizeof(uint32_t);
    *chunk = c;
    *nchunks = n;
    *data_off = round_up(meta, page_bytes());
    *map_len = *data_off + n * c;
    return STOKE_OK;
}

/* Points a->owner, a->run, a->data into the mapping for this layout, and keeps the layout. */
static void set_views(stoke_arena *a, uint64_t chunk, uint64_t nchunks, uint64_t data_off)
{
    a->chunk = chunk;
    a->nchunks = nchunks;
    a->owner = (uint8_t *)(a->h + 1);
    a->run = (uint32_t *)(a->base + round_up(sizeof(ar_hdr) + nchunks, sizeof(uint32_t)));
    a->data = a->base + data_off;
}

int stoke__arena_check_header(stoke_arena *a, int pid)
{
    /* The mapping holds at least a page (the caller checked), so the header's fields can be
     * read; every one that places something in the mapping must be what the layout of the
     * requested size gives, which also bounds them by the memfd's size. */
    const ar_hdr *h = a->h;
    const char *bad = NULL;
    uint64_t chunk = 0, nchunks = 0, data_off = 0, map_len = 0;
    if (h->magic != AR_MAGIC)
        bad = "its magic number is wrong";
    else if (h->version != AR_VERSION || h->maxp != AR_MAXP)
        bad = "its layout version or process table is not this library's";
    else if (stoke__arena_layout(h->requested, &chunk, &nchunks, &data_off, &map_len) != STOKE_OK)
        bad = "its size is beyond the largest arena";
    else if (h->chunk != chunk || h->nchunks != nchunks || h->data_off != data_off)
        bad = "its chunk size, chunk count or data offset do not match its size";
    else if (h->map_len != map_len || map_len != a->map_len)
        bad = "its length is not the size of the shared memory";
    if (!bad) {
        /* the layout computed here, not the shared header read again: it may change meanwhile */
        set_views(a, chunk, nchunks, data_off);
        return STOKE_OK;
    }
    stoke__clear_error(); /* stoke__arena_layout's message is not the story */
    return stoke__fail(STOKE_EINVAL,
                       "stoke_arena_open: arena '%s': process %d sent a header that is not a "
                       "valid stoke arena: %s (%llu requested bytes, chunk %llu x %llu, data at "
                       "%llu, %llu bytes recorded, %zu shared); refused",
                       a->name, pid, bad, (unsigned long long)h->requested,
                       (unsigned long long)h->chunk, (unsigned long long)h->nchunks,
                       (unsigned long long)h->data_off, (unsigned long long)h->map_len, a->map_len);
}

int stoke__arena_init_header(stoke_arena *a, uint64_t requested, uint64_t chunk, uint64_t nchunks,
                             uint64_t data_off)
{
    ar_hdr *h = a->h;
    /* The memfd is fresh: every byte is zero already (owner/run arrays included). */
    h->version = AR_VERSION;
    h->maxp = AR_MAXP;
    h->requested = requested;
    h->chunk = chunk;
    h->nchunks = nchunks;
    h->data_off = data_off;
    h->map_len = a->map_len;
    h->creator_pid = (int32_t)getpid();
    stoke__strlcpy(h->name, a->name, sizeof(h->name));
    pthread_mutexattr_t at;
    int e = pthread_mutexattr_init(&at);
    if (!e)
        e = pthread_mutexattr_setpshared(&at, PTHREAD_PROCESS_SHARED);
    if (!e)
        e = pthread_mutexattr_setrobust(&at, PTHREAD_MUTEX_ROBUST);
    if (!e)
        e = pthread_mutex_init(&h->lock, &at);
    pthread_mutexattr_destroy(&at);
    if (e)
        return stoke__fail(STOKE_EIO, "arena '%s': cannot make its process-shared lock: %s",
                           a->name, strerror(e));
    set_views(a, chunk, nchunks, data_off);
    h->magic = AR_MAGIC;
    return STOKE_OK;
}

/* ---- writers ---------------------------------------------------------------------------- */

/* This process's pid namespace (the inode of /proc/self/ns/pid), 0 when unknown. */
static uint64_t pid_ns(void)
{
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* Process pid's start time (field 22 of /proc/PID/stat, clock ticks since boot), 0 when there
 * is no such process or it is a zombie (its memory is gone: it writes nothing any more). */
static uint64_t start_time(pid_t pid)
{
    char path[64], buf[1024];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')'); /* the command name may hold spaces and parentheses */
    if (!p || p[1] != ' ' || !p[2])
        return 0;
    char state = p[2];
    if (state == 'Z' || state == 'X' || state == 'x')
        return 0;
    p += 2; /* field 3 */
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p)
            return 0;
        p++;
    }
    return strtoull(p, NULL, 10);
}

/* Lock held: 1 (with *pid) when a recorded writer of slot k lives, as far as this process can
 * tell (a writer of another pid namespace cannot be checked: it counts as gone). */
static int writer_lives(const ar_hdr *h, int k, int32_t *pid)
{
    uint64_t ns = 0;
    for (int i = 0; i < AR_WRITERS; i++) {
        const ar_writer *w = &h->procs[k].writers[i];
        if (w->pid <= 0)
            continue;
        if (!ns)
            ns = pid_ns();
        if (ns && w->pidns == ns && w->start && start_time(w->pid) == w->start) {
            *pid = w->pid;
            return 1;
        }
    }
    return 0;
}

/* Frees every chunk owned by `slot` (lock held); returns how many. */
static uint64_t free_slot_chunks(stoke_arena *a, int slot)
{
    ar_hdr *h = a->h;
    uint64_t n = 0;
    for (uint64_t i = 0; i < a->nchunks; i++) {
        if (a->owner[i] == (uint8_t)(slot + 1)) {
            a->owner[i] = 0;
            a->run[i] = 0;
            n++;
        }
    }
    h->used -= n <= h->used ? n : h->used;
    h->procs[slot].chunks = 0;
    return n;
}

/* Lock held: reclaims the chunks of every recorded slot whose name nobody holds (the process
 * exited, was killed, or exec'd).  Our probe holds the name while reclaiming, so no newcomer
 * can take the slot meanwhile.  With `ask_holders` (an allocation found no room), a slot whose
 * name a process of another uid holds is gone too: its process of this uid let go of the name
 * and a squatter took it (no newcomer of this uid can bind it either). */
static void reclaim_gone(stoke_arena *a, int ask_holders)
{
    ar_hdr *h = a->h;
    for (int k = 0; k < AR_MAXP; k++) {
        if (k == a->slot || (h->procs[k].pid == 0 && h->procs[k].chunks == 0))
            continue;
        unsigned uid = 0;
        int probe = stoke__arena_bind(a->name, k);
        if (probe < 0 && !(ask_holders && stoke__arena_slot_foreign(a->name, k, &uid)))
            continue; /* someone of this uid holds slot k: alive */
        int32_t pid = h->procs[k].pid, wpid = 0;
        if (writer_lives(h, k, &wpid)) {
            /* its process is gone, but not one that may still be writing its chunks */
            if (probe >= 0)
                close(probe);
            stoke__log(STOKE_LOG_DEBUG,
                       "arena '%s': process %d (slot %d) is gone, but process %d, which may "
                       "write its chunks, lives: not reclaimed yet",
                       a->name, (int)pid, k, (int)wpid);
            continue;
        }
        uint64_t n = free_slot_chunks(a, k);
        h->procs[k].pid = 0;
        memset(h->procs[k].writers, 0, sizeof(h->procs[k].writers));
        h->reclaims++;
        h->reclaimed_chunks += n;
        if (probe >= 0) {
            close(probe);
            stoke__log(STOKE_LOG_INFO,
                       "arena '%s': process %d (slot %d) is gone; %llu bytes of its allocations "
                       "returned to the arena",
                       a->name, (int)pid, k, (unsigned long long)(n * a->chunk));
        } else {
            stoke__log(STOKE_LOG_WARN,
                       "arena '%s': process %d (slot %d) is gone and uid %u, another user, now "
                       "holds its slot name; %llu bytes of its allocations returned to the arena",
                       a->name, (int)pid, k, uid, (unsigned long long)(n * a->chunk));
        }
    }
}

static int lock_hdr(stoke_arena *a, const char *what)
{
    ar_hdr *h = a->h;
    /* trylock first: the common case, and the one that finds a lock left by a dead process
     * (ThreadSanitizer models EOWNERDEAD from trylock and lock, not from timedlock) */
    int e = pthread_mutex_trylock(&h->lock);
    if (e == EBUSY) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += AR_LOCK_S;
        e = pthread_mutex_timedlock(&h->lock, &ts);
    }
    if (e == EOWNERDEAD) {
        int32_t dead = h->lock_pid;
        stoke__log(STOKE_LOG_WARN,
                   "arena '%s': process %d died holding the arena's lock; reclaiming the "
                   "allocations of processes that are gone",
                   a->name, (int)dead);
        h->lock_pid = (int32_t)getpid();
        reclaim_gone(a, 0);
        pthread_mutex_consistent(&h->lock);
        e = 0;
    }
    if (e == ETIMEDOUT)
        return stoke__fail(STOKE_ETIMEDOUT,
                           "%s: arena '%s': its lock has been held for more than %d s (by "
                           "process %d)",
                           what, a->name, AR_LOCK_S, (int)h->lock_pid);
    if (e)
        return stoke__fail(STOKE_EIO, "%s: arena '%s': cannot take its lock: %s", what, a->name,
                           strerror(e));
    h->lock_pid = (int32_t)getpid();
    return STOKE_OK;
}

static void unlock_hdr(stoke_arena *a)
{
    a->h->lock_pid = 0;
    pthread_mutex_unlock(&a->h->lock);
}

int stoke__arena_test_hold_lock(stoke_arena *a)
{
    return lock_hdr(a, "test");
}

int stoke__arena_claim(stoke_arena *a)
{
    int rc = lock_hdr(a, "stoke_arena_open");
    if (rc != STOKE_OK)
        return rc;
    ar_hdr *h = a->h;
    ar_proc *p = &h->procs[a->slot];
    int32_t wpid = 0;
    if (writer_lives(h, a->slot, &wpid)) {
        stoke__log(STOKE_LOG_DEBUG,
                   "arena '%s': slot %d: its process %d is gone, but process %d, which may "
                   "write its chunks, lives: taking another slot",
                   a->name, a->slot, (int)p->pid, (int)wpid);
        unlock_hdr(a);
        return 1;
    }
    if (p->pid != 0 || p->chunks != 0) {
        /* We hold the slot's name, so its previous holder is gone. */
        uint64_t n = free_slot_chunks(a, a->slot);
        h->reclaims++;
        h->reclaimed_chunks += n;
        stoke__log(STOKE_LOG_INFO,
                   "arena '%s': slot %d of process %d (gone) reused; %llu bytes of its "
                   "allocations returned",
                   a->name, a->slot, (int)p->pid, (unsigned long long)(n * a->chunk));
    }
    p->pid = (int32_t)getpid();
    p->chunks = 0;
    memset(p->writers, 0, sizeof(p->writers));
    unlock_hdr(a);
    return STOKE_OK;
}

static int usable(stoke_arena *a, const char *what);

int stoke__arena_add_writer(stoke_arena *a, pid_t pid)
{
    const char *what = "arena: recording a writer";
    int rc = usable(a, what);
    if (rc != STOKE_OK)
        return rc;
    if (pid <= 0)
        return stoke__fail(STOKE_EINVAL, "%s: arena '%s': pid %d", what, a->name, (int)pid);
    uint64_t start = start_time(pid), ns = pid_ns();
    if (!start)
        return STOKE_OK; /* gone already (or a zombie): it writes nothing any more */
    if (!ns)
        return stoke__fail(STOKE_EINVAL,
                           "%s: arena '%s': no /proc/self/ns/pid: process %d cannot be recorded",
                           what, a->name, (int)pid);
    if ((rc = lock_hdr(a, what)) != STOKE_OK)
        return rc;
    ar_proc *p = &a->h->procs[a->slot];
    ar_writer *free_w = NULL;
    for (int i = 0; i < AR_WRITERS; i++) {
        ar_writer *w = &p->writers[i];
        int live = w->pid > 0 && w->pidns == ns && w->start && start_time(w->pid) == w->start;
        if (live && w->pid == pid) {
            free_w = w; /* already recorded */
            break;
        }
        if (!live && !free_w)
            free_w = w;
    }
    if (free_w)
        *free_w = (ar_writer){.pid = (int32_t)pid, .start = start, .pidns = ns};
    unlock_hdr(a);
    if (!free_w)
        return stoke__fail(STOKE_ELIMIT, "%s: arena '%s': %d live writers recorded already", what,
                           a->name, AR_WRITERS);
    return STOKE_OK;
}

void stoke__arena_release(stoke_arena *a)
{
    if (lock_hdr(a, "stoke_arena_close") != STOKE_OK) {
        stoke__log(STOKE_LOG_WARN, "%s; this process's allocations return when it exits",
                   stoke_last_error());
        return;
    }
    /* this process's writers are its own business now: it closes the arena after its loaders
     * ended their process workers */
    free_slot_chunks(a, a->slot);
    a->h->procs[a->slot].pid = 0;
    memset(a->h->procs[a->slot].writers, 0, sizeof(a->h->procs[a->slot].writers));
    unlock_hdr(a);
}

static int usable(stoke_arena *a, const char *what)
{
    if (!a)
        return stoke__fail(STOKE_EINVAL, "%s: arena is NULL", what);
    if (a->pid != getpid())
        return stoke__fail(STOKE_EINVAL,
                           "%s: arena '%s' was opened by process %d; a forked child (%d) keeps "
                           "its memory but must open the arena itself to allocate",
                           what, a->name, (int)a->pid, (int)getpid());
    return STOKE_OK;
}

/* First run of n free chunks, or UINT64_MAX (lock held). */
static uint64_t find_run(const stoke_arena *a, uint64_t n)
{
    uint64_t len = 0;
    for (uint64_t i = 0; i < a->nchunks; i++) {
        len = a->owner[i] ? 0 : len + 1;
        if (len == n)
            return i + 1 - n;
    }
    return UINT64_MAX;
}

static int procs_attached(const ar_hdr *h)
{
    int n = 0;
    for (int k = 0; k < AR_MAXP; k++)
        n += h->procs[k].pid != 0;
    return n;
}

int stoke_arena_alloc(stoke_arena *a, size_t size, void **out)
{
    const char *what = "stoke_arena_alloc";
    if (out)
        *out = NULL;
    int rc = usable(a, what);
    if (rc == STOKE_OK && !out)
        rc = stoke__fail(STOKE_EINVAL, "%s: out is NULL", what);
    if (rc != STOKE_OK)
        return rc;
    ar_hdr *h = a->h;
    uint64_t n = size ? ((uint64_t)size + a->chunk - 1) / a->chunk : 1;
    if (n > a->nchunks)
        return stoke__fail(STOKE_ENOMEM, "%s: %zu bytes asked, but arena '%s' has %llu", what, size,
                           a->name, (unsigned long long)(a->nchunks * a->chunk));
    if ((rc = lock_hdr(a, what)) != STOKE_OK)
        return rc;
    uint64_t i = find_run(a, n);
    if (i == UINT64_MAX) {
        reclaim_gone(a, 1);
        i = find_run(a, n);
    }
    if (i == UINT64_MAX) {
        uint64_t used = h->used * a->chunk, total = a->nchunks * a->chunk;
        int procs = procs_attached(h);
        unlock_hdr(a);
        return stoke__fail(STOKE_ENOMEM,
                           "%s: arena '%s' has no %llu free bytes in one piece (%llu of %llu "
                           "bytes used, by %d process%s)",
                           what, a->name, (unsigned long long)(n * a->chunk),
                           (unsigned long long)used, (unsigned long long)total, procs,
                           procs == 1 ? "" : "es");
    }
    /* The run first: a crash between the two leaves chunks owned by this slot, which reclaim
     * frees; never an owned chunk without its run. */
    a->run[i] = (uint32_t)n;
    for (uint64_t k = i; k < i + n; k++)
        a->owner[k] = (uint8_t)(a->slot + 1);
    h->used += n;
    h->procs[a->slot].chunks += n;
    h->allocs++;
    unlock_hdr(a);
    *out = a->data + i * a->chunk;
    return STOKE_OK;
}

int stoke_arena_free(stoke_arena *a, void *ptr)
{
    const char *what = "stoke_arena_free";
    if (!ptr)
        return STOKE_OK;
    int rc = usable(a, what);
    if (rc != STOKE_OK)
        return rc;
    ar_hdr *h = a->h;
    unsigned char *p = ptr;
    uint64_t off = (uint64_t)(p - a->data);
    if (p < a->data || off >= a->nchunks * a->chunk || off % a->chunk)
        return stoke__fail(STOKE_EINVAL, "%s: %p is not the start of an allocation of arena '%s'",
                           what, ptr, a->name);
    if ((rc = lock_hdr(a, what)) != STOKE_OK)
        return rc;
    uint64_t i = off / a->chunk, n = a->run[i];
    if (n > a->nchunks - i) {
        unlock_hdr(a);
        return stoke__fail(STOKE_EIO,
                           "%s: arena '%s': the allocation at %p says it has %llu chunks, past "
                           "the end of the arena (its shared tables were overwritten)",
                           what, a->name, ptr, (unsigned long long)n);
    }
    if (a->owner[i] != (uint8_t)(a->slot + 1) || n == 0) {
        int owner = a->owner[i];
        unlock_hdr(a);
        if (owner)
            return stoke__fail(STOKE_EINVAL, "%s: %p in arena '%s' is %s", what, ptr, a->name,
                               owner == a->slot + 1 ? "inside an allocation, not its start"
                                                    : "allocated by another process");
        return stoke__fail(STOKE_EINVAL, "%s: %p in arena '%s' is not allocated (freed twice?)",
                           what, ptr, a->name);
    }
    for (uint64_t k = i; k < i + n; k++)
        a->owner[k] = 0;
    a->run[i] = 0;
    h->used -= n;
    h->procs[a->slot].chunks -= n;
    h->frees++;
    unlock_hdr(a);
    return STOKE_OK;
}

int stoke_arena_stats_get(stoke_arena *a, stoke_arena_stats *out)
{
    const char *what = "stoke_arena_stats_get";
    int rc = usable(a, what);
    if (rc == STOKE_OK && (!out || out->size < 2 * sizeof(uint32_t)))
        rc = stoke__fail(STOKE_EINVAL, "%s: %s", what, out ? "size too small" : "out is NULL");
    if (rc != STOKE_OK)
        return rc;
    if ((rc = lock_hdr(a, what)) != STOKE_OK)
        return rc;
    ar_hdr *h = a->h;
    reclaim_gone(a, 0);
    stoke_arena_stats s;
    memset(&s, 0, sizeof(s));
    s.version = STOKE_ARENA_STATS_VERSION;
    stoke__strlcpy(s.name, a->name, sizeof(s.name));
    s.bytes = a->nchunks * a->chunk;
    s.requested_bytes = h->requested;
    s.chunk_bytes = a->chunk;
    s.mapped_bytes = a->map_len;
    s.bytes_used = h->used * a->chunk;
    s.bytes_used_self = h->procs[a->slot].chunks * a->chunk;
    s.processes = (uint64_t)procs_attached(h);
    s.allocs = h->allocs;
    s.frees = h->frees;
    s.reclaims = h->reclaims;
    s.reclaimed_bytes = h->reclaimed_chunks * a->chunk;
    s.creator_pid = h->creator_pid;
    unlock_hdr(a);
    s.pinned = a->pinned;
    s.created = a->created;
    s.slot = a->slot;
    size_t n = out->size < sizeof(s) ? out->size : sizeof(s);
    s.size = (uint32_t)n;
    memcpy(out, &s, n);
    return STOKE_OK;
}

int stoke_arena_offset(const stoke_arena *a, const void *ptr, uint64_t *offset)
{
    if (!a || !ptr || !offset)
        return stoke__fail(STOKE_EINVAL, "stoke_arena_offset: NULL argument");
    uint64_t total = a->nchunks * a->chunk;
    const unsigned char *p = ptr;
    if (p < a->data || (uint64_t)(p - a->data) >= total)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_arena_offset: %p is outside arena '%s' (%llu bytes at %p)", ptr,
                           a->name, (unsigned long long)total, (void *)a->data);
    *offset = (uint64_t)(p - a->data);
    return STOKE_OK;
}

int stoke_arena_ptr(const stoke_arena *a, uint64_t offset, void **ptr)
{
    if (!a || !ptr)
        return stoke__fail(STOKE_EINVAL, "stoke_arena_ptr: NULL argument");
    uint64_t total = a->nchunks * a->chunk;
    if (offset >= total) {
        *ptr = NULL;
        return stoke__fail(STOKE_EINVAL,
                           "stoke_arena_ptr: offset %llu is outside arena '%s' (%llu bytes)",
                           (unsigned long long)offset, a->name, (unsigned long long)total);
    }
    *ptr = a->data + offset;
    return STOKE_OK;
}

int stoke__arena_allocation(stoke_arena *a, const void *ptr, size_t *len)
{
    const char *what = "stoke_ipc_export";
    const unsigned char *p = ptr;
    uint64_t off = (uint64_t)(p - a->data);
    if (p < a->data || off >= a->nchunks * a->chunk || off % a->chunk)
        return stoke__fail(STOKE_EINVAL, "%s: %p is not the start of an allocation of arena '%s'",
                           what, ptr, a->name);
    int rc = lock_hdr(a, what);
    if (rc != STOKE_OK)
        return rc;
    uint64_t i = off / a->chunk, n = a->run[i];
    int mine = a->owner[i] == (uint8_t)(a->slot + 1) && n > 0 && n <= a->nchunks - i;
    unlock_hdr(a);
    if (!mine)
        return stoke__fail(STOKE_EINVAL,
                           "%s: %p in arena '%s' is not the start of a live allocation of this "
                           "process",
                           what, ptr, a->name);
    *len = (size_t)(n * a->chunk);
    return STOKE_OK;
}
