/* Resident memory: ordinary memory with every page faulted in at allocation.  See internal.h. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE, MADV_POPULATE_WRITE */
#include <errno.h>
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/internal.h"

void *stoke__resident_alloc(size_t size)
{
    if (size == 0)
        size = 1;
    void *m = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED)
        return NULL;
#ifdef MADV_HUGEPAGE
    if (size >= ((size_t)2 << 20))
        (void)madvise(m, size, MADV_HUGEPAGE);
#endif
#ifdef MADV_POPULATE_WRITE
    if (madvise(m, size, MADV_POPULATE_WRITE) == 0)
        return m;
    if (errno != EINVAL) { /* ENOMEM, EFAULT (no memory behind it), EINTR: give up */
        munmap(m, size);
        return NULL;
    }
#endif
    long pg = sysconf(_SC_PAGESIZE);
    for (size_t o = 0; o < size; o += pg > 0 ? (size_t)pg : 4096u)
        ((volatile unsigned char *)m)[o] = 0; /* a kernel before 5.14: one write per page */
    return m;
}

uint64_t stoke__physical_memory(void)
{
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 0;
}

void stoke__resident_free(void *p, size_t size)
{
    if (p)
        munmap(p, size ? size : 1);
}
