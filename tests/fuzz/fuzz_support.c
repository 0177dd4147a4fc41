/* fuzz_support.h's functions, linked into the fuzz targets. */
#include "fuzz_support.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "common/internal.h"

void stoke_fuzz_check_at(int ok, const char *file, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
        abort();
    }
}

char *stoke__fmt(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dst, n, fmt, ap);
    va_end(ap);
    return dst;
}
