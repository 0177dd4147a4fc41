/* Credentials kept out of messages (remote.h): a URL's user:password@ and secret query
 * parameters (stoke__remote_redact), and what an error body echoes of a request's credentials
 * (stoke__remote_mask_secrets).  Without libcurl too: a source's name is redacted anyway. */
#include "sources/remote.h"

#include <ctype.h>
#include <string.h>
#include <strings.h>

/* 1 when a name of len bytes holds a secret, in any case: a presigned URL's signature,
 * credential or session token (S3's X-Amz-Signature, X-Amz-Credential, X-Amz-Security-Token;
 * GCS's X-Goog-*; CloudFront's Signature; Azure's sig), anything named a token, secret or
 * password, or a key (key, api_key, x-api-key: the last part after '-', '_' or '.'): such a URL
 * is as good as the password.  header: an echoed request's names too (Authorization,
 * Proxy-Authorization, Cookie, Set-Cookie). */
static int secret_name(const char *name, size_t len, int header)
{
    static const char *const ends[] = {"signature", "credential",    "token", "secret",
                                       "password",  "authorization", "cookie"};
    static const char *const whole[] = {"sig", "key", "apikey", "AWSAccessKeyId"};
    size_t part = len;
    while (part > 0 && !strchr("-_.", name[part - 1]))
        part--;
    for (size_t i = 0; i < sizeof(whole) / sizeof(*whole); i++) {
        size_t t = strlen(whole[i]);
        if ((len == t && strncasecmp(name, whole[i], t) == 0) ||
            (len - part == t && strncasecmp(name + part, whole[i], t) == 0))
            return 1;
    }
    for (size_t i = 0; i < sizeof(ends) / sizeof(*ends) - (header ? 0 : 2); i++) {
        size_t t = strlen(ends[i]);
        if (len >= t && strncasecmp(name + len - t, ends[i], t) == 0)
            return 1;
    }
    return 0;
}

static int secret_param(const char *key, size_t len)
{
    return secret_name(key, len, 0);
}

/* 1 when s[0 .. n) holds "://": a URL's start, not a parameter's name (a URL right after a
 * '?' or '&'), whose user info is to be looked at. */
static int holds_url(const char *s, size_t n)
{
    for (size_t i = 0; i + 2 < n; i++)
        if (s[i] == ':' && s[i + 1] == '/' && s[i + 2] == '/')
            return 1;
    return 0;
}

/* Where the user info of the URL whose "://" ends just before s ends: past its '@' (the host's
 * start), or NULL for none.  curl's host starts after the authority's LAST '@' (a password may
 * hold one).  A password may hold a raw '/', '?' or '#' too (curl takes the host from before
 * it, and fails): with a ':' before any of "/?#", what looks like user:password ends at the
 * URL's last '@' -- which hides the host of a URL with a port and an '@' later (host:8080/a@b),
 * rather than show a password.  An '@' before the ':' is the user's own, raw (an e-mail
 * address: me@example.com:pa/ss@host). */
static const char *after_userinfo(const char *s)
{
    size_t auth = strcspn(s, "/?#");
    const char *at = NULL;
    for (size_t i = 0; i < auth; i++)
        if (s[i] == '@')
            at = s + i;
    size_t colon = strcspn(s, ":/?#");
    if (s[colon] == ':')
        for (size_t i = colon + 1; s[i] && s[i] != ',' && !isspace((unsigned char)s[i]); i++)
            if (s[i] == '@')
                at = s + i;
    return at ? at + 1 : NULL;
}

/* The length of a secret parameter's value at s: up to '&', '#', ',' or white space -- or, for
 * a value that holds a URL with user info, past that URL's user info first (its password may
 * hold a '#' or '&': "key=a://u:p#w@h" showed "#w"). */
static size_t secret_value(const char *s)
{
    size_t v = strcspn(s, "&#, \t\r\n");
    for (size_t i = 0; i + 2 < v; i++) /* (every URL in it: the value grows past each) */
        if (s[i] == ':' && s[i + 1] == '/' && s[i + 2] == '/') {
            const char *host = after_userinfo(s + i + 3);
            if (host && (size_t)(host - s) > v)
                v = (size_t)(host - s) + strcspn(host, "&#, \t\r\n");
        }
    return v;
}

/* Byte c at out[(*k)++], written when it fits in n with the final 0 (as snprintf). */
static void put(char *out, size_t n, size_t *k, char c)
{
    if (*k + 1 < n)
        out[*k] = c;
    ++*k;
}

size_t stoke__remote_redact(char *out, size_t n, const char *s)
{
    size_t k = 0;  /* the bytes of the whole result */
    int url = 0;   /* in a URL: from its "://" to white space or ',' (a spec's next option) */
    int param = 0; /* at the start of a query parameter of that URL */
    while (*s) {
        if (s[0] == ':' && s[1] == '/' && s[2] == '/') { /* copy "://", skip any user info */
            for (int i = 0; i < 3; i++)
                put(out, n, &k, *s++);
            const char *host = after_userinfo(s);
            if (host)
                s = host;
            url = 1, param = 0;
            continue;
        }
        if (url && (*s == ',' || isspace((unsigned char)*s))) {
            url = param = 0;
        } else if (url && (*s == '?' || *s == '&')) {
            param = 1;
        } else if (url && *s == '#') {
            param = 0;
        } else if (param) { /* a parameter's name: its value kept, or "***" for a secret */
            param = 0;
            size_t key = strcspn(s, "=&#, \t\r\n");
            if (s[key] == '=' && secret_param(s, key) && !holds_url(s, key)) {
                for (size_t i = 0; i <= key; i++)
                    put(out, n, &k, *s++);
                s += secret_value(s);
                for (int i = 0; i < 3; i++)
                    put(out, n, &k, '*');
                continue;
            }
        }
        put(out, n, &k, *s++);
    }
    if (n)
        out[k < n ? k : n - 1] = 0;
    return k;
}

/* The bytes of a name in an echoed request or a URL's query (letters, digits, '-', '_', '.'). */
#define NAME_CHARS "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_."

/* Masks, in place, the values that an error body echoing the request (a debug endpoint, a
 * proxy's page) would show of its credentials: after a name that holds one (secret_name: an
 * Authorization header, a signature, token, secret, password or key, Azure's sig, a cookie),
 * quoted or not, and its ':' or '=', the value up to a quote or a ',', ';', '&', '<', '}' or
 * the line's end is "***" (a cookie's up to a quote, a '<' or the line's end: all its pairs). */
void stoke__remote_mask_secrets(char *s)
{
    for (char *p = s; *p;) {
        size_t len = strspn(p, NAME_CHARS);
        if (len == 0) {
            p++;
            continue;
        }
        char *v = p + len;
        v += strspn(v, "\"'");
        if ((*v != ':' && *v != '=') || !secret_name(p, len, 1)) {
            p += len;
            continue;
        }
        int cookie = len >= 6 && strncasecmp(p + len - 6, "cookie", 6) == 0;
        v += 1 + strspn(v + 1, " \t\"'");
        size_t vlen = strcspn(v, cookie ? "\"'<\r\n" : "\"',;&<}\r\n");
        if (vlen > 3) {
            memcpy(v, "***", 3);
            memmove(v + 3, v + vlen, strlen(v + vlen) + 1);
            vlen = 3;
        }
        p = v + vlen;
    }
}
