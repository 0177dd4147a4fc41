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
static stoke_log_fn sink_fn; /* NULL: stderr */
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
    fprintf(stderr,
            "stoke: warn: STOKE_LOG=%s is not one of error, warn, info, debug, trace; "
            "using warn\n",
            s);
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

/* fork(): a thread of the parent may have held sink_lock (logging as the fork happened); the
 * child makes it anew, unless the forking thread held it itself (a sink that forks), as the
 * child goes on in that thread.  (A child whose first log line waited on a lock nobody would
 * release: seen with a thread of the parent in the registry while another forked.) */
static _Thread_local int tl_holds_sink;
static pthread_once_t fork_hooked = PTHREAD_ONCE_INIT;

static void fork_child(void)
{
    if (!tl_holds_sink)
        pthread_mutex_init(&sink_lock, NULL);
}

static void hook_fork(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

static void sink_lock_take(void)
{
    pthread_once(&fork_hooked, hook_fork);
    pthread_mutex_lock(&sink_lock);
    tl_holds_sink = 1;
}

static void sink_lock_drop(void)
{
    tl_holds_sink = 0;
    pthread_mutex_unlock(&sink_lock);
}

void stoke_log_set_callback(stoke_log_fn fn, void *user)
{
    sink_lock_take();
    sink_fn = fn;
    sink_user = user;
    sink_lock_drop();
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
    sink_lock_take();
    if (sink_fn)
        sink_fn(sink_user, level, msg);
    else
        fprintf(stderr, "stoke: %s: %s\n", stoke_log_level_name(level), msg);
    sink_lock_drop();
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
