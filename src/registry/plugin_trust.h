/* Plugin files no other local user could have written (plugin_trust.c; docs/registry.md). */
#ifndef STOKE_PLUGIN_TRUST_H
#define STOKE_PLUGIN_TRUST_H

#include <stddef.h>

/* Resolves `path` into real[PATH_MAX] and checks that no other local user could have written
 * it or could change what `real` names: a regular file of root or this user that neither
 * others nor a shared group may write, in directories that are trusted the same way from "/"
 * down (sticky ones excepted).  `real` is what to dlopen.  Returns STOKE_OK; else
 * STOKE_ENOENT (not found), STOKE_EINVAL (a directory, a FIFO, ...) or STOKE_EIO (cannot be
 * resolved, or untrusted), with the reason in `why`. */
int stoke__plugin_check(const char *path, char *real, char *why, size_t why_len);

#endif
