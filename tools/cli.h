/* The stoke CLI: one file per command; public API only. */
#ifndef STOKE_CLI_H
#define STOKE_CLI_H

#include <stdio.h>

/* Commands: argv[0] is the command name.  Return the process exit status. */
int cmd_devices(int argc, char **argv);
int cmd_load(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int bench_pinned(int argc, char **argv); /* bench_pinned.c */
int bench_copy(int argc, char **argv);   /* bench_copy.c */

/* Writes `s` as a JSON string literal (quotes included). */
void cli_json_str(FILE *f, const char *s);
/* Prints "stoke: <msg>: <stoke_last_error() or strerror>" to stderr for status `rc`. */
void cli_error(const char *what, int rc);
/* 1 if `arg` is `name` (e.g. "--json"). */
int cli_is(const char *arg, const char *name);

#endif
