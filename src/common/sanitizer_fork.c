/* AddressSanitizer and ThreadSanitizer builds only: a fork waits until no other thread of the
 * process is running.
 *
 * The sanitizer runtimes of GCC 12 (Debian 12's libasan8 and libtsan2; LLVM's before 18 for
 * ASan, 19 for TSan) take no lock of their allocator around fork().  A thread of the parent
 * inside malloc or free as another forks (a Python thread exiting frees its state without the
 * GIL) leaves the child with a size class's mutex held by nobody, and the child's first
 * allocation of that size waits forever.  Seen in CI: a torch DataLoader worker forked in the
 * ASan run as the previous pass's queue feeder threads exited, hung in
 * SizeClassAllocator64::GetFromAllocator (tests/python/test_dropin_parity.py; outside the
 * tests, one hang in 4,500 such passes of 2 workers, and every time within two minutes with a
 * thread that wakes every few seconds).  tests/test_fork_threads.c hangs a child under both
 * (under TSan in about one run of six).  LLVM locks the allocators in pthread_atfork handlers
 * since (llvm-project PRs 75290 and 96600); their lock functions are not exported here.
 *
 * So the handler below, registered when libstoke is loaded, waits before every fork of the
 * process (the library's workers, Python's os.fork, torch's) until every other thread is
 * asleep or stopped: one that is running or runnable may be inside the allocator.  A thread
 * asleep holds none of its locks, as the allocator never sleeps with one held but to wait for
 * another.  What is left is a thread that wakes between the check and the end of the fork
 * (the kernel's copy of the address space); a Python thread waiting for the GIL, which the
 * forking thread holds, cannot.  The wait is bounded (a thread computing for longer than that
 * forks anyway, as before) and costs nothing when every other thread sleeps, as at a loader's
 * start.  Not compiled into other builds: glibc's malloc is fork-safe. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)

#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"

/* The longest wait: 50 ms was outlasted beside a CPU hog (a thread starved in a 10 ms burst of
 * allocations); a thread that computes longer costs each fork this much, in these builds only. */
enum { QUIESCE_MS = 250 };

/* Whether a thread other than this one is running, runnable or in uninterruptible sleep. */
static int another_thread_busy(void)
{
    DIR *dir = opendir("/proc/self/task");
    if (!dir)
        return 0;
    pid_t self = gettid();
    int busy = 0;
    struct dirent *e;
    while (!busy && (e = readdir(dir))) {
        char *end;
        long tid = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end || tid == self)
            continue;
        char path[64], stat[256];
        snprintf(path, sizeof path, "/proc/self/task/%ld/stat", tid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue; /* it exited */
        ssize_t n = read(fd, stat, sizeof stat - 1);
        close(fd);
        if (n <= 0)
            continue;
        stat[n] = '\0';
        /* "tid (comm) S ...": the state follows the last ')' (a comm may hold one) */
        const char *paren = strrchr(stat, ')');
        if (paren && paren[1] == ' ')
            busy = paren[2] == 'R' || paren[2] == 'D';
    }
    closedir(dir);
    return busy;
}

static void quiesce(void)
{
    struct timespec start, now, nap = {0, 100 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &start);
    while (another_thread_busy()) {
        clock_gettime(CLOCK_MONOTONIC, &now);
        long ms = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (ms >= QUIESCE_MS)
            return;
        nanosleep(&nap, NULL);
    }
}

static pthread_once_t hooked = PTHREAD_ONCE_INIT;

static void hook(void)
{
    pthread_atfork(quiesce, NULL, NULL);
}

/* At load (libstoke.so, or a program linking the static library that forks workers: the
 * loader's process workers call it, which also keeps this object in such a program). */
__attribute__((constructor)) void stoke__sanitizer_fork_hook(void)
{
    pthread_once(&hooked, hook);
}

#else
typedef int stoke__sanitizer_fork_unused; /* ISO C: a translation unit declares something */
#endif
