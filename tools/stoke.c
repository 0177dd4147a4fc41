/* stoke — the command dispatcher: cli_run() runs one command line (main.c for the executable,
 * python/cli.c for `python -m stoke`). */
#include <stdio.h>

#include "cli.h"
#include "stoke/stoke.h"

static void usage(FILE *f)
{
    fprintf(
        f, "usage: stoke COMMAND [options]\n"
           "\n"
           "commands:\n"
           "  devices [--json] [--accelerator NAME[:INDEX]]\n"
           "          the chosen accelerator and every backend considered\n"
           "  load [SOURCE] [options] [--json]\n"
           "          run the data loader (SOURCE: synthetic:N, npy:PATH, tar:PATTERN,\n"
           "          images:DIR; --help for their options and the loader's)\n"
           "  cache ls|clear [DIR] [--json]\n"
           "          the local cache of remote shards (STOKE_CACHE_DIR): list, or empty\n"
           "  index tar:PATTERN [--out DIR] [--json]\n"
           "          write a sidecar index SHARD.idx next to every local tar shard\n"
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

/* Runs one command line (cli.h).  A --json before the command ("stoke --json devices") is moved
 * after it, where the command looks for it; with --json and no command, or an unknown one, the
 * error is one JSON object too. */
int cli_run(int argc, char **argv)
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
    if (cli_is(cmd, "cache"))
        return cmd_cache(argc - 1, argv + 1);
    if (cli_is(cmd, "index"))
        return cmd_index(argc - 1, argv + 1);
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
