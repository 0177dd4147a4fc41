/* fuzz_support.h's check(), linked into the fuzz targets. */
#include "fuzz_support.h"

#include <stdio.h>
#include <stdlib.h>

void stoke_fuzz_check_at(int ok, const char *file, int line, const char *what)
{
    if (!ok) {
        fprintf(stderr, "%s:%d: check failed: %s\n", file, line, what);
        abort();
    }
}
