/* Eight processes with and without the node-wide pinned arena: locked (pinned) memory in all.
 *
 *   build/bench/bench_arena [PROCS] [MIB] [BUF_MIB]       (defaults 8, 64, 4)
 *
 * Runs the accelerator stoke chooses (STOKE_ACCELERATOR / STOKE_PLUGIN_PATH; simdev in the
 * examples of docs/ipc.md).  PROCS processes are forked (before any thread) and each holds MIB
 * MiB of staging buffers of BUF_MIB MiB, in two scenarios:
 *   together  - all processes hold their buffers at the same time (the arena is sized to the
 *               sum: the saving is only the size-class rounding of private pinned blocks);
 *   staggered - the processes take turns (allocate, touch, free), as processes whose loaders
 *               peak at different times do; private pinned caches keep every block pinned after
 *               it is freed, the arena (sized to two processes' need) is reused.
 * For each mode it prints, summed over the processes at the end of the scenario (all still
 * alive): stoke's pinned bytes (pinned.bytes_reserved + registered_bytes: what each process
 * had locked, as a driver would count it), the distinct locked bytes (private: the same sum;
 * arena: the one shared mapping, registered by every process but the same physical pages),
 * the processes' total Pss (proportional resident memory: shared pages split between sharers)
 * and the change of /proc/meminfo's Mlocked (non-zero only with a backend that really locks
 * pages: cuda's cuMemHostAlloc / cuMemHostRegister; simdev does not).  Then the ratio. */
#define _GNU_SOURCE
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "stoke/stoke.h"

typedef struct result {
    int ok;
    uint64_t pinned;   /* bytes_reserved + registered_bytes */
    uint64_t distinct; /* private: = pinned; arena: 0 (counted once by the parent) */
    uint64_t pss;      /* bytes */
    char err[200];
} result;

static uint64_t meminfo_kib(const char *key)
{
    FILE *f = fopen("/proc/meminfo", "r");
    char line[256];
    uint64_t v = 0;
    size_t n = strlen(key);
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, key, n) == 0 && line[n] == ':')
            v = strtoull(line + n + 1, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

static uint64_t pss_bytes(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    uint64_t v = 0;
    while (f && fgets(line, sizeof(line), f))
        if (strncmp(line, "Pss:", 4) == 0)
            v = strtoull(line + 4, NULL, 10) * 1024;
    if (f)
        fclose(f);
    return v;
}

typedef struct plan {
    int procs, staggered, use_arena;
    size_t mib, buf_mib;
    uint64_t arena_bytes;
    char name[64];
} plan;

/* One process: it starts when its turn comes on `turn` (a byte), says it is done allocating on
 * `next`; it reports on `out` once every process is done (a byte on `done`). */
static void child(const plan *pl, int turn, int next, int done, int out, int leave)
{
    result r;
    memset(&r, 0, sizeof(r));
    stoke_arena *a = NULL;
    size_t nbuf = pl->mib / pl->buf_mib, bsz = pl->buf_mib << 20;
    void **bufs = calloc(nbuf, sizeof(*bufs));
    char c;
    int rc = STOKE_OK;
    if (pl->use_arena)
        rc = stoke_arena_open(pl->name, (size_t)pl->arena_bytes, &a);
    if (read(turn, &c, 1) != 1)
        rc = STOKE_EIO;
    for (size_t i = 0; rc == STOKE_OK && i < nbuf; i++) {
        rc = a ? stoke_arena_alloc(a, bsz, &bufs[i]) : stoke_pinned_alloc(bsz, &bufs[i]);
        if (rc == STOKE_OK)
            memset(bufs[i], (int)i, bsz); /* a batch written into it */
    }
    if (pl->staggered) /* done with this peak: give the buffers back, pass the turn */
        for (size_t i = 0; i < nbuf; i++)
            a ? stoke_arena_free(a, bufs[i]) : stoke_pinned_free(bufs[i]);
    if (write(next, "t", 1) != 1)
        rc = STOKE_EIO;
    if (read(done, &c, 1) != 1)
        rc = rc ? rc : STOKE_EIO;
    stoke_pinned_stats st = {.size = sizeof(st)};
    stoke_pinned_stats_get(&st);
    r.ok = rc == STOKE_OK;
    if (!r.ok)
        snprintf(r.err, sizeof(r.err), "%s", stoke_last_error());
    r.pinned = st.bytes_reserved + st.registered_bytes;
    r.distinct = a ? 0 : r.pinned;
    r.pss = pss_bytes();
    if (write(out, &r, sizeof(r)) != (ssize_t)sizeof(r))
        _exit(3);
    if (read(leave, &c, 1) != 1) /* stay alive (and attached) until every report is in */
        c = 0;
    stoke_arena_close(a);
    _exit(0);
}

static int run(const plan *pl, result *sum, uint64_t *mlocked_delta)
{
    int tp[2], ap[2], dp[2], op[2], ep[2];
    if (pipe(tp) || pipe(ap) || pipe(dp) || pipe(op) || pipe(ep))
        return -1;
    uint64_t ml0 = meminfo_kib("Mlocked");
    pid_t *pids = calloc((size_t)pl->procs, sizeof(*pids));
    for (int i = 0; i < pl->procs; i++) {
        pids[i] = fork();
        if (pids[i] == 0)
            child(pl, tp[0], ap[1], dp[0], op[1], ep[0]);
    }
    /* turns: together, every process at once; staggered, one after the other */
    char c;
    for (int i = 0; i < pl->procs; i++)
        if (write(tp[1], "t", 1) != 1 || (pl->staggered && read(ap[0], &c, 1) != 1))
            return -1;
    for (int i = 0; !pl->staggered && i < pl->procs; i++)
        if (read(ap[0], &c, 1) != 1)
            return -1;
    uint64_t ml1 = meminfo_kib("Mlocked");
    for (int i = 0; i < pl->procs; i++)
        if (write(dp[1], "d", 1) != 1)
            return -1;
    memset(sum, 0, sizeof(*sum));
    sum->ok = 1;
    for (int i = 0; i < pl->procs; i++) {
        result r;
        if (read(op[0], &r, sizeof(r)) != (ssize_t)sizeof(r))
            return -1;
        if (!r.ok) {
            fprintf(stderr, "bench_arena: a process failed: %s\n", r.err);
            sum->ok = 0;
        }
        sum->pinned += r.pinned;
        sum->distinct += r.distinct;
        sum->pss += r.pss;
    }
    for (int i = 0; i < pl->procs; i++)
        if (write(ep[1], "e", 1) != 1)
            return -1;
    for (int i = 0; i < pl->procs; i++)
        waitpid(pids[i], NULL, 0);
    free(pids);
    close(tp[0]), close(tp[1]), close(ap[0]), close(ap[1]), close(dp[0]), close(dp[1]),
        close(op[0]), close(op[1]);
    close(ep[0]), close(ep[1]);
    if (pl->use_arena)
        sum->distinct = pl->arena_bytes;
    *mlocked_delta = ml1 > ml0 ? (ml1 - ml0) * 1024 : 0;
    return 0;
}

int main(int argc, char **argv)
{
    plan pl = {.procs = argc > 1 ? atoi(argv[1]) : 8,
               .mib = argc > 2 ? (size_t)atoi(argv[2]) : 64,
               .buf_mib = argc > 3 ? (size_t)atoi(argv[3]) : 4};
    if (pl.procs < 1 || pl.procs > STOKE_ARENA_MAX_PROCS || pl.buf_mib < 1 || pl.mib < pl.buf_mib) {
        fprintf(stderr, "usage: bench_arena [PROCS 1..64] [MIB] [BUF_MIB <= MIB]\n");
        return 2;
    }
    snprintf(pl.name, sizeof(pl.name), "bench-%d", (int)getpid());
    printf("%d processes, each %zu MiB of staging buffers of %zu MiB\n", pl.procs, pl.mib,
           pl.buf_mib);
    fflush(stdout);
    printf("%-10s %-8s %14s %14s %12s %12s\n", "scenario", "mode", "pinned_sum_MiB", "distinct_MiB",
           "pss_sum_MiB", "mlocked_MiB");
    int rcode = 0;
    for (int staggered = 0; staggered < 2; staggered++) {
        double distinct[2] = {0, 0};
        for (int use_arena = 0; use_arena < 2; use_arena++) {
            pl.staggered = staggered;
            pl.use_arena = use_arena;
            uint64_t need = (uint64_t)pl.mib << 20;
            pl.arena_bytes = staggered ? 2 * need : need * (uint64_t)pl.procs;
            result s;
            uint64_t ml;
            if (run(&pl, &s, &ml) != 0 || !s.ok) {
                rcode = 1;
                continue;
            }
            distinct[use_arena] = (double)s.distinct;
            printf("%-10s %-8s %14.1f %14.1f %12.1f %12.1f\n", staggered ? "staggered" : "together",
                   use_arena ? "arena" : "private", (double)s.pinned / 1048576,
                   (double)s.distinct / 1048576, (double)s.pss / 1048576, (double)ml / 1048576);
            fflush(stdout);
        }
        if (distinct[1] > 0)
            printf("%-10s locked memory, private / arena: %.2fx\n",
                   staggered ? "staggered" : "together", distinct[0] / distinct[1]);
    }
    return rcode;
}
