/* stoke load — placeholder until the loader issue lands. */
#include <stdio.h>

#include "cli.h"

int cmd_load(int argc, char **argv)
{
    fprintf(stderr, "stoke: load is not implemented yet\n");
    return 2;
}
