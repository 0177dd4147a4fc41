/* stoke bench copy — placeholder until its issue lands. */
#include <stdio.h>

#include "cli.h"

int bench_copy(int argc, char **argv)
{
    fprintf(stderr, "stoke: bench copy is not implemented yet\n");
    return 2;
}
