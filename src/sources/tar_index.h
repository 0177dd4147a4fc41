/* Sidecar indexes of tar shards (tar_index.c; docs/sources.md, "Sidecar indexes"): SHARD.idx
 * holds the shard's size and, per regular-file member, its path, header offset, data offset and
 * size, so that opening a remote shard costs one request instead of a walk over the shard.
 *
 * Format, version 2 (text, ASCII decimal numbers, '\n' ends every line):
 *   stoke-tar-index 2
 *   shard-bytes SIZE
 *   shard-crc32 HEX             the shard's CRC-32 (zlib's), 8 lowercase hex digits
 *   members COUNT
 *   HDR DATA SIZE LEN PATH      (COUNT lines: PATH is LEN bytes, any but NUL, '\n' included)
 *   end
 * Members in archive order (HDR increasing, each past the one before).  Version 1 is the same
 * without the shard-crc32 line: a build without zlib writes it, and both versions are read. */
#ifndef STOKE_SOURCES_TAR_INDEX_H
#define STOKE_SOURCES_TAR_INDEX_H

#include <stddef.h>
#include <stdint.h>

#include "sources/tar_header.h"

/* The longest index we parse (a local one), and fetch: a remote one is refused past 64 MiB (a
 * line a member: over a million members a shard), so that a server cannot make every rank
 * hold a gigabyte for it. */
#define STOKE__TAR_INDEX_MAX        ((size_t)1 << 30)
#define STOKE__TAR_INDEX_REMOTE_MAX ((size_t)64 << 20)

/* Walks the shard `path` (for messages; shard_size bytes, read through read/read_ctx), reads it
 * whole for its CRC-32 (with zlib) and writes the index to `out` (NULL: path + ".idx")
 * atomically (a temporary name in the same directory, fsync, rename): 0 with *members, or an
 * error code with why (naming the file).  */
int stoke__tar_index_write(const char *path, const char *out, uint64_t shard_size,
                           stoke__tar_read_fn read, void *read_ctx, uint64_t *members, char *why,
                           size_t why_len);

/* Parses an index of len bytes: 0 with *shard_size and *crc (the shard's CRC-32, or -1 for a
 * version 1 index), calling member for each member (in order); STOKE_EFORMAT with why ("line
 * N: ...", no name) for a malformed one; member's code. */
int stoke__tar_index_parse(const char *buf, size_t len, uint64_t *shard_size, int64_t *crc,
                           stoke__tar_member_fn member, void *ctx, char *why, size_t why_len);

/* The CRC-32 of bytes [0, size) read through read/ctx (1 MiB at a time): 0 with *crc, a read's
 * error code (why: "at byte N: ..."), or STOKE_ENOTSUP in a build without zlib. */
int stoke__crc32_of(stoke__tar_read_fn read, void *ctx, uint64_t size, uint32_t *crc, char *why,
                    size_t why_len);

#endif
