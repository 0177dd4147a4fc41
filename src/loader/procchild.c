/* Process workers: the code that runs in the other processes (procworker.c has the parent's
 * side and the design): a child's loop, which fills the batches it is sent, in the order they
 * come, through the fill pipeline (its busy marks in shared memory), and the zygote, which forks
 * children on request and reaps them. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/ipc_internal.h"
#include "loader/loader_internal.h"
#include "loader/proc_internal.h"

/* ---- the child: the dataset's get() wrapped to fail poisoned samples ---------------------- */

static struct {
    int (*get)(void *, uint64_t, void *const[], int64_t[], int, char *, size_t); /* the dataset's */
    wreq req; /* the batch being made, with its poisoned samples */
} cw;

static int w_get(void *user, uint64_t index, void *const dst[], int64_t len[], int worker,
                 char *msg, size_t msg_len)
{
    for (uint32_t k = 0; k < cw.req.npoison; k++)
        if (cw.req.poison[k] == index) {
            stoke__strlcpy(msg, cw.req.pmsg[k], msg_len);
            return STOKE_EDATA;
        }
    return cw.get(user, index, dst, len, worker, msg, msg_len);
}

/* One message of n bytes to fd (no descriptor): 0, or -1 when it did not go. */
static int send_all(int fd, const void *p, size_t n)
{
    return stoke__sendmsg_fd(fd, p, n, -1) == (ssize_t)n ? 0 : -1;
}

ssize_t stoke__proc_recv(int fd, void *p, size_t n)
{
    ssize_t r;
    do
        r = recv(fd, p, n, 0);
    while (r < 0 && errno == EINTR);
    return r;
}

/* The child's loop: one batch per request; exits (without atexit handlers) on EOF. */
static void child_main(stoke_loader *l, int wid, int fd, pid_t zygote)
{
    cw.get = l->ds.get; /* (MAP: required) */
    l->ds.get = w_get;
    /* the dataset's batch call: off for a request that reruns a crashed batch to find its
     * sample (F_NO_READ: one get() at a time), on again for the requests after it */
    int (*const ds_read)(void *, const uint64_t *, size_t, const stoke_slots *, int, char *, size_t,
                         uint64_t *) = l->ds.read;
    l->caller.wid = wid; /* this process's producer: its copy of the caller's, for worker wid */
    l->caller.busy = &l->proc->ctl[wid]; /* its marks, which the parent reads (plan.marks) */
    int init_rc = l->ds.worker_init ? l->ds.worker_init(l->ds.user, wid, l->nworkers) : STOKE_OK;
    init_rc = init_rc > 0 ? STOKE_EDATA : init_rc;
    wreq *const req = &cw.req;
    wmsg m;
    char why[256];
    /* the epoch this process's copy of the dataset was set to: create set it before the zygote
     * was forked; the parent's later calls reach only the parent's copy */
    int epoch_set = 1;
    uint64_t epoch = l->o.epoch;
    for (;;) {
        ssize_t n = stoke__proc_recv(fd, req, sizeof(*req));
        /* before a batch: the zygote is still this child's parent and the loader still holds
         * the other end of its socket (a child of a loader that died must not write into its
         * buffers, which may belong to another process by now: an arena's chunks) */
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (n != (ssize_t)sizeof(*req) || getppid() != zygote || poll(&pfd, 1, 0) < 0 ||
            (pfd.revents & (POLLHUP | POLLERR | POLLNVAL)))
            _exit(0);
        stoke_batch *b = &l->bat[req->bi];
        b->host = &l->slots[req->si];
        b->seq = req->seq;
        b->gen = req->gen; /* (this process's copy of b: the parent's gen is in the request) */
        l->caller.seed = req->seed;
        l->caller.epoch = req->epoch;
        l->ds.read = req->flags & F_NO_READ ? NULL : ds_read;
        int rc = init_rc;
        if (stoke__run_abandoned(&l->proc->ctl[wid], req->gen)) { /* queued behind, not wanted */
            rc = STOKE_ECANCELED;
            stoke__fmt(why, sizeof(why), "its run was abandoned (a reposition, an error, destroy)");
        } else if (rc != STOKE_OK) {
            /* (the code is added where the batch's error is reported: next.c batch_error) */
            stoke__fmt(why, sizeof(why), "worker_init of dataset %s failed in worker process %d",
                       l->ds.name, (int)getpid());
        } else if (l->ds.set_epoch && (!epoch_set || epoch != req->epoch)) {
            rc = l->ds.set_epoch(l->ds.user, req->epoch);
            rc = rc > 0 ? STOKE_EDATA : rc;
            epoch_set = rc == STOKE_OK;
            epoch = req->epoch;
            stoke__fmt(why, sizeof(why),
                       "set_epoch(%" PRIu64 ") of dataset %s failed in worker process %d",
                       req->epoch, l->ds.name, (int)getpid());
        }
        if (rc != STOKE_OK) { /* the batch fails, with no sample */
            stoke__loader_batch_start(l, b, &l->caller);
            stoke__batch_failed(b, rc, UINT64_MAX, why);
        } else {
            l->caller.ahead.seq_end = req->seq + 1; /* batches come one request at a time */
            stoke__loader_fill_batch(l, b, &l->caller);
        }
        memset(&m, 0, sizeof(m));
        m.kind = M_BAD;
        for (size_t i = 0; i < b->bad.n; i++) {
            m.bad = b->bad.v[i];
            if (send_all(fd, &m, sizeof(m)))
                _exit(0);
        }
        m.kind = M_DONE;
        m.status = b->status;
        m.count = b->count;
        m.bytes = b->bytes;
        m.err_index = b->err_index;
        m.truncated = b->truncated;
        memcpy(m.err_msg, b->err_msg, sizeof(m.err_msg));
        if (send_all(fd, &m, sizeof(m)))
            _exit(0);
    }
}

/* ---- the zygote ------------------------------------------------------------------------- */

/* The disposition and mask of ZSIG the zygote found (its children get them back). */
static struct sigaction z_old_action;
static sigset_t z_old_mask;

static void z_wake(int sig)
{
    (void)sig; /* only interrupts ppoll: the loop then looks at getppid() */
}

static void zygote_spawn(stoke_loader *l, int zfd, const zreq *q, pid_t *pids, int npids)
{
    zrep rep = {.pid = -1, .seq = q->seq};
    int sv[2] = {-1, -1};
    pid_t zygote = getpid(), pid = -1;
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
        rep.err = errno;
    } else {
        if (l->ds.fork_prepare)
            l->ds.fork_prepare(l->ds.user);
        pid = fork();
        if (pid == 0) {
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != zygote)
                _exit(0);
            sigaction(ZSIG, &z_old_action, NULL);
            sigprocmask(SIG_SETMASK, &z_old_mask, NULL);
            close(zfd);
            close(sv[0]);
            if (l->ds.fork_child)
                l->ds.fork_child(l->ds.user, q->worker);
            child_main(l, q->worker, sv[1], zygote);
            _exit(0);
        }
        rep.err = pid < 0 ? errno : 0; /* (before the hook, which may change errno) */
        if (l->ds.fork_parent)
            l->ds.fork_parent(l->ds.user);
        close(sv[1]);
    }
    for (int i = 0; pid > 0 && i < npids; i++)
        if (pids[i] <= 0) {
            pids[i] = pid;
            break;
        }
    rep.pid = pid > 0 ? (int32_t)pid : -1;
    (void)stoke__sendmsg_fd(zfd, &rep, sizeof(rep), pid > 0 ? sv[0] : -1);
    if (sv[0] >= 0)
        close(sv[0]);
}

/* Waits for child `pid` (SIGKILLed first when kill_it), SIGKILLing it once grace_ns passed;
 * its wait status into *st (may be NULL).  0, or an errno. */
int stoke__proc_reap(pid_t pid, int kill_it, uint64_t grace_ns, int *st)
{
    if (kill_it)
        kill(pid, SIGKILL);
    uint64_t deadline = stoke__now_ns() + grace_ns; /* time, not a number of polls */
    for (int killed = kill_it;;) {
        pid_t r = waitpid(pid, st, killed ? 0 : WNOHANG);
        if (r == pid)
            return 0;
        if (r < 0 && errno != EINTR)
            return errno;
        if (r == 0 && stoke__now_ns() >= deadline) {
            kill(pid, SIGKILL);
            killed = 1;
        } else if (r == 0) { /* 1 ms (a signal cuts it short: the loop looks again) */
            nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
        }
    }
}

/* The zygote's loop (never returns). */
void stoke__zygote_main(stoke_loader *l, int zfd, pid_t loader)
{
    /* A worker is replaced only after its predecessor was reaped: at most one live child per
     * worker, plus room for one being reaped. */
    signal(SIGCHLD, SIG_DFL); /* the caller may ignore it, which would reap for us */
    int npids = 2 * l->nworkers + 2;
    pid_t *pids = calloc((size_t)npids, sizeof(pid_t));
    if (!pids)
        _exit(1);
    /* ZSIG stays blocked but in ppoll, so its wake-up is never lost between the check of
     * getppid() and the wait. */
    sigset_t zs, wait_mask;
    sigemptyset(&zs);
    sigaddset(&zs, ZSIG);
    sigprocmask(SIG_BLOCK, &zs, &z_old_mask);
    wait_mask = z_old_mask;
    sigdelset(&wait_mask, ZSIG);
    struct sigaction sa = {.sa_handler = z_wake};
    sigemptyset(&sa.sa_mask);
    sigaction(ZSIG, &sa, &z_old_action);
    prctl(PR_SET_PDEATHSIG, ZSIG);
    zreq q;
    while (getppid() == loader) { /* also the race: the loader died before prctl */
        struct pollfd pfd = {.fd = zfd, .events = POLLIN};
        int pr = ppoll(&pfd, 1, NULL, &wait_mask);
        if (pr < 0 && errno == EINTR)
            continue;
        ssize_t n = pr < 0 ? -1 : stoke__proc_recv(zfd, &q, sizeof(q));
        if (n != (ssize_t)sizeof(q))
            break;
        if (q.op == Z_SPAWN) {
            zygote_spawn(l, zfd, &q, pids, npids);
        } else if (q.op == Z_REAP || q.op == Z_FORGET) {
            zrep rep = {.pid = q.pid, .seq = q.seq};
            /* a child not gone 2 s after its socket closed is SIGKILLed */
            rep.err = stoke__proc_reap(q.pid, q.kill || q.op == Z_FORGET, 2000000000u, &rep.status);
            for (int i = 0; i < npids; i++)
                if (pids[i] == q.pid)
                    pids[i] = -1;
            if (q.op == Z_REAP)
                (void)stoke__sendmsg_fd(zfd, &rep, sizeof(rep), -1);
        } else if (q.op == Z_EXIT) {
            break;
        }
    }
    /* The end: at EOF (destroy closed its socket, or the loader's process is dying: its
     * descriptors close before its parent-death signal is sent, and getppid() cannot tell yet)
     * or when its parent is no longer the loader's process.  Its children are SIGKILLed at once:
     * at destroy they are idle (a busy one was killed already), and a child of a dead loader
     * must not go on writing into buffers that may belong to another process by now (an arena's
     * chunks). */
    for (int i = 0; i < npids; i++)
        if (pids[i] > 0)
            (void)stoke__proc_reap(pids[i], 1, 0, NULL);
    _exit(0);
}
