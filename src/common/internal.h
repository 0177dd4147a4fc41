/* Private helpers shared by every layer of libstoke (never installed). */
#ifndef STOKE_INTERNAL_H
#define STOKE_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "stoke/log.h"
#include "stoke/status.h"

#if defined(__GNUC__)
#define STOKE__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define STOKE__PRINTF(a, b)
#endif

#define STOKE__ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))

/* splitmix64's finalizer: a bijection of 64-bit integers with good avalanche. */
static inline uint64_t stoke__mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* pread()s n bytes at `at` (retrying EINTR and short reads) into buf; *got: bytes read (fewer
 * at end of file).  Returns 0 or -errno. */
int stoke__pread_full(int fd, void *buf, size_t n, uint64_t at, size_t *got);
/* write()s all n bytes (retrying EINTR and short writes).  Returns 0 or -errno. */
int stoke__write_all(int fd, const void *buf, size_t n);

/* Logs one line through the current sink if `level` is enabled. */
void stoke__log(int level, const char *fmt, ...) STOKE__PRINTF(2, 3);
void stoke__vlog(int level, const char *fmt, va_list ap);
/* Cheap check before building an expensive message. */
int stoke__log_enabled(int level);

/* Records `fmt` as the calling thread's last error, logs it at DEBUG, and returns `code`:
 *     return stoke__fail(STOKE_EIO, "npy %s: header truncated", path);
 * A message longer than the last-error string keeps its head and its tail (the reason), joined
 * by " ... ".  An argument may be stoke_last_error() itself (the message is built aside). */
int stoke__fail(int code, const char *fmt, ...) STOKE__PRINTF(2, 3);
/* Same with an explicit log level (e.g. WARN for errors a user must see even if unchecked). */
int stoke__fail_at(int level, int code, const char *fmt, ...) STOKE__PRINTF(3, 4);
/* 1 when `code` is one of STOKE_STATUS_MAP's (a switch: no string compared). */
int stoke__status_known(int code);
/* Sets the calling thread's last error without logging it (for text already logged). */
void stoke__set_error_text(const char *fmt, ...) STOKE__PRINTF(1, 2);
/* Forgets the calling thread's last error.  Only at the start of an operation, to tell whether
 * the call it makes (a backend's) leaves a message: never on a cleanup path. */
void stoke__clear_error(void);

/* Cleanup never clears or replaces a pending error.  A cleanup path that calls functions which
 * may clear or set the last error (destroy functions, stream synchronization, a backend's free)
 * brackets them:
 *     stoke__saved_error saved;
 *     stoke__error_save(&saved);
 *     ...cleanup...
 *     stoke__error_restore(&saved);
 * so the message of the failure that led there survives. */
/* The room of a message: the thread's last error, and the buffers a failure's message passes
 * through on its way there (a source's read, a sample's failure in a batch, a bad sample):
 * enough for a message naming a long URL or path twice and ending with its reason. */
#define STOKE__MSG_MAX 1024

typedef struct stoke__saved_error {
    char msg[STOKE__MSG_MAX];
} stoke__saved_error;
void stoke__error_save(stoke__saved_error *s);
void stoke__error_restore(const stoke__saved_error *s);

/* snprintf that always terminates and never warns about truncation; returns `dst`. */
char *stoke__strlcpy(char *dst, const char *src, size_t n);
char *stoke__fmt(char *dst, size_t n, const char *fmt, ...) STOKE__PRINTF(3, 4);
/* Copies src into dst (n bytes); a longer src keeps its head and its tail joined by " ... "
 * (messages end with their reason; a long path in the middle is what gets cut). */
char *stoke__shorten(char *dst, size_t n, const char *src);
/* vsnprintf into dst (n bytes) that shortens a message too long for it as stoke__shorten does.
 * An argument must not point into dst. */
char *stoke__vfmt_short(char *dst, size_t n, const char *fmt, va_list ap);
/* stoke__vfmt_short's variadic form. */
char *stoke__fmt_short(char *dst, size_t n, const char *fmt, ...) STOKE__PRINTF(3, 4);

/* ASan and TSan builds: every fork of the process first waits for the other threads to sleep,
 * as those runtimes do not make their allocator safe across fork (src/common/sanitizer_fork.c).
 * Registered when the library is loaded; nothing in other builds. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
void stoke__sanitizer_fork_hook(void);
#else
static inline void stoke__sanitizer_fork_hook(void) {}
#endif

/* Monotonic clock in nanoseconds. */
uint64_t stoke__now_ns(void);

/* Names the calling thread (at most 15 characters are kept), e.g. "stoke-w3". */
void stoke__thread_name(const char *name);

/* Memory that is resident from the start (common/memory.c): an anonymous mapping of `size`
 * bytes, page aligned and zeroed, every page faulted in now (MADV_POPULATE_WRITE; before Linux
 * 5.14 one write per page), with transparent huge pages asked for from 2 MiB.  For buffers
 * that are written again and again (the loader's batch buffers, the pinned allocator's
 * stand-in when there is no accelerator): the page faults are paid once at creation rather
 * than in the first epoch, where on a virtual machine each costs microseconds (58 MiB of
 * fresh buffers took 165 ms to fault in on this project's VM, 3 ms to write again).  NULL when
 * out of memory.  Freed with stoke__resident_free(p, size) (the same size). */
void *stoke__resident_alloc(size_t size);
void stoke__resident_free(void *p, size_t size);
/* Copies n bytes with non-temporal stores: on x86-64 SSE2 streaming stores for the middle,
 * from the first 16-byte aligned byte of dst, and memcpy for the ends; elsewhere memcpy.  The
 * destination's cache lines are not read first (memcpy's stores read each line they write when
 * it is not in the cache) and do not displace the cache: a copy into buffers far larger than
 * the cache then moves two bytes of memory traffic per byte instead of three.  For memory no
 * core reads soon (a batch handed to a device, or too big to stay in the cache anyway).  The
 * stores are weakly ordered: call stoke__copy_nt_done() after a run of them, before the data is
 * published to another thread (a lock release orders them too, but say it). */
void stoke__copy_nt(void *dst, const void *src, size_t n);
void stoke__copy_nt_done(void);
/* calloc(n, size) rounded up to whole cache lines (STOKE__LINE bytes) and aligned to one, so
 * that no other allocation shares its lines: for records one thread writes while another reads
 * their neighbours (the loader's batches).  Freed with free().  NULL when out of memory or
 * n * size overflows. */
#define STOKE__LINE 64
void *stoke__calloc_lines(size_t n, size_t size);
/* Bytes of physical memory (0 if unknown). */
uint64_t stoke__physical_memory(void);

#endif
