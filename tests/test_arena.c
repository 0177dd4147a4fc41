/* The node-wide pinned arena (stoke/arena.h) on simdev, between real processes: children are
 * this executable run again (fork + exec, so each is a fresh process with no inherited
 * threads), driven over pipes.  Two processes share data through one arena; a killed process's
 * allocations come back, also when it died holding the arena's lock; the creator leaving does
 * not end the arena; racing creators end with one arena; name and size errors; no accelerator;
 * the loader gives the same bytes from the arena.  After every test: nothing in /dev/shm, no
 * arena descriptor and no arena socket name left. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "ipc/ipc_internal.h"
#include "stoke/stoke.h"
#include "testutil.h"

#define MIB    (1024u * 1024u)
#define LEN    (256u * 1024u + 4096u) /* bytes of data each side writes */
#define WAIT_S 60                     /* bound on every wait for a child */

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed * 29u + (i >> 9));
}

static size_t first_bad(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 131u + seed * 29u + (i >> 9)))
            return i;
    return n;
}

static void name_of(char *buf, size_t len, const char *tag)
{
    snprintf(buf, len, "t%d-%s", (int)getpid(), tag);
}

/* ---- what the children report ---------------------------------------------------------------- */

typedef struct report {
    int32_t status; /* 0: fine; else the step that failed */
    int32_t created, creator_pid, pinned;
    uint64_t off;        /* offset of the child's own allocation */
    uint64_t processes;  /* stats.processes when it reported */
    int32_t writer, pad; /* role writer: the pid of the process it forked and recorded */
    char err[240];
} report;

static int rd_all(int fd, void *p, size_t n)
{
    char *c = p;
    while (n) {
        struct pollfd pf = {.fd = fd, .events = POLLIN};
        if (poll(&pf, 1, WAIT_S * 1000) <= 0)
            return -1;
        ssize_t r = read(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        c += r;
        n -= (size_t)r;
    }
    return 0;
}

static void wr_all(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n) {
        ssize_t r = write(fd, c, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return;
        c += r;
        n -= (size_t)r;
    }
}

/* ---- the child (argv: arena-child ROLE NAME SIZE ARG; commands on fd 3, reports on fd 4) ------
 */

static int child_report(report *r, int status, stoke_arena *a)
{
    r->status = status;
    if (status)
        stoke__strlcpy(r->err, stoke_last_error(), sizeof(r->err));
    stoke_arena_stats st = {.size = sizeof(st)};
    if (a && stoke_arena_stats_get(a, &st) == STOKE_OK) {
        r->created = st.created;
        r->creator_pid = st.creator_pid;
        r->pinned = st.pinned;
        r->processes = st.processes;
    }
    wr_all(4, r, sizeof(*r));
    return status;
}

static void child_block(void)
{
    char c;
    while (read(3, &c, 1) < 0 && errno == EINTR)
        ;
}

/* Not attached to the arena: imports an allocation the parent exported (stoke_ipc_export),
 * checks seed 1 in its first half, writes seed 2 into its second half. */
static int child_import(void)
{
    report r;
    memset(&r, 0, sizeof(r));
    stoke_ipc_handle h;
    void *p = NULL;
    if (stoke_ipc_recv(3, &h) != STOKE_OK)
        return child_report(&r, 20, NULL);
    if (strcmp(h.backend, "arena") != 0 || h.size != LEN)
        return child_report(&r, 21, NULL);
    if (stoke_ipc_import(&h, &p) != STOKE_OK)
        return child_report(&r, 22, NULL);
    r.pinned = stoke_is_pinned(p) && stoke_is_pinned((char *)p + LEN - 1);
    if (first_bad(p, LEN / 2, 1) != LEN / 2)
        return child_report(&r, 23, NULL);
    fill((unsigned char *)p + LEN / 2, LEN - LEN / 2, 2);
    if (stoke_ipc_unmap(p) != STOKE_OK || stoke_ipc_close(&h) != STOKE_OK)
        return child_report(&r, 24, NULL);
    return child_report(&r, 0, NULL);
}

static int child_main(const char *role, const char *name, size_t size, uint64_t arg)
{
    if (strcmp(role, "import") == 0)
        return child_import();
    report r;
    memset(&r, 0, sizeof(r));
    stoke_arena *a = NULL;
    if (strcmp(role, "race") == 0)
        child_block(); /* the start gun */
    if (stoke_arena_open(name, size, &a) != STOKE_OK)
        return child_report(&r, 1, NULL);
    void *p = NULL;
    if (strcmp(role, "share") == 0) {
        /* read the parent's data at offset `arg`, write the second half, make our own block */
        if (stoke_arena_ptr(a, arg, &p) != STOKE_OK)
            return child_report(&r, 2, a);
        if (!stoke_is_pinned(p) || !stoke_is_pinned((char *)p + LEN - 1))
            return child_report(&r, 3, a);
        if (first_bad(p, LEN / 2, 1) != LEN / 2)
            return child_report(&r, 4, a);
        fill((unsigned char *)p + LEN / 2, LEN - LEN / 2, 2);
    }
    int hog = strcmp(role, "hog") == 0 || strcmp(role, "writer") == 0;
    if (strcmp(role, "share") == 0 || hog || strcmp(role, "create") == 0) {
        size_t n = hog ? (size_t)arg : LEN;
        if (stoke_arena_alloc(a, n, &p) != STOKE_OK)
            return child_report(&r, 5, a);
        fill(p, n < LEN ? n : LEN, 3);
        if (stoke_arena_offset(a, p, &r.off) != STOKE_OK)
            return child_report(&r, 6, a);
    }
    if (strcmp(role, "lock") == 0 && stoke__arena_test_hold_lock(a) != STOKE_OK)
        return child_report(&r, 7, NULL);
    if (strcmp(role, "writer") == 0) {
        /* a process worker's stand-in: forked, it keeps writing our chunk after we are gone
         * until the parent says so on fd 3 (or closes it) */
        pid_t w = fork();
        if (w < 0)
            return child_report(&r, 8, a);
        if (w == 0) {
            struct pollfd pf = {.fd = 3, .events = POLLIN};
            while (poll(&pf, 1, 1) == 0)
                ((volatile unsigned char *)p)[0] = 0x77;
            _exit(0);
        }
        r.writer = (int32_t)w;
        if (stoke__arena_add_writer(a, w) != STOKE_OK)
            return child_report(&r, 9, a);
    }
    child_report(&r, 0, strcmp(role, "lock") == 0 ? NULL : a);
    child_block(); /* until the parent says so (or kills us) */
    stoke_arena_close(a);
    return 0;
}

/* ---- the parent's side ------------------------------------------------------------------------
 */

typedef struct kid {
    pid_t pid;
    int to, from;
} kid;

static kid spawn(const char *role, const char *name, size_t size, uint64_t arg)
{
    int down[2], up[2]; /* down: a socket, so that descriptors can travel */
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, down), 0);
    assert_int_equal(pipe2(up, O_CLOEXEC), 0);
    char sz[32], ar[32];
    snprintf(sz, sizeof(sz), "%zu", size);
    snprintf(ar, sizeof(ar), "%llu", (unsigned long long)arg);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* only async-signal-safe calls until exec */
        if (dup2(down[0], 3) < 0 || dup2(up[1], 4) < 0)
            _exit(120);
        char *argv[] = {"test_arena", "arena-child", (char *)role, (char *)name, sz, ar, NULL};
        execv("/proc/self/exe", argv);
        _exit(121);
    }
    close(down[0]);
    close(up[1]);
    return (kid){.pid = pid, .to = down[1], .from = up[0]};
}

static report kid_report(const kid *k)
{
    report r;
    memset(&r, 0, sizeof(r));
    if (rd_all(k->from, &r, sizeof(r)) != 0)
        fail_msg("child %d sent no report within %d s", (int)k->pid, WAIT_S);
    if (r.status)
        fail_msg("child %d failed at step %d: %s", (int)k->pid, r.status, r.err);
    return r;
}

static void kid_go(const kid *k)
{
    /* the child may have exited already (its socket closed): no SIGPIPE */
    while (send(k->to, "g", 1, MSG_NOSIGNAL) < 0 && errno == EINTR)
        ;
}

/* Waits (bounded) for the child; returns its wait status. */
static int kid_wait(kid *k)
{
    int st = 0;
    for (int t = 0; t < WAIT_S * 100; t++) {
        pid_t r = waitpid(k->pid, &st, WNOHANG);
        if (r == k->pid)
            break;
        if (t == WAIT_S * 100 - 1) {
            kill(k->pid, SIGKILL);
            waitpid(k->pid, &st, 0);
            fail_msg("child %d did not exit within %d s", (int)k->pid, WAIT_S);
        }
        struct timespec ts = {.tv_nsec = 10000000};
        nanosleep(&ts, NULL);
    }
    close(k->to);
    close(k->from);
    return st;
}

static void kid_finish(kid *k)
{
    kid_go(k);
    int st = kid_wait(k);
    assert_true(WIFEXITED(st));
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void kid_kill(kid *k)
{
    kill(k->pid, SIGKILL);
    int st = kid_wait(k);
    assert_true(WIFSIGNALED(st));
}

static stoke_arena_stats stats_of(stoke_arena *a)
{
    stoke_arena_stats st;
    memset(&st, 0, sizeof(st));
    st.size = sizeof(st);
    assert_int_equal(stoke_arena_stats_get(a, &st), STOKE_OK);
    return st;
}

/* ---- leftovers --------------------------------------------------------------------------------
 */

static int count_our_shm(void)
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (strstr(de->d_name, "stoke") || strstr(de->d_name, "simdev"))
            n++;
    closedir(d);
    return n;
}

static int count_arena_fds(void)
{
    return tu_count_fds_to("memfd:stoke-arena");
}

/* Abstract socket names of this test's arenas still bound (any process). */
static int count_our_sockets(void)
{
    char needle[96];
    snprintf(needle, sizeof(needle), "@stoke-arena-%u-t%d-", (unsigned)getuid(), (int)getpid());
    return tu_count_unix_names(needle);
}

static int shm_at_setup;

static int setup(void **state)
{
    (void)state;
    shm_at_setup = count_our_shm();
    tu_log_capture();
    tu_log_clear();
    tu_use_simdev();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_use_none();
    int bad = 0;
    if (count_our_shm() != shm_at_setup)
        bad = fprintf(stderr, "teardown: /dev/shm changed (%d stoke entries, %d before)\n",
                      count_our_shm(), shm_at_setup);
    if (count_arena_fds() != 0)
        bad = fprintf(stderr, "teardown: %d arena memfd(s) still open\n", count_arena_fds());
    if (count_our_sockets() != 0)
        bad =
            fprintf(stderr, "teardown: %d arena socket name(s) still bound\n", count_our_sockets());
    return bad ? -1 : 0;
}

/* ---- tests ------------------------------------------------------------------------------------
 */

/* Two processes attach to one arena by name: each reads what the other wrote, and the memory
 * is pinned in both. */
static void test_two_processes_share(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "share");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 4 * MIB, &a), STOKE_OK);
    void *p;
    assert_int_equal(stoke_arena_alloc(a, LEN, &p), STOKE_OK);
    assert_int_equal(stoke_is_pinned(p), 1);
    assert_int_equal(stoke_is_pinned((char *)p + LEN - 1), 1);
    fill(p, LEN, 1);
    uint64_t off;
    assert_int_equal(stoke_arena_offset(a, p, &off), STOKE_OK);

    kid k = spawn("share", name, 0, off);
    report r = kid_report(&k);
    assert_int_equal(r.pinned, 1);
    assert_int_equal(r.created, 0);
    assert_int_equal(r.creator_pid, (int)getpid());
    assert_int_equal(r.processes, 2);
    /* the child's writes into our block, and its own block */
    assert_int_equal(first_bad(p, LEN / 2, 1), LEN / 2);
    assert_int_equal(first_bad((unsigned char *)p + LEN / 2, LEN - LEN / 2, 2), LEN - LEN / 2);
    void *q;
    assert_int_equal(stoke_arena_ptr(a, r.off, &q), STOKE_OK);
    assert_int_equal(first_bad(q, LEN, 3), LEN);
    assert_int_equal(stoke_is_pinned(q), 1);
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.bytes_used,
                     2 * ((LEN + st.chunk_bytes - 1) / st.chunk_bytes) * st.chunk_bytes);
    assert_int_equal(st.created, 1);
    assert_int_equal(st.pinned, 1);
    assert_true(st.bytes >= 4 * MIB);
    assert_int_equal(st.requested_bytes, 4 * MIB);

    kid_finish(&k); /* it closes: its block is freed */
    st = stats_of(a);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.bytes_used_self, st.bytes_used);
    assert_int_equal(st.reclaims, 0);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stats_of(a).bytes_used, 0);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* A process killed with SIGKILL while it holds most of the arena: its chunks come back. */
static void test_killed_process_chunks_return(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "kill");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 4 * MIB, &a), STOKE_OK);
    kid k = spawn("hog", name, 0, 3 * MIB);
    kid_report(&k);
    void *p;
    assert_int_equal(stoke_arena_alloc(a, 2 * MIB, &p), STOKE_ENOMEM);
    assert_non_null(strstr(stoke_last_error(), name));
    assert_non_null(strstr(stoke_last_error(), "by 2 processes"));
    kid_kill(&k);
    assert_int_equal(stoke_arena_alloc(a, 2 * MIB, &p), STOKE_OK);
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.reclaims, 1);
    assert_int_equal(st.reclaimed_bytes, 3 * MIB);
    assert_int_equal(st.processes, 1);
    assert_int_equal(st.bytes_used, 2 * MIB);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* A process that recorded a writer (stoke__arena_add_writer: the zygote of its process workers)
 * is SIGKILLed; its writer lives on, writing into its chunk.  While the writer lives, nothing of
 * the dead process is reclaimed (not by stats, not by an allocation that finds no room) and its
 * slot is not handed to a newcomer; once the writer is gone, its chunks come back. */
static void test_writer_keeps_chunks(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "writer");
    stoke_arena *a, *b;
    assert_int_equal(stoke_arena_open(name, 4 * MIB, &a), STOKE_OK);
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 1), 0); /* the writer is reaped here */
    kid k = spawn("writer", name, 0, 3 * MIB);
    int keep = dup(k.to); /* the writer's line: open until it is told to stop */
    assert_true(keep >= 0);
    report r = kid_report(&k);
    pid_t w = r.writer;
    assert_true(w > 0);
    kid_kill(&k);
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.reclaims, 0);
    assert_int_equal(st.bytes_used, 3 * MIB);
    void *p;
    assert_int_equal(stoke_arena_alloc(a, 2 * MIB, &p), STOKE_ENOMEM);
    assert_int_equal(stoke_arena_open(name, 0, &b), STOKE_OK);
    stoke_arena_stats sb = stats_of(b);
    assert_int_equal(sb.slot, 2); /* slot 1 is the dead process's, kept by its writer */
    assert_int_equal(sb.reclaims, 0);
    assert_int_equal(stoke_arena_close(b), STOKE_OK);
    /* the writer stops and is reaped: now everything comes back */
    assert_int_equal(send(keep, "g", 1, MSG_NOSIGNAL), 1);
    int wst = 0;
    assert_int_equal(waitpid(w, &wst, 0), w);
    close(keep);
    assert_int_equal(prctl(PR_SET_CHILD_SUBREAPER, 0), 0);
    assert_int_equal(stoke_arena_alloc(a, 2 * MIB, &p), STOKE_OK);
    st = stats_of(a);
    assert_int_equal(st.reclaims, 1);
    assert_int_equal(st.reclaimed_bytes, 3 * MIB);
    assert_int_equal(st.bytes_used, 2 * MIB);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* A process killed while it holds the arena's lock: the next locker repairs the arena. */
static void test_killed_holding_lock(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "lock");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 4 * MIB, &a), STOKE_OK);
    kid h = spawn("hog", name, 0, 1 * MIB);
    kid_report(&h);
    kid k = spawn("lock", name, 0, 0);
    kid_report(&k); /* it holds the lock now */
    pid_t dead = k.pid;
    kid_kill(&k);
    tu_log_clear();
    void *p;
    assert_int_equal(stoke_arena_alloc(a, 1 * MIB, &p), STOKE_OK);
    char needle[128];
    snprintf(needle, sizeof(needle), "process %d died holding the arena's lock", (int)dead);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, needle), 1);
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.processes, 2); /* the hog is alive and keeps its chunks */
    assert_int_equal(st.bytes_used, 2 * MIB);
    assert_int_equal(st.reclaims, 1); /* the lock holder's (empty) slot */
    kid_finish(&h);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* The creator dies; the others keep the arena, and a new process can still attach. */
static void test_creator_leaves(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "creator");
    kid c = spawn("create", name, 2 * MIB, 0);
    report rc = kid_report(&c);
    assert_int_equal(rc.created, 1);
    kid h = spawn("hog", name, 0, 512 * 1024);
    report rh = kid_report(&h);
    assert_int_equal(rh.created, 0);
    assert_int_equal(rh.creator_pid, (int)c.pid);
    kid_kill(&c); /* the creator is gone */

    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 0, &a), STOKE_OK); /* served by the hog */
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.created, 0);
    assert_int_equal(st.creator_pid, (int)c.pid);
    assert_int_equal(st.processes, 2);
    assert_int_equal(st.bytes_used, 512 * 1024); /* the creator's block came back */
    void *q;
    assert_int_equal(stoke_arena_ptr(a, rh.off, &q), STOKE_OK);
    assert_int_equal(first_bad(q, LEN, 3), LEN);
    assert_int_equal(stoke_is_pinned(q), 1);
    kid_finish(&h);

    /* a new process attaches through us now */
    kid n = spawn("hog", name, 2 * MIB, 4096);
    report rn = kid_report(&n);
    assert_int_equal(rn.created, 0);
    assert_int_equal(rn.processes, 2);
    kid_finish(&n);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* The only process serving the arena is stopped (SIGSTOP: a debugger, a job control stop): an
 * open fails with STOKE_EBUSY naming it after the 2 s wait, and makes no second arena of the
 * name (it once did: a third process then joined one arena while we sat in the other).  Once it
 * goes on, the open attaches. */
static void test_stopped_holder_is_not_nobody(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "stopped");
    kid c = spawn("create", name, 2 * MIB, 0);
    report rc = kid_report(&c);
    assert_int_equal(rc.created, 1);
    assert_int_equal(kill(c.pid, SIGSTOP), 0);
    /* stopped once waitpid says so: kill() returns before every thread of it is (its serving
     * thread answered an open or two under load) */
    int ws = 0;
    assert_int_equal(waitpid(c.pid, &ws, WUNTRACED), c.pid);
    assert_true(WIFSTOPPED(ws));
    stoke_arena *a = NULL;
    int orc = stoke_arena_open(name, 2 * MIB, &a);
    char msg[1024];
    snprintf(msg, sizeof(msg), "%s", stoke_last_error());
    assert_int_equal(kill(c.pid, SIGCONT), 0); /* before any check: a failure leaves it going */
    if (orc != STOKE_EBUSY) {
        if (a)
            stoke_arena_close(a);
        kid_kill(&c);
        fail_msg("open of a stopped holder's arena: %s, not STOKE_EBUSY: %s", stoke_err_name(orc),
                 msg);
    }
    assert_null(a);
    char pid[32];
    snprintf(pid, sizeof(pid), "pid %d", (int)c.pid);
    if (!strstr(msg, "did not answer") || !strstr(msg, pid))
        fail_msg("message: %s", msg);
    assert_int_equal(stoke_arena_open(name, 2 * MIB, &a), STOKE_OK);
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.created, 0);
    assert_int_equal(st.creator_pid, (int)c.pid);
    assert_int_equal(st.processes, 2);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
    kid_finish(&c);
}

/* Processes that open one name at the same moment end up in one arena, made by one of them. */
static void test_racing_creators(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "race");
    enum { N = 6 };
    kid k[N];
    for (int i = 0; i < N; i++)
        k[i] = spawn("race", name, MIB, 0);
    for (int i = 0; i < N; i++)
        kid_go(&k[i]);
    report r[N];
    int creators = 0;
    for (int i = 0; i < N; i++) {
        r[i] = kid_report(&k[i]);
        creators += r[i].created;
    }
    assert_int_equal(creators, 1);
    for (int i = 1; i < N; i++)
        assert_int_equal(r[i].creator_pid, r[0].creator_pid);
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 0, &a), STOKE_OK);
    assert_int_equal(stats_of(a).processes, N + 1);
    for (int i = 0; i < N; i++)
        kid_finish(&k[i]);
    assert_int_equal(stats_of(a).processes, 1);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* Host-block IPC through the arena: a process that is not attached imports an allocation
 * (pinned there by its own registration) and both see the same bytes; misuse is refused. */
static void test_ipc_export(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "ipc");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 2 * MIB, &a), STOKE_OK);
    void *p;
    assert_int_equal(stoke_arena_alloc(a, LEN, &p), STOKE_OK);
    fill(p, LEN, 1);
    stoke_ipc_handle h;
    assert_int_equal(stoke_ipc_export((char *)p + 4096, 0, &h), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "not the start of a live allocation"));
    assert_int_equal(stoke_ipc_export(p, 4 * MIB, &h), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), name));
    assert_int_equal(stoke_ipc_export(p, LEN, &h), STOKE_OK);
    assert_string_equal(h.backend, "arena");
    assert_true(h.fd >= 0);
    kid k = spawn("import", name, 0, 0);
    assert_int_equal(stoke_ipc_send(k.to, &h), STOKE_OK);
    report r = kid_report(&k);
    assert_int_equal(r.pinned, 1);
    kid_finish(&k);
    assert_int_equal(first_bad(p, LEN / 2, 1), LEN / 2);
    assert_int_equal(first_bad((unsigned char *)p + LEN / 2, LEN - LEN / 2, 2), LEN - LEN / 2);
    /* imported in this process too: another mapping of the same bytes */
    void *q;
    assert_int_equal(stoke_ipc_import_device(&h, &(stoke_device_buffer *){NULL}), STOKE_EINVAL);
    assert_int_equal(stoke_ipc_import(&h, &q), STOKE_OK);
    assert_ptr_not_equal(p, q);
    assert_int_equal(stoke_is_pinned(q), 1);
    assert_int_equal(first_bad(q, LEN / 2, 1), LEN / 2);
    assert_int_equal(stoke_ipc_unmap(q), STOKE_OK);
    assert_int_equal(stoke_ipc_unmap(q), STOKE_EINVAL);
    assert_int_equal(stoke_ipc_close(&h), STOKE_OK);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_ipc_export(p, 0, &h), STOKE_EINVAL); /* freed */
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

static void test_errors(void **state)
{
    (void)state;
    char name[64], msg[512];
    name_of(name, sizeof(name), "errors");
    stoke_arena *a, *b;
    assert_int_equal(stoke_arena_open(name, 0, &a), STOKE_ENOENT);
    assert_null(a);
    assert_non_null(strstr(stoke_last_error(), name));
    assert_int_equal(stoke_arena_open(name, 4 * MIB, &a), STOKE_OK);
    /* size mismatch: the arena and both sizes */
    assert_int_equal(stoke_arena_open(name, 8 * MIB, &b), STOKE_EINVAL);
    stoke__strlcpy(msg, stoke_last_error(), sizeof(msg));
    assert_non_null(strstr(msg, name));
    assert_non_null(strstr(msg, "4194304"));
    assert_non_null(strstr(msg, "8388608"));
    /* the same process may attach twice (two slots) */
    assert_int_equal(stoke_arena_open(name, 4 * MIB, &b), STOKE_OK);
    assert_int_equal(stats_of(b).processes, 2);
    void *p, *q;
    assert_int_equal(stoke_arena_alloc(a, 100000, &p), STOKE_OK);
    assert_int_equal(stoke_arena_alloc(a, 5 * MIB, &q), STOKE_ENOMEM);
    assert_non_null(strstr(stoke_last_error(), "has 4194304"));
    assert_int_equal(stoke_arena_free(a, (char *)p + 4096), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "inside an allocation"));
    assert_int_equal(stoke_arena_free(a, (char *)p + 1), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "not the start"));
    assert_int_equal(stoke_arena_ptr(b, 0, &q), STOKE_OK); /* b's view of a's block */
    assert_int_equal(stoke_arena_free(b, q), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "another process")); /* another slot */
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_arena_free(a, p), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "freed twice"));
    assert_int_equal(stoke_arena_ptr(a, 4 * MIB, &q), STOKE_EINVAL);
    assert_int_equal(stoke_arena_offset(a, msg, &(uint64_t){0}), STOKE_EINVAL);
    assert_int_equal(stoke_arena_free(a, NULL), STOKE_OK);
    assert_int_equal(stoke_arena_close(b), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
    assert_int_equal(stoke_arena_close(NULL), STOKE_OK);

    /* names */
    assert_int_equal(stoke_arena_open("", MIB, &a), STOKE_EINVAL);
    assert_int_equal(stoke_arena_open("a/b", MIB, &a), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "'/'"));
    char longname[80];
    memset(longname, 'x', sizeof(longname) - 1);
    longname[sizeof(longname) - 1] = '\0';
    assert_int_equal(stoke_arena_open(longname, MIB, &a), STOKE_EINVAL);
    assert_int_equal(stoke_arena_open(name, MIB, NULL), STOKE_EINVAL);
}

/* Issue 25, item 2: the arena's memfd is sealed, so an importer of an allocation cannot
 * truncate it under every attached process (SIGBUS); an arena handle carrying an unsealed
 * memfd is refused. */
static void test_sealed(void **state)
{
    (void)state;
    char name[64];
    name_of(name, sizeof(name), "sealed");
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 2 * MIB, &a), STOKE_OK);
    void *p;
    assert_int_equal(stoke_arena_alloc(a, LEN, &p), STOKE_OK);
    fill(p, LEN, 1);
    stoke_ipc_handle h;
    assert_int_equal(stoke_ipc_export(p, LEN, &h), STOKE_OK);
    int seals = fcntl(h.fd, F_GET_SEALS);
    assert_true(seals >= 0 && (seals & F_SEAL_SHRINK) && (seals & F_SEAL_GROW));
    assert_int_equal(ftruncate(h.fd, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(h.fd, 1 << 30), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(first_bad(p, LEN, 1), LEN); /* still readable: no SIGBUS */
    assert_int_equal(stats_of(a).bytes_used, (LEN + 4095) / 4096 * 4096);

    /* the same handle with an unsealed memfd of the same size behind it */
    struct stat st;
    assert_int_equal(fstat(h.fd, &st), 0);
    int real = h.fd;
    h.fd = memfd_create("test-unsealed", MFD_CLOEXEC);
    assert_true(h.fd >= 0);
    assert_int_equal(ftruncate(h.fd, st.st_size), 0);
    void *q = NULL;
    assert_int_equal(stoke_ipc_import(&h, &q), STOKE_EINVAL);
    assert_null(q);
    assert_non_null(strstr(stoke_last_error(), "not sealed against shrinking"));
    close(h.fd);
    h.fd = real;
    assert_int_equal(stoke_ipc_import(&h, &q), STOKE_OK);
    assert_int_equal(first_bad(q, LEN, 1), LEN);
    assert_int_equal(stoke_ipc_unmap(q), STOKE_OK);
    assert_int_equal(stoke_ipc_close(&h), STOKE_OK);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* ---- a crafted server of this uid (issue 25, item 1) -------------------------------------- */

/* A memfd holding the header of an arena of `requested` bytes as the library lays it out,
 * changed by `tamper` (1: chunk count, 2: data offset beyond the memfd, 3: a header for 64
 * times the size); sealed or not. */
static int crafted_memfd(uint64_t requested, int tamper, int sealed, uint64_t *len)
{
    uint64_t chunk, nchunks, data_off, map_len;
    assert_int_equal(stoke__arena_layout(requested, &chunk, &nchunks, &data_off, &map_len),
                     STOKE_OK);
    int fd = memfd_create("test-crafted", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)map_len), 0);
    ar_hdr *h = mmap(NULL, map_len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(h != MAP_FAILED);
    h->magic = AR_MAGIC;
    h->version = AR_VERSION;
    h->maxp = AR_MAXP;
    h->requested = requested;
    h->chunk = chunk;
    h->nchunks = nchunks;
    h->data_off = data_off;
    h->map_len = map_len;
    if (tamper == 1)
        h->nchunks = 1ull << 40;
    else if (tamper == 2)
        h->data_off = map_len * 16;
    else if (tamper == 3)
        h->requested = requested * 64;
    munmap(h, map_len);
    if (sealed)
        assert_int_equal(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    *len = map_len;
    return fd;
}

typedef struct crafted {
    int listen_fd, memfd;
    ar_hello hello;
    int served; /* connections answered */
} crafted;

/* Answers one connection with the hello and the memfd, as a serving process would. */
static void *crafted_serve(void *arg)
{
    crafted *c = arg;
    struct pollfd pf = {.fd = c->listen_fd, .events = POLLIN};
    if (poll(&pf, 1, WAIT_S * 1000) <= 0)
        return NULL;
    int s = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (s < 0)
        return NULL;
    if (stoke__sendmsg_fd(s, &c->hello, sizeof(c->hello), c->memfd) == (ssize_t)sizeof(c->hello))
        c->served++;
    close(s);
    return NULL;
}

/* stoke_arena_open(name, 0) against a process of this uid on slot 0 that answers with a memfd
 * of `requested` bytes as crafted; the hello says `said` bytes (0: the true length).  Returns
 * the status; *msg gets the message. */
static int open_crafted(const char *name, int tamper, int sealed, uint64_t said, char *msg,
                        size_t len)
{
    crafted c = {.listen_fd = stoke__arena_bind(name, 0)};
    assert_true(c.listen_fd >= 0);
    assert_int_equal(listen(c.listen_fd, 4), 0);
    uint64_t map_len;
    c.memfd = crafted_memfd(MIB, tamper, sealed, &map_len);
    c.hello = (ar_hello){.magic = AR_MAGIC,
                         .version = AR_VERSION,
                         .pid = (int32_t)getpid(),
                         .requested = MIB,
                         .map_len = said ? said : map_len};
    pthread_t t;
    assert_int_equal(pthread_create(&t, NULL, crafted_serve, &c), 0);
    stoke_arena *a = NULL;
    int rc = stoke_arena_open(name, 0, &a);
    stoke__strlcpy(msg, stoke_last_error(), len);
    pthread_join(t, NULL);
    assert_int_equal(c.served, 1);
    assert_null(a);
    if (a)
        stoke_arena_close(a);
    close(c.listen_fd);
    close(c.memfd);
    return rc;
}

/* Issue 25, item 1: a header that does not describe its memfd (a bad chunk count, data beyond
 * the memfd, a size that is not the memfd's), a hello that lies about the size, or an unsealed
 * memfd: STOKE_EINVAL naming what is wrong, never a crash. */
static void test_crafted_header(void **state)
{
    (void)state;
    char name[64], msg[512];
    name_of(name, sizeof(name), "crafted");
    assert_int_equal(open_crafted(name, 1, 1, 0, msg, sizeof(msg)), STOKE_EINVAL);
    assert_non_null(strstr(msg, "not a valid stoke arena"));
    assert_non_null(strstr(msg, "chunk count"));
    assert_non_null(strstr(msg, "1099511627776")); /* the count it claimed */
    assert_int_equal(open_crafted(name, 2, 1, 0, msg, sizeof(msg)), STOKE_EINVAL);
    assert_non_null(strstr(msg, "data offset"));
    assert_int_equal(open_crafted(name, 3, 1, 0, msg, sizeof(msg)), STOKE_EINVAL);
    assert_non_null(strstr(msg, "not a valid stoke arena"));
    assert_int_equal(open_crafted(name, 0, 1, 1ull << 30, msg, sizeof(msg)), STOKE_EINVAL);
    assert_non_null(strstr(msg, "but said 1073741824"));
    assert_int_equal(open_crafted(name, 0, 0, 0, msg, sizeof(msg)), STOKE_EINVAL);
    assert_non_null(strstr(msg, "not sealed against shrinking"));
    /* nothing was left behind: the name works as usual */
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, MIB, &a), STOKE_OK);
    assert_int_equal(stats_of(a).created, 1);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

static void test_default_name(void **state)
{
    (void)state;
    char buf[80];
    const char *vars[] = {"STOKE_ARENA", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "SLURM_STEP_ID",
                          "OMPI_MCA_ess_base_jobid"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        tu_env(vars[i], NULL);
    stoke_arena *a;
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_ENOENT);
    assert_int_equal(stoke_arena_open(NULL, MIB, &a), STOKE_ENOENT);
    assert_non_null(strstr(stoke_last_error(), "TORCHELASTIC_RUN_ID"));
    tu_env("OMPI_MCA_ess_base_jobid", "1234");
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, "ompi-1234");
    tu_env("SLURM_JOB_ID", "77");
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, "slurm-77.0");
    tu_env("SLURM_STEP_ID", "3");
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, "slurm-77.3");
    tu_env("TORCHELASTIC_RUN_ID", "job/7 x");
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, "torchelastic-job_7_x");
    /* STOKE_ARENA=auto (with or without a size) is the job's arena, not one named "auto" */
    tu_env("STOKE_ARENA", "auto");
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, "torchelastic-job_7_x");
    tu_env("STOKE_ARENA", "auto:64M");
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, "torchelastic-job_7_x");
    tu_env("TORCHELASTIC_RUN_ID", NULL);
    tu_env("SLURM_JOB_ID", NULL);
    tu_env("OMPI_MCA_ess_base_jobid", NULL);
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_ENOENT); /* no job */
    tu_env("TORCHELASTIC_RUN_ID", "job/7 x");
    char name[64], spec[80];
    name_of(name, sizeof(name), "env");
    snprintf(spec, sizeof(spec), "%s:2M", name);
    tu_env("STOKE_ARENA", spec);
    assert_int_equal(stoke_arena_default_name(buf, sizeof(buf)), STOKE_OK);
    assert_string_equal(buf, name);
    assert_int_equal(stoke_arena_open(NULL, MIB, &a), STOKE_OK);
    stoke_arena_stats st = stats_of(a);
    assert_string_equal(st.name, name);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++)
        tu_env(vars[i], NULL);
}

/* Without an accelerator the arena is ordinary shared memory, with the usual one warning. */
static void test_no_accelerator(void **state)
{
    (void)state;
    tu_use_none();
    tu_log_clear();
    char name[64];
    name_of(name, sizeof(name), "none");
    stoke_arena *a, *b;
    assert_int_equal(stoke_arena_open(name, MIB, &a), STOKE_OK);
    assert_int_equal(stoke_arena_open(name, MIB, &b), STOKE_OK);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "pinning is not in effect"), 1);
    void *p;
    assert_int_equal(stoke_arena_alloc(a, 8192, &p), STOKE_OK);
    assert_int_equal(stoke_is_pinned(p), 0);
    fill(p, 8192, 9);
    void *q;
    assert_int_equal(stoke_arena_ptr(b, 0, &q), STOKE_OK);
    assert_ptr_not_equal(p, q);
    assert_int_equal(first_bad(q, 8192, 9), 8192); /* two mappings, one memory */
    assert_int_equal(stats_of(a).pinned, 0);
    assert_int_equal(stoke_arena_free(a, p), STOKE_OK);
    assert_int_equal(stoke_arena_close(b), STOKE_OK);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
}

/* ---- the loader --------------------------------------------------------------------------------
 */

#define DSN 300
#define DSB 1000

static uint64_t ds_len(void *user)
{
    (void)user;
    return DSN;
}

static int ds_get(void *user, uint64_t index, void *const dst[], int64_t lens[], int worker,
                  char *msg, size_t msg_len)
{
    (void)user, (void)worker, (void)msg, (void)msg_len;
    unsigned char *d = dst[0];
    for (size_t k = 0; k < DSB; k++)
        d[k] = (unsigned char)(index * 7u + k * 13u + (k >> 8));
    return STOKE_OK;
}

static void make_ds(stoke_dataset *ds)
{
    stoke_dataset_init(ds);
    ds->kind = STOKE_DATASET_MAP;
    stoke__strlcpy(ds->name, "arena-ds", sizeof(ds->name));
    ds->nfields = 1;
    stoke__strlcpy(TU_F(ds)[0].name, "data", sizeof(TU_F(ds)[0].name));
    TU_F(ds)[0].dtype = STOKE_DTYPE_U8;
    TU_F(ds)[0].itemsize = 1;
    TU_F(ds)[0].ndim = 1;
    TU_SHAPE(ds, 0)[0] = DSB;
    TU_F(ds)[0].bytes = DSB;
    ds->length = ds_len;
    ds->get = ds_get;
}

/* FNV-1a of every delivered batch's data, in order; *pinned: batches that were pinned. */
static uint64_t run_loader(const char *arena, int mode, int *pinned, const char *device)
{
    stoke_dataset ds;
    make_ds(&ds);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 32;
    o.num_workers = 2;
    o.shuffle = 1;
    o.seed = 5;
    o.worker_mode = mode;
    o.arena = arena;
    o.device = device;
    stoke_loader *l;
    int rc = stoke_loader_create(&o, &ds, &l);
    if (rc != STOKE_OK)
        fail_msg("loader create: %s", stoke_last_error());
    uint64_t h = 1469598103934665603ull;
    *pinned = 0;
    stoke_batch *b;
    unsigned char *tmp = malloc(32 * DSB);
    assert_non_null(tmp);
    while ((rc = stoke_loader_next(l, &b)) == STOKE_OK) {
        size_t n = stoke_batch_field_bytes(b, 0);
        const unsigned char *d = stoke_batch_data(b, 0);
        if (device) {
            assert_int_equal(stoke_batch_device_read(b, 0, tmp), STOKE_OK);
            d = tmp;
        }
        for (size_t i = 0; i < n; i++)
            h = (h ^ d[i]) * 1099511628211ull;
        *pinned += stoke_batch_is_pinned(b);
        stoke_batch_release(b);
    }
    free(tmp);
    assert_int_equal(rc, STOKE_EEND);
    stoke_loader_destroy(l);
    return h;
}

static void test_loader_same_bytes(void **state)
{
    (void)state;
    char name[64], spec[96];
    name_of(name, sizeof(name), "loader");
    snprintf(spec, sizeof(spec), "%s:8M", name);
    int nb = (DSN + 31) / 32, pin;
    uint64_t want = run_loader("", STOKE_WORKER_THREADS, &pin, NULL);
    assert_int_equal(pin, nb);
    /* another process holds the arena too, so the loader's buffers are shared memory */
    kid k = spawn("hog", name, 8 * MIB, 4096);
    kid_report(&k);
    for (int mode = 0; mode < 2; mode++) {
        assert_int_equal(run_loader(spec, mode, &pin, NULL), want);
        assert_int_equal(pin, nb);
        assert_int_equal(run_loader(name, mode, &pin, NULL), want); /* attach without a size */
        assert_int_equal(pin, nb);
    }
    assert_int_equal(run_loader(name, STOKE_WORKER_THREADS, &pin, "simdev"), want);
    /* every loader gave its buffers back: only the hog's page is in use */
    stoke_arena *a;
    assert_int_equal(stoke_arena_open(name, 0, &a), STOKE_OK);
    stoke_arena_stats st = stats_of(a);
    assert_int_equal(st.bytes_used, st.chunk_bytes);
    assert_int_equal(st.processes, 2);
    assert_true(st.allocs > 4);
    assert_int_equal(stoke_arena_close(a), STOKE_OK);
    kid_finish(&k);

    /* from the environment; a size the arena cannot hold is a clear error */
    tu_env("STOKE_ARENA", spec);
    assert_int_equal(run_loader(NULL, STOKE_WORKER_THREADS, &pin, NULL), want);
    tu_env("STOKE_ARENA", NULL);
    snprintf(spec, sizeof(spec), "%s:64K", name);
    stoke_dataset ds;
    make_ds(&ds);
    stoke_loader_opts o;
    stoke_loader_opts_init(&o);
    o.batch_size = 32;
    o.arena = spec;
    stoke_loader *l;
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_ENOMEM);
    assert_non_null(strstr(stoke_last_error(), name));
    o.arena = "x:12Q";
    assert_int_equal(stoke_loader_create(&o, &ds, &l), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "not a size"));
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "arena-child") == 0)
        return child_main(argv[2], argv[3], (size_t)strtoull(argv[4], NULL, 10),
                          strtoull(argv[5], NULL, 10));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_two_processes_share, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_process_chunks_return, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_keeps_chunks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_killed_holding_lock, setup, teardown),
        cmocka_unit_test_setup_teardown(test_creator_leaves, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stopped_holder_is_not_nobody, setup, teardown),
        cmocka_unit_test_setup_teardown(test_racing_creators, setup, teardown),
        cmocka_unit_test_setup_teardown(test_ipc_export, setup, teardown),
        cmocka_unit_test_setup_teardown(test_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_sealed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_crafted_header, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_accelerator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loader_same_bytes, setup, teardown),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
