/* Process workers, private: what the parent (procworker.c) and the code that runs in the
 * zygote and the worker children (proc_child.c) share - the shared records, the messages, and
 * a few socket helpers.  The protocol and the lifetimes are described at the top of
 * procworker.c and in docs/loader.md, "Process workers". */
#ifndef STOKE_LOADER_PROCWORKER_INTERNAL_H
#define STOKE_LOADER_PROCWORKER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "loader/loader_internal.h"

#define POISON_MAX    16          /* crashing samples one batch may skip or replace */
#define RESTARTS_MAX  100         /* worker process restarts per epoch */
#define POLL_MS       50          /* every wait for a child is a poll of at most this */
#define STOP_GRACE_NS 2000000000u /* destroy: a child busy longer than this is SIGKILLed */
#define ZYGOTE_MS     5000        /* the longest wait for the zygote's reply */
#define ZSIG          SIGHUP      /* the zygote's parent-death signal (it only wakes the zygote) */

typedef struct proc_w {
    _Atomic int fd;  /* the parent's end of the child's socket; -1: no child (atomic: the fork
                        handler reads it) */
    _Atomic int pid; /* the child; -1: none (read by stoke_loader_worker_pid) */
} proc_w;

struct stoke__proc {
    unsigned char *shm;
    size_t shm_len;
    int registered;   /* stoke_pin_register succeeded */
    int from_arena;   /* shm is an allocation of l->arena (not mapped here) */
    stoke__busy *ctl; /* nworkers, in shm: each child's busy marks (its worker's p.busy) */
    proc_w *w;        /* nworkers */
    pid_t zpid;
    _Atomic int zfd;
    uint32_t zseq;       /* (zmu) the number of the last request to the zygote */
    pthread_mutex_t zmu; /* serializes request/reply on zfd; then `rmu` never inside it */
    pthread_mutex_t rmu; /* restarts, cap_epoch, cap_n */
    uint64_t restarts, cap_epoch, cap_n;
    _Atomic int stopping;
    int nw;                   /* entries of w */
    int listed;               /* in the list of live ones (fork_mu) */
    struct stoke__proc *next; /* that list (fork_mu) */
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

enum { F_NO_READ = 1 };
typedef struct wreq {
    int32_t bi, si;
    uint32_t flags, npoison;
    uint64_t seq, seed, epoch;
    uint64_t poison[POISON_MAX];
    char pmsg[POISON_MAX][112];
} wreq;

enum { M_BAD = 1, M_DONE = 2 };
typedef struct wmsg {
    int32_t kind, status;
    uint64_t count, bytes, err_index;
    uint32_t truncated, pad;
    char err_msg[256];
    stoke__bad bad;
} wmsg;

/* proc_child.c: the zygote's loop (never returns), and the helpers both sides use */
void stoke__zygote_main(stoke_loader *l, int zfd, pid_t loader);
int stoke__proc_send_all(int fd, const void *p, size_t n);
ssize_t stoke__proc_recv_msg(int fd, void *p, size_t n);
/* Waits for child `pid` (SIGKILLed first when kill_it), SIGKILLing it once grace_ns passed;
 * its wait status into *st (may be NULL).  0, or an errno. */
int stoke__proc_reap(pid_t pid, int kill_it, uint64_t grace_ns, int *st);

#endif
