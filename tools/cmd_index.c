/* stoke index tar:PATTERN [--out DIR] [--json]: writes a sidecar index SHARD.idx next to every
 * local shard (stoke_tar_write_index), or NAME.idx into DIR for every shard, remote ones
 * included (stoke_tar_write_index_to), which a remote tar source fetches in one request
 * instead of walking the shard.  docs/cli.md, "stoke index". */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "stoke/stoke.h"

static const char use[] = "usage: stoke index tar:PATTERN [--out DIR] [--json]\n"
                          "  writes SHARD.idx next to every shard of PATTERN (local files):\n"
                          "  its size and its members' names, offsets and sizes, read by a\n"
                          "  remote tar: source in one request instead of walking the shard\n"
                          "  --out DIR  writes NAME.idx into DIR instead (NAME: the shard's file\n"
                          "             name); needed for http(s):// and s3:// shards, each then\n"
                          "             downloaded once to index it: upload DIR's .idx files next\n"
                          "             to the shards\n";

typedef struct idx_ctx {
    FILE *json;      /* --json: the shards' entries, printed once all went well */
    const char *dir; /* --out */
    uint64_t n, members, bytes;
} idx_ctx;

static int on_shard(void *ctx, const char *shard, uint64_t bytes, uint64_t members)
{
    idx_ctx *c = ctx;
    if (c->json) {
        fprintf(c->json, "%s{\"shard\": ", c->n ? ", " : "");
        cli_json_str(c->json, shard);
        fprintf(c->json, ", \"bytes\": %" PRIu64 ", \"members\": %" PRIu64 "}", bytes, members);
    } else {
        printf("%s%s: %" PRIu64 " members, shard %" PRIu64 " bytes%s%s%s\n", shard,
               c->dir ? "" : ".idx", members, bytes, c->dir ? " (its index in " : "",
               c->dir ? c->dir : "", c->dir ? ")" : "");
    }
    c->n++;
    c->members += members;
    c->bytes += bytes;
    return 0;
}

int cmd_index(int argc, char **argv)
{
    cli_cmd c = {"index", cli_has_json(argc, argv)};
    const char *src = NULL, *dir = NULL;
    for (int i = 1; i < argc; i++) {
        int o = cli_opt(&c, argc, argv, &i, "--out", &dir);
        if (o < 0)
            return 2;
        if (o > 0 || cli_is(argv[i], "--json"))
            continue;
        if (cli_is(argv[i], "--help") || cli_is(argv[i], "-h")) {
            fputs(use, stdout);
            return 0;
        }
        if (argv[i][0] == '-')
            return cli_fail(&c, 2, "unknown option '%s' (--out DIR, --json)", argv[i]);
        if (src) {
            char shown[512]; /* a URL's credentials are not printed */
            return cli_fail(&c, 2, "unexpected argument '%s'",
                            stoke_source_redact(shown, sizeof(shown), argv[i]));
        }
        src = argv[i];
    }
    if (!src) {
        if (!c.json)
            fputs(use, stderr);
        return cli_fail(&c, 2, "no source (tar:PATTERN)");
    }
    int depth = 0; /* an option: a ',' outside the pattern's braces ({0,1} is a list) */
    const char *p = strncmp(src, "tar:", 4) == 0 ? src + 4 : "";
    for (; *p && (*p != ',' || depth > 0); p++)
        depth += *p == '{' ? 1 : *p == '}' ? -1 : 0;
    if (strncmp(src, "tar:", 4) != 0 || !src[4] || *p) {
        char shown[512];
        return cli_fail(&c, 2, "'%s': expected tar:PATTERN (shards only, no options)",
                        stoke_source_redact(shown, sizeof(shown), src));
    }
    char *entries = NULL;
    size_t entries_len = 0;
    idx_ctx ctx = {c.json ? open_memstream(&entries, &entries_len) : NULL, dir, 0, 0, 0};
    if (c.json && !ctx.json)
        return cli_fail(&c, 1, "out of memory");
    int rc = stoke_tar_write_index_to(src + 4, dir, on_shard, &ctx);
    if (ctx.json)
        fclose(ctx.json);
    if (rc != STOKE_OK) {
        /* (the library's message names the source) */
        char msg[1024];
        snprintf(msg, sizeof(msg), "%s",
                 *stoke_last_error() ? stoke_last_error() : stoke_strerror(rc));
        cli_cmd text = {c.name, 0}; /* the message on stderr; the object here: */
        cli_fail_code(&text, 1, rc, "%s", msg);
        if (c.json) { /* with the shards indexed before the failure (they keep their index) */
            printf("{\"ok\": false, \"error\": ");
            cli_json_str(stdout, msg);
            printf(", \"error_code\": %d, \"error_name\": \"%s\", \"shards\": [%s], "
                   "\"count\": %" PRIu64 ", \"members\": %" PRIu64 ", \"bytes\": %" PRIu64 "}\n",
                   rc, stoke_err_name(rc), entries ? entries : "", ctx.n, ctx.members, ctx.bytes);
        }
        free(entries);
        return 1;
    }
    if (c.json)
        printf("{\"ok\": true, \"shards\": [%s], \"count\": %" PRIu64 ", \"members\": %" PRIu64
               ", \"bytes\": %" PRIu64 "}\n",
               entries ? entries : "", ctx.n, ctx.members, ctx.bytes);
    else
        printf("%" PRIu64 " shard%s indexed, %" PRIu64 " members\n", ctx.n, ctx.n == 1 ? "" : "s",
               ctx.members);
    free(entries);
    return 0;
}
