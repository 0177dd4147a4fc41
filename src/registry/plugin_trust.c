/* Whose code a plugin is (docs/registry.md, "Whose code"): a plugin runs in the process with
 * its rights, so only a file no other local user could have written is loaded.
 *
 * The path is resolved once (realpath) and what is checked is that resolved path, the path
 * dlopen is then given: the file (lstat: no link at its end) must be root's or this user's and
 * writable by nobody else, and so must every directory from / down to it, a sticky one
 * excepted (no one else can rename or remove what is in it).  No other user can then change
 * what the path names between the check and the dlopen.  (A stat of the link, then a dlopen of
 * the path it named a moment later, was a race another user won in about 200 tries.)
 * Group-writable is accepted where the group is the owner's own private group (the owner's
 * primary group, with no other members: Debian's user private groups under umask 002), as
 * OpenSSH's user-group-modes does. */
#define _GNU_SOURCE
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/internal.h"
#include "registry/plugin_trust.h"

static const char *file_type_name(mode_t mode)
{
    return S_ISFIFO(mode)   ? "a FIFO"
           : S_ISSOCK(mode) ? "a socket"
           : S_ISCHR(mode)  ? "a character device"
           : S_ISBLK(mode)  ? "a block device"
                            : "not a regular file";
}

/* The group of `st` is its owner's private group: the owner's primary group, and nobody else
 * listed in it. */
static int private_group(const struct stat *st)
{
    char buf[16384];
    struct passwd pw, *pwp = NULL;
    if (getpwuid_r(st->st_uid, &pw, buf, sizeof(buf), &pwp) != 0 || !pwp || pw.pw_gid != st->st_gid)
        return 0;
    char name[256];
    stoke__strlcpy(name, pw.pw_name, sizeof(name));
    struct group gr, *grp = NULL;
    if (getgrgid_r(st->st_gid, &gr, buf, sizeof(buf), &grp) != 0 || !grp)
        return 0;
    for (char **m = gr.gr_mem; m && *m; m++)
        if (strcmp(*m, name) != 0)
            return 0;
    return 1;
}

/* Why another user could have changed what `st` describes, or NULL: the owner must be root or
 * this user; others may not write it (unless `sticky_ok` and the sticky bit is set), nor the
 * group unless it is the owner's private one. */
static const char *untrusted(const struct stat *st, int sticky_ok)
{
    if (st->st_uid != 0 && st->st_uid != geteuid())
        return "is owned by another user";
    if ((st->st_mode & S_IWOTH) && !(sticky_ok && (st->st_mode & S_ISVTX)))
        return "is writable by others";
    if ((st->st_mode & S_IWGRP) && !(sticky_ok && (st->st_mode & S_ISVTX)) && !private_group(st))
        return "is writable by its group (not the owner's private one)";
    return NULL;
}

/* Every directory of the resolved path `real` (from "/" to its own) is trusted; else `why`. */
static int check_dirs(const char *real, char *why, size_t why_len)
{
    char dir[PATH_MAX];
    stoke__strlcpy(dir, real, sizeof(dir));
    for (char *end = strrchr(dir, '/'); end; end = strrchr(dir, '/')) {
        if (end == dir) { /* "/" itself, last */
            dir[1] = '\0';
        } else {
            *end = '\0';
        }
        struct stat st;
        if (stat(dir, &st) != 0) {
            stoke__fmt(why, why_len, "cannot stat its directory %s: %s", dir, strerror(errno));
            return STOKE_EIO;
        }
        const char *bad = untrusted(&st, 1);
        if (bad) {
            stoke__fmt(why, why_len,
                       "the directory %s %s: another user could replace the plugin (chmod "
                       "go-w, or move the plugin to a directory of its own)",
                       dir, bad);
            return STOKE_EIO;
        }
        if (end == dir)
            break;
    }
    return STOKE_OK;
}

int stoke__plugin_check(const char *path, char *real, char *why, size_t why_len)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int err = errno;
        if (err == ENOENT)
            stoke__strlcpy(why, "file not found", why_len);
        else
            stoke__fmt(why, why_len, "cannot stat it: %s", strerror(err));
        return err == ENOENT ? STOKE_ENOENT : STOKE_EIO;
    }
    if (S_ISDIR(st.st_mode)) {
        stoke__strlcpy(why,
                       "is a directory, not a plugin file (directories are searched only "
                       "when named in STOKE_PLUGIN_PATH)",
                       why_len);
        return STOKE_EINVAL;
    }
    if (!S_ISREG(st.st_mode)) {
        stoke__fmt(why, why_len, "is %s, not a regular file or directory",
                   file_type_name(st.st_mode));
        return STOKE_EINVAL;
    }
    if (!realpath(path, real)) {
        stoke__fmt(why, why_len, "cannot resolve its path: %s", strerror(errno));
        return STOKE_EIO;
    }
    const char *bad = NULL;
    if (lstat(real, &st) != 0 || !S_ISREG(st.st_mode))
        bad = "is no longer a regular file";
    else
        bad = untrusted(&st, 0);
    if (bad) {
        stoke__fmt(why, why_len,
                   "the file %s %s: not loaded, another user could have put code in it "
                   "(chown it, chmod go-w)",
                   real, bad);
        return STOKE_EIO;
    }
    return check_dirs(real, why, why_len);
}
