/* libFuzzer target: the tar parser (src/sources/tar_header.c) over arbitrary bytes: one header
 * block, pax records, and the walk over a whole archive read from the input.  Built only with
 * -DSTOKE_FUZZ=ON and clang; run by tests/fuzz/run.sh.  Beyond "no crash, no sanitizer report"
 * it checks the walk's promises: members lie inside the file, offsets are block-aligned, an
 * error names an offset inside the file and has a message. */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "sources/tar_header.h"
#include "stoke/status.h"

static void check(int ok)
{
    if (!ok)
        abort();
}

typedef struct input {
    const uint8_t *p;
    size_t n;
    unsigned members;
} input;

static int read_input(void *ctx, void *buf, size_t n, uint64_t off, size_t *got)
{
    const input *in = ctx;
    if (off > in->n) {
        *got = 0;
        return 0;
    }
    size_t avail = in->n - (size_t)off;
    size_t k = n < avail ? n : avail;
    memcpy(buf, in->p + off, k);
    *got = k;
    return 0;
}

static int member(void *ctx, const char *path, uint64_t hdr, uint64_t data, uint64_t size)
{
    input *in = ctx;
    check(strlen(path) < STOKE__TAR_PATH_MAX);
    check(hdr % STOKE__TAR_BLOCK == 0 && data % STOKE__TAR_BLOCK == 0);
    check(hdr < data && data <= in->n && size <= in->n - data);
    in->members++;
    return in->members > 100000 ? STOKE_ELIMIT : 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* Copy into an exact-size heap block so ASan sees any read past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf)
        return 0;
    if (size)
        memcpy(buf, data, size);
    char err[256];
    if (size >= STOKE__TAR_BLOCK) {
        stoke__tar_block *b = malloc(sizeof(*b));
        if (b) {
            memset(err, 'x', sizeof(err));
            int rc = stoke__tar_parse_block(buf, b, err, sizeof(err));
            check(rc == 0 || rc == STOKE_EEND || rc == STOKE_EFORMAT);
            check(memchr(err, 0, sizeof(err)) != NULL);
            if (rc == STOKE_EFORMAT)
                check(err[0] != 0);
            if (rc == 0)
                check(b->size <= (uint64_t)INT64_MAX && strlen(b->name) < 257);
            free(b);
        }
    }
    char path[128];
    uint64_t psize = 0;
    int has = 0;
    memset(err, 'x', sizeof(err));
    int rc = stoke__tar_parse_pax((const char *)buf, size, path, sizeof(path), &psize, &has, err,
                                  sizeof(err));
    check(rc == 0 || rc == STOKE_EFORMAT || rc == STOKE_ENOTSUP); /* ENOTSUP: GNU.sparse.* */
    if (rc != 0)
        check(err[0] != 0 && memchr(err, 0, sizeof(err)) != NULL);
    if (rc == 0)
        check(strlen(path) < sizeof(path) && (!has || psize <= (uint64_t)INT64_MAX));
    input in = {buf, size, 0};
    uint64_t at = UINT64_MAX;
    memset(err, 'x', sizeof(err));
    rc = stoke__tar_walk(size, read_input, &in, member, &in, err, sizeof(err), &at);
    check(rc == 0 || rc == STOKE_EFORMAT || rc == STOKE_ELIMIT || rc == STOKE_ENOMEM ||
          rc == STOKE_ENOTSUP); /* ENOTSUP: a sparse member */
    check(memchr(err, 0, sizeof(err)) != NULL);
    if (rc == STOKE_EFORMAT || rc == STOKE_ENOTSUP)
        check(err[0] != 0 && at <= size);
    free(buf);
    return 0;
}
