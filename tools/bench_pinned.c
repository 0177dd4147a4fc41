/* stoke bench pinned — placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int bench_pinned(int argc, char **argv)
{
    fprintf(stderr, "stoke: bench pinned is not implemented yet\n");
    return 2;
}
