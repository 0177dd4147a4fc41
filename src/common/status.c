/* Status codes and the per-thread last-error string. */
#include <stdio.h>
#include <string.h>

#include "common/internal.h"

const char *stoke_strerror(int code)
{
    switch (code) {
#define STOKE__STATUS_MSG(name, value, msg) \
    case (value):                           \
        return msg;
        STOKE_STATUS_MAP(STOKE__STATUS_MSG)
#undef STOKE__STATUS_MSG
    }
    return "unknown status";
}

const char *stoke_err_name(int code)
{
    switch (code) {
#define STOKE__STATUS_NAME(name, value, msg) \
    case (value):                            \
        return "STOKE_" #name;
        STOKE_STATUS_MAP(STOKE__STATUS_NAME)
#undef STOKE__STATUS_NAME
    }
    return "STOKE_UNKNOWN";
}

static _Thread_local char last_error[1024];

const char *stoke_last_error(void)
{
    return last_error;
}

void stoke__set_error_text(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    va_end(ap);
}

void stoke__clear_error(void)
{
    last_error[0] = '\0';
}

static int fail_v(int level, int code, const char *fmt, va_list ap)
{
    vsnprintf(last_error, sizeof(last_error), fmt, ap);
    stoke__log(level, "%s (%s)", last_error, stoke_err_name(code));
    return code;
}

int stoke__fail(int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(STOKE_LOG_DEBUG, code, fmt, ap);
    va_end(ap);
    return code;
}

int stoke__fail_at(int level, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fail_v(level, code, fmt, ap);
    va_end(ap);
    return code;
}

char *stoke__strlcpy(char *dst, const char *src, size_t n)
{
    if (n == 0)
        return dst;
    size_t len = src ? strlen(src) : 0;
    if (len >= n)
        len = n - 1;
    if (len)
        memcpy(dst, src, len);
    dst[len] = '\0';
    return dst;
}

char *stoke__fmt(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
    return dst;
}
