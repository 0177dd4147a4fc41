/* Private to the npy source: the dataset's state and the pieces its files share.
 *
 * npy.c opens files, decides io=auto and implements get(); npy_batch.c implements get_batch()
 * for mmap and pread and cuts a batch into runs of consecutive rows; npy_uring.c runs those
 * runs on one io_uring per worker.  See docs/sources.md. */
#ifndef STOKE_NPY_INTERNAL_H
#define STOKE_NPY_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "sources/npy_header.h"
#include "sources/remote.h"
#include "stoke/dataset.h"

/* get() of a sample whose index is a multiple of STOKE__NPY_STAT_EVERY fstat()s the file, and
 * get_batch() of a batch that holds a multiple of STOKE__NPY_STAT_EVERY_BATCH (once per
 * batch): at least once per epoch that visits sample 0.  Batches check less often: with the
 * 256 of get(), almost every batch of 1024 holds one, and its fstat cost about 1 ns per
 * 256-byte row (3%). */
#define STOKE__NPY_STAT_EVERY       256
#define STOKE__NPY_STAT_EVERY_BATCH 4096

/* io=mmap: a field whose rows in one batch come to at least this many bytes, copied while
 * another batch of the dataset is being copied too, is copied with non-temporal stores
 * (stoke__copy_nt; runs of under STOKE__NPY_NT_RUN bytes with memcpy).  The loader rotates at
 * least four batch buffers, so such batches fill 32 MiB or more, past the last-level cache of a
 * core complex of current server CPUs, and memcpy reads every line it writes from memory first:
 * with two copies at once the memory's bandwidth is the limit, and streaming stores leave more
 * of it for the rows (150 KB rows, batch 64: 1 worker and the consumer's help +18%, 2 workers
 * +8%, auto +17%; again once populated mappings no longer got MADV_WILLNEED per row: 1 worker
 * +2%, 2 workers +21%, auto +29%).  A copy on its own is not bandwidth bound and lost 9% with
 * them, so it keeps memcpy.  Tests lower stoke__npy_nt_min, set stoke__npy_nt_always (no need
 * for a second copy) and read stoke__npy_nt_fields, the batch fields copied that way. */
#define STOKE__NPY_NT_MIN ((size_t)8 << 20)
#define STOKE__NPY_NT_RUN ((size_t)1024)
extern size_t stoke__npy_nt_min;
extern int stoke__npy_nt_always;
extern _Atomic uint64_t stoke__npy_nt_fields;
/* io=mmap: MADV_WILLNEED calls made for long runs (tests count them). */
extern _Atomic uint64_t stoke__npy_willneed;

/* Rings per dataset: worker w uses ring w % STOKE__NPY_RINGS (each has a lock, so two loaders
 * sharing a dataset, or worker ids past the table, only serialise). */
#define STOKE__NPY_RINGS 64

typedef struct stoke__npy_file {
    char *path; /* as given; a URL without any user:password@ (stoke__remote_redact) */
    int fd;     /* -1 for a remote file */
    int remote; /* IO_REMOTE: read by range through rf and the dataset's pool (npy_remote.c) */
    stoke__remote_file rf;
    const unsigned char *map; /* IO_MMAP: the whole file */
    size_t map_len;
    stoke__npy_header h;
    uint64_t rows;
    size_t row_bytes;
    uint64_t size;         /* st_size at open (remote: Content-Range's total) */
    struct timespec mtime; /* st_mtim at open */
    /* mincore tells the truth about this file's pages: since Linux 5.0 only to its owner, one
     * who may write it, or root (to others it calls every page resident).  cachestat, where it
     * applies the same rule, fails with EPERM instead. */
    int mincore_ok;
    /* IO_MMAP: io=auto found the file resident and filled the mapping's page tables (npy.c,
     * populate): its pages are in, so runs skip MADV_WILLNEED. */
    int populated;
    /* IO_MMAP: a read faulted (the file is shorter than its mapping): from then on each
     * mapped read checks its rows' ends against the file's size (stoke__npy_rows_within),
     * since the rows in the last page past the new end read as zeros, without a fault. */
    atomic_int shrunk;
} stoke__npy_file;

struct stoke__npy_ring;                           /* npy_uring.c */
typedef struct stoke__npy_stage stoke__npy_stage; /* npy_stage.c */

typedef struct stoke__npy_ds {
    int io;     /* the mode in use: MMAP, PREAD, URING or REMOTE (auto resolved at open) */
    int direct; /* staged blocks not in the page cache are read with O_DIRECT (resolved) */
    int nfiles; /* 1 (data) or 2 (data, labels) */
    stoke__npy_file f[2];
    stoke__remote_pool *pool; /* IO_REMOTE: the connections (slot = worker), else NULL */
    /* IO_URING: created by the first get_batch() of each worker, freed by close. */
    _Atomic(struct stoke__npy_ring *) rings[STOKE__NPY_RINGS];
    atomic_int ring_warned; /* one warning when a worker's ring cannot be created */
    /* Block read-ahead (npy_stage.c): the state in use (NULL: none), and every state the
     * hints made (freed by close). */
    _Atomic(stoke__npy_stage *) stage;
    _Atomic(stoke__npy_stage *) stages; /* newest first; ->older never changes once published */
    /* io=mmap: batches being copied now (get_batch() of any thread; written through a cast,
     * the rest of the struct is read-only once open) */
    atomic_int copying;
    stoke_field fields[2]; /* data, labels: what the dataset describes */
} stoke__npy_ds;

/* A run: samples pos .. pos + n - 1 of a batch, field k, whose rows are consecutive in the file
 * (at, len bytes) and land consecutively at dst. */
typedef struct stoke__npy_run {
    int k;
    size_t pos, n;
    uint64_t at;
    unsigned char *dst;
    size_t len;
} stoke__npy_run;

/* Walks a batch's runs: field 0 over the batch, then field 1.  NULL dst[k] and 0-byte rows are
 * skipped; a run stops at STOKE__NPY_RUN_MAX bytes (but holds at least one row). */
#define STOKE__NPY_RUN_MAX ((size_t)1 << 20)
typedef struct stoke__npy_runs {
    const stoke__npy_ds *ds;
    const uint64_t *idx;
    size_t count;
    void *const *dst;
    int k, kend; /* the field walked now, and one past the last field to walk */
    size_t pos;
} stoke__npy_runs;

/* Rows in the run starting at position p of idx[0, count): 1 plus the consecutive indices that
 * follow, at most `most` (STOKE__NPY_RUN_MAX bytes of rows of rb bytes: stoke__npy_run_most). */
static inline size_t stoke__npy_run_most(size_t rb)
{
    return rb >= STOKE__NPY_RUN_MAX ? 1 : STOKE__NPY_RUN_MAX / rb;
}
static inline size_t stoke__npy_run_len(const uint64_t *idx, size_t p, size_t count, size_t most)
{
    size_t n = 1;
    while (p + n < count && n < most && idx[p + n] == idx[p + n - 1] + 1)
        n++;
    return n;
}

void stoke__npy_runs_init(stoke__npy_runs *it, const stoke__npy_ds *ds, const uint64_t *idx,
                          size_t count, void *const dst[]);
/* Next run into *r; 0 when there is none left. */
int stoke__npy_runs_next(stoke__npy_runs *it, stoke__npy_run *r);

/* ---- npy_read.c ---- */
/* Byte-swaps every `unit`-byte element (2, 4 or 8; other units: nothing) of p[0, n). */
void stoke__npy_swap(unsigned char *p, size_t n, size_t unit);
/* Compares f's size and mtime with those seen at open: STOKE_OK, or STOKE_EIO with msg. */
int stoke__npy_check_unchanged(const stoke__npy_file *f, uint64_t index, char *msg, size_t msg_len);
/* A read of sample `index` that failed with -errno `err`, or (err 0) ended at file byte `end`:
 * "read failed: ..." or "file changed while loading (it ends at byte END: truncated)".
 * Returns STOKE_EIO. */
int stoke__npy_read_failed(const stoke__npy_file *f, uint64_t index, uint64_t end, int err,
                           char *msg, size_t msg_len);
/* "npy PATH: sample I: file changed while loading (why)" into msg; returns STOKE_EIO. */
/* IO_MMAP, once f->shrunk: STOKE_OK when rows idx[0, count) all end within the file's size
 * now, else STOKE_EIO for the first that does not (*err_index, msg: "now N bytes, M when
 * opened", or after a `fault` "its mapped pages are gone"); marks f shrunk when `fault` (a
 * read of its mapping faulted). */
int stoke__npy_rows_within(const stoke__npy_file *f, const uint64_t *idx, size_t count, int fault,
                           char *msg, size_t msg_len, uint64_t *err_index);
int stoke__npy_changed(const stoke__npy_file *f, uint64_t index, char *msg, size_t msg_len,
                       const char *why);
/* The error of a run that read only `got` of its bytes: EOF (res 0) or -errno (res < 0), for
 * the sample the missing bytes belong to.  Returns STOKE_EIO. */
int stoke__npy_run_failed(const stoke__npy_ds *ds, const uint64_t *idx, const stoke__npy_run *r,
                          size_t got, int err, char *msg, size_t msg_len, uint64_t *err_index);

/* get_batch() of every mode (npy_batch.c). */
/* The dataset's prefetch: io=mmap prefetches the rows' first bytes into the cache. */
void stoke__npy_prefetch(void *user, const uint64_t *idx, size_t count);
int stoke__npy_get_batch(void *user, const uint64_t *indices, size_t count, void *const dst[],
                         int worker, char *msg, size_t msg_len, uint64_t *err_index);
/* read()'s scattered path (several runs of slots, each sample's slot at dst[j * nf + k]):
 * io=mmap copies the rows under one guard per file, rows
 * PREFETCH_AHEAD ahead prefetched (a byte-swapped file's rows then swapped in place); the other
 * modes, and block-shuffle slots, read each sample as a get_batch of one. */
int stoke__npy_get_scattered(void *user, const uint64_t *indices, size_t count, void *const dst[],
                             int worker, char *msg, size_t msg_len, uint64_t *err_index);
/* The pread batch path (npy_batch.c): the fallback of io=uring without a ring. */
int stoke__npy_batch_pread(const stoke__npy_ds *ds, const uint64_t *idx, size_t count,
                           void *const dst[], char *msg, size_t msg_len, uint64_t *err_index);

/* ---- npy_remote.c ---- */
/* Fills f's request for URL `url` (the pool made first when *pool is NULL) and reads the first
 * min(size, STOKE__NPY_PREFIX_MAX) bytes with one range request: 0 with *head (malloc'd),
 * *got and f->size (the total of the answer's Content-Range), or an error with the message set
 * (stoke__fail): the pool's STOKE_ENOTSUP without libcurl, STOKE_ENOENT for 404, ... */
int stoke__npy_remote_head(stoke__npy_file *f, const char *url, stoke__remote_pool **pool,
                           unsigned char **head, size_t *got);
/* get() of a remote file: the row of sample `index` at `at` with one range read through the
 * worker's slot.  STOKE_OK, or an error with msg ("npy URL: sample I: ..."). */
int stoke__npy_remote_row(const stoke__npy_ds *ds, const stoke__npy_file *f, uint64_t index,
                          uint64_t at, void *dst, int worker, char *msg, size_t msg_len);
/* get_batch() of IO_REMOTE: the rows sorted by index, one range request per run of rows
 * consecutive in the file (wherever their slots are), the batch's requests in flight together
 * (stoke__remote_read_many).  Same contract as
 * get_batch (no byte swap: the caller's). */
int stoke__npy_batch_remote(const stoke__npy_ds *ds, const uint64_t *idx, size_t count,
                            void *const dst[], int worker, char *msg, size_t msg_len,
                            uint64_t *err_index);

/* ---- npy_uring.c ---- */
/* 1 when this build has liburing. */
int stoke__npy_uring_built(void);
/* Creates and destroys a small ring: 0, or -errno from io_uring_queue_init (-ENOSYS without
 * liburing).  why receives the reason for the caller's message. */
int stoke__npy_uring_probe(char *why, size_t why_len);
/* Reads the batch's runs on worker's ring (created on first use); falls back to the pread path
 * when the ring cannot be created.  Same contract as get_batch. */
int stoke__npy_batch_uring(stoke__npy_ds *ds, const uint64_t *idx, size_t count, void *const dst[],
                           int worker, char *msg, size_t msg_len, uint64_t *err_index);
/* Frees every ring (no get_batch() may be running). */
void stoke__npy_rings_free(stoke__npy_ds *ds);
/* In a forked child, before it reads: the rings inherited from the parent dropped unused (their
 * queues are the parent's); the child's first batch on each worker makes its own. */
void stoke__npy_rings_forked(stoke__npy_ds *ds);

/* ---- npy_stage.c ---- */
/* The dataset's access_hint: a block shuffle turns the block read-ahead on, anything else off. */
void stoke__npy_access_hint(void *user, int sampler_kind, uint64_t block_rows,
                            uint64_t block_window);
/* The dataset's set_epoch: every block is read ahead again in the new epoch. */
int stoke__npy_set_epoch(void *user, uint64_t epoch);
/* get_batch(), before its reads: reads ahead the blocks of idx not yet read in this epoch. */
void stoke__npy_stage_batch(const stoke__npy_ds *ds, const uint64_t *idx, size_t count);
/* Whether every page of [at, at + len) of f is in the page cache (cachestat, which reads
 * nothing in; where the kernel has none or refuses it, 8 pages probed with 1-byte preadv2
 * RWF_NOWAIT, which start reading the pages they miss). */
int stoke__npy_resident(const stoke__npy_file *f, uint64_t at, uint64_t len);
/* A staged block whose residency the caller probed: the first call of the epoch for the block
 * counts it as found RESIDENT, read with O_DIRECT (DIRECT: counted as read ahead, no advice),
 * or asks the kernel for it (ADVISE), and keeps stage_one and stage_batch from doing it again. */
enum { STOKE__NPY_STAGE_RESIDENT, STOKE__NPY_STAGE_DIRECT, STOKE__NPY_STAGE_ADVISE };
void stoke__npy_stage_claim(const stoke__npy_ds *ds, uint64_t block, int how);
/* The read-ahead of one block, unless it was read ahead in this epoch. */
void stoke__npy_stage_one(const stoke__npy_ds *ds, uint64_t block);
/* Blocks read ahead and blocks found resident since open (stoke_npy_block_stats). */
void stoke__npy_stage_stats(const stoke__npy_ds *ds, uint64_t *read_ahead, uint64_t *resident);
/* Blocks read whole into slots (of those, with O_DIRECT) and rows served from them since open
 * (stoke_npy_block_staged). */
void stoke__npy_stage_staged(const stoke__npy_ds *ds, uint64_t *blocks, uint64_t *direct,
                             uint64_t *rows);
/* Frees every block read-ahead state (no get may be running). */
void stoke__npy_stages_free(stoke__npy_ds *ds);
/* ---- npy_slots.c ---- */
typedef struct stoke__npy_slots stoke__npy_slots;
/* The staged blocks of the state in use (NULL: none): what get_batch() serves from memory. */
stoke__npy_slots *stoke__npy_stage_slots(const stoke__npy_ds *ds);
/* Reads samples from .. from + n - 1 of the batch the io mode's own way. */
typedef int (*stoke__npy_rest_fn)(void *ctx, size_t from, size_t n);
/* Bytes nslots slots of block_rows rows of every file take; SIZE_MAX on overflow. */
size_t stoke__npy_slots_bytes(const stoke__npy_ds *ds, uint64_t block_rows, uint64_t nslots);
/* nslots buffers of one block of every file, resident; NULL without memory. */
stoke__npy_slots *stoke__npy_slots_new(const stoke__npy_ds *ds, uint64_t block_rows,
                                       uint64_t nblocks, uint64_t nslots);
void stoke__npy_slots_free(stoke__npy_slots *S);
/* Every slot free again (set_epoch; no get may be running). */
void stoke__npy_slots_reset(stoke__npy_slots *S);
/* Adds blocks read whole (of those, with O_DIRECT) and rows served from slots since the slots
 * were made. */
void stoke__npy_slots_stats(const stoke__npy_slots *S, uint64_t *blocks, uint64_t *direct,
                            uint64_t *rows);
/* get_batch() under a block shuffle: copies the rows of the batch's blocks from slots (reading
 * a block whole into a slot when no slot has it yet), and hands every stretch of rows it does
 * not serve to rest().  Returns STOKE_OK or rest()'s first error. */
int stoke__npy_slots_serve(const stoke__npy_ds *ds, stoke__npy_slots *S, const uint64_t *idx,
                           size_t count, void *const dst[], stoke__npy_rest_fn rest, void *ctx);

#endif
