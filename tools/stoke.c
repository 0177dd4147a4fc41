/* stoke — command-line entry point. */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "stoke/stoke.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stoke COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  devices [--json] [--accelerator NAME[:INDEX]]\n"
            "          the chosen accelerator and every backend considered\n"
            "  load [SOURCE] [options] [--json]\n"
            "          run the data loader (SOURCE: synthetic[:N] or npy:PATH); --help for options\n"
            "  bench pinned|copy [--json]\n"
            "          micro-benchmarks of the pinned allocator and of host-to-device copies\n"
            "  version\n"
            "\n"
            "environment: STOKE_ACCELERATOR, STOKE_PLUGIN_PATH, STOKE_LOG, ... (see README)\n");
}

void cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

void cli_error(const char *what, int rc)
{
    const char *detail = stoke_last_error();
    fprintf(stderr, "stoke: %s: %s\n", what, detail && *detail ? detail : stoke_strerror(rc));
}

int cli_is(const char *arg, const char *name)
{
    return strcmp(arg, name) == 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (cli_is(cmd, "devices"))
        return cmd_devices(argc - 1, argv + 1);
    if (cli_is(cmd, "load"))
        return cmd_load(argc - 1, argv + 1);
    if (cli_is(cmd, "bench"))
        return cmd_bench(argc - 1, argv + 1);
    if (cli_is(cmd, "version") || cli_is(cmd, "--version")) {
        printf("stoke %s\n", stoke_version_string());
        return 0;
    }
    if (cli_is(cmd, "help") || cli_is(cmd, "--help") || cli_is(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "stoke: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
