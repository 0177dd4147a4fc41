/* A backend's automatic-probe answer, kept for the rest of this boot (probe_cache.c). */
#ifndef STOKE_PROBE_CACHE_H
#define STOKE_PROBE_CACHE_H

#include <stddef.h>

/* Room for a key: what the answer depends on, as text. */
#define STOKE__PROBE_KEY_MAX 8192

/* Starts `key` (STOKE__PROBE_KEY_MAX bytes) with what every backend's answer depends on: the
 * library's version, the answer's size, the user, the boot, the dynamic linker's cache, the
 * device nodes of GPUs and accelerators.  0, or -1 when no answer may be cached (turned off by
 * STOKE_PROBE_CACHE=0, or the boot unknown). */
int stoke__probe_key_begin(char *key, const char *backend, size_t answer_size);
/* Appends the names, sizes, modification times and inodes of `dir`'s entries, or that it is
 * absent.  0, or -1 when the key is full (unusable). */
int stoke__probe_key_dir(char *key, const char *dir);
/* Appends "NAME=VALUE" of the environment variables named by `prefixes` / `parts` (see
 * stoke__env_matching).  0, or -1 when the key is full. */
int stoke__probe_key_env(char *key, const char *const *prefixes, const char *const *parts);

/* The answer kept under exactly `key` for `backend`, copied to `answer` (`size` bytes): 1 then,
 * else 0 (none, another key, a file this user does not own alone, a short one). */
int stoke__probe_cache_get(const char *backend, const char *key, void *answer, size_t size);
/* Keeps `answer` under `key`, replacing the backend's previous one (failures are logged at
 * DEBUG and otherwise ignored: the cache only saves time). */
void stoke__probe_cache_put(const char *backend, const char *key, const void *answer, size_t size);

#endif
