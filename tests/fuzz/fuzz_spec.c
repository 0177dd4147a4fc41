/* libFuzzer target: what a source spec is parsed and shown as -- the brace expansion of a tar:
 * shard pattern (src/sources/tar_shards.c, stoke__tar_expand: {000000..004095}, {a,b}, nested)
 * and the redaction of URLs for messages (src/sources/remote_redact.c: stoke__remote_redact,
 * what stoke_source_redact calls, and stoke__remote_mask_secrets).  Built only with
 * -DSTOKE_FUZZ=ON and clang; run by tests/fuzz/run.sh (target spec).
 *
 * The input, up to its first 0x01 byte, is a pattern and a text to redact; after it, parts
 * separated by 0x01 make a URL with user info: PREFIX SCHEME "://" USER ":" PASSWORD "@" REST.
 * Beyond "no crash, no sanitizer report" it checks: every expanded pattern is without '{' and
 * no longer than the pattern, a pattern without '{' is its own one expansion, and a refusal is
 * one of the codes tar_shards.h says; the redaction's length is snprintf's (the whole result's,
 * whatever the buffer), a buffer of n bytes gets its first n - 1 bytes and a 0 and nothing past
 * them; no byte of a URL's password is in what is shown (remote.h: every user:password@, as
 * curl reads it: a password of any bytes but white space and ',', which end the URL; told by
 * a byte of it that the rest of the text does not have); masking never lengthens a text. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "fuzz_support.h"
#include "sources/remote.h"
#include "sources/tar_shards.h"
#include "stoke/status.h"

typedef struct leaves {
    size_t pat_len;
    unsigned long n;
    const char *only; /* a pattern without '{': its one expansion */
} leaves;

static int leaf(void *ctx, const char *pat)
{
    leaves *l = ctx;
    check(strchr(pat, '{') == NULL);
    check(strlen(pat) <= l->pat_len);
    if (l->only)
        check(strcmp(pat, l->only) == 0);
    return ++l->n >= 20000 ? STOKE_ELIMIT : 0; /* (bounded: a fuzz run, not a shard list) */
}

static void expand(const char *pat)
{
    leaves l = {strlen(pat), 0, strchr(pat, '{') ? NULL : pat};
    int rc = stoke__tar_expand("tar:fuzz", pat, leaf, &l);
    check(rc == 0 || rc == STOKE_EINVAL || rc == STOKE_ELIMIT || rc == STOKE_ENOMEM);
    if (rc == 0)
        check(l.n >= 1);
    if (l.only)
        check(rc == 0 && l.n == 1);
}

/* redact(s) whole, malloc'd, checked against buffers of other sizes; its length in *len. */
static char *redact(const char *s, size_t *len)
{
    size_t k = stoke__remote_redact(NULL, 0, s);
    char *full = malloc(k + 1);
    if (!full)
        return NULL;
    check(stoke__remote_redact(full, k + 1, s) == k && strlen(full) == k);
    size_t sizes[3] = {1, k / 2 + 1, k};
    for (int i = 0; i < 3; i++) { /* exact-size heap blocks: ASan sees a write past one */
        size_t n = sizes[i];
        char *out = n ? malloc(n) : NULL;
        if (!out)
            continue;
        check(stoke__remote_redact(out, n, s) == k);
        check(strlen(out) == n - 1 || (n > k && strlen(out) == k));
        check(memcmp(out, full, strlen(out)) == 0);
        free(out);
    }
    *len = k;
    return full;
}

/* How many times needle[0 .. n) is in hay[0 .. hay_n). */
static size_t count(const char *hay, size_t hay_n, const char *needle, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; n && i + n <= hay_n; i++)
        c += memcmp(hay + i, needle, n) == 0;
    return c;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* The first part as a C string (up to a 0 too). */
    const uint8_t *sep = memchr(data, 1, size);
    size_t head = sep ? (size_t)(sep - data) : size;
    char *s = malloc(head + 1);
    if (!s)
        return 0;
    memcpy(s, data, head);
    s[head] = 0;
    expand(s);
    size_t k;
    free(redact(s, &k));
    char *m = strdup(s);
    if (m) {
        size_t before = strlen(m);
        stoke__remote_mask_secrets(m);
        check(strlen(m) <= before);
        free(m);
    }
    free(s);
    if (!sep)
        return 0;

    /* PREFIX SCHEME USER PASSWORD REST, separated by 0x01: the URL with user info. */
    const char *part[5] = {"", "http", "user", "", ""};
    size_t plen[5] = {0, 4, 4, 0, 0};
    const uint8_t *p = sep + 1, *end = data + size;
    for (int i = 0; i < 5 && p <= end; i++) {
        const uint8_t *e = i < 4 ? memchr(p, 1, (size_t)(end - p)) : NULL;
        if (!e)
            e = end;
        part[i] = (const char *)p, plen[i] = (size_t)(e - p);
        p = e + 1;
    }
    if (memchr(part[0], 0, plen[0]) || memchr(part[1], 0, plen[1]) || memchr(part[2], 0, plen[2]) ||
        memchr(part[3], 0, plen[3]) || memchr(part[4], 0, plen[4]))
        return 0;
    /* curl's user info: a user without ':' or what ends the authority; a password of bytes
     * that do not end the URL (white space, ',') */
    for (size_t i = 0; i < plen[2]; i++)
        if (strchr(":/?#, \t\r\n\v\f", part[2][i]))
            return 0;
    for (size_t i = 0; i < plen[3]; i++)
        if (strchr(", \t\r\n\v\f", part[3][i]))
            return 0;
    if (plen[3] == 0)
        return 0;
    size_t n = plen[0] + plen[1] + 3 + plen[2] + 1 + plen[3] + 1 + plen[4];
    char *url = malloc(n + 1);
    if (!url)
        return 0;
    snprintf(url, n + 1, "%.*s%.*s://%.*s:%.*s@%.*s", (int)plen[0], part[0], (int)plen[1], part[1],
             (int)plen[2], part[2], (int)plen[3], part[3], (int)plen[4], part[4]);
    /* A byte of the password that is nowhere else in the text: shown, it is the password's
     * (a password's whole text may be made of the rest's bytes around a cut-out) */
    int mark = -1;
    for (size_t i = 0; i < plen[3] && mark < 0; i++)
        if (count(url, n, part[3] + i, 1) == 1 && part[3][i] != '*')
            mark = (unsigned char)part[3][i];
    if (mark >= 0) {
        char *shown = redact(url, &k);
        if (shown) {
            if (memchr(shown, mark, k))
                fprintf(stderr, "redacted '%s' to '%s'\n", url, shown);
            check(memchr(shown, mark, k) == NULL);
            free(shown);
        }
    }
    free(url);
    return 0;
}
