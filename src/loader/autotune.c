/* num_workers = auto: the hill climb over the number of workers given work (docs/loader.md,
 * "Auto workers").  The loader holds a stoke__autotune and tells it of every delivery
 * (stoke__autotune_delivered, from next(); its count is inline in loader_internal.h); the
 * decision itself (stoke__autotune_step) sees only the period's measures and the state, so
 * tests drive it with made-up periods. */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "common/internal.h"
#include "loader/loader_internal.h"
#include "stoke/loader.h"

/* Every ~50 ms of deliveries, one step of a hill climb on the number of workers given work
 * (nact), judged by batches per second:
 * - the last step's move lost throughput (an addition that did not gain 5%, a removal that lost
 *   5%): undo it, and make no move for a while (2, 4, ... 32 periods);
 * - the consumer spent under 5% of the time in next(): workers are not the bottleneck, one
 *   fewer;
 * - it spent over 10% there: one more if there is one and adding did not fail last, else one
 *   fewer (on a busy machine, or when hand-offs cost more than the samples, fewer threads are
 *   faster; at 0 the caller's thread makes every batch, as with num_workers 0) - but with every
 *   worker given work, one fewer only when the process did not get the CPUs it could use
 *   (cpu_share, its CPU time over the period divided by min(CPUs, workers given work + 1),
 *   under 0.85: another process holds some): on an idle machine that try only cost a period
 *   at a lower rate, and short epochs never made it back.
 * Before those: when the caller's thread made more than half of the period's batches itself
 * because nobody was making them (assist; not those it made while helping), the workers mostly
 * add hand-offs: one fewer.  And first of all: when the consumer
 * waited over 10% and the loader delivered under 3/4 of the batches one thread makes back to
 * back (`solo`: batches per ns times the ns a batch takes to make), hand-offs cost more than
 * the batches (a consumer that does not wait is slower than its loader): straight to
 * nact_min (0: the caller's thread makes them, as with num_workers 0), unless that is the
 * move that failed last.  At batch size 1 on 2 cores each hand-off moves the batch and the
 * lock between cores (about 1 us here, a 256-byte row takes 0.3), and one step at a time took
 * two periods to get there.
 * Time in next() includes batches the caller's thread made itself.  (A shorter first period,
 * 10 ms, was tried: the workers are still starting then and the caller's thread makes most
 * batches, so the assist rule took a worker away; 3 KB rows, batch 256: 1.27 vs 1.45 M/s.) */
#define STOKE__ADAPT_NS 50000000u

void stoke__autotune_init(stoke__autotune *a, int nact)
{
    memset(a, 0, sizeof(*a));
    a->lo = a->hi = nact;
}

int stoke__autotune_step(stoke__autotune *a, int n, int lo, int hi, const stoke__autotune_period *p)
{
    int lost = (a->last > 0 && p->tput < a->prev_tput * 1.05) ||
               (a->last < 0 && p->tput < a->prev_tput * 0.95);
    a->prev_tput = p->tput;
    if (lost) {
        a->backoff = a->backoff ? (a->backoff < 32 ? a->backoff * 2 : 32) : 2;
        a->hold = a->backoff;
        n -= a->last;
        a->failed = a->last;
        a->last = 0;
        return n;
    }
    if (a->last) { /* the last move paid off */
        a->backoff = 0;
        a->failed = 0;
    }
    a->last = 0;
    if (a->hold) {
        a->hold--;
        return n;
    }
    int up = n < hi;
    int down = n > lo;
    double wait = p->wait_frac;
    if (p->solo > 0 && p->solo < 0.75 && wait > 0.10 && down && a->failed >= 0)
        a->last = lo - n; /* hand-offs cost more than the batches */
    else if (p->assisted_frac > 0.5 && down)
        a->last = -1; /* the caller's thread makes most batches: workers add hand-offs */
    else if (wait < 0.05 && down)
        a->last = -1;
    else if (wait > 0.10 && up && (a->failed != 1 || !down))
        a->last = 1; /* the direction that did not fail last, if there is a choice */
    else if (wait > 0.10 && down && (up || p->cpu_share < 0.85))
        a->last = -1;
    return n + a->last;
}

/* CPU time of the whole process, ns (0 when the clock is not there). */
static uint64_t process_cpu_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void stoke__autotune_clock(stoke_loader *l, uint64_t now)
{
    stoke__autotune *a = &l->autotune;
    if (!now)
        now = stoke__now_ns();
    if (!a->t0) {
        a->t0 = now;
        a->cpu0 = process_cpu_ns();
    }
    uint64_t span = now - a->t0;
    if (span < STOKE__ADAPT_NS || a->batches < 8)
        return;
    stoke__autotune_period p;
    p.tput = (double)a->batches / (double)span;
    p.wait_frac = (double)a->wait_ns / (double)span;
    /* the batches the caller's thread made because nobody was making them: those it made
     * while helping a worker say nothing about hand-offs */
    uint64_t helped = l->st_helped - a->helped0;
    p.assisted_frac = (double)(l->st.assisted_batches - a->assisted0 - helped) / (double)a->batches;
    uint64_t cpu = process_cpu_ns();
    int usable = l->nact + 1 < l->ncpu ? l->nact + 1 : l->ncpu;
    p.cpu_share = cpu > a->cpu0 ? (double)(cpu - a->cpu0) / (double)span / usable : 0.0;
    p.solo = p.tput * (double)l->busy_avg;
    int n = stoke__autotune_step(a, l->nact, l->nact_min, l->nworkers, &p);
    if (n != l->nact) {
        l->nact = n;
        a->changes++;
        if (n < a->lo)
            a->lo = n;
        if (n > a->hi)
            a->hi = n;
        stoke__loader_wake_workers(l, 1);
    }
    a->t0 = now;
    a->cpu0 = cpu;
    a->assisted0 = l->st.assisted_batches;
    a->helped0 = l->st_helped;
    a->batches = 0;
    a->wait_ns = 0;
}
