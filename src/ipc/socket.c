/* Handles over Unix sockets: the handle's bytes as the message, its file descriptor (if any) as
 * SCM_RIGHTS ancillary data.  Works on stream and datagram/seqpacket sockets: a stream socket
 * may split the bytes (the rest is read without ancillary data); on a datagram or seqpacket
 * socket one message is one handle, and a message of another size is an error for that message
 * alone.  Also: the check that a shared memfd is sealed. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
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

/* take_fds for a handle: STOKE_OK, or STOKE_EIO when the kernel cut the ancillary data short
 * (more descriptors than a handle carries). */
static int take_handle_fds(struct msghdr *msg, int *fd, const char *what)
{
    take_fds(msg, fd);
    if (msg->msg_flags & MSG_CTRUNC)
        return stoke__fail(STOKE_EIO,
                           "%s: ancillary data truncated (more descriptors than a handle "
                           "carries)",
                           what);
    return STOKE_OK;
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
    if (r >= 0) {
        take_fds(&msg, fd);
        if (msg.msg_flags & MSG_CTRUNC)
            errno = EMFILE; /* (a descriptor that was sent is lost) */
        else
            errno = 0;
    }
    return r;
}

/* One message of a datagram / seqpacket socket: exactly one handle, or an error for this
 * message alone (its descriptors closed by the caller); the next message is left as it is. */
static int recv_message(int sock, stoke_ipc_handle *h, int *fd, const char *what)
{
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {.iov_base = h, .iov_len = sizeof(*h)};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    msg.msg_control = ctl.buf;
    msg.msg_controllen = sizeof(ctl.buf);
    ssize_t n;
    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return sock_fail(what, errno);
    int rc = take_handle_fds(&msg, fd, what);
    if (rc != STOKE_OK)
        return rc;
    if (n == 0)
        return stoke__fail(STOKE_EEND, "%s: the peer closed the socket (or sent an empty message)",
                           what);
    if (n != (ssize_t)sizeof(*h) || (msg.msg_flags & MSG_TRUNC))
        return stoke__fail(STOKE_EINVAL,
                           "%s: a message of %zd bytes is not a handle (%zu bytes); it was "
                           "dropped, the next message is still there",
                           what, n, sizeof(*h));
    return STOKE_OK;
}

/* Reads the handle's bytes into *h and the descriptor into *fd: the bytes of a stream socket
 * as they come, one message of any other type. */
static int recv_bytes(int sock, stoke_ipc_handle *h, int *fd, const char *what)
{
    union {
        char buf[CMSG_SPACE(4 * sizeof(int))];
        struct cmsghdr align;
    } ctl;
    int type = 0;
    socklen_t tl = sizeof(type);
    if (getsockopt(sock, SOL_SOCKET, SO_TYPE, &type, &tl) != 0)
        return sock_fail(what, errno);
    if (type != SOCK_STREAM)
        return recv_message(sock, h, fd, what);
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
        int rc = take_handle_fds(&msg, fd, what);
        if (rc != STOKE_OK)
            return rc;
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

int stoke__memfd_check_sealed(int fd, const char *what, const char *whose)
{
    int seals = fcntl(fd, F_GET_SEALS);
    int need = F_SEAL_SHRINK | F_SEAL_GROW;
    if (seals >= 0 && (seals & need) == need)
        return STOKE_OK;
    if (seals < 0)
        return stoke__fail(STOKE_EINVAL,
                           "%s: the shared memory of %s is not a sealable memfd (F_GET_SEALS: "
                           "%s); refused",
                           what, whose, strerror(errno));
    return stoke__fail(STOKE_EINVAL,
                       "%s: the memfd of %s is not sealed against %s (F_SEAL_SHRINK | "
                       "F_SEAL_GROW): any holder could truncate it under this mapping (SIGBUS); "
                       "refused",
                       what, whose, !(seals & F_SEAL_SHRINK) ? "shrinking" : "growing");
}
