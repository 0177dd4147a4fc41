/* The registry: which backends exist, which one is the accelerator, and why.
 *
 * Locking: `reg.lock` protects everything in `reg` except `reg.selected`, which is published
 * with release/acquire atomics so that the hot path (stoke__accel_current, called by every
 * pinned allocation) reads it without the lock.  A selection is immutable once published; a new
 * one (after stoke_accelerator_select or a plugin load) is a new object, and the old ones stay
 * allocated until stoke__registry_reset, so a reader never sees one change under it.  Entries are
 * never freed while the process runs (only stoke__registry_reset, for tests, frees them), so a
 * published entry pointer stays valid. The current device is per thread, tagged with the selection
 * generation it belongs to. */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backends/builtin.h"
#include "common/env.h"
#include "common/internal.h"
#include "registry/plugin_trust.h"
#include "registry/registry.h"
#include "registry/table.h"

/* Plugin files tried in all (STOKE_PLUGIN_PATH and stoke_plugin_load); a file past it is listed
 * as rejected, naming the limit. */
#define MAX_PLUGIN_FILES 512

typedef struct entry {
    stoke_backend_info info;
    const stoke_backend *vt; /* NULL when rejected before a valid table */
    void *dl;                /* plugins: dlopen handle */
    int probed;              /* 1 once probe ran with `probe_flags` */
    uint32_t probe_flags;
    int forked_from; /* set up by this pid, an ancestor: unavailable here (0: no) */
} entry;

typedef struct selection {
    entry *e;           /* NULL: no accelerator */
    int status;         /* STOKE_OK, STOKE_ENODEV, STOKE_ENOENT, STOKE_ERANGE */
    int default_device; /* index given explicitly, else 0 */
    int device_count;   /* of `e` when chosen: readers need no lock */
    int explicit_spec;  /* chosen by name (stoke_accelerator_select or STOKE_ACCELERATOR) */
    unsigned gen;       /* bumps at every new selection */
    char reason[256];
    char error[512];         /* for ENOENT/ERANGE: the message for stoke_last_error */
    struct selection *older; /* earlier selections, kept alive for lock-free readers */
} selection;

static struct {
    pthread_mutex_t lock;
    int initialized;
    entry **plugins; /* in load order; each entry is allocated on its own and never moves */
    int nplugins, plugins_cap;
    entry builtins[4]; /* cuda, hip, opencl, cpu: in selection/listing order */
    int nbuiltins;
    char api_spec[64];              /* stoke_accelerator_select; "" = none */
    selection *sel;                 /* latest selection, NULL until computed */
    _Atomic(selection *) published; /* `sel` once valid; NULL while it must be recomputed */
    atomic_uint gen;
    int pid; /* the process that set the entries up (see fork_child) */
} reg = {.lock = PTHREAD_MUTEX_INITIALIZER};

static _Thread_local int tl_device = -1;
static _Thread_local unsigned tl_gen;
static _Thread_local int tl_holds_reg; /* this thread holds reg.lock (see fork_child) */

static void fork_child(void);
static pthread_once_t fork_hooked = PTHREAD_ONCE_INIT;

static void hook_fork(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

/* (the fork handler is installed before the lock is first taken: a fork while another thread
 * held it during the first init found no handler, and the child waited for ever) */
static void reg_lock(void)
{
    pthread_once(&fork_hooked, hook_fork);
    pthread_mutex_lock(&reg.lock);
    tl_holds_reg = 1;
}

static void reg_unlock(void)
{
    tl_holds_reg = 0;
    pthread_mutex_unlock(&reg.lock);
}

/* A plugin's log line.  Warnings and errors also become the calling thread's last error: a
 * plugin reports the detail of a failing call this way (its calls run in the caller's thread),
 * so the caller's message can carry it (see device.c and the pinned allocator). */
static void host_log(const char *backend, int level, const char *msg)
{
    const char *who = backend ? backend : "backend";
    stoke__log(level, "%s: %s", who, msg);
    if (level <= STOKE_LOG_WARN)
        stoke__set_error_text("%s: %s", who, msg);
}

static const stoke_backend_host host_info = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend_host),
    .abi_min = STOKE_BACKEND_ABI_MIN,
    .log = host_log,
};

/* Runs the probe with `flags` unless already done so; returns availability. */
static int probe_entry(entry *e, uint32_t flags)
{
    if (!e->vt)
        return 0;
    if (e->forked_from) { /* never probed again here: a driver's threads did not survive */
        e->info.available = 0;
        e->info.device_count = 0;
        e->info.caps = 0;
        stoke__fmt(e->info.reason, sizeof(e->info.reason),
                   "set up by process %d, which this process was forked from: an accelerator "
                   "runtime does not survive fork (use it in that process, or in one started "
                   "anew, not forked)",
                   e->forked_from);
        return 0;
    }
    if (e->probed && e->probe_flags == flags)
        return e->info.available;

    char reason[sizeof(e->info.reason)] = "";
    int rc = e->vt->probe(flags, reason, sizeof(reason));
    reason[sizeof(reason) - 1] = '\0'; /* a probe that filled it without a NUL */
    int count = 0;
    if (rc == STOKE_OK) {
        rc = e->vt->device_count(&count);
        if (rc == STOKE_OK && count <= 0) {
            rc = STOKE_ENODEV;
            if (!reason[0] || !strstr(reason, "device"))
                stoke__strlcpy(reason, "no device", sizeof(reason));
        }
    }
    e->probed = 1;
    e->probe_flags = flags;
    e->info.available = rc == STOKE_OK;
    e->info.device_count = rc == STOKE_OK ? count : 0;
    e->info.caps = rc == STOKE_OK ? stoke__effective_caps(e->vt) : 0;
    if (!reason[0])
        stoke__strlcpy(reason, rc == STOKE_OK ? "available" : stoke_strerror(rc), sizeof(reason));
    stoke__strlcpy(e->info.reason, reason, sizeof(e->info.reason));
    stoke__log(STOKE_LOG_DEBUG, "backend %s: %s (%s)", e->info.name,
               e->info.available ? "available" : "unavailable", e->info.reason);
    return e->info.available;
}

static entry *find_locked(const char *name)
{
    for (int i = 0; i < reg.nplugins; i++)
        if (reg.plugins[i]->vt && strcasecmp(reg.plugins[i]->info.name, name) == 0)
            return reg.plugins[i];
    for (int i = 0; i < reg.nbuiltins; i++)
        if (strcasecmp(reg.builtins[i].info.name, name) == 0)
            return &reg.builtins[i];
    return NULL;
}

static void names_locked(char *out, size_t len)
{
    size_t used = 0;
    out[0] = '\0';
    for (int i = 0; i < reg.nplugins + reg.nbuiltins; i++) {
        const entry *e = i < reg.nplugins ? reg.plugins[i] : &reg.builtins[i - reg.nplugins];
        if (!e->vt)
            continue;
        int w = snprintf(out + used, len - used, "%s%s", used ? ", " : "", e->info.name);
        if (w < 0 || (size_t)w >= len - used)
            return;
        used += (size_t)w;
    }
}

/* Appends a new plugin entry for `path` (listed from now on, even if rejected); NULL when out of
 * memory. */
static entry *add_plugin_entry_locked(const char *path)
{
    if (reg.nplugins == reg.plugins_cap) {
        int cap = reg.plugins_cap ? 2 * reg.plugins_cap : 16;
        entry **grown = realloc(reg.plugins, (size_t)cap * sizeof(*grown));
        if (!grown)
            return NULL;
        reg.plugins = grown;
        reg.plugins_cap = cap;
    }
    entry *e = calloc(1, sizeof(*e));
    if (!e)
        return NULL;
    e->info.origin = STOKE_ORIGIN_PLUGIN;
    /* A path longer than info.path keeps its head and tail joined by " ... ": cut plainly, it
     * would name a file that does not exist. */
    stoke__shorten(e->info.path, sizeof(e->info.path), path);
    const char *base = strrchr(path, '/');
    stoke__strlcpy(e->info.name, base ? base + 1 : path, sizeof(e->info.name));
    reg.plugins[reg.nplugins++] = e;
    return e;
}

/* Marks `e` `verb` ("rejected", "skipped") because of `why`, logs it at WARN and returns `rc`
 * (the last error says the same). */
static int set_unusable_locked(entry *e, const char *path, int rc, const char *verb,
                               const char *why)
{
    /* A rejected library stays loaded (e->dl is kept, never dlclose'd): its constructors and
     * entry point have run and may have started threads that still run its code. */
    e->vt = NULL;
    e->probed = 1;
    stoke__fmt(e->info.reason, sizeof(e->info.reason), "%s: %s", verb, why);
    return stoke__fail_at(STOKE_LOG_WARN, rc, "plugin %s %s: %s", path, verb, why);
}

static int reject_locked(entry *e, const char *path, int rc, const char *why)
{
    return set_unusable_locked(e, path, rc, "rejected", why);
}

/* dlopens the checked, resolved path `real` into `e`, calls its entry point and checks the
 * table it returns. */
static int open_plugin_locked(entry *e, const char *real, char *why, size_t why_len)
{
    e->dl = dlopen(real, RTLD_NOW | RTLD_LOCAL);
    if (!e->dl) {
        const char *err = dlerror();
        stoke__fmt(why, why_len, "dlopen failed: %s", err ? err : "unknown error");
        return STOKE_EIO;
    }
    stoke_backend_entry_fn fn;
    *(void **)&fn = dlsym(e->dl, STOKE_BACKEND_ENTRY_SYMBOL);
    if (!fn) {
        stoke__fmt(why, why_len, "no entry point %s", STOKE_BACKEND_ENTRY_SYMBOL);
        return STOKE_EABI;
    }
    const stoke_backend *vt = NULL;
    int raw = fn(&host_info, &vt), rc = stoke__backend_rc(raw);
    if (rc != STOKE_OK) {
        if (rc == raw)
            stoke__fmt(why, why_len, "entry point failed: %s", stoke_strerror(rc));
        else
            stoke__fmt(why, why_len, "entry point failed with %d, not a stoke status code", raw);
        return rc;
    }
    rc = stoke__validate_table(vt, why, why_len);
    if (rc != STOKE_OK)
        return rc;
    if (find_locked(vt->name)) {
        stoke__fmt(why, why_len, "a backend named '%s' is already registered", vt->name);
        return STOKE_EABI;
    }
    e->vt = vt;
    stoke__strlcpy(e->info.name, vt->name, sizeof(e->info.name));
    return STOKE_OK;
}

/* Loads one plugin file as a new entry.  Returns its status; the entry is kept (and listed)
 * even when rejected. */
static int load_plugin_locked(const char *path)
{
    entry *e = add_plugin_entry_locked(path);
    if (!e)
        return stoke__fail_at(STOKE_LOG_WARN, STOKE_ENOMEM, "plugin %s not loaded: out of memory",
                              path);
    char why[256] = "";
    if (reg.nplugins > MAX_PLUGIN_FILES) {
        stoke__fmt(why, sizeof(why), "the limit of %d plugin files is reached", MAX_PLUGIN_FILES);
        return set_unusable_locked(e, path, STOKE_ELIMIT, "skipped", why);
    }
    char real[PATH_MAX];
    int rc = stoke__plugin_check(path, real, why, sizeof(why));
    if (rc == STOKE_OK)
        rc = open_plugin_locked(e, real, why, sizeof(why));
    if (rc != STOKE_OK)
        return reject_locked(e, path, rc, why);
    if (!probe_entry(e, 0)) {
        rc = STOKE_ENODEV;
        stoke__strlcpy(why, e->info.reason, sizeof(why));
        stoke__log(STOKE_LOG_WARN, "plugin %s (%s) is unavailable: %s", path, e->vt->name, why);
        return stoke__fail(rc, "plugin %s (%s) unavailable: %s", path, e->vt->name, why);
    }
    stoke__log(STOKE_LOG_INFO, "plugin %s loaded: backend %s, %d device(s)", path, e->info.name,
               e->info.device_count);
    return STOKE_OK;
}

/* Lists `path` as a rejected plugin without trying to open it. */
static void reject_path_locked(const char *path, int rc, const char *why)
{
    entry *e = add_plugin_entry_locked(path);
    if (e)
        reject_locked(e, path, rc, why);
    else
        stoke__fail_at(STOKE_LOG_WARN, rc, "plugin %s rejected: %s", path, why);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Collects the names of every *.so entry of `d` into a growable array (*names, *n).  Returns
 * STOKE_OK or STOKE_ENOMEM (the names collected so far are kept). */
static int list_so_names(DIR *d, char ***names, size_t *n)
{
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len <= 3 || strcmp(de->d_name + len - 3, ".so") != 0)
            continue;
        if (*n == cap) {
            size_t grown_cap = cap ? 2 * cap : 64;
            char **grown = realloc(*names, grown_cap * sizeof(*grown));
            if (!grown)
                return STOKE_ENOMEM;
            *names = grown;
            cap = grown_cap;
        }
        if (!((*names)[*n] = strdup(de->d_name)))
            return STOKE_ENOMEM;
        (*n)++;
    }
    return STOKE_OK;
}

/* Loads `dir/name`, or refuses it when the path does not fit in PATH_MAX: a truncated path
 * would name a different file. */
static void load_dir_entry_locked(const char *dir, const char *name)
{
    char path[PATH_MAX];
    int w = snprintf(path, sizeof(path), "%s/%s", dir, name);
    if (w >= 0 && (size_t)w < sizeof(path)) {
        load_plugin_locked(path);
        return;
    }
    /* Listed and logged by a shortened form that cannot be mistaken for a real path. */
    char shown[sizeof(((stoke_backend_info *)0)->path)], why[256];
    snprintf(shown, sizeof(shown), "%.100s.../%s", dir, name);
    stoke__fmt(why, sizeof(why),
               "path of %zu bytes is longer than the %d-byte limit (PATH_MAX); "
               "not loaded",
               strlen(dir) + 1 + strlen(name), PATH_MAX);
    reject_path_locked(shown, STOKE_ELIMIT, why);
}

/* A directory contributes all its *.so entries, in name order (never readdir order). */
static void load_dir_locked(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d) {
        char why[256];
        stoke__fmt(why, sizeof(why), "cannot read the directory: %s", strerror(errno));
        reject_path_locked(dir, STOKE_EIO, why);
        return;
    }
    char **names = NULL;
    size_t n = 0;
    if (list_so_names(d, &names, &n) != STOKE_OK)
        stoke__fail_at(STOKE_LOG_WARN, STOKE_ENOMEM,
                       "plugin directory %s: out of memory after "
                       "%zu entries; the rest are not considered",
                       dir, n);
    closedir(d);
    if (n)
        qsort(names, n, sizeof(names[0]), cmp_str);
    for (size_t i = 0; i < n; i++) {
        load_dir_entry_locked(dir, names[i]);
        free(names[i]);
    }
    free(names);
}

static void load_plugin_path_locked(void)
{
    const char *pp = stoke__env_str(STOKE_ENV_PLUGIN_PATH);
    if (!pp)
        return;
    char *copy = strdup(pp), *save = NULL;
    if (!copy) {
        stoke__fail_at(STOKE_LOG_WARN, STOKE_ENOMEM,
                       "STOKE_PLUGIN_PATH: out of memory; no "
                       "plugin loaded");
        return;
    }
    for (char *tok = strtok_r(copy, ":", &save); tok; tok = strtok_r(NULL, ":", &save)) {
        struct stat st;
        if (stat(tok, &st) == 0 && S_ISDIR(st.st_mode))
            load_dir_locked(tok);
        else
            load_plugin_locked(tok);
    }
    free(copy);
}

static void add_builtin_locked(stoke_backend_entry_fn fn)
{
    entry *e = &reg.builtins[reg.nbuiltins++];
    memset(e, 0, sizeof(*e));
    e->info.origin = STOKE_ORIGIN_BUILTIN;
    const stoke_backend *vt = NULL;
    char why[256] = "";
    if (fn(&host_info, &vt) == STOKE_OK &&
        stoke__validate_table(vt, why, sizeof(why)) == STOKE_OK) {
        e->vt = vt;
        stoke__strlcpy(e->info.name, vt->name, sizeof(e->info.name));
    } else {
        stoke__strlcpy(e->info.name, "?", sizeof(e->info.name));
        stoke__fmt(e->info.reason, sizeof(e->info.reason), "built-in rejected: %s", why);
        e->probed = 1;
    }
}

/* In a forked child: a backend the parent probed available is not used here unless it says it
 * may be (STOKE_CAP_FORK_SAFE): the child has none of the driver's threads, and its calls may
 * fail, or hang (PoCL waits for a thread that is gone).  The handler only notes the fork; the
 * next use, under the lock, marks the entries (mark_forked_locked) and selects again.  No
 * prepare handler takes the lock around fork(): OpenCL's probe forks under it, and a thread
 * probing holds it while calling into drivers, whose own locks another forking thread may hold
 * in its prepare handlers (a deadlock).  So the child makes the lock anew unless the forking
 * thread held it (then it is that thread's, which goes on in the child): a lock another
 * thread of the parent held would never be released here (the child waited for ever). */
static atomic_int fork_parent_pid; /* nonzero: forked from this pid, entries not yet marked */

static void fork_child(void)
{
    if (!tl_holds_reg)
        pthread_mutex_init(&reg.lock, NULL);
    atomic_store_explicit(&fork_parent_pid, reg.pid, memory_order_relaxed);
    atomic_store_explicit(&reg.published, NULL, memory_order_relaxed);
}

static void mark_forked_locked(void)
{
    int parent = atomic_exchange(&fork_parent_pid, 0);
    if (!parent)
        return;
    reg.pid = (int)getpid();
    for (int i = 0; i < reg.nplugins + reg.nbuiltins; i++) {
        entry *e = i < reg.nplugins ? reg.plugins[i] : &reg.builtins[i - reg.nplugins];
        if (e->vt && e->probed && e->info.available && !e->forked_from &&
            !(e->vt->caps & STOKE_CAP_FORK_SAFE) && strcmp(e->vt->name, "cpu") != 0) {
            e->forked_from = parent;
            probe_entry(e, e->probe_flags); /* (listed unavailable, with the reason) */
        }
    }
}

static void init_locked(void)
{
    mark_forked_locked();
    if (reg.initialized)
        return;
    reg.pid = (int)getpid();
    reg.initialized = 1;
    reg.nbuiltins = 0;
    add_builtin_locked(stoke__backend_cuda_entry);
    add_builtin_locked(stoke__backend_hip_entry);
    add_builtin_locked(stoke__backend_opencl_entry);
    add_builtin_locked(stoke__backend_cpu_entry);
    load_plugin_path_locked();
}

/* stoke__fmt for a reason that names a path: one too long keeps its head and its tail (the
 * file's name) joined by " ... ". */
static void reason_fmt(char *dst, size_t n, const char *fmt, ...) STOKE__PRINTF(3, 4);
static void reason_fmt(char *dst, size_t n, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    stoke__vfmt_short(dst, n, fmt, ap);
    va_end(ap);
}

static void select_locked(selection *s)
{
    const char *spec = reg.api_spec[0] ? reg.api_spec : stoke__env_str(STOKE_ENV_ACCELERATOR);
    const char *src = reg.api_spec[0] ? "stoke_accelerator_select" : "STOKE_ACCELERATOR";
    if (spec) {
        s->explicit_spec = 1;
        char name[32], known[256];
        int index;
        names_locked(known, sizeof(known));
        if (stoke__parse_accel_spec(spec, name, sizeof(name), &index) != STOKE_OK) {
            s->status = STOKE_EINVAL;
            stoke__fmt(s->error, sizeof(s->error),
                       "%s=%s is not of the form name[:index]; known backends: %s", src, spec,
                       known);
            return;
        }
        entry *e = find_locked(name);
        if (!e) {
            s->status = STOKE_ENOENT;
            stoke__fmt(s->error, sizeof(s->error),
                       "%s=%s: unknown accelerator '%s'; known "
                       "backends: %s",
                       src, spec, name, known);
            return;
        }
        if (!probe_entry(e, STOKE_PROBE_EXPLICIT)) {
            s->status = STOKE_ENODEV;
            stoke__fmt(s->reason, sizeof(s->reason),
                       "%s=%s requested, but %s is unavailable: "
                       "%s",
                       src, spec, e->info.name, e->info.reason);
            stoke__strlcpy(s->error, s->reason, sizeof(s->error));
            return;
        }
        if (strcmp(e->info.name, "cpu") == 0) {
            s->status = STOKE_ENODEV;
            stoke__fmt(s->reason, sizeof(s->reason),
                       "%s=%s: the cpu fallback pins nothing; "
                       "no accelerator",
                       src, spec);
            return;
        }
        if (index >= e->info.device_count) {
            s->status = STOKE_ERANGE;
            stoke__fmt(s->error, sizeof(s->error), "%s=%s: %s has %d device(s), no device %d", src,
                       spec, e->info.name, e->info.device_count, index);
            return;
        }
        s->e = e;
        s->device_count = e->info.device_count;
        s->default_device = index < 0 ? 0 : index;
        stoke__fmt(s->reason, sizeof(s->reason), "explicit: %s=%s", src, spec);
        return;
    }
    for (int i = 0; i < reg.nplugins; i++) {
        if (probe_entry(reg.plugins[i], 0)) {
            s->e = reg.plugins[i];
            s->device_count = s->e->info.device_count;
            reason_fmt(s->reason, sizeof(s->reason),
                       "first available plugin loaded by the "
                       "application (%s)",
                       reg.plugins[i]->info.path);
            return;
        }
    }
    for (int i = 0; i < reg.nbuiltins; i++) {
        entry *e = &reg.builtins[i];
        if (e->vt && strcmp(e->info.name, "cpu") != 0 && probe_entry(e, 0)) {
            s->e = e;
            s->device_count = e->info.device_count;
            stoke__fmt(s->reason, sizeof(s->reason),
                       "first available built-in (order: cuda, "
                       "hip, opencl)");
            return;
        }
    }
    s->status = STOKE_ENODEV;
    if (reg.nplugins) /* (one that loaded and is unavailable is no "no plugin loaded") */
        stoke__fmt(s->reason, sizeof(s->reason),
                   "no accelerator found: no loaded plugin is available (%d loaded) and no "
                   "built-in backend (cuda, hip, opencl) has a usable device",
                   reg.nplugins);
    else
        stoke__strlcpy(s->reason,
                       "no accelerator found: no plugin loaded and no built-in backend "
                       "(cuda, hip, opencl) has a usable device",
                       sizeof(s->reason));
}

/* Logs a new selection: INFO when one was chosen; WARN, once per distinct reason, when the user
 * named a backend and gets no accelerator (the reason carries the backend's own cause, e.g.
 * "libcuda.so.1 not found"). */
static void log_selection(const selection *s)
{
    if (s->e) {
        stoke__log(STOKE_LOG_INFO, "accelerator: %s (%s)", s->e->info.name, s->reason);
        return;
    }
    if (s->status != STOKE_ENODEV || !s->explicit_spec)
        return;
    for (const selection *o = s->older; o; o = o->older)
        if (o->status == s->status && strcmp(o->reason, s->reason) == 0)
            return;
    stoke__log(STOKE_LOG_WARN, "%s", s->reason);
}

/* Returns the published selection, computing it the first time. */
static const selection *current_selection(void)
{
    selection *s = atomic_load_explicit(&reg.published, memory_order_acquire);
    if (s)
        return s;
    reg_lock();
    init_locked();
    s = atomic_load_explicit(&reg.published, memory_order_relaxed);
    if (!s) {
        static selection oom = {.status = STOKE_ENOMEM, .reason = "out of memory"};
        s = calloc(1, sizeof(*s));
        if (!s) {
            reg_unlock();
            return &oom;
        }
        select_locked(s);
        s->gen = atomic_fetch_add(&reg.gen, 1) + 1;
        s->older = reg.sel;
        reg.sel = s;
        log_selection(s);
        atomic_store_explicit(&reg.published, s, memory_order_release);
    }
    reg_unlock();
    return s;
}

/* Makes the next reader compute a new selection (under the lock). */
static void invalidate_locked(void)
{
    atomic_store_explicit(&reg.published, NULL, memory_order_release);
}

static int selection_status(const selection *s)
{
    if (s->status == STOKE_ENOENT || s->status == STOKE_ERANGE || s->status == STOKE_EINVAL)
        return stoke__fail(s->status, "%s", s->error);
    return s->status;
}

static int thread_device(const selection *s)
{
    if (tl_gen != s->gen || tl_device < 0) {
        tl_gen = s->gen;
        tl_device = s->default_device;
    }
    return tl_device;
}

int stoke__accel_current(const stoke_backend **vt, int *dev, const char **why)
{
    const selection *s = current_selection();
    if (!s->e) {
        *vt = NULL;
        *dev = -1;
        if (why)
            *why = s->reason[0] ? s->reason : s->error;
        return selection_status(s);
    }
    *vt = s->e->vt;
    *dev = thread_device(s);
    if (why)
        *why = s->reason;
    return STOKE_OK;
}

int stoke_accelerator_get(stoke_accelerator_info *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "stoke_accelerator_get: NULL argument");
    memset(out, 0, sizeof(*out));
    const selection *s = current_selection();
    stoke__strlcpy(out->reason, s->reason[0] ? s->reason : s->error, sizeof(out->reason));
    if (!s->e) {
        out->current_device = -1;
        if (s->status == STOKE_ENODEV)
            return stoke__fail(STOKE_ENODEV, "%s", s->reason);
        return selection_status(s);
    }
    stoke__strlcpy(out->backend, s->e->info.name, sizeof(out->backend));
    out->device_count = s->device_count;
    out->current_device = thread_device(s);
    return STOKE_OK;
}

int stoke_accelerator_select(const char *spec)
{
    reg_lock();
    init_locked();
    char saved[sizeof(reg.api_spec)];
    stoke__strlcpy(saved, reg.api_spec, sizeof(saved));
    if (spec && !*spec) { /* "" would read as NULL (no API choice): malformed instead */
        reg_unlock();
        return stoke__fail(STOKE_EINVAL, "stoke_accelerator_select: empty spec (NULL takes the "
                                         "API's choice back)");
    }
    if (spec && strlen(spec) >= sizeof(reg.api_spec)) {
        reg_unlock();
        return stoke__fail(STOKE_EINVAL, "accelerator spec '%.40s...' is too long", spec);
    }
    stoke__strlcpy(reg.api_spec, spec ? spec : "", sizeof(reg.api_spec));
    selection trial = {0};
    select_locked(&trial);
    int rc = trial.status;
    if (spec && rc != STOKE_OK) {
        stoke__strlcpy(reg.api_spec, saved, sizeof(reg.api_spec));
        char msg[512];
        stoke__strlcpy(msg, trial.error[0] ? trial.error : trial.reason, sizeof(msg));
        reg_unlock();
        return stoke__fail(rc, "%s", msg);
    }
    invalidate_locked();
    reg_unlock();
    const selection *s = current_selection();
    if (s->e && spec)
        tl_device = s->default_device, tl_gen = s->gen;
    return spec ? STOKE_OK : (s->e ? STOKE_OK : STOKE_ENODEV);
}

int stoke_plugin_load(const char *path)
{
    if (!path || !*path)
        return stoke__fail(STOKE_EINVAL, "stoke_plugin_load: empty path");
    reg_lock();
    init_locked();
    int rc = load_plugin_locked(path);
    invalidate_locked();
    reg_unlock();
    return rc;
}

static void probe_all_locked(void)
{
    mark_forked_locked();
    const selection *s = atomic_load_explicit(&reg.published, memory_order_relaxed);
    for (int i = 0; i < reg.nplugins; i++)
        if (!reg.plugins[i]->probed)
            probe_entry(reg.plugins[i], 0);
    for (int i = 0; i < reg.nbuiltins; i++)
        if (!reg.builtins[i].probed && (!s || s->e != &reg.builtins[i]))
            probe_entry(&reg.builtins[i], 0);
}

int stoke_backend_count(void)
{
    current_selection();
    reg_lock();
    probe_all_locked();
    int n = reg.nplugins + reg.nbuiltins;
    reg_unlock();
    return n;
}

int stoke_backend_get_info(int i, stoke_backend_info *out)
{
    if (!out)
        return stoke__fail(STOKE_EINVAL, "stoke_backend_get_info: NULL argument");
    current_selection();
    reg_lock();
    probe_all_locked();
    int rc = STOKE_OK;
    if (i >= 0 && i < reg.nplugins)
        *out = reg.plugins[i]->info;
    else if (i >= reg.nplugins && i < reg.nplugins + reg.nbuiltins)
        *out = reg.builtins[i - reg.nplugins].info;
    else
        rc = STOKE_ERANGE;
    reg_unlock();
    return rc;
}

int stoke__backend_lookup(const char *name, const stoke_backend **vt)
{
    *vt = NULL;
    if (!name)
        return STOKE_EINVAL;
    current_selection();
    reg_lock();
    entry *e = find_locked(name);
    int rc = STOKE_OK;
    if (!e) {
        char known[256];
        names_locked(known, sizeof(known));
        rc = stoke__fail(STOKE_ENOENT, "unknown backend '%s'; known backends: %s", name, known);
    } else {
        /* The chosen accelerator keeps the flags it was probed with. */
        const selection *s = atomic_load_explicit(&reg.published, memory_order_relaxed);
        if (!(s && s->e == e) && !probe_entry(e, STOKE_PROBE_EXPLICIT))
            rc = stoke__fail(STOKE_ENODEV, "backend %s is unavailable: %s", e->info.name,
                             e->info.reason);
        else
            *vt = e->vt;
    }
    reg_unlock();
    return rc;
}

void stoke__backend_names(char *out, size_t len)
{
    current_selection();
    reg_lock();
    names_locked(out, len);
    reg_unlock();
}

int stoke_device_get_props(const char *name, int dev, stoke_device_props *out)
{
    if (!out || out->size == 0)
        return stoke__fail(STOKE_EINVAL, "stoke_device_get_props: out->size must be set");
    const stoke_backend *vt;
    int cur, rc;
    if (name)
        rc = stoke__backend_lookup(name, &vt);
    else
        rc = stoke__accel_current(&vt, &cur, NULL);
    if (rc != STOKE_OK)
        return rc;
    int count = 0;
    if (vt->device_count(&count) != STOKE_OK || dev < 0 || dev >= count)
        return stoke__fail(STOKE_ERANGE, "backend %s has %d device(s), no device %d", vt->name,
                           count, dev);
    return vt->device_props(dev, out);
}

int stoke_device_get(int *dev)
{
    if (!dev)
        return stoke__fail(STOKE_EINVAL, "stoke_device_get: NULL argument");
    const stoke_backend *vt;
    const char *why;
    int rc = stoke__accel_current(&vt, dev, &why);
    if (rc == STOKE_ENODEV)
        return stoke__fail(rc, "no accelerator: %s", why);
    return rc;
}

int stoke_device_set(int dev)
{
    const selection *s = current_selection();
    if (!s->e) {
        if (s->status == STOKE_ENODEV)
            return stoke__fail(STOKE_ENODEV, "no accelerator: %s", s->reason);
        return selection_status(s);
    }
    if (dev < 0 || dev >= s->device_count)
        return stoke__fail(STOKE_ERANGE, "accelerator %s has %d device(s), no device %d",
                           s->e->info.name, s->device_count, dev);
    tl_gen = s->gen;
    tl_device = dev;
    return STOKE_OK;
}

static pthread_mutex_t reset_hooks_lock = PTHREAD_MUTEX_INITIALIZER;
static void (*reset_hooks[8])(void); /* guarded by reset_hooks_lock */

void stoke__registry_on_reset(void (*fn)(void))
{
    pthread_mutex_lock(&reset_hooks_lock);
    for (size_t i = 0; i < STOKE__ARRAY_LEN(reset_hooks); i++) {
        if (reset_hooks[i] == fn)
            break;
        if (!reset_hooks[i]) {
            reset_hooks[i] = fn;
            break;
        }
    }
    pthread_mutex_unlock(&reset_hooks_lock);
}

void stoke__registry_reset(void)
{
    void (*hooks[STOKE__ARRAY_LEN(reset_hooks)])(void);
    pthread_mutex_lock(&reset_hooks_lock);
    memcpy(hooks, reset_hooks, sizeof(hooks));
    pthread_mutex_unlock(&reset_hooks_lock);
    for (size_t i = 0; i < STOKE__ARRAY_LEN(hooks) && hooks[i]; i++)
        hooks[i]();
    reg_lock();
    atomic_store(&reg.published, NULL);
    for (int i = 0; i < reg.nplugins; i++) {
        entry *e = reg.plugins[i];
        if (e->vt && e->vt->shutdown)
            e->vt->shutdown();
        if (e->dl && e->vt) /* a rejected one stays loaded: see set_unusable_locked */
            dlclose(e->dl);
        free(e);
    }
    free(reg.plugins);
    reg.plugins = NULL;
    reg.plugins_cap = 0;
    for (int i = 0; i < reg.nbuiltins; i++)
        if (reg.builtins[i].vt && reg.builtins[i].vt->shutdown)
            reg.builtins[i].vt->shutdown();
    memset(reg.builtins, 0, sizeof(reg.builtins));
    reg.nplugins = reg.nbuiltins = 0;
    reg.initialized = 0;
    reg.api_spec[0] = '\0';
    while (reg.sel) {
        selection *older = reg.sel->older;
        free(reg.sel);
        reg.sel = older;
    }
    atomic_fetch_add(&reg.gen, 1);
    reg_unlock();
}
