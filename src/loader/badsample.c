/* The bad-sample policy (stoke_loader_opts.on_error; docs/loader.md, "Bad samples").
 *
 * Producer side (worker threads, or the caller's thread without workers): a sample whose
 * dataset call fails goes through stoke__bad_sample, which records it in its batch's own list
 * (no lock: the batch belongs to its producer) and skips it, replaces it, or lets the error
 * stand.  Consumer side, under `mu`: when a batch reaches stoke_loader_next its list moves into
 * the quarantine and the counts, and the budget is checked there, in delivery order, so the
 * batch that runs past it is the same whatever the number of workers (with in_order = 1). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "loader/loader_internal.h"

stoke__bad *stoke__bad_append(stoke_batch *b)
{
    if (b->bad.n == b->bad.cap) {
        size_t cap = b->bad.cap ? b->bad.cap * 2 : 4;
        stoke__bad *v = realloc(b->bad.v, cap * sizeof(*v));
        if (!v)
            return NULL;
        b->bad.v = v;
        b->bad.cap = cap;
    }
    return &b->bad.v[b->bad.n++];
}

static int push(stoke_batch *b, uint64_t idx, int rc, int action, const char *msg)
{
    stoke__bad *e = stoke__bad_append(b);
    if (!e)
        return STOKE_ENOMEM;
    e->index = idx;
    e->replacement = UINT64_MAX;
    e->code = rc > 0 ? STOKE_EDATA : rc;
    e->action = action;
    stoke__strlcpy(e->msg, msg && msg[0] ? msg : stoke_strerror(e->code), sizeof(e->msg));
    return STOKE_OK;
}

void stoke__bad_note(stoke_batch *b, uint64_t idx, int rc, const char *msg)
{
    (void)push(b, idx, rc, STOKE_ON_ERROR_ERROR, msg); /* out of memory: the error still stands */
}

/* REPLACE: loads the first candidate that works into the slot; STOKE_OK with *idx set. */
static int replace(stoke_loader *l, stoke_batch *b, stoke__producer *p, size_t slot, uint64_t *idx,
                   char *msg, size_t msg_len)
{
    uint64_t n = l->ds.length ? l->ds.length(l->ds.user) : 0;
    char tmp[STOKE__MSG_MAX];
    for (unsigned k = 0; k < STOKE_REPLACE_TRIES && n > 1; k++) {
        if (stoke__producer_abandoned(p, b))
            break; /* nobody wants the batch: no more candidates read for it */
        /* candidate k for sample *idx: a hash of (seed, index, k) */
        uint64_t r = stoke__mix64(l->o.seed ^ stoke__mix64(*idx * 0x9E3779B97F4A7C15u + k + 1)) % n;
        if (r == *idx)
            continue;
        if (stoke__loader_one_sample(l, b, p, slot, &r, tmp, sizeof(tmp)) == STOKE_OK) {
            *idx = r;
            return STOKE_OK;
        }
    }
    size_t used = strlen(msg); /* (< msg_len: at most the room for the terminator is left) */
    stoke__fmt(msg + used, msg_len - used, " (and none of its %d replacement candidates loaded)",
               STOKE_REPLACE_TRIES);
    return STOKE_EDATA;
}

int stoke__bad_sample(stoke_loader *l, stoke_batch *b, stoke__producer *p, size_t slot,
                      uint64_t *idx, int rc, char *msg, size_t msg_len)
{
    int action = l->o.on_error;
    /* not the sample's fault: a wait, memory, the end; STOKE_ECANCELED a sample the dataset
     * gave up (nobody wants its batch) or, while the batch is wanted, an interrupt (Ctrl-C in a
     * Python dataset): it ends the epoch, never skipped or replaced */
    if (rc == STOKE_ETIMEDOUT || rc == STOKE_ENOMEM || rc == STOKE_EEND || rc == STOKE_ECANCELED)
        return rc;
    if (action == STOKE_ON_ERROR_ERROR) {
        stoke__bad_note(b, *idx, rc, msg);
        return rc;
    }
    /* A stream that keeps failing (ITERABLE) must not spin: one batch holds at most
     * batch_size bad samples. */
    if (b->bad.n >= l->o.batch_size) {
        stoke__bad_note(b, *idx, rc, msg);
        size_t used = strlen(msg);
        stoke__fmt(msg + used, msg_len - used, " (more than %zu bad samples in one batch)",
                   l->o.batch_size);
        return rc;
    }
    if (l->iterable)
        action = STOKE_ON_ERROR_SKIP;
    if (push(b, *idx, rc, action, msg) != STOKE_OK)
        return rc;
    if (action == STOKE_ON_ERROR_SKIP)
        return STOKE__BAD_SKIPPED;
    int r = replace(l, b, p, slot, idx, msg, msg_len);
    stoke__bad *e = &b->bad.v[b->bad.n - 1];
    if (r != STOKE_OK) {
        e->action = STOKE_ON_ERROR_ERROR;
        return rc;
    }
    e->replacement = *idx;
    return STOKE_OK;
}

/* The budget of this epoch after `seen` delivered samples. */
static uint64_t budget(const stoke_loader *l, uint64_t seen)
{
    /* An order over the dataset's indices (sequential, shuffled, in blocks: never more
     * positions than length() at create) whose dataset's length() is now under its positions
     * has that many in the epoch: a dataset that plans each epoch's batches within a bound, as
     * the Python writer.  (A weighted or subset sampler's positions are its own draws.) */
    uint64_t n = l->nsamples;
    if (!l->iterable && l->ds.length && l->o.sampler.kind != STOKE_SAMPLER_WEIGHTED &&
        l->o.sampler.kind != STOKE_SAMPLER_SUBSET) {
        uint64_t len = l->ds.length(l->ds.user);
        n = len < n ? len : n;
    }
    double total = l->iterable ? (double)seen : (double)n;
    double f = l->o.max_bad_fraction * total + 1e-9; /* truncated below: the floor */
    uint64_t b =
        (l->o.max_bad_fraction >= 1.0 || f >= 18446744073709551615.0) ? UINT64_MAX : (uint64_t)f;
    return b < l->o.max_bad ? b : l->o.max_bad;
}

static void quarantine(stoke_loader *l, const stoke_batch *b, const stoke__bad *e)
{
    if (l->nquar == STOKE_QUARANTINE_MAX)
        return;
    if (l->nquar == l->quar_cap) {
        size_t cap = l->quar_cap ? l->quar_cap * 2 : 16;
        stoke_bad_sample *v = realloc(l->quar, cap * sizeof(*v));
        if (!v)
            return; /* counted, not listed */
        l->quar = v;
        l->quar_cap = cap;
    }
    stoke_bad_sample *q = &l->quar[l->nquar++];
    *q = (stoke_bad_sample){.index = e->index,
                            .epoch = b->epoch,
                            .code = e->code,
                            .action = e->action,
                            .replacement = e->replacement};
    /* "npy /x.npy: sample 3: bad" -> source "npy /x.npy", reason "sample 3: bad" */
    const char *c = strstr(e->msg, ": ");
    if (c)
        stoke__fmt(q->source, sizeof(q->source), "%.*s", (int)(c - e->msg), e->msg);
    else
        stoke__strlcpy(q->source, l->ds.name, sizeof(q->source));
    stoke__shorten(q->reason, sizeof(q->reason), c ? c + 2 : e->msg); /* its end: the reason */
}

void stoke__bad_account(stoke_loader *l, stoke_batch *b)
{
    if (l->bad_gen != l->gen) {
        l->bad_gen = l->gen;
        l->bad_epoch = 0;
        l->bad_epoch_samples = 0;
    }
    if (b->status == STOKE_OK)
        l->bad_epoch_samples += b->count;
    /* In the batch's order: the bad sample past the budget ends the epoch (the batch is not
     * delivered), so it is quarantined as the error it is, and those after it in the batch
     * are not reached: neither counted nor listed (they were listed as skipped, and the
     * message counted them: "4 this epoch" for a budget of 2 crossed by the third) */
    const stoke__bad *over = NULL;
    for (size_t i = 0; i < b->bad.n && !over; i++) {
        const stoke__bad *e = &b->bad.v[i];
        l->st.bad_samples++;
        if (e->action != STOKE_ON_ERROR_ERROR) {
            l->bad_epoch++;
            if (b->status == STOKE_OK &&
                l->bad_epoch > budget(l, l->bad_epoch_samples + l->bad_epoch)) {
                over = e;
                stoke__bad ended = *e;
                ended.action = STOKE_ON_ERROR_ERROR;
                ended.replacement = UINT64_MAX;
                quarantine(l, b, &ended);
                break;
            }
            l->st.skipped_samples += e->action == STOKE_ON_ERROR_SKIP;
            l->st.replaced_samples += e->action == STOKE_ON_ERROR_REPLACE;
        }
        quarantine(l, b, e);
    }
    if (b->bad.n)
        b->bad.n = 0;
    if (!over)
        return;
    b->status = over->code;
    b->err_index = over->index;
    char lim[64];
    if (l->o.max_bad_fraction < 1.0)
        stoke__fmt(lim, sizeof(lim), "%" PRIu64 " (%g%% of the epoch)",
                   budget(l, l->bad_epoch_samples + l->bad_epoch), l->o.max_bad_fraction * 100.0);
    else
        stoke__fmt(lim, sizeof(lim), "%" PRIu64, l->o.max_bad);
    stoke__fmt(b->err_msg, sizeof(b->err_msg),
               "too many bad samples: %" PRIu64 " this epoch, "
               "the budget is %s; the one past it: %s",
               l->bad_epoch, lim, over->msg);
}

int stoke_loader_quarantine(const stoke_loader *l, size_t i, stoke_bad_sample *out)
{
    if (!l || !out)
        return stoke__fail(STOKE_EINVAL, "stoke_loader_quarantine: NULL argument");
    stoke_loader *m = (stoke_loader *)l;
    if (stoke__loader_foreign(l)) /* before mu: a fork's copy may hold it locked */
        return stoke__loader_forked_fail(m);
    stoke__loader_lock(m);
    size_t n = m->nquar;
    if (i < n)
        *out = m->quar[i];
    stoke__loader_unlock(m);
    if (i >= n)
        return stoke__fail(STOKE_ERANGE, "stoke_loader_quarantine: no entry %zu (%zu in all)", i,
                           n);
    return STOKE_OK;
}

int stoke_on_error_parse(const char *spec, stoke_loader_opts *o)
{
    if (!spec || !o)
        return stoke__fail(STOKE_EINVAL, "stoke_on_error_parse: NULL argument");
    int action = STOKE_ON_ERROR_ERROR, ok = strcmp(spec, "error") == 0;
    const char *rest = "";
    if (strncmp(spec, "skip", 4) == 0)
        action = STOKE_ON_ERROR_SKIP, rest = spec + 4, ok = 1;
    else if (strncmp(spec, "replace", 7) == 0)
        action = STOKE_ON_ERROR_REPLACE, rest = spec + 7, ok = 1;
    uint64_t n = UINT64_MAX;
    double frac = 1.0;
    size_t len = strlen(rest);
    if (ok && len > 0 && (rest[0] != ':' || len < 2)) {
        ok = 0;
    } else if (ok && len > 0 && rest[len - 1] == '%') { /* P%: a decimal 0..100 */
        char *end = NULL;
        frac = strtod(rest + 1, &end) / 100.0;
        ok = end == rest + len - 1 && rest[1] >= '0' && rest[1] <= '9' && frac <= 1.0;
    } else if (ok && len > 0) {
        ok = stoke__parse_u64(rest + 1, &n) == 0;
    }
    if (!ok)
        return stoke__fail(
            STOKE_EINVAL, "on_error '%s': expected error, skip[:N|:P%%] or replace[:N|:P%%]", spec);
    o->on_error = action;
    o->max_bad = n;
    o->max_bad_fraction = frac;
    return STOKE_OK;
}
