/* Process workers' private types: what procworker.c (the parent's side) and procchild.c (the
 * children and the zygote) share.  See procworker.c for the design and the messages. */
#ifndef STOKE_LOADER_PROC_INTERNAL_H
#define STOKE_LOADER_PROC_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/types.h>

#include "loader/loader_internal.h"

#define POISON_MAX   16  /* crashing samples one batch may skip or replace */
#define RESTARTS_MAX 100 /* worker process restarts per epoch */
#define POLL_MS      50  /* every wait for a child is a poll of at most this */
#define STOP_GRACE_NS                                                                              \
    2000000000u          /* destroy: a child busy longer than this is SIGKILLed (at                \
                            once after an interrupted stoke_loader_next: loader.h) */
#define ZYGOTE_MS 5000   /* the longest wait for the zygote's reply */
#define ZSIG      SIGHUP /* the zygote's parent-death signal (it only wakes the zygote) */

/* A request in flight to a worker's child (the parent's side). */
typedef struct proc_req {
    stoke_batch *b;
    uint64_t seed, epoch, t0; /* t0: when it was dispatched */
    int sent;                 /* sent to the current child (the sent ones come first) */
    uint32_t flags;           /* its request's flags, as sent (or to be sent) */
} proc_req;

typedef struct wreq { /* parent -> child: a batch */
    int32_t bi, si;
    uint32_t flags, npoison;
    uint64_t seq, seed, epoch;
    uint64_t gen; /* the batch's run (b->gen): made only while it is the loader's (ctl gen) */
    uint64_t poison[POISON_MAX];
    char pmsg[POISON_MAX][112];
} wreq;

typedef struct proc_w {
    _Atomic int fd;   /* the parent's end of the child's socket; -1: no child (atomic: the fork
                         handler reads it) */
    _Atomic int pid;  /* the child; -1: none (read by stoke_loader_worker_pid) */
    _Atomic int wake; /* an eventfd: work to dispatch for a worker waiting on its child */
    /* the worker thread's alone: its requests in flight, oldest first (a ring of p->depth) */
    proc_req *q;
    int head, n;
    wreq req;                 /* the oldest's request, with its crash state */
    int send_closed;          /* a send failed: the child closed its end (died); the replies it
                                 sent before are still read, then its end of file */
    int no_read;              /* a read() crash that was no sample's (get() one at a time made
                                 the batch): this worker's batches are made with get() */
    uint64_t last_t, stop_t0; /* when the last reply was taken; when receive() first saw
                                 its batch unwanted (destroy, an abandoned run) */
    char killed[160];         /* req's F_KILLED: how its child was killed (said if the batch
                                 fails after all) */
} proc_w;

struct stoke__proc {
    unsigned char *shm;
    size_t shm_len;
    int registered;   /* stoke_pin_register succeeded */
    int from_arena;   /* shm is an allocation of l->arena (not mapped here) */
    int ended;        /* stoke__proc_end ran: no child, zygote or socket is left */
    stoke__busy *ctl; /* nworkers, in shm: each child's busy marks (its worker's p.busy) */
    pid_t zpid;
    _Atomic int zfd;
    uint32_t zseq;       /* (zmu) the number of the last request to the zygote */
    pthread_mutex_t zmu; /* serializes request/reply on zfd; then the loader's `mu` never in it */
    uint64_t cap_epoch, cap_n; /* (the loader's mu) restarts in epoch cap_epoch (0 in 0 at first) */
    _Atomic int stopping;
    int depth;                /* requests in flight per worker, at most: prefetch_factor */
    proc_req *ring;           /* nworkers x depth: the workers' q */
    struct stoke__proc *next; /* the list of live ones (fork_mu), from create to destroy */
    int nw;                   /* entries of w */
    proc_w w[];               /* nworkers */
};

/* SPAWN and REAP are answered; FORGET (kill and reap a child whose SPAWN reply came too late)
 * and EXIT (destroy: end now, whoever else holds the socket) are not. */
enum { Z_SPAWN = 1, Z_REAP = 2, Z_FORGET = 3, Z_EXIT = 4 };
typedef struct zreq {
    int32_t op, worker;
    int32_t pid, kill; /* REAP: SIGKILL it first */
    uint32_t seq, pad;
} zreq;
typedef struct zrep {
    int32_t pid, err, status;
    uint32_t seq; /* the request's */
} zrep;

/* F_NO_READ: the child makes the batch with get(), one sample at a time; F_READ_CRASHED (the
 * parent's, ignored by the child): the batch's read() crashed, the rerun looks for the sample;
 * F_KILLED (the parent's too): a child was killed from outside (SIGKILL, SIGTERM) in one of the
 * batch's dataset calls, and the batch runs again as it was, once, before a sample is blamed */
enum { F_NO_READ = 1, F_READ_CRASHED = 2, F_KILLED = 4 };

enum { M_BAD = 1, M_DONE = 2 };
typedef struct wmsg {
    int32_t kind, status;
    uint64_t count, bytes, err_index;
    uint32_t truncated, pad;
    char err_msg[STOKE__MSG_MAX];
    stoke__bad bad;
} wmsg;

/* procchild.c: one message from fd (EINTR retried): its size, 0 at EOF, -1; waits for child
 * `pid` (SIGKILLed first when kill_it, and once grace_ns passed), its wait status into *st (may
 * be NULL): 0, or an errno; the zygote's loop, in the process forked at create (never
 * returns). */
ssize_t stoke__proc_recv(int fd, void *p, size_t n);
int stoke__proc_reap(pid_t pid, int kill_it, uint64_t grace_ns, int *st);
void stoke__zygote_main(stoke_loader *l, int zfd, pid_t loader);

#endif
