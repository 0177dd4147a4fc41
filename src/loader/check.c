/* The loader's lifecycle check (STOKE_CHECK_INVARIANTS builds only): every batch in exactly the
 * container its state says, the counters equal to the counts per state, no buffer or staging
 * slot lost or doubled.  The states and who owns what are in loader_internal.h, above struct
 * stoke_batch; docs/loader.md, "Batch lifecycle". */
#ifdef STOKE_CHECK_INVARIANTS

#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "loader/loader_internal.h"

#ifdef STOKE_TEST_BREAK_TRANSITION
int stoke__test_break;
#endif

_Atomic uint64_t stoke__loader_checks;

static _Thread_local char me_tag; /* its address names the thread */

uintptr_t stoke__loader_me(void)
{
    return (uintptr_t)&me_tag;
}

void stoke__loader_check_failed(const char *file, int line, const char *what)
{
    fprintf(stderr, "stoke: loader invariant broken at %s:%d: %s\n", file, line, what);
    fflush(stderr);
    abort();
}

static const char *const state_name[] = {"FREE", "FILLING", "DONE", "HELD", "RELEASED"};

/* Where the walk of the containers found each batch and slot. */
enum { IN_NONE = 0, IN_FREE, IN_DONE, IN_READY, IN_RELEASED };
enum { S_NONE = 0, S_FREE, S_COPY, S_BATCH };

typedef struct checker {
    stoke_loader *l;
    int bad; /* invariants broken so far */
} checker;

static void broken(checker *c, const char *fmt, ...) STOKE__PRINTF(2, 3);
static void broken(checker *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "stoke: loader invariant broken: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    c->bad++;
}

static int state_of(const stoke_batch *b)
{
    return atomic_load_explicit(&b->state, memory_order_relaxed);
}

static const char *name_of(int st)
{
    return st >= 0 && st < (int)STOKE__ARRAY_LEN(state_name) ? state_name[st] : "(no state)";
}

/* Records entry p of `kind` (l's batches, or its staging slots: base, each `size` bytes) as
 * found in container `in` (its name: what): p must be one of them, found once.  Its number, or
 * -1 when it is none of them. */
static long record(checker *c, unsigned char *where, const void *p, const void *base, size_t size,
                   int in, const char *kind, const char *what)
{
    const char *at = p, *b0 = base;
    if (at < b0 || at >= b0 + size * (size_t)c->l->nbuf) {
        broken(c, "%s holds %p, which is no %s of the loader's %d", what, p, kind, c->l->nbuf);
        return -1;
    }
    size_t i = (size_t)(at - b0) / size;
    if (where[i])
        broken(c, "%s %zu is in %s and in another container (%d)", kind, i, what, where[i]);
    where[i] = (unsigned char)in;
    return (long)i;
}

/* Records batch b as found in container `in`, which holds batches in state `want`. */
static void found(checker *c, unsigned char *where, const stoke_batch *b, int in, int want,
                  const char *what)
{
    long i = record(c, where, b, c->l->bat, sizeof(*b), in, "batch", what);
    if (i >= 0 && state_of(b) != want)
        broken(c, "batch %ld is in %s in state %s, not %s", i, what, name_of(state_of(b)),
               name_of(want));
}

/* Device mode: every staging slot in free_s, the copy FIFO or one batch's host. */
static void check_slots(checker *c, unsigned char *where)
{
    stoke_loader *l = c->l;
    const size_t size = sizeof(stoke__slot);
    int nfree = 0, ncopy = 0, nbat = 0;
    for (const stoke__slot *s = l->free_s; s && nfree <= l->nbuf; s = s->next, nfree++)
        record(c, where, s, l->slots, size, S_FREE, "staging slot", "free_s");
    const stoke__slot *last = NULL;
    for (const stoke__slot *s = l->copy_head; s && ncopy <= l->nbuf; s = s->next, ncopy++) {
        record(c, where, s, l->slots, size, S_COPY, "staging slot", "the copy FIFO");
        last = s;
    }
    if (l->copy_tail != last)
        broken(c, "copy_tail is not the copy FIFO's last slot");
    for (int i = 0; i < l->nbuf; i++) {
        const stoke_batch *b = &l->bat[i];
        int st = state_of(b);
        if (b->host) {
            record(c, where, b->host, l->slots, size, S_BATCH, "staging slot", "a batch's host");
            nbat++;
        }
        if ((st == STOKE__B_FREE && b->host) || (st == STOKE__B_FILLING && !b->host))
            broken(c, "device mode: batch %d, %s, %s a staging slot", i, name_of(st),
                   b->host ? "has" : "has no");
    }
    if (nfree + ncopy + nbat != l->nbuf)
        broken(c, "device mode: %d staging slots free + %d copying + %d with batches != %d", nfree,
               ncopy, nbat, l->nbuf);
}

void stoke__loader_check(stoke_loader *l)
{
    checker c = {l, 0};
    atomic_fetch_add_explicit(&stoke__loader_checks, 1, memory_order_relaxed);
    /* (l's create got as far as the pools: the destroy of a failed one takes no lock) */
    unsigned char small[512] = {0}, *where = small;
    size_t need = 2 * (size_t)l->nbuf; /* batches, then slots */
    if (need > sizeof(small) && !(where = calloc(need, 1))) {
        fprintf(stderr, "stoke: loader check: out of memory, skipped\n");
        return;
    }
    /* the containers */
    if (l->nfree < 0 || l->nfree > l->nbuf)
        broken(&c, "nfree %d is outside [0, %d]", l->nfree, l->nbuf);
    for (int i = 0; i >= 0 && i < l->nfree && i < l->nbuf; i++)
        found(&c, where, l->free_v[i], IN_FREE, STOKE__B_FREE, "free_v");
    int ndone = 0;
    stoke_batch *const *tail = &l->done;
    for (stoke_batch *b = l->done; b && ndone <= l->nbuf; b = b->next, ndone++) {
        found(&c, where, b, IN_DONE, STOKE__B_DONE, "the done list");
        tail = &b->next;
    }
    if (l->done_tail != tail)
        broken(&c, "done_tail is not the done list's last next");
    for (uint64_t i = 0; l->ready && i <= l->ready_mask; i++) {
        stoke_batch *b = l->ready[i];
        if (!b)
            continue;
        found(&c, where, b, IN_READY, STOKE__B_DONE, "the ready ring");
        ndone++;
        if ((b->seq & l->ready_mask) != i)
            broken(&c, "batch seq %llu is in ready slot %llu", (unsigned long long)b->seq,
                   (unsigned long long)i);
    }
    /* The released stack, read without popping: pushes only add on top, and only reclaim (under
     * `mu`, held here) takes it.  Acquire: a batch seen on it shows its RELEASED. */
    int nrel = 0;
    for (stoke_batch *b = atomic_load_explicit(&l->released, memory_order_acquire);
         b && nrel <= l->nbuf; b = b->next, nrel++)
        found(&c, where, b, IN_RELEASED, STOKE__B_RELEASED, "the released stack");
    /* the batches in no container: FILLING, HELD, or RELEASED by a release that has not pushed
     * it yet (it stores the state first); another thread may release a HELD one meanwhile, so
     * HELD and RELEASED count together */
    int nfilling = 0, ncurrent = 0, nheld = 0;
    for (int i = 0; i < l->nbuf; i++) {
        const stoke_batch *b = &l->bat[i];
        int st = state_of(b);
        if (!l->o.device && !b->host)
            broken(&c, "host mode: batch %d has no buffer", i);
        if (where[i])
            continue;
        if (st == STOKE__B_FILLING) {
            nfilling++;
            ncurrent += b->gen == l->gen;
        } else if (st == STOKE__B_HELD || st == STOKE__B_RELEASED) {
            nheld++;
        } else {
            broken(&c, "batch %d is in state %s but in none of its containers", i, name_of(st));
        }
    }
    /* the counters */
    if (nfilling != l->filling)
        broken(&c, "filling is %d, but %d batches are FILLING", l->filling, nfilling);
    if (nheld + nrel != l->held)
        broken(&c, "held is %d, but %d batches are HELD or RELEASED (%d on the stack)", l->held,
               nheld + nrel, nrel);
    if (ndone + ncurrent != l->outstanding)
        broken(&c, "outstanding is %d, but %d batches are DONE and %d FILLING of gen %llu",
               l->outstanding, ndone, ncurrent, (unsigned long long)l->gen);
    if (l->nfree + nfilling + ndone + nheld + nrel != l->nbuf)
        broken(&c, "%d free + %d filling + %d done + %d held or released != %d buffers", l->nfree,
               nfilling, ndone, nheld + nrel, l->nbuf);
    if (!l->iterable && l->outstanding > l->window)
        broken(&c, "outstanding %d is over the window of %d", l->outstanding, l->window);
    if (l->iterable && l->w) {
        int sum = 0;
        for (int i = 0; i < l->nw1; i++)
            sum += l->w[i].outstanding;
        if (sum != l->outstanding)
            broken(&c, "the workers' outstanding add up to %d, the loader's is %d", sum,
                   l->outstanding);
    }
    if (l->o.device && l->slots)
        check_slots(&c, where + l->nbuf);
    if (where != small)
        free(where);
    if (c.bad)
        stoke__loader_check_failed(__FILE__, __LINE__, "see above (stoke__loader_check)");
}

#else
/* ISO C: a translation unit is not empty. */
typedef int stoke__check_unused;
#endif
