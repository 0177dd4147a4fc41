/* Helpers shared by the stoke commands (see cli.h). */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "stoke/stoke.h"

int cli_is(const char *arg, const char *name)
{
    return strcmp(arg, name) == 0;
}

int cli_has_json(int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
        if (cli_is(argv[i], "--json"))
            return 1;
    return 0;
}

/* The length of the well-formed UTF-8 sequence at p (1..4), or 0 when p starts none (a stray
 * continuation byte, a sequence cut short, an overlong form, a surrogate, beyond U+10FFFF). */
static int utf8_len(const unsigned char *p)
{
    if (p[0] < 0x80)
        return 1;
    int n = p[0] >= 0xc2 && p[0] <= 0xdf   ? 2
            : p[0] >= 0xe0 && p[0] <= 0xef ? 3
            : p[0] >= 0xf0 && p[0] <= 0xf4 ? 4
                                           : 0;
    /* the second byte's range is narrower after E0 (overlong), ED (surrogates), F0, F4 */
    unsigned lo = p[0] == 0xe0 ? 0xa0 : p[0] == 0xf0 ? 0x90 : 0x80;
    unsigned hi = p[0] == 0xed ? 0x9f : p[0] == 0xf4 ? 0x8f : 0xbf;
    for (int k = 1; k < n; k++)
        if (p[k] < (k == 1 ? lo : 0x80) || p[k] > (k == 1 ? hi : 0xbf))
            return 0; /* also stops at the terminating NUL */
    return n;
}

void cli_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        if (*p >= 0x80) {
            int n = utf8_len(p);
            if (n) {
                fwrite(p, 1, (size_t)n, f);
                p += n - 1;
            } else { /* not UTF-8 (a file name's raw byte): Python's surrogateescape */
                fprintf(f, "\\udc%02x", *p);
            }
            continue;
        }
        switch (*p) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20)
                fprintf(f, "\\u%04x", *p);
            else
                fputc(*p, f);
        }
    }
    fputc('"', f);
}

/* Writes s to f with control characters escaped ("\n", "\x1b"): a message may quote a file
 * name or an argument, and its raw bytes must not break the line or drive the terminal. */
static void put_escaped(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        switch (*p) {
        case '\n': fputs("\\n", f); break;
        case '\t': fputs("\\t", f); break;
        case '\r': fputs("\\r", f); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(f, "\\x%02x", *p);
            else
                fputc(*p, f);
        }
    }
}

/* code: the library's status code of the failure (< 0), or 0 for none (a usage error). */
static int report(const cli_cmd *c, int status, int code, const char *msg)
{
    fprintf(stderr, "stoke%s%s: ", *c->name ? " " : "", c->name); /* "" : no command */
    put_escaped(stderr, msg);
    fputc('\n', stderr);
    if (c->json) {
        printf("{\"ok\": false, \"error\": ");
        cli_json_str(stdout, msg);
        if (code < 0)
            printf(", \"error_code\": %d, \"error_name\": \"%s\"", code, stoke_err_name(code));
        printf("}\n");
    }
    return status;
}

int cli_fail(const cli_cmd *c, int status, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return report(c, status, 0, msg);
}

int cli_fail_code(const cli_cmd *c, int status, int code, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    return report(c, status, code, msg);
}

int cli_words(const cli_cmd *c, int argc, char **argv, const char *use, const char **words, int max)
{
    int n = 0;
    for (int k = 0; k < max; k++)
        words[k] = NULL;
    for (int i = 1; i < argc; i++) {
        if (cli_is(argv[i], "--json"))
            continue;
        if (cli_is(argv[i], "--help") || cli_is(argv[i], "-h")) {
            fputs(use, stdout);
            return 0;
        }
        if (argv[i][0] == '-')
            return cli_fail(c, 2, "unknown option '%s' (only --json)", argv[i]);
        if (n == max)
            return cli_fail(c, 2, "unexpected argument '%s'", argv[i]);
        words[n++] = argv[i];
    }
    return -1;
}

int cli_fail_rc(const cli_cmd *c, int status, const char *what, int rc)
{
    const char *detail = stoke_last_error();
    return cli_fail_code(c, status, rc, "%s: %s", what,
                         detail && *detail ? detail : stoke_strerror(rc));
}

int cli_opt(const cli_cmd *c, int argc, char **argv, int *i, const char *name,
            const char **value)
{
    const char *a = argv[*i];
    size_t n = strlen(name);
    if (strncmp(a, name, n) != 0 || (a[n] != '\0' && a[n] != '='))
        return 0;
    const char *v = a[n] == '=' ? a + n + 1 : *i + 1 < argc ? argv[*i + 1] : NULL;
    if (!v || !*v || (a[n] == '\0' && strncmp(v, "--", 2) == 0)) {
        cli_fail(c, 2, "%s needs a value", name);
        return -1;
    }
    if (a[n] == '\0')
        ++*i;
    *value = v;
    return 1;
}

int cli_u64(const cli_cmd *c, const char *name, const char *v, uint64_t min, uint64_t max,
            uint64_t *out)
{
    if (*v < '0' || *v > '9')
        return cli_fail(c, -1, "%s: '%s' is not a non-negative integer", name, v);
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (*end)
        return cli_fail(c, -1, "%s: '%s' is not a non-negative integer", name, v);
    if (errno == ERANGE || x > max)
        return cli_fail(c, -1, "%s: %s is too large (at most %" PRIu64 ")", name, v, max);
    if (x < min)
        return cli_fail(c, -1, "%s must be at least %" PRIu64 " (got %s)", name, min, v);
    *out = x;
    return 0;
}

int cli_check_output(int status)
{
    errno = 0;
    int flushed = fflush(stdout) == 0;
    int err = errno;
    if (flushed && !ferror(stdout))
        return status;
    /* a write that failed before this flush left the error flag but maybe not errno */
    fprintf(stderr, "stoke: error writing output: %s\n",
            !flushed && err ? strerror(err) : "a write to stdout failed");
    return status ? status : 1;
}
