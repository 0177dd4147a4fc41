/* Host-block IPC for every backend that can register memory, through the arena: an allocation
 * of a node-wide arena (stoke/arena.h) exported with stoke_ipc_export becomes a handle of
 * backend "arena" carrying a dup of the arena's memfd and the allocation's offset and size; the
 * importer maps that range and pins it with stoke_pin_register for its own current accelerator
 * (simdev's host_register, CUDA's cuMemHostRegister, HIP's hipHostRegister).  No backend IPC
 * function is involved, so it works for backends whose own pinned blocks cannot be shared.
 * The memfd is sealed against shrinking and growing (arena.c); an import of one that is not is
 * refused, since its holders could truncate it under the mapping. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "ipc/arena_internal.h"
#include "ipc/ipc_internal.h"
#include "stoke/pinned.h"

#define ARENA_BLOB_MAGIC 0x414e5241u /* "ARNA" */

typedef struct arena_blob {
    uint32_t magic;
    uint32_t pad;
    uint64_t offset;  /* of the range in the memfd (page-aligned) */
    uint64_t map_len; /* bytes of the memfd when exported */
} arena_blob;

int stoke__arena_ipc_export(stoke_arena *a, void *ptr, size_t size, stoke_ipc_handle *out)
{
    const char *what = "stoke_ipc_export";
    size_t len = 0;
    int rc = stoke__arena_allocation(a, ptr, &len);
    if (rc != STOKE_OK)
        return rc;
    if (size == 0)
        size = len;
    if (size > len)
        return stoke__fail(STOKE_EINVAL,
                           "%s: %zu bytes asked, but the allocation %p of arena "
                           "'%s' holds %zu",
                           what, size, ptr, a->name, len);
    /* The arena's memfd was sealed when it was made (arena.c): an importer cannot shrink it. */
    int fd = fcntl(a->memfd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return stoke__fail(STOKE_EIO, "%s: arena '%s': cannot duplicate its memfd: %s", what,
                           a->name, strerror(errno));
    memset(out, 0, sizeof(*out));
    out->magic = STOKE_IPC_MAGIC;
    out->version = STOKE_IPC_VERSION;
    out->kind = STOKE_IPC_HOST;
    out->device = -1;
    out->size = size;
    out->pid = (int64_t)getpid();
    stoke__strlcpy(out->backend, STOKE__ARENA_BACKEND, sizeof(out->backend));
    out->fd = fd;
    arena_blob b = {.magic = ARENA_BLOB_MAGIC,
                    .offset = (uint64_t)((unsigned char *)ptr - a->base),
                    .map_len = a->map_len};
    memcpy(out->blob, &b, sizeof(b));
    out->blob_len = sizeof(b);
    return STOKE_OK;
}

int stoke__arena_ipc_import(const stoke_ipc_handle *h, void **out, size_t *mapped)
{
    const char *what = "stoke_ipc_import";
    arena_blob b;
    if (h->blob_len != sizeof(b) || h->fd < 0)
        return stoke__fail(STOKE_EINVAL, "%s: malformed arena handle (blob of %u bytes, %s)", what,
                           (unsigned)h->blob_len, h->fd < 0 ? "no descriptor" : "fd");
    memcpy(&b, h->blob, sizeof(b));
    long page = sysconf(_SC_PAGESIZE);
    struct stat st;
    if (b.magic != ARENA_BLOB_MAGIC || page <= 0 || b.offset % (uint64_t)page)
        return stoke__fail(STOKE_EINVAL, "%s: the blob is not an arena range", what);
    if (fstat(h->fd, &st) != 0 || (uint64_t)st.st_size < b.offset ||
        (uint64_t)st.st_size - b.offset < h->size)
        return stoke__fail(STOKE_EINVAL,
                           "%s: the arena handle of process %lld names %llu bytes at offset %llu, "
                           "beyond its shared memory",
                           what, (long long)h->pid, (unsigned long long)h->size,
                           (unsigned long long)b.offset);
    char whose[64];
    snprintf(whose, sizeof(whose), "the arena handle of process %lld", (long long)h->pid);
    int rc = stoke__memfd_check_sealed(h->fd, what, whose);
    if (rc != STOKE_OK)
        return rc;
    size_t len = ((size_t)h->size + (size_t)page - 1) / (size_t)page * (size_t)page;
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, h->fd, (off_t)b.offset);
    if (p == MAP_FAILED)
        return stoke__fail(STOKE_ENOMEM,
                           "%s: cannot map %zu bytes of the arena of process %lld: "
                           "%s",
                           what, len, (long long)h->pid, strerror(errno));
    rc = stoke_pin_register(p, len);
    if (rc == STOKE_ENOTSUP) {
        stoke__log(STOKE_LOG_WARN, "%s: the arena range of process %lld is not pinned: %s", what,
                   (long long)h->pid, stoke_last_error());
    } else if (rc != STOKE_OK) {
        munmap(p, len);
        return stoke__fail(rc, "%s: %s", what, stoke_last_error());
    }
    *out = p;
    *mapped = len;
    return STOKE_OK;
}

void stoke__arena_ipc_unmap(void *ptr, size_t mapped)
{
    stoke_pin_unregister(ptr); /* STOKE_EINVAL when it was not pinned: nothing to undo */
    stoke__clear_error();
    munmap(ptr, mapped);
}
