/* Private interface of the IPC layer (src/ipc) shared by its files. */
#ifndef STOKE_IPC_INTERNAL_H
#define STOKE_IPC_INTERNAL_H

#include <fcntl.h>
#include <stdint.h>
#include <sys/types.h>

#include "stoke/ipc.h"

/* "pinned host block", "device buffer" or "unknown kind". */
const char *stoke__ipc_kind_name(uint32_t kind);
/* STOKE_OK for an open handle of a known kind and layout; else STOKE_EINVAL with a message
 * that starts with `what` (closed handle, not a handle, malformed). */
int stoke__ipc_check_handle(const stoke_ipc_handle *h, const char *what);

/* socket.c: one sendmsg of n bytes at p with descriptor fd attached (SCM_RIGHTS; none when
 * fd < 0), retried on EINTR, without SIGPIPE.  Returns sendmsg's result (errno set on -1). */
ssize_t stoke__sendmsg_fd(int sock, const void *p, size_t n, int fd);
/* socket.c: one recvmsg of at most n bytes into p, retried on EINTR; the first descriptor that
 * came with it goes to *fd (left as is when none came; extra ones are closed).  Returns
 * recvmsg's result (errno set on -1).  When the kernel cut the descriptors off (MSG_CTRUNC:
 * this process is at RLIMIT_NOFILE) errno is EMFILE, whatever the result. */
ssize_t stoke__recvmsg_fd(int sock, void *p, size_t n, int *fd);

/* The seals of every memfd stoke shares (its size is fixed): nobody holding a descriptor can
 * shrink it under another process's mapping (SIGBUS there), grow it, or change the seals. */
#define STOKE__MEMFD_SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL)
/* socket.c: STOKE_OK when fd is a memfd sealed against shrinking and growing (F_GET_SEALS);
 * else STOKE_EINVAL, the message starting with `what` and naming `whose` memory it is. */
int stoke__memfd_check_sealed(int fd, const char *what, const char *whose);

#endif
