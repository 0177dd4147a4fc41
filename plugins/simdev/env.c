/* simdev — the one file that reads simdev's environment variables.
 *
 * The plugin reads its own STOKE_SIMDEV_* variables (libstoke's env.c does not know them: a
 * plugin must not depend on libstoke internals).  They are read at every probe, which the host
 * runs after each load, so a test can change them and reload.  An invalid value logs a warning
 * naming the variable and falls back to the default.
 *
 *   STOKE_SIMDEV_DEVICES        number of devices, 0..64 (default 2; 0: probe says "no device")
 *   STOKE_SIMDEV_COPY_DELAY_US  microseconds each copy waits before it runs (default 0)
 *   STOKE_SIMDEV_MEMORY         device memory per device, bytes with K/M/G suffix (default 4G)
 *   STOKE_SIMDEV_FAIL_ALLOC     the N-th allocation since probe fails with STOKE_ENOMEM
 *   STOKE_SIMDEV_FAIL_COPY      the N-th copy since probe fails with STOKE_EBACKEND (async)
 *   STOKE_SIMDEV_PROBE_FAIL     boolean: probe fails with an "injected" reason
 */
#define _GNU_SOURCE /* secure_getenv */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "simdev_int.h"

/* Unsigned decimal with nothing after it.  0 on success, -1 when malformed. */
static int parse_u64(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return -1;
    *out = (uint64_t)v;
    return 0;
}

/* Bytes with an optional K/M/G/T suffix (powers of 1024), optionally followed by B or iB. */
static int parse_size(const char *s, uint64_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return -1;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return -1;
    unsigned shift = 0;
    switch (*end) {
    case 'k':
    case 'K':
        shift = 10;
        end++;
        break;
    case 'm':
    case 'M':
        shift = 20;
        end++;
        break;
    case 'g':
    case 'G':
        shift = 30;
        end++;
        break;
    case 't':
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
    if (*end || (shift && v > (UINT64_MAX >> shift)))
        return -1;
    *out = (uint64_t)v << shift;
    return 0;
}

static int parse_bool(const char *s, int *out)
{
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (size_t i = 0; i < 4; i++) {
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

static const char *env(const char *name)
{
    const char *v = secure_getenv(name); /* none in a setuid program, as libstoke's */
    return v && *v ? v : NULL;
}

/* An unsigned variable in [lo, hi]; unset keeps *out, invalid warns and keeps *out. */
static void read_u64(const char *name, uint64_t lo, uint64_t hi, uint64_t *out, int warn)
{
    const char *v = env(name);
    uint64_t x;
    if (!v)
        return;
    if (parse_u64(v, &x) != 0 || x < lo || x > hi) {
        if (warn)
            simdev__log(STOKE_LOG_WARN, "%s='%s' is not an integer in [%llu, %llu]; using %llu",
                        name, v, (unsigned long long)lo, (unsigned long long)hi,
                        (unsigned long long)*out);
        return;
    }
    *out = x;
}

void simdev__read_config(simdev_config *cfg, int warn)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->devices = SIMDEV_DEFAULT_DEVICES;
    cfg->memory = SIMDEV_DEFAULT_MEMORY;

    uint64_t devices = (uint64_t)cfg->devices;
    read_u64("STOKE_SIMDEV_DEVICES", 0, SIMDEV_MAX_DEVICES, &devices, warn);
    cfg->devices = (int)devices;
    read_u64("STOKE_SIMDEV_COPY_DELAY_US", 0, 60ull * 1000 * 1000, &cfg->copy_delay_us, warn);
    read_u64("STOKE_SIMDEV_FAIL_ALLOC", 0, UINT64_MAX, &cfg->fail_alloc, warn);
    read_u64("STOKE_SIMDEV_FAIL_COPY", 0, UINT64_MAX, &cfg->fail_copy, warn);

    const char *v = env("STOKE_SIMDEV_MEMORY");
    uint64_t mem;
    if (v) {
        if (parse_size(v, &mem) != 0 || mem == 0) {
            if (warn)
                simdev__log(
                    STOKE_LOG_WARN,
                    "STOKE_SIMDEV_MEMORY='%s' is not a size (e.g. 512M, 4G); using %llu bytes", v,
                    (unsigned long long)cfg->memory);
        } else {
            cfg->memory = mem;
        }
    }
    v = env("STOKE_SIMDEV_PROBE_FAIL");
    if (v && parse_bool(v, &cfg->probe_fail) != 0) {
        if (warn)
            simdev__log(
                STOKE_LOG_WARN,
                "STOKE_SIMDEV_PROBE_FAIL='%s' is not a boolean (1/0/true/false/yes/no/on/off); "
                "using 0",
                v);
        cfg->probe_fail = 0;
    }
}
