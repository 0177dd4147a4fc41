/* The opencl backend, for real, on whatever OpenCL platform the machine has (PoCL's CPU device
 * in CI: `make deps` installs pocl-opencl-icd).  PoCL is asked for two CPU devices
 * (POCL_DEVICES) so that per-device contexts can be checked.
 *
 * Without libOpenCL.so.1 or any OpenCL device the tests skip with a message, except when CI=true
 * (or 1) is set: then they fail, because CI installs both.  The same holds for every check that
 * needs something PoCL provides (two devices, host registration): in CI a missing one fails,
 * elsewhere the test is skipped; the checks that need CPU-only OpenCL devices skip on a machine
 * with an OpenCL GPU.  Any skip makes the executable exit 77, which CTest reports as skipped
 * (tu_exit_status), never as passed. */
#define _GNU_SOURCE
#include "testutil.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backends/opencl_api.h"
#include "pinned/pinned_internal.h"
#include "registry/registry.h"
#include "stoke/stoke.h"

#define MiB (1024u * 1024u)

static int in_ci(void)
{
    const char *ci = getenv("CI");
    return ci && (strcmp(ci, "true") == 0 || strcmp(ci, "1") == 0);
}

/* Skips the current test because this machine lacks what it checks (`why`), or fails it in CI,
 * where `make deps` installs what every check needs. */
static void skip_or_fail_in_ci(const char *why)
{
    if (in_ci())
        fail_msg("%s, but CI=%s (make deps installs ocl-icd-libopencl1 and pocl-opencl-icd; "
                 "POCL_DEVICES asks for two CPU devices)", why, getenv("CI"));
    tu_skip("%s", why);
}

/* Makes opencl the explicit accelerator; skips (or fails in CI) when it is unavailable. */
static void use_opencl(void)
{
    stoke__pinned_reset(); /* cached blocks belong to the backend instance reset below */
    tu_env("STOKE_OPENCL_LIBRARY", NULL);
    tu_env("STOKE_PLUGIN_PATH", NULL);
    tu_env("STOKE_ACCELERATOR", "opencl");
    stoke_accelerator_info ai;
    int rc = stoke_accelerator_get(&ai);
    if (rc == STOKE_OK) {
        assert_string_equal(ai.backend, "opencl");
        return;
    }
    char why[512];
    snprintf(why, sizeof(why), "OpenCL is unavailable here: %s", ai.reason);
    skip_or_fail_in_ci(why);
}

static const stoke_backend *vt_opencl(void)
{
    const stoke_backend *vt = NULL;
    assert_int_equal(stoke__backend_lookup("opencl", &vt), STOKE_OK);
    return vt;
}

static int all_cpu_devices(void)
{
    int n = 0;
    assert_int_equal(vt_opencl()->device_count(&n), STOKE_OK);
    for (int i = 0; i < n; i++) {
        stoke_device_props p = {.size = sizeof(p)};
        assert_int_equal(stoke_device_get_props("opencl", i, &p), STOKE_OK);
        if (p.kind != STOKE_DEVICE_CPU)
            return 0;
    }
    return 1;
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    uint32_t x = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        p[i] = (unsigned char)(x >> 24);
    }
}

/* ---- what the probe loads ----------------------------------------------------------------- */

/* Lines of /proc/self/maps naming `lib`. */
static int maps_count(const char *lib)
{
    FILE *f = fopen("/proc/self/maps", "r");
    assert_non_null(f);
    char line[1024];
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, lib) != NULL;
    fclose(f);
    return n;
}

/* A field of /proc/self/status in kB ("VmRSS"), -1 if absent. */
static long status_kb(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    assert_non_null(f);
    char line[256];
    long v = -1;
    size_t n = strlen(field);
    while (fgets(line, sizeof(line), f))
        if (strncmp(line, field, n) == 0 && line[n] == ':')
            v = atol(line + n + 1);
    fclose(f);
    return v;
}

/* Runs first, before anything loads OpenCL here: the automatic probe (selection and the backend
 * listing of `stoke devices`) must not map the ICD loader or PoCL (and its LLVM) into this
 * process when there are only CPU devices, which it does not use; choosing opencl explicitly
 * afterwards loads it and works. */
static void test_automatic_probe_loads_nothing(void **state)
{
    tu_env("STOKE_OPENCL_LIBRARY", NULL);
    tu_env("STOKE_PLUGIN_PATH", NULL);
    tu_env("STOKE_ACCELERATOR", NULL);
    if (maps_count("libOpenCL") || maps_count("libpocl"))
        fail_msg("OpenCL is mapped before the first probe: this test must run first");
    long rss0 = status_kb("VmRSS");
    stoke_accelerator_info ai;
    int rc = stoke_accelerator_get(&ai);
    if (rc == STOKE_OK && strcmp(ai.backend, "opencl") == 0)
        tu_skip("this machine has a GPU/accelerator OpenCL device (used, so loaded)");
    stoke_backend_info bi = {0};
    int found = 0;
    for (int i = 0; i < stoke_backend_count() && !found; i++) {
        assert_int_equal(stoke_backend_get_info(i, &bi), STOKE_OK);
        found = strcmp(bi.name, "opencl") == 0;
    }
    assert_true(found);
    if (bi.available)
        tu_skip("this machine has a GPU/accelerator OpenCL device: %s", bi.reason);
    int nreported = 0;
    if (sscanf(bi.reason, "only CPU devices (%d: ", &nreported) != 1) {
        char why[512];
        snprintf(why, sizeof(why), "no CPU OpenCL device (PoCL) here: %s", bi.reason);
        skip_or_fail_in_ci(why);
    }
    assert_non_null(strstr(bi.reason, "STOKE_ACCELERATOR=opencl"));
    long rss1 = status_kb("VmRSS");
    int ocl = maps_count("libOpenCL"), pocl = maps_count("libpocl"), llvm = maps_count("libLLVM");
    print_message("after the automatic probe: VmRSS %ld -> %ld kB; maps: libOpenCL %d, "
                  "libpocl %d, libLLVM %d\n", rss0, rss1, ocl, pocl, llvm);
    assert_int_equal(ocl, 0);
    assert_int_equal(pocl, 0);
    assert_int_equal(llvm, 0);

    /* Chosen explicitly now (no reset in between): loaded here, with the devices reported. */
    assert_int_equal(stoke_accelerator_select("opencl"), STOKE_OK);
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_OK);
    assert_string_equal(ai.backend, "opencl");
    assert_int_equal(ai.device_count, nreported);
    void *p = NULL;
    assert_int_equal(stoke_pinned_alloc(64 * 1024, &p), STOKE_OK);
    assert_int_equal(stoke_is_pinned(p), 1);
    memset(p, 0x5a, 64 * 1024);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    assert_true(maps_count("libOpenCL") > 0);
    print_message("after choosing opencl explicitly: VmRSS %ld kB; maps: libpocl %d\n",
                  status_kb("VmRSS"), maps_count("libpocl"));
    assert_int_equal(stoke_accelerator_select(NULL), STOKE_ENODEV); /* CPU-only: none */
}

/* ---- selection ---------------------------------------------------------------------------- */

static void test_automatic_selection_ignores_cpu_devices(void **state)
{
    use_opencl();
    if (!all_cpu_devices())
        tu_skip("this machine has a GPU/accelerator OpenCL device"); /* CI has none */
    tu_env("STOKE_ACCELERATOR", NULL);
    stoke_accelerator_info ai;
    int rc = stoke_accelerator_get(&ai);
    /* Another backend (a real CUDA GPU) may win; opencl must not. */
    if (rc == STOKE_OK)
        assert_string_not_equal(ai.backend, "opencl");
    int found = 0;
    for (int i = 0; i < stoke_backend_count(); i++) {
        stoke_backend_info bi;
        assert_int_equal(stoke_backend_get_info(i, &bi), STOKE_OK);
        if (strcmp(bi.name, "opencl") != 0)
            continue;
        found = 1;
        assert_int_equal(bi.available, 0);
        assert_non_null(strstr(bi.reason, "only CPU devices"));
        assert_non_null(strstr(bi.reason, "STOKE_ACCELERATOR=opencl"));
    }
    assert_true(found);
}

static void test_explicit_selection_exposes_cpu_devices(void **state)
{
    use_opencl();
    stoke_accelerator_info ai;
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_OK);
    assert_true(ai.device_count >= 1);
    assert_non_null(strstr(ai.reason, "STOKE_ACCELERATOR=opencl"));
    for (int i = 0; i < ai.device_count; i++) {
        stoke_device_props p = {.size = sizeof(p)};
        assert_int_equal(stoke_device_get_props(NULL, i, &p), STOKE_OK);
        assert_true(p.name[0] != '\0');
        assert_true(p.compute_major >= 1); /* OpenCL version */
        assert_true(p.total_memory > 0);
        assert_true(p.kind == STOKE_DEVICE_CPU || p.kind == STOKE_DEVICE_GPU ||
                    p.kind == STOKE_DEVICE_ACCELERATOR);
    }
    stoke_device_props p = {.size = sizeof(p)};
    assert_int_equal(stoke_device_get_props(NULL, ai.device_count, &p), STOKE_ERANGE);
}

/* Objects made on a CPU device exposed by an explicit choice keep working after the process
 * returns to automatic selection (which re-probes opencl without exposing CPU devices). */
static void test_exposure_never_narrows(void **state)
{
    use_opencl();
    tu_env("STOKE_ACCELERATOR", NULL);
    if (!all_cpu_devices())
        tu_skip("this machine has a GPU/accelerator OpenCL device"); /* CI has none */
    assert_int_equal(stoke_accelerator_select("opencl"), STOKE_OK);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, 4096, &d), STOKE_OK);
    assert_int_equal(stoke_accelerator_select(NULL), STOKE_ENODEV); /* CPU-only: none */
    unsigned char in[4096], out[4096];
    fill(in, sizeof(in), 9);
    memset(out, 0, sizeof(out));
    assert_int_equal(stoke_copy_h2d_async(d, 0, in, sizeof(in), s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(out, d, 0, sizeof(out), s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(in, out, sizeof(in));
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
}

static void test_missing_library_reason(void **state)
{
    use_opencl();
    tu_env("STOKE_OPENCL_LIBRARY", "/nonexistent/libOpenCL.so.1");
    stoke_accelerator_info ai;
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_ENODEV);
    assert_non_null(strstr(ai.reason, "/nonexistent/libOpenCL.so.1 not found"));
    tu_env("STOKE_OPENCL_LIBRARY", NULL);
    assert_int_equal(stoke_accelerator_get(&ai), STOKE_OK);
}

static void test_probe_creates_no_context(void **state)
{
    use_opencl();
    int n = 0;
    assert_int_equal(vt_opencl()->device_count(&n), STOKE_OK);
    for (int i = 0; i < n; i++)
        assert_int_equal(stoke__opencl_context_created(i), 0);
    if (n < 2)
        skip_or_fail_in_ci("one OpenCL device only: the per-device context check needs two");
    /* Pinning on device 1 creates device 1's context and no other. */
    assert_int_equal(stoke_device_set(1), STOKE_OK);
    void *p = NULL;
    assert_int_equal(stoke_pinned_alloc(64 * 1024, &p), STOKE_OK);
    assert_int_equal(stoke_is_pinned(p), 1);
    assert_int_equal(stoke__opencl_context_created(1), 1);
    assert_int_equal(stoke__opencl_context_created(0), 0);
    assert_int_equal(stoke_pinned_free(p), STOKE_OK);
    assert_int_equal(stoke_device_set(0), STOKE_OK);
}

/* ---- pinned memory ------------------------------------------------------------------------ */

static void test_pinned_alloc_and_is_pinned(void **state)
{
    use_opencl();
    const stoke_backend *vt = vt_opencl();
    long ps = sysconf(_SC_PAGESIZE);
    size_t n = 3 * MiB + 13;
    void *p = NULL;
    assert_int_equal(vt->host_alloc(0, n, &p), STOKE_OK);
    assert_non_null(p);
    assert_int_equal((uintptr_t)p % (uintptr_t)ps, 0);
    unsigned char *b = p;
    memset(b, 0xa5, n); /* the whole block is CPU-writable */
    int pinned = -1;
    assert_int_equal(vt->is_pinned(b, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(b + n / 2, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(b + n - 1, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->is_pinned(b + n, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    int local = 0;
    assert_int_equal(vt->is_pinned(&local, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->host_free(0, b + 1), STOKE_EINVAL); /* interior pointer */
    assert_int_equal(vt->host_free(0, p), STOKE_OK);
    assert_int_equal(vt->is_pinned(b, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    assert_int_equal(vt->host_free(0, p), STOKE_EINVAL); /* twice */

    /* Through the public allocator. */
    void *q = NULL;
    assert_int_equal(stoke_pinned_alloc(100000, &q), STOKE_OK);
    assert_int_equal(stoke_is_pinned(q), 1);
    assert_int_equal(stoke_is_pinned((char *)q + 99999), 1);
    assert_int_equal(stoke_is_pinned(&local), 0);
    assert_int_equal(stoke_pinned_free(q), STOKE_OK);
}

static void test_host_register(void **state)
{
    use_opencl();
    const stoke_backend *vt = vt_opencl();
    long ps = sysconf(_SC_PAGESIZE);
    size_t n = 1 * MiB;
    void *mem = NULL;
    assert_int_equal(posix_memalign(&mem, (size_t)ps, n), 0);
    int rc = vt->host_register(0, mem, n);
    if (rc == STOKE_ENOTSUP) {
        char why[512];
        snprintf(why, sizeof(why), "this OpenCL device cannot register host memory: %s",
                 stoke_last_error());
        free(mem);
        skip_or_fail_in_ci(why);
    }
    assert_int_equal(rc, STOKE_OK);
    int pinned = 0;
    assert_int_equal(vt->is_pinned((char *)mem + 4097, &pinned), STOKE_OK);
    assert_int_equal(pinned, 1);
    assert_int_equal(vt->host_register(0, (char *)mem + 4096, 4096), STOKE_EINVAL); /* overlap */
    assert_int_equal(vt->host_unregister(0, (char *)mem + 4096), STOKE_EINVAL);
    assert_int_equal(vt->host_unregister(0, mem), STOKE_OK);
    assert_int_equal(vt->is_pinned((char *)mem + 4097, &pinned), STOKE_OK);
    assert_int_equal(pinned, 0);
    free(mem);
}

/* ---- copies and events -------------------------------------------------------------------- */

static void test_copies_both_ways(void **state)
{
    use_opencl();
    size_t n = 5 * MiB + 77;
    unsigned char *src = NULL, *back_pinned = NULL;
    assert_int_equal(stoke_pinned_alloc(n, (void **)&src), STOKE_OK);
    assert_int_equal(stoke_pinned_alloc(n, (void **)&back_pinned), STOKE_OK);
    unsigned char *pageable = malloc(n), *back = malloc(n);
    assert_non_null(pageable);
    assert_non_null(back);
    fill(src, n, 1);
    fill(pageable, n, 2);
    memset(back, 0, n);
    memset(back_pinned, 0, n);

    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    assert_string_equal(stoke_stream_backend(s), "opencl");
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, 2 * n, &d), STOKE_OK);
    assert_non_null(stoke_device_buffer_handle(d));
    stoke_event *ev = NULL;
    assert_int_equal(stoke_event_create(s, &ev), STOKE_OK);
    assert_int_equal(stoke_event_query(ev), STOKE_OK); /* never recorded */

    /* pinned -> [0, n), pageable -> [n, 2n), then read both back. */
    assert_int_equal(stoke_copy_h2d_async(d, 0, src, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_h2d_async(d, n, pageable, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back_pinned, d, 0, n, s), STOKE_OK);
    assert_int_equal(stoke_copy_d2h_async(back, d, n, n, s), STOKE_OK);
    assert_int_equal(stoke_event_record(ev, s), STOKE_OK);
    int q = stoke_event_query(ev);
    assert_true(q == STOKE_OK || q == STOKE_EBUSY);
    assert_int_equal(stoke_event_synchronize(ev), STOKE_OK);
    assert_int_equal(stoke_event_query(ev), STOKE_OK);
    assert_memory_equal(back_pinned, src, n);
    assert_memory_equal(back, pageable, n);

    /* An unaligned slice in the middle, and a copy past the end. */
    memset(back, 0, n);
    assert_int_equal(stoke_copy_d2h_async(back, d, 12345, 1000, s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(back, src + 12345, 1000);
    assert_int_equal(stoke_copy_h2d_async(d, 2 * n - 10, src, 11, s), STOKE_ERANGE);

    stoke_event_destroy(ev);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    free(pageable);
    free(back);
    assert_int_equal(stoke_pinned_free(src), STOKE_OK);
    assert_int_equal(stoke_pinned_free(back_pinned), STOKE_OK);
}

/* Many small copies with an event after each: events complete in order and every chunk lands. */
static void test_events_in_order(void **state)
{
    use_opencl();
    enum { CHUNKS = 40, CHUNK = 64 * 1024 };
    unsigned char *src = NULL;
    assert_int_equal(stoke_pinned_alloc(CHUNKS * CHUNK, (void **)&src), STOKE_OK);
    fill(src, CHUNKS * CHUNK, 3);
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    assert_int_equal(stoke_device_buffer_create(s, CHUNKS * CHUNK, &d), STOKE_OK);
    stoke_event *ev[CHUNKS];
    for (int i = 0; i < CHUNKS; i++) {
        assert_int_equal(stoke_event_create(s, &ev[i]), STOKE_OK);
        assert_int_equal(stoke_copy_h2d_async(d, (size_t)i * CHUNK, src + (size_t)i * CHUNK,
                                              CHUNK, s), STOKE_OK);
        assert_int_equal(stoke_event_record(ev[i], s), STOKE_OK);
    }
    assert_int_equal(stoke_event_synchronize(ev[CHUNKS - 1]), STOKE_OK);
    for (int i = 0; i < CHUNKS; i++)
        assert_int_equal(stoke_event_query(ev[i]), STOKE_OK);
    /* Re-recording an event moves it. */
    assert_int_equal(stoke_copy_h2d_async(d, 0, src, CHUNK, s), STOKE_OK);
    assert_int_equal(stoke_event_record(ev[0], s), STOKE_OK);
    assert_int_equal(stoke_event_synchronize(ev[0]), STOKE_OK);
    unsigned char *back = malloc(CHUNKS * CHUNK);
    assert_non_null(back);
    assert_int_equal(stoke_copy_d2h_async(back, d, 0, CHUNKS * CHUNK, s), STOKE_OK);
    assert_int_equal(stoke_stream_synchronize(s), STOKE_OK);
    assert_memory_equal(back, src, CHUNKS * CHUNK);
    for (int i = 0; i < CHUNKS; i++)
        stoke_event_destroy(ev[i]);
    free(back);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    assert_int_equal(stoke_pinned_free(src), STOKE_OK);
}

static void test_device_alloc_failure_is_clear(void **state)
{
    use_opencl();
    stoke_stream *s = NULL;
    assert_int_equal(stoke_stream_create(NULL, &s), STOKE_OK);
    stoke_device_buffer *d = NULL;
    int rc = stoke_device_buffer_create(s, (size_t)1 << 60, &d);
    assert_true(rc == STOKE_ENOMEM || rc == STOKE_EBACKEND);
    assert_null(d);
    assert_non_null(strstr(stoke_last_error(), "allocating"));
    stoke_stream_destroy(s);
}

/* Streams used by several threads at once (one stream per thread). */
typedef struct {
    int id;
    int ok;
} worker_arg;

static void *copy_worker(void *p)
{
    worker_arg *a = p;
    size_t n = 256 * 1024;
    unsigned char *src = NULL, *back = malloc(n);
    stoke_stream *s = NULL;
    stoke_device_buffer *d = NULL;
    stoke_event *ev = NULL;
    if (!back || stoke_pinned_alloc(n, (void **)&src) != STOKE_OK ||
        stoke_stream_create(NULL, &s) != STOKE_OK ||
        stoke_device_buffer_create(s, n, &d) != STOKE_OK || stoke_event_create(s, &ev) != STOKE_OK)
        goto out;
    a->ok = 1;
    for (int round = 0; round < 8 && a->ok; round++) {
        fill(src, n, (unsigned)(a->id * 100 + round));
        if (stoke_copy_h2d_async(d, 0, src, n, s) != STOKE_OK ||
            stoke_copy_d2h_async(back, d, 0, n, s) != STOKE_OK ||
            stoke_event_record(ev, s) != STOKE_OK || stoke_event_synchronize(ev) != STOKE_OK ||
            memcmp(back, src, n) != 0)
            a->ok = 0;
    }
out:
    stoke_event_destroy(ev);
    stoke_device_buffer_destroy(d);
    stoke_stream_destroy(s);
    if (src)
        stoke_pinned_free(src);
    free(back);
    return NULL;
}

static void test_threads(void **state)
{
    use_opencl();
    enum { T = 3 };
    pthread_t th[T];
    worker_arg args[T];
    for (int i = 0; i < T; i++) {
        args[i] = (worker_arg){.id = i};
        assert_int_equal(pthread_create(&th[i], NULL, copy_worker, &args[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
}

/* ---- the loader end to end, through the CLI ----------------------------------------------- */

static void write_npy(const char *path, int n, int c, int w)
{
    char dict[128];
    snprintf(dict, sizeof(dict), "{'descr': '<f4', 'fortran_order': False, 'shape': (%d, %d, %d), }",
             n, c, w);
    unsigned char head[256];
    size_t total = tu_npy_head(head, dict);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(head, 1, total, f), total);
    for (int i = 0; i < n * c * w; i++) {
        float v = (float)((i * 37) % 1001) * 0.25f - (float)i;
        assert_int_equal(fwrite(&v, sizeof(v), 1, f), 1);
    }
    assert_int_equal(fclose(f), 0);
}

/* Runs `cmd`, returns its stdout (static buffer) and exit status. */
static const char *run(const char *cmd, int *status)
{
    static char out[16384];
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    *status = pclose(p);
    return out;
}

/* Copies the JSON value of "key" (a string without quotes, or a bare token) into val. */
static int json_field(const char *json, const char *key, char *val, size_t len)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\": ", key);
    const char *p = strstr(json, pat);
    if (!p)
        return 0;
    p += strlen(pat);
    if (*p == '"')
        p++;
    size_t i = 0;
    while (*p && *p != '"' && *p != ',' && *p != '}' && i + 1 < len)
        val[i++] = *p++;
    val[i] = '\0';
    return 1;
}

static void test_loader_to_device_same_content(void **state)
{
    use_opencl();
    const char *cli = getenv("STOKE_CLI");
    if (!cli || !*cli)
        fail_msg("STOKE_CLI is not set (run the tests through ctest)");
    char path[512], name[64];
    snprintf(name, sizeof(name), "opencl_e2e_%d.npy", (int)getpid());
    tu_tmp_path(name, path, sizeof(path));
    write_npy(path, 3000, 3, 16);
    const char *opts = "--batch-size 64 --workers 3 --shuffle --seed 7 --json";
    char cmd[2048];
    int st;
    snprintf(cmd, sizeof(cmd), "STOKE_ACCELERATOR= '%s' load 'npy:%s' %s", cli, path, opts);
    char host[16384];
    snprintf(host, sizeof(host), "%s", run(cmd, &st));
    if (st != 0)
        fail_msg("host run failed (status %d): %s\n%s", st, cmd, host);
    snprintf(cmd, sizeof(cmd), "STOKE_ACCELERATOR=opencl '%s' load 'npy:%s' --device opencl "
             "--verify %s", cli, path, opts);
    const char *dev = run(cmd, &st);
    if (st != 0)
        fail_msg("device run failed (status %d): %s\n%s", st, cmd, dev);
    char a[128], b[128];
    assert_true(json_field(dev, "device", a, sizeof(a)));
    assert_string_equal(a, "opencl");
    assert_true(json_field(dev, "verified", a, sizeof(a)));
    assert_string_equal(a, "true");
    assert_true(json_field(dev, "device_copies", a, sizeof(a)));
    assert_int_equal(atoi(a), (3000 + 63) / 64);
    assert_true(json_field(dev, "samples", a, sizeof(a)));
    assert_int_equal(atoi(a), 3000);
    assert_true(json_field(dev, "pinned_batches", a, sizeof(a)));
    assert_true(atoi(a) > 0);
    for (int k = 0; k < 2; k++) {
        const char *key = k == 0 ? "content_hash" : "order_hash";
        assert_true(json_field(host, key, a, sizeof(a)));
        assert_true(json_field(dev, key, b, sizeof(b)));
        if (strcmp(a, b) != 0)
            fail_msg("%s differs: host %s, device %s\nhost: %s\ndevice: %s", key, a, b, host,
                     dev);
    }
    unlink(path);
}

static int teardown(void **state)
{
    stoke__pinned_reset();
    tu_env("STOKE_ACCELERATOR", NULL);
    tu_env("STOKE_OPENCL_LIBRARY", NULL);
    return 0;
}

int main(void)
{
    /* Two PoCL CPU devices (before anything loads PoCL); a user's own setting wins. */
    setenv("POCL_DEVICES", "pthread pthread", 0);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_teardown(test_automatic_probe_loads_nothing, teardown), /* first */
        cmocka_unit_test_teardown(test_probe_creates_no_context, teardown),
        cmocka_unit_test_teardown(test_automatic_selection_ignores_cpu_devices, teardown),
        cmocka_unit_test_teardown(test_explicit_selection_exposes_cpu_devices, teardown),
        cmocka_unit_test_teardown(test_exposure_never_narrows, teardown),
        cmocka_unit_test_teardown(test_missing_library_reason, teardown),
        cmocka_unit_test_teardown(test_pinned_alloc_and_is_pinned, teardown),
        cmocka_unit_test_teardown(test_host_register, teardown),
        cmocka_unit_test_teardown(test_copies_both_ways, teardown),
        cmocka_unit_test_teardown(test_events_in_order, teardown),
        cmocka_unit_test_teardown(test_device_alloc_failure_is_clear, teardown),
        cmocka_unit_test_teardown(test_threads, teardown),
        cmocka_unit_test_teardown(test_loader_to_device_same_content, teardown),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
