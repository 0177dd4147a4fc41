/* Process workers (stoke_loader_opts.worker_mode = STOKE_WORKER_PROCESSES; docs/loader.md,
 * "Process workers").
 *
 * At create, before any loader thread exists, the batch buffers (and the batches' index and
 * offset arrays) are put in one shared mapping of an anonymous memfd, and one single-threaded
 * "zygote" process is forked.  The zygote forks worker children on request (so a replacement is
 * never forked from the multithreaded parent) and passes each child's socket to the parent with
 * SCM_RIGHTS; it also reaps them (procchild.c: the zygote and the children's loop).  The
 * parent's worker threads dispatch, hand off and order as with threads; only the filling of a
 * batch is a request to worker w's child, which runs the same fill code (bad-sample policy
 * included) on its forked copy of the loader and writes the samples straight into the shared
 * buffer.  Worker thread w keeps up to prefetch_factor requests in flight to its child (`depth`;
 * stoke__proc_send, stoke__proc_take), so the child never waits for the thread between two
 * batches; replies come in request order.  The child publishes the dataset index it is loading
 * in its busy marks (stoke__busy), in shared memory, so a crash names its sample.
 *
 * Messages (SOCK_SEQPACKET, one struct per message):
 *   parent -> zygote: zreq {SPAWN, worker} -> zrep {pid, err} + the parent's socket end;
 *                     zreq {REAP, pid} -> zrep {wait status}.  Each request carries a number
 *                     its reply repeats: the parent waits ZYGOTE_MS for it, and a late reply to
 *                     a request that timed out is dropped (a child forked for it is killed
 *                     and reaped: zreq {FORGET, pid}).  zreq {EXIT} (destroy) or EOF: the
 *                     zygote SIGKILLs its children (idle at destroy; a dead loader's must
 *                     stop at once), reaps them and exits.
 *   parent -> child:  wreq (a batch: handle, slot, seq, seed, epoch, its run's gen, flags,
 *                     poisoned samples); a request whose gen is not the run in the child's
 *                     busy marks (stoke__loader_abandon) is answered ECANCELED, not made;
 *                     the child calls the dataset's set_epoch when the epoch is not the one its
 *                     copy of the dataset was last set to (create's call, made before the
 *                     zygote forks, then its own: the parent's later calls reach only the
 *                     parent's copy).
 *   child -> parent:  zero or more wmsg BAD (the batch's bad samples), then one wmsg DONE.
 *                     EOF on its socket: the child exits.
 * Death and fork: the zygote has PR_SET_PDEATHSIG(SIGHUP) and compares getppid() with the
 * loader's pid whenever it wakes (the signal fires when the *thread* that forked it ends, which
 * may be long before the process); when the loader's process is gone it SIGKILLs its children
 * and exits.  A child has PR_SET_PDEATHSIG(SIGKILL) towards the zygote and checks, before each
 * batch, that the zygote is its parent and the parent's end of its socket is open.  Every live
 * loader's descriptors are listed; a pthread_atfork child handler closes them in any forked
 * process (a zygote of another loader, a fork of the user's) and counts forks, so a loader used
 * from a process that did not create it fails at once (stoke__loader_foreign; a loader of
 * the caller's thread alone keeps working there).
 * A child that dies (EOF on its socket) is reaped through the zygote; it died on its worker's
 * oldest request in flight (the younger ones, not started, are sent again to the replacement),
 * and its crash is the failure of the sample it was on: with on_error = error the batch fails,
 * otherwise the sample is "poisoned" (a replacement child's dataset calls fail for it with the
 * crash message, so the ordinary policy skips or replaces it) and the batch is re-run by a
 * replacement child. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "ipc/ipc_internal.h"
#include "loader/loader_internal.h"
#include "loader/proc_internal.h"
#include "pinned/pinned_internal.h"
#include "stoke/arena.h"
#include "stoke/pinned.h"

/* ---- forks: the live loaders' descriptors, closed in every forked process --------------- */

static pthread_mutex_t fork_mu = PTHREAD_MUTEX_INITIALIZER;
static stoke__proc *fork_list; /* (fork_mu) */
static _Atomic unsigned fork_gen;
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void close_fd(_Atomic int *fd)
{
    int v = atomic_exchange(fd, -1);
    if (v >= 0)
        close(v);
}

static void fork_prepare(void)
{
    pthread_mutex_lock(&fork_mu);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&fork_mu);
}

/* In the child of any fork (the user's, another loader's zygote, a worker): the sockets of the
 * parent's loaders are not this process's to hold (a zygote that still had a reader would never
 * see EOF), and those loaders are foreign now. */
static void fork_child(void)
{
    atomic_fetch_add(&fork_gen, 1);
    for (stoke__proc *p = fork_list; p; p = p->next) {
        for (int i = 0; i < p->nw; i++) {
            close_fd(&p->w[i].fd);
            close_fd(&p->w[i].wake);
        }
        close_fd(&p->zfd);
    }
    pthread_mutex_unlock(&fork_mu);
}

static void fork_hooks(void)
{
    stoke__sanitizer_fork_hook();
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

unsigned stoke__fork_gen(void)
{
    pthread_once(&fork_once, fork_hooks);
    return atomic_load(&fork_gen);
}

int stoke__loader_forked(const stoke_loader *l)
{
    return l->fork_gen != atomic_load(&fork_gen);
}

/* A forked copy of a loader that makes its batches on the caller's thread into memory of its
 * own (no worker threads or processes, no device copies, no arena, no pinning: a backend's
 * pinned memory may not be mapped in a fork, CUDA's is MADV_DONTFORK) still works: its state is
 * a plain copy, as a caller's fork of a 0-worker loader reading rows expects (test_npy_block);
 * any other's use fails, its threads and processes being the creator's. */
int stoke__loader_foreign(const stoke_loader *l)
{
    return stoke__loader_forked(l) &&
           (l->nworkers > 0 || l->proc || l->o.device || l->arena || l->pin_backend[0]);
}

int stoke__loader_forked_fail(stoke_loader *l)
{
    return stoke__loader_fail(l, STOKE_ESTATE,
                              "loader was created in process %d; a forked child cannot use it "
                              "(this is process %d)",
                              l->pid, (int)getpid());
}

static void list_proc(stoke__proc *p, int on)
{
    pthread_mutex_lock(&fork_mu);
    if (on) {
        p->next = fork_list;
        fork_list = p;
    } else {
        stoke__proc **pp = &fork_list;
        while (*pp != p)
            pp = &(*pp)->next;
        *pp = p->next;
    }
    pthread_mutex_unlock(&fork_mu);
}

/* ---- the parent ------------------------------------------------------------------------- */

/* The shared mapping (an anonymous memfd, or an allocation of the node-wide arena, which is
 * shared and pinned already), carved into: per batch handle its buffer, its indices and its
 * ragged fields' words (b->rmeta); the children's busy marks. */
static int map_shared(stoke_loader *l, stoke__proc *p)
{
    size_t words = l->cap + (size_t)l->nragged * STOKE__RMETA_WORDS(l);
    size_t idx_bytes = stoke__align_up(words * sizeof(uint64_t), 4096);
    size_t per = stoke__align_up(l->buf_bytes, 4096) + idx_bytes;
    size_t ctl_bytes = stoke__align_up((size_t)l->nworkers * sizeof(stoke__busy), 4096);
    p->shm_len = per * (size_t)l->nbuf + ctl_bytes;
    void *m = MAP_FAILED;
    if (l->arena) {
        int rc = stoke_arena_alloc(l->arena, p->shm_len, &m);
        if (rc != STOKE_OK)
            return stoke__loader_fail(l, rc, "loader: shared batch buffers: %s",
                                      stoke_last_error());
        p->from_arena = 1;
    } else {
        int fd = memfd_create("stoke-batches", MFD_CLOEXEC);
        if (fd < 0)
            return stoke__loader_fail(l, STOKE_ENOMEM, "loader: memfd_create failed: %s",
                                      strerror(errno));
        if (ftruncate(fd, (off_t)p->shm_len) == 0)
            m = mmap(NULL, p->shm_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        int e = errno;
        close(fd);
        if (m == MAP_FAILED)
            return stoke__loader_fail(l, STOKE_ENOMEM,
                                      "loader: cannot map %zu bytes of shared batch buffers: %s",
                                      p->shm_len, strerror(e));
        /* pinned where pinning is in effect (else a registration is bookkeeping only: the
         * mapping's bytes counted registered); pin_on_use: each buffer's used part, as the
         * consumer takes its batches (stoke__proc_pin) */
        const stoke_backend *vt = NULL;
        int dev;
        stoke__pn_ensure_init(); /* (STOKE_PINNED read) */
        int pins =
            l->alloc_kind != STOKE__ALLOC_PAGEABLE && stoke__pn_target(&vt, &dev) == STOKE_OK && vt;
        l->pin_lazy = pins && l->o.pin_on_use;
        p->registered = pins && !l->pin_lazy && stoke_pin_register(m, p->shm_len) == STOKE_OK;
    }
    p->shm = m;
    for (int i = 0; i < l->nbuf; i++) {
        unsigned char *base = p->shm + per * (size_t)i;
        l->slots[i].mem = base;
        l->slots[i].pinned = (p->registered || p->from_arena) && stoke_is_pinned(base);
        l->bat[i].l = l;
        l->bat[i].indices = (uint64_t *)(base + stoke__align_up(l->buf_bytes, 4096));
        l->bat[i].rmeta = l->nragged ? (int64_t *)(l->bat[i].indices + l->cap) : NULL;
    }
    p->ctl = (stoke__busy *)(p->shm + per * (size_t)l->nbuf);
    for (int i = 0; i < l->nworkers; i++) { /* the consumer's timeout check reads the child's */
        atomic_store(&p->ctl[i].since, 0);
        atomic_store(&p->ctl[i].stop, 0); /* (an arena's memory may be a reused chunk's) */
        atomic_store(&p->ctl[i].gen, l->gen);
        l->w[i].p.busy = &p->ctl[i];
    }
    return STOKE_OK;
}

int stoke__proc_create(stoke_loader *l)
{
    if (l->o.worker_mode != STOKE_WORKER_PROCESSES)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: unknown worker_mode %d (STOKE_WORKER_THREADS, "
                                  "STOKE_WORKER_PROCESSES)",
                                  l->o.worker_mode);
    if (l->iterable)
        return stoke__loader_fail(l, STOKE_ENOTSUP,
                                  "loader: worker_mode processes works with MAP datasets "
                                  "only; %s is ITERABLE (use worker threads)",
                                  l->ds.name);
    if (l->nworkers < 1)
        return stoke__loader_fail(l, STOKE_EINVAL,
                                  "loader: worker_mode processes needs num_workers >= 1");
    stoke__proc *p = calloc(1, sizeof(*p) + (size_t)l->nworkers * sizeof(proc_w));
    if (!p)
        return stoke__loader_fail(l, STOKE_ENOMEM, "loader: out of memory");
    l->proc = p;
    p->zfd = -1;
    p->zpid = -1;
    pthread_mutex_init(&p->zmu, NULL);
    p->nw = l->nworkers;
    for (int i = 0; i < l->nworkers; i++) {
        p->w[i].fd = -1;
        p->w[i].wake = -1;
        atomic_store(&p->w[i].pid, -1);
    }
    list_proc(p, 1);           /* its descriptors are -1 until they are made */
    int rc = map_shared(l, p); /* the buffers and the index arrays */
    if (rc != STOKE_OK)
        return rc;
    p->depth = l->prefetch < l->nbuf ? l->prefetch : l->nbuf; /* (both at least 1) */
    p->ring = calloc((size_t)l->nworkers * (size_t)p->depth, sizeof(proc_req));
    if (!p->ring)
        return stoke__loader_fail(l, STOKE_ENOMEM, "loader: out of memory");
    for (int i = 0; i < l->nworkers; i++) { /* (in the zygote, the fork handler closes them) */
        p->w[i].q = p->ring + (size_t)i * (size_t)p->depth;
        p->w[i].wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (p->w[i].wake < 0)
            return stoke__loader_fail(l, STOKE_ENOMEM, "loader: eventfd failed: %s",
                                      strerror(errno));
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
        return stoke__loader_fail(l, STOKE_ENOMEM, "loader: socketpair failed: %s",
                                  strerror(errno));
    pid_t self = getpid();
    if (l->ds.fork_prepare)
        l->ds.fork_prepare(l->ds.user);
    pid_t pid = fork(); /* the fork handler closes the other loaders' sockets in the zygote */
    if (pid == 0) {
        close(sv[0]);
        if (l->ds.fork_child)
            l->ds.fork_child(l->ds.user, -1);
        stoke__zygote_main(l, sv[1], self);
        _exit(0);
    }
    int e = errno; /* (before the hook, which may change it) */
    if (l->ds.fork_parent)
        l->ds.fork_parent(l->ds.user);
    close(sv[1]);
    if (pid < 0) {
        close(sv[0]);
        return stoke__loader_fail(l, STOKE_ENOMEM, "loader: cannot fork the worker zygote: %s",
                                  strerror(e));
    }
    p->zpid = pid;
    if (l->arena && stoke__arena_add_writer(l->arena, pid) != STOKE_OK) /* see arena_alloc.c */
        stoke__log(STOKE_LOG_WARN, "loader: %s", stoke_last_error());
    p->zfd = sv[0];
    return STOKE_OK;
}

/* One request to the zygote and its reply (with a descriptor for SPAWN into *fd, which the
 * caller set to -1), within ZYGOTE_MS.  STOKE_OK; STOKE_ETIMEDOUT (a zygote that is stopped or
 * stuck) or STOKE_ENOMEM (gone: no process can be started, as when fork fails), with why in
 * msg. */
static int zygote_call(stoke__proc *p, zreq *q, zrep *rep, int *fd, int *cut, char *msg, size_t len)
{
    pthread_mutex_lock(&p->zmu);
    q->seq = ++p->zseq;
    int zfd = p->zfd, rc = STOKE_OK;
    /* no wait here (nor EINTR): one request at a time leaves room in the socket */
    ssize_t sr = zfd >= 0 ? send(zfd, q, sizeof(*q), MSG_NOSIGNAL | MSG_DONTWAIT) : -1;
    if (sr != (ssize_t)sizeof(*q))
        rc = zfd >= 0 && sr < 0 && errno == EAGAIN ? STOKE_ETIMEDOUT : STOKE_ENOMEM;
    uint64_t deadline = stoke__now_ns() + (uint64_t)ZYGOTE_MS * 1000000u;
    while (rc == STOKE_OK) {
        uint64_t now = stoke__now_ns();
        struct pollfd pfd = {.fd = zfd, .events = POLLIN};
        int pr = now >= deadline ? 0 : poll(&pfd, 1, (int)((deadline - now) / 1000000u) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0) {
            rc = STOKE_ETIMEDOUT;
            break;
        }
        int got = -1;
        ssize_t rn = pr < 0 ? -1 : stoke__recvmsg_fd(zfd, rep, sizeof(*rep), &got);
        int ctrunc = rn >= 0 && errno == EMFILE; /* its descriptor was cut off */
        if (rn != (ssize_t)sizeof(*rep)) {
            if (got >= 0)
                close(got);
            rc = STOKE_ENOMEM;
            break;
        }
        if (rep->seq != q->seq) { /* the late reply to a request that timed out */
            if (got >= 0)
                close(got); /* a child forked for it: EOF, it exits */
            /* and the zygote reaps it (else: a zombie), its socket taken or cut off here
             * (RLIMIT_NOFILE); only a SPAWN's reply carries a descriptor (a REAP's pid was
             * reaped: asking again could kill a process that took the pid since) */
            if (rep->pid > 0 && (got >= 0 || ctrunc)) {
                zreq f = {.op = Z_FORGET, .pid = rep->pid};
                (void)send(zfd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
            }
            continue;
        }
        if (cut)
            *cut = ctrunc;
        if (fd)
            *fd = got;
        else if (got >= 0)
            close(got);
        break;
    }
    pthread_mutex_unlock(&p->zmu);
    if (rc == STOKE_ETIMEDOUT)
        stoke__fmt(msg, len, "the worker zygote (pid %d) did not answer in %d s", (int)p->zpid,
                   ZYGOTE_MS / 1000);
    else if (rc != STOKE_OK)
        stoke__fmt(msg, len, "the worker zygote (pid %d) is gone", (int)p->zpid);
    return rc;
}

static int spawn(stoke_loader *l, int wid, char *msg, size_t len)
{
    stoke__proc *p = l->proc;
    zreq q = {.op = Z_SPAWN, .worker = wid};
    zrep rep = {.pid = -1};
    int fd = -1;
    char why[160];
    int lost = 0; /* the reply's descriptor was cut off (this process at RLIMIT_NOFILE) */
    int rc = zygote_call(p, &q, &rep, &fd, &lost, why, sizeof(why));
    if (rc != STOKE_OK || rep.pid <= 0 || fd < 0) {
        if (fd >= 0)
            close(fd);
        if (rc == STOKE_OK && rep.pid > 0) { /* forked, but its socket never came: the zygote
                                                kills and reaps it (else a zombie each time) */
            zreq f = {.op = Z_FORGET, .pid = rep.pid};
            pthread_mutex_lock(&p->zmu);
            if (p->zfd >= 0)
                (void)send(p->zfd, &f, sizeof(f), MSG_NOSIGNAL | MSG_DONTWAIT);
            pthread_mutex_unlock(&p->zmu);
        }
        if (rc == STOKE_OK) {
            int fds = lost || rep.err == EMFILE || rep.err == ENFILE;
            rc = fds ? STOKE_ELIMIT : STOKE_ENOMEM;
            struct rlimit rl = {0};
            if (rep.err)
                stoke__fmt(why, sizeof(why), "%s", strerror(rep.err));
            else if (lost && getrlimit(RLIMIT_NOFILE, &rl) == 0)
                stoke__fmt(why, sizeof(why),
                           "its socket could not be received: this process "
                           "has too many open files (RLIMIT_NOFILE %llu; ulimit -n)",
                           (unsigned long long)rl.rlim_cur);
            else
                stoke__fmt(why, sizeof(why), "no descriptor from the worker zygote");
        }
        stoke__fmt(msg, len, "cannot start worker process %d: %s", wid, why);
        return rc;
    }
    p->w[wid].fd = fd;
    p->w[wid].send_closed = 0;
    if (l->arena && stoke__arena_add_writer(l->arena, rep.pid) != STOKE_OK) /* before its work */
        stoke__log(STOKE_LOG_WARN, "loader: %s", stoke_last_error());
    atomic_store(&p->w[wid].pid, rep.pid);
    return STOKE_OK;
}

/* Closes worker wid's socket, reaps its child through the zygote (SIGKILL first when `kill`)
 * and describes how it ended into msg; *sig: the signal it died of, else 0. */
static void reap(stoke_loader *l, int wid, int kill_it, char *msg, size_t len, int *sig_out)
{
    *sig_out = 0;
    stoke__proc *p = l->proc;
    int pid = atomic_exchange(&p->w[wid].pid, -1);
    close_fd(&p->w[wid].fd);
    if (pid <= 0)
        return;
    zreq q = {.op = Z_REAP, .pid = pid, .kill = kill_it};
    zrep rep = {0};
    char why[160] = "";
    if (zygote_call(p, &q, &rep, NULL, NULL, why, sizeof(why)) != STOKE_OK || rep.err) {
        stoke__fmt(msg, len, "worker process %d died (its exit status is unknown%s%.150s)", pid,
                   why[0] ? ": " : "", why);
        return;
    }
    int st = rep.status;
    if (WIFSIGNALED(st)) {
        int sig = WTERMSIG(st);
        *sig_out = sig;
        char name[24]; /* SIGSEGV, or signal 34 (glibc names no real-time signal) */
        if (sigabbrev_np(sig))
            stoke__fmt(name, sizeof(name), "SIG%s", sigabbrev_np(sig));
        else
            stoke__fmt(name, sizeof(name), "signal %d", sig);
        stoke__fmt(msg, len, "worker process %d killed by %s (%s)", pid, name, strsignal(sig));
    } else {
        stoke__fmt(msg, len, "worker process %d exited with status %d", pid,
                   WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
}

enum { X_DONE = 0, X_DEAD = 1, X_STOPPED = 2, X_WOKEN = 3 };

/* Whether worker w's child is busy on a batch (b, its oldest) nobody wants and may be killed
 * for: the loader is being destroyed, or b's run was abandoned after stoke_loader_interrupt
 * (interrupted 2; not after the hook's interrupt alone: a caller that goes on keeps its
 * children, whose RNG streams a new child would start again from their first seeds). */
static int unwanted_for(stoke_loader *l, proc_w *w, const stoke_batch *b)
{
    stoke__proc *p = l->proc;
    return atomic_load(&p->stopping) ||
           (atomic_load(&l->interrupted) == 2 && stoke__run_abandoned(&p->ctl[w - p->w], b->gen));
}

/* The request of worker w's oldest batch in flight into w->req (no crash yet). */
static void head_req(stoke_loader *l, proc_w *w)
{
    const proc_req *r = &w->q[w->head];
    memset(&w->req, 0, offsetof(wreq, poison));
    w->req.flags = r->flags;
    w->req.bi = (int32_t)(r->b - l->bat);
    w->req.si = (int32_t)(r->b->host - l->slots);
    w->req.seq = r->b->seq;
    w->req.seed = r->seed;
    w->req.epoch = r->epoch;
    w->req.gen = r->b->gen; /* (set at dispatch, unchanged while FILLING) */
}

/* Sends worker wid's requests not yet sent to its child, oldest first (the oldest's is w->req),
 * without waiting: a full socket (or a transient lack of buffers) leaves the rest for later.  A
 * send that fails otherwise means the child closed its end, but not that its replies are lost:
 * those it sent before dying wait in the socket, and receive() takes them before the end of
 * file that tells the death (a failed send is no death certificate: taking it as one would
 * make a batch already made again, and blame its crash on a sample of another batch). */
static void pump(stoke_loader *l, proc_w *w)
{
    int fd = w->fd, depth = l->proc->depth;
    for (int i = 0; i < w->n && !w->send_closed; i++) {
        proc_req *r = &w->q[(w->head + i) % depth];
        if (r->sent)
            continue;
        wreq younger;
        const wreq *req = &w->req;
        if (i) { /* never started: no crash state (and no poison: all of it zeroed) */
            /* with get() while the oldest looks for the sample its read() crashed on: a read()
             * that crashes on every batch costs one restart, not one a batch */
            r->flags =
                w->no_read || ((w->req.flags & F_READ_CRASHED) && !w->req.npoison) ? F_NO_READ : 0;
            memset(&younger, 0, sizeof(younger));
            younger.flags = r->flags;
            younger.bi = (int32_t)(r->b - l->bat);
            younger.si = (int32_t)(r->b->host - l->slots);
            younger.seq = r->b->seq;
            younger.seed = r->seed;
            younger.epoch = r->epoch;
            younger.gen = r->b->gen;
            req = &younger;
        }
        ssize_t n;
        do
            n = send(fd, req, sizeof(*req), MSG_NOSIGNAL | MSG_DONTWAIT);
        while (n < 0 && errno == EINTR);
        if (n < 0 &&
            (errno == EAGAIN || errno == EWOULDBLOCK || errno == ENOBUFS || errno == ENOMEM))
            return;
        if (n != (ssize_t)sizeof(*req)) {
            w->send_closed = 1;
            return;
        }
        r->sent = 1;
    }
}

/* Takes the reply to worker wid's oldest request into b, sending the requests left unsent as
 * the socket makes room.  With `wakeable`, returns X_WOKEN when the worker's eventfd is written
 * (stoke__proc_wake) before the reply began (once a BAD message of b was read, the wake waits
 * for the next call: b's messages are taken in one call).  When destroy is stopping the loader, a
 * child still busy STOP_GRACE_NS after the worker first saw it is SIGKILLed (X_STOPPED); after
 * an interrupted stoke_loader_next (l->interrupted), at once; after stoke_loader_interrupt, a
 * child busy on a batch of an abandoned run too (unwanted_for). */
static int receive(stoke_loader *l, proc_w *w, stoke_batch *b, int wakeable)
{
    stoke__proc *p = l->proc;
    int fd = w->fd;
    b->bad.n = 0;
    w->stop_t0 = 0;
    wmsg m;
    int got = 0; /* a message of b was read */
    /* b's request never reached the child, which closed its end: nothing will answer it */
    if (w->send_closed && !w->q[w->head].sent)
        return X_DEAD;
    for (;;) {
        int unsent = !w->send_closed && !w->q[(w->head + w->n - 1) % p->depth].sent;
        struct pollfd pfd[2] = {{.fd = fd, .events = (short)(POLLIN | (unsent ? POLLOUT : 0))},
                                {.fd = w->wake, .events = POLLIN}};
        int pr = poll(pfd, wakeable && !got ? 2 : 1, POLL_MS);
        if (pr == 0 || (pr < 0 && errno == EINTR)) {
            if (!unwanted_for(l, w, b))
                continue;
            uint64_t now = stoke__now_ns();
            if (!w->stop_t0)
                w->stop_t0 = now;
            /* after Ctrl-C (the caller's wait was interrupted, and it took no batch since):
             * at once, as torch's workers die of the same SIGINT; the 2 s each was 2 s before
             * the prompt, and an abandoned run (the exit's set_epoch) waited for its batches
             * however long they took */
            if (atomic_load(&l->interrupted) ||
                (atomic_load(&p->stopping) && now - w->stop_t0 > STOP_GRACE_NS))
                return X_STOPPED;
            continue;
        }
        if (pr > 0 && !(pfd[0].revents & ~POLLOUT)) { /* room to send, or woken */
            if (pfd[0].revents & POLLOUT)
                pump(l, w);
            uint64_t v;
            if (wakeable && (pfd[1].revents & POLLIN) && read(w->wake, &v, sizeof(v)) > 0)
                return X_WOKEN;
            continue;
        }
        ssize_t n = stoke__proc_recv(fd, &m, sizeof(m));
        if (n != (ssize_t)sizeof(m))
            return X_DEAD;
        if (m.kind != M_BAD)
            break;
        got = 1;
        stoke__bad *e = stoke__bad_append(b);
        if (e)
            *e = m.bad;
    }
    b->status = m.status;
    b->count = (size_t)m.count;
    b->bytes = (size_t)m.bytes;
    b->err_index = m.err_index;
    b->truncated = m.truncated;
    stoke__fmt(b->err_msg, sizeof(b->err_msg), "%.*s", (int)sizeof(m.err_msg) - 1, m.err_msg);
    return X_DONE;
}

/* After worker wid's child died (of signal sig, or 0) while making b: STOKE_OK to run the
 * batch again (req updated), or the batch's failure status (b failed).  Clears the child's busy
 * mark, which names the dataset call it died in, if any. */
static int after_crash(stoke_loader *l, stoke_batch *b, int wid, wreq *req, const char *why,
                       int sig)
{
    stoke__proc *p = l->proc;
    stoke__busy *c = &p->ctl[wid];
    uint64_t idx = atomic_load(&c->since) ? atomic_load(&c->index) : UINT64_MAX;
    int in_batch = atomic_load(&c->in_batch);
    atomic_store(&c->since, 0);
    uint64_t where = idx != UINT64_MAX ? idx : b->seq * l->o.batch_size;
    stoke__loader_lock(l); /* the restart, counted; past RESTARTS_MAX in this epoch, no more */
    l->st.worker_restarts++;
    if (p->cap_epoch != b->epoch) {
        p->cap_epoch = b->epoch;
        p->cap_n = 0;
    }
    int over = ++p->cap_n > RESTARTS_MAX;
    stoke__loader_unlock(l);
    char m[256];
    if (over) {
        stoke__fmt(m, sizeof(m), "%.150s; worker processes restarted more than %d times this epoch",
                   why, RESTARTS_MAX);
        stoke__batch_failed(b, STOKE_ELIMIT, where, m);
        b->ends_epoch = 1; /* a crash loop: the epoch ends, errors_go_on or not */
        return STOKE_ELIMIT;
    }
    if (idx == UINT64_MAX)
        return STOKE_OK; /* not in a dataset call (killed from outside): run the batch again */
    if ((sig == SIGKILL || sig == SIGTERM) && !(req->flags & F_KILLED) && !l->iterable) {
        /* killed from outside in a dataset call (the OOM killer for another process's memory,
         * a kill): the batch again as it was, once (a sample was blamed, and a read() made
         * slow for good); killed again in it, the sample is what draws the kill.  (An ITERABLE
         * dataset's replacement cannot resume the dead child's iterator: its death is said.) */
        req->flags |= F_KILLED;
        stoke__strlcpy(l->proc->w[wid].killed, why, sizeof(l->proc->w[wid].killed));
        return STOKE_OK;
    }
    if (in_batch && !(req->flags & F_NO_READ)) {
        req->flags |= F_NO_READ | F_READ_CRASHED; /* find the sample: one get() at a time */
        return STOKE_OK;
    }
    if (l->o.on_error != STOKE_ON_ERROR_ERROR && req->npoison < POISON_MAX) {
        req->flags |= F_NO_READ; /* only get() fails the poisoned samples (w_get) */
        req->poison[req->npoison] = idx;
        stoke__strlcpy(req->pmsg[req->npoison++], why, sizeof(req->pmsg[0]));
        return STOKE_OK;
    }
    /* the sample fails its batch: on_error ERROR, or too many crashes */
    stoke__fmt(m, sizeof(m), "%.150s (more than %d crashing samples in one batch)", why,
               POISON_MAX);
    const char *msg = l->o.on_error == STOKE_ON_ERROR_ERROR ? why : m;
    stoke__bad_note(b, idx, STOKE_EDATA, msg);
    stoke__batch_failed(b, STOKE_EDATA, idx, msg);
    return STOKE_EDATA;
}

int stoke__proc_room(const stoke_loader *l, int wid)
{
    return l->proc->depth - l->proc->w[wid].n;
}

int stoke__proc_in_flight(const stoke_loader *l, int wid)
{
    return l->proc->w[wid].n;
}

void stoke__proc_send(stoke_loader *l, stoke_batch *b, stoke__producer *pr)
{
    stoke__proc *p = l->proc;
    proc_w *w = &p->w[pr->wid]; /* a worker thread's (never the caller's: no assist) */
    STOKE__LOADER_ASSERT(pr->w != NULL && w->n < p->depth);
    stoke__loader_batch_start(l, b, pr);
    proc_req *r = &w->q[(w->head + w->n++) % p->depth];
    *r = (proc_req){.b = b,
                    .seed = pr->seed,
                    .epoch = pr->epoch,
                    .t0 = stoke__now_ns(),
                    .flags = w->no_read ? F_NO_READ : 0};
    if (w->n == 1)
        head_req(l, w);
    if (w->fd >= 0) /* else the wait starts a child */
        pump(l, w);
}

/* (mu) Wakes the process workers waiting on their child that could dispatch now. */
void stoke__proc_wake(stoke_loader *l)
{
    for (int i = 0; i < l->nact; i++) {
        stoke__worker *x = &l->w[i];
        if (x->polling && stoke__loader_can_dispatch(l, x)) {
            x->polling = 0;
            (void)eventfd_write(l->proc->w[i].wake, 1);
        }
    }
}

stoke_batch *stoke__proc_take(stoke_loader *l, stoke__producer *pr, int wakeable, uint64_t *busy_ns)
{
    stoke__proc *p = l->proc;
    int wid = pr->wid;
    proc_w *w = &p->w[wid];
    STOKE__LOADER_ASSERT(w->n > 0);
    proc_req *r = &w->q[w->head];
    stoke_batch *b = r->b;
    uint64_t first = b->seq * l->o.batch_size;
    char msg[256] = "";
    for (;;) {
        int rc = STOKE_OK;
        if (w->fd < 0 && atomic_load(&p->stopping)) { /* no new child at destroy */
            rc = STOKE_ECANCELED;
            stoke__strlcpy(msg, "the loader is being destroyed", sizeof(msg));
        } else if (w->fd < 0 && stoke__run_abandoned(&p->ctl[wid], b->gen)) {
            /* nor to answer that a batch is not wanted (b->gen: unchanged while FILLING) */
            rc = STOKE_ECANCELED;
            stoke__strlcpy(msg, "its run was abandoned", sizeof(msg));
        } else if (w->fd < 0) {
            rc = spawn(l, wid, msg, sizeof(msg));
        }
        if (rc != STOKE_OK) {
            stoke__batch_failed(b, rc, first, msg);
            break;
        }
        pump(l, w);
        int x = receive(l, w, b, wakeable);
        if (x == X_WOKEN)
            return NULL;
        if (x == X_DONE)
            break;
        /* the child died (or was killed) on the oldest request: replies come in order */
        int sig;
        reap(l, wid, x == X_STOPPED, msg, sizeof(msg), &sig);
        for (int i = 0; i < w->n; i++) /* the next child gets them all again */
            w->q[(w->head + i) % p->depth].sent = 0;
        if (x == X_STOPPED) {
            int destroy = atomic_load(&p->stopping);
            atomic_store(&p->ctl[wid].since, 0); /* (a dead child's: the timeout would see it) */
            if (!destroy) { /* killed, and replaced by the next take: counted, not capped */
                stoke__loader_lock(l);
                l->st.worker_restarts++;
                stoke__loader_unlock(l);
            }
            stoke__batch_failed(b, STOKE_ECANCELED, first,
                                destroy ? "the loader is being destroyed"
                                        : "its run was abandoned");
            break;
        }
        stoke__log(STOKE_LOG_WARN, "loader: worker %d: %s", wid, msg);
        if (stoke__run_abandoned(&p->ctl[wid], b->gen)) { /* not run again: nobody wants it */
            atomic_store(&p->ctl[wid].since, 0);
            stoke__batch_failed(b, STOKE_ECANCELED, first, "its run was abandoned");
            break;
        }
        if (after_crash(l, b, wid, &w->req, msg, sig) != STOKE_OK)
            break;
    }
    if ((w->req.flags & F_KILLED) && b->status != STOKE_OK) {
        /* made again after a kill, and failed: the kill said too (an IterableDataset's new
         * process cannot resume the dead one's iterator: its error alone hid the death) */
        size_t k = strlen(b->err_msg);
        stoke__fmt(b->err_msg + k, sizeof(b->err_msg) - k, " (after %s)", w->killed);
    }
    if ((w->req.flags & F_READ_CRASHED) && !w->req.npoison && !w->no_read &&
        b->status == STOKE_OK) {
        /* its read() crashed, get() one sample at a time did not: read() is what crashes */
        w->no_read = 1;
        stoke__log(STOKE_LOG_WARN,
                   "loader: worker %d: dataset %s's read() crashed on batch %" PRIu64
                   " where get() one sample at a time did not: this worker makes its batches "
                   "with get() from now on",
                   wid, l->ds.name, b->seq);
    }
    if (l->o.device && b->status == STOKE_OK && b->count)
        stoke__loader_copy_batch(l, b);
    uint64_t now = stoke__now_ns(), t0 = r->t0 > w->last_t ? r->t0 : w->last_t;
    *busy_ns = now - t0; /* since it was dispatched, or since the reply before it */
    w->last_t = now;
    w->head = (w->head + 1) % p->depth;
    if (--w->n)
        head_req(l, w);
    return b;
}

void stoke__proc_stopping(stoke_loader *l)
{
    if (!l->proc)
        return;
    atomic_store(&l->proc->stopping, 1);
    /* the requests queued behind a child's current batch are answered at once, not made: an
     * early exit waits for one batch a child, not prefetch_factor */
    for (int i = 0; i < l->nworkers; i++)
        atomic_store(&l->proc->ctl[i].stop, 1);
}

/* After the worker threads were joined: closes every child's socket (they exit on EOF), then
 * the zygote's (it SIGKILLs the children left, reaps them and exits); reaps the zygote
 * (SIGKILL after about 5 s).  The shared buffers stay: batches the caller holds are in them
 * (stoke_loader_stop).  In a forked process (the loader is foreign) only this process's
 * descriptors go: the zygote and its children are the creator's. */
void stoke__proc_end(stoke_loader *l)
{
    stoke__proc *p = l->proc;
    if (!p || p->ended)
        return;
    p->ended = 1;
    int foreign = stoke__loader_forked(l);
    list_proc(p, 0);
    for (int i = 0; i < l->nworkers; i++) {
        close_fd(&p->w[i].fd);
        close_fd(&p->w[i].wake);
        atomic_store(&p->w[i].pid, -1);
    }
    if (!foreign && p->zfd >= 0) { /* not only EOF: a fork may still hold the socket */
        zreq q = {.op = Z_EXIT};
        (void)send(p->zfd, &q, sizeof(q), MSG_NOSIGNAL | MSG_DONTWAIT);
    }
    close_fd(&p->zfd);
    if (!foreign && p->zpid > 0)
        (void)stoke__proc_reap(p->zpid, 0, 5000000000u, NULL);
    p->zpid = -1;
}

/* A buffer's registration (pin_on_use) ends: STOKE_OK, or the backend's refusal (the buffer's
 * pages must then stay as they are: they are the registration's). */
static int unpin_slot(stoke__slot *s)
{
    int rc = s->reg_len ? stoke_pin_unregister(s->mem) : STOKE_OK;
    if (rc == STOKE_OK)
        s->reg_len = 0;
    return rc;
}

void stoke__proc_release_buffer(stoke_loader *l, stoke__slot *s)
{
    const stoke__proc *p = l->proc;
    if (p->shm && !p->registered && !p->from_arena && unpin_slot(s) == STOKE_OK)
        (void)madvise(s->mem, stoke__align_up(l->buf_bytes, 4096), MADV_REMOVE);
}

/* Registrations grow in steps of this at least, an eighth over the batch: the next batches of
 * a buffer are about as long (an IterableDataset's), each growth pins the whole part again. */
#define PIN_GRAIN ((size_t)2 << 20)
/* After a registration failed, the next ones are tried again only this many batches later: a
 * lasting refusal (a memory lock limit) is not asked of the backend for every batch, a passing
 * one does not leave the rest of the run unpinned. */
#define PIN_RETRY_BATCHES 64

int stoke__proc_pin(stoke_loader *l, stoke_batch *b, size_t nbytes)
{
    stoke__slot *s = b->host;
    if (s->reg_len < nbytes) {
        if (b->pinned) /* a copy may be reading its bytes: their registration stays */
            return stoke__fail(STOKE_ESTATE,
                               "stoke_batch_pin: batch %" PRIu64 " is pinned already, to %zu "
                               "bytes (a copy may be reading them); pin a batch once, with all "
                               "its bytes",
                               b->seq, s->reg_len);
        if (l->pin_failed && l->st.batches < l->pin_retry_at) /* (not for every batch) */
            return stoke__fail(l->pin_failed,
                               "stoke_batch_pin: batch %" PRIu64 " (%zu bytes) is not pinned: "
                               "a registration of the loader's buffers failed %" PRIu64
                               " batches ago (%s)",
                               b->seq, nbytes, l->st.batches + PIN_RETRY_BATCHES - l->pin_retry_at,
                               stoke_strerror(l->pin_failed));
        size_t old = s->reg_len, cap = stoke__align_up(l->buf_bytes, 4096);
        size_t want = stoke__align_up(nbytes + nbytes / 8, PIN_GRAIN);
        want = want < cap ? want : cap;
        /* one registration a buffer, never two side by side: a copy that spans two
         * registrations is not known to be a pinned copy on every backend */
        int rc = unpin_slot(s);
        if (rc == STOKE_OK)
            rc = stoke_pin_register(s->mem, want);
        if (rc == STOKE_OK && !stoke_is_pinned(s->mem)) { /* (pinning went off since create) */
            (void)stoke_pin_unregister(s->mem);
            rc = stoke__fail(STOKE_ENOTSUP, "pinning is not in effect (STOKE_PINNED, or no "
                                            "accelerator)");
        }
        if (rc != STOKE_OK) {
            char why[STOKE__MSG_MAX];
            stoke__fmt(why, sizeof(why), "%s", stoke_last_error());
            if (old && !s->reg_len && stoke_pin_register(s->mem, old) == STOKE_OK)
                s->reg_len = old; /* the batches that fit it stay pinned */
            l->pin_failed = rc;
            l->pin_retry_at = l->st.batches + PIN_RETRY_BATCHES;
            return stoke__fail(rc, "stoke_batch_pin: batch %" PRIu64 " (%zu bytes): %s", b->seq,
                               nbytes, why);
        }
        s->reg_len = want;
    }
    if (!b->pinned) {
        stoke__loader_lock(l);
        b->pinned = 1;
        l->st.pinned_batches++; /* (delivered() counted it pageable) */
        stoke__loader_unlock(l);
    }
    return STOKE_OK;
}

/* stoke__proc_end, then unmaps the shared buffers (in a forked process, only this process's
 * mapping: the buffers are the creator's). */
void stoke__proc_destroy(stoke_loader *l)
{
    stoke__proc *p = l->proc;
    if (!p)
        return;
    int foreign = stoke__loader_forked(l);
    stoke__proc_end(l);
    if (foreign) {
        if (p->shm && !p->from_arena && !p->registered)
            munmap(p->shm, p->shm_len); /* this process's mapping; the rest is the creator's */
        p->shm = NULL;
    }
    if (p->shm && p->from_arena) {
        stoke_arena_free(l->arena, p->shm);
    } else if (p->shm) {
        if (p->registered)
            stoke_pin_unregister(p->shm);
        for (int i = 0; l->slots && i < l->nbuf; i++)
            if (unpin_slot(&l->slots[i]) != STOKE_OK)
                stoke__log(STOKE_LOG_WARN, "loader: batch buffer %d stays registered: %s", i,
                           stoke_last_error());
        munmap(p->shm, p->shm_len);
    }
    for (int i = 0; l->bat && i < l->nbuf; i++) { /* (slots: allocated with bat) */
        l->bat[i].indices = NULL;
        l->bat[i].rmeta = NULL;
        l->slots[i].mem = NULL;
    }
    if (!foreign) /* a forked copy may hold it locked */
        pthread_mutex_destroy(&p->zmu);
    free(p->ring);
    free(p);
    l->proc = NULL;
}

int stoke_loader_worker_pid(const stoke_loader *l, int worker)
{
    if (!l || !l->proc || worker < 0 || worker >= l->nworkers)
        return -1;
    return atomic_load(&l->proc->w[worker].pid);
}
