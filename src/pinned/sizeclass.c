/* Size classes of the pinned allocator (the table is in include/stoke/pinned.h). */
#include <stdatomic.h>

#include "pinned/pinned_internal.h"

static atomic_int min_class; /* raised when pages are larger than 4 KiB */

static int floor_log2(size_t v) /* v > 0 */
{
#if defined(__GNUC__)
    return 63 - __builtin_clzll((unsigned long long)v);
#else
    int n = 0;
    while (v >>= 1)
        n++;
    return n;
#endif
}

void stoke__pinned_set_page(size_t page)
{
    int c = 0;
    while (c < PN_NSMALL - 1 && ((size_t)1 << (PN_SMALL_LOG_MIN + c)) < page)
        c++;
    atomic_store_explicit(&min_class, c, memory_order_relaxed);
}

int stoke__pinned_class(size_t size)
{
    int cls;
    if (size <= ((size_t)1 << PN_SMALL_LOG_MAX)) {
        cls = size <= ((size_t)1 << PN_SMALL_LOG_MIN)
                  ? 0
                  : floor_log2(size - 1) + 1 - PN_SMALL_LOG_MIN; /* ceil(log2(size)) - 12 */
    } else {
        int n = floor_log2(size - 1); /* 2^n < size <= 2^(n+1) */
        if (n >= PN_LOG_MAX)
            return -1;
        size_t quarter = (size_t)1 << (n - 2);
        size_t q = (size - ((size_t)1 << n) + quarter - 1) / quarter; /* 1..4 */
        cls = PN_NSMALL + (n - PN_SMALL_LOG_MAX) * 4 + (int)q - 1;
    }
    int lo = atomic_load_explicit(&min_class, memory_order_relaxed);
    return cls < lo ? lo : cls;
}

size_t stoke__pinned_class_size(int cls)
{
    if (cls < PN_NSMALL)
        return (size_t)1 << (PN_SMALL_LOG_MIN + cls);
    int k = cls - PN_NSMALL;
    int n = PN_SMALL_LOG_MAX + k / 4;
    return ((size_t)1 << n) + (size_t)(k % 4 + 1) * ((size_t)1 << (n - 2));
}
