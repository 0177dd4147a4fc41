/* libFuzzer target: the sidecar index parser (src/sources/tar_index.c) over arbitrary bytes, as
 * a remote tar source parses whatever URL.idx a server returns.  Built only with -DSTOKE_FUZZ=ON
 * and clang; run by tests/fuzz/run.sh (target idx).  Beyond "no crash, no sanitizer report" it
 * checks the parser's promises: members come in archive order, each inside the shard's size and
 * past the one before, with a path of 1 to STOKE__TAR_PATH_MAX bytes; a parsed index has a
 * CRC-32 that is -1 (version 1) or 32 bits; a refusal is STOKE_EFORMAT with a message naming a
 * line. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "fuzz_support.h"
#include "sources/tar_index.h"
#include "stoke/status.h"

typedef struct seen {
    uint64_t n, next;
} seen;

static int member(void *ctx, const char *path, uint64_t hdr, uint64_t data, uint64_t size)
{
    seen *s = ctx;
    size_t len = strlen(path);
    check(len >= 1 && len <= STOKE__TAR_PATH_MAX);
    check(hdr >= s->next && hdr % STOKE__TAR_BLOCK == 0 && data > hdr &&
          data % STOKE__TAR_BLOCK == 0);
    s->next = data + size;
    s->n++;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size heap block so ASan sees any read past the end. */
    char *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    seen s = {0, 0};
    uint64_t shard = 0;
    int64_t crc = -2;
    char why[256] = "";
    int rc = stoke__tar_index_parse(buf, size, &shard, &crc, member, &s, why, sizeof(why));
    if (rc == STOKE_OK) {
        check(crc == -1 || (crc >= 0 && crc <= (int64_t)UINT32_MAX));
        check(s.next <= shard);
    } else {
        check(rc == STOKE_EFORMAT && strncmp(why, "line ", 5) == 0);
    }
    free(buf);
    return 0;
}
