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
            "  version [--json]\n"
            "\n"
            "environment: STOKE_ACCELERATOR, STOKE_PLUGIN_PATH, STOKE_LOG, ... (see README)\n");
}

/* stoke version [--json]: "stoke X.Y.Z", or {"version": "X.Y.Z"}. */
static int cmd_version(int argc, char **argv)
{
    cli_cmd c = {"version", cli_has_json(argc, argv)};
    for (int i = 1; i < argc; i++)
        if (!cli_is(argv[i], "--json"))
            return cli_fail(&c, 2, "unknown option '%s' (only --json)", argv[i]);
    if (c.json) {
        printf("{\"version\": ");
        cli_json_str(stdout, stoke_version_string());
        printf("}\n");
    } else {
        printf("stoke %s\n", stoke_version_string());
    }
    return 0;
}

/* Runs the command argv[1].  A --json before the command ("stoke --json devices") is moved
 * after it, where the command looks for it; with --json and no command, or an unknown one, the
 * error is one JSON object too. */
static int run(int argc, char **argv)
{
    int k = 1;
    while (k < argc && cli_is(argv[k], "--json"))
        k++;
    if (k > 1 && k < argc) { /* argv[1 .. k] = the command, then the k - 1 "--json" */
        char *cmd = argv[k];
        for (int i = k; i > 1; i--)
            argv[i] = argv[i - 1];
        argv[1] = cmd;
    }
    cli_cmd c = {"", cli_has_json(argc, argv)};
    if (argc < 2 || k == argc) {
        if (!c.json) {
            usage(stderr);
            return 2;
        }
        return cli_fail(&c, 2, "no command given (stoke --help lists them)");
    }
    const char *cmd = argv[1];
    if (cli_is(cmd, "devices"))
        return cmd_devices(argc - 1, argv + 1);
    if (cli_is(cmd, "load"))
        return cmd_load(argc - 1, argv + 1);
    if (cli_is(cmd, "bench"))
        return cmd_bench(argc - 1, argv + 1);
    if (cli_is(cmd, "version") || cli_is(cmd, "--version"))
        return cmd_version(argc - 1, argv + 1);
    if (cli_is(cmd, "help") || cli_is(cmd, "--help") || cli_is(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    if (!c.json)
        usage(stderr);
    return cli_fail(&c, 2, "unknown command '%s' (stoke --help lists them)", cmd);
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
