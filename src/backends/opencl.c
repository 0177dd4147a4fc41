/* The opencl backend: any OpenCL 1.2+ platform through the ICD loader, loaded at run time.
 *
 * - libOpenCL.so.1 (or STOKE_OPENCL_LIBRARY) is dlopen'ed at run time; no OpenCL headers or
 *   libraries are needed to build (opencl_api.h).
 * - An automatic probe (flags 0) with nothing loaded yet looks from a short-lived forked child
 *   first: loading the ICD loader loads every vendor driver (PoCL brings LLVM, 35-60 MiB, and
 *   threads), and neither can be unloaded again.  Only when the child finds a GPU/accelerator
 *   device, or on an explicit probe, is the library loaded into this process.  A child that
 *   exits without answering (or no fork) is logged and the probe runs here; one that hangs for
 *   30 s or dies of a signal makes the backend unavailable with that reason.  A child's answer
 *   that settles the probe (nothing loaded here) is kept for the boot and reused by later
 *   processes instead of a child (probe_cache.c, STOKE_PROBE_CACHE; probe_key says what it
 *   depends on).
 * - Devices of every platform are enumerated once.  They are indexed GPU/accelerator devices
 *   first, then CPU devices: automatic selection (probe flags 0) exposes only the former, an
 *   explicit choice (STOKE_PROBE_EXPLICIT, e.g. STOKE_ACCELERATOR=opencl) exposes all, so an
 *   index names the same device in both views.
 * - A context (plus a utility queue for mapping) is created per device on first use, never in
 *   probe.
 * - Pinned memory is a buffer created with CL_MEM_ALLOC_HOST_PTR and mapped for good; the block
 *   handed out is the first page boundary inside the mapping.  host_register wraps caller memory
 *   in a CL_MEM_USE_HOST_PTR buffer when the platform maps it in place (else STOKE_ENOTSUP).
 *   Both are tracked in a range table, so is_pinned answers for interior addresses.
 * - Each stream is an in-order command queue; copies are non-blocking, each with an event
 *   (opencl_stream.c).
 *
 * Locking: `g.lock` serialises loading, enumeration (held while a probing child runs), context
 * creation and shutdown.  After a successful probe `g.api` and `g.devs` (except the lazily
 * published context) are immutable until shutdown; contexts are published with release/acquire
 * atomics.  OpenCL API calls are thread-safe, so the utility queues are shared.  A stream
 * belongs to one thread at a time (device.h); an event has a mutex because the thread that
 * records it and the one that queries it may differ. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/builtin.h"
#include "backends/hostranges.h"
#include "backends/opencl_api.h"
#include "backends/opencl_internal.h"
#include "backends/probe_cache.h"
#include "common/env.h"
#include "common/internal.h"

#define OCL_MAX_DEVICES 64
#define OCL_MAX_PLATFORMS 16
#define OCL_DEFAULT_LIBRARY  "libOpenCL.so.1"
#define OCL_CHILD_TIMEOUT_MS 30000 /* a probing child that has not answered by then is killed */
#define OCL_CHILD_MAGIC 0x6f636c70u

/* ThreadSanitizer kills a child that starts threads (PoCL does) after a multi-threaded fork. */
#if defined(__SANITIZE_THREAD__)
#define OCL_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define OCL_TSAN 1
#endif
#endif
#ifndef OCL_TSAN
#define OCL_TSAN 0
#endif

enum { RANGE_ALLOC = 0, RANGE_REGISTERED = 1 };

static const struct {
    size_t offset;
    const char *symbol;
} ocl_symbols[] = {
#define SYM(name) {offsetof(struct stoke__ocl_api, name), #name}
    SYM(clGetPlatformIDs),          SYM(clGetPlatformInfo),       SYM(clGetDeviceIDs),
    SYM(clGetDeviceInfo),           SYM(clCreateContext),         SYM(clReleaseContext),
    SYM(clCreateCommandQueue),      SYM(clReleaseCommandQueue),   SYM(clCreateBuffer),
    SYM(clReleaseMemObject),        SYM(clEnqueueMapBuffer),      SYM(clEnqueueUnmapMemObject),
    SYM(clEnqueueWriteBuffer),      SYM(clEnqueueReadBuffer),     SYM(clEnqueueMarkerWithWaitList),
    SYM(clGetEventInfo),            SYM(clWaitForEvents),         SYM(clRetainEvent),
    SYM(clReleaseEvent),            SYM(clFlush),                 SYM(clFinish),
#undef SYM
};

static struct {
    pthread_mutex_t lock;
    struct stoke__ocl_api api;
    void *dl;             /* kept loaded once opened (see shutdown) */
    char dl_path[512];
    int enumerated;       /* devs[] valid */
    int ndev;             /* all usable devices, GPU/accelerator first */
    int nfast;            /* of which GPU/accelerator */
    atomic_int nexposed;  /* ndev after an explicit probe, nfast after an automatic one */
    ocl_dev devs[OCL_MAX_DEVICES];
    int in_child;         /* in the probing child: notes collect what would be logged */
    char notes[512];
} g = {.lock = PTHREAD_MUTEX_INITIALIZER};

const struct stoke__ocl_api *const stoke__ocl_fn = &g.api;

/* What a probing child found (written whole to a pipe). */
typedef struct child_answer {
    uint32_t magic;
    int rc;    /* of loading and enumerating */
    int ndev;  /* usable devices */
    int nfast; /* of which GPU/accelerator */
    char reason[256];
    char first[128]; /* name of device 0 */
    char notes[512]; /* log lines (info), '\n'-separated */
} child_answer;

static stoke__hostranges g_ranges = STOKE__HOSTRANGES_INIT;

/* ---- errors ------------------------------------------------------------------------------- */

const char *stoke__ocl_name(cl_int e)
{
    switch (e) {
    case CL_DEVICE_NOT_FOUND: return "CL_DEVICE_NOT_FOUND";
    case CL_DEVICE_NOT_AVAILABLE: return "CL_DEVICE_NOT_AVAILABLE";
    case CL_MEM_OBJECT_ALLOCATION_FAILURE: return "CL_MEM_OBJECT_ALLOCATION_FAILURE";
    case CL_OUT_OF_RESOURCES: return "CL_OUT_OF_RESOURCES";
    case CL_OUT_OF_HOST_MEMORY: return "CL_OUT_OF_HOST_MEMORY";
    case CL_MAP_FAILURE: return "CL_MAP_FAILURE";
    case CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST:
        return "CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST";
    case CL_INVALID_VALUE: return "CL_INVALID_VALUE";
    case CL_INVALID_PLATFORM: return "CL_INVALID_PLATFORM";
    case CL_INVALID_DEVICE: return "CL_INVALID_DEVICE";
    case CL_INVALID_CONTEXT: return "CL_INVALID_CONTEXT";
    case CL_INVALID_COMMAND_QUEUE: return "CL_INVALID_COMMAND_QUEUE";
    case CL_INVALID_HOST_PTR: return "CL_INVALID_HOST_PTR";
    case CL_INVALID_MEM_OBJECT: return "CL_INVALID_MEM_OBJECT";
    case CL_INVALID_EVENT: return "CL_INVALID_EVENT";
    case CL_INVALID_OPERATION: return "CL_INVALID_OPERATION";
    case CL_INVALID_BUFFER_SIZE: return "CL_INVALID_BUFFER_SIZE";
    case CL_PLATFORM_NOT_FOUND_KHR: return "CL_PLATFORM_NOT_FOUND_KHR";
    default: return "CL_ERROR";
    }
}

int stoke__ocl_code(cl_int e)
{
    return e == CL_MEM_OBJECT_ALLOCATION_FAILURE || e == CL_OUT_OF_HOST_MEMORY ? STOKE_ENOMEM
                                                                                : STOKE_EBACKEND;
}

/* "opencl: clCreateBuffer(4096 bytes) on device 0: CL_INVALID_BUFFER_SIZE (-61)" */
int stoke__ocl_fail(cl_int e, const char *what)
{
    return stoke__fail(stoke__ocl_code(e), "opencl: %s: %s (%d)", what, stoke__ocl_name(e), (int)e);
}

/* ---- loading and enumeration -------------------------------------------------------------- */

static int load_api_locked(char *reason, size_t reason_len)
{
    const char *path = stoke__env_str(STOKE_ENV_OPENCL_LIBRARY);
    if (!path)
        path = OCL_DEFAULT_LIBRARY;
    if (!g.dl || strcmp(g.dl_path, path) != 0) {
        void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (!h) {
            const char *err = dlerror();
            if (strcmp(path, OCL_DEFAULT_LIBRARY) == 0)
                stoke__fmt(reason, reason_len, "libOpenCL.so.1 not found (install an OpenCL ICD "
                           "loader, e.g. ocl-icd-libopencl1): %s", err ? err : "dlopen failed");
            else
                stoke__fmt(reason, reason_len, "%s not found (STOKE_OPENCL_LIBRARY): %s", path,
                           err ? err : "dlopen failed");
            return STOKE_ENODEV;
        }
        /* A loader opened before is never dlclose'd: vendor drivers keep threads and
         * process-wide state.  Only tests switch paths. */
        g.dl = h;
        stoke__strlcpy(g.dl_path, path, sizeof(g.dl_path));
    }
    struct stoke__ocl_api api;
    for (size_t i = 0; i < STOKE__ARRAY_LEN(ocl_symbols); i++) {
        void *fn = dlsym(g.dl, ocl_symbols[i].symbol);
        if (!fn) {
            stoke__fmt(reason, reason_len, "%s lacks %s (an OpenCL 1.2 ICD loader is needed)",
                       path, ocl_symbols[i].symbol);
            return STOKE_ENODEV;
        }
        memcpy((char *)&api + ocl_symbols[i].offset, &fn, sizeof(fn));
    }
    g.api = api;
    return STOKE_OK;
}

/* "OpenCL 1.2 ..." -> 1, 2; 0 if unparsable. */
static void parse_cl_version(const char *s, int *major, int *minor)
{
    *major = *minor = 0;
    if (sscanf(s, "OpenCL %d.%d", major, minor) != 2)
        *major = *minor = 0;
}

static void add_device_locked(cl_platform_id p, cl_device_id id, ocl_dev *tmp, int *n)
{
    cl_device_type type = 0;
    char ver[128] = "";
    ocl_dev d;
    memset(&d, 0, sizeof(d));
    d.platform = p;
    d.id = id;
    if (g.api.clGetDeviceInfo(id, CL_DEVICE_TYPE, sizeof(type), &type, NULL) != CL_SUCCESS ||
        g.api.clGetDeviceInfo(id, CL_DEVICE_NAME, sizeof(d.name) - 1, d.name, NULL) != CL_SUCCESS)
        return;
    g.api.clGetDeviceInfo(id, CL_DEVICE_VERSION, sizeof(ver) - 1, ver, NULL);
    int major, minor;
    parse_cl_version(ver, &major, &minor);
    if (major < 1 || (major == 1 && minor < 2)) {
        char note[256];
        stoke__fmt(note, sizeof(note), "opencl: skipping device '%s': %s (stoke needs OpenCL "
                   "1.2)", d.name, ver[0] ? ver : "unknown version");
        if (!g.in_child) {
            stoke__log(STOKE_LOG_INFO, "%s", note);
        } else {
            size_t used = strlen(g.notes);
            stoke__fmt(g.notes + used, sizeof(g.notes) - used, "%s\n", note);
        }
        return;
    }
    d.kind = (type & CL_DEVICE_TYPE_GPU)                                    ? STOKE_DEVICE_GPU
             : (type & (CL_DEVICE_TYPE_ACCELERATOR | CL_DEVICE_TYPE_CUSTOM)) ? STOKE_DEVICE_ACCELERATOR
                                                                            : STOKE_DEVICE_CPU;
    if (*n < OCL_MAX_DEVICES)
        tmp[(*n)++] = d;
}

/* Enumerates devices once.  Under g.lock. */
static int enumerate_locked(char *reason, size_t reason_len)
{
    if (g.enumerated)
        return STOKE_OK;
    cl_platform_id plats[OCL_MAX_PLATFORMS];
    cl_uint np = 0;
    cl_int e = g.api.clGetPlatformIDs(OCL_MAX_PLATFORMS, plats, &np);
    if (e == CL_PLATFORM_NOT_FOUND_KHR || (e == CL_SUCCESS && np == 0)) {
        stoke__fmt(reason, reason_len, "no OpenCL platform: the ICD loader %s found no vendor "
                   "driver (e.g. install pocl-opencl-icd for a CPU device)", g.dl_path);
        return STOKE_ENODEV;
    }
    if (e != CL_SUCCESS) {
        stoke__fmt(reason, reason_len, "clGetPlatformIDs failed: %s (%d)", stoke__ocl_name(e),
                   (int)e);
        return STOKE_ENODEV;
    }
    if (np > OCL_MAX_PLATFORMS)
        np = OCL_MAX_PLATFORMS;
    static ocl_dev tmp[OCL_MAX_DEVICES]; /* under g.lock */
    int n = 0;
    for (cl_uint i = 0; i < np; i++) {
        cl_device_id ids[OCL_MAX_DEVICES];
        cl_uint nd = 0;
        e = g.api.clGetDeviceIDs(plats[i], CL_DEVICE_TYPE_ALL, OCL_MAX_DEVICES, ids, &nd);
        if (e != CL_SUCCESS)
            continue; /* CL_DEVICE_NOT_FOUND: a platform without devices */
        for (cl_uint j = 0; j < nd && j < OCL_MAX_DEVICES; j++)
            add_device_locked(plats[i], ids[j], tmp, &n);
    }
    /* GPU/accelerator devices first, then CPU devices, each in platform order. */
    g.ndev = g.nfast = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++)
            if ((tmp[i].kind == STOKE_DEVICE_CPU) == (pass == 1)) {
                g.devs[g.ndev] = tmp[i];
                atomic_init(&g.devs[g.ndev].ctx, NULL);
                g.ndev++;
                if (pass == 0)
                    g.nfast++;
            }
    g.enumerated = 1;
    return STOKE_OK;
}

/* ---- probing from a child ----------------------------------------------------------------- */

/* The child's side: load, enumerate, answer, exit.  It calls nothing that could wait for a lock
 * another parent thread held at fork time (no logging: a log callback may take the caller's
 * locks, e.g. Python's GIL) and exits without running atexit handlers or flushing stdio. */
_Noreturn static void child_probe(int fd)
{
    child_answer a;
    memset(&a, 0, sizeof(a));
    a.magic = OCL_CHILD_MAGIC;
    g.in_child = 1;
    g.notes[0] = '\0';
    a.rc = load_api_locked(a.reason, sizeof(a.reason));
    if (a.rc == STOKE_OK)
        a.rc = enumerate_locked(a.reason, sizeof(a.reason));
    if (a.rc == STOKE_OK) {
        a.ndev = g.ndev;
        a.nfast = g.nfast;
        if (g.ndev > 0)
            stoke__strlcpy(a.first, g.devs[0].name, sizeof(a.first));
    }
    stoke__strlcpy(a.notes, g.notes, sizeof(a.notes));
    const char *p = (const char *)&a;
    size_t left = sizeof(a);
    while (left > 0) {
        ssize_t w = write(fd, p, left);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        p += w;
        left -= (size_t)w;
    }
    _exit(0);
}

/* Reads the child's answer within OCL_CHILD_TIMEOUT_MS; returns the bytes read, *late = 1 when
 * the time ran out first. */
static size_t read_answer(int fd, child_answer *a, int *late)
{
    size_t got = 0;
    *late = 0;
    uint64_t deadline = stoke__now_ns() + (uint64_t)OCL_CHILD_TIMEOUT_MS * 1000000u;
    while (got < sizeof(*a)) {
        uint64_t now = stoke__now_ns();
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        int pr = now < deadline ? poll(&pfd, 1, (int)((deadline - now) / 1000000u) + 1) : 0;
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr == 0)
            *late = 1;
        if (pr <= 0)
            break;
        ssize_t r = read(fd, (char *)a + got, sizeof(*a) - got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break; /* EOF: the child died before answering in full */
        got += (size_t)r;
    }
    return got;
}

/* Loads and enumerates in a forked child and returns what it found in *a: STOKE_OK when it
 * answered; STOKE_ETIMEDOUT when it did not within OCL_CHILD_TIMEOUT_MS or died of a signal (a
 * driver that hangs or crashes while probing: it would do so here too); else STOKE_EBACKEND (it
 * exited without answering, e.g. ThreadSanitizer refuses threads after a multi-threaded fork).
 * `why` says what went wrong.  Under g.lock. */
static int probe_in_child(child_answer *a, char *why, size_t why_len)
{
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
        stoke__fmt(why, why_len, "pipe: %s", strerror(errno));
        return STOKE_EBACKEND;
    }
    pid_t pid = fork();
    if (pid < 0) {
        stoke__fmt(why, why_len, "fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return STOKE_EBACKEND;
    }
    if (pid == 0) {
        close(fds[0]);
        child_probe(fds[1]);
    }
    close(fds[1]);
    memset(a, 0, sizeof(*a));
    int late = 0;
    size_t got = read_answer(fds[0], a, &late);
    close(fds[0]);
    /* late or broken: it must not linger; answered: its driver's teardown is not waited for */
    kill(pid, SIGKILL);
    int st = 0;
    pid_t w;
    do
        w = waitpid(pid, &st, 0);
    while (w < 0 && errno == EINTR);
    /* w < 0 (ECHILD): SIGCHLD is ignored, the child was reaped for us; the answer decides. */
    if (got == sizeof(*a) && a->magic == OCL_CHILD_MAGIC) {
        a->reason[sizeof(a->reason) - 1] = a->first[sizeof(a->first) - 1] = '\0';
        a->notes[sizeof(a->notes) - 1] = '\0';
        return STOKE_OK;
    }
    if (late) {
        stoke__fmt(why, why_len, "the OpenCL driver did not finish probing within %d s (in a "
                   "child process, killed)", OCL_CHILD_TIMEOUT_MS / 1000);
        return STOKE_ETIMEDOUT;
    }
    if (got < sizeof(*a) && w == pid && WIFSIGNALED(st) && WTERMSIG(st) != SIGKILL) {
        stoke__fmt(why, why_len, "the OpenCL driver crashed while probing (signal %d in a child "
                   "process)", WTERMSIG(st));
        return STOKE_ETIMEDOUT;
    }
    if (got < sizeof(*a) && w == pid && WIFEXITED(st))
        stoke__fmt(why, why_len, "the probing child exited with status %d without answering",
                   WEXITSTATUS(st));
    else
        stoke__strlcpy(why, "the probing child's answer is short or malformed", why_len);
    return STOKE_EBACKEND;
}

/* The process's thread count (/proc/self/status), 0 if unknown. */
static int thread_count(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    if (!f)
        return 0;
    char line[128];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Threads: %d", &n) == 1)
            break;
    fclose(f);
    return n;
}

/* The key of an automatic probe's cached answer (probe_cache.c): what loading and enumerating
 * depends on beyond the machine's drivers and devices, i.e. the variables the ICD loader and the
 * vendor drivers read and the ICD loader's vendor directory.  0, or -1: not cached. */
static int probe_key(char *key)
{
    static const char *const prefixes[] = {"OCL_", "POCL_", "CL_", "ROCR_", "HSA_", "GPU_",
                                           "ZE_", "NEO_", "SYCL_", "STOKE_OPENCL_", "LD_LIBRARY_PATH",
                                           "LD_PRELOAD", NULL};
    static const char *const parts[] = {"VISIBLE_DEVICES", NULL};
    if (stoke__probe_key_begin(key, "opencl", sizeof(child_answer)) != 0 ||
        stoke__probe_key_env(key, prefixes, parts) != 0 ||
        stoke__probe_key_dir(key, "/etc/OpenCL/vendors") != 0)
        return -1;
    const char *v = stoke__env_str(STOKE_ENV_OCL_ICD_VENDORS); /* read by the ICD loader */
    return v && v[0] == '/' ? stoke__probe_key_dir(key, v) : 0;
}

/* The reason an automatic probe gives when there are only CPU devices. */
static void only_cpu_reason(char *reason, size_t reason_len, int ndev, const char *first)
{
    stoke__fmt(reason, reason_len, "only CPU devices (%d: %s) (select explicitly with "
               "STOKE_ACCELERATOR=opencl)", ndev, first);
}

/* An automatic probe with nothing loaded: asks a child.  1 when its answer settles the probe
 * (*rc and `reason` set: nothing to use here, so nothing is loaded), 0 when the library must be
 * loaded here (a GPU/accelerator device exists, or the child failed). */
static int settled_by_child(int *rc, char *reason, size_t reason_len)
{
    child_answer a;
    char key[STOKE__PROBE_KEY_MAX];
    int cached = probe_key(key) == 0 && stoke__probe_cache_get("opencl", key, &a, sizeof(a)) &&
                 a.magic == OCL_CHILD_MAGIC;
    if (cached) {
        a.reason[sizeof(a.reason) - 1] = a.first[sizeof(a.first) - 1] = '\0';
        a.notes[sizeof(a.notes) - 1] = '\0';
    } else if (OCL_TSAN && thread_count() != 1) {
        stoke__log(STOKE_LOG_DEBUG, "opencl: probing in this process: under ThreadSanitizer, a "
                   "child forked from a multi-threaded process cannot start threads");
        return 0;
    } else {
        char why[192] = "";
        int crc = probe_in_child(&a, why, sizeof(why));
        if (crc == STOKE_ETIMEDOUT) {
            *rc = STOKE_ENODEV;
            stoke__fmt(reason, reason_len, "%s; STOKE_ACCELERATOR=opencl probes in this process",
                       why);
            return 1;
        }
        if (crc != STOKE_OK) {
            stoke__log(STOKE_LOG_DEBUG, "opencl: probing in this process instead: %s", why);
            return 0;
        }
    }
    for (char *line = a.notes, *nl; *line; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            break;
        *nl = '\0';
        stoke__log(STOKE_LOG_INFO, "%s", line);
    }
    if (a.rc == STOKE_OK && a.nfast > 0)
        return 0;
    if (!cached) /* settled without loading anything here: the same until the machine changes */
        stoke__probe_cache_put("opencl", key, &a, sizeof(a));
    if (a.rc != STOKE_OK) {
        *rc = a.rc;
        stoke__strlcpy(reason, a.reason, reason_len);
    } else if (a.ndev == 0) {
        *rc = STOKE_ENODEV;
        stoke__strlcpy(reason, "no device: the OpenCL platforms expose no OpenCL 1.2 device",
                       reason_len);
    } else {
        *rc = STOKE_ENODEV;
        only_cpu_reason(reason, reason_len, a.ndev, a.first);
    }
    stoke__log(STOKE_LOG_DEBUG, "opencl: %s, nothing loaded here: %s", cached ?
               "answered by the probe cache (this boot's; STOKE_PROBE_CACHE=0 probes again)" :
               "probed in a child", reason);
    return 1;
}

static int opencl_probe(uint32_t flags, char *reason, size_t reason_len)
{
    int explicit_ = (flags & STOKE_PROBE_EXPLICIT) != 0;
    pthread_mutex_lock(&g.lock);
    int rc = STOKE_OK;
    if (!g.enumerated) {
        if (!explicit_ && !g.dl && settled_by_child(&rc, reason, reason_len))
            goto done;
        rc = load_api_locked(reason, reason_len);
        if (rc == STOKE_OK)
            rc = enumerate_locked(reason, reason_len);
        if (rc != STOKE_OK)
            goto done;
    }
    if (g.ndev == 0) {
        stoke__strlcpy(reason, "no device: the OpenCL platforms expose no OpenCL 1.2 device",
                       reason_len);
        rc = STOKE_ENODEV;
        goto done;
    }
    if (!explicit_ && g.nfast == 0) {
        only_cpu_reason(reason, reason_len, g.ndev, g.devs[0].name);
        rc = STOKE_ENODEV;
        goto done;
    }
    int n = explicit_ ? g.ndev : g.nfast;
    /* Exposure only widens: once CPU devices were exposed (an explicit choice), a later
     * automatic probe must not take them away from contexts, buffers and streams using them
     * (devices are numbered GPUs first, so indices stay stable). */
    if (n < atomic_load(&g.nexposed))
        n = atomic_load(&g.nexposed);
    atomic_store(&g.nexposed, n);
    if (explicit_ && g.nfast < g.ndev)
        stoke__fmt(reason, reason_len, "%d device(s) (%d CPU, exposed because opencl was chosen "
                   "explicitly): %s", n, g.ndev - g.nfast, g.devs[0].name);
    else
        stoke__fmt(reason, reason_len, "%d device(s): %s", n, g.devs[0].name);
done:
    pthread_mutex_unlock(&g.lock);
    return rc;
}

static int opencl_device_count(int *count)
{
    *count = atomic_load(&g.nexposed);
    return STOKE_OK;
}

int stoke__ocl_check_dev(int dev)
{
    int n = atomic_load(&g.nexposed);
    if (dev < 0 || dev >= n)
        return stoke__fail(n ? STOKE_ERANGE : STOKE_ENODEV, "opencl: no device %d (%d exposed)",
                           dev, n);
    return STOKE_OK;
}

/* Device `dev` with its context and utility queue created on first use. */
int stoke__ocl_get_dev(int dev, ocl_dev **out)
{
    int rc = stoke__ocl_check_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    ocl_dev *d = &g.devs[dev];
    if (atomic_load_explicit(&d->ctx, memory_order_acquire)) {
        *out = d;
        return STOKE_OK;
    }
    pthread_mutex_lock(&g.lock);
    if (!atomic_load_explicit(&d->ctx, memory_order_relaxed)) {
        cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)d->platform,
                                         0};
        cl_int e = CL_SUCCESS;
        cl_context c = g.api.clCreateContext(props, 1, &d->id, NULL, NULL, &e);
        if (!c || e != CL_SUCCESS) {
            pthread_mutex_unlock(&g.lock);
            char what[192];
            return stoke__ocl_fail(
                e ? e : CL_INVALID_CONTEXT,
                stoke__fmt(what, sizeof(what), "clCreateContext for device %d (%s)", dev, d->name));
        }
        cl_command_queue q = g.api.clCreateCommandQueue(c, d->id, 0, &e);
        if (!q || e != CL_SUCCESS) {
            g.api.clReleaseContext(c);
            pthread_mutex_unlock(&g.lock);
            return stoke__ocl_fail(e ? e : CL_INVALID_COMMAND_QUEUE,
                                   "clCreateCommandQueue (utility)");
        }
        d->util_q = q;
        stoke__log(STOKE_LOG_DEBUG, "opencl: created the context of device %d (%s)", dev,
                   d->name);
        atomic_store_explicit(&d->ctx, c, memory_order_release);
    }
    pthread_mutex_unlock(&g.lock);
    *out = d;
    return STOKE_OK;
}

int stoke__opencl_context_created(int dev)
{
    if (dev < 0 || dev >= OCL_MAX_DEVICES)
        return 0;
    return atomic_load(&g.devs[dev].ctx) != NULL;
}

static void copy_str_info(cl_device_id id, cl_device_info what, char *dst, size_t len)
{
    dst[0] = '\0';
    if (g.api.clGetDeviceInfo(id, what, len - 1, dst, NULL) != CL_SUCCESS)
        dst[0] = '\0';
    dst[len - 1] = '\0';
}

static int opencl_device_props(int dev, stoke_device_props *p)
{
    int rc = stoke__ocl_check_dev(dev);
    if (rc != STOKE_OK)
        return rc;
    const ocl_dev *d = &g.devs[dev];
    stoke_device_props o = {.size = sizeof(o), .kind = d->kind};
    stoke__strlcpy(o.name, d->name, sizeof(o.name));
    copy_str_info(d->id, CL_DEVICE_VENDOR, o.vendor, sizeof(o.vendor));
    copy_str_info(d->id, CL_DRIVER_VERSION, o.driver_version, sizeof(o.driver_version));
    cl_ulong mem = 0;
    if (g.api.clGetDeviceInfo(d->id, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof(mem), &mem, NULL) == 0)
        o.total_memory = mem;
    char ver[128];
    copy_str_info(d->id, CL_DEVICE_VERSION, ver, sizeof(ver));
    parse_cl_version(ver, &o.compute_major, &o.compute_minor);
    /* PCI location: only through cl_khr_pci_bus_info. */
    size_t extlen = 0;
    if (g.api.clGetDeviceInfo(d->id, CL_DEVICE_EXTENSIONS, 0, NULL, &extlen) == 0 && extlen) {
        char *ext = malloc(extlen + 1);
        if (ext && g.api.clGetDeviceInfo(d->id, CL_DEVICE_EXTENSIONS, extlen, ext, NULL) == 0) {
            ext[extlen] = '\0';
            stoke__cl_pci_bus_info pci;
            if (strstr(ext, "cl_khr_pci_bus_info") &&
                g.api.clGetDeviceInfo(d->id, CL_DEVICE_PCI_BUS_INFO_KHR, sizeof(pci), &pci,
                                      NULL) == 0)
                stoke__fmt(o.pci_bus_id, sizeof(o.pci_bus_id), "%04x:%02x:%02x.%x",
                           pci.pci_domain, pci.pci_bus, pci.pci_device, pci.pci_function);
        }
        free(ext);
    }
    return stoke__props_out(p, &o);
}

/* ---- pinned host memory ------------------------------------------------------------------- */

static size_t page_size(void)
{
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
}

static void unmap_release(ocl_dev *d, cl_mem m, void *map)
{
    if (map && g.api.clEnqueueUnmapMemObject(d->util_q, m, map, 0, NULL, NULL) == CL_SUCCESS)
        g.api.clFinish(d->util_q);
    g.api.clReleaseMemObject(m);
}

static int opencl_host_alloc(int dev, size_t size, void **out)
{
    *out = NULL;
    ocl_dev *d;
    int rc = stoke__ocl_get_dev(dev, &d);
    if (rc != STOKE_OK)
        return rc;
    cl_context c = atomic_load_explicit(&d->ctx, memory_order_acquire);
    /* One page more, so that the block can start on a page boundary inside the mapping. */
    size_t ps = page_size(), len = (size ? size : 1) + ps;
    char what[160];
    cl_int e = CL_SUCCESS;
    cl_mem m = g.api.clCreateBuffer(c, CL_MEM_ALLOC_HOST_PTR | CL_MEM_READ_WRITE, len, NULL, &e);
    if (!m || e != CL_SUCCESS)
        return stoke__ocl_fail(e ? e : CL_MEM_OBJECT_ALLOCATION_FAILURE,
                               stoke__fmt(what, sizeof(what),
                                          "clCreateBuffer(CL_MEM_ALLOC_HOST_PTR, %zu "
                                          "bytes) on device %d",
                                          len, dev));
    void *map = g.api.clEnqueueMapBuffer(d->util_q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                         len, 0, NULL, NULL, &e);
    if (!map || e != CL_SUCCESS) {
        g.api.clReleaseMemObject(m);
        return stoke__ocl_fail(e ? e : CL_MAP_FAILURE,
                               stoke__fmt(what, sizeof(what),
                                          "clEnqueueMapBuffer(%zu bytes) on device "
                                          "%d",
                                          len, dev));
    }
    uintptr_t base = ((uintptr_t)map + ps - 1) & ~(uintptr_t)(ps - 1);
    stoke__hostrange r = {.base = base, .size = size, .dev = dev, .kind = RANGE_ALLOC,
                          .obj = m, .map = map};
    rc = stoke__hostranges_add(&g_ranges, &r);
    if (rc != STOKE_OK) {
        unmap_release(d, m, map);
        return stoke__fail(rc, "opencl: tracking pinned block %p failed", (void *)base);
    }
    *out = (void *)base;
    return STOKE_OK;
}

static int opencl_host_free(int dev, void *ptr)
{
    if (!ptr)
        return STOKE_OK;
    stoke__hostrange r;
    if (!stoke__hostranges_find(&g_ranges, ptr, &r) || r.base != (uintptr_t)ptr ||
        r.kind != RANGE_ALLOC)
        return stoke__fail(STOKE_EINVAL, "opencl: host_free(%p): not a block from host_alloc",
                           ptr);
    if (stoke__hostranges_remove(&g_ranges, ptr, &r) != STOKE_OK)
        return stoke__fail(STOKE_EINVAL, "opencl: host_free(%p): freed twice", ptr);
    unmap_release(&g.devs[r.dev], r.obj, r.map);
    return STOKE_OK;
}

static int opencl_host_register(int dev, void *ptr, size_t size)
{
    if (!ptr || !size)
        return stoke__fail(STOKE_EINVAL, "opencl: host_register of an empty range");
    ocl_dev *d;
    int rc = stoke__ocl_get_dev(dev, &d);
    if (rc != STOKE_OK)
        return rc;
    cl_context c = atomic_load_explicit(&d->ctx, memory_order_acquire);
    cl_int e = CL_SUCCESS;
    cl_mem m = g.api.clCreateBuffer(c, CL_MEM_USE_HOST_PTR | CL_MEM_READ_WRITE, size, ptr, &e);
    if (!m || e != CL_SUCCESS)
        return stoke__fail(STOKE_ENOTSUP,
                           "opencl: device %d (%s) cannot register host memory: "
                           "clCreateBuffer(CL_MEM_USE_HOST_PTR) failed with %s (%d)",
                           dev, d->name, stoke__ocl_name(e), (int)e);
    void *map = g.api.clEnqueueMapBuffer(d->util_q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0,
                                         size, 0, NULL, NULL, &e);
    if (map != ptr || e != CL_SUCCESS) {
        unmap_release(d, m, e == CL_SUCCESS ? map : NULL);
        return stoke__fail(STOKE_ENOTSUP, "opencl: device %d (%s) does not use registered host "
                           "memory in place (CL_MEM_USE_HOST_PTR maps to a copy)", dev, d->name);
    }
    stoke__hostrange r = {.base = (uintptr_t)ptr, .size = size, .dev = dev,
                          .kind = RANGE_REGISTERED, .obj = m, .map = map};
    rc = stoke__hostranges_add(&g_ranges, &r);
    if (rc != STOKE_OK) {
        unmap_release(d, m, map);
        return stoke__fail(rc, "opencl: [%p, +%zu) overlaps memory already pinned", ptr, size);
    }
    return STOKE_OK;
}

static int opencl_host_unregister(int dev, void *ptr)
{
    stoke__hostrange r;
    if (!stoke__hostranges_find(&g_ranges, ptr, &r) || r.base != (uintptr_t)ptr ||
        r.kind != RANGE_REGISTERED)
        return stoke__fail(STOKE_EINVAL, "opencl: host_unregister(%p): not a registered range",
                           ptr);
    if (stoke__hostranges_remove(&g_ranges, ptr, &r) != STOKE_OK)
        return stoke__fail(STOKE_EINVAL, "opencl: host_unregister(%p): unregistered twice", ptr);
    unmap_release(&g.devs[r.dev], r.obj, r.map);
    return STOKE_OK;
}

static int opencl_is_pinned(const void *ptr, int *out)
{
    *out = ptr && stoke__hostranges_find(&g_ranges, ptr, NULL);
    return STOKE_OK;
}

/* ---- device memory ------------------------------------------------------------------------ */

static int opencl_device_alloc(int dev, size_t size, void **out)
{
    *out = NULL;
    ocl_dev *d;
    int rc = stoke__ocl_get_dev(dev, &d);
    if (rc != STOKE_OK)
        return rc;
    cl_int e = CL_SUCCESS;
    cl_mem m = g.api.clCreateBuffer(atomic_load_explicit(&d->ctx, memory_order_acquire),
                                    CL_MEM_READ_WRITE, size ? size : 1, NULL, &e);
    if (!m || e != CL_SUCCESS) {
        char what[128];
        return stoke__ocl_fail(
            e ? e : CL_MEM_OBJECT_ALLOCATION_FAILURE,
            stoke__fmt(what, sizeof(what), "clCreateBuffer(%zu bytes) on device %d", size, dev));
    }
    *out = m;
    return STOKE_OK;
}

static int opencl_device_free(int dev, void *handle)
{
    if (handle)
        g.api.clReleaseMemObject((cl_mem)handle);
    return STOKE_OK;
}

/* ---- shutdown ----------------------------------------------------------------------------- */

static void opencl_shutdown(void)
{
    pthread_mutex_lock(&g.lock);
    stoke__hostrange *v = NULL;
    size_t n = 0;
    stoke__hostranges_take_all(&g_ranges, &v, &n);
    for (size_t i = 0; i < n; i++)
        unmap_release(&g.devs[v[i].dev], v[i].obj, v[i].map);
    if (n)
        stoke__log(STOKE_LOG_DEBUG, "opencl: shutdown released %zu pinned range(s) still held",
                   n);
    free(v);
    for (int i = 0; i < g.ndev; i++) {
        cl_context c = atomic_exchange(&g.devs[i].ctx, NULL);
        if (c) {
            g.api.clReleaseCommandQueue(g.devs[i].util_q);
            g.devs[i].util_q = NULL;
            g.api.clReleaseContext(c);
        }
    }
    g.enumerated = 0;
    g.ndev = g.nfast = 0;
    atomic_store(&g.nexposed, 0);
    pthread_mutex_unlock(&g.lock);
}

static const stoke_backend opencl_backend = {
    .abi_version = STOKE_BACKEND_ABI_VERSION,
    .size = sizeof(stoke_backend),
    .name = "opencl",
    .description = "OpenCL 1.2+ through the ICD loader (libOpenCL.so.1 loaded at run time)",
    .caps = STOKE_CAP_PINNED_ALLOC | STOKE_CAP_HOST_REGISTER | STOKE_CAP_DEVICE_MEMORY |
            STOKE_CAP_ASYNC_COPY | STOKE_CAP_EVENTS,
    .probe = opencl_probe,
    .device_count = opencl_device_count,
    .device_props = opencl_device_props,
    .host_alloc = opencl_host_alloc,
    .host_free = opencl_host_free,
    .host_register = opencl_host_register,
    .host_unregister = opencl_host_unregister,
    .is_pinned = opencl_is_pinned,
    .device_alloc = opencl_device_alloc,
    .device_free = opencl_device_free,
    .stream_create = stoke__opencl_stream_create,
    .stream_destroy = stoke__opencl_stream_destroy,
    .stream_synchronize = stoke__opencl_stream_synchronize,
    .copy_h2d_async = stoke__opencl_copy_h2d,
    .copy_d2h_async = stoke__opencl_copy_d2h,
    .event_create = stoke__opencl_event_create,
    .event_destroy = stoke__opencl_event_destroy,
    .event_record = stoke__opencl_event_record,
    .event_query = stoke__opencl_event_query,
    .event_synchronize = stoke__opencl_event_synchronize,
    .shutdown = opencl_shutdown,
};

int stoke__backend_opencl_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    *out = &opencl_backend;
    return STOKE_OK;
}
