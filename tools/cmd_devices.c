/* stoke devices — the chosen accelerator and every backend considered. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "stoke/stoke.h"

static const char *kind_name(int kind)
{
    switch (kind) {
    case STOKE_DEVICE_GPU: return "gpu";
    case STOKE_DEVICE_ACCELERATOR: return "accelerator";
    case STOKE_DEVICE_CPU: return "cpu";
    case STOKE_DEVICE_SIMULATED: return "simulated";
    }
    return "?";
}

static void caps_text(unsigned long long caps, char *out, size_t len)
{
    static const struct {
        unsigned long long bit;
        const char *name;
    } names[] = {{STOKE_CAP_PINNED_ALLOC, "pinned"},
                 {STOKE_CAP_HOST_REGISTER, "register"},
                 {STOKE_CAP_DEVICE_MEMORY, "device-memory"},
                 {STOKE_CAP_ASYNC_COPY, "async-copy"},
                 {STOKE_CAP_EVENTS, "events"},
                 {STOKE_CAP_IPC, "ipc"},
                 {STOKE_CAP_FORK_SAFE, "fork-safe"}};
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        if (!(caps & names[i].bit))
            continue;
        if (out[0])
            strncat(out, ",", len - strlen(out) - 1);
        strncat(out, names[i].name, len - strlen(out) - 1);
    }
}

static void print_json(int have, const stoke_accelerator_info *acc)
{
    printf("{\"accelerator\": ");
    if (have) {
        printf("{\"backend\": ");
        cli_json_str(stdout, acc->backend);
        printf(", \"device_count\": %d, \"current_device\": %d, \"reason\": ", acc->device_count,
               acc->current_device);
        cli_json_str(stdout, acc->reason);
        printf(", \"devices\": [");
        for (int d = 0; d < acc->device_count; d++) {
            stoke_device_props p = {.size = sizeof(p)};
            if (stoke_device_get_props(NULL, d, &p) != STOKE_OK)
                continue;
            printf("%s{\"index\": %d, \"name\": ", d ? ", " : "", d);
            cli_json_str(stdout, p.name);
            printf(", \"kind\": \"%s\", \"total_memory\": %" PRIu64 ", \"pci_bus_id\": ",
                   kind_name(p.kind), p.total_memory);
            cli_json_str(stdout, p.pci_bus_id);
            printf("}");
        }
        printf("]}");
    } else {
        printf("null, \"reason\": ");
        cli_json_str(stdout, acc->reason);
    }
    printf(", \"backends\": [");
    int n = stoke_backend_count();
    for (int i = 0; i < n; i++) {
        stoke_backend_info b;
        if (stoke_backend_get_info(i, &b) != STOKE_OK)
            continue;
        printf("%s{\"name\": ", i ? ", " : "");
        cli_json_str(stdout, b.name);
        printf(", \"origin\": \"%s\", \"available\": %s, \"device_count\": %d, \"reason\": ",
               b.origin == STOKE_ORIGIN_PLUGIN ? "plugin" : "builtin",
               b.available ? "true" : "false", b.device_count);
        cli_json_str(stdout, b.reason);
        printf(", \"ipc\": %s", b.available && (b.caps & STOKE_CAP_IPC) ? "true" : "false");
        if (b.path[0]) {
            printf(", \"path\": ");
            cli_json_str(stdout, b.path);
        }
        printf("}");
    }
    printf("]}\n");
}

static void print_text(int have, const stoke_accelerator_info *acc)
{
    if (have) {
        printf("Accelerator: %s, %d device(s), current device %d\n", acc->backend,
               acc->device_count, acc->current_device);
        printf("  chosen because: %s\n", acc->reason);
        for (int d = 0; d < acc->device_count; d++) {
            stoke_device_props p = {.size = sizeof(p)};
            if (stoke_device_get_props(NULL, d, &p) != STOKE_OK)
                continue;
            printf("  %c %d  %-28s %-11s", d == acc->current_device ? '*' : ' ', d, p.name,
                   kind_name(p.kind));
            if (p.total_memory)
                printf(" %8.1f GiB", (double)p.total_memory / (1024.0 * 1024 * 1024));
            if (p.pci_bus_id[0])
                printf("  %s", p.pci_bus_id);
            printf("\n");
        }
    } else {
        printf("Accelerator: none -- pinned memory falls back to ordinary memory\n");
        printf("  because: %s\n", acc->reason);
    }
    printf("\nBackends considered:\n");
    int n = stoke_backend_count(), width = 8;
    for (int i = 0; i < n; i++) {
        stoke_backend_info b;
        if (stoke_backend_get_info(i, &b) == STOKE_OK && (int)strlen(b.name) > width)
            width = (int)strlen(b.name);
    }
    for (int i = 0; i < n; i++) {
        stoke_backend_info b;
        if (stoke_backend_get_info(i, &b) != STOKE_OK)
            continue;
        char caps[128];
        caps_text(b.caps, caps, sizeof(caps));
        printf("  %-*s %-7s %-11s", width, b.name,
               b.origin == STOKE_ORIGIN_PLUGIN ? "plugin" : "builtin",
               b.available ? "available" : "unavailable");
        if (b.available)
            printf(" %d device(s)  ipc: %-3s%s%s", b.device_count,
                   b.caps & STOKE_CAP_IPC ? "yes" : "no", caps[0] ? "  " : "", caps);
        printf("  -- %s\n", b.reason);
        if (b.path[0])
            printf("  %*s %s\n", width, "", b.path);
    }
}

/* A refused --accelerator.  The library's message names its API ("stoke_accelerator_select=
 * simdev:5: simdev has 2 device(s), no device 5"); the user wrote an option, so the message
 * names the option instead. */
static int fail_accelerator(const cli_cmd *c, const char *accel, int rc)
{
    static const char api[] = "stoke_accelerator_select=";
    const char *msg = stoke_last_error();
    if (!msg || !*msg)
        return cli_fail_code(c, 1, rc, "--accelerator %s: %s", accel, stoke_strerror(rc));
    size_t n = strlen(accel);
    if (strncmp(msg, api, sizeof(api) - 1) != 0 || strncmp(msg + sizeof(api) - 1, accel, n) != 0)
        return cli_fail_code(c, 1, rc, "--accelerator: %s", msg);
    /* what follows the spec: ": simdev has ...", " is not of the form ...", " requested, ..." */
    msg += sizeof(api) - 1 + n;
    return cli_fail_code(c, 1, rc, "--accelerator %s%s", accel, msg);
}

int cmd_devices(int argc, char **argv)
{
    cli_cmd c = {"devices", cli_has_json(argc, argv)};
    const char *accel = NULL;
    for (int i = 1; i < argc; i++) {
        int got = cli_opt(&c, argc, argv, &i, "--accelerator", &accel);
        if (got < 0)
            return 2;
        if (got || cli_is(argv[i], "--json"))
            continue;
        if (cli_is(argv[i], "--help") || cli_is(argv[i], "-h")) {
            printf("usage: stoke devices [--json] [--accelerator NAME[:INDEX]]\n");
            return 0;
        }
        return cli_fail(&c, 2, "unknown option '%s'", argv[i]);
    }
    if (accel) {
        int rc = stoke_accelerator_select(accel);
        if (rc != STOKE_OK)
            return fail_accelerator(&c, accel, rc);
    }
    stoke_accelerator_info acc;
    int rc = stoke_accelerator_get(&acc);
    if (rc != STOKE_OK && rc != STOKE_ENODEV)
        return cli_fail_rc(&c, 1, "choosing the accelerator", rc);
    if (c.json)
        print_json(rc == STOKE_OK, &acc);
    else
        print_text(rc == STOKE_OK, &acc);
    return 0;
}
