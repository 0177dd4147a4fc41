/* The node-wide arena against another user (issue 25, item 1): a process of another uid binds
 * the victim's predictable abstract socket names first.  It answers on slot 0 with its own
 * memory (a good-looking arena, or a header with a bad chunk count), squats the opening lock
 * ("-init", listening or not), squats every slot name, or squats the slots a running arena has
 * free.  Each time the victim's open fails at once with STOKE_EBUSY naming the other uid (and
 * its pid where the kernel tells it) and never maps the other user's memory; an arena of the
 * victim that is still served is used, the squatter only named in a warning; the other user
 * connecting to the victim's slot gets nothing; and a slot name taken by the other user after
 * the victim's process there died does not keep that process's chunks from coming back.
 *
 * Needs root: the attacker is a user made here with useradd ("stoke-attacker"; one that exists
 * is used), run as a fork of this test after setresgid/setresuid.  Not root, or no user could
 * be made: every test skips (exit 77).  The attacker child makes only system calls. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "ipc/ipc_internal.h"
#include "stoke/stoke.h"
#include "testutil.h"

#define MIB       (1024u * 1024u)
#define WAIT_S    30 /* bound on every wait for the attacker */
#define FAST_S    5  /* a squatter must be named well within this (the old code: 10 s, 130 s) */
#define ATTACKER  "stoke-attacker"
#define EVIL_BYTE 0xEE /* the attacker's data */

static uid_t evil_uid;
static gid_t evil_gid;
static pid_t evil_live[8]; /* attackers running: teardown kills any a failed test left */

/* The attacker's uid and gid (made with useradd when missing), or skips the test. */
static void need_attacker(void)
{
    if (geteuid() != 0)
        tu_skip("needs root: the attacker runs as another user made with useradd");
    struct passwd *pw = getpwnam(ATTACKER);
    for (int i = 0; !pw && i < 20; i++) {
        /* "already exists" and a locked /etc/passwd (another test adding it) are retried */
        int rc = system("useradd -M -N -r -s /usr/sbin/nologin " ATTACKER " >/dev/null 2>&1");
        (void)rc;
        pw = getpwnam(ATTACKER);
        if (!pw) {
            struct timespec ts = {.tv_nsec = 100000000};
            nanosleep(&ts, NULL);
        }
    }
    if (!pw)
        tu_skip("could not create the user " ATTACKER " with useradd");
    evil_uid = pw->pw_uid;
    evil_gid = pw->pw_gid;
    if (evil_uid == getuid())
        tu_skip(ATTACKER " has this process's uid");
}

static void name_of(char *buf, size_t len, const char *tag)
{
    snprintf(buf, len, "u%d-%s", (int)getpid(), tag);
}

/* ---- the attacker ------------------------------------------------------------------------------
 */

enum {
    BIND_ONLY = 1,  /* bind, do not listen */
    LISTEN = 2,     /* bind and listen; connections stay unanswered */
    ANSWER = 4,     /* bind, listen, answer each connection with the attacker's memfd */
    BAD_HEADER = 8, /* ... whose header has a bad chunk count */
    FULL_QUEUE = 16 /* bind, listen(fd, 0) and fill the queue by connecting to itself */
};

typedef struct evil {
    pid_t pid;
    int ready; /* read end: one byte when the names are bound, then the child's verdict */
} evil;

typedef struct evil_plan {
    int flags;
    int nnames;
    struct sockaddr_un sa[AR_MAXP + 1];
    socklen_t len[AR_MAXP + 1];
    uint64_t chunk, nchunks, data_off, map_len; /* the layout of a 1 MiB arena */
} evil_plan;

static void evil_plan_name(evil_plan *p, const char *name, int slot)
{
    p->len[p->nnames] = stoke__arena_addr(name, slot, &p->sa[p->nnames]);
    p->nnames++;
}

/* In a child after fork: becomes the attacker, and dies with the test (the parent-death signal
 * is set after the change of credentials, which clears it). */
static void become_attacker(pid_t parent)
{
    if (setgroups(0, NULL) != 0 || setresgid(evil_gid, evil_gid, evil_gid) != 0 ||
        setresuid(evil_uid, evil_uid, evil_uid) != 0 || getuid() != evil_uid)
        _exit(90);
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        _exit(89);
}

/* The child after fork: only system calls. */
static void evil_child(const evil_plan *p, int ready, pid_t parent)
{
    become_attacker(parent);
    int fds[AR_MAXP + 1];
    for (int i = 0; i < p->nnames; i++) {
        fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fds[i] < 0 || bind(fds[i], (const struct sockaddr *)&p->sa[i], p->len[i]) != 0)
            _exit(91);
        if (!(p->flags & BIND_ONLY) && listen(fds[i], p->flags & FULL_QUEUE ? 0 : 64) != 0)
            _exit(92);
        for (int q = 0; p->flags & FULL_QUEUE; q++) { /* until a connect would wait */
            int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
            if (c < 0 || q > 64)
                _exit(96);
            if (connect(c, (const struct sockaddr *)&p->sa[i], p->len[i]) != 0) {
                if (errno != EAGAIN)
                    _exit(97);
                close(c);
                break;
            } /* else kept open, queued, never accepted */
        }
    }
    int mfd = -1;
    if (p->flags & ANSWER) {
        /* its own "arena", full of its own bytes */
        mfd = memfd_create("attacker", MFD_CLOEXEC | MFD_ALLOW_SEALING);
        if (mfd < 0 || ftruncate(mfd, (off_t)p->map_len) != 0)
            _exit(93);
        unsigned char *m = mmap(NULL, p->map_len, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
        if (m == MAP_FAILED)
            _exit(94);
        for (uint64_t i = p->data_off; i < p->map_len; i++)
            m[i] = EVIL_BYTE;
        ar_hdr *h = (ar_hdr *)(void *)m;
        h->magic = AR_MAGIC;
        h->version = AR_VERSION;
        h->maxp = AR_MAXP;
        h->requested = MIB;
        h->chunk = p->chunk;
        h->nchunks = (p->flags & BAD_HEADER) ? 1ull << 40 : p->nchunks;
        h->data_off = p->data_off;
        h->map_len = p->map_len;
        munmap(m, p->map_len);
        fcntl(mfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
    }
    char c = 'r';
    if (write(ready, &c, 1) != 1)
        _exit(95);
    struct pollfd pf[AR_MAXP + 1];
    for (int i = 0; i < p->nnames; i++)
        pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
    for (;;) { /* until killed */
        if (!(p->flags & (ANSWER | LISTEN)) || (p->flags & FULL_QUEUE) ||
            poll(pf, (nfds_t)p->nnames, -1) <= 0) {
            pause();
            continue;
        }
        for (int i = 0; i < p->nnames; i++) {
            if (!(pf[i].revents & POLLIN))
                continue;
            int s = accept4(fds[i], NULL, NULL, SOCK_CLOEXEC);
            if (s < 0)
                continue;
            if (p->flags & ANSWER) {
                ar_hello hello = {.magic = AR_MAGIC,
                                  .version = AR_VERSION,
                                  .pid = (int32_t)getpid(),
                                  .requested = MIB,
                                  .map_len = p->map_len};
                stoke__sendmsg_fd(s, &hello, sizeof(hello), mfd);
                close(s);
            } /* else: accepted, never answered (kept open until killed) */
        }
    }
}

static void reap_attacker(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    for (size_t i = 0; i < sizeof(evil_live) / sizeof(evil_live[0]); i++)
        if (evil_live[i] == pid)
            evil_live[i] = 0;
}

static evil evil_start(evil_plan *p)
{
    uint64_t requested = MIB;
    assert_int_equal(
        stoke__arena_layout(requested, &p->chunk, &p->nchunks, &p->data_off, &p->map_len),
        STOKE_OK);
    int pp[2];
    assert_int_equal(pipe2(pp, O_CLOEXEC), 0);
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(pp[0]);
        evil_child(p, pp[1], parent);
        _exit(99);
    }
    close(pp[1]);
    for (size_t i = 0; i < sizeof(evil_live) / sizeof(evil_live[0]); i++)
        if (!evil_live[i]) {
            evil_live[i] = pid;
            break;
        }
    evil e = {.pid = pid, .ready = pp[0]};
    struct pollfd pf = {.fd = e.ready, .events = POLLIN};
    char c = 0;
    if (poll(&pf, 1, WAIT_S * 1000) != 1 || read(e.ready, &c, 1) != 1 || c != 'r') {
        int st = 0;
        kill(pid, SIGKILL);
        waitpid(pid, &st, 0);
        for (size_t i = 0; i < sizeof(evil_live) / sizeof(evil_live[0]); i++)
            if (evil_live[i] == pid)
                evil_live[i] = 0;
        fail_msg("the attacker (uid %u) did not bind its names (exit %d)", (unsigned)evil_uid,
                 WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    }
    return e;
}

static void evil_stop(evil *e)
{
    if (e->pid > 0) {
        reap_attacker(e->pid);
        close(e->ready);
        e->pid = 0;
    }
}

/* ---- the victim's checks -----------------------------------------------------------------------
 */

static int count_our_sockets(void)
{
    char needle[96];
    snprintf(needle, sizeof(needle), "@stoke-arena-%u-u%d-", (unsigned)getuid(), (int)getpid());
    return tu_count_unix_names(needle);
}

/* stoke_arena_open(name, size) must fail with STOKE_EBUSY within FAST_S, naming the attacker's
 * uid (and its pid when `with_pid`) and `needle`, without the attacker's memory. */
static void expect_squatted(const char *name, size_t size, const evil *e, int with_pid,
                            const char *needle)
{
    stoke_arena *a = NULL;
    uint64_t t0 = stoke__now_ns();
    int rc = stoke_arena_open(name, size, &a);
    double s = (double)(stoke__now_ns() - t0) / 1e9;
    char msg[1024], want[64];
    stoke__strlcpy(msg, stoke_last_error(), sizeof(msg));
    if (a)
        stoke_arena_close(a);
    if (rc != STOKE_EBUSY)
        fail_msg("open of '%s' gave %s (\"%s\"), expected STOKE_EBUSY", name, stoke_err_name(rc),
                 msg);
    assert_null(a);
    if (s >= FAST_S)
        fail_msg("the squatter was named after %.1f s, not within %d s: %s", s, FAST_S, msg);
    snprintf(want, sizeof(want), "uid %u", (unsigned)evil_uid);
    if (!strstr(msg, want))
        fail_msg("the message does not name %s: %s", want, msg);
    snprintf(want, sizeof(want), "pid %d", (int)e->pid);
    if (with_pid && !strstr(msg, want))
        fail_msg("the message does not name %s: %s", want, msg);
    if (needle && !strstr(msg, needle))
        fail_msg("the message does not say \"%s\": %s", needle, msg);
    assert_int_equal(tu_count_fds_to("memfd:attacker"), 0);
}

static int setup(void **state)
{
    (void)state;
    tu_log_capture();
    tu_log_clear();
    tu_use_simdev();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof(evil_live) / sizeof(evil_live[0]); i++)
        if (evil_live[i])
            reap_attacker(evil_live[i]);
    tu_use_none();
    int bad = 0;
    if (tu_count_fds_to("memfd:stoke-arena") != 0)
        bad = fprintf(stderr, "teardown: arena memfd(s) still open\n");
    if (tu_count_fds_to("memfd:attacker") != 0)
        bad = fprintf(stderr, "teardown: the attacker's memfd is open here\n");
    if (count_our_sockets() != 0)
        bad =
            fprintf(stderr, "teardown: %d arena socket name(s) still bound\n", count_our_sockets());
    return bad ? -1 : 0;
}

/* ---- tests -------------------------------------------------------------------------------------
 */

/* The attacker answers first on slot 0 with its own memory: a good-looking arena, then one
 * with a bad chunk count (which crashed the victim).  Both refused before anything is read. */
static void test_answer_on_slot(void **state)
{
    (void)state;
    need_attacker();
    for (int bad = 0; bad < 2; bad++) {
        char name[64];
        name_of(name, sizeof(name), bad ? "badhdr" : "answer");
        evil_plan p = {.flags = ANSWER | (bad ? BAD_HEADER : 0)};
        evil_plan_name(&p, name, 0);
        evil e = evil_start(&p);
        expect_squatted(name, MIB, &e, 1, "slot 0");
        expect_squatted(name, 0, &e, 1, "squatting");
        evil_stop(&e);
        /* gone: the name is the victim's again */
        stoke_arena *a;
        assert_int_equal(stoke_arena_open(name, MIB, &a), STOKE_OK);
        void *q;
        assert_int_equal(stoke_arena_alloc(a, 4096, &q), STOKE_OK);
        assert_int_not_equal(((unsigned char *)q)[0], EVIL_BYTE);
        assert_int_equal(stoke_arena_close(a), STOKE_OK);
    }
}

/* Skips the test unless the kernel's socket table names the uid of a bound name (unix_diag
 * with UDIAG_SHOW_UID, Linux 5.3, CONFIG_UNIX_DIAG): what names a squatter that only binds. */
static void need_unix_diag(void)
{
    char name[64];
    name_of(name, sizeof(name), "diag-probe");
    int s = stoke__arena_bind(name, -1);
    assert_true(s >= 0);
    unsigned uid = ~0u;
    int found = stoke__arena_name_uid(name, -1, &uid);
    close(s);
    if (!found || uid != (unsigned)getuid())
        tu_skip("the kernel's socket diagnostics (NETLINK_SOCK_DIAG, unix_diag with "
                "UDIAG_SHOW_UID) do not name a bound socket's uid here");
}

/* The opening lock "-init" squatted, listening (its credentials name the pid too) and bound
 * only (the kernel's socket table names the uid: skipped where it cannot): named at once, not
 * ETIMEDOUT after 10 s. */
static void test_init_squatted(void **state)
{
    (void)state;
    need_attacker();
    for (int listening = 1; listening >= 0; listening--) {
        if (!listening)
            need_unix_diag();
        char name[64];
        name_of(name, sizeof(name), listening ? "init-l" : "init-b");
        evil_plan p = {.flags = listening ? LISTEN : BIND_ONLY};
        evil_plan_name(&p, name, -1);
        evil e = evil_start(&p);
        expect_squatted(name, MIB, &e, listening, "opening lock");
        evil_stop(&e);
    }
}

/* The attacker binds slot 0, listens with a queue of 0 and fills it by connecting to itself:
 * the victim's connect there blocked for ever, inside the opening lock.  Now it does not wait:
 * the squatter is named within FAST_S (an alarm fails the test if the open hangs). */
static void test_full_queue_on_slot(void **state)
{
    (void)state;
    need_attacker();
    need_unix_diag();
    char name[64];
    name_of(name, sizeof(name), "fullq");
    evil_plan p = {.flags = LISTEN | FULL_QUEUE};
    evil_plan_name(&p, name, 0);
    evil e = evil_start(&p);
    alarm(WAIT_S); /* SIGALRM kills the test: a hang fails instead of waiting for CTest */
    expect_squatted(name, MIB, &e, 0, "slot 0");
    expect_squatted(name, 0, &e, 0, "slot 0");
    alarm(0);
    evil_stop(&e);
}

/* A process (not root: uid 0 is what the kernel reports for the sockets it makes for queued
 * connections) holds its opening lock, listening, with 16 accepted connections in hand, and
 * accepts no more; 100 waiters ask who holds it, so its queue fills and the question goes to
 * the socket table, where the connections carry the listener's name too (kernels that list
 * queued ones report uid 0 for them: a false "another user is squatting").  Every answer must
 * be the holder's own uid.  (Linux 6.18 lists accepted connections with the right uid and not
 * the queued ones, so there this passes without the fix too.) */
static void test_init_probes_same_uid(void **state)
{
    (void)state;
    need_attacker();
    need_unix_diag();
    char name[64];
    name_of(name, sizeof(name), "probes");
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        become_attacker(parent); /* here: a plain user opening its own arena */
        int s = stoke__arena_bind(name, -1);
        if (s < 0 || listen(s, AR_MAXP) != 0)
            _exit(91);
        struct sockaddr_un sa;
        socklen_t len = stoke__arena_addr(name, -1, &sa);
        for (int i = 0; i < 16; i++) { /* connections in hand: they carry the name too */
            int c = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (c < 0 || connect(c, (struct sockaddr *)&sa, len) != 0 ||
                accept4(s, NULL, NULL, SOCK_CLOEXEC) < 0)
                _exit(92);
        }
        int bad = 0, named = 0;
        for (int i = 0; i < 100; i++) {
            unsigned uid = 0;
            bad += stoke__arena_slot_foreign(name, -1, &uid);
        }
        unsigned uid = ~0u;
        named = stoke__arena_name_uid(name, -1, &uid) && uid == (unsigned)getuid();
        _exit(bad ? 1 : named ? 0 : 2);
    }
    int st = 0;
    for (int t = 0; t < WAIT_S * 100 && waitpid(pid, &st, WNOHANG) != pid; t++) {
        struct timespec ts = {.tv_nsec = 10000000};
        nanosleep(&ts, NULL);
        if (t == WAIT_S * 100 - 1) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    assert_true(WIFEXITED(st));
    if (WEXITSTATUS(st) == 1)
        fail_msg("a waiter of uid %u was told another uid holds its own opening lock",
                 (unsigned)evil_uid);
    assert_int_equal(WEXITSTATUS(st), 0);
}

/* Every slot name squatted (accepted, never answered: each ask waited 2 s, 130 s in all, then
 * "has 64 processes attached"). */
static void test_all_slots_squatted(void **state)
{
    (void)state;
    need_attacker();
    char name[64];
    name_of(name, sizeof(name), "slots");
    for (int listening = 0; listening < 2; listening++) {
        evil_plan p = {.flags = listening ? LISTEN : BIND_ONLY};
        for (int k = 0; k < AR_MAXP; k++)
            evil_plan_name(&p, name, k);
        evil e = evil_start(&p);
        /* listening: the first slot asked names it; bound only: nobody answers, the arena is
         * made, and no slot name can be taken */
        expect_squatted(name, MIB, &e, listening, listening ? "slot 0" : "64 of its 64");
        evil_stop(&e);
    }
}

/* A running arena of the victim holds slot 0; the attacker squats the 63 others: a new
 * process of the victim is told so, not "has 64 processes attached". */
static void test_free_slots_squatted(void **state)
{
    (void)state;
    need_attacker();
    char name[64];
    name_of(name, sizeof(name), "free");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, MIB, &a), STOKE_OK);
    evil_plan p = {.flags = LISTEN};
    for (int k = 1; k < AR_MAXP; k++)
        evil_plan_name(&p, name, k);
    evil e = evil_start(&p);
    expect_squatted(name, MIB, &e, 1, "63 of its 64 slot names");
    evil_stop(&e);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* The attacker takes slot 0 after the victim's process there left, while another process of
 * the victim still serves slot 1: the victim's arena is found and used, the squatter named in
 * a warning. */
static void test_squatter_skipped(void **state)
{
    (void)state;
    need_attacker();
    char name[64];
    name_of(name, sizeof(name), "skip");
    stoke_arena *a0, *a1, *a2;
    assert_int_equal(stoke_arena_open(name, MIB, &a0), STOKE_OK);
    assert_int_equal(stoke_arena_open(name, MIB, &a1), STOKE_OK);
    void *p1;
    assert_int_equal(stoke_arena_alloc(a1, 4096, &p1), STOKE_OK);
    memset(p1, 0x5c, 4096);
    uint64_t off;
    assert_int_equal(stoke_arena_offset(a1, p1, &off), STOKE_OK);
    assert_int_equal(stoke_arena_close(a0), STOKE_OK); /* slot 0 is free */
    evil_plan p = {.flags = ANSWER};
    evil_plan_name(&p, name, 0);
    evil e = evil_start(&p);
    tu_log_clear();
    assert_int_equal(stoke_arena_open(name, MIB, &a2), STOKE_OK);
    char want[64];
    snprintf(want, sizeof(want), "held by uid %u (pid %d)", (unsigned)evil_uid, (int)e.pid);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, want), 1);
    assert_int_equal(tu_count_fds_to("memfd:attacker"), 0);
    void *p2;
    assert_int_equal(stoke_arena_ptr(a2, off, &p2), STOKE_OK);
    assert_int_equal(((unsigned char *)p2)[0], 0x5c); /* the victim's own memory */
    assert_int_equal(((unsigned char *)p2)[4095], 0x5c);
    stoke_arena_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_arena_stats_get(a2, &st), STOKE_OK);
    assert_int_equal(st.created, 0);
    assert_int_equal(st.creator_pid, (int)getpid());
    assert_int_not_equal(st.slot, 0); /* slot 0's name is the attacker's */
    evil_stop(&e);
    assert_int_equal(stoke_arena_close(a2), STOKE_OK);
    assert_int_equal(stoke_arena_close(a1), STOKE_OK);
}

/* The other user connects to the victim's slot, 50 times: it gets no descriptor (the serving
 * side checks SO_PEERCRED), and the victim logs the refusal once (one line a connection let
 * another user fill the victim's log). */
static void test_attacker_cannot_attach(void **state)
{
    (void)state;
    need_attacker();
    char name[64];
    name_of(name, sizeof(name), "steal");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, MIB, &a), STOKE_OK);
    struct sockaddr_un sa;
    socklen_t len = stoke__arena_addr(name, 0, &sa);
    tu_log_clear();
    pid_t parent = getpid();
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        become_attacker(parent);
        for (int i = 0; i < 50; i++) {
            int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
            if (s < 0 || connect(s, (struct sockaddr *)&sa, len) != 0)
                _exit(91);
            struct timeval tv = {.tv_sec = WAIT_S};
            setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            ar_hello hello;
            int fd = -1;
            ssize_t n = stoke__recvmsg_fd(s, &hello, sizeof(hello), &fd);
            if (fd >= 0)
                _exit(1);
            if (n != 0) /* 0: closed without an answer */
                _exit(92);
            close(s);
        }
        _exit(0);
    }
    int st = 0;
    for (int t = 0; t < WAIT_S * 100 && waitpid(pid, &st, WNOHANG) != pid; t++) {
        struct timespec ts = {.tv_nsec = 10000000};
        nanosleep(&ts, NULL);
        if (t == WAIT_S * 100 - 1) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
        }
    }
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
    char want[64];
    snprintf(want, sizeof(want), "refused a connection from uid %u", (unsigned)evil_uid);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, want), 1);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* A process of the victim holding 768 KiB of a 1 MiB arena is killed, and the attacker takes
 * its slot name before anyone reclaimed: an allocation that finds no room still gets the
 * chunks back (the name held by another uid means the victim's process there is gone). */
static void test_dead_slot_squatted(void **state)
{
    (void)state;
    need_attacker();
    char name[64];
    name_of(name, sizeof(name), "dead");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, MIB, &a), STOKE_OK);
    int pp[2];
    assert_int_equal(pipe2(pp, O_CLOEXEC), 0);
    pid_t hog = fork();
    assert_true(hog >= 0);
    if (hog == 0) {
        /* only async-signal-safe calls until exec: a fresh process of this uid */
        if (dup2(pp[1], 3) < 0)
            _exit(120);
        char *argv[] = {"test_arena_users", "hog", name, NULL};
        execv("/proc/self/exe", argv);
        _exit(121);
    }
    close(pp[1]);
    struct pollfd pf = {.fd = pp[0], .events = POLLIN};
    char c = 0;
    int ready = poll(&pf, 1, WAIT_S * 1000) == 1 && read(pp[0], &c, 1) == 1 && c == 'r';
    kill(hog, SIGKILL);
    waitpid(hog, NULL, 0);
    close(pp[0]);
    if (!ready)
        fail_msg("the victim's second process did not attach and allocate");
    evil_plan p = {.flags = LISTEN};
    evil_plan_name(&p, name, 1); /* the hog's slot */
    evil e = evil_start(&p);
    tu_log_clear();
    void *q = NULL;
    int rc = stoke_arena_alloc(a, 512 * 1024, &q);
    if (rc != STOKE_OK)
        fail_msg("alloc: %s (%s)", stoke_err_name(rc), stoke_last_error());
    char want[96];
    snprintf(want, sizeof(want), "uid %u, another user, now holds its slot name",
             (unsigned)evil_uid);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, want), 1);
    stoke_arena_stats st = {.size = sizeof(st)};
    assert_int_equal(stoke_arena_stats_get(a, &st), STOKE_OK);
    assert_int_equal(st.reclaims, 1);
    assert_int_equal(st.reclaimed_bytes, 768 * 1024);
    assert_int_equal(st.processes, 1);
    evil_stop(&e);
    assert_int_equal(stoke_arena_free(a, q), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* The victim's second process (argv: hog NAME): attaches, allocates 768 KiB, says so on fd 3,
 * waits to be killed. */
static int hog_main(const char *name)
{
    stoke_arena *a = NULL;
    void *p = NULL;
    if (stoke_arena_open(name, 0, &a) != STOKE_OK || stoke_arena_alloc(a, 768 * 1024, &p) != 0)
        return 1;
    memset(p, 0x11, 768 * 1024);
    if (write(3, "r", 1) != 1)
        return 2;
    for (;;)
        pause();
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "hog") == 0)
        return hog_main(argv[2]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_answer_on_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_squatted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_full_queue_on_slot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_init_probes_same_uid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_all_slots_squatted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_free_slots_squatted, setup, teardown),
        cmocka_unit_test_setup_teardown(test_squatter_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attacker_cannot_attach, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dead_slot_squatted, setup, teardown),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
