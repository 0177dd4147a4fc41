/* A preloaded library (LD_PRELOAD) that makes pthread_create fail as a process at its limit of
 * threads does (RLIMIT_NPROC, a container's pids.max): with STOKE_TEST_FAIL_THREADS=N in the
 * environment, every pthread_create after the first N answers EAGAIN without starting a thread;
 * without it, every call goes through.  For the tests of what stoke does when it cannot start
 * a thread (tests/python/test_remote_threads.py).  The real pthread_create is the next one in
 * the lookup order (a sanitizer's interceptor, when its runtime is preloaded after this one). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

typedef int (*create_fn)(pthread_t *, const pthread_attr_t *, void *(*)(void *), void *);

/* (exported whatever the build's default visibility: it must interpose libc's) */
__attribute__((visibility("default"))) int pthread_create(pthread_t *th, const pthread_attr_t *attr,
                                                          void *(*start)(void *), void *arg)
{
    static _Atomic long calls;
    const char *n = getenv("STOKE_TEST_FAIL_THREADS");
    if (n && atomic_fetch_add(&calls, 1) >= atol(n))
        return EAGAIN;
    create_fn real;
    *(void **)&real = dlsym(RTLD_NEXT, "pthread_create"); /* (ISO C: no object-to-function cast) */
    return real ? real(th, attr, start, arg) : ENOSYS;
}
