/* Remote files through libcurl (remote.h): the pool and its slots, and the request engine:
 * byte-range GETs with keep-alive per worker slot, several at once through a slot's multi
 * handle (read_many), whole-file fetches, retries with backoff.  S3's settings, URLs and
 * Signature V4 are remote_aws.c's; one answer's headers, version check and body,
 * remote_answer.c's; credentials kept out of messages, remote_redact.c's. */
#define _GNU_SOURCE
#include "sources/remote.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/internal.h"

int stoke__remote_is_url(const char *path)
{
    return path && (strncasecmp(path, "http://", 7) == 0 || strncasecmp(path, "https://", 8) == 0 ||
                    strncasecmp(path, "s3://", 5) == 0);
}

void stoke__remote_file_free(stoke__remote_file *f)
{
    if (!f)
        return;
    free(f->url);
    free(f->req);
    if (f->tag)
        free(atomic_load(&f->tag->v));
    free(f->tag);
    memset(f, 0, sizeof(*f));
}

int stoke__remote_file_pin(stoke__remote_file *f, char *why, size_t why_len)
{
    if (f->tag)
        return STOKE_OK;
    if (!(f->tag = calloc(1, sizeof(*f->tag)))) {
        stoke__fmt(why, why_len, "out of memory");
        return STOKE_ENOMEM;
    }
    return STOKE_OK;
}

int stoke__remote_tag_differs(stoke__remote_tag *t, const char *v, int adopt, const char **had)
{
    char *mine = atomic_load(&t->v);
    if (!mine) {
        char *copy = adopt ? strdup(v) : NULL;
        if (!copy || atomic_compare_exchange_strong(&t->v, &mine, copy))
            return 0;
        free(copy); /* another's came first (mine is it now): compared with it */
    }
    if (had)
        *had = mine;
    return mine[0] == v[0] && strncmp(mine, v, STOKE__REMOTE_TAG_KEY) != 0;
}

#ifndef STOKE_HAVE_LIBCURL

int stoke__remote_pool_create(stoke__remote_pool **out, char *why, size_t why_len)
{
    if (out) /* NULL from the other stubs below, for the message */
        *out = NULL;
    stoke__fmt(why, why_len,
               "stoke was built without libcurl (Debian libcurl4-openssl-dev): http://, "
               "https:// and s3:// sources are not available");
    return STOKE_ENOTSUP;
}
void stoke__remote_pool_destroy(stoke__remote_pool *p)
{
    (void)p;
}
void stoke__remote_pool_fork_prepare(stoke__remote_pool *p)
{
    (void)p;
}
void stoke__remote_pool_fork_parent(stoke__remote_pool *p)
{
    (void)p;
}
void stoke__remote_pool_fork_child(stoke__remote_pool *p)
{
    (void)p;
}
void stoke__remote_pool_stats(const stoke__remote_pool *p, stoke__remote_stats *out)
{
    (void)p;
    memset(out, 0, sizeof(*out));
}
int stoke__remote_pool_connections(const stoke__remote_pool *p)
{
    (void)p;
    return 1;
}
int stoke__remote_pool_checks(const stoke__remote_pool *p)
{
    (void)p;
    return 0;
}
int stoke__remote_file_init(const stoke__remote_pool *p, const char *url, stoke__remote_file *f,
                            char *why, size_t why_len)
{
    (void)p;
    (void)url;
    memset(f, 0, sizeof(*f));
    return stoke__remote_pool_create(NULL, why, why_len);
}
int stoke__remote_read(stoke__remote_pool *p, int slot, const stoke__remote_file *f, void *buf,
                       size_t n, uint64_t off, size_t *got, uint64_t *total, char *why,
                       size_t why_len)
{
    (void)p, (void)slot, (void)f, (void)buf, (void)n, (void)off, (void)total;
    *got = 0;
    return stoke__remote_pool_create(NULL, why, why_len);
}
int stoke__remote_fetch(stoke__remote_pool *p, int slot, const stoke__remote_file *f, int fd,
                        uint64_t expect, uint64_t most, const char *most_why,
                        _Atomic uint64_t *seen, const int *stop, uint64_t *size, char *why,
                        size_t why_len)
{
    (void)p, (void)slot, (void)f, (void)fd, (void)expect, (void)most, (void)most_why, (void)seen,
        (void)stop;
    *size = 0;
    return stoke__remote_pool_create(NULL, why, why_len);
}

int stoke__remote_read_many(stoke__remote_pool *p, int slot, stoke__remote_req *r, size_t n,
                            size_t *failed, char *why, size_t why_len)
{
    (void)p, (void)slot, (void)r;
    *failed = 0;
    if (n == 0)
        return STOKE_OK;
    return stoke__remote_pool_create(NULL, why, why_len);
}
int stoke__remote_read_each(stoke__remote_pool *p, int slot, stoke__remote_req *r, size_t n,
                            char *why, size_t why_len)
{
    size_t failed;
    return stoke__remote_read_many(p, slot, r, n, &failed, why, why_len);
}

#else /* STOKE_HAVE_LIBCURL */

#include "sources/remote_internal.h"
#include "stoke/version.h"

#define STR_(x)         #x
#define STR(x)          STR_(x)
#define BACKOFF_BASE_MS 100u   /* the first retry waits 50..100 ms, each next one twice that */
#define BACKOFF_CAP_MS  10000u /* ... up to 5..10 s */
/* A try slower than this many bytes a second for STOKE_REMOTE_TIMEOUT seconds (libcurl's speed
 * over its last few seconds; a paused stream's transfer is not measured) times out: a server
 * that trickles is bounded as one that stalls (docs/sources.md, "Faults") */
#define SPEED_FLOOR     1024L
#define DEFAULT_RETRIES 6u
#define DEFAULT_TIMEOUT 30u /* seconds without a byte before a try is abandoned */

/* A slot's handles for several requests at once (read_many), made by its first. */
typedef struct multi {
    CURLM *m;
    int n;                         /* handles */
    CURL *h[STOKE__REMOTE_BG_MAX]; /* their error texts: err[i] */
    char err[STOKE__REMOTE_BG_MAX][CURL_ERROR_SIZE];
} multi;

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc;
static void curl_init(void)
{
    curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

static int env_number(stoke_env_id id, uint64_t dflt, uint64_t max)
{
    uint64_t v;
    if (!stoke__env_u64(id, &v))
        return (int)dflt;
    if (v > max) {
        stoke__log(STOKE_LOG_WARN, "%s=%" PRIu64 " is more than %" PRIu64 ": using %" PRIu64,
                   stoke__env_name(id), v, max, max);
        v = max;
    }
    return (int)v;
}

int stoke__remote_pool_create(stoke__remote_pool **out, char *why, size_t why_len)
{
    *out = NULL;
    pthread_once(&curl_once, curl_init);
    if (curl_init_rc != CURLE_OK) {
        stoke__fmt(why, why_len, "libcurl's global init failed: %s",
                   curl_easy_strerror(curl_init_rc));
        return STOKE_EIO;
    }
    stoke__remote_pool *p = calloc(1, sizeof(*p));
    if (!p) {
        stoke__fmt(why, why_len, "out of memory");
        return STOKE_ENOMEM;
    }
    for (int i = 0; i < SLOTS; i++)
        pthread_mutex_init(&p->s[i].lock, NULL);
    pthread_mutex_init(&p->fe_lock, NULL);
    pthread_cond_init(&p->fe_cond, NULL);
    p->n = mmap(NULL, sizeof(*p->n), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p->n == MAP_FAILED) {
        p->n = NULL;
        stoke__fmt(why, why_len, "out of memory (a shared page for the counters)");
        stoke__remote_pool_destroy(p);
        return STOKE_ENOMEM;
    }
    p->check_version = 1;
    stoke__env_bool(STOKE_ENV_REMOTE_CHECK_VERSION, &p->check_version);
    p->retries = (unsigned)env_number(STOKE_ENV_REMOTE_RETRIES, DEFAULT_RETRIES, 100);
    p->connections = env_number(STOKE_ENV_REMOTE_CONNECTIONS, STOKE__REMOTE_CONNECTIONS_DEFAULT,
                                STOKE__REMOTE_BG_MAX);
    p->timeout_s = env_number(STOKE_ENV_REMOTE_TIMEOUT, DEFAULT_TIMEOUT, 86400);
    uint64_t ahead = STOKE__REMOTE_STREAM_AHEAD_DEFAULT;
    stoke__env_size(STOKE_ENV_STREAM_AHEAD, &ahead);
    p->stream_ahead = ahead;
    if (p->timeout_s < 1) { /* (0 would be "no timeout" to libcurl: a stall waits for ever) */
        stoke__log(STOKE_LOG_WARN, "STOKE_REMOTE_TIMEOUT=0: a try needs a second at least: "
                                   "using 1");
        p->timeout_s = 1;
    }
    const char *ca = stoke__env_str(STOKE_ENV_CA_BUNDLE);
    int rc = STOKE_OK;
    if (ca && !(p->ca_bundle = strdup(ca))) {
        stoke__fmt(why, why_len, "out of memory");
        rc = STOKE_ENOMEM;
    }
    if (!rc)
        rc = stoke__remote_aws_init(&p->aws, why, why_len);
    if (rc) {
        stoke__remote_pool_destroy(p);
        return rc;
    }
    *out = p;
    return STOKE_OK;
}

void stoke__remote_pool_stats(const stoke__remote_pool *p, stoke__remote_stats *out)
{
    memset(out, 0, sizeof(*out));
    if (!p || !p->n)
        return;
    out->requests = atomic_load(&p->n->requests);
    out->retries = atomic_load(&p->n->retries_done);
    out->bytes = atomic_load(&p->n->bytes);
    out->wait_ns = atomic_load(&p->n->wait_ns);
}

int stoke__remote_pool_connections(const stoke__remote_pool *p)
{
    return p->connections < 1 ? 1 : p->connections;
}

int stoke__remote_pool_checks(const stoke__remote_pool *p)
{
    return p->check_version;
}

void stoke__remote_pool_destroy(stoke__remote_pool *p)
{
    if (!p)
        return;
    stoke__remote_stats st;
    stoke__remote_pool_stats(p, &st);
    if (st.requests)
        stoke__log(STOKE_LOG_DEBUG,
                   "remote: %" PRIu64 " request(s), %" PRIu64 " retr%s, %" PRIu64 " bytes",
                   st.requests, st.retries, st.retries == 1 ? "y" : "ies", st.bytes);
    for (int i = 0; i < SLOTS; i++) {
        if (p->s[i].h)
            curl_easy_cleanup(p->s[i].h);
        multi *mu = p->s[i].mu;
        for (int k = 0; mu && k < mu->n; k++)
            curl_easy_cleanup(mu->h[k]);
        if (mu && mu->m)
            curl_multi_cleanup(mu->m);
        free(mu);
        pthread_mutex_destroy(&p->s[i].lock);
    }
    stoke__remote_fetcher_free(p, 0);
    pthread_mutex_destroy(&p->fe_lock);
    pthread_cond_destroy(&p->fe_cond);
    stoke__remote_aws_free(&p->aws);
    free(p->ca_bundle);
    if (p->n)
        munmap(p->n, sizeof(*p->n));
    free(p);
}

void stoke__remote_pool_fork_prepare(stoke__remote_pool *p)
{
    for (int i = 0; p && i < SLOTS; i++)
        pthread_mutex_lock(&p->s[i].lock);
    if (p) /* after the slots: no fetch runs, its lanes are idle */
        pthread_mutex_lock(&p->fe_lock);
}

void stoke__remote_pool_fork_parent(stoke__remote_pool *p)
{
    if (p)
        pthread_mutex_unlock(&p->fe_lock);
    for (int i = 0; p && i < SLOTS; i++)
        pthread_mutex_unlock(&p->s[i].lock);
}

void stoke__remote_pool_fork_child(stoke__remote_pool *p)
{
    for (int i = 0; p && i < SLOTS; i++) {
        p->s[i].h = NULL; /* the parent's connections: left alone, never closed here */
        p->s[i].mu = NULL;
        pthread_mutex_unlock(&p->s[i].lock);
    }
    if (p) /* no fetch runs (prepare took every slot): the transfers are idle, the parent's */
        stoke__remote_fetcher_free(p, 1);
}

/* ---- URLs --------------------------------------------------------------------------------- */

/* `url` for messages (stoke__remote_redact's), malloc'd; NULL when out of memory. */
static char *redact(const char *url)
{
    size_t n = stoke__remote_redact(NULL, 0, url) + 1;
    char *out = malloc(n);
    if (out)
        stoke__remote_redact(out, n, url);
    return out;
}

int stoke__remote_file_init(const stoke__remote_pool *p, const char *url, stoke__remote_file *f,
                            char *why, size_t why_len)
{
    memset(f, 0, sizeof(*f));
    f->url = redact(url);
    if (!f->url)
        goto oom;
    if (strncasecmp(url, "s3://", 5) != 0) {
        if (!(f->req = strdup(url)))
            goto oom;
        return STOKE_OK;
    }
    f->s3 = 1;
    return stoke__remote_aws_url(&p->aws, url, f->url, &f->req, why, why_len);
oom:
    stoke__fmt(why, why_len, "out of memory");
    return STOKE_ENOMEM;
}

/* ---- one read ----------------------------------------------------------------------------- */

/* The S3 error's <Code> and <Message>, an HTML page's <title>, or the start of any other body,
 * into out (": text"; "" when there is none). */
static void error_text_raw(const xfer *x, char *out, size_t n)
{
    out[0] = 0;
    const char *c = strstr(x->err, "<Code>"), *m = strstr(x->err, "<Message>");
    if (c) {
        const char *ce = strstr(c, "</Code>"), *me = m ? strstr(m, "</Message>") : NULL;
        if (ce)
            stoke__fmt(out, n, ": %.*s%s%.*s", (int)(ce - c - 6), c + 6, me ? ": " : "",
                       me ? (int)(me - m - 9) : 0, me ? m + 9 : "");
        return;
    }
    const char *t = strstr(x->err, "<title>"), *te = t ? strstr(t, "</title>") : NULL;
    if (te) { /* an HTML error page: its title */
        stoke__fmt(out, n, ": %.*s", (int)(te - t - 7), t + 7);
        return;
    }
    size_t k = 0;
    char text[160];
    for (size_t i = 0; i < x->errlen && k + 1 < sizeof(text); i++) /* one line of printable */
        if (isprint((unsigned char)x->err[i]))
            text[k++] = x->err[i];
        else if (k && text[k - 1] != ' ')
            text[k++] = ' ';
    text[k] = 0;
    if (k)
        stoke__fmt(out, n, ": %s", stoke__remote_trim(text));
}

/* The start of an error answer's text for its message, credentials it echoes masked. */
static void error_text(const xfer *x, char *out, size_t n)
{
    error_text_raw(x, out, n);
    stoke__remote_mask_secrets(out);
}

static int retryable_curl(CURLcode c)
{
    switch (c) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_PARTIAL_FILE:
    case CURLE_GOT_NOTHING:
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM: return 1;
    default: return 0;
    }
}

static int retryable_status(long s)
{
    return s == 408 || s == 429 || s == 500 || s == 502 || s == 503 || s == 504;
}

CURL *stoke__remote_handle_new(const stoke__remote_pool *p, slot *s)
{
    CURL *h = curl_easy_init();
    if (!h)
        return NULL;
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* no SIGALRM from DNS timeouts in threads */
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, s->err);
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(h, CURLOPT_MAXREDIRS, 5L);
#if LIBCURL_VERSION_NUM >= 0x075500
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
#endif
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, p->timeout_s < 10 ? p->timeout_s : 10L);
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, SPEED_FLOOR); /* a stall, or a trickle */
    curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, p->timeout_s);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_2TLS);
    curl_easy_setopt(h, CURLOPT_USERAGENT,
                     "stoke/" STR(STOKE_VERSION_MAJOR) "." STR(STOKE_VERSION_MINOR) "." STR(
                         STOKE_VERSION_PATCH));
    if (p->ca_bundle)
        curl_easy_setopt(h, CURLOPT_CAINFO, p->ca_bundle);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, stoke__remote_on_header);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, stoke__remote_on_body);
    return h;
}

static int stopped(const xfer *x)
{
    return x->stop && __atomic_load_n(x->stop, __ATOMIC_RELAXED);
}

static int on_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal,
                       curl_off_t ulnow)
{
    (void)dltotal, (void)dlnow, (void)ultotal, (void)ulnow;
    return stopped(user); /* nonzero: libcurl ends the transfer (CURLE_ABORTED_BY_CALLBACK) */
}

/* The wait before retry `attempt` (exponential, jittered, at least the server's Retry-After). */
uint64_t stoke__remote_backoff_ms(unsigned attempt, long retry_after_s, uint64_t *rng)
{
    uint64_t ms = BACKOFF_BASE_MS << (attempt < 16 ? attempt : 16);
    if (ms > BACKOFF_CAP_MS)
        ms = BACKOFF_CAP_MS;
    *rng ^= *rng << 13, *rng ^= *rng >> 7, *rng ^= *rng << 17; /* xorshift64 */
    ms = ms / 2 + *rng % (ms / 2 + 1);                         /* jitter: [ms/2, ms] */
    if (retry_after_s > 0 && (uint64_t)retry_after_s * 1000 > ms)
        ms = (uint64_t)retry_after_s * 1000 > 60000 ? 60000 : (uint64_t)retry_after_s * 1000;
    return ms;
}

/* Sleeps that long (in 50 ms steps when x can be stopped, to see it). */
void stoke__remote_backoff(unsigned attempt, long retry_after_s, uint64_t *rng, const xfer *x)
{
    uint64_t ms = stoke__remote_backoff_ms(attempt, retry_after_s, rng);
    for (uint64_t step; ms && !stopped(x); ms -= step) {
        step = x->stop && ms > 50 ? 50 : ms;
        struct timespec ts = {(time_t)(step / 1000), (long)(step % 1000) * 1000000L};
        while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
}

/* The request of one try of x on h (x->h = h), before it runs. */
void stoke__remote_try_begin(stoke__remote_pool *p, CURL *h, const stoke__remote_file *f, xfer *x)
{
    char range[64];
    x->h = h;
    x->before = x->got;
    if (x->n == SIZE_MAX) /* the whole file, its size not known yet */
        stoke__fmt(range, sizeof(range), "%" PRIu64 "-", x->off + x->got);
    else
        stoke__fmt(range, sizeof(range), "%" PRIu64 "-%" PRIu64, x->off + x->got,
                   x->off + x->n - 1);
    x->body = x->enough = x->bad_range = x->has_cr = x->cr_total = x->capped = x->changed = 0;
    x->bad_cr = x->over = x->has_clen = 0;
    x->etag[0] = x->lastmod[0] = 0;
    x->check = p->check_version; /* (the pool's: each dataset keeps its own setting) */
    x->status = 0;
    x->errlen = 0;
    x->err[0] = 0;
    x->retry_after = -1;
    curl_easy_setopt(h, CURLOPT_URL, f->req);
    curl_easy_setopt(h, CURLOPT_RANGE, range);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, x);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, x);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, x->stop ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, x->stop ? on_progress : NULL);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, x);
    stoke__remote_aws_sign(&p->aws, h, f->s3);
}

/* The outcome of a try of x that ended with c: 0 (done: full, or the file ended), 1 (retry),
 * or a negative code with why set. */
int stoke__remote_try_end(stoke__remote_pool *p, const stoke__remote_file *f, xfer *x, CURLcode c,
                          const char *serr, char *why, size_t why_len)
{
    CURL *h = x->h;
    size_t before = x->before;
    atomic_fetch_add(&p->n->requests, 1);
    atomic_fetch_add(&p->n->bytes, (uint64_t)(x->got - before));
    long st = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &st);
    curl_off_t sent = 0, first = 0, all = 0; /* from the start: connected, first byte, end */
    curl_easy_getinfo(h, CURLINFO_PRETRANSFER_TIME_T, &sent);
    curl_easy_getinfo(h, CURLINFO_STARTTRANSFER_TIME_T, &first);
    curl_easy_getinfo(h, CURLINFO_TOTAL_TIME_T, &all);
    x->first_us = first > sent ? (uint64_t)(first - sent) : 0;
    x->total_us = all > sent ? (uint64_t)(all - sent) : 0;
    if (x->werr) {
        stoke__fmt_short(why, why_len, "GET %s: writing the download failed at byte %zu: %s",
                         f->url, x->got, strerror(x->werr));
        return STOKE_EIO;
    }
    if (x->changed) { /* not retried: every try would get the new version */
        const char *had = atomic_load(&x->tag->v);
        int e = had[0] == 'E';
        stoke__fmt_short(why, why_len, "GET %s: the file changed %s: its %s is %s, it was %s",
                         f->url, x->tag->pass ? "while it was read" : "since the open",
                         e ? "ETag" : "Last-Modified", e ? x->etag : x->lastmod,
                         had + STOKE__REMOTE_TAG_KEY);
        return STOKE_EIO;
    }
    if (x->enough && c == CURLE_WRITE_ERROR)
        c = CURLE_OK;
    if (x->bad_cr) { /* not retried: the same server answers the same way */
        if (!x->has_cr)
            stoke__fmt_short(why, why_len,
                             "GET %s: HTTP 206 without a Content-Range: which bytes it holds is "
                             "not said (none taken)",
                             f->url);
        else if (x->cr_total && x->cr_end >= x->cr_start && x->cr_end >= x->total)
            stoke__fmt_short(why, why_len,
                             "GET %s: HTTP 206: its Content-Range (bytes %" PRIu64 "-%" PRIu64
                             "/%" PRIu64 ") ends past the size it says (none taken)",
                             f->url, x->cr_start, x->cr_end, x->total);
        else if (x->has_clen || x->cr_end < x->cr_start)
            stoke__fmt_short(why, why_len,
                             "GET %s: HTTP 206: its Content-Range (bytes %" PRIu64 "-%" PRIu64
                             ") and Content-Length (%" PRIu64 ") do not agree (none taken)",
                             f->url, x->cr_start, x->cr_end, x->clen);
        else
            stoke__fmt_short(why, why_len,
                             "GET %s: HTTP 206: its body is not the bytes its Content-Range "
                             "(bytes %" PRIu64 "-%" PRIu64 ") says",
                             f->url, x->cr_start, x->cr_end);
        return STOKE_EIO;
    }
    if (x->over) {
        stoke__fmt_short(why, why_len,
                         "GET %s: the file is longer than the %" PRIu64
                         " bytes this download may take (%s)",
                         f->url, x->most, x->most_why ? x->most_why : "its size");
        return STOKE_EIO;
    }
    if (x->bad_range) {
        stoke__fmt_short(why, why_len,
                         "GET %s: the server sent bytes from %" PRIu64 " for a range "
                         "from %" PRIu64,
                         f->url, x->pos, x->off + before);
        return STOKE_EIO;
    }
    if (x->encoded && (st == 200 || st == 206)) { /* bytes that are not the file's */
        stoke__fmt_short(why, why_len,
                         "GET %s: HTTP %ld: the body is Content-Encoding: %s, not the file's "
                         "bytes (stoke asks for none: store the shards without a "
                         "Content-Encoding)",
                         f->url, st, x->encoding);
        return STOKE_EIO;
    }
    if (c == CURLE_OK && st == 416) { /* the range starts at or past the end */
        uint64_t at = x->off + x->got;
        if (x->has_total && x->total > at) { /* a file that goes on past it: a fault */
            stoke__fmt_short(why, why_len,
                             "GET %s: HTTP 416 for a range from byte %" PRIu64
                             ", in a file of %" PRIu64 " bytes (its Content-Range)",
                             f->url, at, x->total);
            return 1;
        }
        if (!x->has_total)
            x->total = x->off + x->got, x->has_total = 1;
        return 0;
    }
    if (c == CURLE_OK && (st == 200 || st == 206)) {
        if (st == 200 && !x->enough) /* the whole file came: it ends here */
            x->total = x->pos, x->has_total = 1;
        uint64_t end = x->n == SIZE_MAX ? UINT64_MAX : x->off + x->n;
        if (x->has_total && x->total < end)
            end = x->total;
        if (x->off + x->got >= end)
            return 0;
        stoke__fmt_short(why, why_len,
                         "GET %s: HTTP %ld: the body ended at byte %" PRIu64 " of %" PRIu64, f->url,
                         st, x->off + x->got, end);
        /* the whole answer came (curl checked its length), with bytes, and its Content-Range
         * said it ends there: the server caps a range's size, not a fault */
        x->capped = st == 206 && x->has_cr && x->got > before && x->cr_end + 1 == x->pos;
        return 1; /* a short body: continue from there */
    }
    if (c == CURLE_OK) {
        char text[384];
        error_text(x, text, sizeof(text));
        if (st >= 300 && st < 400 && f->s3 && !text[0]) /* (stoke__remote_aws_sign) */
            stoke__strlcpy(text,
                           ": a redirect, which an S3 request does not follow (the bucket "
                           "is in another region, or behind another endpoint: AWS_REGION, "
                           "AWS_ENDPOINT_URL)",
                           sizeof(text));
        stoke__fmt_short(why, why_len, "GET %s: HTTP %ld%s", f->url, st, text);
        if (retryable_status(st))
            return 1;
        return st == 404 || st == 410 ? STOKE_ENOENT : STOKE_EIO;
    }
    if (st && st != 200 && st != 206) /* the status and curl's reason, both */
        stoke__fmt_short(why, why_len, "GET %s: HTTP %ld: %s%s%s", f->url, st,
                         curl_easy_strerror(c), serr[0] ? ": " : "", serr);
    else
        stoke__fmt_short(why, why_len, "GET %s: %s%s%s", f->url, curl_easy_strerror(c),
                         serr[0] ? ": " : "", serr);
    return retryable_curl(c) ? 1 : STOKE_EIO;
}

/* One try: GET of [off + got, off + n) appended to x.  Returns as try_end: 0 (done: full, or
 * the file ended), 1 (retry), or a negative code with why set. */
static int try_once(stoke__remote_pool *p, CURL *h, const stoke__remote_file *f, xfer *x,
                    const char *serr, char *why, size_t why_len)
{
    stoke__remote_try_begin(p, h, f, x);
    return stoke__remote_try_end(p, f, x, curl_easy_perform(h), serr, why, why_len);
}

/* The slot of slot_i: a worker's (>= 0) among the first FG_SLOTS, a background downloader's
 * (STOKE__REMOTE_BG(k) < 0) after them. */
static slot *slot_of(stoke__remote_pool *p, int slot_i)
{
    if (slot_i >= 0)
        return &p->s[(unsigned)slot_i % FG_SLOTS];
    return &p->s[FG_SLOTS + (unsigned)(-1 - (long)slot_i) % STOKE__REMOTE_BG_MAX];
}

#define TRY_NOW 2 /* retry_loop: no try made yet */

/* The tries of transfer x on slot s's handle (s->lock held), from try `attempt` whose outcome
 * is rc (TRY_NOW: not made yet; 1: to retry): 0, or the error with why set. */
static int retry_loop(stoke__remote_pool *p, slot *s, const stoke__remote_file *f, xfer *x,
                      unsigned attempt, int rc, char *why, size_t why_len)
{
    uint64_t rng = stoke__now_ns() ^ ((uint64_t)(uintptr_t)s * 0x9E3779B97F4A7C15u) ^ x->off;
    rng |= 1;
    for (;; attempt++) {
        /* after a capped answer (progress) the rest is asked for at once, not counted as a try */
        while (rc == TRY_NOW || (rc == 1 && x->capped && !stopped(x))) {
            s->err[0] = 0;
            rc = try_once(p, s->h, f, x, s->err, why, why_len);
        }
        if (rc != 1 && !(rc < 0 && stopped(x)))
            return rc;
        if (stopped(x)) {
            stoke__fmt_short(why, why_len, "GET %s: stopped (the dataset is closing)", f->url);
            return STOKE_EIO;
        }
        if (attempt >= p->retries) {
            size_t l = strlen(why);
            stoke__fmt(why + l, why_len - l, " (after %u tries)", attempt + 1);
            return STOKE_EIO;
        }
        atomic_fetch_add(&p->n->retries_done, 1);
        stoke__log(STOKE_LOG_DEBUG, "remote: %s; retry %u of %u", why, attempt + 1, p->retries);
        stoke__remote_backoff(attempt, x->retry_after, &rng, x);
        rc = TRY_NOW;
    }
}

slot *stoke__remote_slot_take(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f,
                              char *why, size_t why_len)
{
    slot *s = slot_of(p, slot_i);
    pthread_mutex_lock(&s->lock);
    if (!s->h && !(s->h = stoke__remote_handle_new(p, s))) {
        pthread_mutex_unlock(&s->lock);
        stoke__fmt_short(why, why_len, "GET %s: cannot create a libcurl handle", f->url);
        return NULL;
    }
    return s;
}

int stoke__remote_tries(stoke__remote_pool *p, slot *s, const stoke__remote_file *f, xfer *x,
                        char *why, size_t why_len)
{
    return retry_loop(p, s, f, x, 0, TRY_NOW, why, why_len);
}

/* The tries of one transfer x through slot slot_i: 0, or the error with why set. */
static int transfer(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f, xfer *x,
                    char *why, size_t why_len)
{
    uint64_t t0 = stoke__now_ns();
    int rc;
    if (!stoke__remote_lanes_read(p, slot_i, f, x, &rc, why, why_len)) {
        slot *s = stoke__remote_slot_take(p, slot_i, f, why, why_len);
        if (!s)
            return STOKE_ENOMEM;
        rc = retry_loop(p, s, f, x, 0, TRY_NOW, why, why_len);
        pthread_mutex_unlock(&s->lock);
    }
    if (slot_i >= 0) /* a background download is no one's wait */
        atomic_fetch_add(&p->n->wait_ns, stoke__now_ns() - t0);
    return rc;
}

/* Slot s's multi handle with k easy handles (s->lock held): 0, or STOKE_ENOMEM. */
static int multi_ready(const stoke__remote_pool *p, slot *s, int k)
{
    if (!s->mu && !(s->mu = calloc(1, sizeof(*s->mu))))
        return STOKE_ENOMEM;
    multi *mu = s->mu;
    if (!mu->m) {
        if (!(mu->m = curl_multi_init()))
            return STOKE_ENOMEM;
        /* keep the connections between batches (the default cap follows the handles added,
         * none between two batches) */
        curl_multi_setopt(mu->m, CURLMOPT_MAXCONNECTS, (long)STOKE__REMOTE_BG_MAX);
    }
    while (mu->n < k) {
        CURL *h = stoke__remote_handle_new(p, s);
        if (!h)
            return STOKE_ENOMEM;
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, mu->err[mu->n]);
        mu->h[mu->n++] = h;
    }
    return STOKE_OK;
}

/* read_many (each 0) and read_each (each 1: a request that fails for good does not end the
 * others; its code in its rc). */
static int read_batch(stoke__remote_pool *p, int slot_i, stoke__remote_req *r, size_t n, int each,
                      size_t *failed, char *why, size_t why_len)
{
    *failed = n;
    for (size_t j = 0; j < n; j++)
        r[j].got = 0, r[j].total = UINT64_MAX, r[j].first_us = r[j].total_us = 0, r[j].rc = 0;
    if (n == 0)
        return STOKE_OK;
    uint64_t t0 = stoke__now_ns();
    slot *s = stoke__remote_slot_take(p, slot_i, r[0].f, why, why_len);
    if (!s) {
        *failed = 0;
        return STOKE_ENOMEM;
    }
    xfer *x = calloc(n, sizeof(*x));
    /* each request's own message: a request that ends after the failing one (in the same
     * round, or retried later) must not overwrite the failing one's */
    char(*msg)[STOKE__MSG_MAX] = calloc(n, sizeof(*msg));
    int k = stoke__remote_pool_connections(p);
    if (k > (int)n)
        k = (int)n;
    int rc = x && msg && (k < 2 || multi_ready(p, s, k) == STOKE_OK) ? STOKE_OK : STOKE_ENOMEM;
    if (rc) {
        stoke__fmt_short(why, why_len, "GET %s: out of memory for %zu requests", r[0].f->url, n);
        *failed = 0;
    }
    for (size_t j = 0; x && j < n; j++)
        x[j] = (xfer){.buf = r[j].buf, .fd = -1, .n = r[j].n, .off = r[j].off, .tag = r[j].f->tag};
    /* the first try of each, k at once on the multi handle; a try to repeat is left for after
     * (marked by retry[j]), tried again on the slot's own handle with the usual backoff */
    unsigned char *retry = rc ? NULL : calloc(n, 1);
    if (!rc && !retry) {
        rc = STOKE_ENOMEM;
        *failed = 0;
        stoke__fmt(why, why_len, "out of memory");
    }
    size_t next = 0;
    if (!rc && k >= 2) {
        multi *mu = s->mu;
        size_t on[STOKE__REMOTE_BG_MAX]; /* the request on handle i, n when idle */
        int active = 0;
        for (int i = 0; i < k; i++)
            on[i] = n;
        while (!rc) {
            for (int i = 0; i < k && next < n; i++) {
                if (on[i] != n)
                    continue;
                stoke__remote_try_begin(p, mu->h[i], r[next].f, &x[next]);
                if (r[next].n == 0) { /* nothing to ask for */
                    next++;
                    continue;
                }
                mu->err[i][0] = 0;
                if (curl_multi_add_handle(mu->m, mu->h[i]) != CURLM_OK) {
                    retry[next++] = 2; /* tried alone below */
                    continue;
                }
                on[i] = next++;
                active++;
            }
            if (!active)
                break;
            int still = 0;
            CURLMcode mc = curl_multi_perform(mu->m, &still);
            CURLMsg *m;
            int q;
            while (mc == CURLM_OK && (m = curl_multi_info_read(mu->m, &q)) != NULL) {
                if (m->msg != CURLMSG_DONE)
                    continue;
                int i = 0;
                while (i < k - 1 && mu->h[i] != m->easy_handle)
                    i++;
                CURLcode c = m->data.result;
                curl_multi_remove_handle(mu->m, mu->h[i]);
                size_t j = on[i];
                on[i] = n;
                active--;
                int t =
                    stoke__remote_try_end(p, r[j].f, &x[j], c, mu->err[i], msg[j], sizeof(msg[j]));
                if (t == 1)
                    retry[j] = 1;
                else if (t < 0)
                    r[j].rc = t;
                if (t < 0 && !each && !rc)
                    rc = t, *failed = j;
            }
            if (mc != CURLM_OK && !rc) {
                size_t j = 0; /* the error is the round's: named after a request in flight */
                for (int i = k - 1; i >= 0; i--)
                    if (on[i] != n)
                        j = on[i];
                stoke__fmt_short(msg[j], sizeof(msg[j]), "GET %s: %s", r[j].f->url,
                                 curl_multi_strerror(mc));
                rc = STOKE_EIO;
                *failed = j;
            }
            if (!rc && still)
                curl_multi_poll(mu->m, NULL, 0, 1000, NULL);
        }
        for (int i = 0; i < k; i++) /* after an error: the others stop */
            if (on[i] != n)
                curl_multi_remove_handle(mu->m, mu->h[i]);
    }
    for (size_t j = 0; !rc && j < n; j++) { /* the rest one at a time: without a multi handle,
                                               retries */
        int t = 0; /* retry_loop from a try to repeat starts from its message (its tries) */
        if ((j >= next && r[j].n) || retry[j] == 2)
            t = retry_loop(p, s, r[j].f, &x[j], 0, TRY_NOW, msg[j], sizeof(msg[j]));
        else if (retry[j] == 1)
            t = retry_loop(p, s, r[j].f, &x[j], 0, 1, msg[j], sizeof(msg[j]));
        if (t < 0)
            r[j].rc = t;
        if (t < 0 && !each)
            rc = t, *failed = j;
    }
    if (rc && msg && *failed < n && msg[*failed][0]) /* the failing request's own message */
        stoke__shorten(why, why_len, msg[*failed]);  /* its end: the status and reason */
    for (size_t j = 0; x && j < n; j++) {
        r[j].got = x[j].got;
        r[j].first_us = x[j].first_us;
        r[j].total_us = x[j].total_us;
        if (x[j].has_total)
            r[j].total = x[j].total;
    }
    pthread_mutex_unlock(&s->lock);
    free(retry);
    free(msg);
    free(x);
    atomic_fetch_add(&p->n->wait_ns, stoke__now_ns() - t0);
    return rc;
}

int stoke__remote_read_many(stoke__remote_pool *p, int slot_i, stoke__remote_req *r, size_t n,
                            size_t *failed, char *why, size_t why_len)
{
    return read_batch(p, slot_i, r, n, 0, failed, why, why_len);
}

int stoke__remote_read_each(stoke__remote_pool *p, int slot_i, stoke__remote_req *r, size_t n,
                            char *why, size_t why_len)
{
    size_t failed;
    return read_batch(p, slot_i, r, n, 1, &failed, why, why_len);
}

int stoke__remote_read(stoke__remote_pool *p, int slot_i, const stoke__remote_file *f, void *buf,
                       size_t n, uint64_t off, size_t *got, uint64_t *total, char *why,
                       size_t why_len)
{
    *got = 0;
    if (n == 0)
        return STOKE_OK;
    xfer x = {.buf = buf, .fd = -1, .n = n, .off = off, .tag = f->tag};
    int rc = transfer(p, slot_i, f, &x, why, why_len);
    *got = x.got;
    if ((rc == STOKE_OK || x.changed) && total && x.has_total)
        *total = x.total;
    return rc;
}

#endif /* STOKE_HAVE_LIBCURL */
