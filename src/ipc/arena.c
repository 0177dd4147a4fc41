/* The node-wide pinned arena (stoke/arena.h): naming, the file-less rendezvous, open / close,
 * the thread that serves the arena's descriptor, and what a fork does to an open arena.
 *
 * Opening, in order, all under the arena's opening lock (the abstract name "...-init", bound
 * for the duration; bind is the atomic arbiter, and the kernel releases it if the process
 * dies):
 *   1. connect to the slot names 0..AR_MAXP-1 until an attached process answers with the
 *      memfd (SCM_RIGHTS) and a hello; map it and check it;
 *   2. nobody answered: create the memfd, map it, lay out the header (arena_alloc.c);
 *   3. bind the first free slot name and listen on it, claim the slot in the header;
 *   4. start the serving thread; release the opening lock; pin the mapping.
 * Because a process binds its slot before it releases the opening lock, "no slot answers" under
 * the lock means no process has the arena, so two racing openers end with one arena.
 *
 * Fork: a child does not get the serving thread.  An atfork handler closes the child's copies
 * of every arena's listening socket, wake descriptor and memfd, so a slot's name goes away with
 * the process that holds it, not with its last child.  The child keeps the mapping (process
 * workers write batches into it) but cannot allocate from the parent's handle.
 *
 * Locking: `arenas.lock` guards the list of this process's open arenas (leaf lock; held only to
 * link / unlink and across fork). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "common/env.h"
#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "ipc/ipc_internal.h"
#include "stoke/pinned.h"

#define AR_OPEN_S       10  /* bound on waiting for the opening lock, seconds */
#define AR_HELLO_WAIT_S 2   /* bound on waiting for a serving process's answer */
#define AR_WHO_MS       100 /* how often a waiter for the opening lock asks who holds it */

static struct {
    pthread_mutex_t lock;
    stoke_arena *list;
    pthread_once_t once;
} arenas = {.lock = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

/* ---- fork --------------------------------------------------------------------------------- */

static void fork_prepare(void)
{
    pthread_mutex_lock(&arenas.lock);
}

static void fork_parent(void)
{
    pthread_mutex_unlock(&arenas.lock);
}

static void fork_child(void)
{
    for (stoke_arena *a = arenas.list; a; a = a->next) {
        if (a->listen_fd >= 0)
            close(a->listen_fd);
        if (a->wake_fd >= 0)
            close(a->wake_fd);
        if (a->memfd >= 0)
            close(a->memfd);
        a->listen_fd = a->wake_fd = a->memfd = -1;
        a->thread_started = 0; /* the thread is the parent's */
    }
    pthread_mutex_unlock(&arenas.lock);
}

static void install_atfork(void)
{
    pthread_atfork(fork_prepare, fork_parent, fork_child);
}

static void list_add(stoke_arena *a)
{
    pthread_mutex_lock(&arenas.lock);
    a->next = arenas.list;
    arenas.list = a;
    pthread_mutex_unlock(&arenas.lock);
}

static void list_remove(stoke_arena *a)
{
    pthread_mutex_lock(&arenas.lock);
    stoke_arena **pp = &arenas.list;
    while (*pp && *pp != a)
        pp = &(*pp)->next;
    if (*pp)
        *pp = a->next;
    pthread_mutex_unlock(&arenas.lock);
}

stoke_arena *stoke__arena_find(const void *ptr)
{
    const unsigned char *p = ptr;
    stoke_arena *found = NULL;
    pthread_mutex_lock(&arenas.lock);
    for (stoke_arena *a = arenas.list; a && !found; a = a->next)
        if (a->pid == getpid() && p >= a->data && (uint64_t)(p - a->data) < a->nchunks * a->chunk)
            found = a;
    pthread_mutex_unlock(&arenas.lock);
    return found;
}

/* ---- names -------------------------------------------------------------------------------- */

/* Copies `src` with characters outside [A-Za-z0-9._-] turned into '_', at most
 * STOKE_ARENA_NAME_MAX of them. */
static void sanitize(char *dst, size_t len, const char *prefix, const char *src)
{
    char tmp[256];
    snprintf(tmp, sizeof(tmp), "%s%s", prefix, src);
    size_t n = 0;
    for (const char *s = tmp; *s && n + 1 < len && n < STOKE_ARENA_NAME_MAX; s++, n++) {
        char c = *s;
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '.' || c == '_' || c == '-';
        dst[n] = ok ? c : '_';
    }
    dst[n] = '\0';
}

int stoke_arena_default_name(char *buf, size_t len)
{
    if (!buf || !len)
        return stoke__fail(STOKE_EINVAL, "stoke_arena_default_name: %s",
                           buf ? "len is 0" : "buf is NULL");
    buf[0] = '\0';
    const char *v;
    char part[256];
    if ((v = stoke__env_str(STOKE_ENV_ARENA))) {
        stoke__strlcpy(part, v, sizeof(part));
        char *colon = strchr(part, ':');
        if (colon)
            *colon = '\0';
        if (part[0] && strcmp(part, "auto") != 0) { /* "auto": the job's, below */
            sanitize(buf, len, "", part);
            return STOKE_OK;
        }
    }
    if ((v = stoke__env_str(STOKE_ENV_TORCHELASTIC_RUN_ID))) {
        sanitize(buf, len, "torchelastic-", v);
    } else if ((v = stoke__env_str(STOKE_ENV_SLURM_JOB_ID))) {
        const char *step = stoke__env_str(STOKE_ENV_SLURM_STEP_ID);
        snprintf(part, sizeof(part), "%s.%s", v, step ? step : "0");
        sanitize(buf, len, "slurm-", part);
    } else if ((v = stoke__env_str(STOKE_ENV_OMPI_JOBID))) {
        sanitize(buf, len, "ompi-", v);
    } else {
        return stoke__fail(STOKE_ENOENT,
                           "arena: no name given and none to derive: set STOKE_ARENA, or run "
                           "under torchrun (TORCHELASTIC_RUN_ID), Slurm (SLURM_JOB_ID) or Open "
                           "MPI (OMPI_MCA_ess_base_jobid)");
    }
    return STOKE_OK;
}

static int check_name(const char *name)
{
    size_t n = strlen(name);
    if (n == 0 || n > STOKE_ARENA_NAME_MAX)
        return stoke__fail(STOKE_EINVAL, "stoke_arena_open: the name '%s' is %s", name,
                           n ? "longer than 64 characters" : "empty");
    for (const char *s = name; *s; s++) {
        char c = *s;
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '.' || c == '_' || c == '-'))
            return stoke__fail(STOKE_EINVAL,
                               "stoke_arena_open: the name '%s' has '%c'; only A-Z a-z 0-9 . _ - "
                               "are allowed",
                               name, c);
    }
    return STOKE_OK;
}

unsigned stoke__arena_addr(const char *name, int slot, void *sockaddr_un)
{
    struct sockaddr_un *sa = sockaddr_un;
    memset(sa, 0, sizeof(*sa));
    sa->sun_family = AF_UNIX;
    char tail[16];
    if (slot < 0)
        snprintf(tail, sizeof(tail), "init");
    else
        snprintf(tail, sizeof(tail), "%d", slot);
    /* sun_path[0] stays '\0': an abstract name, not a file */
    int n = snprintf(sa->sun_path + 1, sizeof(sa->sun_path) - 1, "stoke-arena-%u-%s-%s",
                     (unsigned)getuid(), name, tail);
    return (unsigned)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

int stoke__arena_bind(const char *name, int slot)
{
    struct sockaddr_un sa;
    socklen_t len = stoke__arena_addr(name, slot, &sa);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -1;
    if (bind(s, (struct sockaddr *)&sa, len) != 0) {
        int e = errno;
        close(s);
        errno = e;
        return -1;
    }
    return s;
}

/* ---- who holds a name ------------------------------------------------------------------- */

/* Who holds a bound name (uid, and pid where known: 0 otherwise). */
typedef struct ar_who {
    int known;
    uid_t uid;
    pid_t pid;
} ar_who;

/* The uid owning the stream socket bound to the abstract address `sa` (len bytes), from the
 * kernel's socket diagnostics (NETLINK_SOCK_DIAG, UDIAG_SHOW_UID: Linux 5.3); 0 when unknown. */
static int diag_uid(const struct sockaddr_un *sa, socklen_t len, uid_t *uid)
{
    int s = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (s < 0)
        return 0;
    struct {
        struct nlmsghdr nh;
        struct unix_diag_req r;
    } req;
    memset(&req, 0, sizeof(req));
    req.nh.nlmsg_len = sizeof(req);
    req.nh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    req.r.sdiag_family = AF_UNIX;
    /* Only the holder of a name: listening or bound and unconnected.  A connection queued on a
     * listener and never accepted carries the listener's name too, with uid 0 (it was made by
     * the kernel): established sockets, and any with a peer, are skipped. */
    req.r.udiag_states = (1u << TCP_LISTEN) | (1u << TCP_CLOSE);
    req.r.udiag_show = UDIAG_SHOW_NAME | UDIAG_SHOW_UID | UDIAG_SHOW_PEER;
    struct sockaddr_nl nl = {.nl_family = AF_NETLINK};
    struct timeval tv = {.tv_sec = 1};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    size_t want = (size_t)len - offsetof(struct sockaddr_un, sun_path);
    int found = 0, done = 0;
    static _Alignas(struct nlmsghdr) char buf[32768]; /* error paths only; guarded below */
    static pthread_mutex_t buf_lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&buf_lock);
    if (sendto(s, &req, sizeof(req), 0, (struct sockaddr *)&nl, sizeof(nl)) < 0)
        done = 1;
    while (!done) {
        ssize_t n = recv(s, buf, sizeof(buf), 0);
        if (n <= 0)
            break;
        int left = (int)n;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, left);
             h = NLMSG_NEXT(h, left)) {
            if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
                done = 1;
                break;
            }
            if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct unix_diag_msg)))
                continue;
            const struct unix_diag_msg *m = NLMSG_DATA(h);
            if (m->udiag_type != SOCK_STREAM || found)
                continue; /* keep reading to the end of the dump */
            int alen = (int)(h->nlmsg_len - NLMSG_LENGTH(sizeof(*m)));
            if (m->udiag_state != TCP_LISTEN && m->udiag_state != TCP_CLOSE)
                continue;
            int named = 0, have_uid = 0, peer = 0;
            uint32_t u = 0;
            for (struct rtattr *at = (struct rtattr *)(void *)(m + 1); RTA_OK(at, alen);
                 at = RTA_NEXT(at, alen)) {
                if (at->rta_type == UNIX_DIAG_NAME && RTA_PAYLOAD(at) == want &&
                    memcmp(RTA_DATA(at), sa->sun_path, want) == 0)
                    named = 1;
                else if (at->rta_type == UNIX_DIAG_UID && RTA_PAYLOAD(at) >= sizeof(u)) {
                    memcpy(&u, RTA_DATA(at), sizeof(u));
                    have_uid = 1;
                } else if (at->rta_type == UNIX_DIAG_PEER && RTA_PAYLOAD(at) >= sizeof(u)) {
                    uint32_t ino;
                    memcpy(&ino, RTA_DATA(at), sizeof(ino));
                    peer = ino != 0;
                }
            }
            if (named && have_uid && !peer) {
                *uid = (uid_t)u;
                found = 1;
            }
        }
    }
    pthread_mutex_unlock(&buf_lock);
    close(s);
    return found;
}

/* Who holds `name`'s slot (slot -1: the opening lock).  A listening holder (every stoke
 * process: slot holders serve, and the opening lock's holder listens too) is asked directly:
 * connecting gives its credentials (SO_PEERCRED) without waiting for it to accept.  Else the
 * kernel's socket table says which uid bound it. */
static ar_who who_holds(const char *name, int slot)
{
    ar_who w = {0};
    struct sockaddr_un sa;
    socklen_t len = stoke__arena_addr(name, slot, &sa);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s >= 0 && connect(s, (struct sockaddr *)&sa, len) == 0) {
        struct ucred cred;
        socklen_t cl = sizeof(cred);
        if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0)
            w = (ar_who){.known = 1, .uid = cred.uid, .pid = cred.pid};
    }
    if (s >= 0)
        close(s);
    if (!w.known && diag_uid(&sa, len, &w.uid))
        w.known = 1;
    return w;
}

int stoke__arena_name_uid(const char *name, int slot, unsigned *uid)
{
    struct sockaddr_un sa;
    socklen_t len = stoke__arena_addr(name, slot, &sa);
    uid_t u = 0;
    int found = diag_uid(&sa, len, &u);
    *uid = (unsigned)u;
    return found;
}

static int foreign(const ar_who *w)
{
    return w->known && w->uid != getuid();
}

int stoke__arena_slot_foreign(const char *name, int slot, unsigned *uid)
{
    ar_who w = who_holds(name, slot);
    *uid = (unsigned)w.uid;
    return foreign(&w);
}

/* "uid 1001 (pid 4242)" or "uid 1001 (pid unknown)" */
static const char *who_str(const ar_who *w, char *buf, size_t len)
{
    if (w->pid > 0)
        snprintf(buf, len, "uid %u (pid %d)", (unsigned)w->uid, (int)w->pid);
    else
        snprintf(buf, len, "uid %u (pid unknown)", (unsigned)w->uid);
    return buf;
}

static int squatted(const char *name, const char *which, const ar_who *w)
{
    char who[64];
    return stoke__fail(STOKE_EBUSY,
                       "stoke_arena_open: arena '%s': the socket name of its %s is held by %s, "
                       "another user than this process's uid %u: another user is squatting this "
                       "arena's names (they are predictable); refused without using anything "
                       "it offers (choose another arena name, e.g. STOKE_ARENA=NAME)",
                       name, which, who_str(w, who, sizeof(who)), (unsigned)getuid());
}

/* ---- the opening lock and the rendezvous -------------------------------------------------- */

static int take_open_lock(const char *name, int *out)
{
    uint64_t start = stoke__now_ns(), next_who = start;
    uint64_t deadline = start + (uint64_t)AR_OPEN_S * 1000000000u;
    ar_who w = {0};
    for (;;) {
        int s = stoke__arena_bind(name, -1);
        if (s >= 0) {
            /* Listening lets waiters ask who holds the lock (who_holds: their connect gives
             * them our credentials); drain_lock empties the queue of their connections. */
            int fl = fcntl(s, F_GETFL);
            if (fl < 0 || fcntl(s, F_SETFL, fl | O_NONBLOCK) != 0 || listen(s, AR_MAXP) != 0) {
                int e = errno;
                close(s);
                return stoke__fail(STOKE_EIO, "stoke_arena_open: arena '%s': listen: %s", name,
                                   strerror(e));
            }
            *out = s;
            return STOKE_OK;
        }
        if (errno != EADDRINUSE)
            return stoke__fail(STOKE_EIO, "stoke_arena_open: arena '%s': cannot bind a socket: %s",
                               name, strerror(errno));
        uint64_t now = stoke__now_ns();
        if (now >= next_who) {
            w = who_holds(name, -1);
            if (foreign(&w))
                return squatted(name, "opening lock (\"-init\")", &w);
            next_who = now + (uint64_t)AR_WHO_MS * 1000000u;
        }
        if (now > deadline) {
            char who[64] = "a process of this uid";
            if (w.known)
                who_str(&w, who, sizeof(who));
            return stoke__fail(STOKE_ETIMEDOUT,
                               "stoke_arena_open: arena '%s': another process has been opening "
                               "it for more than %d s (its opening lock is held by %s)",
                               name, AR_OPEN_S, who);
        }
        struct timespec ts = {.tv_nsec = 2000000};
        nanosleep(&ts, NULL);
    }
}

/* The holder of the opening lock closes the connections waiters made to ask who holds it (they
 * read our credentials at connect), so that its queue never fills (a full one turns their
 * question into a lookup in the kernel's socket table). */
static void drain_lock(int lock)
{
    int c;
    while ((c = accept4(lock, NULL, NULL, SOCK_CLOEXEC)) >= 0 || errno == EINTR)
        if (c >= 0)
            close(c);
}

/* Asks slot k for the arena: 1 with *fd and *hello filled; 0 when nobody holds the slot;
 * -1 when a process of another uid holds the name (*w says who; nothing was read from it);
 * 2 when a process of this uid holds it but gave no answer (its queue full, or nothing
 * readable within AR_HELLO_WAIT_S: stopped, or flooded; *w says which process when known).
 * Never blocks on the holder: the connect does not wait (a listener whose queue is full, as a
 * squatter can make it, gives EAGAIN: the kernel's socket table then says whose it is) and the
 * answer is awaited for at most AR_HELLO_WAIT_S. */
static int ask_slot(const char *name, int k, int *fd, ar_hello *hello, ar_who *w)
{
    struct sockaddr_un sa;
    socklen_t len = stoke__arena_addr(name, k, &sa);
    int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (s < 0)
        return -2; /* (errno: this process could not ask, which is not "nobody") */
    int got = 0, lost = 0, gone = 0;
    if (connect(s, (struct sockaddr *)&sa, len) != 0) {
        int e = errno;
        close(s);
        uid_t u = 0;
        if (e == EAGAIN && diag_uid(&sa, len, &u)) {
            if (u != getuid()) {
                *w = (ar_who){.known = 1, .uid = u};
                return -1;
            }
            *w = (ar_who){.known = 1, .uid = u};
            return 2; /* (its queue is full) */
        }
        return 0;
    }
    /* Abstract names have no owner: whoever answers must be of our uid, or nothing it sends is
     * looked at. */
    struct ucred cred = {.pid = 0, .uid = (uid_t)-1, .gid = (gid_t)-1};
    socklen_t cl = sizeof(cred);
    if (getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != getuid()) {
        *w = (ar_who){.known = 1, .uid = cred.uid, .pid = cred.pid};
        close(s);
        return -1;
    }
    int fl = fcntl(s, F_GETFL);
    struct timeval tv = {.tv_sec = AR_HELLO_WAIT_S};
    if (fl >= 0 && fcntl(s, F_SETFL, fl & ~O_NONBLOCK) == 0 &&
        setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) == 0) {
        int f = -1;
        ssize_t n = stoke__recvmsg_fd(s, hello, sizeof(*hello), &f);
        lost = n == (ssize_t)sizeof(*hello) && f < 0 && errno == EMFILE;
        /* closed on us (its process closing the arena as we came): nobody, as before */
        gone = n == 0 || (n < 0 && (errno == ECONNRESET || errno == EPIPE));
        if (n == (ssize_t)sizeof(*hello) && f >= 0 && hello->magic == AR_MAGIC) {
            *fd = f;
            got = 1;
        } else if (f >= 0) {
            close(f);
        }
    }
    close(s);
    if (lost) { /* it answered; its descriptor could not be taken */
        errno = EMFILE;
        return -2;
    }
    if (gone)
        return 0;
    if (!got) /* ours, and silent: not "nobody" (a second arena of the name would follow) */
        *w = (ar_who){.known = 1, .uid = cred.uid, .pid = cred.pid};
    return got ? 1 : 2;
}

/* 1: a process of this uid answered (*fd, *hello); 0: nobody did; -1: nobody of this uid did,
 * but a process of another uid holds a slot name (*w and *wslot: the first such); 2: nobody
 * answered, but a process of this uid holds a slot and was silent (*w, *wslot: the first);
 * -2: this process could not ask or take the answer (errno; *wslot: where). */
static int find_served(const char *name, int lock, int *fd, ar_hello *hello, ar_who *w, int *wslot)
{
    int seen_foreign = 0, silent = 0;
    ar_who sw = {0};
    int sslot = -1;
    for (int k = 0; k < AR_MAXP; k++) {
        ar_who kw = {0};
        drain_lock(lock);
        int r = ask_slot(name, k, fd, hello, &kw);
        if (r == -2) {
            *wslot = k;
            return -2;
        }
        if (r == 2 && !silent) {
            silent = 1;
            sw = kw;
            sslot = k;
        }
        if (r == 1) {
            if (seen_foreign) {
                char who[64];
                stoke__log(STOKE_LOG_WARN,
                           "arena '%s': a slot name is held by %s, another user (ignored; "
                           "process %d of this uid answered)",
                           name, who_str(w, who, sizeof(who)), (int)hello->pid);
            }
            return 1;
        }
        if (r < 0 && !seen_foreign) {
            *w = kw;
            *wslot = k;
            seen_foreign = 1;
        }
    }
    if (silent) {
        *w = sw;
        *wslot = sslot;
        return 2;
    }
    return seen_foreign ? -1 : 0;
}

/* ---- the serving thread ------------------------------------------------------------------- */

static void serve_one(stoke_arena *a, int c)
{
    struct ucred cred;
    socklen_t cl = sizeof(cred);
    if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.uid != getuid()) {
        /* said once a minute at most: another user can connect as often as it likes */
        uint64_t now = stoke__now_ns();
        a->refused++;
        if (!a->refused_said || now - a->refused_said >= 60000000000ull) {
            char all[64] = "";
            if (a->refused > 1)
                snprintf(all, sizeof(all), "; %llu refused in all, not each said",
                         (unsigned long long)a->refused);
            stoke__log(STOKE_LOG_WARN, "arena '%s': refused a connection from uid %d (pid %d)%s",
                       a->name, (int)cred.uid, (int)cred.pid, all);
            a->refused_said = now;
        }
        return;
    }
    ar_hello hello = {.magic = AR_MAGIC,
                      .version = AR_VERSION,
                      .pid = (int32_t)getpid(),
                      .requested = a->h->requested,
                      .map_len = a->map_len};
    struct timeval tv = {.tv_sec = AR_HELLO_WAIT_S};
    setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (stoke__sendmsg_fd(c, &hello, sizeof(hello), a->memfd) != (ssize_t)sizeof(hello))
        stoke__log(STOKE_LOG_DEBUG, "arena '%s': could not answer pid %d: %s", a->name,
                   (int)cred.pid, strerror(errno));
}

static void *serve(void *arg)
{
    stoke_arena *a = arg;
    stoke__thread_name("stoke-arena");
    struct pollfd pf[2] = {{.fd = a->listen_fd, .events = POLLIN},
                           {.fd = a->wake_fd, .events = POLLIN}};
    for (;;) {
        int n = poll(pf, 2, -1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 || (pf[1].revents & POLLIN))
            break;
        if (!(pf[0].revents & POLLIN))
            continue;
        int c = accept4(a->listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (c < 0)
            continue;
        serve_one(a, c);
        close(c);
    }
    return NULL;
}

static int start_serving(stoke_arena *a)
{
    a->wake_fd = eventfd(0, EFD_CLOEXEC);
    if (a->wake_fd < 0)
        return stoke__fail(STOKE_EIO, "stoke_arena_open: arena '%s': eventfd: %s", a->name,
                           strerror(errno));
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread takes no signals */
    int e = pthread_create(&a->thread, NULL, serve, a);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (e)
        return stoke__fail(STOKE_EIO, "stoke_arena_open: arena '%s': cannot start its thread: %s",
                           a->name, strerror(e));
    a->thread_started = 1;
    return STOKE_OK;
}

static void stop_serving(stoke_arena *a)
{
    if (a->thread_started) {
        uint64_t one = 1;
        ssize_t w;
        do
            w = write(a->wake_fd, &one, sizeof(one));
        while (w < 0 && errno == EINTR);
        pthread_join(a->thread, NULL);
        a->thread_started = 0;
    }
}

/* ---- create / attach ---------------------------------------------------------------------- */

static int map_fd(stoke_arena *a, size_t len)
{
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, a->memfd, 0);
    if (m == MAP_FAILED)
        return stoke__fail(STOKE_ENOMEM, "stoke_arena_open: arena '%s': cannot map %zu bytes: %s",
                           a->name, len, strerror(errno));
    a->base = m;
    a->map_len = len;
    a->h = m;
    return STOKE_OK;
}

static int create_arena(stoke_arena *a, size_t size)
{
    uint64_t chunk, nchunks, data_off, map_len;
    int rc = stoke__arena_layout(size, &chunk, &nchunks, &data_off, &map_len);
    if (rc != STOKE_OK)
        return rc;
    a->memfd = memfd_create("stoke-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (a->memfd < 0)
        return stoke__fail(STOKE_ENOMEM, "stoke_arena_open: arena '%s': memfd_create: %s", a->name,
                           strerror(errno));
    if (ftruncate(a->memfd, (off_t)map_len) != 0)
        return stoke__fail(STOKE_ENOMEM,
                           "stoke_arena_open: arena '%s': cannot size it to %llu bytes: %s",
                           a->name, (unsigned long long)map_len, strerror(errno));
    /* Sealed before anyone else gets it: no holder of the descriptor can shrink it under the
     * other processes' mappings (SIGBUS there). */
    if (fcntl(a->memfd, F_ADD_SEALS, STOKE__MEMFD_SEALS) != 0)
        return stoke__fail(STOKE_EIO, "stoke_arena_open: arena '%s': cannot seal its memfd: %s",
                           a->name, strerror(errno));
    if ((rc = map_fd(a, (size_t)map_len)) != STOKE_OK)
        return rc;
    a->created = 1;
    return stoke__arena_init_header(a, size, chunk, nchunks, data_off);
}

static int attach_arena(stoke_arena *a, int fd, const ar_hello *hello, size_t size)
{
    a->memfd = fd;
    if (hello->version != AR_VERSION)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_arena_open: arena '%s' (process %d) has layout version %u, "
                           "this library reads %u",
                           a->name, (int)hello->pid, (unsigned)hello->version, AR_VERSION);
    if (size && hello->requested != size)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_arena_open: arena '%s' exists with %llu bytes (process %d has "
                           "it open); this process asked for %zu bytes",
                           a->name, (unsigned long long)hello->requested, (int)hello->pid, size);
    char whose[96];
    snprintf(whose, sizeof(whose), "arena '%s' (from process %d)", a->name, (int)hello->pid);
    int rc = stoke__memfd_check_sealed(fd, "stoke_arena_open", whose);
    if (rc != STOKE_OK)
        return rc;
    struct stat st;
    long page = sysconf(_SC_PAGESIZE);
    if (fstat(fd, &st) != 0 || st.st_size < (off_t)sizeof(ar_hdr) || page <= 0 ||
        st.st_size < page || (uint64_t)st.st_size != hello->map_len ||
        (uint64_t)st.st_size > SIZE_MAX)
        return stoke__fail(STOKE_EINVAL,
                           "stoke_arena_open: arena '%s': process %d sent %lld bytes of shared "
                           "memory but said %llu; refused",
                           a->name, (int)hello->pid, (long long)st.st_size,
                           (unsigned long long)hello->map_len);
    if ((rc = map_fd(a, (size_t)st.st_size)) != STOKE_OK)
        return rc;
    return stoke__arena_check_header(a, (int)hello->pid);
}

/* Binds the first free slot name, listens on it and claims the slot in the header (a slot
 * whose previous holder is gone but a writer of its chunks lives is passed over). */
static int take_slot(stoke_arena *a)
{
    int passed = 0;
    for (int k = 0; k < AR_MAXP; k++) {
        int s = stoke__arena_bind(a->name, k);
        if (s < 0 && errno != EADDRINUSE) /* not a name held: this process could not try */
            return stoke__fail(errno == EMFILE || errno == ENFILE ? STOKE_ELIMIT : STOKE_EIO,
                               "stoke_arena_open: arena '%s': a socket for slot %d: %s", a->name, k,
                               strerror(errno));
        if (s < 0)
            continue;
        if (listen(s, AR_MAXP) != 0) {
            int e = errno;
            close(s);
            return stoke__fail(STOKE_EIO, "stoke_arena_open: arena '%s': listen: %s", a->name,
                               strerror(e));
        }
        a->slot = k;
        a->listen_fd = s;
        int rc = stoke__arena_claim(a);
        if (rc == STOKE_OK)
            return STOKE_OK;
        a->slot = -1;
        a->listen_fd = -1;
        close(s);
        if (rc != 1)
            return rc;
        passed++;
    }
    if (passed)
        return stoke__fail(STOKE_ELIMIT,
                           "stoke_arena_open: arena '%s' has no free slot: of its %d, %d are "
                           "kept by live processes that may write the chunks of processes that "
                           "are gone (process workers), the others held by attached processes",
                           a->name, AR_MAXP, passed);
    /* Every name is bound: by attached processes, or by squatters of another uid. */
    ar_who first = {0};
    int others = 0;
    for (int k = 0; k < AR_MAXP; k++) {
        ar_who w = who_holds(a->name, k);
        if (foreign(&w) && others++ == 0)
            first = w;
    }
    if (others) {
        char who[64];
        return stoke__fail(STOKE_EBUSY,
                           "stoke_arena_open: arena '%s': no free slot: %d of its %d slot names "
                           "are held by other users (the first by %s, not this process's uid "
                           "%u): another user is squatting this arena's names; choose another "
                           "arena name",
                           a->name, others, AR_MAXP, who_str(&first, who, sizeof(who)),
                           (unsigned)getuid());
    }
    return stoke__fail(STOKE_ELIMIT, "stoke_arena_open: arena '%s' has %d processes attached",
                       a->name, AR_MAXP);
}

/* Registers the mapping for the current accelerator; a backend that cannot register leaves
 * the arena unpinned with a warning. */
static int pin_arena(stoke_arena *a)
{
    int rc = stoke_pin_register(a->base, a->map_len);
    if (rc == STOKE_ENOTSUP) {
        stoke__log(STOKE_LOG_WARN, "arena '%s' is not pinned: %s", a->name, stoke_last_error());
        return STOKE_OK;
    }
    if (rc != STOKE_OK)
        return stoke__fail(rc, "stoke_arena_open: arena '%s': %s", a->name, stoke_last_error());
    a->registered = 1;
    a->pinned = stoke_is_pinned(a->data);
    return STOKE_OK;
}

static void destroy(stoke_arena *a)
{
    stop_serving(a);
    if (a->listen_fd >= 0)
        close(a->listen_fd);
    if (a->wake_fd >= 0)
        close(a->wake_fd);
    if (a->registered && stoke_pin_unregister(a->base) != STOKE_OK)
        stoke__log(STOKE_LOG_DEBUG, "arena '%s': %s", a->name, stoke_last_error());
    if (a->base)
        munmap(a->base, a->map_len);
    if (a->memfd >= 0)
        close(a->memfd);
    free(a);
}

/* Steps 1-4 of the comment at the top, under the opening lock. */
static int open_locked(stoke_arena *a, size_t size, int lock)
{
    int fd = -1;
    ar_hello hello;
    ar_who w = {0};
    int rc, wslot = -1;
    int found = find_served(a->name, lock, &fd, &hello, &w, &wslot);
    if (found == -2) {
        int e = errno;
        struct rlimit rl = {0};
        char lim[64] = "";
        if ((e == EMFILE || e == ENFILE) && getrlimit(RLIMIT_NOFILE, &rl) == 0)
            snprintf(lim, sizeof(lim), " (RLIMIT_NOFILE %llu; ulimit -n)",
                     (unsigned long long)rl.rlim_cur);
        return stoke__fail(e == EMFILE || e == ENFILE ? STOKE_ELIMIT : STOKE_EIO,
                           "stoke_arena_open: arena '%s': could not ask slot %d for it: %s%s",
                           a->name, wslot, strerror(e), lim);
    }
    if (found < 0) {
        char which[32];
        snprintf(which, sizeof(which), "slot %d", wslot);
        return squatted(a->name, which, &w);
    }
    if (found == 2) {
        char pid[32] = "";
        if (w.pid > 0)
            snprintf(pid, sizeof(pid), " (pid %d)", (int)w.pid);
        return stoke__fail(STOKE_EBUSY,
                           "stoke_arena_open: arena '%s': a process of this uid%s holds slot %d "
                           "but did not answer within %d s (stopped? its queue flooded?); not "
                           "making a second arena of the same name: try again, or end it",
                           a->name, pid, wslot, AR_HELLO_WAIT_S);
    }
    if (found)
        rc = attach_arena(a, fd, &hello, size);
    else if (size == 0)
        return stoke__fail(STOKE_ENOENT,
                           "stoke_arena_open: no process of uid %u has an arena named '%s' "
                           "open (give a size to create it)",
                           (unsigned)getuid(), a->name);
    else
        rc = create_arena(a, size);
    drain_lock(lock);
    if (rc == STOKE_OK)
        rc = take_slot(a);
    drain_lock(lock);
    if (rc == STOKE_OK)
        rc = start_serving(a);
    return rc;
}

int stoke_arena_open(const char *name, size_t size, stoke_arena **out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "stoke_arena_open: out is NULL");
    *out = NULL;
    pthread_once(&arenas.once, install_atfork);
    stoke_arena *a = calloc(1, sizeof(*a));
    if (!a)
        return stoke__fail(STOKE_ENOMEM, "stoke_arena_open: out of memory");
    a->memfd = a->listen_fd = a->wake_fd = -1;
    a->slot = -1;
    a->pid = getpid();
    int rc = name ? STOKE_OK : stoke_arena_default_name(a->name, sizeof(a->name));
    if (rc == STOKE_OK && name)
        stoke__strlcpy(a->name, name, sizeof(a->name));
    if (rc == STOKE_OK && name && strlen(name) > STOKE_ARENA_NAME_MAX)
        rc = stoke__fail(STOKE_EINVAL,
                         "stoke_arena_open: the name '%.64s...' is longer than 64 "
                         "characters",
                         name);
    if (rc == STOKE_OK)
        rc = check_name(a->name);
    int lock = -1;
    if (rc == STOKE_OK)
        rc = take_open_lock(a->name, &lock);
    if (rc == STOKE_OK)
        rc = open_locked(a, size, lock);
    if (lock >= 0)
        close(lock);
    if (rc == STOKE_OK)
        rc = pin_arena(a);
    if (rc != STOKE_OK) {
        stoke__saved_error e;
        stoke__error_save(&e);
        if (a->h && a->slot >= 0 && a->listen_fd >= 0)
            stoke__arena_release(a);
        destroy(a);
        stoke__error_restore(&e);
        return rc;
    }
    list_add(a);
    *out = a;
    return STOKE_OK;
}

int stoke_arena_close(stoke_arena *a)
{
    if (!a)
        return STOKE_OK;
    list_remove(a);
    if (a->pid != getpid()) {
        /* A forked child: the descriptors were closed at fork; only the mapping is ours. */
        if (a->base)
            munmap(a->base, a->map_len);
        free(a);
        return STOKE_OK;
    }
    stop_serving(a);
    stoke__arena_release(a);
    destroy(a);
    return STOKE_OK;
}

int stoke__arena_open_spec(const char *spec, uint64_t need, const char *what, stoke_arena **out)
{
    *out = NULL;
    if (!spec)
        spec = stoke__env_str(STOKE_ENV_ARENA);
    if (!spec || !spec[0])
        return STOKE_OK;
    char name[STOKE_ARENA_NAME_MAX + 2];
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    if (n >= sizeof(name))
        return stoke__fail(STOKE_EINVAL, "%s: arena '%s': the name is longer than %d characters",
                           what, spec, STOKE_ARENA_NAME_MAX);
    memcpy(name, spec, n);
    name[n] = '\0';
    uint64_t size = 0;
    if (colon && stoke__parse_size(colon + 1, &size) != 0)
        return stoke__fail(STOKE_EINVAL, "%s: arena '%s': '%s' is not a size (bytes, K/M/G)", what,
                           spec, colon + 1);
    if (colon && size == 0)
        return stoke__fail(STOKE_EINVAL, "%s: arena '%s': size 0", what, spec);
    const char *nm = strcmp(name, "auto") == 0 ? NULL : name;
    int rc;
    if (size)
        rc = stoke_arena_open(nm, (size_t)size, out);
    else {
        rc = stoke_arena_open(nm, 0, out);
        if (rc == STOKE_ENOENT &&
            (nm || stoke_arena_default_name(name, sizeof(name)) == STOKE_OK)) {
            uint64_t procs = 1;
            if (!stoke__env_u64(STOKE_ENV_LOCAL_WORLD_SIZE, &procs) || procs == 0)
                procs = 1;
            if (procs > AR_MAXP)
                procs = AR_MAXP;
            rc = stoke_arena_open(nm, (size_t)(need * procs), out);
            if (rc == STOKE_EINVAL && stoke_arena_open(nm, 0, out) == STOKE_OK)
                rc = STOKE_OK; /* another process created it meanwhile, of another size */
        }
    }
    if (rc != STOKE_OK)
        return stoke__fail(rc, "%s: %s", what, stoke_last_error());
    return STOKE_OK;
}
