#define _GNU_SOURCE
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "registry/registry.h"
#include "stoke/stoke.h"

#define TU_MAX_LINES 4096

static pthread_mutex_t tu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int level;
    char *msg;
} lines[TU_MAX_LINES];
static int nlines;

static void tu_sink(void *user, int level, const char *msg)
{
    pthread_mutex_lock(&tu_lock);
    if (nlines < TU_MAX_LINES) {
        lines[nlines].level = level;
        lines[nlines].msg = strdup(msg);
        nlines++;
    }
    pthread_mutex_unlock(&tu_lock);
    if (getenv("TU_LOG_ECHO"))
        fprintf(stderr, "[log %s] %s\n", stoke_log_level_name(level), msg);
}

void tu_log_capture(void)
{
    stoke_log_set_level(STOKE_LOG_TRACE);
    stoke_log_set_callback(tu_sink, NULL);
}

int tu_log_count(int level, const char *needle)
{
    int n = 0;
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nlines; i++)
        if ((level < 0 || lines[i].level == level) && (!needle || strstr(lines[i].msg, needle)))
            n++;
    pthread_mutex_unlock(&tu_lock);
    return n;
}

void tu_log_clear(void)
{
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nlines; i++)
        free(lines[i].msg);
    nlines = 0;
    pthread_mutex_unlock(&tu_lock);
}

void tu_log_dump(void)
{
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nlines; i++)
        fprintf(stderr, "  log[%s] %s\n", stoke_log_level_name(lines[i].level), lines[i].msg);
    pthread_mutex_unlock(&tu_lock);
}

const char *tu_simdev_path(void)
{
    const char *p = getenv("STOKE_SIMDEV_PLUGIN");
    if (!p || !*p)
        fail_msg("STOKE_SIMDEV_PLUGIN is not set (run the tests through ctest)");
    return p;
}

const char *tu_test_plugin(const char *file, char *buf, size_t len)
{
    const char *dir = getenv("STOKE_TEST_PLUGIN_DIR");
    if (!dir || !*dir)
        fail_msg("STOKE_TEST_PLUGIN_DIR is not set (run the tests through ctest)");
    snprintf(buf, len, "%s/%s", dir, file);
    return buf;
}

const char *tu_tmp_path(const char *name, char *buf, size_t len)
{
    const char *dir = getenv("STOKE_TEST_TMP");
    snprintf(buf, len, "%s/%s", dir && *dir ? dir : "/tmp", name);
    return buf;
}

void tu_registry_reset(void)
{
    stoke__registry_reset();
}

void tu_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    stoke__registry_reset();
}

void tu_use_simdev(void)
{
    unsetenv("STOKE_ACCELERATOR");
    setenv("STOKE_PLUGIN_PATH", tu_simdev_path(), 1);
    stoke__registry_reset();
}

void tu_use_none(void)
{
    unsetenv("STOKE_ACCELERATOR");
    unsetenv("STOKE_PLUGIN_PATH");
    stoke__registry_reset();
}
