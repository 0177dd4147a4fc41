/* Opening data files, regular files only (regular.h). */
#define _GNU_SOURCE
#include "sources/regular.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"

const char *stoke__file_kind(mode_t m)
{
    return S_ISFIFO(m)   ? "a FIFO"
           : S_ISDIR(m)  ? "a directory"
           : S_ISCHR(m)  ? "a character device"
           : S_ISBLK(m)  ? "a block device"
           : S_ISSOCK(m) ? "a socket"
                         : "something else";
}

int stoke__open_regular(int dirfd, const char *path, struct stat *st, char *why, size_t why_len)
{
    int fd = openat(dirfd, path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        /* a socket cannot be opened at all (ENXIO): say what it is */
        if (e != ENOENT && fstatat(dirfd, path, st, 0) == 0 && !S_ISREG(st->st_mode)) {
            stoke__fmt(why, why_len, "is %s, not a regular file", stoke__file_kind(st->st_mode));
            return STOKE_EIO;
        }
        stoke__fmt(why, why_len, "cannot open: %s", strerror(e));
        return e == ENOENT ? STOKE_ENOENT : STOKE_EIO;
    }
    int rc = STOKE_OK;
    int fl;
    if (fstat(fd, st) != 0) {
        stoke__fmt(why, why_len, "cannot stat: %s", strerror(errno));
        rc = STOKE_EIO;
    } else if (!S_ISREG(st->st_mode)) {
        stoke__fmt(why, why_len, "is %s, not a regular file", stoke__file_kind(st->st_mode));
        rc = STOKE_EIO;
    } else if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        stoke__fmt(why, why_len, "fcntl: %s", strerror(errno));
        rc = STOKE_EIO;
    }
    if (rc != STOKE_OK) {
        close(fd);
        return rc;
    }
    return fd;
}
