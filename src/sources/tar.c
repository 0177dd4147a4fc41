/* The tar source: WebDataset-style shards as a map-style dataset.
 *
 * Open: the spec's shard pattern is expanded (brace ranges and lists, then glob(3)), every
 * shard's member headers are walked (tar_header.c; data is skipped, never read) and members
 * sharing a key -- the path up to the first dot of its base name, consecutive in one shard --
 * become one sample, its fields by extension (a remote shard: tar_remote.c, which may fetch
 * its sidecar index instead).  The index (sample -> shard, and per field the member's offset
 * and size) is the canonical order: shard order, then member order.
 * The options after the pattern are parsed and checked in tar_options.c.
 * get() preads the members of one sample (tar_fields.c); it reads only the immutable index, so
 * workers call it concurrently without a lock.  Everything is freed by the close callback. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "sources/regular.h"
#include "sources/remote.h"
#include "sources/tar_header.h"
#include "sources/tar_index.h"
#include "sources/tar_internal.h"
#include "sources/tar_shards.h"
#include "stoke/sources.h"

#define MAX_SHARDS STOKE__TAR_SHARDS_MAX

/* ---- shard lists -------------------------------------------------------------------------- */

typedef struct strvec {
    char **v;
    size_t n, cap;
} strvec;

static int strvec_push(strvec *s, const char *str, size_t len)
{
    if (s->n >= MAX_SHARDS)
        return STOKE_ELIMIT;
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 16;
        char **v = realloc(s->v, cap * sizeof(*v));
        if (!v)
            return STOKE_ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    char *c = strndup(str, len);
    if (!c)
        return STOKE_ENOMEM;
    s->v[s->n++] = c;
    return STOKE_OK;
}

static void strvec_free(strvec *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    memset(s, 0, sizeof(*s));
}

static int has_glob(const char *s)
{
    return strpbrk(s, "*?[") != NULL;
}

/* A pattern without braces: glob(3) (sorted) or the literal path; a URL as it is (a remote
 * store is not listed, and '?' starts its query). */
static int add_paths(const char *spec, const char *pat, strvec *out)
{
    if (!has_glob(pat) || stoke__remote_is_url(pat))
        return strvec_push(out, pat, strlen(pat)) ? stoke__fail(STOKE_ENOMEM,
                                                                "source '%s': "
                                                                "too many shards or out of "
                                                                "memory",
                                                                spec)
                                                  : STOKE_OK;
    glob_t g;
    int e = glob(pat, GLOB_ERR, NULL, &g);
    if (e == GLOB_NOMATCH)
        return stoke__fail(STOKE_ENOENT, "source '%s': no file matches '%s'", spec, pat);
    if (e)
        return stoke__fail(STOKE_EIO, "source '%s': glob '%s' failed", spec, pat);
    int rc = STOKE_OK;
    for (size_t i = 0; i < g.gl_pathc && !rc; i++)
        if (strvec_push(out, g.gl_pathv[i], strlen(g.gl_pathv[i])))
            rc = stoke__fail(STOKE_ENOMEM, "source '%s': too many shards or out of memory", spec);
    globfree(&g);
    return rc;
}

/* stoke__tar_expand's leaf: a pattern's paths into the shard list. */
typedef struct shard_list {
    const char *spec;
    strvec *out;
} shard_list;

static int add_leaf(void *ctx, const char *pat)
{
    shard_list *l = ctx;
    return add_paths(l->spec, pat, l->out);
}

static int expand(const char *spec, const char *pat, strvec *out)
{
    shard_list l = {spec, out};
    return stoke__tar_expand(spec, pat, add_leaf, &l);
}

/* ---- the index ---------------------------------------------------------------------------- */

static int read_shard(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    const stoke__tar_shard *s = ctx;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(s->fd, (char *)buf + done, n - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (r == 0)
            break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

int stoke__tar_on_member(void *ctx, const char *path, uint64_t hdr, uint64_t off, uint64_t size)
{
    stoke__tar_scan *sc = ctx;
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    const char *dot = strchr(base, '.');
    if (!dot || dot == base || !dot[1]) /* no key.ext: not part of a sample */
        return 0;
    if (sc->n == sc->cap) {
        size_t cap = sc->cap ? sc->cap * 2 : 256;
        stoke__tar_member *m = realloc(sc->m, cap * sizeof(*m));
        if (!m)
            return STOKE_ENOMEM;
        sc->m = m;
        sc->cap = cap;
    }
    stoke__tar_member *m = &sc->m[sc->n];
    m->path = strdup(path);
    if (!m->path)
        return STOKE_ENOMEM;
    m->shard = sc->shard;
    m->hdr = hdr;
    m->off = off;
    m->size = size;
    m->key_len = (size_t)(dot - path);
    sc->n++;
    return 0;
}

static const char *ext_of(const stoke__tar_member *m)
{
    return m->path + m->key_len + 1;
}

int stoke__tar_same_key(const stoke__tar_member *a, const stoke__tar_member *b)
{
    return a->shard == b->shard && a->key_len == b->key_len &&
           memcmp(a->path, b->path, a->key_len) == 0;
}

static int open_shard(const char *spec, stoke__tar_shard *s)
{
    struct stat st;
    char why[160];
    s->fd = stoke__open_regular(AT_FDCWD, s->path, &st, why, sizeof(why));
    if (s->fd < 0) {
        int rc = s->fd;
        s->fd = -1;
        return stoke__fail(rc, "source '%s': tar %s: %s", spec, s->path, why);
    }
    s->size = (uint64_t)st.st_size;
    return STOKE_OK;
}

/* Opens and walks every shard, collecting the members into *sc: local shards, and remote ones
 * with a sidecar index or a cache, one after another; remote ones without either walked
 * together after them (stoke__tar_walk_remote), their members put in shard order. */
static int scan_shards(const char *spec, stoke__tar_ds *t, stoke__tar_scan *sc)
{
    stoke__tar_rlocal w = {0};
    int *later = calloc((size_t)t->nshards + 1, sizeof(*later)), nlater = 0;
    int rc = later ? stoke__tar_remote_order(spec, t, 0)
                   : stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    int ahead = 0;    /* indexes fetched ahead up to here */
    int retried = -1; /* the shard whose copy was downloaded again after its walk failed */
    /* With a cache, a shard without an index is downloaded whole by its open anyway: the
     * indexes are fetched ahead only after a shard that had one, else each is asked alone on the
     * open's connection (fetched ahead, their 404s opened STOKE_REMOTE_CONNECTIONS connections
     * for nothing beside the downloads' own: 9 -> 17 at bench_remote's limited cache row).
     * stoke__tar_remote_order made the cache, if any, above. */
    for (int i = 0; i < t->nshards && !rc; i++) {
        stoke__tar_shard *s = &t->shards[i];
        int remote = stoke__remote_is_url(s->path), how = 0;
        sc->shard = (uint32_t)i;
        if (ahead <= i && remote && (!t->cache || (i > 0 && t->shards[i - 1].idx_url))) {
            stoke__tar_index_ahead(spec, t, i);
            ahead = i + STOKE__TAR_INDEX_AHEAD;
        }
        rc = remote ? stoke__tar_open_remote(spec, t, s, &w, stoke__tar_on_member, sc, &how)
                    : open_shard(spec, s);
        if (!rc && how == STOKE__TAR_WALK_LATER)
            later[nlater++] = i;
        if (rc || how == STOKE__TAR_INDEXED || how == STOKE__TAR_WALK_LATER)
            continue;
        char err[512];
        uint64_t at = 0;
        size_t n0 = sc->n; /* the members before this shard's */
        rc = stoke__tar_walk(s->size, remote ? stoke__tar_read_remote : read_shard,
                             remote ? (void *)&w : s, stoke__tar_on_member, sc, err, sizeof(err),
                             &at);
        if (rc == STOKE_EFORMAT && remote && t->cache && retried != i) {
            /* a copy in the cache (WALK_NOW) that does not walk: downloaded again, once (a
             * power cut may leave a renamed copy truncated, and every later open failed on
             * it; one cut into zeros at a block boundary reads as a shorter archive, which
             * no walk tells); a shard that is bad on the server fails again, and is
             * downloaded twice by each open */
            stoke__log(STOKE_LOG_WARN,
                       "source '%s': tar %s: at byte %" PRIu64 ": %s: its copy "
                       "in the cache is removed and the shard downloaded again",
                       spec, s->path, at, err);
            retried = i;
            for (size_t j = n0; j < sc->n; j++)
                free(sc->m[j].path);
            sc->n = n0;
            if (stoke__cache_forget(t->cache, &s->rf) == 0) {
                rc = STOKE_OK;
                i--;
                continue;
            }
        }
        if (rc == STOKE_EIO && remote && w.why[0])
            rc = stoke__fail(rc, "source '%s': %s", spec, w.why);
        else if (rc == STOKE_ENOMEM)
            rc = stoke__fail(rc, "source '%s': tar %s: out of memory", spec, s->path);
        else if (rc)
            rc = stoke__fail(rc, "source '%s': tar %s: at byte %" PRIu64 ": %s", spec, s->path, at,
                             err);
    }
    /* the shards left for later come before any that failed: the first failing one's error */
    int lrc = stoke__tar_walk_remote(spec, t, later, nlater, sc);
    rc = lrc ? lrc : rc;
    free(later);
    if (!rc && t->cache) /* the sizes known now: the read-ahead checks its downloads */
        rc = stoke__tar_remote_order(spec, t, 1);
    return rc;
}

/* Without fields=: the extensions of the first sample, in member order. */
static int default_fields(const char *spec, stoke__tar_ds *t, const stoke__tar_scan *sc)
{
    for (size_t j = 0; j < sc->n && stoke__tar_same_key(&sc->m[0], &sc->m[j]); j++) {
        if (t->nf == STOKE__TAR_MAX_FIELDS)
            return stoke__fail(STOKE_ELIMIT,
                               "source '%s': the first sample has more than %d "
                               "members: choose with fields=EXT:EXT",
                               spec, STOKE__TAR_MAX_FIELDS);
        stoke__strlcpy(t->f[t->nf++].ext, ext_of(&sc->m[j]), sizeof(t->f[0].ext));
    }
    return STOKE_OK;
}

/* Groups the members into samples: the index arrays and the key pool. */
int stoke__tar_build_index(const char *spec, stoke__tar_ds *t, const stoke__tar_scan *sc)
{
    uint64_t n = 0;
    size_t keys = 0;
    for (size_t j = 0; j < sc->n; j++)
        if (j == 0 || !stoke__tar_same_key(&sc->m[j - 1], &sc->m[j])) {
            n++;
            keys += sc->m[j].key_len + 1;
        }
    t->n = n;
    t->shard_of = malloc((n ? n : 1) * sizeof(*t->shard_of));
    t->key_at = malloc((n ? n : 1) * sizeof(*t->key_at));
    t->loc = malloc((n ? n : 1) * (size_t)t->nf * sizeof(*t->loc));
    t->keys = malloc(keys ? keys : 1);
    if (!t->shard_of || !t->key_at || !t->loc || !t->keys)
        return stoke__fail(STOKE_ENOMEM,
                           "source '%s': out of memory for the index of %" PRIu64 " samples", spec,
                           n);
    uint64_t i = 0;
    size_t kp = 0;
    for (size_t j = 0; j < sc->n; j++) {
        const stoke__tar_member *m = &sc->m[j];
        if (j == 0 || !stoke__tar_same_key(&sc->m[j - 1], m)) {
            i = j == 0 ? 0 : i + 1;
            t->shard_of[i] = m->shard;
            t->key_at[i] = kp;
            memcpy(t->keys + kp, m->path, m->key_len);
            t->keys[kp + m->key_len] = 0;
            kp += m->key_len + 1;
            for (int k = 0; k < t->nf; k++)
                t->loc[i * (uint64_t)t->nf + (uint64_t)k] = (stoke__tar_loc){m->hdr, UINT64_MAX, 0};
        }
        int k = stoke__tar_field_index(t, ext_of(m));
        if (k < 0)
            continue; /* an extension no field asks for */
        stoke__tar_loc *L = &t->loc[i * (uint64_t)t->nf + (uint64_t)k];
        if (L->off != UINT64_MAX)
            return stoke__fail(STOKE_EFORMAT,
                               "source '%s': tar %s: at byte %" PRIu64 ": sample "
                               "'%.*s' has two '%s' members",
                               spec, t->shards[m->shard].path, m->hdr, (int)m->key_len, m->path,
                               t->f[k].ext);
        *L = (stoke__tar_loc){m->hdr, m->off, m->size};
    }
    return STOKE_OK;
}

/* ---- the dataset -------------------------------------------------------------------------- */

static void tar_close(void *user)
{
    stoke__tar_ds *t = user;
    if (!t)
        return;
    stoke__tar_stream_free(t->st); /* first: its streams and downloaders read the shards' rf */
    stoke__cache_destroy(t->cache);
    t->cache = NULL;
    for (int i = 0; i < t->nshards; i++) {
        if (t->shards[i].fd >= 0)
            close(t->shards[i].fd);
        free(t->shards[i].path);
        free(t->shards[i].idx_url);
        free(t->shards[i].idx_ahead);
        stoke__remote_file_free(&t->shards[i].rf);
    }
    stoke__remote_pool_destroy(t->pool);
    free(t->shards);
    free(t->shard_of);
    free(t->key_at);
    free(t->loc);
    free(t->keys);
    free(t->image_opts);
    free(t->ragged_opt[0]);
    free(t->ragged_opt[1]);
    free(t->max_len_opt);
    free(t);
}

static void tar_fork_prepare(void *user)
{
    stoke__cache_fork_prepare(((stoke__tar_ds *)user)->cache);
    stoke__remote_pool_fork_prepare(((stoke__tar_ds *)user)->pool);
}

static void tar_fork_parent(void *user)
{
    stoke__remote_pool_fork_parent(((stoke__tar_ds *)user)->pool);
    stoke__cache_fork_parent(((stoke__tar_ds *)user)->cache);
}

static void tar_fork_child(void *user, int worker)
{
    (void)worker;
    stoke__remote_pool_fork_child(((stoke__tar_ds *)user)->pool);
    stoke__cache_fork_child(((stoke__tar_ds *)user)->cache);
}

static uint64_t tar_length(void *user)
{
    return ((const stoke__tar_ds *)user)->n;
}

/* Sample index into dst (len: its ragged lengths, or NULL), the members from io's window when
 * it has one, else fetched as get() does. */
static int read_sample(const stoke__tar_ds *t, uint64_t index, void *const dst[], int64_t len[],
                       stoke__tar_io *io, char *msg, size_t msg_len)
{
    if (index >= t->n) {
        stoke__fmt(msg, msg_len, "tar: sample %" PRIu64 " past the end (%" PRIu64 " samples)",
                   index, t->n);
        return STOKE_ERANGE;
    }
    int rc = io->win ? STOKE_OK : stoke__tar_fetch_sample(t, index, dst, io, msg, msg_len);
    for (int k = 0; k < t->nf && !rc; k++)
        if (dst[k])
            rc = stoke__tar_read_field(t, index, k, dst[k], len ? &len[k] : NULL, io, msg, msg_len);
    return rc;
}

static int tar_get(void *user, uint64_t index, void *const dst[], int64_t len[], int worker,
                   char *msg, size_t msg_len)
{
    stoke__tar_io io = {.worker = worker};
    int rc = read_sample(user, index, dst, len, &io, msg, msg_len);
    free((void *)io.win);
    return rc;
}

/* read(), for a source with remote shards read by range: the batch's requests in flight
 * together (stoke__tar_fetch_batch), then each sample as get() reads it. */
static int tar_read(void *user, const uint64_t *indices, size_t count, const stoke_slots *slots,
                    int worker, char *msg, size_t msg_len, uint64_t *err_index)
{
    const stoke__tar_ds *t = user;
    size_t nf = (size_t)t->nf;
    void **dst = calloc(count * nf + 1, sizeof(*dst));
    stoke__tar_io *io = calloc(count + 1, sizeof(*io));
    int rc = STOKE_OK;
    if (!dst || !io) {
        free(dst);
        free(io);
        stoke__fmt(msg, msg_len, "tar: out of memory for a batch of %zu", count);
        *err_index = count ? indices[0] : 0;
        return STOKE_ENOMEM;
    }
    for (size_t j = 0; j < count; j++) {
        stoke_slots_sample(slots, t->nf, t->fields, j, dst + j * nf);
        io[j].worker = worker;
    }
    size_t bad = count;
    rc = stoke__tar_fetch_batch(t, indices, count, dst, io, msg, msg_len, &bad);
    if (rc)
        *err_index = indices[bad < count ? bad : 0];
    for (size_t j = 0; j < count && !rc; j++) {
        rc = read_sample(t, indices[j], dst + j * nf, slots->len ? slots->len + j * nf : NULL,
                         &io[j], msg, msg_len);
        if (rc)
            *err_index = indices[j];
    }
    for (size_t j = 0; j < count; j++)
        if (!io[j].borrowed)
            free((void *)io[j].win);
    free(io);
    free(dst);
    return rc;
}

int stoke_tar_remote_stats(const stoke_dataset *ds, stoke_remote_stats *out)
{
    if (!ds || ds->close != tar_close || !ds->user || !out || out->size == 0)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_tar_remote_stats: not an open tar dataset, or NULL output");
    const stoke__tar_ds *t = ds->user;
    stoke_remote_stats s = {.cached = t->cache != NULL};
    for (int i = 0; i < t->nshards; i++)
        s.shards += (uint64_t)t->shards[i].remote;
    stoke__remote_stats r;
    stoke__cache_stats c;
    stoke__remote_pool_stats(t->pool, &r);
    stoke__cache_stats_get(t->cache, &c);
    s.requests = r.requests;
    s.retries = r.retries;
    s.bytes = r.bytes;
    s.network_wait_s = (double)(r.wait_ns + c.wait_ns) / 1e9;
    s.cache_hits = c.hits;
    s.cache_misses = c.misses;
    s.cache_evictions = c.evictions;
    s.cache_bytes = c.bytes;
    uint32_t keep = out->size;
    memcpy(out, &s, keep < sizeof(s) ? keep : sizeof(s));
    out->size = keep;
    return STOKE_OK;
}

/* The length of the shard pattern that starts s: it ends at the first ',' outside braces. */
static size_t pattern_len(const char *s)
{
    size_t n = 0;
    for (int depth = 0; s[n] && (s[n] != ',' || depth > 0); n++)
        depth += s[n] == '{' ? 1 : s[n] == '}' ? -1 : 0;
    return n;
}

static int tar_open(const char *spec, const char *args, stoke__tar_ds *t, stoke__tar_scan *sc,
                    stoke__tar_io *io)
{
    size_t plen = pattern_len(args);
    char *pat = strndup(args, plen);
    char *opts = args[plen] ? strdup(args + plen + 1) : NULL;
    strvec shards = {0};
    int rc = (!pat || (args[plen] && !opts)) ? stoke__fail(STOKE_ENOMEM,
                                                           "source '%s': out of "
                                                           "memory",
                                                           spec)
                                             : STOKE_OK;
    if (!rc && !*pat)
        rc = stoke__fail(STOKE_EINVAL, "source '%s': no shard pattern (tar:PATTERN)", spec);
    if (!rc)
        rc = stoke__tar_parse_options(spec, t, opts);
    if (!rc)
        rc = expand(spec, pat, &shards);
    if (!rc) {
        t->shards = calloc(shards.n, sizeof(*t->shards));
        if (!t->shards)
            rc = stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    }
    if (!rc) {
        for (size_t i = 0; i < shards.n; i++) {
            t->shards[i].fd = -1;
            t->shards[i].path = shards.v[i];
            shards.v[i] = NULL;
        }
        t->nshards = (int)shards.n;
        rc = t->stream ? stoke__tar_stream_check(spec, t) : STOKE_OK;
        if (!rc)
            rc = t->stream ? stoke__tar_stream_open(spec, t, sc, io) : scan_shards(spec, t, sc);
    }
    if (!rc && sc->n == 0)
        rc = stoke__fail(STOKE_EFORMAT,
                         "source '%s': no member of the form KEY.EXT in %d "
                         "shard(s)",
                         spec, t->nshards);
    if (!rc && t->nf == 0)
        rc = default_fields(spec, t, sc);
    for (int k = 0; !rc && k < t->nf; k++) {
        t->f[k].kind = stoke__tar_field_kind(t->f[k].ext);
        if (t->f[k].kind == STOKE__TAR_IMAGE && !stoke__tar_image_hook_get())
            rc = stoke__fail(STOKE_ENOTSUP,
                             "source '%s': tar: .jpg fields need the images "
                             "module (field '%s'; not in this build)",
                             spec, t->f[k].ext);
    }
    for (int rg = 0; !rc && rg < 2; rg++)
        rc = stoke__tar_mark_ragged(spec, t, rg);
    if (!rc)
        rc = stoke__tar_mark_max_len(spec, t);
    if (!rc)
        rc = stoke__tar_build_index(spec, t, sc);
    for (int k = 0; !rc && k < t->nf; k++)
        rc = stoke__tar_describe_field(t, k, spec, io);
    strvec_free(&shards);
    free(pat);
    free(opts);
    return rc;
}

/* DIR/NAME.idx for the shard at `path` (a file path or URL: NAME its last path segment, a
 * URL's query and fragment left out), malloc'd; NULL with *rc set when there is no name. */
static char *index_path_in(const char *spec, const char *dir, const char *path, int *rc)
{
    size_t end = strcspn(path, stoke__remote_is_url(path) ? "?#" : "");
    size_t start = end;
    while (start > 0 && path[start - 1] != '/')
        start--;
    if (start == end || (end - start == 1 && path[start] == '.')) {
        char shown[STOKE__MSG_MAX];
        stoke__remote_redact(shown, sizeof(shown), path);
        *rc = stoke__fail(STOKE_EINVAL, "source '%s': %s: no file name to name its index", spec,
                          shown);
        return NULL;
    }
    size_t n = strlen(dir) + 1 + (end - start) + 5;
    char *out = malloc(n);
    if (!out) {
        *rc = stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
        return NULL;
    }
    snprintf(out, n, "%s/%.*s.idx", dir, (int)(end - start), path + start);
    return out;
}

/* A remote shard into an unlinked file of dir (its descriptor in s->fd, its size in s->size):
 * one whole-file download with a read's retries, through *pool (created at the first). */
static int download_shard(const char *spec, const char *dir, stoke__remote_pool **pool,
                          stoke__tar_shard *s, const char *shown)
{
    char why[STOKE__MSG_MAX];
    int rc = *pool ? STOKE_OK : stoke__remote_pool_create(pool, why, sizeof(why));
    if (rc)
        return stoke__fail(rc, "source '%s': %s", spec, why);
    stoke__remote_file f;
    rc = stoke__remote_file_init(*pool, s->path, &f, why, sizeof(why));
    int fd = -1;
    if (!rc) {
        fd = open(dir, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        if (fd < 0) {
            stoke__fmt(why, sizeof(why), "a temporary file in %s: %s", dir, strerror(errno));
            rc = STOKE_EIO;
        }
    }
    if (!rc)
        rc = stoke__remote_fetch(*pool, 0, &f, fd, 0, 0, NULL, NULL, NULL, &s->size, why,
                                 sizeof(why));
    stoke__remote_file_free(&f);
    if (rc) {
        if (fd >= 0)
            close(fd);
        return stoke__fail(rc, "source '%s': tar %s: %s", spec, shown, why);
    }
    s->fd = fd;
    return STOKE_OK;
}

int stoke_tar_write_index_to(const char *pattern, const char *dir, stoke_tar_index_fn fn, void *ctx)
{
    if (!pattern || !*pattern)
        return stoke__fail(STOKE_EINVAL, "stoke_tar_write_index: no shard pattern");
    char spec[128]; /* for messages: without credentials */
    memcpy(spec, "tar:", 4);
    stoke__remote_redact(spec + 4, sizeof(spec) - 4, pattern);
    struct stat st;
    if (dir && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)))
        return stoke__fail(STOKE_EINVAL, "source '%s': %s is not a directory", spec, dir);
    strvec shards = {0};
    stoke__remote_pool *pool = NULL;
    int rc = expand(spec, pattern, &shards);
    for (size_t i = 0; i < shards.n && !rc; i++) {
        stoke__tar_shard s = {.path = shards.v[i], .fd = -1};
        char shown[STOKE__MSG_MAX], *out = NULL;
        stoke__remote_redact(shown, sizeof(shown), s.path);
        int remote = stoke__remote_is_url(s.path);
        if (remote && !dir) {
            rc = stoke__fail(STOKE_EINVAL,
                             "source '%s': %s is remote: give a directory for its index "
                             "(stoke index --out DIR), then put DIR's .idx files next to the "
                             "shards",
                             spec, shown);
            break;
        }
        if (dir && !(out = index_path_in(spec, dir, s.path, &rc)))
            break;
        rc = remote ? download_shard(spec, dir, &pool, &s, shown) : open_shard(spec, &s);
        if (!rc) {
            char why[640];
            uint64_t members = 0;
            rc = stoke__tar_index_write(shown, out, s.size, read_shard, &s, &members, why,
                                        sizeof(why));
            if (rc)
                rc = stoke__fail(rc, "source '%s': %s", spec, why);
            else if (fn && fn(ctx, shown, s.size, members) != 0)
                rc = stoke__fail(STOKE_ECANCELED, "source '%s': stopped by the callback", spec);
        }
        if (s.fd >= 0)
            close(s.fd);
        free(out);
    }
    stoke__remote_pool_destroy(pool);
    strvec_free(&shards);
    return rc;
}

int stoke_tar_write_index(const char *pattern, stoke_tar_index_fn fn, void *ctx)
{
    return stoke_tar_write_index_to(pattern, NULL, fn, ctx);
}

int stoke_tar_open(const char *args, stoke_dataset *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "tar: NULL dataset");
    stoke_dataset_init(out);
    if (!args || !*args)
        return stoke__fail(STOKE_EINVAL, "tar: no shard pattern (tar:PATTERN)");
    /* for messages and the dataset's name: without credentials (a redaction may be longer
     * than what it hides: "***") */
    size_t spec_n = 3 * strlen(args) + 16;
    char *spec = malloc(spec_n);
    stoke__tar_ds *t = spec ? calloc(1, sizeof(*t)) : NULL;
    if (!t) {
        free(spec);
        return stoke__fail(STOKE_ENOMEM, "source 'tar:...': out of memory");
    }
    memcpy(spec, "tar:", 4);
    stoke__remote_redact(spec + 4, spec_n - 4, args);
    stoke__tar_scan sc = {spec, NULL, 0, NULL, 0, 0};
    stoke__tar_io io = {0}; /* mode=stream: the first sample's bytes */
    t->rank = t->world = -1;
    t->shuffle_buffer = STOKE__TAR_SHUFFLE_DEFAULT;
    int rc = tar_open(spec, args, t, &sc, &io);
    free((void *)io.win);
    for (size_t j = 0; j < sc.n; j++)
        free(sc.m[j].path);
    free(sc.m);
    if (rc) {
        tar_close(t);
        free(spec);
        return rc;
    }
    /* the name: the pattern without the options, its middle cut if it is still too long (the
     * loader's messages name the dataset; the shard's name is at the end) */
    spec[pattern_len(spec)] = '\0';
    stoke__shorten(out->name, sizeof(out->name), spec);
    if (t->stream) {
        out->user = t;
        out->nfields = t->nf;
        out->fields = t->fields;
        out->close = tar_close;
        stoke__tar_stream_dataset(t, out);
        stoke__log(STOKE_LOG_DEBUG, "%s: %d shard(s) streamed, %d field(s)", spec, t->nshards,
                   t->nf);
        free(spec);
        return STOKE_OK;
    }
    out->kind = STOKE_DATASET_MAP;
    out->user = t;
    out->nfields = t->nf;
    out->fields = t->fields;
    out->length = tar_length;
    out->get = tar_get;
    out->describe = stoke__tar_describe;
    out->set_epoch = stoke__tar_set_epoch; /* .jpg fields' train crops depend on the epoch */
    out->close = tar_close;
    if (t->pool && !t->cache) /* range reads: a batch's requests in flight together */
        out->read = tar_read;
    if (t->pool) { /* a forked worker opens connections of its own */
        out->fork_prepare = tar_fork_prepare;
        out->fork_parent = tar_fork_parent;
        out->fork_child = tar_fork_child;
    }
    stoke__log(STOKE_LOG_DEBUG, "%s: %d shard(s), %" PRIu64 " samples, %d field(s)", spec,
               t->nshards, t->n, t->nf);
    free(spec);
    return STOKE_OK;
}
