/* `stoke devices` as a user runs it: JSON and text, with and without plugins, bad choices. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "stoke/stoke.h"
#include "testutil.h"

static char out[65536], err[8192];

static int run_devices(const char *const env[], const char *arg1, const char *arg2)
{
    const char *argv[] = {tu_cli_path(), "devices", arg1, arg2, NULL};
    return tu_run(argv, env, out, sizeof(out), err, sizeof(err));
}

static void test_cpu_only_json(void **state)
{
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    assert_int_equal(run_devices(env, "--json", NULL), 0);
    assert_non_null(strstr(out, "{\"accelerator\": null"));
    assert_non_null(strstr(out, "{\"name\": \"cuda\", \"origin\": \"builtin\", \"available\": "
                                "false"));
    assert_non_null(strstr(out, "\"name\": \"opencl\""));
    assert_non_null(strstr(out, "\"name\": \"hip\""));
    assert_non_null(strstr(out, "\"name\": \"cpu\""));
}

static void test_cpu_only_text(void **state)
{
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    assert_int_equal(run_devices(env, NULL, NULL), 0);
    assert_non_null(strstr(out, "Accelerator: none"));
    assert_non_null(strstr(out, "cuda"));
}

static void test_fake_plugin_and_explicit_index(void **state)
{
    char path[1024], envp[1100];
    snprintf(envp, sizeof(envp), "STOKE_PLUGIN_PATH=%s",
             tu_test_plugin("beta.so", path, sizeof(path)));
    const char *env[] = {envp, "STOKE_ACCELERATOR=", NULL};
    assert_int_equal(run_devices(env, "--json", NULL), 0);
    assert_non_null(strstr(out, "{\"accelerator\": {\"backend\": \"beta\", \"device_count\": 3, "
                                "\"current_device\": 0"));
    const char *env2[] = {envp, "STOKE_ACCELERATOR=beta:2", NULL};
    assert_int_equal(run_devices(env2, "--json", NULL), 0);
    assert_non_null(strstr(out, "\"current_device\": 2"));
    /* --accelerator on the command line does the same. */
    assert_int_equal(run_devices(env, "--accelerator", "beta:1"), 0);
    assert_non_null(strstr(out, "current device 1"));
}

static void test_unknown_accelerator_fails_listing_known(void **state)
{
    const char *env[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=bogus", NULL};
    assert_int_not_equal(run_devices(env, "--json", NULL), 0);
    assert_non_null(strstr(err, "unknown accelerator 'bogus'"));
    assert_non_null(strstr(err, "known backends: cuda, hip, opencl, cpu"));
    const char *env2[] = {"STOKE_PLUGIN_PATH=", "STOKE_ACCELERATOR=", NULL};
    assert_int_not_equal(run_devices(env2, "--accelerator", "bogus"), 0);
    assert_non_null(strstr(err, "known backends"));
    assert_int_equal(run_devices(env2, "--frobnicate", NULL), 2);
}

/* A refused --accelerator is reported in the user's terms (the option), not by the API's name. */
static void test_accelerator_option_error_names_the_option(void **state)
{
    char envp[1100];
    snprintf(envp, sizeof(envp), "STOKE_PLUGIN_PATH=%s", tu_simdev_path());
    const char *env[] = {envp, "STOKE_ACCELERATOR=", "STOKE_SIMDEV_DEVICES=", NULL};
    assert_int_equal(run_devices(env, "--accelerator=simdev:5", NULL), 1);
    assert_string_equal(err, "stoke devices: --accelerator simdev:5: simdev has 2 device(s), no "
                             "device 5\n");
    assert_int_equal(run_devices(env, "--accelerator", "simdev:x"), 1);
    assert_string_equal(err, "stoke devices: --accelerator simdev:x is not of the form "
                             "name[:index]; known backends: simdev, cuda, hip, opencl, cpu\n");
    assert_int_equal(run_devices(env, "--json", "--accelerator=bogus"), 1);
    assert_string_equal(out, "{\"ok\": false, \"error\": \"--accelerator bogus: unknown "
                             "accelerator 'bogus'; known backends: simdev, cuda, hip, opencl, "
                             "cpu\", \"error_code\": -3, \"error_name\": \"STOKE_ENOENT\"}\n");
}

/* The acceptance checks of the foundation issue, with the real simdev plugin. */
static void test_simdev_acceptance(void **state)
{
    char envp[1100];
    snprintf(envp, sizeof(envp), "STOKE_PLUGIN_PATH=%s", tu_simdev_path());
    const char *env[] = {envp, "STOKE_ACCELERATOR=", "STOKE_SIMDEV_DEVICES=", NULL};
    assert_int_equal(run_devices(env, "--json", NULL), 0);
    assert_non_null(strstr(out, "{\"accelerator\": {\"backend\": \"simdev\", \"device_count\": 2, "
                                "\"current_device\": 0"));
    const char *env2[] = {envp, "STOKE_ACCELERATOR=simdev:1", "STOKE_SIMDEV_DEVICES=", NULL};
    assert_int_equal(run_devices(env2, "--json", NULL), 0);
    assert_non_null(strstr(out, "\"current_device\": 1"));
    const char *env3[] = {envp, "STOKE_ACCELERATOR=bogus", NULL};
    assert_int_not_equal(run_devices(env3, "--json", NULL), 0);
    assert_non_null(strstr(err, "known backends: simdev, cuda, hip, opencl, cpu"));
}

/* Removes dir's probe cache files (a failed earlier run's). */
static void clear_probe_files(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[1200];
    while ((e = readdir(d)))
        if (strncmp(e->d_name, "stoke-", 6) == 0) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
}

/* The file a run's debug output says it cached its answer in, into file (len bytes). */
static void cached_file(char *file, size_t len)
{
    static const char said[] = "probe answer cached for this boot in ";
    const char *named = strstr(err, said);
    assert_non_null(named);
    named += strlen(said);
    snprintf(file, len, "%.*s", (int)strcspn(named, "\n"), named);
}

/* A copy of file src at dst (mode 0700); 0 or -1. */
static int copy_file(const char *src, const char *dst)
{
    FILE *in = fopen(src, "rb"), *o = in ? fopen(dst, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int rc = in && o ? 0 : -1;
    while (rc == 0 && (n = fread(buf, 1, sizeof(buf), in)) > 0)
        rc = fwrite(buf, 1, n, o) == n ? 0 : -1;
    if (in && ferror(in))
        rc = -1;
    if (o && fclose(o) != 0)
        rc = -1;
    if (in)
        fclose(in);
    return rc == 0 ? chmod(dst, 0700) : -1;
}

/* The automatic OpenCL probe's answer is kept for the boot (STOKE_PROBE_CACHE): the next process
 * takes it from there instead of probing in a child again, says so at debug level and lists the
 * same; a file others may write, a truncated one, another environment or STOKE_PROBE_CACHE=0
 * probe again. */
static void test_probe_cache(void **state)
{
    char dir[512], dirv[600], file[700];
    tu_tmp_path("probecache", dir, sizeof(dir));
    mkdir(dir, 0700);
    snprintf(dirv, sizeof(dirv), "STOKE_PROBE_CACHE=%s", dir);
    clear_probe_files(dir);
    const char *env[] = {dirv,
                         "STOKE_LOG=debug",
                         "STOKE_PLUGIN_PATH=",
                         "STOKE_ACCELERATOR=",
                         "STOKE_OPENCL_LIBRARY=",
                         "POCL_DEVICES=",
                         NULL};
    assert_int_equal(run_devices(env, NULL, NULL), 0);
    if (strstr(err, "probing in this process"))
        tu_skip("the OpenCL probe runs in this process here (no child to save): %s", err);
    if (!strstr(err, "opencl: probed in a child, nothing loaded here"))
        tu_skip("the OpenCL probe finds a device here (such answers are not kept): %s", err);
    char listed[sizeof(out)];
    memcpy(listed, out, sizeof(out));
    /* the file: named in the debug line, in the directory, one per library path
     * ("stoke-UID-opencl-HASH.probe", HASH 16 hex digits) */
    cached_file(file, sizeof(file));
    char prefix[600];
    snprintf(prefix, sizeof(prefix), "%s/stoke-%u-opencl-", dir, (unsigned)geteuid());
    assert_int_equal(strncmp(file, prefix, strlen(prefix)), 0);
    assert_int_equal(strlen(file), strlen(prefix) + 16 + strlen(".probe"));
    assert_int_equal(strspn(file + strlen(prefix), "0123456789abcdef"), 16);
    assert_string_equal(file + strlen(prefix) + 16, ".probe");
    struct stat st;
    assert_int_equal(stat(file, &st), 0);
    assert_true(S_ISREG(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0600);
    assert_int_equal(st.st_uid, geteuid());

    assert_int_equal(run_devices(env, NULL, NULL), 0);
    assert_non_null(strstr(err, "opencl: answered by the probe cache (this boot's"));
    assert_null(strstr(err, "probed in a child"));
    assert_string_equal(out, listed);

    /* writable by the group: not read, replaced by a fresh answer (0600 again) */
    assert_int_equal(chmod(file, 0620), 0);
    assert_int_equal(run_devices(env, NULL, NULL), 0);
    assert_non_null(strstr(err, "ignored: not a regular file of uid"));
    assert_non_null(strstr(err, "opencl: probed in a child"));
    assert_int_equal(stat(file, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0600);

    /* another user's (root can make one here): not read, replaced */
    if (geteuid() == 0) {
        assert_int_equal(chown(file, 65534, 65534), 0);
        assert_int_equal(run_devices(env, NULL, NULL), 0);
        assert_non_null(strstr(err, "ignored: not a regular file of uid 0"));
        assert_non_null(strstr(err, "opencl: probed in a child"));
        assert_int_equal(stat(file, &st), 0);
        assert_int_equal(st.st_uid, 0);
    }

    /* truncated: probed again */
    assert_int_equal(truncate(file, 20), 0);
    assert_int_equal(run_devices(env, NULL, NULL), 0);
    assert_non_null(strstr(err, "opencl: probed in a child"));
    assert_string_equal(out, listed);

    /* another value of a variable the drivers read: another key, probed again, then kept */
    const char *env2[] = {dirv,
                          "STOKE_LOG=debug",
                          "STOKE_PLUGIN_PATH=",
                          "STOKE_ACCELERATOR=",
                          "STOKE_OPENCL_LIBRARY=",
                          "POCL_DEVICES=pthread",
                          NULL};
    assert_int_equal(run_devices(env2, NULL, NULL), 0);
    assert_non_null(strstr(err, "opencl: probed in a child"));
    assert_int_equal(run_devices(env2, NULL, NULL), 0);
    assert_non_null(strstr(err, "answered by the probe cache"));
    assert_int_equal(run_devices(env, NULL, NULL), 0);
    assert_non_null(strstr(err, "opencl: probed in a child"));

    /* a copy of the library in another place keeps its own answer: neither replaces the other's
     * (each process of the one was a miss for the other) */
    char lib[700], libdir[700], copy[800], ldp[800], file2[700];
    snprintf(lib, sizeof(lib), "%s", tu_cli_path());
    char *slash = strrchr(lib, '/');
    assert_non_null(slash);
    snprintf(slash + 1, sizeof(lib) - (size_t)(slash + 1 - lib), "libstoke.so.0");
    snprintf(libdir, sizeof(libdir), "%s/lib2", dir);
    mkdir(libdir, 0700);
    snprintf(copy, sizeof(copy), "%s/libstoke.so.0", libdir);
    assert_int_equal(copy_file(lib, copy), 0);
    snprintf(ldp, sizeof(ldp), "LD_LIBRARY_PATH=%s", libdir);
    const char *env4[] = {dirv,
                          "STOKE_LOG=debug",
                          "STOKE_PLUGIN_PATH=",
                          "STOKE_ACCELERATOR=",
                          "STOKE_OPENCL_LIBRARY=",
                          "POCL_DEVICES=",
                          ldp,
                          NULL};
    assert_int_equal(run_devices(env, NULL, NULL), 0); /* this library's answer, kept */
    assert_non_null(strstr(err, "answered by the probe cache"));
    assert_int_equal(run_devices(env4, NULL, NULL), 0);
    assert_non_null(strstr(err, "opencl: probed in a child"));
    cached_file(file2, sizeof(file2));
    assert_string_not_equal(file2, file);
    assert_int_equal(run_devices(env, NULL, NULL), 0);
    assert_non_null(strstr(err, "answered by the probe cache"));
    assert_int_equal(run_devices(env4, NULL, NULL), 0);
    assert_non_null(strstr(err, "answered by the probe cache"));
    assert_string_equal(out, listed);
    assert_int_equal(unlink(file2), 0);
    assert_int_equal(unlink(copy), 0);
    assert_int_equal(rmdir(libdir), 0);

    /* turned off: never read, never written */
    assert_int_equal(unlink(file), 0);
    const char *env3[] = {"STOKE_PROBE_CACHE=0",
                          "STOKE_LOG=debug",
                          "STOKE_PLUGIN_PATH=",
                          "STOKE_ACCELERATOR=",
                          "STOKE_OPENCL_LIBRARY=",
                          "POCL_DEVICES=",
                          NULL};
    for (int i = 0; i < 2; i++) {
        assert_int_equal(run_devices(env3, NULL, NULL), 0);
        assert_non_null(strstr(err, "opencl: probed in a child"));
        assert_null(strstr(err, "probe cache"));
        assert_string_equal(out, listed);
    }
    assert_int_not_equal(stat(file, &st), 0);

    /* a directory named by STOKE_PROBE_CACHE that cannot take the answer: said at the default
     * log level, naming the variable (every process probes again) */
    char missing[700], missingv[800];
    snprintf(missing, sizeof(missing), "%s/missing", dir);
    snprintf(missingv, sizeof(missingv), "STOKE_PROBE_CACHE=%s", missing);
    const char *env5[] = {missingv,
                          "STOKE_LOG=",
                          "STOKE_PLUGIN_PATH=",
                          "STOKE_ACCELERATOR=",
                          "STOKE_OPENCL_LIBRARY=",
                          "POCL_DEVICES=",
                          NULL};
    assert_int_equal(run_devices(env5, NULL, NULL), 0);
    if (!strstr(err, "opencl: probe answer not cached: ") || !strstr(err, missingv) ||
        !strstr(err, "No such file or directory") || !strstr(err, "each process probes again"))
        fail_msg("no warning of the missing probe cache directory in: %s", err);
    assert_string_equal(out, listed);
    rmdir(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_only_json),
        cmocka_unit_test(test_cpu_only_text),
        cmocka_unit_test(test_fake_plugin_and_explicit_index),
        cmocka_unit_test(test_unknown_accelerator_fails_listing_known),
        cmocka_unit_test(test_accelerator_option_error_names_the_option),
        cmocka_unit_test(test_simdev_acceptance),
        cmocka_unit_test(test_probe_cache),
    };
    return tu_exit_status(cmocka_run_group_tests(tests, NULL, NULL));
}
