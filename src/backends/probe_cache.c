/* A backend's automatic-probe answer, kept for the rest of this boot.
 *
 * - Finding out that a machine has no accelerator can cost more than the rest of a short job:
 *   the OpenCL probe loads the ICD loader and every vendor driver (PoCL brings LLVM) in a child,
 *   60-90 ms, in every process (each rank, each `stoke` command, each Python process's first
 *   DataLoader).  The answer depends on the installed drivers and the devices present, which do
 *   not change under a running system without leaving a trace, so it is kept in one file per
 *   user, backend and library path, "stoke-UID-BACKEND-LIB.probe" (cache_path) in
 *   STOKE_PROBE_CACHE (default /tmp; "0" turns the cache off, "1" is the default), under a key
 *   that names everything it depends on:
 *   - the library's version and file (size, mtime, inode), the answer's size, the user, the boot
 *     (/proc/sys/kernel/random/boot_id);
 *   - the dynamic linker's cache (/etc/ld.so.cache: installing a driver package runs ldconfig),
 *     and the device nodes of GPUs and accelerators (/dev/dri, /dev/accel, /dev/nvidia*,
 *     /dev/kfd, /dev/dxg);
 *   - what the backend adds: the environment variables its drivers read, its vendor
 *     directories.
 *   A key that differs in anything is a miss, and the next answer replaces the file.
 * - The backend decides what is kept: answers that settle a probe without loading anything
 *   here.  An answer that finds a device is not (the library is loaded anyway), nor a probe that
 *   hung or crashed.
 * - The file is read only when it is a regular file owned by this user and writable by no one
 *   else, and matches in full; it is replaced whole (written under a temporary name, renamed).
 *   In a sticky directory such as /tmp another user can take the name first: then nothing
 *   is cached, nothing else happens. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/probe_cache.h"
#include "common/env.h"
#include "common/internal.h"
#include "stoke/version.h"

#define DEFAULT_DIR "/tmp" /* not /dev/shm: where users look for leaked batch memory */
#define MAGIC "stoke-probe 1\n"
#define MAX_ENTRIES 512 /* of a directory in a key */

static const int self_anchor; /* an address inside this library (dladdr) */

/* The cache's directory, or NULL when it is turned off. */
static const char *cache_dir(void)
{
    const char *d = stoke__env_str(STOKE_ENV_PROBE_CACHE);
    if (!d)
        return DEFAULT_DIR;
    int on = 0;
    if (d[0] != '/' && stoke__parse_bool(d, &on) == 0)
        return on ? DEFAULT_DIR : NULL;
    return d;
}

/* The file of this library's answers: "stoke-UID-BACKEND-LIB.probe", LIB 16 hex digits of a
 * hash (FNV-1a) of the library's path, so that libraries installed in different places (a
 * build tree next to an installed copy, two virtual environments) each keep their answer instead
 * of replacing each other's at every process (each a miss for the other: a probe of 60-120 ms
 * each time).  A rebuild in the same place replaces its own file. */
static int cache_path(char *path, size_t len, const char *backend)
{
    const char *d = cache_dir();
    if (!d)
        return -1;
    uint64_t h = 0xcbf29ce484222325ull;
    Dl_info self;
    if (dladdr(&self_anchor, &self) && self.dli_fname)
        for (const unsigned char *c = (const unsigned char *)self.dli_fname; *c; c++)
            h = (h ^ *c) * 0x100000001b3ull;
    int n = snprintf(path, len, "%s/stoke-%u-%s-%016llx.probe", d, (unsigned)geteuid(), backend,
                     (unsigned long long)h);
    return n > 0 && (size_t)n < len ? 0 : -1;
}

static int key_add(char *key, const char *fmt, ...) STOKE__PRINTF(2, 3);
static int key_add(char *key, const char *fmt, ...)
{
    size_t at = strlen(key);
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(key + at, STOKE__PROBE_KEY_MAX - at, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= STOKE__PROBE_KEY_MAX - at) {
        key[at] = '\0';
        return -1;
    }
    return 0;
}

static int key_file(char *key, const char *path)
{
    struct stat st;
    if (stat(path, &st) != 0)
        return key_add(key, "%s: none\n", path);
    return key_add(key, "%s %lld %lld.%09ld %llu\n", path, (long long)st.st_size,
                   (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
                   (unsigned long long)st.st_ino);
}

static int name_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static int name_matches(const char *name, const char *const *prefixes)
{
    if (!prefixes)
        return 1;
    for (; *prefixes; prefixes++)
        if (strncmp(name, *prefixes, strlen(*prefixes)) == 0)
            return 1;
    return 0;
}

/* Appends `dir`'s entries (those starting with one of `prefixes`, a NULL-terminated list, when
 * not NULL), in name order: their names, and with `with_stat` their size, mtime and inode. */
static int key_dir(char *key, const char *dir, const char *const *prefixes, int with_stat)
{
    DIR *d = opendir(dir);
    if (!d)
        return key_add(key, "%s: none\n", dir);
    char *names[MAX_ENTRIES];
    size_t n = 0;
    int rc = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || !name_matches(e->d_name, prefixes))
            continue;
        if (n == MAX_ENTRIES || !(names[n] = strdup(e->d_name))) {
            rc = -1;
            break;
        }
        n++;
    }
    closedir(d);
    qsort(names, n, sizeof(names[0]), name_cmp);
    if (rc == 0)
        rc = key_add(key, "%s:\n", dir);
    for (size_t i = 0; i < n && rc == 0; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        rc = with_stat ? key_file(key, path) : key_add(key, " %s\n", names[i]);
    }
    for (size_t i = 0; i < n; i++)
        free(names[i]);
    return rc;
}

int stoke__probe_key_begin(char *key, const char *backend, size_t answer_size)
{
    key[0] = '\0';
    if (!cache_dir())
        return -1;
    char boot[64] = "";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (!fgets(boot, sizeof(boot), f))
            boot[0] = '\0';
        fclose(f);
    }
    boot[strcspn(boot, "\n")] = '\0';
    if (!boot[0])
        return -1; /* "this boot" unknown: a cached answer could outlive a driver change */
    int rc = key_add(key, "stoke %s %s answer %zu\nuid %u\nboot %s\n", STOKE_VERSION_STRING,
                     backend, answer_size, (unsigned)geteuid(), boot);
    /* this build of the library (a rebuilt one may probe differently), the linker's cache */
    Dl_info self;
    if (rc == 0 && dladdr(&self_anchor, &self) && self.dli_fname)
        rc = key_file(key, self.dli_fname);
    if (rc == 0)
        rc = key_file(key, "/etc/ld.so.cache");
    static const char *const gpu_nodes[] = {"nvidia", "kfd", "dxg", NULL};
    if (rc == 0)
        rc = key_dir(key, "/dev", gpu_nodes, 0);
    if (rc == 0)
        rc = key_dir(key, "/dev/dri", NULL, 0);
    if (rc == 0)
        rc = key_dir(key, "/dev/accel", NULL, 0);
    return rc;
}

int stoke__probe_key_dir(char *key, const char *dir)
{
    return key_dir(key, dir, NULL, 1);
}

int stoke__probe_key_env(char *key, const char *const *prefixes, const char *const *parts)
{
    if (key_add(key, "env:\n") != 0)
        return -1;
    size_t at = strlen(key);
    if (stoke__env_matching(prefixes, parts, key, STOKE__PROBE_KEY_MAX) != 0) {
        key[at] = '\0';
        return -1;
    }
    return 0;
}

int stoke__probe_cache_get(const char *backend, const char *key, void *answer, size_t size)
{
    char path[4096];
    if (!key[0] || cache_path(path, sizeof(path), backend) != 0)
        return 0;
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    size_t klen = strlen(key), want = sizeof(MAGIC) - 1 + klen + 1 + size;
    struct stat st;
    int hit = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & (S_IWGRP | S_IWOTH))) {
        stoke__log(STOKE_LOG_DEBUG, "%s: probe cache %s ignored: not a regular file of uid %u "
                   "writable by it alone", backend, path, (unsigned)geteuid());
    } else if ((uint64_t)st.st_size == want) {
        char *buf = malloc(want);
        size_t got = 0;
        if (buf && stoke__pread_full(fd, buf, want, 0, &got) == 0 && got == want && memcmp(buf, MAGIC, sizeof(MAGIC) - 1) == 0 &&
            memcmp(buf + sizeof(MAGIC) - 1, key, klen + 1) == 0) {
            memcpy(answer, buf + want - size, size);
            hit = 1;
        }
        free(buf);
    }
    close(fd);
    return hit;
}

/* An answer not kept: said at debug level where the directory is the default (/tmp), as a
 * warning where STOKE_PROBE_CACHE names it (the user chose a place, and every process will
 * probe again, unseen, until it is fixed). */
static void not_kept(const char *backend, const char *path, int err)
{
    const char *d = stoke__env_str(STOKE_ENV_PROBE_CACHE);
    int chosen = d && cache_dir() == d;
    stoke__log(chosen ? STOKE_LOG_WARN : STOKE_LOG_DEBUG,
               "%s: probe answer not cached: %s: %s%s%s%s", backend, path, strerror(err),
               chosen ? " (STOKE_PROBE_CACHE=" : "", chosen ? d : "",
               chosen ? "; each process probes again)" : "");
}

void stoke__probe_cache_put(const char *backend, const char *key, const void *answer, size_t size)
{
    char path[4096], tmp[4200];
    if (!key[0] || cache_path(path, sizeof(path), backend) != 0)
        return;
    const char *slash = strrchr(path, '/');
    snprintf(tmp, sizeof(tmp), "%.*s/.%s.%ld.%llx", (int)(slash - path), path, slash + 1,
             (long)getpid(), (unsigned long long)(stoke__now_ns() & 0xffffffffffull));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
        not_kept(backend, path, errno); /* (the file it would have become: tmp is noise) */
        return;
    }
    int e = fchmod(fd, 0600) != 0 ? -errno : 0;
    if (!e)
        e = stoke__write_all(fd, MAGIC, sizeof(MAGIC) - 1);
    if (!e)
        e = stoke__write_all(fd, key, strlen(key) + 1);
    if (!e)
        e = stoke__write_all(fd, answer, size);
    if (close(fd) != 0 && !e)
        e = -errno;
    if (!e && rename(tmp, path) != 0)
        e = -errno;
    if (!e) {
        stoke__log(STOKE_LOG_DEBUG, "%s: probe answer cached for this boot in %s", backend, path);
        return;
    }
    unlink(tmp);
    not_kept(backend, path, -e);
}
