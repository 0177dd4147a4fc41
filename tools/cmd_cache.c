/* stoke cache ls|clear [DIR] [--json]: the local cache of remote shards (STOKE_CACHE_DIR, or
 * DIR): its copies, their sizes and the total against the cap; or empties it of every copy no
 * process has open.  docs/cli.md, "stoke cache". */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cli.h"
#include "stoke/stoke.h"

static const char use[] = "usage: stoke cache ls|clear [DIR] [--json]\n"
                          "  ls     the shards in the cache, least recently read first, and the\n"
                          "         total against STOKE_CACHE_LIMIT\n"
                          "  clear  remove every shard no process has open\n"
                          "  DIR    the cache directory (default: STOKE_CACHE_DIR)\n";

typedef struct ls_ctx {
    int json;
    uint64_t n;
} ls_ctx;

/* n bytes for people: "700 bytes", "8.0 kB", "5.2 MB", "1.3 GB" (a small cap read "0.0 MB"). */
static const char *size_text(char *buf, size_t len, uint64_t n)
{
    if (n < 1000)
        snprintf(buf, len, "%" PRIu64 " bytes", n);
    else if (n < 999950) /* (one that rounds to 1000.0 kB is 1.0 MB) */
        snprintf(buf, len, "%.1f kB", (double)n / 1e3);
    else if (n < 999950000)
        snprintf(buf, len, "%.1f MB", (double)n / 1e6);
    else
        snprintf(buf, len, "%.1f GB", (double)n / 1e9);
    return buf;
}

static int print_entry(void *ctx, const stoke_cache_entry *e)
{
    ls_ctx *c = ctx;
    if (c->json) {
        printf("%s{\"name\": ", c->n ? ", " : "");
        cli_json_str(stdout, e->name);
        printf(", \"bytes\": %" PRIu64 ", \"atime\": %" PRId64 ", \"in_use\": %s}", e->bytes,
               e->atime, e->in_use ? "true" : "false");
    } else {
        char when[32] = "?";
        time_t t = (time_t)e->atime;
        struct tm tm;
        if (gmtime_r(&t, &tm))
            strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", &tm);
        printf("  %14" PRIu64 "  %s UTC  %-6s  %s\n", e->bytes, when, e->in_use ? "in use" : "",
               e->name);
    }
    c->n++;
    return 0;
}

/* No DIR and no STOKE_CACHE_DIR: said in the command's words (the library's names its API). */
static int no_dir(const cli_cmd *c, const char *sub, const char *dir)
{
    const char *env = getenv("STOKE_CACHE_DIR");
    if (dir || (env && *env))
        return 0;
    cli_fail_code(c, 1, STOKE_EINVAL,
                  "no cache directory: give one (stoke cache %s DIR) or set "
                  "STOKE_CACHE_DIR",
                  sub);
    return 1;
}

static int cache_ls(const cli_cmd *c, const char *dir)
{
    if (no_dir(c, "ls", dir))
        return 1;
    stoke_cache_info info = {.size = sizeof(info)};
    ls_ctx ctx = {c->json, 0};
    /* the totals first (the text header), then the entries */
    int rc = stoke_cache_list(dir, NULL, NULL, &info);
    if (rc != STOKE_OK)
        return cli_fail_rc(c, 1, "ls", rc);
    if (c->json) {
        printf("{\"ok\": true, \"dir\": ");
        cli_json_str(stdout, info.dir);
        printf(", \"entries\": [");
    } else {
        char used[32], cap[32], part[32], stale[32];
        printf("cache %s: %" PRIu64 " shard%s, %s of a %s cap (%s)", info.dir, info.entries,
               info.entries == 1 ? "" : "s", size_text(used, sizeof(used), info.bytes),
               size_text(cap, sizeof(cap), info.limit),
               info.limit_default ? "default: a tenth of the file system kept free"
                                  : "STOKE_CACHE_LIMIT");
        if (info.partial_bytes)
            printf("; %s being downloaded", size_text(part, sizeof(part), info.partial_bytes));
        if (info.stale_bytes) /* (they read as "being downloaded" after a kill) */
            printf("; %s left by downloads that died (the next run or stoke cache clear "
                   "removes them)",
                   size_text(stale, sizeof(stale), info.stale_bytes));
        printf("\n");
    }
    rc = stoke_cache_list(info.dir, print_entry, &ctx, NULL);
    if (c->json && rc == STOKE_OK)
        printf("], \"count\": %" PRIu64 ", \"bytes\": %" PRIu64 ", \"partial_bytes\": %" PRIu64
               ", \"stale_bytes\": %" PRIu64 ", \"limit\": %" PRIu64 ", \"limit_default\": %s}\n",
               ctx.n, info.bytes, info.partial_bytes, info.stale_bytes, info.limit,
               info.limit_default ? "true" : "false");
    if (rc != STOKE_OK) /* the directory went away between the two calls */
        return cli_fail_rc(c, 1, "ls", rc);
    return 0;
}

static int cache_clear(const cli_cmd *c, const char *dir)
{
    if (no_dir(c, "clear", dir))
        return 1;
    stoke_cache_info info = {.size = sizeof(info)};
    uint64_t removed = 0, kept = 0;
    int rc = stoke_cache_list(dir, NULL, NULL, &info); /* the directory's name, for the output */
    if (rc == STOKE_OK)
        rc = stoke_cache_clear(info.dir, &removed, &kept);
    if (rc != STOKE_OK)
        return cli_fail_rc(c, 1, "clear", rc);
    if (c->json) {
        printf("{\"ok\": true, \"dir\": ");
        cli_json_str(stdout, info.dir);
        printf(", \"removed\": %" PRIu64 ", \"kept\": %" PRIu64 "}\n", removed, kept);
    } else {
        printf("cache %s: %" PRIu64 " shard%s removed, %" PRIu64 " in use kept\n", info.dir,
               removed, removed == 1 ? "" : "s", kept);
    }
    return 0;
}

int cmd_cache(int argc, char **argv)
{
    cli_cmd c = {"cache", cli_has_json(argc, argv)};
    const char *w[2];
    int st = cli_words(&c, argc, argv, use, w, 2);
    if (st >= 0)
        return st;
    const char *sub = w[0], *dir = w[1];
    if (sub && cli_is(sub, "ls"))
        return cache_ls(&c, dir);
    if (sub && cli_is(sub, "clear"))
        return cache_clear(&c, dir);
    if (!c.json)
        fputs(use, stderr);
    if (!sub)
        return cli_fail(&c, 2, "no subcommand (ls or clear)");
    return cli_fail(&c, 2, "unknown subcommand '%s' (ls or clear)", sub);
}
