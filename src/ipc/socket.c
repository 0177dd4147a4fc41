/* Handles over Unix sockets: the handle's bytes as the message, its file descriptor (if any) as
 * SCM_RIGHTS ancillary data.  Works on stream and datagram/seqpacket sockets (a stream socket
 * may split the bytes; the rest is read without ancillary data). */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/ipc_internal.h"
#include "stoke/ipc.h"

static int sock_fail(const char *what, int err)
{
    if (err == EAGAIN || err == EWOULDBLOCK)
        return stoke__fail(STOKE_ETIMEDOUT,
                           "%s: the socket timed out (SO_SNDTIMEO / "
                           "SO_RCVTIMEO)",
                           what);
    return stoke__fail(STOKE_EIO, "%s: %s", what, strerror(err));
}

ssize_t stoke__sendmsg_fd(int sock, const void *p, size_t n, int fd)
{
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } ctl;
    memset(&ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = (void *)p, .iov_len = n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(c), &fd, sizeof(int));
    }
    ssize_t r;
    do
        r = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (r < 0 && errno == EINTR);
    return r;
}

int stoke_ipc_send(int sock, const stoke_ipc_handle *h)
{
    const char *what = "stoke_ipc_send";
    int rc = stoke__ipc_check_handle(h, what);
    if (rc != STOKE_OK)
        return rc;
    const char *p = (const char *)h;
    size_t left = sizeof(*h);
    int fd = h->fd;
    while (left > 0) {
        ssize_t n = stoke__sendmsg_fd(sock, p, left, fd);
        if (n < 0)
            return sock_fail(what, errno);
        fd = -1; /* the descriptor went with the first bytes */
        p += n;
        left -= (size_t)n;
    }
    return STOKE_OK;
}

/* Takes the first descriptor of `msg` into *fd (closing any others). */
static void take_fds(struct msghdr *msg, int *fd)
{
    for (struct cmsghdr *c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfd = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfd; i++) {
            int got;
            memcpy(&got, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
            if (*fd < 0)
                *fd = got;
            else
                close(got);
        }
    }
}

ssize_t stoke__recvmsg_fd(int sock, void *p, size_t n, int *fd)
{
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = p, .iov_len = n};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    ssize_t r;
    do
        r = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r >= 0)
        take_fds(&msg, fd);
    return r;
}

/* Reads the handle's bytes into *h and the descriptor into *fd. */
static int recv_bytes(int sock, stoke_ipc_handle *h, int *fd, const char *what)
{
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    char *p = (char *)h;
    size_t got = 0;
    while (got < sizeof(*h)) {
        struct iovec iov = {.iov_base = p + got, .iov_len = sizeof(*h) - got};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        msg.msg_control = ctl.buf;
        msg.msg_controllen = sizeof(ctl.buf);
        ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return sock_fail(what, errno);
        take_fds(&msg, fd);
        if (msg.msg_flags & MSG_CTRUNC)
            return stoke__fail(STOKE_EIO,
                               "%s: ancillary data truncated (more descriptors than "
                               "a handle carries)",
                               what);
        if (n == 0)
            return got == 0 ? stoke__fail(STOKE_EEND, "%s: the peer closed the socket", what)
                            : stoke__fail(STOKE_EIO,
                                          "%s: the peer closed the socket after %zu "
                                          "of %zu bytes of a handle",
                                          what, got, sizeof(*h));
        got += (size_t)n;
    }
    return STOKE_OK;
}

int stoke_ipc_recv(int sock, stoke_ipc_handle *out)
{
    const char *what = "stoke_ipc_recv";
    if (!out)
        return stoke__fail(STOKE_EINVAL, "%s: out is NULL", what);
    stoke_ipc_handle h;
    int fd = -1;
    int rc = recv_bytes(sock, &h, &fd, what);
    if (rc == STOKE_OK)
        rc = stoke__ipc_check_handle(&h, what);
    if (rc == STOKE_OK && (h.fd >= 0) != (fd >= 0))
        rc = stoke__fail(STOKE_EINVAL, "%s: the handle %s a file descriptor, but %s arrived", what,
                         h.fd >= 0 ? "carries" : "carries no", fd >= 0 ? "one" : "none");
    if (rc != STOKE_OK) {
        if (fd >= 0)
            close(fd);
        memset(out, 0, sizeof(*out));
        out->fd = -1;
        return rc;
    }
    h.fd = fd;
    *out = h;
    return STOKE_OK;
}
