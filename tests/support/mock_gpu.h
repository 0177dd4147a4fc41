/* What the mock CUDA driver and the mock HIP runtime (tests/test_cuda_mock.c,
 * tests/test_hip_mock.c) emulate alike, so that they behave like a GPU rather than like memcpy:
 *
 * - Device memory: malloc'd blocks that remember their device and size.
 * - Page-locked host ranges: a table of allocated and registered ranges, refusing overlaps as
 *   the drivers do (the mocks turn a refusal into their "already registered" code).
 * - A copy engine: streams queue copies and event records; one engine thread runs them later,
 *   in order per stream (streams served in turn), sleeping a configurable delay before each
 *   copy, so a copy reads its source when it runs, not when it was queued.  An event is done
 *   once the work queued before its last record has run (never recorded: done).  mg_hold makes
 *   "not done yet" deterministic: while held, nothing runs.
 *
 * Every function is thread-safe.  Completion is published under one mutex, so whoever waited
 * for a copy (event/stream sync) sees its bytes. */
#ifndef STOKE_TEST_MOCK_GPU_H
#define STOKE_TEST_MOCK_GPU_H

#include <stddef.h>

/* Forgets every block, range and counter, frees the device blocks, sets the delay to 0 and
 * releases a hold.  Streams and events must have been destroyed (the engine idle). */
void mg_reset(void);

/* ---- device memory ---- */

/* A block of n bytes "on" dev; NULL when out of memory (or the table is full). */
void *mg_dev_alloc(int dev, size_t n);
/* 1 if p lies in a block (its end included), with the offset, device and size of that block. */
int mg_dev_find(const void *p, size_t *off, int *dev, size_t *size);
/* Frees the block starting at p (waiting for queued copies that use it, see mg_hazards);
 * 0, or -1 when p does not start a block. */
int mg_dev_free(void *p);

/* ---- page-locked host ranges ---- */

enum { MG_PIN_ALLOC = 1, MG_PIN_REGISTERED = 2 };
/* Records [p, p+n) as `kind`; -1 when it overlaps a recorded range (nothing recorded). */
int mg_pin_add(void *p, size_t n, int kind);
/* Forgets the range of `kind` starting at p (waiting for queued copies that use it); 0, or -1
 * when no such range starts at p. */
int mg_pin_remove(void *p, int kind);
/* The kind of the range holding p (interior addresses too), or 0. */
int mg_pin_kind(const void *p);

/* ---- the copy engine ---- */

typedef struct mg_stream mg_stream;
typedef struct mg_event mg_event;

/* Microseconds the engine sleeps before running each copy. */
void mg_set_delay_us(unsigned us);
/* 1: the engine runs nothing until mg_hold(0); meanwhile a synchronize, or destroying a stream
 * or event with queued work, blocks.  Release it before any assertion that may fail. */
void mg_hold(int on);

mg_stream *mg_stream_create(void);    /* NULL: out of memory */
void mg_stream_destroy(mg_stream *s); /* waits for its queued work first */
int mg_copy(mg_stream *s, void *dst, const void *src, size_t n); /* queued; -1: no memory */
void mg_stream_sync(mg_stream *s); /* returns once its queue is empty */

mg_event *mg_event_create(void);                /* NULL: out of memory */
void mg_event_destroy(mg_event *e);             /* waits for its pending records first */
int mg_event_record(mg_event *e, mg_stream *s); /* queued; -1: no memory */
int mg_event_done(mg_event *e);                 /* 1 when its last record has run */
void mg_event_sync(mg_event *e);

/* Copies the engine has run since mg_reset. */
unsigned long mg_copies_run(void);
/* Frees (mg_dev_free, mg_pin_remove) of memory a queued copy still used, since mg_reset. */
int mg_hazards(void);

#endif
