/* Logging: one sink (callback + user pointer), one level.
 *
 * Locking: `sink_lock` protects the pair (sink_fn, sink_user) so that a message never reaches a
 * callback with another callback's user pointer.  The level is an atomic read on every call. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "common/env.h"
#include "common/internal.h"

static pthread_mutex_t sink_lock = PTHREAD_MUTEX_INITIALIZER;
static stoke_log_fn sink_fn;    /* NULL: stderr */
static void *sink_user;
static atomic_int log_level = -1; /* -1: not yet read from STOKE_LOG */

static const char *const level_names[] = {"error", "warn", "info", "debug", "trace"};

const char *stoke_log_level_name(int level)
{
    if (level < 0 || level >= (int)STOKE__ARRAY_LEN(level_names))
        return "?";
    return level_names[level];
}

static int level_from_env(void)
{
    const char *s = stoke__env_str(STOKE_ENV_LOG);
    if (!s)
        return STOKE_LOG_WARN;
    for (int i = 0; i < (int)STOKE__ARRAY_LEN(level_names); i++)
        if (strcasecmp(s, level_names[i]) == 0)
            return i;
    if (strcasecmp(s, "warning") == 0)
        return STOKE_LOG_WARN;
    fprintf(stderr, "stoke: warn: STOKE_LOG=%s is not one of error, warn, info, debug, trace; "
                    "using warn\n", s);
    return STOKE_LOG_WARN;
}

int stoke_log_get_level(void)
{
    int l = atomic_load_explicit(&log_level, memory_order_relaxed);
    if (l < 0) {
        int want = level_from_env();
        int expect = -1;
        atomic_compare_exchange_strong(&log_level, &expect, want);
        l = atomic_load(&log_level);
    }
    return l;
}

void stoke_log_set_level(int level)
{
    if (level < STOKE_LOG_ERROR)
        level = STOKE_LOG_ERROR;
    if (level > STOKE_LOG_TRACE)
        level = STOKE_LOG_TRACE;
    atomic_store(&log_level, level);
}

void stoke_log_set_callback(stoke_log_fn fn, void *user)
{
    pthread_mutex_lock(&sink_lock);
    sink_fn = fn;
    sink_user = user;
    pthread_mutex_unlock(&sink_lock);
}

int stoke__log_enabled(int level)
{
    return level <= stoke_log_get_level();
}

void stoke__vlog(int level, const char *fmt, va_list ap)
{
    if (!stoke__log_enabled(level))
        return;
    char msg[1536];
    vsnprintf(msg, sizeof(msg), fmt, ap);
    pthread_mutex_lock(&sink_lock);
    if (sink_fn)
        sink_fn(sink_user, level, msg);
    else
        fprintf(stderr, "stoke: %s: %s\n", stoke_log_level_name(level), msg);
    pthread_mutex_unlock(&sink_lock);
}

void stoke__log(int level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    stoke__vlog(level, fmt, ap);
    va_end(ap);
}

uint64_t stoke__now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void stoke__thread_name(const char *name)
{
    char buf[16];
    stoke__strlcpy(buf, name, sizeof(buf));
    pthread_setname_np(pthread_self(), buf);
}
