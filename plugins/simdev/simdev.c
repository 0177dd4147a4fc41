/* simdev — a simulated discrete accelerator, built as libstoke-backend-simdev.so.
 *
 * It implements the backend ABI v1 (include/stoke/backend.h) using only that header, so it is
 * also the worked example for backend authors (docs/backend-authors.md).  This file holds the
 * entry point, the function table, probe, device properties, the counters query and shutdown;
 * memory.c, stream.c and env.c hold the rest (see simdev_int.h).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "simdev_int.h"

#define SIMDEV_EXPORT __attribute__((visibility("default")))

pthread_mutex_t simdev__lock = PTHREAD_MUTEX_INITIALIZER;
simdev_config simdev__cfg;
struct stoke_simdev_counters simdev__ctr;
uint64_t simdev__alloc_seq;
uint64_t simdev__copy_seq;

/* The host's log function, written by the entry point (before any other call, on the host's
 * loading thread) and only read afterwards. */
static void (*host_log)(const char *backend, int level, const char *msg);
/* Probes since the entry point ran (the host probes up to twice per load: once plainly, once
 * explicitly); configuration warnings are logged by the first only.  Guarded by simdev__lock. */
static unsigned probes_since_entry;

void simdev__log(int level, const char *fmt, ...)
{
    void (*fn)(const char *, int, const char *) = host_log;
    if (!fn)
        return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fn("simdev", level, line);
}

int simdev__check_dev(int dev, const char *what)
{
    pthread_mutex_lock(&simdev__lock);
    int n = simdev__cfg.devices;
    pthread_mutex_unlock(&simdev__lock);
    if (dev >= 0 && dev < n)
        return STOKE_OK;
    simdev__log(STOKE_LOG_WARN, "%s: no device %d (simdev has %d)", what, dev, n);
    return STOKE_ERANGE;
}

int simdev__alloc_attempt(const char *what, int dev, size_t size)
{
    pthread_mutex_lock(&simdev__lock);
    uint64_t seq = ++simdev__alloc_seq;
    int inject = simdev__cfg.fail_alloc != 0 && seq == simdev__cfg.fail_alloc;
    if (inject)
        simdev__ctr.allocs_failed++;
    pthread_mutex_unlock(&simdev__lock);
    if (!inject)
        return STOKE_OK;
    simdev__log(STOKE_LOG_WARN,
                "injected allocation failure: %s of %zu bytes on device %d is allocation #%llu "
                "(STOKE_SIMDEV_FAIL_ALLOC=%llu)",
                what, size, dev, (unsigned long long)seq, (unsigned long long)seq);
    return STOKE_ENOMEM;
}

/* ---- probe and devices ------------------------------------------------------------------ */

static int sd_probe(uint32_t flags, char *reason, size_t reason_len)
{
    (void)flags; /* simdev shows the same devices whether or not it was named explicitly */
    pthread_mutex_lock(&simdev__lock);
    int warn = probes_since_entry++ == 0;
    pthread_mutex_unlock(&simdev__lock);
    simdev_config cfg;
    simdev__read_config(&cfg, warn);

    pthread_mutex_lock(&simdev__lock);
    simdev__cfg = cfg;
    /* Counters and fault-injection sequence numbers start again at every probe, keeping the
     * "live" figures (objects may survive a re-probe). */
    struct stoke_simdev_counters keep = simdev__ctr;
    memset(&simdev__ctr, 0, sizeof(simdev__ctr));
    simdev__ctr.live_host_blocks = keep.live_host_blocks;
    simdev__ctr.live_host_bytes = keep.live_host_bytes;
    simdev__ctr.live_registered = keep.live_registered;
    simdev__ctr.live_registered_bytes = keep.live_registered_bytes;
    simdev__ctr.live_device_buffers = keep.live_device_buffers;
    simdev__ctr.live_device_bytes = keep.live_device_bytes;
    simdev__ctr.live_streams = keep.live_streams;
    simdev__ctr.live_events = keep.live_events;
    simdev__alloc_seq = 0;
    simdev__copy_seq = 0;
    pthread_mutex_unlock(&simdev__lock);

    if (cfg.probe_fail) {
        snprintf(reason, reason_len, "probe failure injected (STOKE_SIMDEV_PROBE_FAIL=1)");
        return STOKE_ENODEV;
    }
    if (cfg.devices == 0) {
        snprintf(reason, reason_len, "no device (STOKE_SIMDEV_DEVICES=0)");
        return STOKE_ENODEV;
    }
    /* Device memory is a memfd mapped twice: check the kernel lets us make one (seccomp
     * sandboxes may not).  This creates no device state. */
    int fd = memfd_create("simdev-probe", MFD_CLOEXEC);
    if (fd < 0) {
        snprintf(reason, reason_len, "memfd_create failed: %s", strerror(errno));
        return STOKE_ENODEV;
    }
    close(fd);
    snprintf(reason, reason_len, "%d simulated device(s), copy delay %llu us", cfg.devices,
             (unsigned long long)cfg.copy_delay_us);
    simdev__log(STOKE_LOG_DEBUG,
                "probe: %d device(s), %llu bytes each, copy delay %llu us, fail alloc #%llu, "
                "fail copy #%llu",
                cfg.devices, (unsigned long long)cfg.memory, (unsigned long long)cfg.copy_delay_us,
                (unsigned long long)cfg.fail_alloc, (unsigned long long)cfg.fail_copy);
    return STOKE_OK;
}

static int sd_device_count(int *count)
{
    if (!count)
        return STOKE_EINVAL;
    pthread_mutex_lock(&simdev__lock);
    *count = simdev__cfg.devices;
    pthread_mutex_unlock(&simdev__lock);
    return STOKE_OK;
}

static int sd_device_props(int dev, stoke_device_props *props)
{
    if (!props || props->size < sizeof(uint32_t))
        return STOKE_EINVAL;
    int rc = simdev__check_dev(dev, "device_props");
    if (rc != STOKE_OK)
        return rc;
    pthread_mutex_lock(&simdev__lock);
    uint64_t mem = simdev__cfg.memory;
    pthread_mutex_unlock(&simdev__lock);

    stoke_device_props d;
    memset(&d, 0, sizeof(d));
    d.size = sizeof(d);
    d.kind = STOKE_DEVICE_SIMULATED;
    snprintf(d.name, sizeof(d.name), "simdev %d", dev);
    snprintf(d.vendor, sizeof(d.vendor), "stoke");
    d.total_memory = mem;
    d.compute_major = 1;
    d.compute_minor = 0;
    snprintf(d.driver_version, sizeof(d.driver_version), "simdev ABI %d",
             STOKE_BACKEND_ABI_VERSION);
    /* Fill at most the caller's size: an older host has a shorter struct. */
    size_t n = props->size < sizeof(d) ? props->size : sizeof(d);
    memcpy(props, &d, n);
    props->size = (uint32_t)n;
    return STOKE_OK;
}

/* ---- shutdown and counters ----------------------------------------------------------------- */

static void sd_shutdown(void)
{
    simdev__streams_shutdown(); /* first: the stream threads use device buffers */
    simdev__memory_shutdown();
    pthread_mutex_lock(&simdev__lock);
    memset(&simdev__ctr, 0, sizeof(simdev__ctr));
    memset(&simdev__cfg, 0, sizeof(simdev__cfg));
    simdev__alloc_seq = simdev__copy_seq = 0;
    pthread_mutex_unlock(&simdev__lock);
}

SIMDEV_EXPORT int stoke_simdev_counters(struct stoke_simdev_counters *out)
{
    if (!out || out->size < 2 * sizeof(uint32_t))
        return STOKE_EINVAL;
    pthread_mutex_lock(&simdev__lock);
    struct stoke_simdev_counters c = simdev__ctr;
    pthread_mutex_unlock(&simdev__lock);
    c.size = (uint32_t)(out->size < sizeof(c) ? out->size : sizeof(c));
    c.version = STOKE_SIMDEV_COUNTERS_VERSION;
    memcpy(out, &c, c.size);
    return STOKE_OK;
}

/* ---- the table and the entry point ------------------------------------------------------- */

static const stoke_backend simdev_backend = {
    .abi_version = 2,
    .size = sizeof(stoke_backend),
    .name = "simdev",
    .description = "simulated discrete accelerator (tests, and the example plugin)",
    .caps = STOKE_CAP_FORK_SAFE | STOKE_CAP_PINNED_ALLOC | STOKE_CAP_HOST_REGISTER |
            STOKE_CAP_DEVICE_MEMORY | STOKE_CAP_ASYNC_COPY | STOKE_CAP_EVENTS | STOKE_CAP_IPC,
    .probe = sd_probe,
    .device_count = sd_device_count,
    .device_props = sd_device_props,
    .host_alloc = simdev__host_alloc,
    .host_free = simdev__host_free,
    .host_register = simdev__host_register,
    .host_unregister = simdev__host_unregister,
    .is_pinned = simdev__is_pinned,
    .device_alloc = simdev__device_alloc,
    .device_free = simdev__device_free,
    .stream_create = simdev__stream_create,
    .stream_destroy = simdev__stream_destroy,
    .stream_synchronize = simdev__stream_synchronize,
    .copy_h2d_async = simdev__copy_h2d_async,
    .copy_d2h_async = simdev__copy_d2h_async,
    .event_create = simdev__event_create,
    .event_destroy = simdev__event_destroy,
    .event_record = simdev__event_record,
    .event_query = simdev__event_query,
    .event_synchronize = simdev__event_synchronize,
    .shutdown = sd_shutdown,
    .ipc_export = NULL, /* the ABI v1 placeholders: never called */
    .ipc_import = NULL,
    .ipc_export_mem = simdev__ipc_export,
    .ipc_import_mem = simdev__ipc_import,
    .ipc_close_mem = simdev__ipc_close,
};

/* simdev says STOKE_CAP_FORK_SAFE: a forked child makes its locks anew (a thread of the parent
 * may have held one; those threads are not there) and goes on with the tables as they were,
 * making its own streams (the parent's have no thread here).  No lock is taken around fork():
 * the order of such handlers changes as plugins are loaded (ThreadSanitizer's lock-order
 * report).  A fork during another thread's simdev call may find a table mid-update: simdev is
 * a test device. */
static void fork_child(void)
{
    pthread_mutex_init(&simdev__lock, NULL);
    simdev__objs_lock_init();
    simdev__pinned_table_lock_init();
}

static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void hook_fork(void)
{
    pthread_atfork(NULL, NULL, fork_child);
}

SIMDEV_EXPORT int stoke_backend_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    if (!host || !out)
        return STOKE_EINVAL;
    pthread_once(&fork_once, hook_fork);
    /* Read host members only within host->size (the host struct only grows). */
    if (host->size >= offsetof(stoke_backend_host, log) + sizeof(host->log))
        host_log = host->log;
    pthread_mutex_lock(&simdev__lock);
    probes_since_entry = 0;
    pthread_mutex_unlock(&simdev__lock);
    /* This plugin implements ABI 2: the host must accept it. */
    if (host->abi_version < simdev_backend.abi_version ||
        (host->size >= offsetof(stoke_backend_host, reserved) &&
         host->abi_min > simdev_backend.abi_version)) {
        simdev__log(STOKE_LOG_WARN, "host accepts ABI %u..%u, simdev implements %u",
                    (unsigned)host->abi_min, (unsigned)host->abi_version,
                    (unsigned)simdev_backend.abi_version);
        return STOKE_EABI;
    }
    *out = &simdev_backend;
    return STOKE_OK;
}
