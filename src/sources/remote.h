/* Private to the built-in sources: files behind http://, https:// and s3:// URLs, read by byte
 * range through libcurl (remote.c; S3's settings and signing: remote_aws.c).  See
 * docs/sources.md, "Remote shards".
 *
 * A pool holds the connections: its whole-file fetches' (remote_fetch.c: threads with a
 * handle each, started by the first fetch, joined by destroy), and one libcurl handle per
 * slot (a worker: slot = worker % 64; a background downloader of the cache:
 * STOKE__REMOTE_BG(k), k < STOKE__REMOTE_BG_MAX), created by the slot's first read and kept,
 * so that consecutive reads of one worker reuse its connection (HTTP keep-alive), and the
 * settings read from the environment once, at create
 * (S3 credentials, region and endpoint, retries, timeout).  A read retries what can pass
 * (timeouts, refused or reset connections, 408/429/5xx, a body cut short: continued from the
 * byte it stopped at) with exponential backoff and jitter.  Credentials never appear in a
 * message or a log line.
 *
 * Built without libcurl, stoke__remote_pool_create fails with STOKE_ENOTSUP naming the
 * library; stoke__remote_is_url still recognises the schemes, so the sources refuse such a
 * path with that message rather than "no such file". */
#ifndef STOKE_SOURCES_REMOTE_H
#define STOKE_SOURCES_REMOTE_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* 1 when path starts with http://, https:// or s3:// (any case), else 0. */
int stoke__remote_is_url(const char *path);

/* s for messages, into out (n bytes, truncated as snprintf; out may be NULL when n is 0):
 * every "scheme://user:password@" in it (a spec may hold several URLs) without its
 * "user:password@" (up to the authority's last '@', as curl reads it; after a ':' that comes
 * before any '/', '?' or '#', up to the URL's last '@': a password holding a raw '/', '?'
 * or '#', after a user that may hold a raw '@'), and the values of its
 * URLs' secret query parameters (a presigned URL's X-Amz-Signature, X-Amz-Credential,
 * X-Amz-Security-Token, ...; any named *signature, *credential, *token, *secret, *password,
 * sig, key, apikey or AWSAccessKeyId, or whose last part after '-', '_' or '.' is one of these
 * four: x-api-key) replaced by "***".  remote_redact.c.  A URL ends at white space or ','.  Returns
 * the length of the whole result (as snprintf).  Thread-safe. */
size_t stoke__remote_redact(char *out, size_t n, const char *s);

/* Masks, in place, the values an error body echoing a request shows of its credentials (after
 * a name holding one, as stoke__remote_redact's parameters, or ending in authorization or
 * cookie, and its ':' or '='): "***".  remote_redact.c. */
void stoke__remote_mask_secrets(char *s);

typedef struct stoke__remote_pool stoke__remote_pool;

/* The slots of background transfers (cache.c's downloaders): slot STOKE__REMOTE_BG(k) for
 * k in [0, STOKE__REMOTE_BG_MAX), apart from the workers' slots.  Their time is not counted in
 * wait_ns (no one waits on them). */
#define STOKE__REMOTE_BG_MAX 64
#define STOKE__REMOTE_BG(k)  (-1 - (int)(k))
/* STOKE_REMOTE_CONNECTIONS when unset: requests at once of a read_many, downloads at once of
 * a cache's read-ahead. */
#define STOKE__REMOTE_CONNECTIONS_DEFAULT 8

/* Creates a pool: 0 and *out, or STOKE_ENOTSUP (built without libcurl), STOKE_ENOMEM,
 * STOKE_EINVAL (a bad setting in the environment), with why set.  Thread-safe. */
int stoke__remote_pool_create(stoke__remote_pool **out, char *why, size_t why_len);
/* Frees the handles (closing their connections).  NULL does nothing.  No read may run. */
void stoke__remote_pool_destroy(stoke__remote_pool *p);
/* Fork hooks (dataset.h): prepare takes every slot's lock, parent releases them, child
 * releases them and drops the handles without closing them (their sockets and TLS state are
 * the parent's): the child's first read opens its own connection. */
void stoke__remote_pool_fork_prepare(stoke__remote_pool *p);
void stoke__remote_pool_fork_parent(stoke__remote_pool *p);
void stoke__remote_pool_fork_child(stoke__remote_pool *p);

/* Counters of a pool since create, its forked workers' included (atomics in a shared
 * mapping, read without a lock). */
typedef struct stoke__remote_stats {
    uint64_t requests, retries, bytes;
    uint64_t wait_ns; /* time in reads and fetches of the workers' slots, waiting for a slot's
                         lock included */
} stoke__remote_stats;
void stoke__remote_pool_stats(const stoke__remote_pool *p, stoke__remote_stats *out);
/* How many requests a read_many of the pool runs at once (STOKE_REMOTE_CONNECTIONS, at least
 * 1; 1 without libcurl). */
int stoke__remote_pool_connections(const stoke__remote_pool *p);
/* The pool's STOKE_REMOTE_CHECK_VERSION (read at its creation): 1 when validators are
 * compared (stoke__remote_tag), 0 when not (and without libcurl). */
int stoke__remote_pool_checks(const stoke__remote_pool *p);

/* A file's validator: the ETag (strong or weak) of the first answer (200 or 206) to a request
 * of it that had one, or without an ETag its Last-Modified, compared whole (a 64-bit hash of
 * it: remote.c, validator) unless the pool's STOKE_REMOTE_CHECK_VERSION is 0.  Every
 * later answer that carries the same header must repeat it (ETags compared as RFC 9110's weak
 * comparison: a "W/" aside), else its request fails with STOKE_EIO, before any of its body is
 * taken: "GET URL: the file changed since the open: its ETag is "b", it was "a"" ("... while it
 * was read" for a fetch's or a stream's own).  An answer without that header is not checked (a
 * server that sends neither: nothing is).  v is set once (compare-and-swap), then read without a
 * lock; a forked process records its own from then on. */
typedef struct stoke__remote_tag {
    /* NULL until an answer had one: 'E' (the ETag) or 'L' (the date), its hash in 16 hex
     * digits (the first STOKE__REMOTE_TAG_KEY bytes: two versions are one when these are), then
     * what messages show of it */
    _Atomic(char *) v;
    int pass; /* words it as one fetch's or stream pass's ("while it was read") */
} stoke__remote_tag;
#define STOKE__REMOTE_TAG_KEY 17

/* Validator text v (as stoke__remote_tag.v: 'E' or 'L', the hash, what messages show) against
 * t's: t without one takes a copy of v when `adopt` (v is the file's first: 0); then 1 when t
 * holds another version of the same kind (*had: t's text), 0 when the same or when they cannot
 * be told apart (t has none; an ETag and a date; out of memory taking v). */
int stoke__remote_tag_differs(stoke__remote_tag *t, const char *v, int adopt, const char **had);

/* One remote file: `url` as written (for messages: stoke__remote_redact's), and what
 * is requested (an s3:// URL becomes the endpoint's, signed). */
typedef struct stoke__remote_file {
    char *url;
    char *req;
    int s3;
    int has_crc;  /* crc is known (a sidecar index's): the cache checks a download against it */
    uint32_t crc; /* the file's CRC-32 */
    /* NULL, or the validator every request of the file is checked against from its first
     * answer on (stoke__remote_file_pin): a file read by offsets known since its open */
    stoke__remote_tag *tag;
} stoke__remote_file;

/* Fills *f for `url`: 0, or STOKE_EINVAL (not a URL we read: "s3://" without a bucket, ...),
 * STOKE_ENOMEM, with why set.  Free with stoke__remote_file_free (also after a failure). */
int stoke__remote_file_init(const stoke__remote_pool *p, const char *url, stoke__remote_file *f,
                            char *why, size_t why_len);
void stoke__remote_file_free(stoke__remote_file *f);
/* Pins f's validator (stoke__remote_tag): every request of f from now on, reads, read_many's,
 * fetches and streams, is checked against the ETag (or Last-Modified) of its first answer.
 * For a file whose bytes are read at offsets learnt once (a shard's walk or index, an .npy's
 * header): another version of the same size would give other bytes at them.  Unpinned, a
 * fetch's chunks and a stream's (one pass over the file) are still checked against each other.
 * 0, or STOKE_ENOMEM with why set. */
int stoke__remote_file_pin(stoke__remote_file *f, char *why, size_t why_len);

/* Reads n bytes at off into buf through slot `slot` (a worker's, any int >= 0, taken modulo 64;
 * or STOKE__REMOTE_BG(k)): 0, with
 * *got = n, or fewer only where the file ends (*got may be 0 past the end); *total (may be
 * NULL) gets the file's size when the server said it (Content-Range, or the Content-Length of a
 * 200 to a server that ignores ranges), else is left alone.  A 206 shorter than asked for whose
 * Content-Range says so (a server that caps a range's size) is continued at once, not retried.
 * Errors, after the retries, with why = "GET URL: reason" (the HTTP status and the server's
 * error code, or libcurl's reason): STOKE_ENOENT for 404 and 410, STOKE_EIO for the rest
 * (401 and 403 included: the message has the store's reason), and STOKE_EIO at once, not
 * retried, for an answer of another version of the file than f's validator's (stoke__remote_tag:
 * "the file changed since the open: its ETag is ..."; *total is then set as on success, so that
 * a caller that knows the file's size can say a size that changed instead).  In a process
 * where a fetch (stoke__remote_fetch) started the pool's download threads (2 or more), the read
 * runs on one of them (on its connection), before their chunks waiting.  Thread-safe; reads of
 * one slot are serialised by its lock. */
int stoke__remote_read(stoke__remote_pool *p, int slot, const stoke__remote_file *f, void *buf,
                       size_t n, uint64_t off, size_t *got, uint64_t *total, char *why,
                       size_t why_len);

/* One range read of a read_many: [off, off + n) of f into buf; got, total (UINT64_MAX when
 * the server did not say; set for a request that failed too, from its last answer),
 * first_us, total_us and rc are set by the call. */
typedef struct stoke__remote_req {
    const stoke__remote_file *f;
    void *buf;
    size_t n;
    uint64_t off;
    size_t got;
    uint64_t total;
    uint64_t first_us, total_us; /* its last try, from the request sent: to the first byte,
                                    to the end (microseconds, libcurl's times) */
    int rc; /* 0, or its error after the retries, as a read's (STOKE_ENOENT for 404, ...) */
} stoke__remote_req;

/* The reads r[0 .. n) through slot `slot` (as stoke__remote_read's), up to
 * STOKE_REMOTE_CONNECTIONS (default 8; 0 or 1: one at a time) at once on connections of
 * their own (a libcurl multi handle of the slot): the first try of each runs in parallel, the
 * tries after a failure that can pass run one at a time after them, with the backoff of a
 * read.  Returns 0 with every r[j].got and total set as a read's; or the error of the first
 * request found failing for good, as a read's (STOKE_ENOENT for 404 and 410, ...), *failed its
 * j, why that request's own message (its URL, the HTTP status, the server's or libcurl's
 * reason: requests that end after it do not replace it); the others' got are then partial.
 * Thread-safe; calls on one slot are serialised. */
int stoke__remote_read_many(stoke__remote_pool *p, int slot, stoke__remote_req *r, size_t n,
                            size_t *failed, char *why, size_t why_len);
/* As read_many, but a request that fails for good does not end the others: each one's outcome
 * is its r[j].rc (its message is not kept).  Returns 0, or an error of the whole call
 * (STOKE_ENOMEM, libcurl's multi handle failing) with why set, every rc then unknown. */
int stoke__remote_read_each(stoke__remote_pool *p, int slot, stoke__remote_req *r, size_t n,
                            char *why, size_t why_len);

/* Downloads the whole of f into fd (byte i written at offset i, pwrite), waiting in slot
 * `slot` (held for the call), as chunks (range requests of STOKE_STREAM_AHEAD / (2 x
 * STOKE_REMOTE_CONNECTIONS) bytes, 64 KiB to 64 MiB) fetched by the pool's
 * STOKE_REMOTE_CONNECTIONS download threads, each with a connection of its own, which serve
 * every fetch of the pool in progress (a worker slot's first); the first chunk alone, the
 * others once its response said the size; a 200 (ranges ignored) to the first is the whole
 * file.  With STOKE_REMOTE_CONNECTIONS 0 or 1, one request (Range: bytes=0-).  Each chunk has
 * the retries of a read (a body cut short is continued by range from its first missing byte).
 * expect: the size the file must have, 0 when not known.  Bytes past expect, else past most
 * (0: what fd's file system has free when it starts, less a hundredth of it) are never written: an
 * answer longer than that (a 200 that never ends, a header that says more) is STOKE_EIO, "the file
 * is longer than the N bytes this download may take (most_why)", not retried.  Returns 0 with *size
 * = the bytes written, which are the file's size as the server said it (Content-Range, or the
 * length of a 200's body) and `expect` when given; errors as stoke__remote_read, and
 * STOKE_EIO when the size differs ("the file is N bytes, M came") or a write to fd failed.
 * Writes nothing past the file's size; fd's size is the caller's.  seen (may be NULL): raised
 * (atomic max) to the file's size as soon as a response's header says it, before the body
 * (cache.c sizes its read-ahead from it).  stop (may be NULL): when it turns nonzero (atomic
 * store) the transfers and their retries end within about 50 ms with STOKE_EIO ("stopped").
 * Thread-safe.  A different size said by two chunks' responses: STOKE_EIO ("the file changed
 * while it was read"); a chunk's answer of another version (stoke__remote_tag) than f's
 * validator when f is pinned ("the file changed since the open: its ETag is ..."), else than
 * the fetch's first answer ("the file changed while it was read: its ETag is ..."): STOKE_EIO
 * too, and nothing more asked for. */
int stoke__remote_fetch(stoke__remote_pool *p, int slot, const stoke__remote_file *f, int fd,
                        uint64_t expect, uint64_t most, const char *most_why,
                        _Atomic uint64_t *seen, const int *stop, uint64_t *size, char *why,
                        size_t why_len);

/* A stream: files read front to back, whose bodies the caller reads as they arrive, through a
 * libcurl multi handle of the stream's own.  Read-ahead (start's `ahead`, and
 * STOKE_REMOTE_CONNECTIONS 2 or more): each file is fetched as chunks, range requests of
 * STOKE_STREAM_AHEAD / (2 x STOKE_REMOTE_CONNECTIONS) bytes (64 KiB to 64 MiB), and while the
 * caller reads one, the chunks after it (the rest of its file, then those of the files it said come
 * next, start's `next`) are requested too, up to STOKE_REMOTE_CONNECTIONS transfers at once,
 * each on a connection of its own (kept from chunk to chunk: keep-alive), bounded by bytes: a
 * chunk is requested only while the bytes requested that the caller has not read (the rest of
 * each chunk; of a file's first chunk before its response said the file's size, the whole
 * chunk) are under STOKE_STREAM_AHEAD (default 64 MiB), and the transfers ahead are paused while
 * the bytes received and not read reach it.  The chunks of a file after its first are asked for
 * once a response said the file's size.  Without read-ahead (STOKE_REMOTE_CONNECTIONS 0 or 1), a
 * file is ONE whole-file GET (Range: bytes=0-).  A server that ignores ranges (200) sends a chunk's
 * file whole on that chunk's connection.  The transfers progress only inside read() (no thread):
 * while the caller waits for the chunk it reads, and for one non-blocking round per read.  A try
 * that fails in a way that can pass (as a read's) is retried after the backoff of a read (without
 * blocking the other transfers), continued by range from the first byte not yet received; the
 * file's error after the retries is a read's ("GET URL: HTTP 404", "... (after N tries)"; a chunk
 * whose response says another file size than the file's first: "the file changed while it was
 * read"; another ETag or Last-Modified than the first answer of the same pass over the file, or
 * than f's when it is pinned: stoke__remote_tag's message) and every later read of that file
 * returns it.  Counted in the pool's stats: requests, bytes,
 * retries, and the time read() waits as wait_ns.  One thread at a time per stream; a forked
 * process must not use its parent's (its sockets are the parent's).  Built without libcurl,
 * create fails with STOKE_ENOTSUP. */
typedef struct stoke__remote_stream stoke__remote_stream;
#define STOKE__REMOTE_STREAM_AHEAD_DEFAULT ((uint64_t)64 << 20)
int stoke__remote_stream_create(stoke__remote_pool *p, stoke__remote_stream **out, char *why,
                                size_t why_len);
/* Begins file f (which must outlive its reads): the transfers of f already running ahead are
 * kept, the file read before is abandoned (its requests ended, their connections closed when
 * their bodies were not all read).  next[0 .. nnext): the files that will be started after f, in
 * that order (the pointers are kept until the next start; next may be NULL when nnext is 0); the
 * transfers ahead of files not among them are ended.  ahead: 0 fetches nothing ahead, and f in
 * chunks that start at 64 KiB and double (a caller that reads only f's start: the open's first
 * sample, then stoke__remote_stream_finish).  No request is made until a read. */
void stoke__remote_stream_start(stoke__remote_stream *st, const stoke__remote_file *f,
                                const stoke__remote_file *const *next, size_t nnext, int ahead);
/* The next n bytes of the file into buf: 0 with *got = n, or fewer where the file ends; or the
 * file's error with why set. */
int stoke__remote_stream_read(stoke__remote_stream *st, void *buf, size_t n, size_t *got, char *why,
                              size_t why_len);
/* Ends the file read and the transfers ahead; the request of the file read is read to its end
 * when at most `most` bytes of it are still to come (a chunk: without read-ahead), so that its
 * connection stays open for the stream's next request (another caller's, after a hand-over),
 * else ended (its connection closed).  The stream can be started again. */
void stoke__remote_stream_finish(stoke__remote_stream *st, size_t most);
/* Ends the transfers, frees the handles.  NULL does nothing. */
void stoke__remote_stream_destroy(stoke__remote_stream *st);

#endif
