/* Staged blocks for the npy source: under a block shuffle with queued or positioned reads
 * (io=uring, io=pread: what io=auto picks for a file that is not in the page cache), the
 * first batch that needs a block reads the whole block into one of a few private buffers
 * ("slots") with large preads, and every row of the block is then copied from there: one
 * large read per block instead of one read per row.  See docs/loader.md, "Block shuffle
 * reads".
 *
 * Slots: min(2 x window, blocks) buffers of one block of every file, from
 * stoke__resident_alloc (huge pages, faulted in at the hint, i.e. at stoke_loader_create), so
 * the batches of two windows can be in flight at once (the last ones of a window on one
 * worker, the first ones of the next on another).  Each slot has one 64-bit word:
 * block << 22 | state << 20 | references.  A reader takes a reference only on a READY slot
 * of its block (compare-and-swap), and a slot is taken for another block (under the lock, the
 * oldest first) only while nobody holds a reference, so a row is never read from a buffer
 * being overwritten.  `where[b]` remembers the slot of block b; the slot's word decides.
 *
 * A block found in the page cache is copied from there with pread; one that is not is read
 * with O_DIRECT when the dataset says so (direct=on, or auto and a file over half of RAM: the
 * files opened again through /proc/self/fd, reads widened to ALIGN, the block at skew[k]
 * inside the buffer), else through the page cache after the block read-ahead of npy_stage.c.
 *
 * Nothing here decides what a batch holds: a row whose block has no slot (every slot in use,
 * more than HELD_MAX blocks in one batch, a process worker: slots live in the process that
 * got the hint) or whose block could not be read whole (a file cut short: FAILED) is read by
 * the io mode's own path, with its usual errors. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/npy_internal.h"

enum { FREE = 0, LOADING = 1, READY = 2, FAILED = 3 };
#define REF_BITS   20
#define REF_MASK   (((uint64_t)1 << REF_BITS) - 1)
#define STATE(w)   ((int)(((w) >> REF_BITS) & 3))
#define BLOCK(w)   ((w) >> (REF_BITS + 2))
#define WORD(b, s) (((uint64_t)(b) << (REF_BITS + 2)) | ((uint64_t)(s) << REF_BITS))
/* Distinct blocks one batch takes from slots (a block-shuffled batch draws from a window). */
#define HELD_MAX 64
/* Bytes per pread of a block (large requests keep the disk streaming). */
#define LOAD_PIECE ((size_t)16 << 20)
/* O_DIRECT reads start and end on this boundary (the largest logical block size in use). */
#define ALIGN ((size_t)4096)

typedef struct slot {
    _Atomic uint64_t word;
    uint64_t seq; /* when it was last taken (under the lock): the oldest is taken first */
    unsigned char *data[2];
    size_t skew[2]; /* the block's first byte is at data[k] + skew[k] (O_DIRECT alignment) */
} slot;

struct stoke__npy_slots {
    /* Whether this process made the slots, without a system call per batch: a page the kernel
     * zeroes in a forked child (MADV_WIPEONFORK) holds 1; NULL where the kernel has no such
     * advice, and then getpid() is compared with pid. */
    volatile unsigned char *owner;
    pid_t pid;
    uint64_t block_rows, nblocks;
    size_t nslots;
    size_t bytes[2]; /* per slot and file: a block, rounded up to ALIGN, plus ALIGN */
    int dfd[2];      /* the files opened again with O_DIRECT, or -1 */
    atomic_int direct_ok;
    unsigned char *mem;
    size_t mem_len;
    pthread_mutex_t lock;
    uint64_t seq;
    _Atomic uint32_t *where; /* per block: slot + 1, 0 none */
    slot *slot;
    _Atomic uint64_t staged, direct, rows; /* blocks read whole (with O_DIRECT), rows served */
};

/* Bytes of one slot for file k: the block rounded up to ALIGN, and ALIGN for the skew. */
static size_t slot_bytes(const stoke__npy_file *f, uint64_t block_rows)
{
    if (!f->row_bytes)
        return 0;
    if (block_rows > (SIZE_MAX - 2 * ALIGN) / f->row_bytes)
        return SIZE_MAX;
    return ((size_t)block_rows * f->row_bytes + ALIGN - 1) / ALIGN * ALIGN + ALIGN;
}

size_t stoke__npy_slots_bytes(const stoke__npy_ds *ds, uint64_t block_rows, uint64_t nslots)
{
    size_t per = 0;
    for (int k = 0; k < ds->nfiles; k++) {
        size_t b = slot_bytes(&ds->f[k], block_rows);
        if (b == SIZE_MAX || per > SIZE_MAX - b)
            return SIZE_MAX;
        per += b;
    }
    return per && nslots > SIZE_MAX / per ? SIZE_MAX : per * (size_t)nslots;
}

/* f's file opened again with O_DIRECT (through /proc/self/fd: the same file even if its path
 * was replaced since), or -1 where the file system refuses it (tmpfs) or /proc is missing. */
static int open_direct(const stoke__npy_file *f)
{
    char path[64];
    stoke__fmt(path, sizeof(path), "/proc/self/fd/%d", f->fd);
    int fd = open(path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    struct stat a, b;
    if (fd >= 0 && (fstat(fd, &a) != 0 || fstat(f->fd, &b) != 0 || a.st_dev != b.st_dev ||
                    a.st_ino != b.st_ino)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

stoke__npy_slots *stoke__npy_slots_new(const stoke__npy_ds *ds, uint64_t block_rows,
                                       uint64_t nblocks, uint64_t nslots)
{
    size_t total = stoke__npy_slots_bytes(ds, block_rows, nslots);
    if (total == SIZE_MAX || nblocks > UINT32_MAX || nslots == 0 || nslots > UINT32_MAX - 1 ||
        nblocks >= ((uint64_t)1 << (64 - REF_BITS - 2)))
        return NULL;
    stoke__npy_slots *S = calloc(1, sizeof(*S));
    if (!S)
        return NULL;
    S->where = calloc((size_t)nblocks, sizeof(*S->where));
    S->slot = calloc((size_t)nslots, sizeof(*S->slot));
    S->mem = S->where && S->slot ? stoke__resident_alloc(total) : NULL;
    if (!S->mem) {
        free(S->where);
        free(S->slot);
        free(S);
        return NULL;
    }
    S->mem_len = total;
    S->pid = getpid();
    S->owner = NULL;
#ifdef MADV_WIPEONFORK
    long pg = sysconf(_SC_PAGESIZE);
    void *o = mmap(NULL, (size_t)pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (o != MAP_FAILED && madvise(o, (size_t)pg, MADV_WIPEONFORK) == 0) {
        S->owner = o;
        *S->owner = 1;
    } else if (o != MAP_FAILED) {
        munmap(o, (size_t)pg);
    }
#endif
    S->block_rows = block_rows;
    S->nblocks = nblocks;
    S->nslots = (size_t)nslots;
    pthread_mutex_init(&S->lock, NULL);
    unsigned char *p = S->mem;
    S->dfd[0] = S->dfd[1] = -1;
    for (int k = 0; k < ds->nfiles; k++) {
        S->bytes[k] = slot_bytes(&ds->f[k], block_rows);
        S->dfd[k] = ds->direct ? open_direct(&ds->f[k]) : -1;
    }
    atomic_init(&S->direct_ok, S->dfd[0] >= 0 && (ds->nfiles < 2 || S->dfd[1] >= 0));
    if (ds->direct && !atomic_load(&S->direct_ok))
        stoke__log(STOKE_LOG_INFO,
                   "npy %s: O_DIRECT is refused here: blocks are read through the page cache",
                   ds->f[0].path);
    for (size_t i = 0; i < S->nslots; i++)
        for (int k = 0; k < ds->nfiles; k++) {
            S->slot[i].data[k] = p;
            p += S->bytes[k];
        }
    return S;
}

void stoke__npy_slots_free(stoke__npy_slots *S)
{
    if (!S)
        return;
    stoke__resident_free(S->mem, S->mem_len);
    if (S->owner)
        munmap((void *)S->owner, (size_t)sysconf(_SC_PAGESIZE));
    for (int k = 0; k < 2; k++)
        if (S->dfd[k] >= 0)
            close(S->dfd[k]);
    pthread_mutex_destroy(&S->lock);
    free(S->where);
    free(S->slot);
    free(S);
}

void stoke__npy_slots_reset(stoke__npy_slots *S)
{
    /* set_epoch: no get runs.  A new epoch reads its blocks again (nothing from the last
     * epoch is served twice, and a block that failed is tried again). */
    for (size_t i = 0; i < S->nslots; i++)
        atomic_store_explicit(&S->slot[i].word, WORD(0, FREE), memory_order_relaxed);
    for (uint64_t b = 0; b < S->nblocks; b++)
        atomic_store_explicit(&S->where[b], 0, memory_order_relaxed);
}

void stoke__npy_slots_stats(const stoke__npy_slots *S, uint64_t *blocks, uint64_t *direct,
                            uint64_t *rows)
{
    *blocks += atomic_load(&S->staged);
    *direct += atomic_load(&S->direct);
    *rows += atomic_load(&S->rows);
}

/* A reference on block b's slot when it is READY: the slot's index, or -1 (none, LOADING by
 * another thread: *loading = 1, or FAILED). */
static long take_ref(stoke__npy_slots *S, uint64_t b, int *loading)
{
    uint32_t w1 = atomic_load_explicit(&S->where[b], memory_order_acquire);
    *loading = 0;
    if (!w1)
        return -1;
    slot *s = &S->slot[w1 - 1];
    uint64_t w = atomic_load_explicit(&s->word, memory_order_acquire);
    for (;;) {
        if (BLOCK(w) != b)
            return -1;
        if (STATE(w) == LOADING) {
            *loading = 1;
            return -1;
        }
        if (STATE(w) != READY || (w & REF_MASK) == REF_MASK)
            return -1;
        if (atomic_compare_exchange_weak_explicit(&s->word, &w, w + 1, memory_order_acquire,
                                                  memory_order_acquire))
            return (long)(w1 - 1);
    }
}

static void drop_ref(stoke__npy_slots *S, long i)
{
    atomic_fetch_sub_explicit(&S->slot[i].word, 1, memory_order_release);
}

/* Takes a slot for block b (LOADING, owned by the caller): a free one, else the one taken
 * longest ago that nobody reads.  -1 when b got a slot meanwhile or every slot is in use. */
static long claim(stoke__npy_slots *S, uint64_t b)
{
    pthread_mutex_lock(&S->lock);
    long got = -1;
    uint32_t w1 = atomic_load_explicit(&S->where[b], memory_order_relaxed);
    if (w1 && BLOCK(atomic_load(&S->slot[w1 - 1].word)) == b &&
        STATE(atomic_load(&S->slot[w1 - 1].word)) != FREE)
        goto out; /* another thread has it (or it failed in this epoch) */
    for (int tries = 0; tries < 4 && got < 0; tries++) {
        long best = -1;
        uint64_t best_seq = UINT64_MAX, best_w = 0;
        for (size_t i = 0; i < S->nslots; i++) {
            uint64_t w = atomic_load_explicit(&S->slot[i].word, memory_order_relaxed);
            if ((w & REF_MASK) || STATE(w) == LOADING)
                continue;
            uint64_t seq = STATE(w) == FREE ? 0 : S->slot[i].seq + 1;
            if (seq < best_seq)
                best = (long)i, best_seq = seq, best_w = w;
        }
        if (best < 0)
            break;
        /* fails when a reader took a reference since: look again */
        if (atomic_compare_exchange_strong_explicit(&S->slot[best].word, &best_w, WORD(b, LOADING),
                                                    memory_order_acquire, memory_order_relaxed)) {
            if (STATE(best_w) != FREE &&
                atomic_load_explicit(&S->where[BLOCK(best_w)], memory_order_relaxed) ==
                    (uint32_t)best + 1)
                atomic_store_explicit(&S->where[BLOCK(best_w)], 0, memory_order_relaxed);
            S->slot[best].seq = ++S->seq;
            atomic_store_explicit(&S->where[b], (uint32_t)best + 1, memory_order_release);
            got = best;
        }
    }
out:
    pthread_mutex_unlock(&S->lock);
    return got;
}

/* Reads len bytes at `at` of a file opened with O_DIRECT into buf + *skew, the read widened to
 * ALIGN on both ends.  0, -EINVAL when the file or device refuses the alignment, or -1 for
 * anything else (an error or a file that ends early: the rows' own reads say why). */
static int read_direct(int fd, unsigned char *buf, uint64_t at, size_t len, size_t *skew)
{
    uint64_t a0 = at / ALIGN * ALIGN;
    size_t sk = (size_t)(at - a0), want = sk + len, total = (want + ALIGN - 1) / ALIGN * ALIGN;
    size_t done = 0;
    while (done < total) {
        size_t n = total - done < LOAD_PIECE ? total - done : LOAD_PIECE;
        ssize_t r = pread(fd, buf + done, n, (off_t)(a0 + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return errno == EINVAL && done == 0 ? -EINVAL : -1;
        done += (size_t)r;
        if ((size_t)r < n) /* end of file: a short read ends it */
            break;
    }
    *skew = sk;
    return done >= want ? 0 : -1;
}

/* How a claimed block is read: from disk with O_DIRECT (not in the page cache), or through
 * the page cache (found there, or no O_DIRECT: then the kernel is asked to read it ahead
 * whole first, as without slots). */
enum { VIA_DIRECT = 1, VIA_CACHE = 2 };

static int load_mode(const stoke__npy_ds *ds, stoke__npy_slots *S, uint64_t b)
{
    const stoke__npy_file *f = &ds->f[0];
    uint64_t r0 = b * S->block_rows, nr = f->rows - r0;
    if (nr > S->block_rows)
        nr = S->block_rows;
    int res = stoke__npy_resident(f, f->h.data_offset + r0 * (uint64_t)f->row_bytes,
                                  nr * (uint64_t)f->row_bytes);
    int direct = !res && atomic_load_explicit(&S->direct_ok, memory_order_relaxed);
    stoke__npy_stage_claim(ds, b,
                           res      ? STOKE__NPY_STAGE_RESIDENT
                           : direct ? STOKE__NPY_STAGE_DIRECT
                                    : STOKE__NPY_STAGE_ADVISE);
    return direct ? VIA_DIRECT : VIA_CACHE;
}

/* Reads block b of every file into slot i (claimed by the caller); READY with one reference
 * for the caller, or FAILED (a short read or an error: the rows' own reads will say why). */
static int load(const stoke__npy_ds *ds, stoke__npy_slots *S, long i, uint64_t b, int via)
{
    slot *s = &S->slot[i];
    uint64_t r0 = b * S->block_rows, nr = ds->f[0].rows - r0;
    if (nr > S->block_rows)
        nr = S->block_rows;
    int ok = 1, direct = via == VIA_DIRECT;
    for (int k = 0; k < ds->nfiles && ok; k++) {
        const stoke__npy_file *f = &ds->f[k];
        size_t len = (size_t)nr * f->row_bytes, got = 0;
        uint64_t at = f->h.data_offset + r0 * (uint64_t)f->row_bytes;
        s->skew[k] = 0;
        if (!len)
            continue;
        if (via == VIA_DIRECT) {
            int e = read_direct(S->dfd[k], s->data[k], at, len, &s->skew[k]);
            if (e == 0)
                continue;
            if (e != -EINVAL) {
                ok = 0;
                break;
            }
            if (atomic_exchange(&S->direct_ok, 0))
                stoke__log(STOKE_LOG_INFO,
                           "npy %s: O_DIRECT reads refused (EINVAL): blocks are read through "
                           "the page cache",
                           f->path);
            s->skew[k] = 0; /* through the page cache from here on */
            direct = 0;
        }
        ok = stoke__pread_full(f->fd, s->data[k], len, at, &got) == 0 && got == len;
    }
    if (ok)
        atomic_fetch_add_explicit(&S->staged, 1, memory_order_relaxed);
    if (ok && direct)
        atomic_fetch_add_explicit(&S->direct, 1, memory_order_relaxed);
    atomic_store_explicit(&s->word, WORD(b, ok ? READY : FAILED) + (ok ? 1 : 0),
                          memory_order_release);
    return ok;
}

/* Waits (yielding, then sleeping 50 us at a time) while block b's slot is LOADING. */
static void wait_loaded(stoke__npy_slots *S, uint64_t b)
{
    for (int spins = 0;; spins++) {
        uint32_t w1 = atomic_load_explicit(&S->where[b], memory_order_acquire);
        if (!w1)
            return;
        uint64_t w = atomic_load_explicit(&S->slot[w1 - 1].word, memory_order_acquire);
        if (BLOCK(w) != b || STATE(w) != LOADING)
            return;
        if (spins < 16) {
            sched_yield();
        } else {
            struct timespec ts = {0, 50 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

typedef struct held {
    uint64_t block;
    long slot; /* -1: not served from a slot */
} held;

int stoke__npy_slots_serve(const stoke__npy_ds *ds, stoke__npy_slots *S, const uint64_t *idx,
                           size_t count, void *const dst[], stoke__npy_rest_fn rest, void *ctx)
{
    if (S->owner ? !*S->owner : getpid() != S->pid) { /* a forked child: slots not shared */
        stoke__npy_stage_batch(ds, idx, count);
        return rest(ctx, 0, count);
    }
    held h[HELD_MAX];
    size_t nh = 0;
    /* the batch's blocks: take what is ready, load what nobody has, then wait for the rest */
    for (size_t j = 0; j < count; j++) {
        uint64_t b = idx[j] / S->block_rows;
        size_t e = 0;
        while (e < nh && h[e].block != b)
            e++;
        if (e < nh || nh == HELD_MAX)
            continue;
        h[nh].block = b;
        h[nh].slot = -2;
        nh++;
    }
    /* 1: take the ready ones, claim the ones nobody has (asking the kernel for each block as
     * it is claimed, so two workers share the asking), and read the claimed ones whole; 2:
     * wait for those another thread is reading.  h[e].slot: -2 not yet, -3 claimed as slot
     * `mine`, -4 another thread reads it. */
    long mine[HELD_MAX];
    int via[HELD_MAX];
    for (size_t e = 0; e < nh; e++) {
        int loading;
        uint64_t b = h[e].block;
        long i = take_ref(S, b, &loading);
        if (i < 0 && !loading) {
            i = claim(S, b);
            if (i >= 0) {
                via[e] = load_mode(ds, S, b);
                mine[e] = i;
                h[e].slot = -3;
                continue;
            }
            i = take_ref(S, b, &loading); /* another thread took it meanwhile, or no slot */
            if (i < 0 && !loading)
                stoke__npy_stage_one(ds, b); /* its rows are read one by one: ahead first */
        }
        h[e].slot = i >= 0 ? i : loading ? -4 : -1;
    }
    for (size_t e = 0; e < nh; e++)
        if (h[e].slot == -3) {
            h[e].slot = load(ds, S, mine[e], h[e].block, via[e]) ? mine[e] : -1;
        }
    for (size_t e = 0; e < nh; e++)
        if (h[e].slot == -4) {
            int loading;
            wait_loaded(S, h[e].block);
            long i = take_ref(S, h[e].block, &loading);
            h[e].slot = i >= 0 ? i : -1;
        }
    /* copy the rows in slots; hand each stretch of the others to rest() */
    int rc = STOKE_OK;
    size_t from = count, served = 0, last = 0;
    for (size_t j = 0; j <= count && rc == STOKE_OK; j++) {
        long i = -1;
        uint64_t b = 0;
        if (j < count) {
            b = idx[j] / S->block_rows;
            if (last < nh && h[last].block == b) {
                i = h[last].slot;
            } else {
                for (size_t e = 0; e < nh; e++)
                    if (h[e].block == b) {
                        i = h[e].slot, last = e;
                        break;
                    }
            }
        }
        if (i < 0 && j < count) {
            if (from == count)
                from = j;
            continue;
        }
        if (from < count) {
            rc = rest(ctx, from, j - from);
            from = count;
        }
        if (j == count)
            break;
        uint64_t r = idx[j] - b * S->block_rows;
        for (int k = 0; k < ds->nfiles; k++) {
            size_t rb = ds->f[k].row_bytes;
            if (dst[k] && rb)
                memcpy((unsigned char *)dst[k] + j * rb,
                       S->slot[i].data[k] + S->slot[i].skew[k] + r * rb, rb);
        }
        served++;
    }
    for (size_t e = 0; e < nh; e++)
        if (h[e].slot >= 0)
            drop_ref(S, h[e].slot);
    atomic_fetch_add_explicit(&S->rows, served, memory_order_relaxed);
    return rc;
}
