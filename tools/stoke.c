/* stoke — command-line entry point. */
#include <stdio.h>
#include <unistd.h>

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

static int run(int argc, char **argv)
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

/* Every command's output is checked here, once: a lost write (a full disk, a closed stdout) is a
 * failure, never exit status 0. */
int main(int argc, char **argv)
{
    /* Not a terminal: stdout keeps up to 64 KiB (help, JSON) until the final flush, so a failing
     * write (a full disk) is met there, where its reason is still in errno. */
    static char outbuf[1 << 16];
    if (!isatty(STDOUT_FILENO))
        setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    return cli_check_output(run(argc, argv));
}
