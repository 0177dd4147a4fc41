/* Private to the tar source (tar.c: spec, shards, index; tar_remote.c: remote shards at open;
 * tar_fields.c: field kinds and the decoder hook).  See docs/sources.md, "tar". */
#ifndef STOKE_TAR_INTERNAL_H
#define STOKE_TAR_INTERNAL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "common/internal.h"
#include "sources/cache.h"
#include "sources/npy_header.h"
#include "sources/remote.h"
#include "sources/tar_header.h"
#include "stoke/dataset.h"

/* How a field's member turns into the sample's bytes. */
enum {
    STOKE__TAR_RAW = 0, /* the member's bytes as they are (u8[size], the size of the first) */
    STOKE__TAR_CLS,     /* a decimal integer in text: i64 */
    STOKE__TAR_NPY,     /* a .npy array: its data (dtype and shape of the first sample's) */
    STOKE__TAR_IMAGE    /* .jpg / .jpeg: decoded through the image hook */
};

/* The image decoder the tar source calls for .jpg / .jpeg fields.  NULL (stoke__tar_image_hook)
 * until the images module is built in: tar_fields.c connects it to stoke__image_* when
 * STOKE__TAR_WITH_IMAGES is defined.  `opts` is an opaque block of opts_size bytes. */
typedef struct stoke__tar_image_hook {
    size_t opts_size;
    void (*opts_init)(void *opts);
    /* 1: consumed; 0: not an image option; < 0: an error (msg set). */
    int (*parse_opt)(void *opts, const char *key, const char *val, char *msg, size_t msg_len);
    /* Describes the decoded field (name is set by the caller afterwards). */
    int (*field)(const void *opts, stoke_field *f, int64_t shape[3]);
    int (*decode)(const void *opts, const void *jpeg, size_t len, uint64_t epoch, uint64_t index,
                  void *dst, char *msg, size_t msg_len);
} stoke__tar_image_hook;

/* The hook in this build, or NULL. */
const stoke__tar_image_hook *stoke__tar_image_hook_get(void);

/* The kind of a member extension ("jpg", "JPEG", "cls", "npy", in any case; "seg.png": RAW). */
int stoke__tar_field_kind(const char *ext);

/* Where one field of one sample lies: data at `off` (size bytes), header at `hdr`; off ==
 * UINT64_MAX: the sample has no member with this field's extension. */
typedef struct stoke__tar_loc {
    uint64_t hdr, off, size;
} stoke__tar_loc;

typedef struct stoke__tar_field {
    char ext[64];
    int kind;
    int ragged; /* RAW: 0 one size, else 1 + stoke_collate (ragged= / packed= options) */
    int64_t max_len; /* a ragged field's max_len= (bytes, or .npy rows); 0: the longest member */
    char npy_descr[32];
} stoke__tar_field;

/* The most fields a tar source has (fields= or the first sample's members). */
#define STOKE__TAR_MAX_FIELDS 64

typedef struct stoke__tar_shard {
    char *path; /* for messages: the path, or the URL without credentials */
    int fd;     /* -1 for a remote shard */
    uint64_t size;
    int remote; /* 1: read through rf and the dataset's pool (remote.h) */
    stoke__remote_file rf;
    char *idx_url; /* the sidecar index its members came from (URL without credentials), or NULL */
    char *idx_ahead; /* its index, fetched ahead by the open (NULL: none; tar_remote.c) */
    size_t idx_ahead_len;
    int idx_missing; /* its index was asked for ahead: 404 (the shard is walked) */
} stoke__tar_shard;

typedef struct stoke__tar_ds {
    int nshards;
    stoke__tar_shard *shards;
    int nf;
    stoke__tar_field f[STOKE__TAR_MAX_FIELDS];
    stoke_field fields[STOKE__TAR_MAX_FIELDS];
    int64_t shapes[STOKE__TAR_MAX_FIELDS][STOKE__NPY_MAX_NDIM]; /* fields[k].shape */
    char *ragged_opt[2];      /* the ragged= and packed= lists, until the fields are known */
    char *max_len_opt;        /* max_len= (N, or EXT:N:EXT:N), until the fields are known */
    int truncate;             /* `truncate`: a ragged member past max_len is cut, not bad */
    uint64_t n;               /* samples */
    uint32_t *shard_of;       /* n */
    uint64_t *key_at;         /* n: offset of the sample's key in keys */
    stoke__tar_loc *loc;      /* n * nf */
    char *keys;               /* NUL-separated keys */
    void *image_opts;         /* the hook's options block (NULL without image fields) */
    stoke__remote_pool *pool; /* connections of the remote shards (NULL: all local) */
    stoke__cache *cache;      /* STOKE_CACHE_DIR: remote shards read from local copies */
    _Atomic uint64_t epoch;   /* for the image hook's random choices */
    uint64_t index_base;      /* added to a sample's i for the image hook (a stream's view) */
    /* mode=stream (tar_stream.c): an ITERABLE dataset */
    int stream;
    uint64_t shuffle_buffer; /* samples mixed (shuffle_buffer=; 0 and 1: none) */
    uint64_t seed;           /* seed= */
    int64_t rank, world;     /* rank= / world_size=; -1: from the environment, else 0 and 1 */
    struct stoke__tar_stream *st;
} stoke__tar_ds;

/* ---- tar.c: the index, shared with the streaming mode ---- */

/* A member of the form KEY.EXT found by a walk (path: malloc'd; path[0, key_len) the key). */
typedef struct stoke__tar_member {
    uint32_t shard;
    uint64_t hdr, off, size;
    char *path;
    size_t key_len;
} stoke__tar_member;

/* The members a walk collected, for stoke__tar_build_index. */
typedef struct stoke__tar_scan {
    const char *spec;
    stoke__tar_shard *sh;
    uint32_t shard; /* given to the next members */
    stoke__tar_member *m;
    size_t n, cap;
} stoke__tar_scan;

/* A walk's member callback (stoke__tar_member_fn) collecting into ctx, a stoke__tar_scan:
 * members without KEY.EXT are left out.  0 or STOKE_ENOMEM. */
int stoke__tar_on_member(void *ctx, const char *path, uint64_t hdr, uint64_t off, uint64_t size);
/* 1 when a and b are of one sample (one shard, one key). */
int stoke__tar_same_key(const stoke__tar_member *a, const stoke__tar_member *b);
/* Groups sc's members into samples: t's index (n, shard_of, key_at, loc, keys: malloc'd, NULL
 * before), by t's fields.  STOKE_OK, or the error recorded (two members of one field). */
int stoke__tar_build_index(const char *spec, stoke__tar_ds *t, const stoke__tar_scan *sc);

/* ---- tar_options.c: the options after the pattern ---- */

/* The field with extension ext, or -1. */
int stoke__tar_field_index(const stoke__tar_ds *t, const char *ext);
/* The dataset's describe (dataset.h) of a map-style tar: "tar SHARD@HDR: sample 'KEY'". */
int stoke__tar_describe(void *user, uint64_t index, char *buf, size_t n);
/* The options after the pattern (opts, modified; NULL: none): fields=, ragged= / packed=,
 * max_len=, truncate, the streaming mode's, the rest for the image hook.  STOKE_OK or the error
 * recorded, naming spec and the option. */
int stoke__tar_parse_options(const char *spec, stoke__tar_ds *t, char *opts);
/* mode=stream's options checked; rank and world from the environment when not given. */
int stoke__tar_stream_check(const char *spec, stoke__tar_ds *t);
/* ragged= (rg 0) / packed= (rg 1) applied to t's fields, once their kinds are known. */
int stoke__tar_mark_ragged(const char *spec, stoke__tar_ds *t, int rg);
/* max_len= applied to t's ragged and packed fields (tar_options.c has the rule). */
int stoke__tar_mark_max_len(const char *spec, stoke__tar_ds *t);

/* ---- tar_stream.c: mode=stream ---- */

/* shuffle_buffer= when not given: samples each worker mixes. */
#define STOKE__TAR_SHUFFLE_DEFAULT 1000
/* The largest shuffle_buffer= (samples per worker). */
#define STOKE__TAR_SHUFFLE_MAX (1 << 24)

struct stoke__tar_io;

/* Opens the streaming mode on t (spec parsed, shards listed, t->stream set): the remote
 * shards' requests made (no request sent), and the first sample of the first shard read into
 * sc (its members) and into a window of its bytes, so that the fields can be described from it
 * with *io.  STOKE_OK, or the error recorded. */
int stoke__tar_stream_open(const char *spec, stoke__tar_ds *t, stoke__tar_scan *sc,
                           struct stoke__tar_io *io);
/* Fills the ITERABLE dataset's callbacks (next, set_epoch, worker_init) into ds. */
void stoke__tar_stream_dataset(stoke__tar_ds *t, stoke_dataset *ds);
/* Frees the streaming state (every worker's stream and shuffle buffer).  NULL does nothing. */
void stoke__tar_stream_free(struct stoke__tar_stream *st);

/* How one get() reads a remote shard: the pool's slot, and the bytes of the sample already
 * fetched by one range request (tar.c, fetch_sample), which reads inside it take from there. */
typedef struct stoke__tar_io {
    int worker;
    const char *win; /* the shard's bytes [win_off, win_off + win_len); NULL: none */
    uint64_t win_off;
    size_t win_len;
    int borrowed; /* win is inside another io's window of the batch (not to be freed) */
} stoke__tar_io;

/* For a remote shard read by range (no cache): fetches the members of sample i's fields
 * that get() will read (dst[k] not NULL) with one range request into a window of io
 * (malloc'd: the caller frees io->win), when there are two or more and the bytes between them
 * that are not asked for are few (coalescing: one request per sample, not one per field).
 * Returns STOKE_OK (also when it fetched nothing), or the request's error with msg as
 * stoke__tar_read_field's, naming the sample's first member read. */
int stoke__tar_fetch_sample(const stoke__tar_ds *t, uint64_t i, void *const dst[],
                            stoke__tar_io *io, char *msg, size_t msg_len);
/* For a batch of samples idx[0 .. count) (read()): the windows of every sample of a remote
 * shard read by range (no cache), its members that dst[j * nf + k] asks for, fetched together
 * with stoke__remote_read_many (several requests in flight) through the slot of io[0].worker,
 * into io[j].  Neighbouring samples of one shard (at most COALESCE_GAP apart) share a request
 * until it holds about the batch's bytes / (4 x STOKE_REMOTE_CONNECTIONS) (so that every
 * connection still has a few) or COALESCE_MAX: the first of them owns the window, the others borrow
 * it (io[j].borrowed; the caller frees each io[j].win that is not borrowed, after the batch).
 * Samples that are local, cached, out of range or whose members are far apart get no window
 * (read as get() reads them).  STOKE_OK, or the first failing request's error with msg as
 * stoke__tar_read_field's and *bad the j of its first sample (no window is then left). */
int stoke__tar_fetch_batch(const stoke__tar_ds *t, const uint64_t *idx, size_t count,
                           void *const *dst, stoke__tar_io *io, char *msg, size_t msg_len,
                           size_t *bad);
/* Reads field k of sample i into dst (fields[k].bytes; a ragged field: the member, its size
 * into *len); a remote shard from io's window, or through the pool's slot of io->worker.
 * Returns STOKE_OK, or the error with msg "tar SHARD@OFFSET: sample 'KEY' field 'EXT':
 * reason"; a remote read's failure keeps the request's code (STOKE_ENOENT: the shard is gone,
 * HTTP 404 or 410; else STOKE_EIO). */
int stoke__tar_read_field(const stoke__tar_ds *t, uint64_t i, int k, void *dst, int64_t *len,
                          const stoke__tar_io *io, char *msg, size_t msg_len);
/* Fills t->fields[k] from the first sample that has field k (reading its member for NPY,
 * through io: NULL for none). */
int stoke__tar_describe_field(stoke__tar_ds *t, int k, const char *spec, const stoke__tar_io *io);
/* The dataset's set_epoch (for the image hook's augmentation): stores the epoch. */
int stoke__tar_set_epoch(void *user, uint64_t epoch);

/* ---- tar_remote.c: remote shards at open ---- */

/* The context of a walk's reads of a remote shard's local copy (the cache's). */
typedef struct stoke__tar_rlocal {
    stoke__tar_ds *t;
    stoke__tar_shard *s;
    char why[STOKE__MSG_MAX]; /* a failed read's reason */
} stoke__tar_rlocal;

/* Fetches the sidecar indexes of the remote shards from `from` on, up to
 * STOKE__TAR_INDEX_AHEAD, in parallel, for the opens that follow (stoke__tar_open_remote takes
 * them, or walks a shard whose index was not found without asking again).  Best effort: a
 * request that failed otherwise is made again by the shard's open, which reports it. */
#define STOKE__TAR_INDEX_AHEAD 64
void stoke__tar_index_ahead(const char *spec, stoke__tar_ds *t, int from);

/* How stoke__tar_open_remote opened a shard. */
enum {
    STOKE__TAR_INDEXED = 1, /* from its sidecar index: its members went to member(ctx, ...) */
    STOKE__TAR_WALK_NOW,    /* the cache's local copy: walk it through *w */
    STOKE__TAR_WALK_LATER   /* no index, no cache: stoke__tar_walk_remote walks it */
};

/* Opens remote shard s (its request made first, with the dataset's pool and cache when the
 * first): from its sidecar index when the server has one (with a cache, asked for only when the
 * cache has no copy of the shard, which is walked), else, with a cache, its local copy
 * (downloaded if missing) is walked through *w (s->size set), else it is left for
 * stoke__tar_walk_remote; *how says which.  STOKE_OK, or the error, recorded, naming the
 * shard. */
int stoke__tar_open_remote(const char *spec, stoke__tar_ds *t, stoke__tar_shard *s,
                           stoke__tar_rlocal *w, stoke__tar_member_fn member, void *ctx, int *how);
/* The walk's read (stoke__tar_read_fn) of a remote shard's local copy opened into ctx (a
 * stoke__tar_rlocal): 0, or -ENOMEM / -EIO with the reason in its why. */
int stoke__tar_read_remote(void *ctx, void *buf, size_t n, uint64_t off, size_t *got);
/* Walks the headers of remote shards t->shards[which[0 .. n)] (which increasing; opened as
 * STOKE__TAR_WALK_LATER) at once, their members merged into sc in shard order (sc holds the
 * other shards' members, in shard order), each shard's size set.  Each walk is a chain of
 * range requests (the first of 1 MiB from byte 0: the size comes with it; then, from the
 * first header of a member the window did not hold, windows of latency x rate bytes measured
 * on the walk's requests, 4 KiB to 1 MiB); the next request of up to 32 shards at a time is read
 * in one round through slot 0 (stoke__remote_read_many: STOKE_REMOTE_CONNECTIONS in flight).
 * Returns STOKE_OK, or the error of the first shard in order that failed (recorded, worded as
 * the walk of one shard: the request's "GET URL: ..." or "tar URL: at byte N: ..."); the
 * shards after it are not walked to their end. */
int stoke__tar_walk_remote(const char *spec, stoke__tar_ds *t, const int *which, int n,
                           stoke__tar_scan *sc);
/* Makes remote shard s's request (the dataset's pool, and cache when STOKE_CACHE_DIR is set,
 * made by the first; no request is sent); s->path becomes the URL without credentials.
 * STOKE_OK, or the error recorded (nothing changed). */
int stoke__tar_remote_init(const char *spec, stoke__tar_ds *t, stoke__tar_shard *s);
/* With a cache: every remote shard's request made, and their order given to the cache, so
 * that the download of a shard has the next ones downloaded meanwhile (read-ahead), at open
 * and during the epochs; with sized, once the shards are open, with their sizes (the
 * read-ahead's downloads are then checked against them).  Without a cache (or no remote
 * shard) nothing is done.  STOKE_OK, or the error, recorded. */
int stoke__tar_remote_order(const char *spec, stoke__tar_ds *t, int sized);

#endif
