/* stoke load: content_hash - FNV-1a of each delivered sample's field 0, summed - and the
 * untimed hash pass that computes it for exactly the samples the timed pass delivered, or
 * says why it cannot (see the top of cmd_load.c). */
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cmd_load.h"

uint64_t cmd_load_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- hashes ---------------------------------------------------------------------------- */

static uint64_t fnv1a(const unsigned char *p, size_t n)
{
    uint64_t h = FNV_OFFSET;
    for (size_t k = 0; k < n; k++)
        h = (h ^ p[k]) * FNV_PRIME;
    return h;
}

/* fnv1a(p[0], n) + ... + fnv1a(p[3], n), interleaved so that the multiplications of the four
 * independent hashes overlap. */
static uint64_t fnv1a_sum4(const unsigned char *const p[4], size_t n)
{
    uint64_t ha = FNV_OFFSET, hb = FNV_OFFSET, hc = FNV_OFFSET, hd = FNV_OFFSET;
    for (size_t k = 0; k < n; k++) {
        ha = (ha ^ p[0][k]) * FNV_PRIME;
        hb = (hb ^ p[1][k]) * FNV_PRIME;
        hc = (hc ^ p[2][k]) * FNV_PRIME;
        hd = (hd ^ p[3][k]) * FNV_PRIME;
    }
    return ha + hb + hc + hd;
}

/* Sum of the hashes of `count` stacked samples of `bytes` bytes each, or of the samples of a
 * ragged field (sample i is span[2i + 1] bytes from span[2i]) when `span` is not NULL. */
uint64_t cmd_load_hash_batch(const unsigned char *p, const uint64_t *span, size_t count,
                             size_t bytes)
{
    uint64_t sum = 0;
    size_t i = 0;
    if (span) {
        for (; i < count; i++)
            sum += fnv1a(p + span[2 * i], (size_t)span[2 * i + 1]);
        return sum;
    }
    for (; i + 4 <= count; i += 4) {
        const unsigned char *q[4] = {p + i * bytes, p + (i + 1) * bytes, p + (i + 2) * bytes,
                                     p + (i + 3) * bytes};
        sum += fnv1a_sum4(q, bytes);
    }
    for (; i < count; i++)
        sum += fnv1a(p + i * bytes, bytes);
    return sum;
}

const uint64_t *cmd_load_spans(load_run *r, const stoke_batch *b)
{
    const int64_t *len = stoke_batch_lengths(b, 0), *off = stoke_batch_offsets(b, 0);
    const stoke_field *f = stoke_batch_field(b, 0);
    if (!len || !r->spans)
        return NULL;
    size_t n = stoke_batch_count(b), unit = f->bytes / (size_t)f->max_len;
    /* padded: the batch's length L (shape[1]; any later dimensions are a row's unit), in bytes;
     * the shape asked for whole (a smaller room is STOKE_ERANGE), on the stack but for fields of
     * more dimensions than a .npy may have */
    int64_t small[65], *shape = small;
    int nd = stoke_batch_ndim(b, 0);
    if (nd > (int)(sizeof(small) / sizeof(small[0])) &&
        !(shape = malloc((size_t)nd * sizeof(*shape))))
        return NULL; /* (out of memory) the batch's bytes as stacked samples */
    uint64_t row = 0;
    if (!off && nd >= 2 && stoke_batch_shape(b, 0, shape, nd, &nd) == STOKE_OK)
        row = (uint64_t)shape[1] * unit;
    if (shape != small)
        free(shape);
    for (size_t i = 0; i < n; i++) {
        r->spans[2 * i] = off ? (uint64_t)off[i] * unit : i * row;
        r->spans[2 * i + 1] = (uint64_t)len[i] * unit;
    }
    return r->spans;
}

/* FNV-1a over 64-bit words: one multiply per index (the byte-wise form took 8 dependent
 * multiplies, 10-15% of the timed pass at 16 M samples/s, work no peer of the benchmark does). */
uint64_t cmd_load_hash_order(uint64_t h, const uint64_t *idx, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ idx[i]) * FNV_PRIME;
    return h;
}

static int cmp_u64(const void *x, const void *y)
{
    uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
    return a < b ? -1 : a > b;
}

/* Takes one not yet taken occurrence of index x from the sorted want[0..n).  1 if there was
 * one. */
static int take_index(const uint64_t *want, unsigned char *taken, size_t n, uint64_t x)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (want[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < n && want[lo] == x; lo++)
        if (!taken[lo])
            return taken[lo] = 1;
    return 0;
}

/* Adds to r->content the hashes of the batch's samples: with `want`, of those whose indices it
 * takes from list[0..n) (each occurrence once); without, of all but those (the samples the timed
 * pass skipped).  Adds the hashed samples' indices to *sum; returns how many it hashed. */
static size_t hash_some(load_run *r, const stoke_batch *b, int want, const uint64_t *list,
                        unsigned char *taken, size_t nlist, uint64_t *sum)
{
    size_t n = stoke_batch_count(b), hit = 0, pending = 0;
    const uint64_t *idx = stoke_batch_indices(b), *off = cmd_load_spans(r, b);
    const unsigned char *data = stoke_batch_data(b, 0), *q[4];
    if (!want && !nlist) {
        r->content += cmd_load_hash_batch(data, off, n, r->sample_bytes);
        for (size_t i = 0; i < n; i++)
            *sum += idx[i];
        return n;
    }
    for (size_t i = 0; i < n; i++) {
        if (take_index(list, taken, nlist, idx[i]) != want)
            continue;
        hit++;
        *sum += idx[i];
        if (off) {
            r->content += cmd_load_hash_batch(data, off + 2 * i, 1, 0);
            continue;
        }
        q[pending++] = data + i * r->sample_bytes;
        if (pending == 4) {
            r->content += fnv1a_sum4(q, r->sample_bytes);
            pending = 0;
        }
    }
    for (size_t k = 0; k < pending; k++)
        r->content += fnv1a(q[k], r->sample_bytes);
    return hit;
}

/* content_hash cannot describe what the timed pass delivered: it is null, for the reason
 * fmt..., which goes to stderr too.  The first reason is kept. */
static void hash_unknown(load_run *r, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void hash_unknown(load_run *r, const char *fmt, ...)
{
    if (r->hash_why[0])
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(r->hash_why, sizeof(r->hash_why), fmt, ap);
    va_end(ap);
    fprintf(stderr, "stoke load: content_hash: none: %s\n", r->hash_why);
}

/* Runs epoch e again.  want: hashes the samples in list[0..n) (sorted here; each as often as it
 * is there), the delivered samples of an epoch cut short.  Otherwise (a whole epoch): hashes
 * every sample the pass delivers less one occurrence of each index in list[0..n) (the samples
 * the timed pass skipped), counting them in r->hashed and r->hashed_sum. */
/* The hash pass on a terminal (the timed pass's bar is done): a line "hash pass: epoch E of N,
 * B batches" redrawn every 0.1 s, so that a long run's second pass is not a silent pause. */
static uint64_t hash_drawn_ns; /* when the line was last drawn (0: never) */

static void hash_progress(const load_run *r, uint64_t e, uint64_t batches)
{
    if (!r->bar)
        return;
    uint64_t t = cmd_load_now_ns();
    if (hash_drawn_ns && t - hash_drawn_ns < 100000000u)
        return;
    hash_drawn_ns = t;
    fprintf(stderr,
            "\rhash pass (--no-hash skips it): epoch %" PRIu64 " of %" PRIu64 ", %" PRIu64
            " batches ",
            e + 1, r->seen.epochs, batches);
    fflush(stderr);
}

static void hash_epoch(load_run *r, uint64_t e, int want, uint64_t *list, size_t n)
{
    unsigned char *taken = NULL;
    if (n) {
        qsort(list, n, sizeof(*list), cmp_u64);
        if (!(taken = calloc(n, 1))) {
            hash_unknown(r, "out of memory for the hash pass");
            return;
        }
    }
    size_t left = n;
    uint64_t sum = 0, batches = 0;
    stoke_batch *b;
    int rc = stoke_loader_set_epoch(r->l, e);
    while (rc == STOKE_OK && (!want || left) && (rc = stoke_loader_next(r->l, &b)) == STOKE_OK) {
        hash_progress(r, e, ++batches);
        size_t hit = hash_some(r, b, want, list, taken, n, &sum);
        if (want)
            left -= hit;
        else
            r->hashed += hit;
        stoke_batch_release(b);
    }
    if (!want)
        r->hashed_sum += sum;
    if (rc != STOKE_OK && rc != STOKE_EEND) {
        const char *msg = stoke_loader_last_error(r->l);
        hash_unknown(r, "the hash pass failed in epoch %" PRIu64 ": %s", e,
                     msg && *msg ? msg : stoke_strerror(rc));
    } else if (want && left) {
        size_t j = 0;
        while (taken[j])
            j++;
        hash_unknown(r,
                     "the hash pass did not deliver sample %" PRIu64 " of epoch %" PRIu64
                     ", which the timed pass delivered (a sample that failed in the hash pass "
                     "only, or a source that changed)",
                     list[j], e);
    }
    free(taken);
}

/* A quarantine entry, as the passes are compared: what was done to which sample. */
typedef struct bad_key {
    uint64_t epoch, index, replacement;
    int action;
    size_t pos; /* in the quarantine */
} bad_key;

static int cmp_bad(const bad_key *x, const bad_key *y)
{
    if (x->epoch != y->epoch)
        return x->epoch < y->epoch ? -1 : 1;
    if (x->index != y->index)
        return x->index < y->index ? -1 : 1;
    if (x->action != y->action)
        return x->action < y->action ? -1 : 1;
    return x->replacement < y->replacement ? -1 : x->replacement > y->replacement;
}

static int cmp_bad_q(const void *x, const void *y)
{
    return cmp_bad(x, y);
}

/* The quarantine entries [from, to) of epochs before `whole`, sorted, into *out (*n of them).
 * Returns 0, or -1 out of memory. */
static int read_bad(const load_run *r, uint64_t from, uint64_t to, uint64_t whole, bad_key **out,
                    size_t *n)
{
    *out = NULL;
    *n = 0;
    if (to <= from)
        return 0;
    bad_key *k = malloc((size_t)(to - from) * sizeof(*k));
    if (!k)
        return -1;
    for (uint64_t i = from; i < to; i++) {
        stoke_bad_sample q;
        if (stoke_loader_quarantine(r->l, (size_t)i, &q) != STOKE_OK || q.epoch >= whole)
            continue;
        k[(*n)++] = (bad_key){q.epoch, q.index, q.replacement, q.action, (size_t)i};
    }
    qsort(k, *n, sizeof(*k), cmp_bad_q);
    *out = k;
    return 0;
}

/* After the hash pass: did it hash exactly what the timed pass delivered in the whole epochs
 * (those before `whole`; an epoch cut short is checked sample by sample in hash_epoch)?  The
 * timed pass's bad samples are t[0..nt); every bad sample of the hash pass must be one of them
 * (else it did not hash a sample the timed pass delivered), every one the timed pass replaced
 * must be replaced again (else it hashed the sample, not its replacement), and the samples
 * hashed and their index sum must be the timed pass's.  Otherwise content_hash is null. */
static void check_passes(load_run *r, uint64_t whole, const bad_key *t, size_t nt)
{
    const delivered *d = &r->seen;
    stoke_loader_stats st = {.size = sizeof(st)};
    stoke_loader_get_stats(r->l, &st);
    if (st.bad_samples > st.quarantined) {
        hash_unknown(r,
                     "%" PRIu64 " bad samples, more than the quarantine keeps (%d): the passes "
                     "cannot be compared",
                     st.bad_samples, STOKE_QUARANTINE_MAX);
        return;
    }
    bad_key *h;
    size_t nh, i = 0, j = 0;
    if (read_bad(r, r->st.quarantined, st.quarantined, whole, &h, &nh) < 0) {
        hash_unknown(r, "out of memory comparing the passes");
        return;
    }
    while (i < nt || j < nh) {
        int c = i == nt ? 1 : j == nh ? -1 : cmp_bad(&t[i], &h[j]);
        if (c == 0) {
            i++, j++;
        } else if (c < 0) {
            if (t[i].action != STOKE_ON_ERROR_SKIP) {
                hash_unknown(r,
                             "sample %" PRIu64 " of epoch %" PRIu64 " was replaced by %" PRIu64
                             " in the timed pass only",
                             t[i].index, t[i].epoch, t[i].replacement);
                break;
            }
            i++; /* skipped in the timed pass only: left out of the hash (hash_epoch) */
        } else {
            stoke_bad_sample q;
            int got = stoke_loader_quarantine(r->l, h[j].pos, &q) == STOKE_OK;
            hash_unknown(r,
                         "sample %" PRIu64 " of epoch %" PRIu64
                         " failed in the hash pass only (%s%s%s), not in the timed pass",
                         h[j].index, h[j].epoch, got ? q.source : "", got ? ": " : "",
                         got ? q.reason : "");
            break;
        }
    }
    free(h);
    uint64_t n = d->last_whole ? r->samples : d->whole_samples;
    uint64_t sum = d->last_whole ? r->index_sum : d->whole_sum;
    if (r->hashed != n || r->hashed_sum != sum)
        hash_unknown(r,
                     "the hash pass hashed %" PRIu64 " samples (index sum %" PRIu64
                     ") of the whole epochs, the timed pass delivered %" PRIu64
                     " (index sum %" PRIu64 ")",
                     r->hashed, r->hashed_sum, n, sum);
}

/* Pass 2, untimed: the content_hash of exactly the samples the timed pass delivered, or a reason
 * in r->hash_why why it cannot be had. */
void cmd_load_hash_pass(load_run *r)
{
    delivered *d = &r->seen;
    uint64_t h0 = cmd_load_now_ns();
    uint64_t whole = d->last_whole ? d->epochs : d->epochs - 1;
    bad_key *t;
    size_t nt, k = 0;
    r->hash_pass = 1;
    uint64_t *skip = NULL;
    if (read_bad(r, 0, r->st.quarantined, whole, &t, &nt) < 0 ||
        (nt && !(skip = malloc(nt * sizeof(*skip))))) {
        hash_unknown(r, "out of memory for the hash pass");
        free(t);
        r->hash_ns = cmd_load_now_ns() - h0;
        return;
    }
    for (uint64_t e = 0; e < d->epochs && !r->hash_why[0]; e++) {
        if (e >= whole) {
            hash_epoch(r, e, 1, d->idx, d->n);
            continue;
        }
        size_t ns = 0; /* the timed pass's skipped samples of epoch e (t is sorted by epoch) */
        for (; k < nt && t[k].epoch == e; k++)
            if (t[k].action == STOKE_ON_ERROR_SKIP)
                skip[ns++] = t[k].index;
        hash_epoch(r, e, 0, skip, ns);
    }
    if (!r->hash_why[0])
        check_passes(r, whole, t, nt);
    if (hash_drawn_ns) /* its last state drawn, the line ended: the summary after it */
        fprintf(stderr, "\rhash pass (--no-hash skips it): %" PRIu64 " epochs, %.1f s%20s\n",
                d->epochs, (double)(cmd_load_now_ns() - h0) / 1e9, "");
    free(skip);
    free(t);
    r->hash_ns = cmd_load_now_ns() - h0;
}
