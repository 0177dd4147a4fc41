/* Status codes and the per-thread last-error string. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"

const char *stoke_strerror(int code)
{
    switch (code) {
#define STOKE__STATUS_MSG(name, value, msg)                                                        \
    case (value): return msg;
        STOKE_STATUS_MAP(STOKE__STATUS_MSG)
#undef STOKE__STATUS_MSG
    }
    return "unknown status";
}

int stoke__status_known(int code)
{
    switch (code) {
#define STOKE__STATUS_KNOWN(name, value, msg) case (value):
        STOKE_STATUS_MAP(STOKE__STATUS_KNOWN)
#undef STOKE__STATUS_KNOWN
        return 1;
    }
    return 0;
}

const char *stoke_err_name(int code)
{
    switch (code) {
#define STOKE__STATUS_NAME(name, value, msg)                                                       \
    case (value): return "STOKE_" #name;
        STOKE_STATUS_MAP(STOKE__STATUS_NAME)
#undef STOKE__STATUS_NAME
    }
    return "STOKE_UNKNOWN";
}

#define LAST_ERROR_MAX STOKE__MSG_MAX
static _Thread_local char last_error[LAST_ERROR_MAX];
_Static_assert(sizeof(((stoke__saved_error *)0)->msg) == LAST_ERROR_MAX,
               "a saved error holds the whole last-error string");

/* Formats into last_error (see stoke__vfmt_short); an argument may be last_error itself. */
static void set_last_v(const char *fmt, va_list ap)
{
    char buf[LAST_ERROR_MAX];
    stoke__vfmt_short(buf, sizeof(buf), fmt, ap);
    memcpy(last_error, buf, sizeof(buf));
}

const char *stoke_last_error(void)
{
    return last_error;
}

void stoke__set_error_text(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    set_last_v(fmt, ap);
    va_end(ap);
}

void stoke__clear_error(void)
{
    last_error[0] = '\0';
}

void stoke__error_save(stoke__saved_error *s)
{
    memcpy(s->msg, last_error, sizeof(s->msg));
}

void stoke__error_restore(const stoke__saved_error *s)
{
    memcpy(last_error, s->msg, sizeof(last_error));
}

static int fail_v(int level, int code, const char *fmt, va_list ap)
{
    set_last_v(fmt, ap);
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

char *stoke__shorten(char *dst, size_t n, const char *src)
{
    static const char cut[] = " ... ";
    size_t len = src ? strlen(src) : 0;
    if (len < n || n < 2 * sizeof(cut))
        return stoke__strlcpy(dst, src, n);
    /* A third of the room for the head, the rest for the tail (where the reason is). */
    size_t room = n - 1 - (sizeof(cut) - 1);
    size_t head = room / 3, tail = room - head;
    memcpy(dst, src, head);
    memcpy(dst + head, cut, sizeof(cut) - 1);
    memcpy(dst + head + sizeof(cut) - 1, src + len - tail, tail);
    dst[n - 1] = '\0';
    return dst;
}

char *stoke__vfmt_short(char *dst, size_t n, const char *fmt, va_list ap)
{
    if (n == 0)
        return dst;
    va_list ap2;
    va_copy(ap2, ap);
    int len = vsnprintf(dst, n, fmt, ap);
    if (len >= 0 && (size_t)len >= n) {
        char *full = malloc((size_t)len + 1);
        if (full) {
            vsnprintf(full, (size_t)len + 1, fmt, ap2);
            stoke__shorten(dst, n, full);
            free(full);
        }
    }
    va_end(ap2);
    return dst;
}

char *stoke__fmt_short(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    stoke__vfmt_short(dst, n, fmt, ap);
    va_end(ap);
    return dst;
}
