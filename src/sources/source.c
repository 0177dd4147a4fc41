/* stoke_source_open: the spec strings of the built-in sources (grammar in sources.h). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/env.h"
#include "common/internal.h"
#include "sources/image.h"
#include "sources/remote.h"
#include "stoke/sources.h"

#define SPEC_MAX 4096

static int parse_dtype(const char *s, int *out)
{
    for (int d = STOKE_DTYPE_BOOL; d <= STOKE_DTYPE_C128; d++)
        if (strcmp(s, stoke_dtype_name(d)) == 0) {
            *out = d;
            return 0;
        }
    return -1;
}

/* "3x32x32" (empty: a scalar). */
static int parse_shape(const char *s, stoke_synthetic_opts *o)
{
    o->ndim = 0;
    if (!*s)
        return 0;
    char buf[256];
    if (strlen(s) >= sizeof(buf))
        return -1;
    stoke__strlcpy(buf, s, sizeof(buf));
    char *save = NULL;
    for (char *t = strtok_r(buf, "x", &save); t; t = strtok_r(NULL, "x", &save)) {
        uint64_t v;
        if (o->ndim >= STOKE_SYNTHETIC_MAX_DIMS || stoke__parse_u64(t, &v) != 0 || v == 0 ||
            v > (uint64_t)INT64_MAX)
            return -1;
        o->shape[o->ndim++] = (int64_t)v;
    }
    /* "3xx4" or a trailing 'x' */
    size_t n = strlen(s);
    if (s[0] == 'x' || s[n - 1] == 'x' || strstr(s, "xx"))
        return -1;
    return 0;
}

static int open_synthetic(const char *spec, const char *args, stoke_dataset *out)
{
    stoke_synthetic_opts o;
    stoke_synthetic_opts_init(&o);
    if (args) {
        char *buf = strdup(args);
        if (!buf)
            return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
        char *save = NULL;
        int first = 1, rc = STOKE_OK;
        for (char *t = strtok_r(buf, ",", &save); t && !rc;
             t = strtok_r(NULL, ",", &save), first = 0) {
            char *eq = strchr(t, '=');
            uint64_t v;
            if (!eq) {
                if (!first || stoke__parse_u64(t, &v) != 0)
                    rc = stoke__fail(STOKE_EINVAL,
                                     "source '%s': '%s' is not a sample count or key=value "
                                     "(synthetic[:N][,shape=AxB..][,seed=S][,classes=C]"
                                     "[,dtype=T][,delay=I:US])",
                                     spec, t);
                else
                    o.length = v;
                continue;
            }
            *eq = 0;
            const char *key = t, *val = eq + 1;
            if (strcmp(key, "shape") == 0) {
                if (parse_shape(val, &o) != 0)
                    rc = stoke__fail(STOKE_EINVAL,
                                     "source '%s': bad shape '%s' (e.g. shape=3x224x224, at "
                                     "most %d positive dimensions)",
                                     spec, val, STOKE_SYNTHETIC_MAX_DIMS);
            } else if (strcmp(key, "seed") == 0) {
                if (stoke__parse_u64(val, &o.seed) != 0)
                    rc = stoke__fail(STOKE_EINVAL, "source '%s': bad seed '%s'", spec, val);
            } else if (strcmp(key, "classes") == 0) {
                if (stoke__parse_u64(val, &v) != 0 || v == 0 || v > UINT32_MAX)
                    rc = stoke__fail(STOKE_EINVAL,
                                     "source '%s': bad classes '%s' (1 to %u: labels index %% C; "
                                     "leave classes out for no label)",
                                     spec, val, (unsigned)UINT32_MAX);
                else
                    o.classes = (uint32_t)v;
            } else if (strcmp(key, "dtype") == 0) {
                if (parse_dtype(val, &o.dtype) != 0)
                    rc = stoke__fail(STOKE_EINVAL,
                                     "source '%s': bad dtype '%s' (u8, i8, u16, ..., f32, f64)",
                                     spec, val);
            } else if (strcmp(key, "delay") == 0) {
                char idx[32];
                const char *colon = strchr(val, ':');
                uint64_t us = 0;
                size_t n = colon ? (size_t)(colon - val) : 0;
                if (n && n < sizeof(idx)) {
                    memcpy(idx, val, n);
                    idx[n] = 0;
                }
                if (!n || n >= sizeof(idx) || stoke__parse_u64(idx, &o.delay_index) != 0 ||
                    stoke__parse_u64(colon + 1, &us) != 0 || us > UINT32_MAX)
                    rc = stoke__fail(STOKE_EINVAL,
                                     "source '%s': bad delay '%s' (delay=INDEX:MICROSECONDS)", spec,
                                     val);
                else
                    o.delay_us = (uint32_t)us;
            } else if (strcmp(key, "n") == 0 || strcmp(key, "length") == 0) {
                if (stoke__parse_u64(val, &o.length) != 0)
                    rc = stoke__fail(STOKE_EINVAL, "source '%s': bad length '%s'", spec, val);
            } else {
                rc = stoke__fail(STOKE_EINVAL,
                                 "source '%s': unknown option '%s' (shape, seed, classes, "
                                 "dtype, delay)",
                                 spec, key);
            }
        }
        free(buf);
        if (rc)
            return rc;
    }
    return stoke_synthetic_open(&o, out);
}

/* The options of a source, as they start a comma-separated word: "key=" takes a value, a bare
 * "word" is the whole word.  One list per source gives the parser its matches and the messages
 * their lists, so the two cannot drift apart. */
static const char *const NPY_KEYS[] = {"labels=", "io=", "direct=", NULL};
static const char *const IMAGES_KEYS[] = {"size=", "train", "eval",  "layout=",           "dtype=",
                                          "mean=", "std=",  "seed=", "max_decode_bytes=", NULL};

/* 1 when the comma-separated word at s starts with one of keys' options. */
static int known_option(const char *s, const char *const *keys)
{
    size_t word = strcspn(s, ",");
    for (; *keys; keys++) {
        size_t n = strlen(*keys);
        if ((*keys)[n - 1] == '=' ? strncmp(s, *keys, n) == 0
                                  : word == n && strncmp(s, *keys, n) == 0)
            return 1;
    }
    return 0;
}

/* keys as the messages list them: "labels=, io=, direct=". */
static const char *option_list(const char *const *keys, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = 0;
    for (const char *const *k = keys; *k && at < len; k++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", k == keys ? "" : ", ", *k);
    return buf;
}

/* A local path that does not exist and holds ",word=" (or, where the source has options of
 * one word, ",word" followed by ',' or the end): an option misspelt (",batchy=3",
 * ",lables=/d/y.npy", ",trian") that the parser, which takes only the options it knows, left
 * in the path.  Fails (STOKE_ENOENT: the file is missing all the same) with a message naming
 * the word and the options of `kind` (the path's "cannot open" named a file nobody meant),
 * and returns its status; 0 otherwise.  A directory named "a,b/" is no option. */
static int misspelt_option(const char *path, const char *kind, const char *const *keys)
{
    if (strstr(path, "://") || access(path, F_OK) == 0 || errno != ENOENT)
        return 0;
    int bare = 0;
    for (const char *const *k = keys; *k; k++)
        bare |= (*k)[strlen(*k) - 1] != '=';
    char known[256];
    for (const char *c = strchr(path, ','); c; c = strchr(c + 1, ',')) {
        size_t n = 0;
        if (!isalpha((unsigned char)c[1]))
            continue;
        while (isalnum((unsigned char)c[1 + n]) || c[1 + n] == '_')
            n++;
        if (c[1 + n] == '=' || (bare && (c[1 + n] == ',' || !c[1 + n])))
            return stoke__fail(STOKE_ENOENT,
                               "%s: no file '%s', and '%.*s' is no %s: option (%s): a "
                               "misspelt option?",
                               kind, path, (int)strcspn(c + 1, ","), c + 1, kind,
                               option_list(keys, known, sizeof(known)));
    }
    return 0;
}

/* Index of the first ',' in s that starts a known option, or strlen(s). */
static size_t npy_path_len(const char *s)
{
    for (const char *c = strchr(s, ','); c; c = strchr(c + 1, ','))
        if (known_option(c + 1, NPY_KEYS))
            return (size_t)(c - s);
    return strlen(s);
}

static int parse_io(const char *s, int *io)
{
    for (int m = STOKE_NPY_IO_MMAP; m <= STOKE_NPY_IO_REMOTE; m++)
        if (strcmp(s, stoke_npy_io_name(m)) == 0) {
            *io = m;
            return 0;
        }
    return -1;
}

static int parse_direct(const char *s, int *direct)
{
    static const char *const names[] = {"auto", "on", "off"};
    for (int m = 0; m < 3; m++)
        if (strcmp(s, names[m]) == 0) {
            *direct = STOKE_NPY_DIRECT_AUTO + m;
            return 0;
        }
    return -1;
}

static int open_npy(const char *spec, const char *args, stoke_dataset *out)
{
    if (!args || !*args)
        return stoke__fail(STOKE_EINVAL, "source '%s': no file name (npy:PATH)", spec);
    char *buf = strdup(args);
    if (!buf)
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    stoke_npy_opts o;
    stoke_npy_opts_init(&o);
    int rc = STOKE_OK;
    size_t plen = npy_path_len(buf);
    char *opt = buf[plen] ? buf + plen + 1 : NULL;
    buf[plen] = 0;
    if (!*buf) {
        rc = stoke__fail(STOKE_EINVAL, "source '%s': no file name (npy:PATH)", spec);
        goto done;
    }
    while (opt && !rc) {
        /* an option's value runs up to the next ",key=" */
        size_t n = npy_path_len(opt);
        char *next = opt[n] ? opt + n + 1 : NULL;
        opt[n] = 0;
        if (strncmp(opt, "labels=", 7) == 0) {
            o.labels_path = opt + 7;
            if (!*o.labels_path)
                rc = stoke__fail(STOKE_EINVAL, "source '%s': empty labels= file name", spec);
        } else if (strncmp(opt, "io=", 3) == 0 && parse_io(opt + 3, &o.io) == 0) {
            /* o.io set */
        } else if (strncmp(opt, "direct=", 7) == 0 && parse_direct(opt + 7, &o.direct) == 0) {
            /* o.direct set */
        } else {
            rc = stoke__fail(STOKE_EINVAL,
                             "source '%s': bad option '%s' (io=auto, io=mmap, io=pread, "
                             "io=uring, io=remote, direct=auto, direct=on or direct=off)",
                             spec, opt);
        }
        opt = next;
    }
    if (!rc)
        rc = misspelt_option(buf, "npy", NPY_KEYS);
    if (!rc && o.labels_path)
        rc = misspelt_option(o.labels_path, "npy", NPY_KEYS);
    if (!rc)
        rc = stoke_npy_open_opts(buf, &o, out);
done:
    free(buf);
    return rc;
}

/* ---- images:DIR[,option]... ---- */

static int open_images(const char *spec, const char *args, stoke_dataset *out)
{
    if (!args || !*args)
        return stoke__fail(STOKE_EINVAL, "source '%s': no directory (images:DIR)", spec);
    char *buf = strdup(args);
    if (!buf)
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    stoke_images_opts o;
    stoke_images_opts_init(&o);
    stoke__image_opts img;
    stoke__image_opts_init(&img);
    char *opt = NULL; /* DIR ends at the first ',' that starts an option */
    for (char *c = strchr(buf, ','); c && !opt; c = strchr(c + 1, ','))
        if (known_option(c + 1, IMAGES_KEYS)) {
            *c = 0;
            opt = c + 1;
        }
    int rc =
        *buf ? STOKE_OK : stoke__fail(STOKE_EINVAL, "source '%s': no directory (images:DIR)", spec);
    char *save = NULL;
    for (char *t = opt ? strtok_r(opt, ",", &save) : NULL; t && !rc;
         t = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(t, '='), why[256] = "";
        if (eq)
            *eq = 0;
        int got = stoke__image_parse_opt(&img, t, eq ? eq + 1 : NULL, why, sizeof(why));
        if (got < 0)
            rc = stoke__fail(got, "source '%s': %s", spec, why);
        else if (got == 0)
            rc = stoke__fail(STOKE_EINVAL, "source '%s': unknown option '%s' (%s)", spec, t,
                             option_list(IMAGES_KEYS, why, sizeof(why)));
    }
    if (!rc) {
        o.image_size = img.size;
        o.train = img.train;
        o.layout = img.chw ? STOKE_IMAGES_CHW : STOKE_IMAGES_HWC;
        o.dtype = img.dtype;
        o.normalize = img.normalize;
        memcpy(o.mean, img.mean, sizeof(o.mean));
        memcpy(o.std, img.std, sizeof(o.std));
        o.seed = img.seed;
        o.max_decode_bytes = img.max_decode;
        rc = misspelt_option(buf, "images", IMAGES_KEYS);
    }
    if (!rc)
        rc = stoke_images_open(buf, &o, out);
    free(buf);
    return rc;
}

const char *stoke_source_redact(char *out, size_t n, const char *spec)
{
    if (out && n)
        stoke__remote_redact(out, n, spec ? spec : "");
    return out;
}

int stoke_source_open(const char *spec, stoke_dataset *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "source: NULL dataset");
    stoke_dataset_init(out);
    if (!spec || !*spec)
        return stoke__fail(STOKE_EINVAL, "source: empty spec (synthetic[:N] or npy:PATH)");
    if (strlen(spec) > SPEC_MAX)
        return stoke__fail(STOKE_EINVAL, "source: spec longer than %d characters", SPEC_MAX);
    const char *colon = strchr(spec, ':');
    size_t kind_len = colon ? (size_t)(colon - spec) : strlen(spec);
    const char *args = colon ? colon + 1 : NULL;
    if (kind_len == 9 && strncmp(spec, "synthetic", 9) == 0) {
        if (args && !*args)
            return stoke__fail(STOKE_EINVAL, "source '%s': nothing after ':'", spec);
        return open_synthetic(spec, args, out);
    }
    if (kind_len == 3 && strncmp(spec, "npy", 3) == 0)
        return open_npy(spec, args, out);
    if (kind_len == 3 && strncmp(spec, "tar", 3) == 0)
        return stoke_tar_open(args, out);
    if (kind_len == 6 && strncmp(spec, "images", 6) == 0)
        return open_images(spec, args, out);
    char shown[512]; /* (a mistyped scheme's URL keeps no password in the message) */
    stoke_source_redact(shown, sizeof(shown), spec);
    return stoke__fail(STOKE_EINVAL,
                       "source '%s': unknown source '%.*s' (expected synthetic[:N], npy:PATH, "
                       "images:DIR or tar:PATTERN)",
                       shown, (int)(kind_len > 64 ? 64 : kind_len), spec);
}
