/* The exit of the interpreter and the loader threads that call Python (pywriter.c's calls).
 *
 * stoke_pyds_stop_all() (from the package's atexit hook, before the interpreter finalizes)
 * waits for the calls in progress and makes every later one fail without touching Python: a
 * worker thread that took the GIL, or freed a torch tensor, during finalization would be ended
 * by pthread_exit, unwinding through libtorch (std::terminate). */
#include <stdatomic.h>
#include <stdio.h>
#include <time.h>

#include "stoke_py.h"

/* `stopped` set once, `inflight` the get() calls past their check of it; `depth`: this
 * thread's calls in progress (a loader freed there may not join its threads: loader.c). */
static atomic_int stopped;
static atomic_int inflight;
static _Thread_local int depth;
static unsigned long stopper; /* the thread that ran the exit hook (set before `stopped`) */

int stoke_py_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

int stoke_pyds_enter(char *msg, size_t msg_len)
{
    atomic_fetch_add(&inflight, 1); /* before the check: stoke_pyds_stop_all waits for it */
    if (atomic_load(&stopped) || stoke_py_finalizing()) {
        atomic_fetch_sub(&inflight, 1);
        snprintf(msg, msg_len, "the Python interpreter is exiting: the dataset is not called");
        return -1;
    }
    depth++;
    return 0;
}

void stoke_pyds_leave(void)
{
    depth--;
    atomic_fetch_sub(&inflight, 1);
}

int stoke_pyds_in_call(void)
{
    return depth > 0;
}

int stoke_pyds_stopped_elsewhere(void)
{
    return atomic_load(&stopped) && PyThread_get_thread_ident() != stopper;
}

void stoke_pyds_stop_all(void)
{
    stopper = PyThread_get_thread_ident();
    atomic_store(&stopped, 1);
    Py_BEGIN_ALLOW_THREADS;
    while (atomic_load(&inflight) > 0) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    Py_END_ALLOW_THREADS;
}

