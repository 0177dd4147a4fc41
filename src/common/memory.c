/* Resident memory: ordinary memory with every page faulted in at allocation.  See internal.h. */
#define _GNU_SOURCE /* MAP_ANONYMOUS, MADV_HUGEPAGE, MADV_POPULATE_WRITE */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/internal.h"

#if defined(__x86_64__) && !defined(STOKE_NO_SIMD)
#include <emmintrin.h>
#define STOKE__COPY_NT 1
#endif

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

void *stoke__calloc_lines(size_t n, size_t size)
{
    if (size && n > (SIZE_MAX - STOKE__LINE) / size)
        return NULL;
    size_t bytes = (n * size + STOKE__LINE - 1) / STOKE__LINE * STOKE__LINE;
    void *p = aligned_alloc(STOKE__LINE, bytes ? bytes : STOKE__LINE);
    if (p)
        memset(p, 0, bytes);
    return p;
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

void stoke__copy_nt(void *dst, const void *src, size_t n)
{
#ifdef STOKE__COPY_NT
    unsigned char *d = dst;
    const unsigned char *s = src;
    size_t head = (16u - ((uintptr_t)d & 15u)) & 15u;
    if (n < head + 64) {
        memcpy(d, s, n);
        return;
    }
    memcpy(d, s, head);
    d += head;
    s += head;
    n -= head;
    for (; n >= 64; n -= 64, d += 64, s += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(const void *)s);
        __m128i b = _mm_loadu_si128((const __m128i *)(const void *)(s + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(const void *)(s + 32));
        __m128i e = _mm_loadu_si128((const __m128i *)(const void *)(s + 48));
        _mm_stream_si128((__m128i *)(void *)d, a);
        _mm_stream_si128((__m128i *)(void *)(d + 16), b);
        _mm_stream_si128((__m128i *)(void *)(d + 32), c);
        _mm_stream_si128((__m128i *)(void *)(d + 48), e);
    }
    memcpy(d, s, n);
#else
    memcpy(dst, src, n);
#endif
}

void stoke__copy_nt_done(void)
{
#ifdef STOKE__COPY_NT
    _mm_sfence();
#endif
}
