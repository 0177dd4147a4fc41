/* Whole reads and writes on file descriptors (internal.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <unistd.h>

#include "common/internal.h"

int stoke__pread_full(int fd, void *buf, size_t n, uint64_t at, size_t *got)
{
    unsigned char *p = buf;
    size_t done = 0;
    while (done < n) {
        ssize_t r = pread(fd, p + done, n - done, (off_t)(at + done));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            *got = done;
            return -errno;
        }
        if (r == 0)
            break;
        done += (size_t)r;
    }
    *got = done;
    return 0;
}

int stoke__write_all(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t r = write(fd, p, n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}
