/* The SIGBUS guard of fault_guard.h.
 *
 * Mechanism: one process-wide SA_SIGINFO handler, installed when a dataset maps a file (again
 * only if something replaced it since, then chaining to that).  A guarded copy stores, in a
 * thread-local pointer, the address range of the mapping it reads and a sigjmp_buf on its own
 * stack, then memcpy's.  The handler acts only when all of these hold: the signal is a fault
 * raised by the kernel (si_code > 0, not kill/raise/sigqueue), the faulting thread has a copy
 * armed, and si_addr lies inside that copy's mapping.  It then disarms, restores the thread's
 * signal mask from the interrupted context and siglongjmps back to the copy, which reports
 * failure.  Anything else is chained to the previous disposition: a previous handler is called
 * as it expects (sa_sigaction or sa_handler); the default action is restored and the fault
 * re-executes (or the sent signal is re-raised), so the process dies exactly as it would have.
 *
 * The thread-local pointer uses the initial-exec TLS model so that reading it in the handler
 * never allocates (a thread that never ran a guarded copy reads NULL). */
#define _GNU_SOURCE
#include "sources/fault_guard.h"

#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <ucontext.h>

typedef struct guard {
    sigjmp_buf jb;
    const unsigned char *lo, *hi; /* the mapping the armed copy reads */
    const void *volatile fault;   /* the address that faulted (set by the handler) */
} guard;

#if defined(__GNUC__)
#define TLS_INITIAL_EXEC __attribute__((tls_model("initial-exec")))
#else
#define TLS_INITIAL_EXEC
#endif

static _Thread_local guard *volatile tl_armed TLS_INITIAL_EXEC;
/* The disposition stoke's handler chains to.  Installers hold g_lock; each installation
 * fills the slot not published last and then publishes it, so a handler running in another
 * thread reads a complete struct (two installations in a row during one handler's run would
 * be needed to overwrite what it reads). */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction g_prev_slot[2];
static int g_next_slot;
static _Atomic(const struct sigaction *) g_prev;

static void on_sigbus(int sig, siginfo_t *si, void *uc);

/* Hands a signal that is not ours to the previous disposition. */
static void chain(int sig, siginfo_t *si, void *uc)
{
    int saved = errno;
    struct sigaction none;
    const struct sigaction *prev = atomic_load(&g_prev);
    if (!prev || prev->sa_sigaction == on_sigbus) { /* never chain to ourselves */
        memset(&none, 0, sizeof(none));
        none.sa_handler = SIG_DFL;
        prev = &none;
    }
    if ((prev->sa_flags & SA_SIGINFO) && prev->sa_sigaction) {
        prev->sa_sigaction(sig, si, uc);
    } else if (!(prev->sa_flags & SA_SIGINFO) && prev->sa_handler != SIG_DFL &&
               prev->sa_handler != SIG_IGN) {
        prev->sa_handler(sig);
    } else if (!(prev->sa_flags & SA_SIGINFO) && prev->sa_handler == SIG_IGN &&
               (!si || si->si_code <= 0)) {
        /* a sent SIGBUS that was ignored before stoke stays ignored */
    } else {
        /* default action (a fault cannot be ignored either): restore it; returning re-executes
         * the faulting access, a sent signal is raised again, and the process ends as it would
         * have without stoke. */
        struct sigaction dfl;
        memset(&dfl, 0, sizeof(dfl));
        dfl.sa_handler = SIG_DFL;
        sigemptyset(&dfl.sa_mask);
        sigaction(sig, &dfl, NULL);
        if (!si || si->si_code <= 0)
            raise(sig);
    }
    errno = saved;
}

/* Before leaving the handler by siglongjmp: the mask the thread had when the fault hit (the
 * kernel blocked SIGBUS for the handler's run, a sanitizer's wrapper may have blocked more, and
 * only a normal return from the handler would have restored it).  pthread_sigmask is
 * async-signal-safe. */
static void restore_mask(void *uc)
{
    if (uc) {
        pthread_sigmask(SIG_SETMASK, &((const ucontext_t *)uc)->uc_sigmask, NULL);
    } else {
        sigset_t s;
        sigemptyset(&s);
        sigaddset(&s, SIGBUS);
        pthread_sigmask(SIG_UNBLOCK, &s, NULL);
    }
}

static void on_sigbus(int sig, siginfo_t *si, void *uc)
{
    guard *g = tl_armed;
    if (g && si && si->si_code > 0) {
        const unsigned char *a = si->si_addr;
        if (a >= g->lo && a < g->hi) {
            g->fault = a;
            tl_armed = NULL;
            restore_mask(uc);
            siglongjmp(g->jb, 1);
        }
    }
    chain(sig, si, uc);
}

static int set_ours(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, NULL) == 0 ? 0 : -errno;
}

int stoke__fault_guard_install(void)
{
    pthread_mutex_lock(&g_lock);
    struct sigaction cur;
    int rc = sigaction(SIGBUS, NULL, &cur) == 0 ? 0 : -errno;
    if (!rc && cur.sa_sigaction == on_sigbus) {
        /* ours, possibly put back by a signal() that dropped SA_SIGINFO: same chain */
        if ((cur.sa_flags & (SA_SIGINFO | SA_ONSTACK)) != (SA_SIGINFO | SA_ONSTACK))
            rc = set_ours();
    } else if (!rc) {
        /* first time, or someone replaced ours since: chain to what is there now */
        struct sigaction *slot = &g_prev_slot[g_next_slot];
        g_next_slot ^= 1;
        *slot = cur;
        atomic_store(&g_prev, slot);
        rc = set_ours();
    }
    pthread_mutex_unlock(&g_lock);
    return rc;
}

int stoke__guarded_run(void (*fn)(void *arg), void *arg, const void *base, size_t len,
                       const void **fault)
{
    guard g;
    g.lo = base;
    g.hi = (const unsigned char *)base + len;
    g.fault = NULL;
    /* savemask 0: no system call per copy; the handler restores the mask before jumping. */
    if (sigsetjmp(g.jb, 0) != 0) {
        if (fault)
            *fault = g.fault;
        return -1;
    }
    tl_armed = &g;
    atomic_signal_fence(memory_order_seq_cst);
    fn(arg);
    atomic_signal_fence(memory_order_seq_cst);
    tl_armed = NULL;
    return 0;
}

typedef struct copy_args {
    void *dst;
    const void *src;
    size_t n;
} copy_args;

static void copy_fn(void *arg)
{
    const copy_args *a = arg;
    memcpy(a->dst, a->src, a->n);
}

int stoke__guarded_copy(void *dst, const void *src, size_t n, const void *base, size_t len)
{
    copy_args a = {dst, src, n};
    return stoke__guarded_run(copy_fn, &a, base, len, NULL);
}
