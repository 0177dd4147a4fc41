/* The one place libstoke reads its environment.  See env.h and the README's table. */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/env.h"
#include "common/internal.h"

static const char *const env_names[] = {
#define STOKE__ENV_NAME(id, name, desc) name,
    STOKE_ENV_MAP(STOKE__ENV_NAME)
#undef STOKE__ENV_NAME
};

static const char *const env_descs[] = {
#define STOKE__ENV_DESC(id, name, desc) desc,
    STOKE_ENV_MAP(STOKE__ENV_DESC)
#undef STOKE__ENV_DESC
};

const char *stoke__env_name(stoke_env_id id)
{
    return (unsigned)id < STOKE_ENV_COUNT_ ? env_names[id] : "?";
}

const char *stoke__env_str(stoke_env_id id)
{
    if ((unsigned)id >= STOKE_ENV_COUNT_)
        return NULL;
    /* secure_getenv: in a setuid or setgid program (or one with file capabilities) none is
     * read, so STOKE_PLUGIN_PATH or STOKE_CUDA_LIBRARY cannot run another user's code there. */
    const char *v = secure_getenv(env_names[id]);
    return (v && *v) ? v : NULL;
}

int stoke__parse_bool(const char *s, int *out)
{
    static const char *const yes[] = {"1", "true", "yes", "on"};
    static const char *const no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < STOKE__ARRAY_LEN(yes); i++) {
        if (strcasecmp(s, yes[i]) == 0) {
            *out = 1;
            return 0;
        }
        if (strcasecmp(s, no[i]) == 0) {
            *out = 0;
            return 0;
        }
    }
    return -1;
}

int stoke__parse_u64(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

int stoke__parse_size(const char *s, uint64_t *out)
{
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (toupper((unsigned char)*end)) {
    case 'K':
        shift = 10;
        end++;
        break;
    case 'M':
        shift = 20;
        end++;
        break;
    case 'G':
        shift = 30;
        end++;
        break;
    case 'T':
        shift = 40;
        end++;
        break;
    default: break;
    }
    if (shift && (*end == 'i' || *end == 'I'))
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end)
        return -1;
    if (shift && v > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int env_typed(stoke_env_id id, int (*parse)(const char *, void *), void *out,
                     const char *what)
{
    const char *s = stoke__env_str(id);
    if (!s)
        return 0;
    if (parse(s, out) == 0)
        return 1;
    /* once a variable per process: the pool and the cache, or each loader, read it again (the
     * same warning printed twice read as two problems) */
    static _Atomic uint64_t warned[(STOKE_ENV_COUNT_ + 63) / 64];
    uint64_t bit = (uint64_t)1 << (id % 64);
    if (!(atomic_fetch_or(&warned[id / 64], bit) & bit))
        stoke__log(STOKE_LOG_WARN, "%s=%s is not a valid %s (%s); ignoring it", env_names[id], s,
                   what, env_descs[id]);
    return 0;
}

static int parse_bool_v(const char *s, void *out)
{
    return stoke__parse_bool(s, out);
}
static int parse_size_v(const char *s, void *out)
{
    return stoke__parse_size(s, out);
}
static int parse_u64_v(const char *s, void *out)
{
    return stoke__parse_u64(s, out);
}

int stoke__env_bool(stoke_env_id id, int *out)
{
    return env_typed(id, parse_bool_v, out, "boolean (1/0/true/false/yes/no/on/off)");
}

int stoke__env_size(stoke_env_id id, uint64_t *out)
{
    return env_typed(id, parse_size_v, out, "size (bytes with optional K/M/G/T)");
}

int stoke__env_u64(stoke_env_id id, uint64_t *out)
{
    return env_typed(id, parse_u64_v, out, "non-negative integer");
}

int stoke__env_dist(const char *who, uint64_t *rank, uint64_t *world)
{
    static const stoke_env_id pairs[][2] = {{STOKE_ENV_RANK, STOKE_ENV_WORLD_SIZE},
                                            {STOKE_ENV_OMPI_RANK, STOKE_ENV_OMPI_SIZE},
                                            {STOKE_ENV_SLURM_RANK, STOKE_ENV_SLURM_SIZE}};
    for (size_t i = 0; i < STOKE__ARRAY_LEN(pairs); i++) {
        const char *s[2] = {stoke__env_str(pairs[i][0]), stoke__env_str(pairs[i][1])};
        uint64_t v[2] = {0, 0};
        char t[2][32]; /* the value without spaces around it, as Python's int() takes it */
        if (!s[0] && !s[1])
            continue;
        if (!s[0] || !s[1])
            return stoke__fail(STOKE_EINVAL, "%s: %s and %s must both be set (only %s is)", who,
                               stoke__env_name(pairs[i][0]), stoke__env_name(pairs[i][1]),
                               stoke__env_name(pairs[i][s[0] ? 0 : 1]));
        /* a value that does not parse is an error, not ignored: ignoring it would load the
         * whole dataset on every rank */
        for (int k = 0; k < 2; k++) {
            const char *a = s[k], *e = s[k] + strlen(s[k]);
            while (a < e && isspace((unsigned char)*a))
                a++;
            while (e > a && isspace((unsigned char)e[-1]))
                e--;
            int n = (int)(e - a);
            stoke__fmt(t[k], sizeof(t[k]), "%.*s", n, a);
            if (n >= (int)sizeof(t[k]) || stoke__parse_u64(t[k], &v[k]) != 0)
                return stoke__fail(STOKE_EINVAL, "%s: %s='%s' is not a non-negative integer", who,
                                   stoke__env_name(pairs[i][k]), s[k]);
        }
        *rank = v[0];
        *world = v[1];
        return 1;
    }
    return 0;
}

static int env_entry_cmp(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static int env_name_matches(const char *entry, size_t name_len, const char *const *prefixes,
                            const char *const *parts)
{
    for (const char *const *p = prefixes; p && *p; p++)
        if (strlen(*p) <= name_len && strncmp(entry, *p, strlen(*p)) == 0)
            return 1;
    for (const char *const *p = parts; p && *p; p++)
        if (memmem(entry, name_len, *p, strlen(*p)))
            return 1;
    return 0;
}

int stoke__env_matching(const char *const *prefixes, const char *const *parts, char *key,
                        size_t len)
{
    extern char **environ;
    const char *found[256];
    size_t n = 0;
    for (char **e = environ; e && *e; e++) {
        const char *eq = strchr(*e, '=');
        if (!eq || !env_name_matches(*e, (size_t)(eq - *e), prefixes, parts))
            continue;
        if (n == STOKE__ARRAY_LEN(found))
            return -1;
        found[n++] = *e;
    }
    qsort(found, n, sizeof(found[0]), env_entry_cmp);
    size_t at = strlen(key);
    for (size_t i = 0; i < n; i++) {
        size_t l = strlen(found[i]);
        if (at + l + 2 > len)
            return -1;
        memcpy(key + at, found[i], l);
        key[at + l] = '\n';
        at += l + 1;
        key[at] = '\0';
    }
    return 0;
}
