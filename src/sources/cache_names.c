/* The names of the cache's files (cache_internal.h): a hash of the URL a file is requested by,
 * without credentials and without a presigned URL's signing parameters, and the URL's last
 * path segment; which kind of cache file a directory entry is. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/internal.h"
#include "sources/cache_internal.h"

#define BASE_MAX (STOKE__CACHE_NAME_MAX - STOKE__CACHE_HEXLEN - 1)

/* splitmix64's finalizer without its increment (common/internal.h's stoke__mix64 has it):
 * kept, since the copies' names on disk are made with it. */
static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9u;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBu;
    return z ^ (z >> 31);
}

/* The presigned URL kinds a query has (sig_kinds), whose parameters change when the URL is
 * signed again while the file stays the same. */
enum {
    SIG_AMZ = 1,   /* X-Amz-Signature: S3's SigV4 (X-Amz-*) */
    SIG_GOOG = 2,  /* X-Goog-Signature: GCS's V4 (X-Goog-*) */
    SIG_V2 = 4,    /* Signature and a key id: S3's V2 (AWSAccessKeyId), GCS's V2 (GoogleAccessId),
                    * OSS's (OSSAccessKeyId), CloudFront's (Key-Pair-Id; Policy or Expires) */
    SIG_AZURE = 8, /* sig and sv: an Azure SAS (sig, se, st, sv, sp, sr, spr, sk*, ...) */
};

/* 1 if query parameter [p, p + n) ("name=value") is named `name` (any case). */
static int param_is(const char *p, size_t n, const char *name)
{
    size_t k = strcspn(p, "=&#");
    return k <= n && strlen(name) == k && strncasecmp(p, name, k) == 0;
}

static int sig_kinds(const char *q)
{
    int kinds = 0, s3 = 0, az = 0;
    for (const char *p = q; p && *p && *p != '#';) {
        size_t n = strcspn(p, "&#");
        kinds |= param_is(p, n, "x-amz-signature") ? SIG_AMZ : 0;
        kinds |= param_is(p, n, "x-goog-signature") ? SIG_GOOG : 0;
        s3 |= param_is(p, n, "signature") ? 1
              : param_is(p, n, "awsaccesskeyid") || param_is(p, n, "googleaccessid") ||
                      param_is(p, n, "ossaccesskeyid") || param_is(p, n, "key-pair-id")
                  ? 2
                  : 0;
        az |= param_is(p, n, "sig") ? 1 : param_is(p, n, "sv") ? 2 : 0;
        p += n + (p[n] == '&');
    }
    return kinds | (s3 == 3 ? SIG_V2 : 0) | (az == 3 ? SIG_AZURE : 0);
}

/* 1 if query parameter [p, p + n) is one of the signing parameters of the presigned URL
 * kinds `kinds`: only those of a kind whose signature the query has, so that a parameter of
 * the same name that selects content (?sp=train, ?st=0) still names its own copy. */
static int signing_param(const char *p, size_t n, int kinds)
{
    static const char *const v2[] = {
        "signature",   "expires", "awsaccesskeyid",       "googleaccessid", "ossaccesskeyid",
        "key-pair-id", "policy",  "x-amz-security-token", "security-token"};
    static const char *const azure[] = {"sig", "se",  "st",    "sv",    "sp",  "sr",
                                        "spr", "si",  "skoid", "sktid", "skt", "ske",
                                        "sks", "skv", "ss",    "srt",   "sdd"};
    size_t k = strcspn(p, "=&#");
    if ((kinds & SIG_AMZ) && k > 6 && strncasecmp(p, "x-amz-", 6) == 0)
        return 1;
    if ((kinds & SIG_GOOG) && k > 7 && strncasecmp(p, "x-goog-", 7) == 0)
        return 1;
    for (size_t i = 0; (kinds & SIG_V2) && i < STOKE__ARRAY_LEN(v2); i++)
        if (param_is(p, n, v2[i]))
            return 1;
    for (size_t i = 0; (kinds & SIG_AZURE) && i < STOKE__ARRAY_LEN(azure); i++)
        if (param_is(p, n, azure[i]))
            return 1;
    return 0;
}

/* The names of f's files: the hash of the URL it is requested by (an s3:// URL's has the
 * endpoint), without the user and password before the host and without a presigned URL's
 * signing parameters (signing_param, of the kinds whose signature the query holds: the same
 * file signed again is the same copy), and the
 * URL's last path segment.  Not the URL of messages, whose secret-looking query values are
 * "***": two URLs that differed only there (?key=shard-000.tar, ?key=shard-001.tar) shared
 * one copy. */
void stoke__cache_names_of(const stoke__remote_file *f, stoke__cache_names *nm)
{
    const char *key = f->req, *host = strstr(key, "://");
    size_t len = strlen(key);
    unsigned char *skip = calloc(len + 1, 1); /* bytes not hashed (none without memory) */
    if (skip && host) {
        host += 3;
        size_t k = strcspn(host, "/?#");
        const char *at = memchr(host, '@', k);
        if (at)
            memset(skip + (host - key), 1, (size_t)(at + 1 - host));
    }
    const char *q = strchr(key, '?');
    int kinds = q ? sig_kinds(q + 1) : 0;
    for (const char *p = q && kinds ? q + 1 : NULL; skip && p && *p && *p != '#';) {
        size_t n = strcspn(p, "&#");
        if (signing_param(p, n, kinds))
            memset(skip + (p - key), 1, n + (p[n] == '&'));
        p += n + (p[n] == '&');
    }
    uint64_t a = 0xcbf29ce484222325u, b = 0x9E3779B97F4A7C15u, m = 0; /* m: bytes hashed */
    for (size_t i = 0; i < len; i++) {
        if (skip && skip[i])
            continue;
        unsigned char ch = (unsigned char)key[i];
        a = (a ^ ch) * 0x100000001b3u; /* FNV-1a, and an independent second lane */
        b = mix64(b ^ ch ^ (m++ << 8));
    }
    free(skip);
    a = mix64(a ^ m);
    b = mix64(b ^ a);
    snprintf(nm->hex, sizeof(nm->hex), "%016" PRIx64 "%016" PRIx64, a, b);
    const char *u = f->url, *seg = u;
    size_t ulen = strcspn(u, "?#");
    for (size_t i = 0; i < ulen; i++)
        if (u[i] == '/')
            seg = u + i + 1;
    char base[BASE_MAX];
    size_t bl = 0;
    for (const char *s = seg; s < u + ulen && bl + 1 < sizeof(base); s++) {
        char ch = *s;
        int ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
                 ch == '.' || ch == '_' || ch == '-';
        base[bl++] = ok ? ch : '_';
    }
    base[bl] = 0;
    snprintf(nm->data, sizeof(nm->data), "%s-%s", nm->hex, bl ? base : "file");
    snprintf(nm->part, sizeof(nm->part), "%s.part", nm->hex);
    snprintf(nm->lock, sizeof(nm->lock), "%s.lock", nm->hex);
}

int stoke__cache_kind_of(const char *name)
{
    for (int i = 0; i < STOKE__CACHE_HEXLEN; i++)
        if (!((name[i] >= '0' && name[i] <= '9') || (name[i] >= 'a' && name[i] <= 'f')))
            return K_OTHER;
    if (name[STOKE__CACHE_HEXLEN] == '-' && name[STOKE__CACHE_HEXLEN + 1])
        return K_DATA;
    if (strcmp(name + STOKE__CACHE_HEXLEN, ".part") == 0)
        return K_PART;
    if (strcmp(name + STOKE__CACHE_HEXLEN, ".lock") == 0)
        return K_LOCK;
    return K_OTHER;
}
