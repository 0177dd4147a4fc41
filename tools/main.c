/* stoke — the executable: one command line, its output checked once. */
#include <stdio.h>
#include <unistd.h>

#include "cli.h"

/* Every command's output is checked here, once: a lost write (a full disk, a closed stdout) is a
 * failure, never exit status 0. */
int main(int argc, char **argv)
{
    /* Not a terminal: stdout keeps up to 64 KiB (help, JSON) until the final flush, so a failing
     * write (a full disk) is met there, where its reason is still in errno. */
    static char outbuf[1 << 16];
    if (!isatty(STDOUT_FILENO))
        setvbuf(stdout, outbuf, _IOFBF, sizeof(outbuf));
    return cli_check_output(cli_run(argc, argv));
}
