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
     * benchmark is a usage error. */
    int help = argc >= 2 && (cli_is(argv[1], "--help") || cli_is(argv[1], "-h"));
    fprintf(help ? stdout : stderr, "usage: stoke bench pinned|copy [--json]\n"
                                    "  (stoke bench pinned --help, stoke bench copy --help: "
                                    "their options)\n");
    return help ? 0 : 2;
}
