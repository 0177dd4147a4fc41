/* Private to the remote files: remote.c (the pool, its slots and the request engine: reads,
 * read_many through a libcurl multi handle, whole-file fetches, retries), remote_stream.c (files
 * read front to back as their body arrives, on the engine's tries) and remote_aws.c (S3:
 * credentials, region and endpoint from the environment and ~/.aws, s3:// URLs turned into the
 * endpoint's, Signature V4 signing).  Built with libcurl only.  See remote.h. */
#ifndef STOKE_SOURCES_REMOTE_INTERNAL_H
#define STOKE_SOURCES_REMOTE_INTERNAL_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "sources/remote.h"

/* A pool's S3 settings, read once at its create (remote_aws.c). */
typedef struct stoke__remote_aws {
    char region[64];
    char *endpoint;          /* AWS_ENDPOINT_URL(_S3) without a trailing '/'; NULL: AWS */
    char *userpwd;           /* "key:secret"; NULL: unsigned requests */
    struct curl_slist *hdrs; /* x-amz-content-sha256 (and x-amz-security-token) */
    char sigv4[96];          /* "aws:amz:REGION:s3" */
} stoke__remote_aws;

/* Fills *a (zeroed by the caller): the endpoint from AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL,
 * the credentials from the environment, else the profile (AWS_PROFILE or "default") of the
 * credentials and config files, as the AWS tools do, and the region (default us-east-1).
 * Returns 0, or STOKE_EINVAL (an endpoint not http:// or https://, a bad region, AWS_PROFILE
 * without keys), STOKE_ENOMEM, with why set (never a secret).  Free with
 * stoke__remote_aws_free, after a failure too. */
int stoke__remote_aws_init(stoke__remote_aws *a, char *why, size_t why_len);
/* Frees what *a holds, the secret cleared first.  Thread-safe on distinct a. */
void stoke__remote_aws_free(stoke__remote_aws *a);

/* The URL to request for s3://BUCKET/KEY `url` (shown: url for messages, without user info):
 * path-style on the endpoint when there is one, else AWS's virtual host (path-style for a
 * dotted bucket), the key percent-encoded; malloc'd into *req.  0, or STOKE_EINVAL (not
 * s3://BUCKET/KEY), STOKE_ENOMEM, with why set. */
int stoke__remote_aws_url(const stoke__remote_aws *a, const char *url, const char *shown,
                          char **req, char *why, size_t why_len);

/* Sets h's headers and authentication for the next request of a file: for s3 (nonzero), S3's
 * headers, and Signature V4 (CURLOPT_AWS_SIGV4) when there are credentials; otherwise none
 * (user:password in an http(s) URL goes as Basic). */
void stoke__remote_aws_sign(const stoke__remote_aws *a, CURL *h, int s3);

/* s without leading and trailing white space (the end cleared in place). */
char *stoke__remote_trim(char *s);
/* The value of `key` in section [section] of the INI file at path (AWS's credentials and config
 * files: lines trimmed, '#' and ';' start a comment line, the first `key = value` of the
 * section): malloc'd, or NULL (no such key, no file). */
char *stoke__remote_ini_get(const char *path, const char *section, const char *key);

/* ---- the request engine (remote.c), shared with the streams (remote_stream.c) ---- */

#define FG_SLOTS 64                                /* slots of the workers: slot % 64 */
#define SLOTS    (FG_SLOTS + STOKE__REMOTE_BG_MAX) /* then the background downloaders' */

typedef struct multi multi; /* remote.c's */

typedef struct counters {
    _Atomic uint64_t requests, retries_done, bytes, wait_ns;
} counters;

typedef struct slot {
    pthread_mutex_t lock; /* held for a whole read: guards h, err and mu */
    CURL *h;              /* NULL until the slot's first read */
    char err[CURL_ERROR_SIZE];
    multi *mu; /* NULL until the slot's first read_many of two or more */
} slot;

struct stoke__remote_pool {
    slot s[SLOTS];
    int connections; /* requests at once of a read_many (STOKE_REMOTE_CONNECTIONS) */
    unsigned retries;
    int check_version; /* STOKE_REMOTE_CHECK_VERSION at create: validators compared (1) */
    long timeout_s;
    uint64_t stream_ahead; /* a stream's bytes received, not read yet (STOKE_STREAM_AHEAD) */
    char *ca_bundle;
    stoke__remote_aws aws; /* S3, from the environment and ~/.aws at create */
    counters *n;        /* a shared mapping: a forked worker's requests are counted in the parent */
    struct fetcher *fe; /* the whole-file fetches' shared transfers (remote_fetch.c); NULL until
                           the first fetch */
    pthread_mutex_t fe_lock; /* guards fe and what it holds (its locking rules: remote_fetch.c) */
    pthread_cond_t fe_cond;  /* a fetch ended */
    _Atomic int fe_alone;    /* no lane could start once: said (remote_fetch.c, fetch_here) */
};

typedef struct xfer {
    CURL *h;
    char *buf;                    /* the destination: n bytes for the file's [off, off + n) */
    int fd;                       /* or, when >= 0, this file: byte off + i written at i (pwrite) */
    struct stoke__remote_lane *q; /* or, when not NULL, this stream lane's queue (appended) */
    int werr;                     /* errno of a failed write to fd */
    size_t n, got;                /* got: bytes of buf filled, from buf[0] */
    uint64_t off;                 /* file offset of buf[0] */
    uint64_t pos;                 /* file offset of the next body byte */
    long status;                  /* of the final response (after redirects) */
    int body;                     /* the body started: pos is set */
    int enough;                   /* stopped on purpose: buf is full (a 200 sends the whole file) */
    int bad_range;                /* the body started past the byte asked for */
    int bad_cr;           /* a 206 without a Content-Range of one range, or with another length */
    uint64_t most;        /* when not 0: the file's bytes past this are not taken (over: some
                             came, or a header said the file is longer) */
    const char *most_why; /* what set most, for the message */
    int over;
    uint64_t total; /* the file's size, when has_total */
    int has_total;
    uint64_t cr_start, cr_end; /* Content-Range's first and last bytes, when has_cr */
    int has_cr;
    int cr_total; /* ... and it said the file's size (total) */
    /* the last try's 206 was all there but ended before the range asked for (a server that
     * caps a range's bytes): progress, the rest asked for at once */
    int capped;
    /* the response's Content-Length, when has_clen and not encoded (a 200's: the file's size,
     * for a server that ignores ranges) */
    uint64_t clen;
    int has_clen, encoded;
    char encoding[24];       /* Content-Encoding's value, when encoded */
    long retry_after;        /* seconds; -1 when absent */
    _Atomic uint64_t *seen;  /* when not NULL: raised to the file's size as soon as a 206
                                that says it is taken (its body starts) */
    _Atomic uint64_t *seen2; /* ... and this one too (a fetch's: its chunks after the first
                                may be out once it is not 0) */
    void (*said)(void *ctx); /* when not NULL: called after an answer raised seen2 (no lock
                                held: stoke__remote_fetch's lanes wake on it) */
    void *said_ctx;
    const int *stop; /* when not NULL and nonzero: give up (stoke__remote_fetch) */
    /* when not NULL: the file's validator, which this transfer's answers must repeat (or
     * record: the first); changed: this try's did not (its body is not taken) */
    stoke__remote_tag *tag;
    int changed;
    int check;        /* the pool's STOKE_REMOTE_CHECK_VERSION: compare with tag */
    char etag[160];   /* this try's answer's ETag as messages show it; "" when none */
    char lastmod[64]; /* ... and its Last-Modified */
    uint64_t etag_hash, lastmod_hash; /* what they are compared by: the whole value's */
    char err[512];                    /* the start of an error response's body */
    size_t errlen;
    size_t before;               /* got when the try began */
    uint64_t first_us, total_us; /* the last try's microseconds from its request sent to its
                                    first byte, and to its end */
} xfer;

/* libcurl's header and body callbacks of a transfer (ctx: its xfer), remote_answer.c: the
 * answer's status, ranges and validators, and its body taken into x's destination (none of it
 * when the answer is of another version of the file than x->tag's: x->changed). */
size_t stoke__remote_on_header(char *data, size_t size, size_t nmemb, void *ctx);
size_t stoke__remote_on_body(char *data, size_t size, size_t nmemb, void *ctx);

/* Slot slot_i (as stoke__remote_read's) locked, with its handle: the slot, or NULL
 * (STOKE_ENOMEM, why set naming f). */
slot *stoke__remote_slot_take(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f,
                              char *why, size_t why_len);
/* The tries of transfer x on slot s's handle (s->lock held, or s a thread's own), with the
 * retries and backoff of a read: 0, or the error with why set. */
int stoke__remote_tries(stoke__remote_pool *p, slot *s, const stoke__remote_file *f, xfer *x,
                        char *why, size_t why_len);
/* Read x (a transfer into x->buf) on a lane of the pool's fetches when this process has them
 * (remote_fetch.c), in slot slot_i (held for the call, as a fetch), before every chunk waiting:
 * 1 with *rc (0, or the error with why set), or 0 when there are no lanes, or one fetching
 * whole files (the caller reads on its slot's handle).  So a process with fetches opens no
 * connection besides the lanes'. */
int stoke__remote_lanes_read(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f,
                             xfer *x, int *rc, char *why, size_t why_len);
/* remote_fetch.c: the fetches' transfers freed (destroy), or dropped without closing their
 * connections, which are the parent's (a fork's child). */
void stoke__remote_fetcher_free(stoke__remote_pool *p, int child);

/* A new easy handle with the pool's settings, its errors into s->err. */
CURL *stoke__remote_handle_new(const stoke__remote_pool *p, slot *s);
/* The request of one try of x on h (x->h = h), before it runs: a GET of the bytes from the
 * first missing one. */
void stoke__remote_try_begin(stoke__remote_pool *p, CURL *h, const stoke__remote_file *f, xfer *x);
/* The outcome of a try of x that ended with c (counted): 0 (done: full, or the file ended), 1
 * (retry), or a negative code with why set. */
int stoke__remote_try_end(stoke__remote_pool *p, const stoke__remote_file *f, xfer *x, CURLcode c,
                          const char *serr, char *why, size_t why_len);
/* The wait before retry `attempt`, in ms (exponential, jittered, at least the server's
 * Retry-After). */
uint64_t stoke__remote_backoff_ms(unsigned attempt, long retry_after_s, uint64_t *rng);
/* Sleeps stoke__remote_backoff_ms (in 50 ms steps when x can be stopped, to see it). */
void stoke__remote_backoff(unsigned attempt, long retry_after_s, uint64_t *rng, const xfer *x);
/* A stream lane's body bytes, from on_body (remote_stream.c): 0, or -1 out of memory. */
int stoke__remote_lane_append(struct stoke__remote_lane *l, const char *data, size_t n);
/* 1 (and l marked paused) when lane l must not take more bytes now (the cap): on_body
 * pauses the transfer (CURL_WRITEFUNC_PAUSE), the stream resumes it once they are read. */
int stoke__remote_lane_full(struct stoke__remote_lane *l);

#endif
