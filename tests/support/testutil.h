/* Helpers shared by the cmocka tests. */
#ifndef STOKE_TESTUTIL_H
#define STOKE_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "../../plugins/simdev/simdev.h"

/* Captures every log line (any level) from now on; the default sink is replaced. */
void tu_log_capture(void);
/* Number of captured lines at `level` (or any level if -1) containing `needle` (NULL: all). */
int tu_log_count(int level, const char *needle);
/* Forgets captured lines. */
void tu_log_clear(void);
/* Prints captured lines to stderr (for failing tests). */
void tu_log_dump(void);

/* Path of the built simdev plugin (STOKE_SIMDEV_PLUGIN), of a test plugin by file name, of a
 * scratch file in the test temp dir.  Returned strings are static per call site buffers:
 * copy them if you need two at once. */
const char *tu_simdev_path(void);
const char *tu_test_plugin(const char *file, char *buf, size_t len);
const char *tu_tmp_path(const char *name, char *buf, size_t len);

/* setenv/unsetenv wrappers that also reset the registry so that the next call re-reads the
 * environment. */
void tu_env(const char *name, const char *value); /* value NULL: unset */
void tu_registry_reset(void);

/* Makes simdev the accelerator (STOKE_PLUGIN_PATH=simdev, STOKE_ACCELERATOR unset) and resets. */
void tu_use_simdev(void);
/* No accelerator: no plugin, no explicit choice. */
void tu_use_none(void);

/* "Every sample exactly once": a bitmap over the indices [0, n).  Consumer thread only. */
typedef struct tu_seen {
    uint64_t n, count;
    unsigned char *bits;
} tu_seen;
void tu_seen_init(tu_seen *s, uint64_t n);
/* Marks index i; fails the test if i >= n or i was seen before. */
void tu_seen_add(tu_seen *s, uint64_t i);
/* Fails the test unless every index in [0, n) was seen (each exactly once, by tu_seen_add). */
void tu_seen_check_all(const tu_seen *s);
void tu_seen_free(tu_seen *s);

/* simdev's counters through its extra exported function (the plugin must be loaded, e.g. by
 * tu_use_simdev and a first call); fails the test if it cannot read them. */
struct stoke_simdev_counters tu_simdev_counters(void);

/* Runs `argv` (argv[0] a path) in a child with extra environment entries "NAME=VALUE" (a value
 * of "" unsets NAME), captures stdout and stderr (NUL-terminated, truncated to the buffers) and
 * returns the exit status (128+signal if killed, -1 if it could not run).  `env` may be NULL;
 * `err` may be NULL. */
int tu_run(const char *const argv[], const char *const env[], char *out, size_t out_len, char *err,
           size_t err_len);
/* The built `stoke` CLI (STOKE_CLI). */
const char *tu_cli_path(void);
/* Runs the built CLI as tu_run does, with the arguments `cmd` (none when NULL) and then `args`
 * (NULL-terminated; at most TU_CLI_MAX_ARGS in all, more fails the test):
 *     tu_run_cli(env, "load", args, out, sizeof(out), err, sizeof(err))
 * runs `stoke load ARGS...`. */
#define TU_CLI_MAX_ARGS 30
int tu_run_cli(const char *const env[], const char *cmd, const char *const args[], char *out,
               size_t out_len, char *err, size_t err_len);
/* As tu_run_cli with stdout on /dev/full, where every write fails with ENOSPC; captures stderr
 * only. */
int tu_run_cli_full(const char *const env[], const char *cmd, const char *const args[], char *err,
                    size_t err_len);
/* "STOKE_PLUGIN_PATH=<the simdev plugin>", an `env` entry for tu_run / tu_run_cli (a static
 * buffer). */
const char *tu_simdev_env(void);

/* ---- skips ----------------------------------------------------------------------------------
 * A skipped check is reported as a skip, never as a pass.  tu_skip() prints "[  SKIP    ] why",
 * counts the skip and leaves the current test through cmocka's skip() (call it from the test's
 * own thread).  main() returns tu_exit_status(cmocka_run_group_tests(...)): 1 when a test
 * failed; otherwise TU_SKIP_EXIT (77, CTest's SKIP_RETURN_CODE for every test, see
 * tests/CMakeLists.txt) when any test skipped, so CTest reports the executable as skipped rather
 * than passed; otherwise 0. */
#define TU_SKIP_EXIT 77
void tu_skip_note(const char *fmt, ...);
#define tu_skip(...)                                                                               \
    do {                                                                                           \
        tu_skip_note(__VA_ARGS__);                                                                 \
        skip();                                                                                    \
    } while (0)
int tu_skipped(void);
int tu_exit_status(int failed);

/* .npy files and the page cache (the npy tests) */
/* numpy's v1 preamble + header for `dict`, padded to a multiple of 64 (at most 256 bytes);
 * returns its length. */
size_t tu_npy_head(unsigned char *out, const char *dict);
/* Writes a .npy file: tu_npy_head(dict), then the n bytes of data; returns the header's length. */
size_t tu_npy_write(const char *path, const char *dict, const void *data, size_t n);
/* Resident share (%) of the file's pages [first, first + n) (n 0: from first to the end). */
int tu_resident_pct(const char *path, size_t first, size_t n);
/* Drops path from the page cache (fdatasync, POSIX_FADV_DONTNEED); returns the share (%) of
 * its pages still resident. */
int tu_evict(const char *path);

/* Descriptors of this process whose target contains `what` (e.g. "memfd:simdev"); -1 when
 * /proc/self/fd cannot be read. */
int tu_count_fds_to(const char *what);
/* Processes: pid no longer exists (reaped or never was); no child of this process is left
 * (asserted: waitpid fails with ECHILD); the pids of a loader's `workers` process workers now
 * added to pids[*npids..cap) where not there yet (0 and negative pids: none running). */
struct stoke_loader;
int tu_pid_gone(int pid);
void tu_assert_no_children(void);
void tu_note_worker_pids(const struct stoke_loader *l, int workers, int *pids, int *npids, int cap);
void tu_sleep_ms(long ms); /* the whole time, signals or not */
/* Lines of /proc/net/unix (bound Unix socket names of any process) that contain `what`. */
int tu_count_unix_names(const char *what);

/* Test datasets describe their fields through a pool of mutable field arrays, each field with
 * room for TU_DIMS dimensions (the loader copies them at create).  TU_F(ds): ds's fields,
 * taking a zeroed array of TU_FIELDS from the pool the first time (ds->fields NULL or not from
 * the pool), each field's shape pointing at its own row; TU_SHAPE(ds, f): field f's shape,
 * writable.  The pool is per test process; running out fails the test. */
#define TU_FIELDS 72
#define TU_DIMS   8
struct stoke_dataset;
struct stoke_field *tu_fields_of(struct stoke_dataset *ds);
#define TU_F(ds)        tu_fields_of(ds)
#define TU_SHAPE(ds, f) ((int64_t *)(void *)TU_F(ds)[f].shape)
/* ds->read of one batch: field f of sample j at base[f] + j * fields[f].bytes (NULL: skipped),
 * as the loader lays a batch out. */
int tu_read_batch(struct stoke_dataset *ds, const uint64_t *idx, size_t n, void *const base[],
                  int worker, char *msg, size_t msg_len, uint64_t *err_index);
/* ds->read with each sample in slots of its own: field f of sample j at dst[j * nfields + f]
 * (n runs of one). */
int tu_read_each(struct stoke_dataset *ds, const uint64_t *idx, size_t n, void *const dst[],
                 int worker, char *msg, size_t msg_len, uint64_t *err_index);

#endif
