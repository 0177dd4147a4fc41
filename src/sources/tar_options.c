/* The tar source's options (tar.c's open): fields=, ragged=/packed=, max_len= and truncate,
 * mode=stream's own (shuffle_buffer=, rank=, world_size=, ...), each checked against the
 * fields and the mode, with an error that names the source and the option.  The fields'
 * kinds and slots are tar_fields.c's; the walk and the index are tar.c's. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "sources/tar_internal.h"

/* The field with extension ext, or -1. */
int stoke__tar_field_index(const stoke__tar_ds *t, const char *ext)
{
    for (int k = 0; k < t->nf; k++)
        if (strcmp(t->f[k].ext, ext) == 0)
            return k;
    return -1;
}

/* Splits "a:b:c" into the fields. */
static int parse_fields(const char *spec, stoke__tar_ds *t, const char *val)
{
    t->nf = 0;
    const char *p = val;
    for (;;) {
        const char *c = strchr(p, ':');
        size_t n = c ? (size_t)(c - p) : strlen(p);
        if (n == 0 || n >= sizeof(t->f[0].ext) || memchr(p, '/', n))
            return stoke__fail(STOKE_EINVAL,
                               "source '%s': bad fields= list '%s' (e.g. "
                               "fields=jpg:cls)",
                               spec, val);
        if (t->nf == STOKE__TAR_MAX_FIELDS)
            return stoke__fail(STOKE_EINVAL, "source '%s': more than %d fields in '%s'", spec,
                               STOKE__TAR_MAX_FIELDS, val);
        memcpy(t->f[t->nf].ext, p, n);
        t->f[t->nf].ext[n] = 0;
        if (stoke__tar_field_index(t, t->f[t->nf].ext) >=
            0) /* looks at the fields before this one */
            return stoke__fail(STOKE_EINVAL, "source '%s': field '%s' listed twice", spec,
                               t->f[t->nf].ext);
        t->nf++;
        if (!c)
            return STOKE_OK;
        p = c + 1;
    }
}

/* The field whose extension is the n bytes at p (ragged ones only when `ragged`), or -1. */
static int field_named(const stoke__tar_ds *t, const char *p, size_t n, int ragged)
{
    for (int j = 0; j < t->nf; j++)
        if ((!ragged || t->f[j].ragged) && strlen(t->f[j].ext) == n &&
            memcmp(t->f[j].ext, p, n) == 0)
            return j;
    return -1;
}

/* ragged=EXT:EXT (rg 0) and packed=EXT:EXT (rg 1): those raw fields vary in length, collated
 * padded with zeros or packed (dataset.h, ragged fields). */
int stoke__tar_mark_ragged(const char *spec, stoke__tar_ds *t, int rg)
{
    const char *list = t->ragged_opt[rg], *p = list;
    while (p && *p) {
        size_t n = strcspn(p, ":");
        int k = field_named(t, p, n, 0);
        if (k < 0 || (t->f[k].kind != STOKE__TAR_RAW && t->f[k].kind != STOKE__TAR_NPY))
            return stoke__fail(STOKE_EINVAL,
                               "source '%s': %s=%s: '%.*s' is %s (ragged fields are members "
                               "taken as bytes, .txt, .json, ..., or .npy arrays whose first "
                               "dimension varies)",
                               spec, rg ? "packed" : "ragged", list, (int)n, p,
                               k < 0 ? "not a field" : "neither raw nor .npy");
        t->f[k].ragged = 1 + (rg ? STOKE_COLLATE_PACK : STOKE_COLLATE_PAD);
        p += n + (p[n] == ':');
    }
    return STOKE_OK;
}

/* A decimal option value into *out: 0, or -1. */
static int parse_u64(const char *val, uint64_t *out)
{
    char *end;
    if (!*val || *val == '-' || *val == '+')
        return -1;
    errno = 0;
    unsigned long long v = strtoull(val, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

/* max_len=N (every ragged and packed field) or max_len=EXT:N:EXT:N: the most units (bytes of a
 * raw member, rows of a .npy one) of a field's member that a sample holds, its slot.  Needed by
 * each ragged field with mode=stream, which does not know the longest member; with the index
 * the slot is the smaller of it and the longest.  A longer member is a bad sample (the loader's
 * length check), or cut to max_len with `truncate` (the loader's truncated_samples). */
int stoke__tar_mark_max_len(const char *spec, stoke__tar_ds *t)
{
    const char *opt = t->max_len_opt, *p = opt;
    int any = 0;
    for (int k = 0; k < t->nf; k++)
        any |= t->f[k].ragged != 0;
    if ((opt || t->truncate) && !any)
        return stoke__fail(STOKE_EINVAL, "source '%s': %s is for ragged= and packed= fields", spec,
                           opt ? "max_len=" : "truncate");
    if (t->truncate && !opt)
        return stoke__fail(STOKE_EINVAL, "source '%s': truncate goes with max_len=N", spec);
    uint64_t v = 0;
    int bare = opt && parse_u64(opt, &v) == 0; /* max_len=N */
    /* (a number that does not parse, -1 or +3, is no field name: its count's message) */
    int numeric = opt && (opt[0] == '-' || opt[0] == '+' ||
                          (opt[0] >= '0' && opt[0] <= '9' && !strchr(opt, ':')));
    if (opt && (!*opt || (bare && (v == 0 || v > INT32_MAX)) || (!bare && numeric)))
        return stoke__fail(STOKE_EINVAL, "source '%s': max_len=%s: a count from 1 to %d", spec, opt,
                           INT32_MAX);
    if (bare) {
        for (int k = 0; k < t->nf; k++)
            if (t->f[k].ragged)
                t->f[k].max_len = (int64_t)v;
        p = NULL;
    }
    while (p && *p) {
        size_t n = strcspn(p, ":");
        int k = field_named(t, p, n, 1);
        if (k < 0)
            return stoke__fail(STOKE_EINVAL,
                               "source '%s': max_len=%s: '%.*s' is not a ragged or packed "
                               "field (max_len=N, or max_len=EXT:N:EXT:N)",
                               spec, opt, (int)n, p);
        p += n + (p[n] == ':');
        char num[24] = "";
        size_t m = strcspn(p, ":");
        if (m < sizeof(num))
            memcpy(num, p, m);
        if (!m || m >= sizeof(num) || parse_u64(num, &v) != 0 || v == 0 || v > INT32_MAX)
            return stoke__fail(STOKE_EINVAL,
                               "source '%s': max_len=%s: field '%s' needs a "
                               "count from 1 to %d",
                               spec, opt, t->f[k].ext, INT32_MAX);
        t->f[k].max_len = (int64_t)v;
        p += m + (p[m] == ':');
    }
    for (int k = 0; t->stream && k < t->nf; k++)
        if (t->f[k].ragged && !t->f[k].max_len)
            return stoke__fail(STOKE_ENOTSUP,
                               "source '%s': field '%s' is ragged: with mode=stream give its "
                               "max_len= (the most bytes, or .npy rows, of its member: the "
                               "longest is known only after reading every shard)",
                               spec, t->f[k].ext);
    return STOKE_OK;
}

/* The streaming mode's options (mode=stream|map, shuffle_buffer=, seed=, rank=, world_size=):
 * 1 when o is one (set in t), 0 when not, or the error recorded. */
static int stream_option(const char *spec, stoke__tar_ds *t, const char *o, const char *val)
{
    uint64_t v = 0;
    if (strcmp(o, "mode") == 0) {
        if (strcmp(val, "stream") != 0 && strcmp(val, "map") != 0)
            return stoke__fail(STOKE_EINVAL, "source '%s': mode=%s: stream or map", spec, val);
        t->stream = strcmp(val, "stream") == 0;
        return 1;
    }
    int which = strcmp(o, "shuffle_buffer") == 0 ? 0
                : strcmp(o, "seed") == 0         ? 1
                : strcmp(o, "rank") == 0         ? 2
                : strcmp(o, "world_size") == 0   ? 3
                                                 : -1;
    if (which < 0)
        return 0;
    if (parse_u64(val, &v) != 0 || (which >= 2 && v > INT32_MAX) || (which == 3 && v == 0))
        return stoke__fail(STOKE_EINVAL, "source '%s': %s=%s: not a %s", spec, o, val,
                           which == 3 ? "positive integer" : "non-negative integer");
    if (which == 0 && v > STOKE__TAR_SHUFFLE_MAX)
        return stoke__fail(STOKE_EINVAL, "source '%s': shuffle_buffer=%s: at most %d samples", spec,
                           val, STOKE__TAR_SHUFFLE_MAX);
    if (which == 0)
        t->shuffle_buffer = v;
    else if (which == 1)
        t->seed = v;
    else if (which == 2)
        t->rank = (int64_t)v;
    else
        t->world = (int64_t)v;
    return 1;
}

/* The options after the pattern: fields=, ragged= / packed=, the streaming mode's, the rest
 * for the image hook. */
int stoke__tar_parse_options(const char *spec, stoke__tar_ds *t, char *opts)
{
    const stoke__tar_image_hook *hk = stoke__tar_image_hook_get();
    if (hk) {
        t->image_opts = calloc(1, hk->opts_size);
        if (!t->image_opts)
            return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
        hk->opts_init(t->image_opts);
    }
    char *save = NULL;
    for (char *o = opts ? strtok_r(opts, ",", &save) : NULL; o; o = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(o, '=');
        const char *val = eq ? eq + 1 : ""; /* a bare word ("train") has the value "" */
        if (eq)
            *eq = 0;
        if (strcmp(o, "fields") == 0) {
            int rc = parse_fields(spec, t, val);
            if (rc)
                return rc;
            continue;
        }
        int rg = strcmp(o, "ragged") == 0 ? 0 : strcmp(o, "packed") == 0 ? 1 : -1;
        if (rg >= 0) { /* resolved once the fields are known (mark_ragged) */
            free(t->ragged_opt[rg]);
            if (!(t->ragged_opt[rg] = strdup(val)))
                return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
            continue;
        }
        if (strcmp(o, "truncate") == 0 && !eq) {
            t->truncate = 1;
            continue;
        }
        if (strcmp(o, "max_len") == 0) {
            free(t->max_len_opt);
            if (!(t->max_len_opt = strdup(val)))
                return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
            continue;
        }
        int sm = stream_option(spec, t, o, val);
        if (sm < 0)
            return sm;
        if (sm > 0 && strcmp(o, "seed") != 0) /* seed= keys the images' choices too */
            continue;
        char msg[256] = "";
        int used = hk ? hk->parse_opt(t->image_opts, o, val, msg, sizeof(msg)) : sm;
        if (used < 0)
            return stoke__fail(STOKE_EINVAL, "source '%s': option '%s': %s", spec, o, msg);
        if (used == 0)
            return stoke__fail(STOKE_EINVAL,
                               "source '%s': unknown option '%s' (fields=EXT:EXT, "
                               "ragged=EXT:EXT, packed=EXT:EXT, max_len=N, truncate, "
                               "mode=stream, shuffle_buffer=N, "
                               "seed=N, rank=R, world_size=W%s)",
                               spec, o,
                               hk ? ", or an image option"
                                  : "; image options need the images module, not in this build");
    }
    return STOKE_OK;
}

/* The streaming mode's options checked, rank and world from the environment when not given. */
int stoke__tar_stream_check(const char *spec, stoke__tar_ds *t)
{
    if ((t->ragged_opt[0] || t->ragged_opt[1]) && !t->max_len_opt)
        return stoke__fail(STOKE_ENOTSUP,
                           "source '%s': ragged= and packed= with mode=stream need max_len=N "
                           "(the most bytes, or .npy rows, of a member: the longest is known "
                           "only after reading every shard)",
                           spec);
    if ((t->rank < 0) != (t->world < 0))
        return stoke__fail(STOKE_EINVAL, "source '%s': rank= and world_size= go together", spec);
    if (t->rank < 0) {
        uint64_t r = 0, w = 1;
        int env = stoke__env_dist(spec, &r, &w);
        if (env < 0)
            return env;
        if (w == 0 || w > INT32_MAX || r > INT32_MAX)
            return stoke__fail(STOKE_EINVAL,
                               "source '%s': world size %" PRIu64 " from the "
                               "environment is out of range",
                               spec, w);
        t->rank = (int64_t)r;
        t->world = (int64_t)w;
    }
    if (t->rank >= t->world)
        return stoke__fail(STOKE_EINVAL,
                           "source '%s': rank %" PRId64 " is not below world size %" PRId64, spec,
                           t->rank, t->world);
    return STOKE_OK;
}
