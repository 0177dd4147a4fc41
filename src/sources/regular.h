/* Private to the built-in sources: opening a data file, only if it is a regular file.
 *
 * Every file a source reads (npy's data and labels, tar shards, images: JPEGs at get() time)
 * is opened here: with O_NONBLOCK, so that open() of a FIFO does not wait for a writer (nor a
 * device for a carrier) -- a path replaced by a FIFO after the scan must fail the sample, not
 * hang the worker and with it the loader's destroy -- and O_NOCTTY (a terminal never becomes
 * the controlling one); then fstat'ed, anything but a regular file refused; then made blocking
 * again before any read. */
#ifndef STOKE_SOURCES_REGULAR_H
#define STOKE_SOURCES_REGULAR_H

#include <stddef.h>
#include <sys/stat.h>

/* What a file of mode m is, for messages: "a FIFO", "a directory", "a socket", ... */
const char *stoke__file_kind(mode_t m);

/* Opens `path` (relative to dirfd; AT_FDCWD for the working directory) read-only, close-on-exec,
 * and fstats it into *st.  Returns the descriptor (>= 0, blocking), or a negative code with
 * `why` set (without the path; the caller adds it): STOKE_ENOENT for a missing file,
 * STOKE_EIO for one that cannot be opened, stat'ed or made blocking, or is not a regular file
 * ("is a FIFO, not a regular file").  Never blocks on a FIFO.  Thread-safe. */
int stoke__open_regular(int dirfd, const char *path, struct stat *st, char *why, size_t why_len);

#endif
