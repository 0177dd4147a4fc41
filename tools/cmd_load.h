/* stoke load, private: what cmd_load.c (options, the timed pass, the summary) and
 * cmd_load_hash.c (the hashes and the untimed hash pass) share.  The run and the hashes are
 * described at the top of cmd_load.c. */
#ifndef STOKE_TOOLS_CMD_LOAD_H
#define STOKE_TOOLS_CMD_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "cli.h"
#include "stoke/stoke.h"

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME  0x100000001b3ull

/* The sample order --shuffle asks for. */
enum { ORDER_SEQUENTIAL = 0, ORDER_RANDOM = 1, ORDER_BLOCK = 2 };

typedef struct load_args {
    cli_cmd cmd;
    const char *source, *pin_dev, *device, *on_error, *worker_mode, *arena;
    char shown[4200];      /* the source as printed: without credentials (stoke_source_redact) */
    stoke_loader_opts bad; /* --on-error parsed: on_error, max_bad, max_bad_fraction */
    uint64_t batch, workers, prefetch, seed, epochs, limit;
    uint64_t block_rows, block_window; /* ORDER_BLOCK: the sizes (defaults filled in) */
    int order, drop_last, pin, verify, in_order, hash, distributed;
    int workers_auto;  /* --workers auto (the default) */
    int prefetch_auto; /* --prefetch auto (the default) */
    int procs;         /* --worker-mode=processes */
    const char *order_arg; /* the --shuffle[=KIND] given (a second, other one is refused) */
} load_args;

/* What the timed pass delivered, for the hash pass: `epochs` epochs were reached; all but the
 * last were delivered whole, and so was the last if `last_whole`; otherwise idx[0..n) are the
 * indices of the last epoch's delivered samples (in delivery order until the hash pass sorts
 * them). */
typedef struct delivered {
    uint64_t epochs;
    int last_whole;
    uint64_t whole_samples, whole_sum; /* samples and index sum before the last epoch reached */
    uint64_t *idx;
    size_t n, cap;
    int lost; /* out of memory keeping idx: content_hash is not computed */
} delivered;

typedef struct load_run {
    const load_args *a;
    stoke_dataset ds;
    stoke_loader *l;
    uint64_t total;         /* batches the timed pass may deliver (UINT64_MAX: until the end) */
    uint64_t full;          /* total without --limit */
    size_t sample_bytes;    /* of field 0 */
    unsigned char *scratch; /* --verify: field 0 of a batch read back from the device */
    uint64_t *spans;        /* a ragged field 0: each sample's (start, bytes) in the batch */
    int bar;                /* a progress bar on stderr */
    delivered seen;
    uint64_t batches, samples, index_sum, order, content;
    uint64_t t0, t1, hash_ns;
    int staged_ok;             /* the npy source's block buffers after the timed pass: */
    uint64_t staged[3];        /* blocks read whole, of those with O_DIRECT, rows served */
    int remote_ok;             /* a tar source with remote shards: */
    stoke_remote_stats remote; /* its counters after the timed pass */
    int64_t rank, world; /* the split in use (--distributed: the environment's), else 0 of 1 */
    int status, hash_pass;
    int code;                    /* status 1: the library's code of the failure (STOKE_E...) */
    uint64_t hashed, hashed_sum; /* the hash pass, of whole epochs: samples hashed, index sum */
    char hash_why[512];          /* not empty: content_hash is null, for this reason */
    char err[1024];
    stoke_loader_stats st;
} load_run;

uint64_t cmd_load_now_ns(void);
/* content_hash of `count` samples of `bytes` each at p (span: each sample's start and bytes,
 * two words apiece, or NULL) */
uint64_t cmd_load_hash_batch(const unsigned char *p, const uint64_t *span, size_t count,
                             size_t bytes);
/* A ragged field 0 of batch b: each sample's (start, bytes) into r->spans, returned; NULL for a
 * field of one shape. */
const uint64_t *cmd_load_spans(load_run *r, const stoke_batch *b);
/* order_hash: h extended by the indices idx[0..n) */
uint64_t cmd_load_hash_order(uint64_t h, const uint64_t *idx, size_t n);
/* the untimed pass that computes r->content (or r->hash_why) from what the timed pass saw */
void cmd_load_hash_pass(load_run *r);

#endif
