/* IPC (stoke/ipc.h): pinned host blocks and device buffers shared between two processes on
 * simdev, in both directions and after the exporter exited; misuse of handles and memory gives
 * clear errors; backends without IPC say so; the registry checks the ABI v2 IPC group; `stoke
 * devices` shows IPC support.  No memfd descriptor and no /dev/shm entry is left behind.
 *
 * The second process is this executable run again (fork + exec, so that the child starts with
 * no thread and no state of the parent): `test_ipc --ipc-child MODE FD`, talking over a Unix
 * socket pair. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"
#include "testutil.h"

#define N_HOST (256u * 1024u + 123u) /* not a class size: the block is larger than the share */
#define N_DEV  (192u * 1024u)
#define WAIT_S 60 /* bound on every wait for the other process */

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 131u + seed * 29u + (i >> 9));
}

/* Index of the first wrong byte, or n. */
static size_t first_bad(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 131u + seed * 29u + (i >> 9)))
            return i;
    return n;
}

static void set_timeouts(int sock)
{
    struct timeval tv = {.tv_sec = WAIT_S};
    setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

/* Descriptors of this process that are simdev memfds. */
static int count_simdev_fds(void)
{
    return tu_count_fds_to("memfd:simdev");
}

/* Entries of /dev/shm that stoke or simdev could have made (none are expected: memfds have
 * no name there). */
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

static int shm_at_start, fds_at_setup;

static int setup(void **state)
{
    (void)state;
    fds_at_setup = count_simdev_fds();
    tu_log_capture();
    tu_log_clear();
    tu_use_simdev();
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    tu_use_none(); /* simdev shuts down: every block and buffer it made is gone */
    int fds = count_simdev_fds();
    if (fds != fds_at_setup) {
        fprintf(stderr, "teardown: %d simdev memfd descriptor(s) open, %d before the test\n", fds,
                fds_at_setup);
        return -1;
    }
    return 0;
}

/* ---- the child process ----------------------------------------------------------------------- */

#define CHILD_FAIL(code, ...)                                                                      \
    do {                                                                                           \
        fprintf(stderr, "ipc child: " __VA_ARGS__);                                                \
        fprintf(stderr, " (%s)\n", stoke_last_error());                                            \
        return code;                                                                               \
    } while (0)

/* Host blocks both ways: imports the parent's block (seed 1), checks it, writes seed 2 into it;
 * then exports its own block (seed 3) and, after the parent's ack, expects seed 4 in it. */
static int child_host(int sock)
{
    stoke_ipc_handle h;
    void *p = NULL;
    int rc = stoke_ipc_recv(sock, &h);
    if (rc != STOKE_OK)
        CHILD_FAIL(10, "recv: %s", stoke_err_name(rc));
    if ((rc = stoke_ipc_import(&h, &p)) != STOKE_OK)
        CHILD_FAIL(11, "import: %s", stoke_err_name(rc));
    if (stoke_is_pinned(p) != 1 || h.size != N_HOST)
        CHILD_FAIL(12, "import not pinned or of %llu bytes", (unsigned long long)h.size);
    if (first_bad(p, N_HOST, 1) != N_HOST)
        CHILD_FAIL(13, "parent's data differ at byte %zu", first_bad(p, N_HOST, 1));
    fill(p, N_HOST, 2);
    if (stoke_ipc_unmap(p) != STOKE_OK || stoke_ipc_close(&h) != STOKE_OK)
        CHILD_FAIL(14, "unmap/close");

    void *mine = NULL;
    stoke_ipc_handle e;
    if ((rc = stoke_pinned_alloc(N_HOST, &mine)) != STOKE_OK)
        CHILD_FAIL(15, "pinned_alloc: %s", stoke_err_name(rc));
    fill(mine, N_HOST, 3);
    if ((rc = stoke_ipc_export(mine, N_HOST, &e)) != STOKE_OK)
        CHILD_FAIL(16, "export: %s", stoke_err_name(rc));
    if ((rc = stoke_ipc_send(sock, &e)) != STOKE_OK)
        CHILD_FAIL(17, "send: %s", stoke_err_name(rc));
    stoke_ipc_close(&e);
    char ack;
    if (read(sock, &ack, 1) != 1)
        CHILD_FAIL(18, "no ack from the parent");
    if (first_bad(mine, N_HOST, 4) != N_HOST)
        CHILD_FAIL(19, "parent's writes differ at byte %zu", first_bad(mine, N_HOST, 4));
    stoke_pinned_free(mine);
    return 0;
}

/* A device buffer: reads the parent's seed 5 through a copy, writes seed 6 back, acks. */
static int child_device(int sock)
{
    stoke_ipc_handle h;
    stoke_device_buffer *b = NULL;
    stoke_stream *s = NULL;
    void *stage = NULL;
    int rc = stoke_ipc_recv(sock, &h);
    if (rc != STOKE_OK)
        CHILD_FAIL(20, "recv: %s", stoke_err_name(rc));
    if ((rc = stoke_ipc_import_device(&h, &b)) != STOKE_OK)
        CHILD_FAIL(21, "import_device: %s", stoke_err_name(rc));
    stoke_ipc_close(&h);
    if (stoke_device_buffer_size(b) != N_DEV)
        CHILD_FAIL(22, "imported buffer of %zu bytes", stoke_device_buffer_size(b));
    if (stoke_stream_create(NULL, &s) != STOKE_OK || stoke_pinned_alloc(N_DEV, &stage) != STOKE_OK)
        CHILD_FAIL(23, "stream or staging");
    if ((rc = stoke_copy_d2h_async(stage, b, 0, N_DEV, s)) != STOKE_OK ||
        (rc = stoke_stream_synchronize(s)) != STOKE_OK)
        CHILD_FAIL(24, "d2h: %s", stoke_err_name(rc));
    if (first_bad(stage, N_DEV, 5) != N_DEV)
        CHILD_FAIL(25, "parent's device data differ at byte %zu", first_bad(stage, N_DEV, 5));
    fill(stage, N_DEV, 6);
    if ((rc = stoke_copy_h2d_async(b, 0, stage, N_DEV, s)) != STOKE_OK ||
        (rc = stoke_stream_synchronize(s)) != STOKE_OK)
        CHILD_FAIL(26, "h2d: %s", stoke_err_name(rc));
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
    stoke_pinned_free(stage);
    char ack = 'k';
    if (write(sock, &ack, 1) != 1)
        CHILD_FAIL(27, "ack");
    return 0;
}

/* Exports a block (seed 7) and exits at once, closing nothing. */
static int child_exit_early(int sock)
{
    void *mine = NULL;
    stoke_ipc_handle e;
    int rc = stoke_pinned_alloc(N_HOST, &mine);
    if (rc != STOKE_OK)
        CHILD_FAIL(30, "pinned_alloc: %s", stoke_err_name(rc));
    fill(mine, N_HOST, 7);
    if ((rc = stoke_ipc_export(mine, 0, &e)) != STOKE_OK)
        CHILD_FAIL(31, "export: %s", stoke_err_name(rc));
    if ((rc = stoke_ipc_send(sock, &e)) != STOKE_OK)
        CHILD_FAIL(32, "send: %s", stoke_err_name(rc));
    return 0;
}

static int child_main(const char *mode, const char *fd_text)
{
    int sock = atoi(fd_text);
    set_timeouts(sock);
    int rc = strcmp(mode, "host") == 0         ? child_host(sock)
             : strcmp(mode, "device") == 0     ? child_device(sock)
             : strcmp(mode, "exit-early") == 0 ? child_exit_early(sock)
                                               : 99;
    close(sock);
    return rc;
}

/* ---- the parent side ------------------------------------------------------------------------- */

typedef struct peer {
    pid_t pid;
    int sock;
} peer;

/* Starts `test_ipc --ipc-child MODE FD`; the environment (STOKE_PLUGIN_PATH = simdev) goes
 * along. */
static peer spawn(const char *mode)
{
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    assert_true(n > 0);
    exe[n] = '\0';
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        int fd = dup(sv[1]); /* without CLOEXEC: the exec'd child inherits it */
        char fd_text[16];
        snprintf(fd_text, sizeof(fd_text), "%d", fd);
        execl(exe, exe, "--ipc-child", mode, fd_text, (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    set_timeouts(sv[0]);
    return (peer){.pid = pid, .sock = sv[0]};
}

/* Waits (at most WAIT_S seconds; then kills it) for the child and returns its exit status. */
static int reap(peer *p)
{
    int status = 0;
    struct timespec nap = {0, 10 * 1000 * 1000};
    for (int i = 0; i < WAIT_S * 100; i++) {
        pid_t got = waitpid(p->pid, &status, WNOHANG);
        if (got == p->pid)
            break;
        if (got < 0 && errno != EINTR)
            fail_msg("waitpid: %s", strerror(errno));
        if (i == WAIT_S * 100 - 1) {
            kill(p->pid, SIGKILL);
            waitpid(p->pid, &status, 0);
            fail_msg("the child did not finish within %d s", WAIT_S);
        }
        nanosleep(&nap, NULL);
    }
    if (p->sock >= 0)
        close(p->sock);
    p->sock = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static void expect_ok(int rc, const char *what)
{
    if (rc != STOKE_OK) {
        tu_log_dump();
        fail_msg("%s: %s (%s)", what, stoke_err_name(rc), stoke_last_error());
    }
}

static void expect_err(int rc, int want, const char *needle)
{
    if (rc != want || !strstr(stoke_last_error(), needle))
        fail_msg("got %s \"%s\", expected %s with \"%s\"", stoke_err_name(rc), stoke_last_error(),
                 stoke_err_name(want), needle);
}

/* Host blocks, parent -> child and child -> parent. */
static void test_host_both_ways(void **state)
{
    (void)state;
    peer c = spawn("host");
    void *block = NULL;
    expect_ok(stoke_pinned_alloc(N_HOST, &block), "pinned_alloc");
    fill(block, N_HOST, 1);
    stoke_ipc_handle h;
    expect_ok(stoke_ipc_export(block, N_HOST, &h), "export");
    assert_int_equal(h.kind, STOKE_IPC_HOST);
    assert_int_equal(h.size, N_HOST);
    assert_string_equal(h.backend, "simdev");
    assert_true(h.fd >= 0);
    expect_ok(stoke_ipc_send(c.sock, &h), "send");
    expect_ok(stoke_ipc_close(&h), "close");
    assert_int_equal(h.fd, -1);

    /* The child's handle arrives after it wrote seed 2 into our block. */
    stoke_ipc_handle theirs;
    expect_ok(stoke_ipc_recv(c.sock, &theirs), "recv");
    assert_int_equal(first_bad(block, N_HOST, 2), N_HOST);
    assert_true(theirs.pid == (int64_t)c.pid);
    void *p = NULL;
    expect_ok(stoke_ipc_import(&theirs, &p), "import");
    assert_int_equal(stoke_is_pinned(p), 1);
    assert_int_equal(first_bad(p, N_HOST, 3), N_HOST);
    fill(p, N_HOST, 4);
    expect_ok(stoke_ipc_unmap(p), "unmap");
    expect_ok(stoke_ipc_close(&theirs), "close theirs");
    char ack = 'k';
    assert_int_equal(write(c.sock, &ack, 1), 1);
    assert_int_equal(reap(&c), 0);
    assert_int_equal(stoke_pinned_free(block), STOKE_OK);
    struct stoke_simdev_counters ctr = tu_simdev_counters();
    assert_int_equal(ctr.ipc_exports, 1);
    assert_int_equal(ctr.ipc_imports, 1);
    assert_int_equal(ctr.live_host_imports, 0);
}

/* A device buffer: the child reads it through a copy and writes it back. */
static void test_device_buffer(void **state)
{
    (void)state;
    peer c = spawn("device"); /* before this process starts stream threads */
    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL;
    void *stage = NULL;
    expect_ok(stoke_stream_create(NULL, &s), "stream");
    expect_ok(stoke_device_buffer_create(s, N_DEV, &b), "buffer");
    expect_ok(stoke_pinned_alloc(N_DEV, &stage), "staging");
    fill(stage, N_DEV, 5);
    expect_ok(stoke_copy_h2d_async(b, 0, stage, N_DEV, s), "h2d");
    expect_ok(stoke_stream_synchronize(s), "sync");
    stoke_ipc_handle h;
    expect_ok(stoke_ipc_export_device(b, &h), "export_device");
    assert_int_equal(h.kind, STOKE_IPC_DEVICE);
    assert_int_equal(h.size, N_DEV);
    expect_ok(stoke_ipc_send(c.sock, &h), "send");
    expect_ok(stoke_ipc_close(&h), "close");
    char ack = 0;
    assert_int_equal(read(c.sock, &ack, 1), 1);
    assert_int_equal(reap(&c), 0);
    memset(stage, 0, N_DEV);
    expect_ok(stoke_copy_d2h_async(stage, b, 0, N_DEV, s), "d2h");
    expect_ok(stoke_stream_synchronize(s), "sync");
    assert_int_equal(first_bad(stage, N_DEV, 6), N_DEV);
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
    stoke_pinned_free(stage);
    assert_int_equal(tu_simdev_counters().live_device_imports, 0);
}

/* The memory outlives an exporter that exited without closing anything. */
static void test_exporter_exits(void **state)
{
    (void)state;
    peer c = spawn("exit-early");
    stoke_ipc_handle h;
    expect_ok(stoke_ipc_recv(c.sock, &h), "recv");
    assert_int_equal(reap(&c), 0);
    void *p = NULL;
    expect_ok(stoke_ipc_import(&h, &p), "import after the exporter exited");
    expect_ok(stoke_ipc_close(&h), "close");
    assert_int_equal(first_bad(p, N_HOST, 7), N_HOST);
    expect_ok(stoke_ipc_unmap(p), "unmap");
}

/* Handles used wrongly, in one process. */
static void test_handle_misuse(void **state)
{
    (void)state;
    void *block = NULL;
    expect_ok(stoke_pinned_alloc(65536, &block), "pinned_alloc");
    fill(block, 65536, 8);
    stoke_ipc_handle h, g;
    expect_ok(stoke_ipc_export(block, 0, &h), "export");
    assert_int_equal(h.size, stoke_pinned_round_size(65536));

    /* Importing in the exporting process works too, and shares the bytes. */
    void *p = NULL;
    expect_ok(stoke_ipc_import(&h, &p), "import");
    assert_ptr_not_equal(p, block);
    assert_int_equal(first_bad(p, 65536, 8), 65536);
    ((unsigned char *)p)[100] ^= 0xff;
    assert_int_equal(((unsigned char *)block)[100], ((unsigned char *)p)[100]);
    expect_ok(stoke_ipc_unmap(p), "unmap");
    expect_err(stoke_ipc_unmap(p), STOKE_EINVAL, "not a live import");

    expect_err(stoke_ipc_import(NULL, &p), STOKE_EINVAL, "handle is NULL");
    g = h;
    g.magic = 0x12345678;
    expect_err(stoke_ipc_import(&g, &p), STOKE_EINVAL, "not a stoke IPC handle");
    g = h;
    memset(g.blob, 0xa5, sizeof(g.blob));
    expect_err(stoke_ipc_import(&g, &p), STOKE_EINVAL, "blob is not simdev's");
    g = h;
    g.blob_len = 3;
    expect_err(stoke_ipc_import(&g, &p), STOKE_EINVAL, "blob has 3 bytes");
    g = h;
    g.size = h.size + 65536;
    expect_err(stoke_ipc_import(&g, &p), STOKE_EINVAL, "has only");
    g = h;
    snprintf(g.backend, sizeof(g.backend), "cuda");
    expect_err(stoke_ipc_import(&g, &p), STOKE_EINVAL, "comes from backend cuda");
    g = h;
    g.fd = -1;
    expect_err(stoke_ipc_import(&g, &p), STOKE_EINVAL, "is not a memfd");
    stoke_device_buffer *db = NULL;
    expect_err(stoke_ipc_import_device(&h, &db), STOKE_EINVAL,
               "is of a pinned host block; use stoke_ipc_import");
    assert_null(db);

    /* Memory that is not a stoke pinned block, or not all of one. */
    char *heap = malloc(8192);
    expect_err(stoke_ipc_export(heap, 0, &g), STOKE_EINVAL, "is not a stoke pinned block");
    free(heap);
    expect_err(stoke_ipc_export((char *)block + 4096, 0, &g), STOKE_EINVAL,
               "is not a stoke pinned block");
    expect_err(stoke_ipc_export(block, h.size + 1, &g), STOKE_EINVAL, "bytes asked");
    expect_err(stoke_ipc_export(block, 0, NULL), STOKE_EINVAL, "out is NULL");

    /* Closed handles. */
    expect_ok(stoke_ipc_close(&h), "close");
    expect_err(stoke_ipc_close(&h), STOKE_EINVAL, "the handle is closed");
    expect_err(stoke_ipc_import(&h, &p), STOKE_EINVAL, "the handle is closed");
    expect_err(stoke_ipc_send(0, &h), STOKE_EINVAL, "the handle is closed");

    expect_ok(stoke_pinned_free(block), "free");
    expect_err(stoke_ipc_export(block, 0, &g), STOKE_EINVAL, "is not a stoke pinned block");
    assert_int_equal(tu_simdev_counters().live_host_imports, 0);
}

/* Device handles used wrongly; an in-process device import shares the buffer. */
static void test_device_misuse(void **state)
{
    (void)state;
    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL, *imp = NULL;
    expect_ok(stoke_stream_create(NULL, &s), "stream");
    expect_ok(stoke_device_buffer_create(s, 8192, &b), "buffer");
    stoke_ipc_handle h;
    expect_ok(stoke_ipc_export_device(b, &h), "export");
    void *p = NULL;
    expect_err(stoke_ipc_import(&h, &p), STOKE_EINVAL,
               "is of a device buffer; use stoke_ipc_import_device");
    stoke_ipc_handle g;
    expect_err(stoke_ipc_export_device(NULL, &g), STOKE_EINVAL, "buffer is NULL");
    expect_ok(stoke_ipc_import_device(&h, &imp), "import");
    expect_ok(stoke_ipc_close(&h), "close");
    unsigned char in[8192], out[8192];
    fill(in, sizeof(in), 9);
    expect_ok(stoke_copy_h2d_async(imp, 0, in, sizeof(in), s), "h2d into the import");
    expect_ok(stoke_copy_d2h_async(out, b, 0, sizeof(out), s), "d2h from the original");
    expect_ok(stoke_stream_synchronize(s), "sync");
    assert_memory_equal(in, out, sizeof(in));
    expect_err(stoke_copy_h2d_async(imp, 1, in, sizeof(in), s), STOKE_ERANGE, "");
    stoke_device_buffer_destroy(imp); /* undoes the import; the original stays */
    assert_int_equal(tu_simdev_counters().live_device_imports, 0);
    assert_int_equal(tu_simdev_counters().live_device_buffers, 1);
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
}

/* Sockets: a peer gone, a timeout, a handle whose descriptor did not come with it. */
static void test_socket_errors(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    stoke_ipc_handle h;
    struct timeval tv = {.tv_usec = 20000};
    setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_ETIMEDOUT, "timed out");

    void *block = NULL;
    expect_ok(stoke_pinned_alloc(4096, &block), "alloc");
    stoke_ipc_handle real;
    expect_ok(stoke_ipc_export(block, 0, &real), "export");
    /* The bytes alone, as a plain write: no SCM_RIGHTS. */
    assert_int_equal(write(sv[1], &real, sizeof(real)), (ssize_t)sizeof(real));
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_EINVAL, "carries a file descriptor, but none");
    assert_int_equal(h.fd, -1);
    /* Garbage bytes. */
    unsigned char junk[sizeof(stoke_ipc_handle)];
    memset(junk, 0x5a, sizeof(junk));
    assert_int_equal(write(sv[1], junk, sizeof(junk)), (ssize_t)sizeof(junk));
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_EINVAL, "not a stoke IPC handle");
    /* A good one, then the peer closes. */
    expect_ok(stoke_ipc_send(sv[1], &real), "send");
    expect_ok(stoke_ipc_recv(sv[0], &h), "recv");
    assert_true(h.fd >= 0 && h.fd != real.fd);
    expect_ok(stoke_ipc_close(&h), "close received");
    close(sv[1]);
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_EEND, "peer closed the socket");
    close(sv[0]);
    expect_ok(stoke_ipc_close(&real), "close");
    stoke_pinned_free(block);
}

/* Issue 25, item 20: on a SOCK_SEQPACKET socket one message is one handle.  A short message is
 * an error for itself alone; the valid handle sent behind it is still the next call's. */
static void test_seqpacket_short_message(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv), 0);
    struct timeval tv = {.tv_sec = 5}; /* a bug that eats the handle fails instead of hanging */
    setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    void *block = NULL;
    expect_ok(stoke_pinned_alloc(N_HOST, &block), "alloc");
    fill(block, N_HOST, 7);
    stoke_ipc_handle real, h;
    expect_ok(stoke_ipc_export(block, 0, &real), "export");
    /* a short message (the first 40 bytes of a handle, with a descriptor), then the handle */
    int spare = fcntl(real.fd, F_DUPFD_CLOEXEC, 0);
    assert_true(spare >= 0);
    struct iovec iov = {.iov_base = &real, .iov_len = 40};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = ctl.buf,
                         .msg_controllen = sizeof(ctl.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &spare, sizeof(int));
    assert_int_equal(sendmsg(sv[1], &msg, 0), 40);
    close(spare);
    expect_ok(stoke_ipc_send(sv[1], &real), "send");
    /* and a message longer than a handle, then the handle again */
    char longer[sizeof(stoke_ipc_handle) + 8];
    memcpy(longer, &real, sizeof(real));
    assert_int_equal(send(sv[1], longer, sizeof(longer), 0), (ssize_t)sizeof(longer));
    expect_ok(stoke_ipc_send(sv[1], &real), "send");

    int fds_before = count_simdev_fds();
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_EINVAL, "message of 40 bytes is not a handle");
    assert_int_equal(h.fd, -1);
    assert_int_equal(count_simdev_fds(), fds_before); /* the short message's fd was closed */
    expect_ok(stoke_ipc_recv(sv[0], &h), "recv after the short message");
    assert_int_equal(h.size, real.size);
    assert_true(h.fd >= 0);
    void *p = NULL;
    expect_ok(stoke_ipc_import(&h, &p), "import");
    assert_int_equal(first_bad(p, N_HOST, 7), N_HOST);
    expect_ok(stoke_ipc_unmap(p), "unmap");
    expect_ok(stoke_ipc_close(&h), "close");
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_EINVAL, "is not a handle");
    expect_ok(stoke_ipc_recv(sv[0], &h), "recv after the long message");
    assert_int_equal(h.size, real.size);
    expect_ok(stoke_ipc_close(&h), "close");
    close(sv[1]);
    expect_err(stoke_ipc_recv(sv[0], &h), STOKE_EEND, "peer closed");
    close(sv[0]);
    expect_ok(stoke_ipc_close(&real), "close real");
    stoke_pinned_free(block);
}

/* Issue 25, item 2: what an importer receives cannot be truncated under the exporter (which
 * would die of SIGBUS): host blocks and device buffers are sealed before they are exported. */
static void test_exports_sealed(void **state)
{
    (void)state;
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    set_timeouts(sv[0]);
    void *block = NULL;
    expect_ok(stoke_pinned_alloc(N_HOST, &block), "alloc");
    fill(block, N_HOST, 8);
    stoke_ipc_handle h, got;
    expect_ok(stoke_ipc_export(block, 0, &h), "export");
    expect_ok(stoke_ipc_send(sv[1], &h), "send");
    expect_ok(stoke_ipc_recv(sv[0], &got), "recv");
    int seals = fcntl(got.fd, F_GET_SEALS);
    assert_true(seals >= 0);
    assert_true(seals & F_SEAL_SHRINK);
    assert_true(seals & F_SEAL_GROW);
    errno = 0;
    assert_int_equal(ftruncate(got.fd, 0), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(ftruncate(got.fd, 1 << 30), -1);
    assert_int_equal(errno, EPERM);
    assert_int_equal(fcntl(got.fd, F_ADD_SEALS, F_SEAL_WRITE), -1); /* F_SEAL_SEAL */
    /* the importer still maps it; the exporter's bytes are all there */
    void *p = NULL;
    expect_ok(stoke_ipc_import(&got, &p), "import");
    assert_int_equal(first_bad(p, N_HOST, 8), N_HOST);
    expect_ok(stoke_ipc_unmap(p), "unmap");
    assert_int_equal(first_bad(block, N_HOST, 8), N_HOST);
    expect_ok(stoke_ipc_close(&got), "close got");
    expect_ok(stoke_ipc_close(&h), "close");
    stoke_pinned_free(block);

    /* a device buffer */
    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL;
    expect_ok(stoke_stream_create(NULL, &s), "stream");
    expect_ok(stoke_device_buffer_create(s, N_DEV, &b), "buffer");
    expect_ok(stoke_ipc_export_device(b, &h), "export_device");
    expect_ok(stoke_ipc_send(sv[1], &h), "send");
    expect_ok(stoke_ipc_recv(sv[0], &got), "recv");
    assert_int_equal(ftruncate(got.fd, 0), -1);
    assert_int_equal(errno, EPERM);
    stoke_device_buffer *imp = NULL;
    expect_ok(stoke_ipc_import_device(&got, &imp), "import_device");
    stoke_device_buffer_destroy(imp);
    expect_ok(stoke_ipc_close(&got), "close got");
    expect_ok(stoke_ipc_close(&h), "close");
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
    close(sv[0]);
    close(sv[1]);
}

/* A memfd of the size of `like`'s file, without seals. */
static int unsealed_memfd(int like)
{
    struct stat st;
    assert_int_equal(fstat(like, &st), 0);
    int fd = memfd_create("simdev-unsealed", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, st.st_size), 0);
    return fd;
}

/* Issue 25, item 2: a handle whose memfd is not sealed (a holder could truncate it under the
 * import) is refused, host and device. */
static void test_unsealed_import_refused(void **state)
{
    (void)state;
    void *block = NULL;
    expect_ok(stoke_pinned_alloc(N_HOST, &block), "alloc");
    stoke_ipc_handle h;
    expect_ok(stoke_ipc_export(block, 0, &h), "export");
    int real = h.fd;
    h.fd = unsealed_memfd(real);
    void *p = NULL;
    expect_err(stoke_ipc_import(&h, &p), STOKE_EINVAL, "not sealed against shrinking");
    assert_null(p);
    close(h.fd);
    h.fd = real;
    expect_ok(stoke_ipc_import(&h, &p), "import of the sealed one");
    expect_ok(stoke_ipc_unmap(p), "unmap");
    expect_ok(stoke_ipc_close(&h), "close");
    stoke_pinned_free(block);

    stoke_stream *s = NULL;
    stoke_device_buffer *b = NULL, *imp = NULL;
    expect_ok(stoke_stream_create(NULL, &s), "stream");
    expect_ok(stoke_device_buffer_create(s, N_DEV, &b), "buffer");
    expect_ok(stoke_ipc_export_device(b, &h), "export_device");
    real = h.fd;
    h.fd = unsealed_memfd(real);
    expect_err(stoke_ipc_import_device(&h, &imp), STOKE_EINVAL, "not sealed against shrinking");
    assert_null(imp);
    close(h.fd);
    h.fd = real;
    expect_ok(stoke_ipc_close(&h), "close");
    stoke_device_buffer_destroy(b);
    stoke_stream_destroy(s);
}

static const char *plugin(const char *file)
{
    static char buf[PATH_MAX];
    return tu_test_plugin(file, buf, sizeof(buf));
}

/* A backend without IPC: STOKE_ENOTSUP naming it; a handle of another backend: STOKE_EINVAL. */
static void test_backend_without_ipc(void **state)
{
    (void)state;
    tu_env("STOKE_PLUGIN_PATH", plugin("alpha.so"));
    assert_int_equal(stoke_ipc_supported(NULL), 0);
    void *block = NULL;
    expect_ok(stoke_pinned_alloc(4096, &block), "alloc");
    stoke_ipc_handle h;
    expect_err(stoke_ipc_export(block, 0, &h), STOKE_ENOTSUP, "backend alpha does not support IPC");
    assert_int_equal(h.fd, -1);
    assert_int_not_equal(h.magic, STOKE_IPC_MAGIC);
    stoke_pinned_free(block);

    stoke_ipc_handle fake = {.magic = STOKE_IPC_MAGIC,
                             .version = STOKE_IPC_VERSION,
                             .kind = STOKE_IPC_HOST,
                             .size = 4096,
                             .backend = "alpha",
                             .fd = -1};
    void *p = NULL;
    expect_err(stoke_ipc_import(&fake, &p), STOKE_ENOTSUP, "backend alpha does not support IPC");
    snprintf(fake.backend, sizeof(fake.backend), "simdev");
    expect_err(stoke_ipc_import(&fake, &p), STOKE_EINVAL,
               "comes from backend simdev (process 0), but the chosen accelerator is alpha");

    /* No accelerator at all. */
    tu_use_none();
    expect_err(stoke_ipc_import(&fake, &p), STOKE_ENODEV, "no accelerator to import into");
    expect_ok(stoke_pinned_alloc(4096, &block), "alloc without accelerator");
    expect_err(stoke_ipc_export(block, 0, &h), STOKE_EINVAL, "ordinary memory, not pinned");
    stoke_pinned_free(block);
}

/* OpenCL (PoCL's CPU device here, chosen explicitly) has no IPC and says why. */
static void test_opencl_unsupported(void **state)
{
    (void)state;
    tu_env("STOKE_PLUGIN_PATH", NULL);
    tu_env("STOKE_ACCELERATOR", "opencl");
    stoke_accelerator_info acc;
    if (stoke_accelerator_get(&acc) != STOKE_OK || strcmp(acc.backend, "opencl") != 0) {
        tu_env("STOKE_ACCELERATOR", NULL);
        tu_skip("no OpenCL platform here: %s", stoke_last_error());
    }
    assert_int_equal(stoke_ipc_supported(NULL), 0);
    void *block = NULL;
    stoke_ipc_handle h;
    expect_ok(stoke_pinned_alloc(4096, &block), "alloc");
    expect_err(stoke_ipc_export(block, 0, &h), STOKE_ENOTSUP,
               "backend opencl does not support IPC (OpenCL has no portable way");
    stoke_pinned_free(block);
    tu_env("STOKE_ACCELERATOR", NULL);
}

/* The registry: the IPC group is all-or-none; a v1 table never has IPC, whatever it claims. */
static void test_registry_ipc_group(void **state)
{
    (void)state;
    assert_int_equal(stoke_ipc_supported("simdev"), 1);
    assert_int_equal(stoke_plugin_load(plugin("half_ipc.so")), STOKE_EABI);
    assert_non_null(strstr(stoke_last_error(), "function ipc_import_mem is missing"));
    assert_int_equal(stoke_plugin_load(plugin("v2_small.so")), STOKE_EABI);
    assert_non_null(strstr(stoke_last_error(), "is smaller than ABI v2's"));
    expect_ok(stoke_plugin_load(plugin("v1_ipc.so")), "load v1 plugin");
    assert_int_equal(stoke_ipc_supported("oldipc"), 0);
    int n = stoke_backend_count(), seen = 0;
    for (int i = 0; i < n; i++) {
        stoke_backend_info b;
        expect_ok(stoke_backend_get_info(i, &b), "info");
        if (strcmp(b.name, "oldipc") == 0) {
            seen |= 1;
            assert_int_equal(b.caps & STOKE_CAP_IPC, 0);
        } else if (strcmp(b.name, "simdev") == 0) {
            seen |= 2;
            assert_int_equal(b.caps & STOKE_CAP_IPC, STOKE_CAP_IPC);
        }
    }
    assert_int_equal(seen, 3);
    expect_ok(stoke_accelerator_select("oldipc"), "select oldipc");
    void *block = NULL;
    stoke_ipc_handle h;
    expect_ok(stoke_pinned_alloc(4096, &block), "alloc");
    expect_err(stoke_ipc_export(block, 0, &h), STOKE_ENOTSUP,
               "backend oldipc does not support IPC (its plugin implements backend ABI v1)");
    stoke_pinned_free(block);
}

/* `stoke devices` says which backends support IPC. */
static void test_cli_devices(void **state)
{
    (void)state;
    char out[16384], err[4096];
    const char *env[] = {tu_simdev_env(), "STOKE_ACCELERATOR=", NULL};
    const char *json[] = {"--json", NULL};
    assert_int_equal(tu_run_cli(env, "devices", json, out, sizeof(out), err, sizeof(err)), 0);
    const char *sd = strstr(out, "{\"name\": \"simdev\"");
    const char *cuda = strstr(out, "{\"name\": \"cuda\"");
    assert_non_null(sd);
    assert_non_null(cuda);
    const char *ipc_sd = strstr(sd, "\"ipc\": ");
    const char *ipc_cuda = strstr(cuda, "\"ipc\": ");
    assert_non_null(ipc_sd);
    assert_non_null(ipc_cuda);
    assert_int_equal(strncmp(ipc_sd, "\"ipc\": true", 11), 0);
    assert_int_equal(strncmp(ipc_cuda, "\"ipc\": false", 12), 0); /* unavailable here */
    const char *none[] = {NULL};
    assert_int_equal(tu_run_cli(env, "devices", none, out, sizeof(out), err, sizeof(err)), 0);
    const char *line = strstr(out, "\n  simdev ");
    assert_non_null(line);
    const char *eol = strchr(line + 1, '\n');
    const char *yes = strstr(line, "ipc: yes");
    if (!yes || !eol || yes > eol)
        fail_msg("no \"ipc: yes\" on simdev's line of:\n%s", out);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--ipc-child") == 0)
        return child_main(argv[2], argv[3]);
    shm_at_start = count_our_shm();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_host_both_ways, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exporter_exits, setup, teardown),
        cmocka_unit_test_setup_teardown(test_handle_misuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_device_misuse, setup, teardown),
        cmocka_unit_test_setup_teardown(test_socket_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_seqpacket_short_message, setup, teardown),
        cmocka_unit_test_setup_teardown(test_exports_sealed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unsealed_import_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_backend_without_ipc, setup, teardown),
        cmocka_unit_test_setup_teardown(test_opencl_unsupported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_registry_ipc_group, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cli_devices, setup, teardown),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    int shm = count_our_shm();
    if (shm != shm_at_start) {
        fprintf(stderr, "/dev/shm: %d stoke/simdev entries before the tests, %d after\n",
                shm_at_start, shm);
        failed++;
    }
    return tu_exit_status(failed);
}
