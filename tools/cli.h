/* The stoke CLI: one file per command; public API only.  Helpers shared by the commands are in
 * cli.c: error reporting (one message on stderr and, with --json, one {"ok": false, "error": ...}
 * object on stdout), option values and number parsing. */
#ifndef STOKE_CLI_H
#define STOKE_CLI_H

#include <stdint.h>
#include <stdio.h>

/* Runs one command line: argv[0] is the program ("stoke"), argv[1] the command (a --json before
 * it is moved after it; argv is reordered in place).  Returns the exit status (0, 1, 2); the
 * caller then checks the output (cli_check_output).  stoke.c. */
int cli_run(int argc, char **argv);

/* Commands: argv[0] is the command name.  Return the process exit status: 0, 1 for a failure,
 * 2 for a usage error.  main() checks that stdout was written (cli_check_output). */
int cmd_devices(int argc, char **argv);
int cmd_load(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_cache(int argc, char **argv);
int cmd_index(int argc, char **argv);
int bench_pinned(int argc, char **argv); /* bench_pinned.c */
int bench_copy(int argc, char **argv);   /* bench_copy.c */

/* The command being run, for messages ("load", "bench copy"; "" before a command is known) and
 * its --json flag. */
typedef struct cli_cmd {
    const char *name;
    int json;
} cli_cmd;

/* 1 if "--json" is among argv[1 .. argc-1] (so that it is known before any error is
 * reported). */
int cli_has_json(int argc, char **argv);
/* Reports a failure: "stoke NAME: MESSAGE" on stderr and, with c->json, the one object
 * {"ok": false, "error": "MESSAGE"} on stdout.  Returns `status`. */
int cli_fail(const cli_cmd *c, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* cli_fail of a failure the library reported with status `code` (< 0): the object has
 * "error_code": CODE, "error_name": "STOKE_E..." after "error" as well.  Returns `status`. */
int cli_fail_code(const cli_cmd *c, int status, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* The arguments of a command taking only --json and at most `max` words: the words into
 * words[0 .. max) (NULL where absent); --help / -h print `use` on stdout.  Returns -1 to go on,
 * or the exit status to return now: 0 after --help, 2 (reported) for an unknown option or a
 * word too many. */
int cli_words(const cli_cmd *c, int argc, char **argv, const char *use, const char **words,
              int max);
/* cli_fail_code(rc) with "WHAT: DETAIL", DETAIL being stoke_last_error() or, when that is
 * empty, stoke_strerror(rc).  Returns `status`. */
int cli_fail_rc(const cli_cmd *c, int status, const char *what, int rc);
/* Matches option `name` ("--size"), which takes a value, at argv[*i]: given as "NAME VALUE" or
 * "NAME=VALUE".  Returns 1 with *value set (and *i moved onto a separate value); 0 when argv[*i]
 * is not that option; -1 after reporting "NAME needs a value" (cli_fail, the caller exits with
 * status 2) when the value is missing, empty or looks like another option ("--json"). */
int cli_opt(const cli_cmd *c, int argc, char **argv, int *i, const char *name, const char **value);
/* Parses the value `v` of option `name` as a decimal integer in [min, max] into *out.  Returns
 * 0; -1 after reporting (cli_fail) why it is not one. */
int cli_u64(const cli_cmd *c, const char *name, const char *v, uint64_t min, uint64_t max,
            uint64_t *out);
/* Writes `s` as a JSON string literal (quotes included), always valid UTF-8: a byte that is not
 * part of a UTF-8 sequence (a file name's) becomes \udcXX, as Python's surrogateescape
 * (json.loads, then os.fsencode, gives the bytes back). */
void cli_json_str(FILE *f, const char *s);
/* 1 if `arg` is `name` (e.g. "--json"). */
int cli_is(const char *arg, const char *name);
/* Flushes stdout and checks that every write to it succeeded.  Returns `status`, or, when a
 * write failed, 1 (or `status` if that is already non-zero) after printing "stoke: error
 * writing output: REASON" on stderr.  Called once, by main, after every command. */
int cli_check_output(int status);

#endif
