/* stoke bench — placeholder until the pinned-memory and accelerator issues land. */
#include <stdio.h>

#include "cli.h"

int cmd_bench(int argc, char **argv)
{
    fprintf(stderr, "stoke: bench is not implemented yet\n");
    return 2;
}
