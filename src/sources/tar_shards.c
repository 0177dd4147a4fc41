/* Shard patterns (tar_shards.h): the brace groups of a tar: spec's pattern expanded, as
 * braceexpand's, before tar.c globs what is left.  Apart from tar.c so that it can be tested and
 * fuzzed alone (tests/fuzz/fuzz_spec.c). */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "sources/tar_shards.h"
#include "stoke/status.h"

/* Parses "A..B" (decimal, A <= B or A > B): 0, or -1. */
static int parse_range(const char *s, size_t n, uint64_t *a, uint64_t *b, int *width)
{
    const char *dots = NULL;
    for (size_t i = 0; i + 1 < n; i++)
        if (s[i] == '.' && s[i + 1] == '.') {
            dots = s + i;
            break;
        }
    if (!dots || dots == s || dots + 2 == s + n)
        return -1;
    uint64_t v[2] = {0, 0};
    const char *p[2] = {s, dots + 2}, *e[2] = {dots, s + n};
    for (int k = 0; k < 2; k++) {
        if (e[k] - p[k] > 18)
            return -1;
        for (const char *c = p[k]; c < e[k]; c++) {
            if (*c < '0' || *c > '9')
                return -1;
            v[k] = v[k] * 10 + (uint64_t)(*c - '0');
        }
    }
    *a = v[0];
    *b = v[1];
    /* zero-padded when either end has a leading zero: the width of the longer end */
    size_t wa = (size_t)(dots - s), wb = (size_t)(s + n - dots - 2);
    *width = ((s[0] == '0' && wa > 1) || (dots[2] == '0' && wb > 1)) ? (int)(wa > wb ? wa : wb) : 0;
    return 0;
}

/* The '}' that closes the '{' at open (groups nest, as braceexpand's), or NULL. */
static const char *brace_close(const char *open)
{
    int depth = 0;
    for (const char *q = open; *q; q++)
        if (*q == '{')
            depth++;
        else if (*q == '}' && --depth == 0)
            return q;
    return NULL;
}

/* The ',' in [p, end) outside nested braces, or NULL. */
static const char *list_comma(const char *p, const char *end)
{
    int depth = 0;
    for (; p < end; p++)
        if (*p == '{')
            depth++;
        else if (*p == '}')
            depth--;
        else if (*p == ',' && depth == 0)
            return p;
    return NULL;
}

/* Expands the first brace group of pat ({A..B} or {x,y,...}, whose items may hold groups of
 * their own), recursively. */
static int expand(const char *spec, const char *pat, stoke__tar_leaf_fn leaf, void *ctx, int depth)
{
    const char *open = strchr(pat, '{');
    if (!open)
        return leaf(ctx, pat);
    if (depth > 16)
        return stoke__fail(STOKE_EINVAL, "source '%s': too many brace groups", spec);
    const char *close = brace_close(open);
    if (!close)
        return stoke__fail(STOKE_EINVAL, "source '%s': '{' without '}'", spec);
    size_t pre = (size_t)(open - pat), inner = (size_t)(close - open - 1);
    const char *rest = close + 1;
    size_t blen = pre + strlen(rest) + 64 + inner;
    char *buf = malloc(blen);
    if (!buf)
        return stoke__fail(STOKE_ENOMEM, "source '%s': out of memory", spec);
    uint64_t a, b;
    int width, rc = STOKE_OK;
    if (parse_range(open + 1, inner, &a, &b, &width) == 0) {
        if ((a > b ? a - b : b - a) >= STOKE__TAR_SHARDS_MAX)
            rc = stoke__fail(STOKE_ELIMIT, "source '%s': range {%.*s} has more than %d values",
                             spec, (int)inner, open + 1, STOKE__TAR_SHARDS_MAX);
        for (uint64_t v = a;; v = a <= b ? v + 1 : v - 1) {
            if (rc)
                break;
            snprintf(buf, blen, "%.*s%0*" PRIu64 "%s", (int)pre, pat, width, v, rest);
            rc = expand(spec, buf, leaf, ctx, depth + 1);
            if (v == b)
                break;
        }
    } else {
        const char *p = open + 1;
        for (;;) {
            const char *c = list_comma(p, close);
            const char *e = c ? c : close;
            snprintf(buf, blen, "%.*s%.*s%s", (int)pre, pat, (int)(e - p), p, rest);
            if ((rc = expand(spec, buf, leaf, ctx, depth + 1)) != 0 || !c)
                break;
            p = c + 1;
        }
    }
    free(buf);
    return rc;
}

int stoke__tar_expand(const char *spec, const char *pat, stoke__tar_leaf_fn leaf, void *ctx)
{
    return expand(spec, pat, leaf, ctx, 0);
}
