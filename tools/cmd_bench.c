/* stoke bench — dispatches to one micro-benchmark per file. */
#include <stdio.h>

#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    if (argc >= 2 && cli_is(argv[1], "pinned"))
        return bench_pinned(argc - 1, argv + 1);
    if (argc >= 2 && cli_is(argv[1], "copy"))
        return bench_copy(argc - 1, argv + 1);
    fprintf(stderr, "usage: stoke bench pinned|copy [--json]\n");
    return 2;
}
