/* The registry: the selection rule, plugin loading and rejection, current device per thread. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "registry/registry.h"
#include "stoke/stoke.h"
#include "testutil.h"

static char pbuf[4][1024];

static const char *plug(int slot, const char *file)
{
    return tu_test_plugin(file, pbuf[slot], sizeof(pbuf[slot]));
}

static int setup(void **state)
{
    tu_log_capture();
    tu_log_clear();
    tu_use_none();
    return 0;
}

static int find_backend(const char *name, stoke_backend_info *out)
{
    int n = stoke_backend_count();
    for (int i = 0; i < n; i++) {
        assert_int_equal(stoke_backend_get_info(i, out), STOKE_OK);
        if (strcmp(out->name, name) == 0)
            return i;
    }
    return -1;
}

/* With no plugin: the built-in backends and nothing else, in their order; fills b[0..3]. */
static void get_builtins(stoke_backend_info b[4])
{
    static const char *const order[] = {"cuda", "hip", "opencl", "cpu"};
    assert_int_equal(stoke_backend_count(), 4);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(stoke_backend_get_info(i, &b[i]), STOKE_OK);
        assert_string_equal(b[i].name, order[i]);
    }
}

/* A CPU-only machine: no accelerator, every built-in listed with a reason. */
static void test_cpu_only_gives_no_accelerator(void **state)
{
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_string_equal(acc.backend, "");
    assert_non_null(strstr(acc.reason, "no accelerator"));
    int dev;
    assert_int_equal(stoke_device_get(&dev), STOKE_ENODEV);
    assert_int_equal(stoke_device_set(0), STOKE_ENODEV);

    stoke_backend_info builtins[4];
    get_builtins(builtins);
    for (int i = 0; i < 4; i++) {
        assert_int_equal(builtins[i].origin, STOKE_ORIGIN_BUILTIN);
        assert_true(strlen(builtins[i].reason) > 0);
    }
    stoke_backend_info b;
    assert_int_equal(stoke_backend_get_info(4, &b), STOKE_ERANGE);
    assert_int_equal(find_backend("cuda", &b), 0);
    assert_false(b.available); /* no driver on the test machines: libcuda.so.1 is absent */
}

static void test_plugin_beats_builtins(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", plug(0, "alpha.so"));
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(acc.device_count, 2);
    assert_int_equal(acc.current_device, 0);
    assert_non_null(strstr(acc.reason, "plugin"));
    stoke_backend_info b;
    assert_int_equal(find_backend("alpha", &b), 0); /* plugins are listed first */
    assert_int_equal(b.origin, STOKE_ORIGIN_PLUGIN);
    assert_string_equal(b.path, plug(0, "alpha.so"));
}

static void test_first_loaded_plugin_wins(void **state)
{
    char path[2200];
    snprintf(path, sizeof(path), "%s:%s", plug(0, "beta.so"), plug(1, "alpha.so"));
    tu_env("STOKE_PLUGIN_PATH", path);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
    assert_int_equal(acc.device_count, 3);
}

/* A directory contributes its .so files in name order; the broken ones in it are rejected
 * without stopping the others. */
static void test_plugin_directory_is_sorted_and_survives_broken_plugins(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", getenv("STOKE_TEST_PLUGIN_DIR"));
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha"); /* alpha.so sorts first */
    stoke_backend_info b;
    assert_true(find_backend("beta", &b) > find_backend("alpha", &b));
    assert_true(b.available);
    assert_true(tu_log_count(STOKE_LOG_WARN, "rejected") >= 6);
}

static void test_explicit_beats_plugin(void **state)
{
    char path[2200];
    snprintf(path, sizeof(path), "%s:%s", plug(0, "alpha.so"), plug(1, "beta.so"));
    setenv("STOKE_PLUGIN_PATH", path, 1);
    tu_env("STOKE_ACCELERATOR", "beta:2");
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
    assert_int_equal(acc.current_device, 2);
    assert_non_null(strstr(acc.reason, "explicit"));

    /* The API beats the environment. */
    assert_int_equal(stoke_accelerator_select("ALPHA:1"), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(acc.current_device, 1);
    /* A failed select keeps the previous choice. */
    assert_int_equal(stoke_accelerator_select("alpha:7"), STOKE_ERANGE);
    assert_int_equal(stoke_accelerator_select("nosuch"), STOKE_ENOENT);
    assert_int_equal(stoke_accelerator_select("bad name!"), STOKE_EINVAL);
    assert_int_equal(stoke_accelerator_select(""), STOKE_EINVAL); /* not NULL's meaning */
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    /* NULL returns to the environment's choice. */
    assert_int_equal(stoke_accelerator_select(NULL), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
}

static void test_unknown_explicit_lists_known_backends(void **state)
{
    setenv("STOKE_PLUGIN_PATH", plug(0, "alpha.so"), 1);
    tu_env("STOKE_ACCELERATOR", "bogus");
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENOENT);
    const char *err = stoke_last_error();
    assert_non_null(strstr(err, "bogus"));
    assert_non_null(strstr(err, "alpha, cuda, hip, opencl, cpu"));

    tu_env("STOKE_ACCELERATOR", "alpha:2");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ERANGE);
    assert_non_null(strstr(stoke_last_error(), "2 device(s)"));

    tu_env("STOKE_ACCELERATOR", "alpha:x");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_EINVAL);

    /* Explicitly asking for an unavailable backend: no accelerator, and the reason says why. */
    tu_env("STOKE_ACCELERATOR", "cuda");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_non_null(strstr(acc.reason, "cuda is unavailable"));

    /* The cpu fallback is never an accelerator, even when named. */
    tu_env("STOKE_ACCELERATOR", "cpu");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
}

/* Each broken plugin: its status from stoke_plugin_load, its listed reason, a warning. */
static stoke_backend_info plugin_at(const char *path);

static void test_broken_plugin_matrix(void **state)
{
    static const struct {
        const char *file;
        int rc;
        const char *reason;
    } cases[] = {
        {"bad_abi.so", STOKE_EABI, "ABI version 99 outside"},
        {"old_abi.so", STOKE_EABI, "ABI version 0 outside"},
        {"small_table.so", STOKE_EABI, "smaller than ABI v1"},
        {"missing_func.so", STOKE_EABI, "required function host_alloc is missing"},
        {"no_entry.so", STOKE_EABI, "no entry point stoke_backend_entry"},
        {"entry_fail.so", STOKE_EBACKEND, "entry point failed"},
        {"probe_fail.so", STOKE_ENODEV, "fake device is switched off"},
        {"not_a_plugin.so", STOKE_EIO, "dlopen failed"},
        {"does_not_exist.so", STOKE_ENOENT, "file not found"},
        {"dup_cuda.so", STOKE_EABI, "already registered"},
        {"half_events.so", STOKE_EABI, "function event_destroy is missing"},
        {"no_stream_sync.so", STOKE_EABI, "function stream_synchronize is missing"},
        {"bad_name.so", STOKE_EABI, "backend name 'my gpu' has a character other than"},
        {"ctor_thread.so", STOKE_EABI, "ABI version 99 outside"},
        {"reason_no_nul.so", STOKE_ENODEV, "AAAA"},
        {"entry_positive.so", STOKE_EBACKEND, "entry point failed with 5, not a stoke status"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tu_log_clear();
        const char *path = plug(0, cases[i].file);
        int rc = stoke_plugin_load(path);
        if (rc != cases[i].rc)
            fail_msg("%s: got %s, want %s", cases[i].file, stoke_err_name(rc),
                     stoke_err_name(cases[i].rc));
        assert_int_equal(tu_log_count(STOKE_LOG_WARN, path), 1);
        /* Listed, unavailable, with its reason. */
        int found = 0, n = stoke_backend_count();
        for (int j = 0; j < n; j++) {
            stoke_backend_info b;
            assert_int_equal(stoke_backend_get_info(j, &b), STOKE_OK);
            if (strcmp(b.path, path) != 0)
                continue;
            found = 1;
            assert_false(b.available);
            if (!strstr(b.reason, cases[i].reason))
                fail_msg("%s: reason '%s' lacks '%s'", cases[i].file, b.reason, cases[i].reason);
        }
        assert_true(found);
    }
    /* ctor_thread.so's thread still runs its code: the rejected library stayed loaded (an
     * unloaded one crashed here), and the reason that had no NUL was cut to the buffer. */
    usleep(20 * 1000);
    stoke_backend_info nonul = plugin_at(plug(0, "reason_no_nul.so"));
    assert_true(strlen(nonul.reason) < sizeof(nonul.reason));
    /* None of that was fatal: a good plugin still loads and wins. */
    assert_int_equal(stoke_plugin_load(plug(0, "alpha.so")), STOKE_OK);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
}

/* ---- plugin paths that are not plain plugin files ------------------------------------------ */

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st, (void)flag, (void)ftw;
    remove(path);
    return 0;
}

/* A fresh, empty directory $STOKE_TEST_TMP/registry-PID-NAME-XXXXXX (written to buf): unique
 * even when a directory left by an earlier run of a reused pid is still there (such leftovers
 * once made mkdir fail with EEXIST, a rare failure of this test). */
static const char *fresh_dir(const char *name, char *buf, size_t len)
{
    char leaf[128];
    snprintf(leaf, sizeof(leaf), "registry-%ld-%s-XXXXXX", (long)getpid(), name);
    tu_tmp_path(leaf, buf, len);
    if (mkdtemp(buf) == NULL)
        fail_msg("mkdtemp %s: %s", buf, strerror(errno));
    return buf;
}

static void remove_dir(const char *dir)
{
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* The listed plugin entry whose path is `path`; fails the test if there is none. */
static stoke_backend_info plugin_at(const char *path)
{
    int n = stoke_backend_count();
    for (int i = 0; i < n; i++) {
        stoke_backend_info b;
        assert_int_equal(stoke_backend_get_info(i, &b), STOKE_OK);
        if (b.origin == STOKE_ORIGIN_PLUGIN && strcmp(b.path, path) == 0)
            return b;
    }
    fail_msg("no plugin listed with path %s", path);
    stoke_backend_info none = {0};
    return none;
}

static void sigalrm_fail(int sig)
{
    (void)sig;
    static const char msg[] = "test_registry: timed out (dlopen blocked on a FIFO?)\n";
    ssize_t w = write(2, msg, sizeof(msg) - 1);
    (void)w;
    _exit(1);
}

/* A FIFO in STOKE_PLUGIN_PATH, and one named x.so in a plugin directory: both refused before
 * dlopen (which would block forever), with a reason and a warning; the other plugins load. */
static void test_fifo_in_plugin_path_is_refused(void **state)
{
    char dir[1024], fifo[1100], sub[1100], subfifo[1200], link[1200], path[4096];
    fresh_dir("fifo", dir, sizeof(dir));
    snprintf(fifo, sizeof(fifo), "%s/plugin.so", dir);
    snprintf(sub, sizeof(sub), "%s/plugins", dir);
    snprintf(subfifo, sizeof(subfifo), "%s/x.so", sub);
    snprintf(link, sizeof(link), "%s/a.so", sub);
    assert_int_equal(mkfifo(fifo, 0644), 0);
    assert_int_equal(mkdir(sub, 0755), 0);
    assert_int_equal(mkfifo(subfifo, 0644), 0);
    assert_int_equal(symlink(plug(0, "alpha.so"), link), 0); /* a symlink to a plugin is fine */
    snprintf(path, sizeof(path), "%s:%s:%s", fifo, sub, plug(1, "beta.so"));

    signal(SIGALRM, sigalrm_fail);
    alarm(60); /* a regression blocks in dlopen: fail instead of hanging */
    tu_env("STOKE_PLUGIN_PATH", path);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    alarm(0);
    signal(SIGALRM, SIG_DFL);

    assert_string_equal(acc.backend, "alpha");
    const char *fifos[] = {fifo, subfifo};
    for (int i = 0; i < 2; i++) {
        stoke_backend_info b = plugin_at(fifos[i]);
        assert_false(b.available);
        assert_non_null(strstr(b.reason, "is a FIFO, not a regular file or directory"));
        assert_int_equal(tu_log_count(STOKE_LOG_WARN, fifos[i]), 1);
    }
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "is a FIFO"), 2);
    assert_true(plugin_at(link).available);
    assert_true(plugin_at(plug(1, "beta.so")).available);
    assert_int_equal(stoke_backend_count(), 4 + 4);

    /* stoke_plugin_load refuses it the same way. */
    tu_log_clear();
    assert_int_equal(stoke_plugin_load(fifo), STOKE_EINVAL);
    assert_non_null(strstr(stoke_last_error(), "is a FIFO"));
    remove_dir(dir);
}

/* Copies the test plugin `file` to `to` with `mode`. */
static void copy_plugin(const char *file, const char *to, mode_t mode)
{
    char pb[1024];
    FILE *in = fopen(tu_test_plugin(file, pb, sizeof(pb)), "rb");
    FILE *out = fopen(to, "wb");
    assert_non_null(in);
    assert_non_null(out);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), in)) > 0)
        assert_int_equal(fwrite(buf, 1, n, out), n);
    fclose(in);
    assert_int_equal(fclose(out), 0);
    assert_int_equal(chmod(to, mode), 0);
}

/* stoke_plugin_load(path) is refused with STOKE_EIO and a reason that says `why`. */
static void assert_untrusted(const char *path, const char *why)
{
    tu_log_clear();
    assert_int_equal(stoke_plugin_load(path), STOKE_EIO);
    if (!strstr(stoke_last_error(), why)) /* the listed entries: the first with this path */
        fail_msg("%s: '%s' lacks '%s'", path, stoke_last_error(), why);
    assert_false(plugin_at(path).available);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, why), 1);
}

/* Code another local user could have written is never loaded: a plugin file or directory
 * writable by others (a sticky directory such as /tmp is fine) or by a group shared with others
 * (the owner's private group is fine), a link whose target's directory is, a file owned by
 * another user.  A bare name is the file in the working directory, never one found on the
 * dynamic linker's search path. */
static void test_plugin_others_could_write_is_refused(void **state)
{
    char dir[1024], safe[1024], file[1200], link[1200], cwd[PATH_MAX];
    fresh_dir("trust", dir, sizeof(dir));
    fresh_dir("trust-safe", safe, sizeof(safe));
    snprintf(file, sizeof(file), "%s/a.so", dir);
    snprintf(link, sizeof(link), "%s/link.so", safe);
    copy_plugin("alpha.so", file, 0755);
    assert_int_equal(symlink(file, link), 0);

    assert_int_equal(chmod(dir, 0777), 0);
    assert_untrusted(file, "the directory");
    assert_untrusted(file, "is writable by others");
    assert_untrusted(link, "is writable by others"); /* the target's directory */
    assert_int_equal(chmod(dir, 0755), 0);
    assert_int_equal(chmod(file, 0666), 0);
    assert_untrusted(file, "the file");
    assert_int_equal(chmod(file, 0755), 0);
    if (geteuid() == 0) { /* only root can give a file away */
        assert_int_equal(chown(file, 65534, 65534), 0);
        assert_untrusted(file, "is owned by another user");
        assert_int_equal(chown(file, 0, 65534), 0); /* root's, in a group root is not alone in */
        assert_int_equal(chmod(file, 0775), 0);
        assert_untrusted(file, "is writable by its group (not the owner's private one)");
        assert_int_equal(chown(file, 0, 0), 0);
    }

    /* Sticky and writable by all, as /tmp, and the file writable by its owner's private group
     * (umask 002): loads, by a bare name from the working directory. */
    assert_int_equal(chmod(dir, 01777), 0);
    assert_int_equal(chmod(file, 0775), 0);
    assert_non_null(getcwd(cwd, sizeof(cwd)));
    assert_int_equal(chdir(dir), 0);
    tu_log_clear();
    int rc = stoke_plugin_load("a.so");
    assert_int_equal(chdir(cwd), 0);
    if (rc != STOKE_OK)
        fail_msg("a.so from the working directory: %s (%s)", stoke_err_name(rc),
                 stoke_last_error());
    assert_true(plugin_at("a.so").available);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(chmod(dir, 0755), 0);
    remove_dir(dir);
    remove_dir(safe);
}

/* Creates `n` entries DIR/pNNN.so, each a symbolic link to TARGETS/tNNN (created later, so that
 * the directory is not touched again once its readdir order is known). */
static void make_link_dir(const char *dir, const char *targets, int n)
{
    for (int i = 0; i < n; i++) {
        char name[1200], target[1200];
        snprintf(name, sizeof(name), "%s/p%04d.so", dir, i);
        snprintf(target, sizeof(target), "%s/t%04d", targets, i);
        if (symlink(target, name) != 0)
            fail_msg("symlink %s: %s", name, strerror(errno));
    }
}

static void point_target(const char *targets, int i, const char *plugin_file)
{
    char target[1200], pb[1024];
    snprintf(target, sizeof(target), "%s/t%04d", targets, i);
    if (symlink(tu_test_plugin(plugin_file, pb, sizeof(pb)), target) != 0)
        fail_msg("symlink %s: %s", target, strerror(errno));
}

/* The *.so names of `dir` in readdir order; returns how many (at most `max`). */
static int readdir_order(const char *dir, char names[][16], int max)
{
    DIR *d = opendir(dir);
    assert_non_null(d);
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max)
        if (strstr(de->d_name, ".so") && strlen(de->d_name) < 16)
            memcpy(names[n++], de->d_name, strlen(de->d_name) + 1);
    closedir(d);
    return n;
}

/* More than 256 entries: every one is considered, in name order.  The entry readdir returns last
 * is made the first loadable one by name (alpha); the names before it are not plugins, the ones
 * after it are beta.  Considering only the first 256 in readdir order would choose beta (or
 * nothing). */
static void test_plugin_directory_considers_every_entry_in_name_order(void **state)
{
    enum { N = 300 };
    char base[1024], dir[1100], targets[1100];
    fresh_dir("many", base, sizeof(base));
    snprintf(dir, sizeof(dir), "%s/plugins", base);
    snprintf(targets, sizeof(targets), "%s/targets", base);
    assert_int_equal(mkdir(dir, 0755), 0);
    assert_int_equal(mkdir(targets, 0755), 0);
    make_link_dir(dir, targets, N);

    static char order[N][16];
    assert_int_equal(readdir_order(dir, order, N), N);
    const char *last = order[N - 1]; /* outside the first 256 in readdir order */
    for (int i = 0; i < N; i++) {
        char name[16];
        snprintf(name, sizeof(name), "p%04d.so", i);
        int c = strcmp(name, last);
        point_target(targets, i, c < 0 ? "not_a_plugin.so" : c == 0 ? "alpha.so" : "beta.so");
    }

    tu_env("STOKE_PLUGIN_PATH", dir);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    char want[1200];
    snprintf(want, sizeof(want), "%s/%s", dir, last);
    assert_non_null(strstr(acc.reason, want));

    /* Every entry is listed, in name order. */
    assert_int_equal(stoke_backend_count(), N + 4);
    for (int i = 0; i < N; i++) {
        stoke_backend_info b;
        assert_int_equal(stoke_backend_get_info(i, &b), STOKE_OK);
        snprintf(want, sizeof(want), "%s/p%04d.so", dir, i);
        assert_string_equal(b.path, want);
    }
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "limit"), 0);
    remove_dir(base);
}

/* A plugin path longer than stoke_backend_info.path is listed, and named in the selection's
 * reason, with its head and tail (the file's name) joined by " ... ", never plainly cut. */
static void test_long_plugin_path_is_shortened_visibly(void **state)
{
    char base[1024], path[2048];
    fresh_dir("longpath", base, sizeof(base));
    size_t n = (size_t)snprintf(path, sizeof(path), "%s", base);
    /* Levels of 190 bytes until the path is well past 1200 bytes, however long base is. */
    while (n < 1250) {
        path[n++] = '/';
        memset(path + n, 'd', 190);
        n += 190;
        path[n] = '\0';
        if (mkdir(path, 0755) != 0)
            fail_msg("mkdir %s: %s", path, strerror(errno));
    }
    snprintf(path + n, sizeof(path) - n, "/alpha.so");
    if (symlink(plug(0, "alpha.so"), path) != 0)
        fail_msg("symlink %s: %s", path, strerror(errno));
    assert_true(strlen(path) > 1200);

    tu_env("STOKE_PLUGIN_PATH", path);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    stoke_backend_info b;
    assert_int_equal(find_backend("alpha", &b), 0);
    size_t len = strlen(b.path);
    assert_int_equal(len, sizeof(b.path) - 1);
    assert_non_null(strstr(b.path, " ... "));
    assert_true(strncmp(b.path, path, 60) == 0);
    assert_string_equal(b.path + len - 10, "d/alpha.so");
    /* "first available plugin loaded by the application (<head> ... <tail>/alpha.so)" */
    len = strlen(acc.reason);
    assert_non_null(strstr(acc.reason, "first available plugin loaded by the application ("));
    assert_non_null(strstr(acc.reason, " ... "));
    assert_string_equal(acc.reason + len - 11, "d/alpha.so)");
    remove_dir(base);
}

/* Past the limit of plugin files, each skipped file is listed and warned about, naming the
 * limit. */
static void test_plugin_file_limit_is_reported(void **state)
{
    enum { N = 520, LIMIT = 512 };
    char base[1024], dir[1100];
    fresh_dir("limit", base, sizeof(base));
    snprintf(dir, sizeof(dir), "%s/plugins", base);
    assert_int_equal(mkdir(dir, 0755), 0);
    for (int i = 0; i < N; i++) {
        char name[1200];
        snprintf(name, sizeof(name), "%s/p%04d.so", dir, i);
        if (symlink(plug(0, i == 0 ? "alpha.so" : "not_a_plugin.so"), name) != 0)
            fail_msg("symlink %s: %s", name, strerror(errno));
    }

    tu_env("STOKE_PLUGIN_PATH", dir);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "alpha");
    assert_int_equal(stoke_backend_count(), N + 4);
    for (int i = 0; i < N; i++) {
        stoke_backend_info b;
        assert_int_equal(stoke_backend_get_info(i, &b), STOKE_OK);
        int skipped = strstr(b.reason, "limit of 512 plugin files") != NULL;
        assert_int_equal(skipped, i >= LIMIT);
        if (skipped)
            assert_string_equal(b.reason, "skipped: the limit of 512 plugin files is reached");
    }
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "limit of 512 plugin files"), N - LIMIT);
    char name[1200];
    snprintf(name, sizeof(name), "%s/p%04d.so", dir, N - 1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, name), 1);
    remove_dir(base);
}

/* An entry whose path is longer than PATH_MAX is refused with a reason.  Cut to PATH_MAX it
 * would name another file (beta, with no .so suffix): that file must never be loaded. */
static void test_plugin_path_too_long_is_refused(void **state)
{
    char base[1024], dir[PATH_MAX];
    fresh_dir("long", base, sizeof(base));
    /* Nested directories up to 3900 bytes of path. */
    snprintf(dir, sizeof(dir), "%s", base);
    while (strlen(dir) < 3900) {
        size_t len = strlen(dir), part = 3900 - len - 1 < 200 ? 3900 - len - 1 : 200;
        dir[len] = '/';
        memset(dir + len + 1, 'd', part);
        dir[len + 1 + part] = '\0';
        if (mkdir(dir, 0755) != 0)
            fail_msg("mkdir (%zu bytes): %s", strlen(dir), strerror(errno));
    }
    assert_int_equal(strlen(dir), 3900);
    int dfd = open(dir, O_DIRECTORY | O_RDONLY);
    assert_true(dfd >= 0);
    /* dir + '/' + prefix is exactly PATH_MAX - 1 bytes, what a cut path would keep. */
    char prefix[256], longname[300];
    size_t plen = PATH_MAX - 1 - strlen(dir) - 1;
    memset(prefix, 'q', plen);
    prefix[plen] = '\0';
    snprintf(longname, sizeof(longname), "%s-too-long.so", prefix);
    assert_int_equal(symlinkat(plug(0, "beta.so"), dfd, prefix), 0);
    assert_int_equal(symlinkat(plug(1, "alpha.so"), dfd, longname), 0);

    tu_env("STOKE_PLUGIN_PATH", dir);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_int_equal(stoke_backend_count(), 1 + 4);
    stoke_backend_info b;
    assert_int_equal(stoke_backend_get_info(0, &b), STOKE_OK);
    assert_false(b.available);
    char want[128];
    snprintf(want, sizeof(want), "path of %zu bytes is longer than the %d-byte limit",
             strlen(dir) + 1 + strlen(longname), PATH_MAX);
    assert_non_null(strstr(b.reason, want));
    assert_non_null(strstr(b.path, "-too-long.so"));
    assert_int_equal(find_backend("beta", &b), -1);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, "longer than the 4096-byte limit"), 1);
    /* The links' full paths are too long for remove(): unlink them through the directory. */
    unlinkat(dfd, longname, 0);
    unlinkat(dfd, prefix, 0);
    close(dfd);
    remove_dir(base);
}

/* Naming an unavailable backend warns with that backend's own reason, and the selection and the
 * last error carry it. */
static void test_explicit_unavailable_warns_with_its_reason(void **state)
{
    char lib[1024];
    tu_tmp_path("registry-no-such-libcuda.so.1", lib, sizeof(lib));
    setenv("STOKE_CUDA_LIBRARY", lib, 1);
    tu_env("STOKE_ACCELERATOR", "cuda");
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    char want[1200];
    snprintf(want, sizeof(want),
             "STOKE_ACCELERATOR=cuda requested, but cuda is unavailable: %s "
             "not found (STOKE_CUDA_LIBRARY)",
             lib);
    assert_non_null(strstr(acc.reason, want));
    assert_non_null(strstr(stoke_last_error(), want));
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, want), 1);
    int dev;
    assert_int_equal(stoke_device_get(&dev), STOKE_ENODEV);
    assert_non_null(strstr(stoke_last_error(), want));
    /* Asked again (or after a plugin load re-selects): no second warning. */
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_int_equal(stoke_plugin_load(plug(0, "beta.so")), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, want), 1);
    unsetenv("STOKE_CUDA_LIBRARY");

    /* A plugin the same way: its probe's reason. */
    tu_log_clear();
    setenv("STOKE_PLUGIN_PATH", plug(0, "probe_fail.so"), 1);
    tu_env("STOKE_ACCELERATOR", "probefail");
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    const char *pwant = "STOKE_ACCELERATOR=probefail requested, but probefail is unavailable: "
                        "fake device is switched off";
    assert_non_null(strstr(acc.reason, pwant));
    assert_non_null(strstr(stoke_last_error(), pwant));
    assert_int_equal(tu_log_count(STOKE_LOG_WARN, pwant), 1);
}

/* Every built-in table passes the checks a plugin's does (stream_synchronize among them). */
static void test_builtin_tables_are_valid(void **state)
{
    stoke_backend_info b[4];
    get_builtins(b);
    for (int i = 0; i < 4; i++)
        if (strstr(b[i].reason, "rejected"))
            fail_msg("built-in %s: %s", b[i].name, b[i].reason);
}

static void test_api_load_after_selection_reselects(void **state)
{
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_ENODEV);
    assert_int_equal(stoke_plugin_load(plug(0, "beta.so")), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
    /* Loading the same backend twice is rejected, the first stays. */
    assert_int_equal(stoke_plugin_load(plug(0, "beta.so")), STOKE_EABI);
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_string_equal(acc.backend, "beta");
}

typedef struct {
    int set_to;
    int seen_before, seen_after;
} dev_job;

static pthread_barrier_t barrier;

static void *device_thread(void *arg)
{
    dev_job *j = arg;
    stoke_device_get(&j->seen_before);
    pthread_barrier_wait(&barrier);
    if (j->set_to >= 0)
        stoke_device_set(j->set_to);
    pthread_barrier_wait(&barrier);
    stoke_device_get(&j->seen_after);
    return NULL;
}

static void test_current_device_is_per_thread(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", plug(0, "beta.so"));
    assert_int_equal(stoke_device_set(3), STOKE_ERANGE);
    assert_int_equal(stoke_device_set(-1), STOKE_ERANGE);
    assert_int_equal(stoke_device_set(2), STOKE_OK);
    pthread_barrier_init(&barrier, NULL, 3);
    dev_job a = {.set_to = 1}, b = {.set_to = -1};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, device_thread, &a);
    pthread_create(&tb, NULL, device_thread, &b);
    pthread_barrier_wait(&barrier);
    pthread_barrier_wait(&barrier);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    pthread_barrier_destroy(&barrier);
    assert_int_equal(a.seen_before, 0);
    assert_int_equal(a.seen_after, 1);
    assert_int_equal(b.seen_before, 0);
    assert_int_equal(b.seen_after, 0);
    int dev;
    assert_int_equal(stoke_device_get(&dev), STOKE_OK);
    assert_int_equal(dev, 2);
    stoke_accelerator_info acc;
    assert_int_equal(stoke_accelerator_get(&acc), STOKE_OK);
    assert_int_equal(acc.current_device, 2);
}

/* The explicit index is every new thread's default device. */
static void *default_device_thread(void *arg)
{
    stoke_device_get(arg);
    return NULL;
}

static void test_explicit_index_is_default_for_new_threads(void **state)
{
    setenv("STOKE_PLUGIN_PATH", plug(0, "beta.so"), 1);
    tu_env("STOKE_ACCELERATOR", "beta:1");
    int dev = -1;
    pthread_t t;
    pthread_create(&t, NULL, default_device_thread, &dev);
    pthread_join(t, NULL);
    assert_int_equal(dev, 1);
}

static void test_device_props(void **state)
{
    tu_env("STOKE_PLUGIN_PATH", plug(0, "alpha.so"));
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props(NULL, 1, &p), STOKE_OK);
    assert_string_equal(p.name, "alpha device");
    assert_int_equal(stoke_device_get_props(NULL, 2, &p), STOKE_ERANGE);
    assert_int_equal(stoke_device_get_props("cpu", 0, &p), STOKE_OK);
    assert_string_equal(p.name, "host CPU");
    assert_int_equal(stoke_device_get_props("nosuch", 0, &p), STOKE_ENOENT);
    p.size = 0;
    assert_int_equal(stoke_device_get_props(NULL, 0, &p), STOKE_EINVAL);
}

static void test_status_codes(void **state)
{
    assert_string_equal(stoke_err_name(STOKE_OK), "STOKE_OK");
    assert_string_equal(stoke_err_name(STOKE_ETIMEDOUT), "STOKE_ETIMEDOUT");
    assert_string_equal(stoke_strerror(STOKE_ENOMEM), "out of memory");
    assert_string_equal(stoke_err_name(-999), "STOKE_UNKNOWN");
    assert_string_equal(stoke_strerror(-999), "unknown status");
    /* Codes are distinct and every one has a name and message. */
#define CHECK(name, value, msg)                                                                    \
    assert_string_equal(stoke_err_name(value), "STOKE_" #name);                                    \
    assert_string_equal(stoke_strerror(value), msg);
    STOKE_STATUS_MAP(CHECK)
#undef CHECK
    assert_int_equal(stoke_version(), STOKE_VERSION_NUMBER);
    assert_string_equal(stoke_version_string(), STOKE_VERSION_STRING);
}

static int teardown(void **state)
{
    tu_use_none();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_cpu_only_gives_no_accelerator, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_beats_builtins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_first_loaded_plugin_wins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_directory_is_sorted_and_survives_broken_plugins,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_beats_plugin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_explicit_lists_known_backends, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_broken_plugin_matrix, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fifo_in_plugin_path_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_others_could_write_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_directory_considers_every_entry_in_name_order,
                                        setup, teardown),
        cmocka_unit_test_setup_teardown(test_plugin_file_limit_is_reported, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_plugin_path_is_shortened_visibly, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_plugin_path_too_long_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_unavailable_warns_with_its_reason, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_builtin_tables_are_valid, setup, teardown),
        cmocka_unit_test_setup_teardown(test_api_load_after_selection_reselects, setup, teardown),
        cmocka_unit_test_setup_teardown(test_current_device_is_per_thread, setup, teardown),
        cmocka_unit_test_setup_teardown(test_explicit_index_is_default_for_new_threads, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_device_props, setup, teardown),
        cmocka_unit_test(test_status_codes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
