/* stoke — built-in data sources: synthetic bytes, NumPy .npy files and JPEG image folders.
 *
 * Each constructor fills a stoke_dataset (see dataset.h) of kind STOKE_DATASET_MAP whose get()
 * writes sample i straight into the batch slots the loader gives it.  Release it with
 * stoke_dataset_close().  get() is thread-safe: workers call it concurrently.
 *
 * Sources by spec string (stoke_source_open, the CLI's SOURCE argument):
 *
 *   synthetic[:N][,shape=3x32x32][,seed=S][,classes=C][,dtype=u8]
 *       N samples (default 50000) of deterministic bytes; classes=C adds a "label" field (i64,
 *       index % C).  Example: "synthetic:100000,shape=3x224x224".
 *   npy:PATH[,labels=LABELS.npy][,io=auto|mmap|pread|uring|remote]
 *       rows of a .npy file are the samples (field "data"); labels adds a field "label" from a
 *       1-D or (N,1) .npy with the same N; io picks the I/O mode (stoke_npy_io below, default
 *       auto).  PATH may be an http://, https:// or s3:// URL (io=remote: docs/sources.md,
 *       "Remote data").  A comma belongs to PATH unless it starts one of the options above.
 *   tar:PATTERN[,fields=EXT:EXT...][,image options]
 *       WebDataset tar shards (stoke_tar_open below).  PATTERN ends at the first comma outside
 *       braces.  Example: "tar:/data/train-{000000..000099}.tar,fields=npy:cls".
 *   images:DIR[,size=224][,train|eval][,layout=chw|hwc][,dtype=u8|f32][,mean=R:G:B,std=R:G:B]
 *             [,seed=N][,max_decode_bytes=SIZE]
 *       a torchvision ImageFolder tree of JPEGs (stoke_images_open below): field "data" the
 *       decoded, transformed image, field "label" (i64) the class index.  A comma belongs to
 *       DIR unless one of the options above follows it.
 */
#ifndef STOKE_SOURCES_H
#define STOKE_SOURCES_H

#include <stdint.h>

#include "stoke/dataset.h"
#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Opens the source `spec` (grammar above; read only during the call) into *out (initialised by
 * this call; the caller owns the result and releases it with stoke_dataset_close).
 * Returns STOKE_OK; STOKE_EINVAL for a NULL argument, an empty spec or one longer than 4096
 * characters, an unknown source or a malformed option (the message names the spec and the
 * problem); STOKE_ENOMEM; otherwise the constructor's code (stoke_synthetic_open,
 * stoke_npy_open_opts, stoke_images_open).  On failure *out is left empty (as from
 * stoke_dataset_init: safe to stoke_dataset_close) unless out was NULL.  Thread-safe. */
STOKE_API int stoke_source_open(const char *spec, stoke_dataset *out);

/* `spec` as it may be printed or logged, into out (n bytes, NUL-terminated, truncated as
 * snprintf): every URL in it without its user:password@ and without the values of
 * signature and token query parameters (a presigned URL's), as in the library's own
 * messages.  Returns out.  Thread-safe. */
STOKE_API const char *stoke_source_redact(char *out, size_t n, const char *spec);

/* ---- synthetic ------------------------------------------------------------------------------
 * Sample i's bytes are a pure function of (seed, i): a counter-based mix (splitmix64 of seed,
 * index and word number) generating 8 bytes per step, so any sample can be produced by any
 * worker in any order, at memory-like speed.  Bytes are random bit patterns whatever the dtype. */
/* The most dimensions stoke_synthetic_opts holds (a limit of these options only). */
#define STOKE_SYNTHETIC_MAX_DIMS 8

typedef struct stoke_synthetic_opts {
    uint32_t size;                           /* sizeof(stoke_synthetic_opts): set by opts_init */
    uint64_t length;                         /* number of samples; default 50000 */
    uint64_t seed;                           /* default 0 */
    int dtype;                               /* element type of "data"; default STOKE_DTYPE_U8 */
    size_t itemsize;                         /* only for STOKE_DTYPE_RAW */
    int ndim;                                /* default 3 */
    int64_t shape[STOKE_SYNTHETIC_MAX_DIMS]; /* default 3 x 32 x 32 */
    uint32_t classes; /* > 0: add field "label" (i64) = index % classes; default 0 */
    /* Appended (a caller built against the struct without them, whose size ends before them,
     * gets no delay): sample delay_index takes delay_us microseconds longer to make (a sleep
     * before its bytes are written), every time it is read: a straggler, for trying a loader's
     * timeout, ordering or auto workers.  delay_us 0 (the default): none. */
    uint64_t delay_index;
    uint32_t delay_us;
} stoke_synthetic_opts;

/* Fills *opts with the defaults above.  NULL does nothing. */
STOKE_API void stoke_synthetic_opts_init(stoke_synthetic_opts *opts);

/* Opens a synthetic dataset (opts NULL: the defaults; *opts is read only during the call) into
 * *out (the caller owns it: stoke_dataset_close).  Returns STOKE_OK; STOKE_EINVAL for out NULL,
 * a bad shape (ndim outside 0..STOKE_SYNTHETIC_MAX_DIMS, a dimension <= 0) or dtype (unknown, RAW
 * with itemsize 0) or opts->size too small; STOKE_ERANGE if a sample's size overflows;
 * STOKE_ENOMEM.  On failure *out is left empty (safe to stoke_dataset_close).  Thread-safe; the
 * dataset's get() is too. */
STOKE_API int stoke_synthetic_open(const stoke_synthetic_opts *opts, stoke_dataset *out);

/* Writes synthetic sample `index` of `seed` (`bytes` bytes) to dst (caller's memory of at least
 * `bytes` bytes, not checked): the bytes get() produces for field "data".  For checks and
 * benchmarks.  Cannot fail.  Thread-safe. */
STOKE_API void stoke_synthetic_fill(uint64_t seed, uint64_t index, void *dst, size_t bytes);

/* ---- npy ------------------------------------------------------------------------------------
 * NumPy .npy, format versions 1.0, 2.0 and 3.0; C order only; any fixed-size dtype
 * (b1 i1 u1 i2 u2 i4 u4 i8 u8 f2 f4 f8 c8 c16; V<n> and S<n> as STOKE_DTYPE_RAW of n bytes).
 * Big-endian ('>') numeric data is byte-swapped to native order as each sample is copied.
 * Shape () is one sample; shape (N, d1, ...) is N samples of shape (d1, ...).
 * Errors: STOKE_ENOENT / STOKE_EIO for a file that cannot be opened or read, STOKE_EFORMAT for a
 * malformed or unsupported file (truncated, bad magic or version, bad header, Fortran order,
 * structured or object dtype, data shorter than the shape says), STOKE_EINVAL for labels that do
 * not match, STOKE_EIO for anything but a regular file ("is a FIFO, not a regular file": never
 * a blocking open); every message names the file and the problem.  The dataset has get() and
 * get_batch() (dataset.h); both return STOKE_ERANGE for an index past the end and STOKE_EIO
 * when a read fails or the file changed while loading ("npy PATH: sample I: file changed while
 * loading (...)": truncated, in every I/O mode, or size/mtime different from those at open,
 * checked at every 256th index).  io=uring on a build without liburing, or on a kernel that
 * refuses io_uring, is STOKE_ENOTSUP at open ("io=uring is not available: ...").  With
 * STOKE_NPY_IO_MMAP (also when io=auto chose it) the process gets a SIGBUS handler that turns
 * a fault in a copy from the mapping into that error and chains every other SIGBUS to the
 * previous disposition (see docs/sources.md).  A shape with a 0 dimension after the first,
 * (N, 0, ...), is N samples of 0 bytes.  URLs (STOKE_NPY_IO_REMOTE): a 404 or 410 is
 * STOKE_ENOENT, another failed request STOKE_EIO, both naming the URL (without any
 * user:password@), the HTTP status and the reason; an answer whose size differs from the one
 * at open, or a body cut short, is "file changed while loading"; without libcurl STOKE_ENOTSUP. */

typedef enum stoke_npy_io {
    STOKE_NPY_IO_MMAP = 0,  /* map the file: get() is one memcpy from the mapping */
    STOKE_NPY_IO_PREAD = 1, /* pread() each sample (each run of consecutive samples) into its
                               slot: mapped pages do not count in the process's resident set */
    STOKE_NPY_IO_URING = 2, /* io_uring: get_batch() keeps up to STOKE_NPY_URING_DEPTH reads in
                               flight per worker, straight into the slots (built with liburing
                               only: stoke_npy_io_available) */
    STOKE_NPY_IO_AUTO = 3,  /* the default: at open, REMOTE for a URL; for a local file MMAP
                               when it is in the page cache (mincore of a sample of its pages),
                               else URING when available, else PREAD (docs/sources.md) */
    STOKE_NPY_IO_REMOTE = 4 /* http://, https:// and s3:// URLs (data and labels both): HTTP
                               range requests, one per sample, one per run of consecutive rows
                               of a batch (built with libcurl only, else STOKE_ENOTSUP) */
} stoke_npy_io;

/* How a block shuffle reads the blocks that are not in the page cache with io=pread or
 * io=uring (docs/loader.md, "Block shuffle reads"): each block is read whole into a block
 * buffer, with O_DIRECT (straight from the disk into the buffer, past the page cache: faster,
 * and the page cache keeps what it holds, but every epoch reads from the disk again) or through
 * the page cache (a later epoch finds the file there when it fits in memory). */
typedef enum stoke_npy_direct {
    STOKE_NPY_DIRECT_AUTO = 0, /* the default: O_DIRECT when the data file is larger than half
                                  of physical memory (it could not stay in the page cache) */
    STOKE_NPY_DIRECT_ON = 1,   /* always O_DIRECT (where the file system refuses it, as OFF) */
    STOKE_NPY_DIRECT_OFF = 2   /* always through the page cache */
} stoke_npy_direct;

/* Reads in flight per worker ring with STOKE_NPY_IO_URING. */
#define STOKE_NPY_URING_DEPTH 128

typedef struct stoke_npy_opts {
    uint32_t size;           /* sizeof(stoke_npy_opts): set by opts_init */
    const char *labels_path; /* optional labels .npy (field "label"); default NULL */
    int io;                  /* stoke_npy_io; default STOKE_NPY_IO_AUTO */
    int direct;              /* stoke_npy_direct; default STOKE_NPY_DIRECT_AUTO (appended: a
                                smaller opts->size that ends after io means AUTO) */
} stoke_npy_opts;

/* Fills *opts with the defaults above.  NULL does nothing. */
STOKE_API void stoke_npy_opts_init(stoke_npy_opts *opts);

/* Opens `path` (and opts->labels_path) into *out; opts NULL: the defaults.  The path strings
 * and *opts are read only during the call (the dataset keeps its own copies).  The files stay
 * open (mapped, with io=mmap) until stoke_dataset_close; the caller owns *out.
 * Returns STOKE_OK or the errors described above; also STOKE_EINVAL for out NULL, an empty
 * path, opts->size too small (it must reach past io) or an unknown io or direct mode;
 * STOKE_ENOMEM; STOKE_ELIMIT for a file too large to map.  On failure *out is left empty (safe
 * to stoke_dataset_close).  Thread-safe. */
STOKE_API int stoke_npy_open_opts(const char *path, const stoke_npy_opts *opts, stoke_dataset *out);

/* Shorthand: stoke_npy_open_opts with labels_path (may be NULL) and the default I/O.  Same
 * return codes, ownership and thread-safety. */
STOKE_API int stoke_npy_open(const char *path, const char *labels_path, stoke_dataset *out);

/* The I/O mode an open npy dataset uses (io=auto resolved: MMAP, PREAD or URING).  Returns it,
 * or STOKE_EINVAL if ds is NULL or not an open npy dataset.  Thread-safe. */
STOKE_API int stoke_npy_io_used(const stoke_dataset *ds);

/* "mmap", "pread", "uring", "auto"; "unknown" for another value.  Static, never NULL. */
STOKE_API const char *stoke_npy_io_name(int io);

/* Whether I/O mode `io` can be used here: STOKE_OK; STOKE_ENOTSUP for io=uring in a build
 * without liburing, or when the kernel refuses an io_uring instance (io_uring_queue_init
 * failed: seccomp, kernel.io_uring_disabled), with the reason in stoke_last_error();
 * STOKE_EINVAL for an unknown mode.  URING is probed each call (one small ring created and
 * destroyed).  Thread-safe. */
STOKE_API int stoke_npy_io_available(int io);

/* Block read-ahead of an open npy dataset (docs/loader.md, "Block shuffle reads"): when a
 * loader runs a block shuffle, the first batch of an epoch that touches a block asks the kernel
 * to read the block's whole byte range, unless it finds the block in the page cache.  Since
 * open: *read_ahead blocks were asked for (or read with O_DIRECT into a block buffer, below),
 * *resident blocks were found resident: each block once per epoch.  Returns STOKE_OK, or
 * STOKE_EINVAL for NULL arguments or not an open npy dataset.  Thread-safe. */
STOKE_API int stoke_npy_block_stats(const stoke_dataset *ds, uint64_t *read_ahead,
                                    uint64_t *resident);
/* Under a block shuffle with io=pread or io=uring (what io=auto picks for a file that is not
 * in the page cache) the npy source reads each block whole into one of min(2 x window, blocks)
 * block buffers made at stoke_loader_create and copies the block's rows from there
 * (docs/loader.md, "Block shuffle reads"; stoke_npy_direct says how).  Since open: *blocks
 * were read whole into a buffer, *direct of them with O_DIRECT, and *rows were copied from the
 * buffers.  Returns STOKE_OK, or STOKE_EINVAL for NULL arguments or not an open npy dataset.
 * Thread-safe. */
STOKE_API int stoke_npy_block_staged(const stoke_dataset *ds, uint64_t *blocks, uint64_t *direct,
                                     uint64_t *rows);

/* ---- tar ------------------------------------------------------------------------------------
 * WebDataset shards read as a map-style dataset (docs/sources.md, "tar"), or with mode=stream
 * as an ITERABLE one (docs/sources.md, "Streaming").  `args` is what follows "tar:" in a spec:
 * PATTERN[,fields=EXT:EXT...][,mode=stream[,shuffle_buffer=N][,seed=S][,rank=R,world_size=W]]
 * [,image options].  Shards may be http://, https:// or s3:// URLs (with libcurl: else
 * STOKE_ENOTSUP), read by range requests or through STOKE_CACHE_DIR's cache.
 * PATTERN: shard paths with brace groups ({000000..000099}, zero-padded as written; {a,b}) and
 * glob(3) wildcards, expanded in that order (glob results sorted): the shard order.
 * Archives: POSIX ustar, pax ('x': path and size; 'g' ignored), GNU long names; regular files
 * only.  Members sharing a key (path up to the first dot of the base name, consecutive in one
 * shard) are one sample; field EXT is the member KEY.EXT: "cls" a decimal integer (i64), "npy"
 * an array (dtype and shape of the first sample's), "jpg"/"jpeg" an image (needs the images
 * module: STOKE_ENOTSUP at open without it), anything else the raw bytes (u8[size], the size of
 * the first sample's member).  Without fields= the fields are the first sample's extensions in
 * member order.  The canonical index: shard order, then member order.
 * At open every shard's headers are walked (data skipped), or a remote shard's sidecar index
 * SHARD.idx is read instead; with mode=stream only the first sample of the first shard is read,
 * and each epoch reads the shards front to back: STOKE_EFORMAT for a corrupt or
 * truncated archive, the message naming the shard and the byte offset; STOKE_ENOENT for a
 * missing shard or a glob without match; STOKE_EINVAL for a bad option.  get() returns
 * STOKE_EDATA for a sample without a member of a field, STOKE_EFORMAT for a member that does
 * not match the field (size, dtype, shape, not a number), STOKE_EIO for a failed read,
 * STOKE_ELIMIT for a .jpg member over 256 MiB (checked from its header, before any read) or
 * one whose decode needs more than max_decode_bytes (an image option, as for images:); each
 * message reads "tar SHARD@OFFSET: sample 'KEY' field 'EXT': reason".  Every shard stays open
 * until stoke_dataset_close.  Thread-safe; get() too. */
STOKE_API int stoke_tar_open(const char *args, stoke_dataset *out);

/* Counters of a tar dataset's remote shards (docs/sources.md, "Remote shards"), since open:
 * the open's requests included, and those of worker processes forked from this one. */
typedef struct stoke_remote_stats {
    uint32_t size;            /* set by the caller to sizeof(stoke_remote_stats) */
    uint32_t cached;          /* 1: the shards are read through the cache (STOKE_CACHE_DIR) */
    uint64_t shards;          /* remote shards of the dataset (0: all local) */
    uint64_t requests;        /* HTTP requests made (each try of a retried one counts) */
    uint64_t retries;         /* of those, tries again after a failure */
    uint64_t bytes;           /* body bytes received */
    double network_wait_s;    /* threads' time in requests and in others' downloads, summed */
    uint64_t cache_hits;      /* shards opened from the cache */
    uint64_t cache_misses;    /* shards downloaded into the cache */
    uint64_t cache_evictions; /* copies this dataset removed to stay under the cap */
    uint64_t cache_bytes;     /* bytes downloaded into the cache */
} stoke_remote_stats;

/* Fills *out (at most out->size bytes of it; fields past that are left alone) for a tar
 * dataset: STOKE_OK (all counters 0 and shards 0 when every shard is local), or STOKE_EINVAL
 * for NULL arguments, out->size 0 or a dataset that is not an open tar dataset.  Thread-safe. */
STOKE_API int stoke_tar_remote_stats(const stoke_dataset *ds, stoke_remote_stats *out);
/* The same counters for an npy dataset read with io=remote: shards is the number of remote
 * files (1, or 2 with labels; 0 for local files, with every counter 0), the cache fields 0.
 * STOKE_OK, or STOKE_EINVAL as above for a dataset that is not an open npy dataset. */
STOKE_API int stoke_npy_remote_stats(const stoke_dataset *ds, stoke_remote_stats *out);

/* Sidecar indexes (docs/sources.md, "Sidecar indexes"): for every local shard of `pattern`
 * (tar:PATTERN's pattern: braces and globs, no options), walks its member headers, reads it
 * whole for its CRC-32 (with zlib: STOKE_FEATURE_ZLIB; the shard cache checks its downloads
 * against it) and writes SHARD.idx next to it (atomically: a temporary name, then rename),
 * which a remote tar source fetches in one request instead of walking the shard.  fn (may be NULL)
 * is called after each shard with its path, size and member count; non-zero stops
 * (STOKE_ECANCELED).  Returns STOKE_OK, or the first shard's error (a URL: STOKE_EINVAL; a corrupt
 * tar: STOKE_EFORMAT; the index not written: STOKE_EIO), with the message in stoke_last_error(). */
typedef int (*stoke_tar_index_fn)(void *ctx, const char *shard, uint64_t shard_bytes,
                                  uint64_t members);
STOKE_API int stoke_tar_write_index(const char *pattern, stoke_tar_index_fn fn, void *ctx);
/* As stoke_tar_write_index, with each index written to DIR/NAME.idx instead (NAME the shard's
 * file name: a URL's last path segment, its query left out), so that shards already in a
 * store can be indexed: an http(s):// or s3:// shard (credentials, endpoint and retries as a
 * remote tar source's) is downloaded once, whole, into an unlinked file of dir, walked and
 * checksummed there; put the .idx files next to the shards (a store: upload them under the
 * same prefix).  dir NULL: stoke_tar_write_index (URLs are then STOKE_EINVAL).  fn gets the
 * shard as a URL without credentials.  Errors as stoke_tar_write_index's, and STOKE_EINVAL
 * when dir is not a directory, the download's (STOKE_ENOENT for a 404, STOKE_EIO, ...). */
STOKE_API int stoke_tar_write_index_to(const char *pattern, const char *dir, stoke_tar_index_fn fn,
                                       void *ctx);

/* ---- the cache of remote shards -------------------------------------------------------------
 * STOKE_CACHE_DIR holds whole copies of remote shards, shared by the processes of a node
 * (docs/sources.md, "The cache").  These read and empty such a directory; `dir` NULL means
 * STOKE_CACHE_DIR (STOKE_EINVAL when it is not set). */

/* One complete copy (the pointer is valid during the callback only). */
typedef struct stoke_cache_entry {
    const char *name; /* its file name in the directory: HASH-BASE (BASE: the URL's last part) */
    uint64_t bytes;
    int64_t atime; /* last read, seconds since the epoch (eviction removes the oldest) */
    int in_use;    /* a process has it open: eviction and clear leave it */
} stoke_cache_entry;

typedef struct stoke_cache_info {
    uint32_t size;          /* set by the caller to sizeof(stoke_cache_info) */
    uint32_t limit_default; /* 1: STOKE_CACHE_LIMIT unset or 0 (limit computed, below) */
    uint64_t limit;         /* the cap in bytes (the default's value now) */
    uint64_t entries;       /* complete copies */
    uint64_t bytes;         /* their bytes */
    uint64_t partial_bytes; /* downloads in progress (.part files) */
    char dir[1024];         /* the directory listed */
    uint64_t stale_bytes;   /* .part files no process downloads (left by one that died; the
                               next run or stoke_cache_clear removes them) */
} stoke_cache_info;

/* Calls fn (may be NULL) for each complete copy in dir, least recently read first; a nonzero
 * return of fn stops the listing and is returned.  *info (may be NULL; at most info->size
 * bytes written) gets the totals and the cap.  Returns STOKE_OK, STOKE_EINVAL (no directory,
 * info->size 0), STOKE_ENOENT (dir does not exist), STOKE_EIO (it cannot be read), with
 * stoke_last_error() set.  Writes nothing.  Thread-safe. */
STOKE_API int stoke_cache_list(const char *dir, int (*fn)(void *ctx, const stoke_cache_entry *e),
                               void *ctx, stoke_cache_info *info);

/* Removes every copy of dir that no process has open, the lock files no process holds and
 * the temporary files of downloads whose process is gone; copies in use stay.  *removed and
 * *kept (may be NULL) get the counts of copies.  Returns as stoke_cache_list.  Safe while
 * other processes use the cache (they download again what they need).  Thread-safe. */
STOKE_API int stoke_cache_clear(const char *dir, uint64_t *removed, uint64_t *kept);

/* ---- images ---------------------------------------------------------------------------------
 * DIR/<class>/.../<file>.jpg|.jpeg (extensions in any case; subdirectories of a class count):
 * the class directories sorted by name (byte order) are labels 0..C-1; each class's files
 * sorted by path (byte order) follow one another in class order: that is the canonical index.
 * Other files are ignored (a warning counts those with other image extensions).  Each sample is
 * one JPEG decoded with libjpeg-turbo (only the rows and columns the output needs, with
 * DCT-domain downscaling when the crop is much larger than the output), converted to RGB
 * (grayscale and CMYK too), resampled with an antialiased filter to image_size x image_size:
 *   eval  (default): resize the short side to image_size / 0.875, center crop (torchvision's
 *                    Resize(256) + CenterCrop(224) for 224);
 *   train:           RandomResizedCrop(image_size, scale=(0.08, 1), ratio=(3/4, 4/3)) and a
 *                    horizontal flip with probability 1/2, drawn from (seed, epoch, index)
 *                    only: reproducible, and the same for any number of workers.  The epoch
 *                    comes from the loader (the dataset's set_epoch); 0 until one is set.
 * Output "data": u8 (0..255) or f32 (v / 255, then (x - mean[c]) / std[c] when normalize),
 * shape (3, S, S) for CHW or (S, S, 3) for HWC.  EXIF orientation is ignored (as torchvision's
 * decode by default).  Files are read with pread() into a per-worker buffer.
 * Errors at open: STOKE_ENOENT / STOKE_EIO for a missing or unreadable DIR, STOKE_ENOENT when
 * DIR has no class directories or a class has no JPEG, STOKE_ENOTSUP in a build without
 * libjpeg-turbo.  Errors of get(): STOKE_EFORMAT for data that is not a JPEG ("not a JPEG (PNG
 * image)") or a corrupt one (truncated, bad Huffman data, ...), STOKE_EIO / STOKE_ENOENT for a
 * file that cannot be read or is no longer a regular file ("is a FIFO, not a regular file":
 * never a blocking open), STOKE_ELIMIT for a file over 256 MiB or an image whose decode needs
 * more than max_decode_bytes (its dimensions named); every message names the file. */

typedef enum stoke_images_layout {
    STOKE_IMAGES_CHW = 0, /* (3, S, S): the default, as torchvision's tensors */
    STOKE_IMAGES_HWC = 1  /* (S, S, 3) */
} stoke_images_layout;

typedef struct stoke_images_opts {
    uint32_t size;  /* sizeof(stoke_images_opts): set by opts_init */
    int image_size; /* output side S, 1..8192; default 224 */
    int train;      /* 1: train transform; 0: eval (default) */
    int layout;     /* stoke_images_layout; default STOKE_IMAGES_CHW */
    int dtype;      /* STOKE_DTYPE_U8 (default) or STOKE_DTYPE_F32 */
    int normalize;  /* f32 only: (v / 255 - mean[c]) / std[c]; default 0 */
    float mean[3];  /* on the 0..1 scale, e.g. 0.485, 0.456, 0.406; default 0 */
    float std[3];   /* > 0, e.g. 0.229, 0.224, 0.225; default 1 */
    uint64_t seed;  /* augmentation seed (train); default 0 */
    /* Appended (a caller built against the struct without it, whose size ends before it, gets
     * the default): the most memory one decode may need (docs/sources.md, "Limits"); an image
     * needing more is STOKE_ELIMIT from get().  Default 256 MiB; at least 1 MiB */
    uint64_t max_decode_bytes;
} stoke_images_opts;

/* Fills *opts with the defaults above.  NULL does nothing. */
STOKE_API void stoke_images_opts_init(stoke_images_opts *opts);

/* Scans `dir` (read only during the call) into *out (the caller owns it: stoke_dataset_close);
 * opts NULL: the defaults.  Returns STOKE_OK or the errors above; also STOKE_EINVAL for out
 * NULL, an empty dir, opts->size too small, a bad image_size, layout or dtype, std <= 0,
 * normalize with u8, or max_decode_bytes below 1 MiB; STOKE_ENOMEM.  On failure *out is left empty
 * (safe to stoke_dataset_close).  Thread-safe; the dataset's get() is too. */
STOKE_API int stoke_images_open(const char *dir, const stoke_images_opts *opts, stoke_dataset *out);

/* Number of classes of an open images dataset (0 if ds is not one).  Thread-safe. */
STOKE_API uint32_t stoke_images_num_classes(const stoke_dataset *ds);
/* Name of class `label` (its directory name), or NULL for a label out of range or ds not an
 * images dataset.  Owned by the dataset: valid until stoke_dataset_close. */
STOKE_API const char *stoke_images_class_name(const stoke_dataset *ds, uint32_t label);
/* Path of sample `index` relative to DIR, or NULL (as above).  Owned by the dataset. */
STOKE_API const char *stoke_images_path(const stoke_dataset *ds, uint64_t index);

#ifdef __cplusplus
}
#endif
#endif
