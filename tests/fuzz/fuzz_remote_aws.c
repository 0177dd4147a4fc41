/* libFuzzer target: the AWS credentials and config files as S3 reads them
 * (src/sources/remote_aws.c): stoke__remote_ini_get's sections and keys, the whole of
 * stoke__remote_aws_init over both files (profiles, region, keys, session token), and
 * stoke__remote_trim.  Built only with -DSTOKE_FUZZ=ON, clang and libcurl; run by
 * tests/fuzz/run.sh (target aws).
 *
 * The input: one byte choosing AWS_PROFILE (none, "default", "dev"), then the credentials file,
 * 0x01, the config file; each is written to a memfd that AWS_SHARED_CREDENTIALS_FILE and
 * AWS_CONFIG_FILE name (/proc/self/fd/N).  Beyond "no crash, no sanitizer report" it checks:
 * ini_get reads what the INI rules of remote_internal.h say (a line by line reading of the
 * file here, lines of any length), its value trimmed; aws_init's codes, a region of letters,
 * digits and '-' when it succeeds, the key and secret it signs with those the files say, and no
 * secret in its message; trim's result is the string without the white space around it. */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/internal.h"
#include "fuzz_support.h"
#include "sources/remote_internal.h"
#include "stoke/status.h"

/* ---- the INI rules, read here line by line from the bytes ---------------------------------- */

/* [p, p + n) trimmed of white space, as a C string (the line ends at a 0 byte, as a C string
 * read from the file does): malloc'd. */
static char *trimmed(const char *p, size_t n)
{
    const char *z = memchr(p, 0, n);
    if (z)
        n = (size_t)(z - p);
    while (n && isspace((unsigned char)*p))
        p++, n--;
    while (n && isspace((unsigned char)p[n - 1]))
        n--;
    char *s = malloc(n + 1);
    if (s) {
        memcpy(s, p, n);
        s[n] = 0;
    }
    return s;
}

static char *ini_want(const char *f, size_t size, const char *section, const char *key)
{
    int in = 0;
    for (size_t at = 0; at < size;) {
        const char *nl = memchr(f + at, '\n', size - at);
        size_t len = nl ? (size_t)(nl - (f + at)) : size - at;
        char *line = trimmed(f + at, len);
        at += len + (nl != NULL);
        if (!line)
            return NULL;
        char *out = NULL, *e, *eq;
        if (!*line || *line == '#' || *line == ';') {
        } else if (*line == '[') {
            if ((e = strchr(line, ']'))) {
                char *sec = trimmed(line + 1, (size_t)(e - line - 1));
                in = sec && strcmp(sec, section) == 0;
                free(sec);
            }
        } else if (in && (eq = strchr(line, '='))) {
            char *k = trimmed(line, (size_t)(eq - line));
            if (k && strcmp(k, key) == 0)
                out = trimmed(eq + 1, strlen(eq + 1));
            free(k);
        }
        free(line);
        if (out)
            return out;
    }
    return NULL;
}

/* ---- the target --------------------------------------------------------------------------- */

static int g_cred = -1, g_conf = -1;
static char g_cred_path[64], g_conf_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    g_cred = memfd_create("aws-credentials", 0);
    g_conf = memfd_create("aws-config", 0);
    if (g_cred < 0 || g_conf < 0)
        abort();
    snprintf(g_cred_path, sizeof(g_cred_path), "/proc/self/fd/%d", g_cred);
    snprintf(g_conf_path, sizeof(g_conf_path), "/proc/self/fd/%d", g_conf);
    setenv("AWS_SHARED_CREDENTIALS_FILE", g_cred_path, 1);
    setenv("AWS_CONFIG_FILE", g_conf_path, 1);
    static const char *const unset[] = {
        "AWS_ACCESS_KEY_ID",  "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",  "AWS_REGION",
        "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL",      "AWS_ENDPOINT_URL_S3"};
    for (size_t i = 0; i < sizeof(unset) / sizeof(*unset); i++)
        unsetenv(unset[i]);
    return 0;
}

static void put_file(int fd, const uint8_t *p, size_t n)
{
    check(ftruncate(fd, 0) == 0);
    for (size_t w = 0; w < n;) {
        ssize_t r = pwrite(fd, p + w, n - w, (off_t)w);
        check(r > 0);
        w += (size_t)r;
    }
}

/* ini_get of path (holding f[0 .. n)) against the rules; the value, malloc'd, or NULL. */
static char *ini(const char *path, const uint8_t *f, size_t n, const char *sec, const char *key)
{
    char *got = stoke__remote_ini_get(path, sec, key);
    char *want = ini_want((const char *)f, n, sec, key);
    if ((got == NULL) != (want == NULL) || (got && strcmp(got, want) != 0))
        fprintf(stderr, "[%s] %s: got '%.80s', want '%.80s'\n", sec, key, got ? got : "(none)",
                want ? want : "(none)");
    check((got == NULL) == (want == NULL));
    if (got) {
        check(strcmp(got, want) == 0);
        check(!*got ||
              (!isspace((unsigned char)got[0]) && !isspace((unsigned char)got[strlen(got) - 1])));
    }
    free(want);
    return got;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const char *const profiles[] = {NULL, "default", "dev", NULL};
    const char *profile = profiles[data[0] & 3];
    data++, size--;
    const uint8_t *sep = memchr(data, 1, size);
    size_t cred_n = sep ? (size_t)(sep - data) : size;
    const uint8_t *conf = sep ? sep + 1 : data + size;
    size_t conf_n = (size_t)(data + size - conf);
    put_file(g_cred, data, cred_n);
    put_file(g_conf, conf, conf_n);
    if (profile)
        setenv("AWS_PROFILE", profile, 1);
    else
        unsetenv("AWS_PROFILE");

    /* stoke__remote_trim over the credentials' bytes as a C string */
    char *s = malloc(cred_n + 1);
    if (!s)
        return 0;
    memcpy(s, data, cred_n);
    s[cred_n] = 0;
    size_t len = strlen(s);
    char *t = stoke__remote_trim(s);
    check(t >= s && t <= s + len);
    for (const char *c = s; c < t; c++)
        check(isspace((unsigned char)*c));
    size_t tn = strlen(t);
    check(!tn || (!isspace((unsigned char)*t) && !isspace((unsigned char)t[tn - 1])));
    for (size_t i = (size_t)(t - s) + tn; i < len; i++) /* (cleared in place) */
        check(isspace(data[i]) && s[i] == 0);
    check(memcmp(t, data + (t - s), tn) == 0);
    free(s);

    /* the keys S3 reads, from the sections it reads them from */
    const char *prof = profile ? profile : "default";
    char conf_sec[64];
    snprintf(conf_sec, sizeof(conf_sec),
             profile && strcmp(profile, "default") != 0 ? "profile %s" : "%s", prof);
    char *key = ini(g_cred_path, data, cred_n, prof, "aws_access_key_id");
    char *secret = ini(g_cred_path, data, cred_n, prof, "aws_secret_access_key");
    free(ini(g_cred_path, data, cred_n, prof, "aws_session_token"));
    if (!key || !secret) {
        free(key);
        free(secret);
        key = ini(g_conf_path, conf, conf_n, conf_sec, "aws_access_key_id");
        secret = ini(g_conf_path, conf, conf_n, conf_sec, "aws_secret_access_key");
        free(ini(g_conf_path, conf, conf_n, conf_sec, "aws_session_token"));
    }
    free(ini(g_conf_path, conf, conf_n, conf_sec, "region"));

    stoke__remote_aws a;
    memset(&a, 0, sizeof(a));
    char why[256] = "";
    int rc = stoke__remote_aws_init(&a, why, sizeof(why));
    check(rc == STOKE_OK || rc == STOKE_EINVAL || rc == STOKE_ENOMEM);
    check(memchr(a.region, 0, sizeof(a.region)) != NULL && a.region[0]);
    if (rc == STOKE_OK) {
        for (const char *c = a.region; *c; c++)
            check(isalnum((unsigned char)*c) || *c == '-');
        if (key && secret && *key && *secret) {
            check(a.userpwd != NULL);
            size_t kn = strlen(key);
            check(strncmp(a.userpwd, key, kn) == 0 && a.userpwd[kn] == ':' &&
                  strcmp(a.userpwd + kn + 1, secret) == 0);
        } else {
            check(a.userpwd == NULL);
        }
    } else {
        check(why[0] != 0);
        /* a secret of some length, not a word the message has anyway */
        if (secret && strlen(secret) >= 8 && !strstr(g_cred_path, secret) &&
            !strstr("AWS_PROFILE=: no aws_access_key_id and aws_secret_access_key for it in "
                    "bad AWS region",
                    secret))
            check(strstr(why, secret) == NULL || strstr(a.region, secret) != NULL);
    }
    stoke__remote_aws_free(&a);
    free(key);
    free(secret);
    return 0;
}
