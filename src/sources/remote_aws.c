/* S3 for the remote files (remote_internal.h): credentials, region and endpoint from the
 * environment and the AWS credentials and config files (profiles), s3:// URLs turned into the
 * endpoint's (virtual host or path-style), and AWS Signature V4 through libcurl
 * (CURLOPT_AWS_SIGV4).  The request engine is remote.c's.  Secrets never go into a message;
 * their copies are cleared before they are freed. */
#define _GNU_SOURCE
#include "sources/remote.h"

#ifdef STOKE_HAVE_LIBCURL

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/env.h"
#include "common/internal.h"
#include "sources/remote_internal.h"

/* SHA-256 of an empty body: what a GET signs as its payload (S3 wants the header). */
#define EMPTY_SHA256 "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

/* ---- settings: environment and the AWS files ---------------------------------------------- */

char *stoke__remote_trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = 0;
    return s;
}

char *stoke__remote_ini_get(const char *path, const char *section, const char *key)
{
    FILE *f = path ? fopen(path, "re") : NULL;
    if (!f)
        return NULL;
    /* whole lines, of any length: a session token may be longer than any buffer, and the
     * rest of a line cut would be read as a line of its own */
    char *line = NULL;
    size_t cap = 0;
    int in = 0;
    char *out = NULL;
    while (!out && getline(&line, &cap, f) >= 0) {
        char *p = stoke__remote_trim(line);
        if (!*p || *p == '#' || *p == ';')
            continue;
        if (*p == '[') {
            char *e = strchr(p, ']');
            if (e) {
                *e = 0;
                in = strcmp(stoke__remote_trim(p + 1), section) == 0;
            }
            continue;
        }
        char *eq = strchr(p, '=');
        if (!in || !eq)
            continue;
        *eq = 0;
        if (strcmp(stoke__remote_trim(p), key) == 0)
            out = strdup(stoke__remote_trim(eq + 1));
    }
    if (line)
        explicit_bzero(line, cap); /* (a secret's line) */
    free(line);
    fclose(f);
    return out;
}

/* AWS_SHARED_CREDENTIALS_FILE / AWS_CONFIG_FILE, else ~/.aws/NAME (malloc'd or NULL). */
static char *aws_file(stoke_env_id id, const char *name)
{
    const char *v = stoke__env_str(id), *home = stoke__env_str(STOKE_ENV_HOME);
    if (v)
        return strdup(v);
    if (!home)
        return NULL;
    char *p = NULL;
    return asprintf(&p, "%s/.aws/%s", home, name) < 0 ? NULL : p;
}

/* Credentials and region: the environment first, then the profile (AWS_PROFILE or "default")
 * of the credentials and config files, as the AWS tools do. */
static int s3_settings(stoke__remote_aws *a, char *why, size_t why_len)
{
    const char *profile = stoke__env_str(STOKE_ENV_AWS_PROFILE);
    const char *prof = profile ? profile : "default";
    char *cred = aws_file(STOKE_ENV_AWS_CREDENTIALS_FILE, "credentials");
    char *conf = aws_file(STOKE_ENV_AWS_CONFIG_FILE, "config");
    char conf_sec[256];
    stoke__fmt(conf_sec, sizeof(conf_sec), profile ? "profile %s" : "%s", prof);
    if (profile && strcmp(profile, "default") == 0)
        stoke__strlcpy(conf_sec, "default", sizeof(conf_sec));

    const char *ek = stoke__env_str(STOKE_ENV_AWS_ACCESS_KEY_ID);
    const char *es = stoke__env_str(STOKE_ENV_AWS_SECRET_ACCESS_KEY);
    char *key = NULL, *secret = NULL, *token = NULL, *region = NULL;
    if (ek && es) {
        key = strdup(ek);
        secret = strdup(es);
        const char *t = stoke__env_str(STOKE_ENV_AWS_SESSION_TOKEN);
        token = t ? strdup(t) : NULL;
    } else {
        key = stoke__remote_ini_get(cred, prof, "aws_access_key_id");
        secret = stoke__remote_ini_get(cred, prof, "aws_secret_access_key");
        token = stoke__remote_ini_get(cred, prof, "aws_session_token");
        if (!key || !secret) { /* the config file may hold them too */
            free(key);
            free(secret);
            free(token);
            key = stoke__remote_ini_get(conf, conf_sec, "aws_access_key_id");
            secret = stoke__remote_ini_get(conf, conf_sec, "aws_secret_access_key");
            token = stoke__remote_ini_get(conf, conf_sec, "aws_session_token");
        }
    }
    const char *er = stoke__env_str(STOKE_ENV_AWS_REGION);
    if (!er)
        er = stoke__env_str(STOKE_ENV_AWS_DEFAULT_REGION);
    region = er ? strdup(er) : stoke__remote_ini_get(conf, conf_sec, "region");
    int rc = STOKE_OK;
    if (profile && !(key && secret) && !ek)
        rc = STOKE_EINVAL, stoke__fmt(why, why_len,
                                      "AWS_PROFILE=%s: no aws_access_key_id and "
                                      "aws_secret_access_key for it in %s",
                                      profile, cred ? cred : "~/.aws/credentials");
    stoke__strlcpy(a->region, region && *region ? region : "us-east-1", sizeof(a->region));
    for (const char *c = a->region; !rc && *c; c++)
        if (!isalnum((unsigned char)*c) && *c != '-')
            rc = STOKE_EINVAL, stoke__fmt(why, why_len, "bad AWS region '%s'", a->region);
    stoke__fmt(a->sigv4, sizeof(a->sigv4), "aws:amz:%s:s3", a->region);
    if (!rc && key && secret && *key && *secret) {
        if (asprintf(&a->userpwd, "%s:%s", key, secret) < 0)
            a->userpwd = NULL, rc = STOKE_ENOMEM;
    }
    a->hdrs = curl_slist_append(NULL, "x-amz-content-sha256: " EMPTY_SHA256);
    if (!a->hdrs)
        rc = STOKE_ENOMEM;
    if (!rc && token && *token) {
        char *h = NULL;
        struct curl_slist *l = NULL;
        if (asprintf(&h, "x-amz-security-token: %s", token) < 0 ||
            !(l = curl_slist_append(a->hdrs, h)))
            rc = STOKE_ENOMEM;
        else
            a->hdrs = l;
        if (h)
            explicit_bzero(h, strlen(h));
        free(h);
    }
    if (rc == STOKE_ENOMEM)
        stoke__fmt(why, why_len, "out of memory");
    if (secret)
        explicit_bzero(secret, strlen(secret));
    free(key);
    free(secret);
    free(token);
    free(region);
    free(cred);
    free(conf);
    return rc;
}

int stoke__remote_aws_init(stoke__remote_aws *a, char *why, size_t why_len)
{
    const char *ep = stoke__env_str(STOKE_ENV_AWS_ENDPOINT_URL_S3);
    if (!ep)
        ep = stoke__env_str(STOKE_ENV_AWS_ENDPOINT_URL);
    if (ep && !(a->endpoint = strdup(ep))) {
        stoke__fmt(why, why_len, "out of memory");
        return STOKE_ENOMEM;
    }
    if (a->endpoint) {
        size_t n = strlen(a->endpoint);
        while (n && a->endpoint[n - 1] == '/')
            a->endpoint[--n] = 0;
        if (strncasecmp(a->endpoint, "http://", 7) != 0 &&
            strncasecmp(a->endpoint, "https://", 8) != 0) {
            stoke__fmt(why, why_len, "AWS_ENDPOINT_URL '%s' is not an http:// or https:// URL",
                       a->endpoint);
            return STOKE_EINVAL;
        }
    }
    return s3_settings(a, why, why_len);
}

void stoke__remote_aws_free(stoke__remote_aws *a)
{
    if (a->userpwd)
        explicit_bzero(a->userpwd, strlen(a->userpwd));
    free(a->userpwd);
    curl_slist_free_all(a->hdrs); /* the token's header: libcurl frees, cannot be cleared */
    free(a->endpoint);
    a->userpwd = a->endpoint = NULL;
    a->hdrs = NULL;
}

/* ---- URLs and signing --------------------------------------------------------------------- */

/* Appends s percent-encoded (all but unreserved characters and '/') to out at *len. */
static void path_encode(char *out, size_t *len, const char *s)
{
    static const char hex[] = "0123456789ABCDEF";
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~' || c == '/') {
            out[(*len)++] = (char)c;
        } else {
            out[(*len)++] = '%';
            out[(*len)++] = hex[c >> 4];
            out[(*len)++] = hex[c & 15];
        }
    }
    out[*len] = 0;
}

int stoke__remote_aws_url(const stoke__remote_aws *a, const char *url, const char *shown,
                          char **req, char *why, size_t why_len)
{
    const char *b = url + 5, *slash = strchr(b, '/');
    size_t blen = slash ? (size_t)(slash - b) : strlen(b);
    int ok = blen >= 1 && blen <= 255 && slash && slash[1];
    for (size_t i = 0; ok && i < blen; i++)
        ok = isalnum((unsigned char)b[i]) || b[i] == '-' || b[i] == '.' || b[i] == '_';
    if (!ok) {
        stoke__fmt(why, why_len, "'%s' is not s3://BUCKET/KEY", shown);
        return STOKE_EINVAL;
    }
    const char *key = slash + 1;
    size_t cap = strlen(url) * 3 + (a->endpoint ? strlen(a->endpoint) : 0) + 128;
    if (!(*req = malloc(cap))) {
        stoke__fmt(why, why_len, "out of memory");
        return STOKE_ENOMEM;
    }
    int n;
    if (a->endpoint) /* S3-compatible stores: path-style */
        n = snprintf(*req, cap, "%s/%.*s/", a->endpoint, (int)blen, b);
    else if (memchr(b, '.', blen)) /* a dotted bucket fails the wildcard certificate */
        n = snprintf(*req, cap, "https://s3.%s.amazonaws.com/%.*s/", a->region, (int)blen, b);
    else
        n = snprintf(*req, cap, "https://%.*s.s3.%s.amazonaws.com/", (int)blen, b, a->region);
    size_t len = (size_t)n;
    path_encode(*req, &len, key);
    return STOKE_OK;
}

void stoke__remote_aws_sign(const stoke__remote_aws *a, CURL *h, int s3)
{
    int sign = s3 && a->userpwd;
    /* An S3 request follows no redirect: libcurl would send the session token's header to
     * the other host (it drops only its own Authorization), and a SigV4 signature is of the
     * host it was made for.  The store's 301/307 is an error naming its Endpoint. */
    curl_easy_setopt(h, CURLOPT_FOLLOWLOCATION, s3 ? 0L : 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, s3 ? a->hdrs : NULL);
    curl_easy_setopt(h, CURLOPT_USERPWD, sign ? a->userpwd : NULL);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, sign ? a->sigv4 : NULL);
    if (!sign)
        curl_easy_setopt(h, CURLOPT_HTTPAUTH, (long)CURLAUTH_BASIC);
}

#endif /* STOKE_HAVE_LIBCURL */
