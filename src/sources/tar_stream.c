/* The tar source's streaming mode (mode=stream; docs/sources.md, "Streaming"): an ITERABLE
 * dataset in WebDataset's model.
 *
 * Open reads the first sample of the first shard (its fields are described from it, as the
 * map-style open does from its index) and nothing of the other shards.  Each epoch, the shards
 * are put in the order of stoke_permute keyed by (seed, epoch); position i of that order goes to
 * rank i % world_size and, within the rank, to worker (i / world_size) % num_workers: every
 * shard is read by one (rank, worker) per epoch.  A worker reads its shards one after the
 * other, front to back (tar_header.c's walk one member at a time): a local one with reads, a
 * remote one in chunks (range requests) through the worker's stream (remote.h), which is told
 * the worker's next remote shards and fetches the chunks after the one read meanwhile
 * (read-ahead; the open's stream, its connection kept, is the first worker's), or through the
 * cache's local copy
 * (STOKE_CACHE_DIR; the next shards queued for the cache's background downloads).  Members become
 * samples by tar.c's rules (stoke__tar_on_member, stoke__tar_same_key, stoke__tar_build_index) and
 * are read by tar_fields.c from the sample's bytes (a window).  Samples pass through a shuffle
 * buffer of shuffle_buffer samples per worker with an RNG keyed by (seed, epoch, rank, worker).
 *
 * State and locking: everything a worker touches is its own (struct sworker, made by its first
 * next()), but for the open's stream, which one worker takes (an atomic exchange); set_epoch
 * runs while no worker does (dataset.h) and only bumps the generation the workers compare theirs
 * with.  Everything is freed by the dataset's close. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/regular.h"
#include "sources/tar_internal.h"
#include "stoke/sampler.h"

#define MAX_WORKERS 1025 /* the loader's 1024 workers and the caller's thread */
/* bytes of its last request the open reads to its end, to keep its connection */
#define OPEN_DRAIN_MAX ((size_t)256 << 10)
#define DRAIN_MAX                                                                                  \
    ((size_t)1 << 20) /* bytes after the end-of-archive block read to keep the                     \
                         connection (a tar's padding to its record size) */

/* A sample read from a shard, waiting in a shuffle buffer. */
typedef struct ssample {
    char *blob; /* the shard's bytes [off, off + len) */
    uint64_t off;
    size_t len;
    stoke__tar_loc *loc; /* nf */
    char *key;
    uint32_t shard;
    uint64_t index; /* shard << 32 | the sample's position in the shard */
} ssample;

/* The shard a worker reads, front to back. */
typedef struct sreader {
    stoke__tar_ds *t;
    int worker;
    stoke__tar_shard *s;
    int fd;                   /* a local shard's */
    stoke__remote_stream *rs; /* the worker's stream, kept from shard to shard */
    uint64_t pos;             /* bytes read */
    char *win;                /* the bytes [win_off, pos): the sample being read */
    size_t cap, len;
    uint64_t win_off;
    int rc; /* a failed read's code, why its message */
    char why[STOKE__MSG_MAX];
} sreader;

typedef struct sworker {
    uint64_t gen;       /* the generation its epoch state is of (0: none yet) */
    int nw;             /* the num_workers it was made for */
    stoke__tar_ds view; /* t's fields and shards; the index of the sample being read */
    uint32_t *mine;     /* its shards this epoch, in order */
    size_t nmine, next;
    const stoke__remote_file **rfs; /* the remote ones among them, in order: the read-ahead's */
    size_t nrfs, rstarted;          /* ... and how many were started */
    sreader rd;
    stoke__tar_iter it;
    int in_shard;
    uint64_t ordinal; /* samples of the current shard so far */
    stoke__tar_scan sc;
    char err[STOKE__MSG_MAX];
    ssample *buf; /* the shuffle buffer */
    size_t nbuf, cap;
    int exhausted; /* no shard left this epoch */
    uint64_t rng;
} sworker;

struct stoke__tar_stream {
    char spec[128];
    uint64_t gen, epoch;
    sworker *w[MAX_WORKERS];
    /* the open's stream, its connection kept: the first worker stream made in the process that
       opened takes it (so the open's connection is a worker's first), NULL after */
    stoke__remote_stream *_Atomic open_rs;
    pid_t open_pid;
};

static uint64_t rng_next(uint64_t *s)
{
    *s += 0x9E3779B97F4A7C15u;
    return stoke__mix64(*s);
}

/* The key of the shards' order of an epoch. */
static uint64_t order_key(uint64_t seed, uint64_t epoch)
{
    return stoke__mix64(seed ^ stoke__mix64(epoch ^ 0x73747265616d0000u)); /* "stream" */
}

/* Position i of the epoch's shard order. */
static uint32_t shard_at(const stoke__tar_ds *t, uint64_t key, uint64_t i)
{
    return (uint32_t)stoke_permute(i, (uint64_t)t->nshards, key);
}

/* ---- reading a shard ---------------------------------------------------------------------- */

/* The next n bytes of the shard (fewer at its end) into buf: 0, or the error in r->why. */
static int raw_read(sreader *r, char *buf, size_t n, size_t *got)
{
    const stoke__tar_ds *t = r->t;
    *got = 0;
    int rc = STOKE_OK;
    if (!r->s->remote) {
        while (*got < n) {
            ssize_t k = pread(r->fd, buf + *got, n - *got, (off_t)(r->pos + *got));
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0) {
                stoke__fmt(r->why, sizeof(r->why), "read %s failed: %s", r->s->path,
                           strerror(errno));
                rc = STOKE_EIO;
                break;
            }
            if (k == 0)
                break;
            *got += (size_t)k;
        }
    } else if (t->cache) {
        rc = stoke__cache_read(t->cache, t->pool, r->worker, &r->s->rf, 0, buf, n, r->pos, got,
                               NULL, r->why, sizeof(r->why));
    } else {
        rc = stoke__remote_stream_read(r->rs, buf, n, got, r->why, sizeof(r->why));
    }
    if (rc)
        r->rc = rc;
    return rc;
}

/* The walk's read (stoke__tar_read_fn): the walk reads forward only; every byte from where the
 * last read ended to the end of this one (the members' data the walk skips) is kept in the
 * window, which then holds the sample being read. */
static int stream_read(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    sreader *r = ctx;
    *got = 0;
    if (off < r->win_off) { /* never: the walk goes forward */
        stoke__fmt(r->why, sizeof(r->why), "tar %s: a read at byte %" PRIu64 " behind %" PRIu64,
                   r->s->path, off, r->pos);
        r->rc = STOKE_EIO;
        return -EIO;
    }
    if (off + n > r->pos) {
        uint64_t more = off + n - r->pos;
        if (off + n < off || more > (SIZE_MAX >> 2) - r->len) { /* (cap doubling: no wrap) */
            stoke__fmt(r->why, sizeof(r->why),
                       "tar %s: a member reaching byte %" PRIu64 " (from byte %" PRIu64
                       "): more than a stream's window holds (a corrupt size in its header?)",
                       r->s->path, off + n, off);
            r->rc = STOKE_EFORMAT;
            return -EINVAL;
        }
        size_t want = (size_t)more;
        if (r->len + want > r->cap) {
            size_t cap = r->cap ? r->cap : (size_t)1 << 16;
            while (cap < r->len + want)
                cap *= 2;
            char *w = realloc(r->win, cap);
            if (!w) {
                stoke__fmt(r->why, sizeof(r->why), "tar %s: out of memory for %zu bytes",
                           r->s->path, cap);
                r->rc = STOKE_ENOMEM;
                return -ENOMEM;
            }
            r->win = w;
            r->cap = cap;
        }
        size_t g = 0;
        int rc = raw_read(r, r->win + r->len, want, &g);
        r->len += g;
        r->pos += g;
        if (rc)
            return rc == STOKE_ENOMEM ? -ENOMEM : -EIO;
    }
    size_t have = r->pos > off ? (size_t)(r->pos - off) : 0;
    *got = have < n ? have : n;
    if (*got)
        memcpy(buf, r->win + (off - r->win_off), *got);
    return 0;
}

/* Drops the window's bytes before `off`. */
static void window_drop(sreader *r, uint64_t off)
{
    size_t k = (size_t)(off - r->win_off);
    if (k && r->len > k)
        memmove(r->win, r->win + k, r->len - k);
    r->len -= k;
    r->win_off = off;
}

static void shard_end(sworker *w)
{
    if (!w->in_shard)
        return;
    stoke__tar_iter_free(&w->it);
    if (w->rd.fd >= 0)
        close(w->rd.fd);
    w->rd.fd = -1;
    for (size_t j = 0; j < w->sc.n; j++)
        free(w->sc.m[j].path);
    w->sc.n = 0;
    w->in_shard = 0;
}

/* Starts shard `shard` (no byte read yet): STOKE_OK, or the error with msg. */
static int shard_begin(stoke__tar_ds *t, sworker *w, int worker, uint32_t shard, char *msg,
                       size_t msg_len)
{
    sreader *r = &w->rd;
    stoke__tar_shard *s = &t->shards[shard];
    r->t = t;
    r->worker = worker;
    r->s = s;
    r->fd = -1;
    r->pos = r->len = 0;
    r->win_off = 0;
    r->rc = 0;
    r->why[0] = 0;
    w->sc.shard = shard;
    w->sc.n = 0;
    w->ordinal = 0;
    uint64_t size = UINT64_MAX; /* a stream's: found at its end */
    if (!s->remote) {
        struct stat st;
        char why[160];
        r->fd = stoke__open_regular(AT_FDCWD, s->path, &st, why, sizeof(why));
        if (r->fd < 0) {
            int rc = r->fd;
            r->fd = -1;
            stoke__fmt(msg, msg_len, "tar %s: %s", s->path, why);
            return rc;
        }
        size = (uint64_t)st.st_size;
    } else {
        /* the worker's remote shards after this one: fetched meanwhile (read-ahead) */
        size_t at = w->rstarted < w->nrfs ? ++w->rstarted : w->nrfs;
        const stoke__remote_file *const *next = at < w->nrfs ? w->rfs + at : NULL;
        size_t nnext = w->nrfs - at;
        if (t->cache) {
            stoke__cache_prefetch(t->cache, t->pool, next, NULL, nnext);
        } else {
            if (!r->rs && getpid() == t->st->open_pid)
                r->rs = atomic_exchange(&t->st->open_rs, NULL);
            if (!r->rs) {
                int rc = stoke__remote_stream_create(t->pool, &r->rs, r->why, sizeof(r->why));
                if (rc) {
                    stoke__fmt(msg, msg_len, "tar %s: %s", s->path, r->why);
                    return rc;
                }
            }
            /* the open (no shards of its own) reads only the first sample: nothing ahead */
            stoke__remote_stream_start(r->rs, &s->rf, next, nnext, w->nrfs > 0);
        }
    }
    if (stoke__tar_iter_init(&w->it, size, stream_read, r, w->err, sizeof(w->err)) != 0) {
        if (r->fd >= 0)
            close(r->fd);
        r->fd = -1;
        stoke__fmt(msg, msg_len, "tar %s: out of memory", s->path);
        return STOKE_ENOMEM;
    }
    w->in_shard = 1;
    return STOKE_OK;
}

/* After the end-of-archive block: the rest of a remote stream (a tar's padding) is read, so
 * that its connection serves the next shard. */
static void shard_drain(sworker *w)
{
    if (!w->rd.s->remote || w->rd.t->cache)
        return;
    char tmp[16384];
    size_t got = sizeof(tmp), total = 0;
    while (got == sizeof(tmp) && total < DRAIN_MAX &&
           stoke__remote_stream_read(w->rd.rs, tmp, sizeof(tmp), &got, w->rd.why,
                                     sizeof(w->rd.why)) == STOKE_OK)
        total += got;
}

/* The sample of the first n members of w->sc, whose bytes end at `end`, into *out (the
 * members and the bytes dropped): STOKE_OK, or the error with msg. */
static int sample_finish(stoke__tar_ds *t, sworker *w, size_t n, uint64_t end, ssample *out,
                         char *msg, size_t msg_len)
{
    stoke__tar_ds *v = &w->view;
    stoke__tar_scan one = w->sc;
    one.n = n;
    v->shard_of = NULL, v->key_at = NULL, v->loc = NULL, v->keys = NULL;
    int rc = stoke__tar_build_index(t->st->spec, v, &one);
    if (!rc && v->n != 1) /* never: the members share a key */
        rc =
            stoke__fail(STOKE_EFORMAT, "tar %s: a sample of %" PRIu64 " keys", w->rd.s->path, v->n);
    char *blob = rc ? NULL : malloc(end > w->rd.win_off ? (size_t)(end - w->rd.win_off) : 1);
    if (!rc && !blob)
        rc = stoke__fail(STOKE_ENOMEM, "tar %s: out of memory", w->rd.s->path);
    if (rc) {
        stoke__fmt(msg, msg_len, "%s", stoke_last_error());
        free(v->loc);
        free(v->keys);
    } else {
        memcpy(blob, w->rd.win, (size_t)(end - w->rd.win_off));
        *out = (ssample){.blob = blob,
                         .off = w->rd.win_off,
                         .len = (size_t)(end - w->rd.win_off),
                         .loc = v->loc,
                         .key = v->keys,
                         .shard = one.shard,
                         .index = (uint64_t)one.shard << 32 | (w->ordinal & 0xffffffffu)};
    }
    w->ordinal++;
    free(v->shard_of);
    free(v->key_at);
    v->shard_of = NULL, v->key_at = NULL, v->loc = NULL, v->keys = NULL;
    window_drop(&w->rd, end);
    for (size_t j = 0; j < n; j++)
        free(w->sc.m[j].path);
    memmove(w->sc.m, w->sc.m + n, (w->sc.n - n) * sizeof(*w->sc.m));
    w->sc.n -= n;
    return rc;
}

/* The next sample of w's shards into *out: STOKE_OK; STOKE_EEND when they are all read; or a
 * shard's error with msg and *index (the shard is then left: the next call reads the next). */
static int pull(stoke__tar_ds *t, sworker *w, int worker, ssample *out, uint64_t *index, char *msg,
                size_t msg_len)
{
    for (;;) {
        if (!w->in_shard) {
            if (w->next == w->nmine)
                return STOKE_EEND;
            uint32_t shard = w->mine[w->next++];
            int rc = shard_begin(t, w, worker, shard, msg, msg_len);
            if (rc) {
                *index = (uint64_t)shard << 32;
                return rc;
            }
        }
        const char *path;
        uint64_t hdr, data, size;
        int rc = stoke__tar_iter_next(&w->it, &path, &hdr, &data, &size);
        if (rc == 0) {
            size_t before = w->sc.n;
            if (stoke__tar_on_member(&w->sc, path, hdr, data, size) != 0)
                rc = STOKE_ENOMEM;
            else if (w->sc.n > before && w->sc.n >= 2 &&
                     !stoke__tar_same_key(&w->sc.m[w->sc.n - 2], &w->sc.m[w->sc.n - 1]))
                return sample_finish(t, w, w->sc.n - 1, hdr, out, msg, msg_len);
            else
                continue;
        }
        if (rc == STOKE_EEND) {
            shard_drain(w);
            int some = w->sc.n > 0;
            if (some)
                rc = sample_finish(t, w, w->sc.n, w->rd.pos, out, msg, msg_len);
            shard_end(w);
            if (!some)
                continue;
            return rc;
        }
        /* the shard fails: named with the request's own message (URL, HTTP status) */
        *index = (uint64_t)w->sc.shard << 32 | (w->ordinal & 0xffffffffu);
        if (w->rd.rc) {
            rc = w->rd.rc;
            stoke__fmt(msg, msg_len, "tar stream: %s", w->rd.why);
        } else if (rc == STOKE_ENOMEM) {
            stoke__fmt(msg, msg_len, "tar %s: out of memory", w->rd.s->path);
        } else {
            stoke__fmt(msg, msg_len, "tar %s: at byte %" PRIu64 ": %s", w->rd.s->path,
                       w->it.err_off, w->err);
        }
        shard_end(w);
        return rc;
    }
}

/* ---- the dataset -------------------------------------------------------------------------- */

static void sample_free(ssample *s)
{
    free(s->blob);
    free(s->loc);
    free(s->key);
}

static void worker_free(sworker *w)
{
    if (!w)
        return;
    shard_end(w);
    for (size_t j = 0; j < w->nbuf; j++)
        sample_free(&w->buf[j]);
    free(w->buf);
    free(w->sc.m);
    free(w->mine);
    free(w->rfs);
    free(w->rd.win);
    stoke__remote_stream_destroy(w->rd.rs);
    free(w);
}

/* w's state for the epoch: its shards, an empty buffer, its RNG. */
static int worker_reset(stoke__tar_ds *t, sworker *w, int worker, int nw)
{
    struct stoke__tar_stream *st = t->st;
    shard_end(w);
    for (size_t j = 0; j < w->nbuf; j++)
        sample_free(&w->buf[j]);
    w->nbuf = 0;
    uint64_t world = (uint64_t)t->world, slots = world * (uint64_t)nw;
    uint64_t first = (uint64_t)t->rank + world * (uint64_t)worker,
             key = order_key(t->seed, st->epoch);
    size_t n = 0;
    for (uint64_t i = first; i < (uint64_t)t->nshards; i += slots)
        n++;
    uint32_t *mine = realloc(w->mine, (n ? n : 1) * sizeof(*mine));
    if (!mine)
        return STOKE_ENOMEM;
    w->mine = mine;
    n = 0;
    for (uint64_t i = first; i < (uint64_t)t->nshards; i += slots)
        mine[n++] = shard_at(t, key, i);
    w->nmine = n;
    w->next = 0;
    const stoke__remote_file **rfs = realloc(w->rfs, (n ? n : 1) * sizeof(*rfs));
    if (!rfs)
        return STOKE_ENOMEM;
    w->rfs = rfs;
    w->nrfs = w->rstarted = 0;
    for (size_t j = 0; j < n; j++)
        if (t->shards[mine[j]].remote)
            rfs[w->nrfs++] = &t->shards[mine[j]].rf;
    w->exhausted = 0;
    w->rng = stoke__mix64(stoke__mix64(stoke__mix64(t->seed) ^ st->epoch) ^ (uint64_t)t->rank) ^
             (uint64_t)worker;
    atomic_store_explicit(&w->view.epoch, st->epoch, memory_order_relaxed);
    w->gen = st->gen;
    w->nw = nw;
    return STOKE_OK;
}

static sworker *worker_new(stoke__tar_ds *t)
{
    sworker *w = calloc(1, sizeof(*w));
    if (!w)
        return NULL;
    memcpy(&w->view, t, sizeof(*t)); /* fields, shards, options: read-only from here on */
    w->view.shard_of = NULL, w->view.key_at = NULL, w->view.loc = NULL, w->view.keys = NULL;
    w->view.n = 0;
    w->rd.fd = -1;
    w->gen = UINT64_MAX; /* reset by its first next(), set_epoch or not */
    w->cap = t->shuffle_buffer > 1 ? (size_t)t->shuffle_buffer : 1;
    return w;
}

/* Writes sample s into dst (tar_fields.c, from the sample's bytes). */
static int sample_read(sworker *w, const ssample *s, void *const dst[], int64_t len[], int worker,
                       char *msg, size_t msg_len)
{
    stoke__tar_ds *v = &w->view;
    uint32_t shard = s->shard;
    uint64_t key_at = 0;
    v->n = 1;
    v->shard_of = &shard;
    v->key_at = &key_at;
    v->keys = s->key;
    v->loc = s->loc;
    v->index_base = s->index;
    stoke__tar_io io = {.worker = worker, .win = s->blob, .win_off = s->off, .win_len = s->len};
    int rc = STOKE_OK;
    for (int k = 0; k < v->nf && !rc; k++)
        if (dst[k])
            rc = stoke__tar_read_field(v, 0, k, dst[k], len ? &len[k] : NULL, &io, msg, msg_len);
    v->n = 0;
    v->shard_of = NULL, v->key_at = NULL, v->loc = NULL, v->keys = NULL;
    return rc;
}

static int stream_next(void *user, int worker, int num_workers, void *const dst[], int64_t len[],
                       uint64_t *index, char *msg, size_t msg_len)
{
    stoke__tar_ds *t = user;
    struct stoke__tar_stream *st = t->st;
    int nw = num_workers > 0 ? num_workers : 1;
    if (worker < 0 || worker >= MAX_WORKERS) {
        stoke__fmt(msg, msg_len, "tar stream: worker %d out of range", worker);
        return STOKE_EINVAL;
    }
    if (worker >= nw) /* the caller's thread beside workers: the shards are theirs */
        return STOKE_EEND;
    sworker *w = st->w[worker];
    if (!w && !(w = st->w[worker] = worker_new(t))) {
        stoke__fmt(msg, msg_len, "tar stream: out of memory");
        return STOKE_ENOMEM;
    }
    if ((w->gen != st->gen || w->nw != nw) && worker_reset(t, w, worker, nw) != STOKE_OK) {
        stoke__fmt(msg, msg_len, "tar stream: out of memory");
        return STOKE_ENOMEM;
    }
    while (!w->exhausted && w->nbuf < w->cap) {
        if (!w->buf && !(w->buf = calloc(w->cap, sizeof(*w->buf)))) {
            stoke__fmt(msg, msg_len, "tar stream: out of memory for %zu samples", w->cap);
            return STOKE_ENOMEM;
        }
        int rc = pull(t, w, worker, &w->buf[w->nbuf], index, msg, msg_len);
        if (rc == STOKE_OK)
            w->nbuf++;
        else if (rc == STOKE_EEND)
            w->exhausted = 1;
        else
            return rc; /* a bad shard (the loader's on_error); the next call goes on */
    }
    if (w->nbuf == 0)
        return STOKE_EEND;
    size_t j = w->cap > 1 ? (size_t)(rng_next(&w->rng) % w->nbuf) : 0;
    ssample s = w->buf[j];
    w->buf[j] = w->buf[--w->nbuf];
    *index = s.index;
    int rc = sample_read(w, &s, dst, len, worker, msg, msg_len);
    sample_free(&s);
    return rc;
}

/* The epoch about to start: the workers restart with its order (their read-ahead with it: a
 * worker's next shards, shard_begin). */
static int stream_set_epoch(void *user, uint64_t epoch)
{
    stoke__tar_ds *t = user;
    struct stoke__tar_stream *st = t->st;
    stoke__tar_set_epoch(user, epoch);
    st->epoch = epoch;
    st->gen++;
    return STOKE_OK;
}

/* The dataset's describe: a sample's index is its shard and its position there (ssample). */
static int stream_describe(void *user, uint64_t index, char *buf, size_t n)
{
    const stoke__tar_ds *t = user;
    uint64_t shard = index >> 32;
    if (shard >= (uint64_t)t->nshards)
        return STOKE_ERANGE;
    stoke__fmt_short(buf, n, "tar %s: the shard's sample %" PRIu64 " (from 0)",
                     t->shards[shard].path, index & 0xffffffffu);
    return STOKE_OK;
}

void stoke__tar_stream_dataset(stoke__tar_ds *t, stoke_dataset *ds)
{
    (void)t;
    ds->kind = STOKE_DATASET_ITERABLE;
    ds->describe = stream_describe;
    ds->next = stream_next;
    ds->set_epoch = stream_set_epoch;
}

void stoke__tar_stream_free(struct stoke__tar_stream *st)
{
    if (!st)
        return;
    for (int i = 0; i < MAX_WORKERS; i++)
        worker_free(st->w[i]);
    stoke__remote_stream_destroy(atomic_load(&st->open_rs));
    free(st);
}

int stoke__tar_stream_open(const char *spec, stoke__tar_ds *t, stoke__tar_scan *sc,
                           stoke__tar_io *io)
{
    if (t->nshards == 0)
        return stoke__fail(STOKE_ENOENT, "source '%s': no shard", spec);
    if (t->rank >= t->nshards) /* (said: under DDP an empty rank hangs the others' collectives) */
        stoke__log(STOKE_LOG_WARN,
                   "source '%s': mode=stream splits %d shards across %" PRId64
                   " ranks: rank %" PRId64 " gets none, and its epochs are empty (use at least "
                   "as many shards as ranks x workers)",
                   spec, t->nshards, t->world, t->rank);
    struct stoke__tar_stream *st = calloc(1, sizeof(*st));
    if (!st)
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    t->st = st;
    stoke__shorten(st->spec, sizeof(st->spec), spec); /* (a long one: its middle cut) */
    int rc = STOKE_OK;
    for (int i = 0; i < t->nshards && !rc; i++)
        if (stoke__remote_is_url(t->shards[i].path))
            rc = stoke__tar_remote_init(spec, t, &t->shards[i]);
    if (rc)
        return rc;
    /* the first sample of the first shard: its members into sc, its bytes into io's window */
    sworker *w = calloc(1, sizeof(*w));
    if (!w)
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    w->rd.fd = -1;
    char msg[STOKE__MSG_MAX];
    rc = shard_begin(t, w, 0, 0, msg, sizeof(msg));
    if (rc)
        rc = stoke__fail(rc, "source '%s': %s", spec, msg);
    while (!rc) {
        const char *path;
        uint64_t hdr, data, size;
        rc = stoke__tar_iter_next(&w->it, &path, &hdr, &data, &size);
        if (rc == STOKE_EEND) {
            rc = STOKE_OK;
            break;
        }
        if (rc && w->rd.rc)
            rc = stoke__fail(w->rd.rc, "source '%s': %s", spec, w->rd.why);
        else if (rc)
            rc = stoke__fail(rc, "source '%s': tar %s: at byte %" PRIu64 ": %s", spec,
                             t->shards[0].path, w->it.err_off, w->err);
        else if (stoke__tar_on_member(sc, path, hdr, data, size) != 0)
            rc = stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
        else if (sc->n >= 2 && !stoke__tar_same_key(&sc->m[0], &sc->m[sc->n - 1])) {
            free(sc->m[--sc->n].path); /* the second sample's: not needed */
            break;
        }
    }
    if (!rc) {
        io->win = w->rd.win; /* the shard's bytes [0, pos): the first sample's among them */
        io->win_off = w->rd.win_off;
        io->win_len = w->rd.len;
        w->rd.win = NULL;
    }
    if (!rc && w->rd.rs) { /* its connection kept for the first worker's stream */
        stoke__remote_stream_finish(w->rd.rs, OPEN_DRAIN_MAX);
        st->open_pid = getpid();
        atomic_store(&st->open_rs, w->rd.rs);
        w->rd.rs = NULL;
    }
    /* w->sc is empty: the members went to sc */
    worker_free(w);
    return rc;
}
