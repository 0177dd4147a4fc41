#define _GNU_SOURCE
#include "testutil.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "registry/registry.h"
#include "stoke/stoke.h"

#define TU_MAX_LINES 4096

static pthread_mutex_t tu_lock = PTHREAD_MUTEX_INITIALIZER;
static struct {
    int level;
    char *msg;
} lines[TU_MAX_LINES];
static int nlines;

static void tu_sink(void *user, int level, const char *msg)
{
    pthread_mutex_lock(&tu_lock);
    if (nlines < TU_MAX_LINES) {
        lines[nlines].level = level;
        lines[nlines].msg = strdup(msg);
        nlines++;
    }
    pthread_mutex_unlock(&tu_lock);
    if (getenv("TU_LOG_ECHO"))
        fprintf(stderr, "[log %s] %s\n", stoke_log_level_name(level), msg);
}

void tu_log_capture(void)
{
    stoke_log_set_level(STOKE_LOG_TRACE);
    stoke_log_set_callback(tu_sink, NULL);
}

int tu_log_count(int level, const char *needle)
{
    int n = 0;
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nlines; i++)
        if ((level < 0 || lines[i].level == level) && (!needle || strstr(lines[i].msg, needle)))
            n++;
    pthread_mutex_unlock(&tu_lock);
    return n;
}

void tu_log_clear(void)
{
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nlines; i++)
        free(lines[i].msg);
    nlines = 0;
    pthread_mutex_unlock(&tu_lock);
}

void tu_log_dump(void)
{
    pthread_mutex_lock(&tu_lock);
    for (int i = 0; i < nlines; i++)
        fprintf(stderr, "  log[%s] %s\n", stoke_log_level_name(lines[i].level), lines[i].msg);
    pthread_mutex_unlock(&tu_lock);
}

const char *tu_simdev_path(void)
{
    const char *p = getenv("STOKE_SIMDEV_PLUGIN");
    if (!p || !*p)
        fail_msg("STOKE_SIMDEV_PLUGIN is not set (run the tests through ctest)");
    return p;
}

const char *tu_test_plugin(const char *file, char *buf, size_t len)
{
    const char *dir = getenv("STOKE_TEST_PLUGIN_DIR");
    if (!dir || !*dir)
        fail_msg("STOKE_TEST_PLUGIN_DIR is not set (run the tests through ctest)");
    snprintf(buf, len, "%s/%s", dir, file);
    return buf;
}

const char *tu_tmp_path(const char *name, char *buf, size_t len)
{
    const char *dir = getenv("STOKE_TEST_TMP");
    snprintf(buf, len, "%s/%s", dir && *dir ? dir : "/tmp", name);
    return buf;
}

void tu_registry_reset(void)
{
    stoke__registry_reset();
}

void tu_env(const char *name, const char *value)
{
    if (value)
        setenv(name, value, 1);
    else
        unsetenv(name);
    stoke__registry_reset();
}

void tu_use_simdev(void)
{
    unsetenv("STOKE_ACCELERATOR");
    setenv("STOKE_PLUGIN_PATH", tu_simdev_path(), 1);
    stoke__registry_reset();
}

void tu_use_none(void)
{
    unsetenv("STOKE_ACCELERATOR");
    unsetenv("STOKE_PLUGIN_PATH");
    stoke__registry_reset();
}

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

const char *tu_cli_path(void)
{
    const char *p = getenv("STOKE_CLI");
    if (!p || !*p)
        fail_msg("STOKE_CLI is not set (run the tests through ctest)");
    return p;
}

static void slurp(int fd, char *buf, size_t len)
{
    size_t used = 0;
    char sink[4096];
    for (;;) {
        char *dst = buf && used + 1 < len ? buf + used : sink;
        size_t room = buf && used + 1 < len ? len - 1 - used : sizeof(sink);
        ssize_t n = read(fd, dst, room);
        if (n <= 0)
            break;
        if (dst != sink)
            used += (size_t)n;
    }
    if (buf && len)
        buf[used] = '\0';
}

/* In the child: applies the extra environment entries of tu_run. */
static void child_env(const char *const env[])
{
    for (int i = 0; env && env[i]; i++) {
        const char *eq = strchr(env[i], '=');
        if (!eq)
            continue;
        char name[256];
        snprintf(name, sizeof(name), "%.*s", (int)(eq - env[i]), env[i]);
        if (eq[1])
            setenv(name, eq + 1, 1);
        else
            unsetenv(name);
    }
}

/* tu_run, with stdout on /dev/full when `full` (nothing captured into `out`). */
static int run_child(const char *const argv[], const char *const env[], int full, char *out,
                     size_t out_len, char *err, size_t err_len)
{
    char outp[512], errp[512];
    static int seq;
    if (full)
        snprintf(outp, sizeof(outp), "/dev/full");
    else
        snprintf(outp, sizeof(outp), "%s.%d.%d.out", tu_tmp_path("run", (char[512]){0}, 512),
                 (int)getpid(), seq);
    snprintf(errp, sizeof(errp), "%s.%d.%d.err", tu_tmp_path("run", (char[512]){0}, 512),
             (int)getpid(), seq++);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fo = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int fe = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (fo < 0 || fe < 0)
            _exit(126);
        dup2(fo, 1);
        dup2(fe, 2);
        child_env(env);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        ;
    int fo = full ? -1 : open(outp, O_RDONLY), fe = open(errp, O_RDONLY);
    if (fo >= 0) {
        slurp(fo, out, out_len);
        close(fo);
    }
    if (fe >= 0) {
        slurp(fe, err, err_len);
        close(fe);
    }
    if (!full)
        unlink(outp);
    unlink(errp);
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return -1;
}

int tu_run(const char *const argv[], const char *const env[], char *out, size_t out_len, char *err,
           size_t err_len)
{
    return run_child(argv, env, 0, out, out_len, err, err_len);
}

/* Fills argv (TU_CLI_MAX_ARGS + 2 entries) for tu_run_cli. */
static void cli_argv(const char *argv[], const char *cmd, const char *const args[])
{
    int n = 0;
    argv[n++] = tu_cli_path();
    if (cmd)
        argv[n++] = cmd;
    for (int i = 0; args[i]; i++) {
        if (n > TU_CLI_MAX_ARGS)
            fail_msg("tu_run_cli: more than %d arguments", TU_CLI_MAX_ARGS);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
}

int tu_run_cli(const char *const env[], const char *cmd, const char *const args[], char *out,
               size_t out_len, char *err, size_t err_len)
{
    const char *argv[TU_CLI_MAX_ARGS + 2];
    cli_argv(argv, cmd, args);
    return run_child(argv, env, 0, out, out_len, err, err_len);
}

int tu_run_cli_full(const char *const env[], const char *cmd, const char *const args[], char *err,
                    size_t err_len)
{
    const char *argv[TU_CLI_MAX_ARGS + 2];
    cli_argv(argv, cmd, args);
    return run_child(argv, env, 1, NULL, 0, err, err_len);
}

const char *tu_simdev_env(void)
{
    static char env[1024];
    snprintf(env, sizeof(env), "STOKE_PLUGIN_PATH=%s", tu_simdev_path());
    return env;
}

struct stoke_simdev_counters tu_simdev_counters(void)
{
    struct stoke_simdev_counters c;
    memset(&c, 0, sizeof(c));
    c.size = sizeof(c);
    void *h = dlopen(tu_simdev_path(), RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        fail_msg("simdev is not loaded: %s", dlerror());
    stoke_simdev_counters_fn fn;
    *(void **)&fn = dlsym(h, STOKE_SIMDEV_COUNTERS_SYMBOL);
    assert_non_null(fn);
    assert_int_equal(fn(&c), STOKE_OK);
    dlclose(h);
    assert_int_equal(c.version, STOKE_SIMDEV_COUNTERS_VERSION);
    assert_int_equal(c.size, sizeof(c));
    return c;
}

/* ---- skips (testutil.h) ---------------------------------------------------------------------- */

static int tu_nskipped; /* tests run one after another on the main thread */

void tu_skip_note(const char *fmt, ...)
{
    char why[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof(why), fmt, ap);
    va_end(ap);
    print_message("[  SKIP    ] %s\n", why);
    tu_nskipped++;
}

int tu_skipped(void)
{
    return tu_nskipped;
}

int tu_exit_status(int failed)
{
    if (failed)
        return 1;
    if (tu_nskipped) {
        print_message("[  SKIPPED ] %d test(s) skipped a check: reported to CTest as skipped "
                      "(exit %d), not passed\n",
                      tu_nskipped, TU_SKIP_EXIT);
        return TU_SKIP_EXIT;
    }
    return 0;
}

/* ---- every sample exactly once (testutil.h) ------------------------------------------------ */

void tu_seen_init(tu_seen *s, uint64_t n)
{
    s->n = n;
    s->count = 0;
    s->bits = calloc((size_t)(n / 8 + 1), 1);
    if (!s->bits)
        fail_msg("tu_seen_init: out of memory for %llu indices", (unsigned long long)n);
}

void tu_seen_add(tu_seen *s, uint64_t i)
{
    if (i >= s->n)
        fail_msg("index %llu out of range (%llu samples)", (unsigned long long)i,
                 (unsigned long long)s->n);
    unsigned char bit = (unsigned char)(1u << (i % 8));
    if (s->bits[i / 8] & bit)
        fail_msg("index %llu seen twice", (unsigned long long)i);
    s->bits[i / 8] |= bit;
    s->count++;
}

void tu_seen_check_all(const tu_seen *s)
{
    for (uint64_t i = 0; i < s->n; i++)
        if (!(s->bits[i / 8] & (1u << (i % 8))))
            fail_msg("index %llu never seen (%llu of %llu seen)", (unsigned long long)i,
                     (unsigned long long)s->count, (unsigned long long)s->n);
}

void tu_seen_free(tu_seen *s)
{
    free(s->bits);
    s->bits = NULL;
}

/* ---- .npy files and the page cache ----------------------------------------------------- */

#include <sys/mman.h>
#include <sys/stat.h>

size_t tu_npy_head(unsigned char *out, const char *dict)
{
    size_t dl = strlen(dict), total = (10 + dl + 1 + 63) / 64 * 64, hlen = total - 10;
    assert_true(total <= 256);
    memcpy(out, "\x93NUMPY\x01\x00", 8);
    out[8] = (unsigned char)(hlen & 0xff);
    out[9] = (unsigned char)(hlen >> 8);
    memcpy(out + 10, dict, dl);
    memset(out + 10 + dl, ' ', hlen - dl - 1);
    out[total - 1] = '\n';
    return total;
}

size_t tu_npy_write(const char *path, const char *dict, const void *data, size_t n)
{
    unsigned char head[256];
    size_t hn = tu_npy_head(head, dict);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, hn, f), hn);
    assert_int_equal(fwrite(data, 1, n, f), n);
    assert_int_equal(fclose(f), 0);
    return hn;
}

int tu_resident_pct(const char *path, size_t first, size_t n)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    struct stat st;
    assert_int_equal(fstat(fd, &st), 0);
    size_t pg = (size_t)sysconf(_SC_PAGESIZE), pages = ((size_t)st.st_size + pg - 1) / pg;
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    assert_true(m != MAP_FAILED);
    unsigned char *vec = malloc(pages);
    assert_non_null(vec);
    assert_int_equal(mincore(m, (size_t)st.st_size, vec), 0);
    if (!n)
        n = pages - first;
    size_t hit = 0;
    for (size_t i = first; i < first + n; i++)
        hit += vec[i] & 1;
    free(vec);
    munmap(m, (size_t)st.st_size);
    close(fd);
    return (int)(hit * 100 / n);
}

int tu_evict(const char *path)
{
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fdatasync(fd), 0);
    assert_int_equal(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
    close(fd);
    return tu_resident_pct(path, 0, 0);
}

int tu_count_fds_to(const char *what)
{
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char path[PATH_MAX], target[PATH_MAX];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", de->d_name);
        ssize_t len = readlink(path, target, sizeof(target) - 1);
        if (len <= 0)
            continue;
        target[len] = '\0';
        n += strstr(target, what) != NULL;
    }
    closedir(d);
    return n;
}

int tu_pid_gone(int pid)
{
    return kill(pid, 0) == -1 && errno == ESRCH;
}

void tu_assert_no_children(void)
{
    assert_int_equal(waitpid(-1, NULL, WNOHANG), -1);
    assert_int_equal(errno, ECHILD);
}

void tu_note_worker_pids(const struct stoke_loader *l, int workers, int *pids, int *npids, int cap)
{
    for (int w = 0; w < workers; w++) {
        int pid = stoke_loader_worker_pid(l, w);
        int known = pid <= 0;
        for (int k = 0; k < *npids && !known; k++)
            known = pids[k] == pid;
        if (!known && *npids < cap)
            pids[(*npids)++] = pid;
    }
}

void tu_sleep_ms(long ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ; /* the rest of it after a signal */
}

int tu_count_unix_names(const char *what)
{
    FILE *f = fopen("/proc/net/unix", "r");
    if (!f)
        return 0;
    char line[512];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, what) != NULL;
    fclose(f);
    return n;
}

/* ---- test datasets' fields ---------------------------------------------------------------- */

#define TU_POOL 512
static stoke_field tu_pool[TU_POOL][TU_FIELDS];
static int64_t tu_pool_shapes[TU_POOL][TU_FIELDS][TU_DIMS];
static atomic_int tu_pool_used;

stoke_field *tu_fields_of(stoke_dataset *ds)
{
    uintptr_t f = (uintptr_t)ds->fields, p0 = (uintptr_t)tu_pool;
    if (f >= p0 && f - p0 < sizeof(tu_pool))
        return (stoke_field *)f;
    int e = atomic_fetch_add(&tu_pool_used, 1);
    if (e >= TU_POOL) {
        fprintf(stderr, "testutil: more than %d test datasets' fields\n", TU_POOL);
        abort();
    }
    for (int k = 0; k < TU_FIELDS; k++) {
        memset(&tu_pool[e][k], 0, sizeof(tu_pool[e][k]));
        tu_pool[e][k].shape = tu_pool_shapes[e][k];
    }
    ds->fields = tu_pool[e];
    return tu_pool[e];
}

int tu_read_batch(stoke_dataset *ds, const uint64_t *idx, size_t n, void *const base[], int worker,
                  char *msg, size_t msg_len, uint64_t *err_index)
{
    size_t start[2] = {0, n};
    stoke_slots s = {1, start, base, NULL};
    return ds->read(ds->user, idx, n, &s, worker, msg, msg_len, err_index);
}

int tu_read_each(stoke_dataset *ds, const uint64_t *idx, size_t n, void *const dst[], int worker,
                 char *msg, size_t msg_len, uint64_t *err_index)
{
    size_t *start = calloc(n + 1, sizeof(*start));
    if (!start)
        abort();
    for (size_t j = 0; j <= n; j++)
        start[j] = j;
    stoke_slots s = {n, start, dst, NULL};
    int rc = ds->read(ds->user, idx, n, &s, worker, msg, msg_len, err_index);
    free(start);
    return rc;
}
