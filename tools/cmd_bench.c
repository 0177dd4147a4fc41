/* stoke bench — dispatches to one micro-benchmark per file. */
#include <stdio.h>

#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && cli_is(argv[1], "pinned"))
        return bench_pinned(argc - 1, argv + 1);
    if (argc >= 2 && cli_is(argv[1], "copy"))
        return bench_copy(argc - 1, argv + 1);
    /* Like the other commands: asked-for help goes to stdout and succeeds; a missing or unknown
     * benchmark is a usage error (with --json, one {"ok": false, "error": ...} object). */
    static const char use[] = "usage: stoke bench pinned|copy [--json]\n"
                              "  (stoke bench pinned --help, stoke bench copy --help: "
                              "their options)\n";
    int help = argc >= 2 && (cli_is(argv[1], "--help") || cli_is(argv[1], "-h"));
    if (help) {
        fputs(use, stdout);
        return 0;
    }
    cli_cmd c = {"bench", cli_has_json(argc, argv)};
    if (!c.json)
        fputs(use, stderr);
    if (argc < 2 || cli_is(argv[1], "--json"))
        return cli_fail(&c, 2, "no benchmark named (pinned or copy)");
    return cli_fail(&c, 2, "unknown benchmark '%s' (pinned or copy)", argv[1]);
}
