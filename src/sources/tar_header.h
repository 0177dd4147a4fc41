/* The tar archive parser of the tar source: header blocks, pax records and the walk over an
 * archive's members.  No I/O of its own (the walk reads through a callback), no global state,
 * so the libFuzzer target in tests/fuzz/ can drive it over a byte buffer.
 *
 * Formats: POSIX ustar (name + prefix), pax extended headers ('x' for the next member: path
 * and size; 'g' global: checked, then ignored), GNU long names ('L') and long link names ('K',
 * skipped), v7 headers without magic; sizes in octal or GNU base-256.  Only regular files
 * ('0', NUL and '7') are reported; every other member is skipped. */
#ifndef STOKE_TAR_HEADER_H
#define STOKE_TAR_HEADER_H

#include <stddef.h>
#include <stdint.h>

#define STOKE__TAR_BLOCK    512u
#define STOKE__TAR_PATH_MAX 4096u             /* longest member path we accept (bytes) */
#define STOKE__TAR_EXT_MAX  ((size_t)1 << 20) /* longest pax / GNU long-name record we read */

/* One header block, decoded. */
typedef struct stoke__tar_block {
    char name[STOKE__TAR_PATH_MAX]; /* prefix "/" name (ustar), or name */
    uint64_t size;                  /* bytes of data after the header */
    char type;                      /* typeflag ('0', 'x', 'L', ...; '0' for NUL) */
} stoke__tar_block;

/* Decodes one 512-byte block: 0 and *out; STOKE_EEND for an all-zero block (end of archive);
 * STOKE_EFORMAT with a message (no file name, no offset) for a bad checksum, a bad size field
 * (not octal, negative base-256, past 2^63) or a missing NUL where one is needed. */
int stoke__tar_parse_block(const unsigned char blk[STOKE__TAR_BLOCK], stoke__tar_block *out,
                           char *err, size_t err_len);

/* Parses pax extended-header records ("LEN key=value\n" ...) in buf[0, len): 0, with
 * path[0 .. path_len) set (NUL-terminated; "" when absent) and *size / *has_size from a "size"
 * record; STOKE_EFORMAT with a message for a malformed record.  Other keys are ignored. */
int stoke__tar_parse_pax(const char *buf, size_t len, char *path, size_t path_len, uint64_t *size,
                         int *has_size, char *err, size_t err_len);

/* Reads n bytes at `off` into buf: 0 and *got (fewer only at end of file), or -errno;
 * -EAGAIN: the bytes are not there yet (a resumable iterator's read, below). */
typedef int (*stoke__tar_read_fn)(void *ctx, void *buf, size_t n, uint64_t off, size_t *got);
/* Called for each regular-file member: its path, the byte offset of its (first) header, of its
 * data and the data size.  Returns 0 to go on, or a negative code that stops the walk. */
typedef int (*stoke__tar_member_fn)(void *ctx, const char *path, uint64_t hdr_off,
                                    uint64_t data_off, uint64_t size);

/* The walk one member at a time, for a caller that reads each member's data itself before
 * asking for the next (the tar source's streaming mode reads an archive front to back):
 * init, then next() until it returns STOKE_EEND (the end-of-archive block) or an error (as the
 * walk's, err_off where), then free.  file_size may be UINT64_MAX when not known (a stream): the
 * end of the data is then found by a short read.  init: 0 or STOKE_ENOMEM. */
typedef struct stoke__tar_iter {
    uint64_t file_size;
    stoke__tar_read_fn read;
    void *ctx;
    char *err;
    size_t err_len;
    uint64_t err_off;
    uint64_t off; /* the next header */
    void *pd, *b; /* the walk's pending overrides and header block */
    int reported, done;
    void *mark; /* resumable: the state next() started from (NULL: not resumable) */
} stoke__tar_iter;
int stoke__tar_iter_init(stoke__tar_iter *it, uint64_t file_size, stoke__tar_read_fn read,
                         void *read_ctx, char *err, size_t err_len);
/* The next regular-file member: 0 with *path (valid until the next call), the offsets of its
 * first header and of its data, and its data size; STOKE_EEND at the end; or an error. */
int stoke__tar_iter_next(stoke__tar_iter *it, const char **path, uint64_t *hdr_off,
                         uint64_t *data_off, uint64_t *size);
void stoke__tar_iter_free(stoke__tar_iter *it);
/* Makes it resumable (after init): a read that returns -EAGAIN makes next() return STOKE_EBUSY
 * with the iterator as it was before that call (nothing reported; it->off: where the call
 * starts again), to be called again once the reads can give the bytes from it->off to the end
 * of the one that waited, all at once (the call reads a member's extension headers again
 * before its own; the remote walk, tar_remote.c, fetches them meanwhile).  0 or
 * STOKE_ENOMEM. */
int stoke__tar_iter_resumable(stoke__tar_iter *it);

/* Walks an archive of `file_size` bytes from offset 0 to its end-of-archive block, calling
 * `member` for each regular file.  Returns 0; STOKE_EFORMAT for a corrupt or truncated archive
 * (a header cut short, a bad checksum or size field, a member running past the end of the file,
 * a bad pax record, an archive without its end-of-archive block), with *err_off the byte offset
 * of the offending block and the message in err (without file name; the caller adds it);
 * STOKE_EIO when a read fails (*err_off where); STOKE_ENOMEM; or member's code.  Thread-safe. */
int stoke__tar_walk(uint64_t file_size, stoke__tar_read_fn read, void *read_ctx,
                    stoke__tar_member_fn member, void *member_ctx, char *err, size_t err_len,
                    uint64_t *err_off);

#endif
