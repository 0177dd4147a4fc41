/* Private interface of the pinned allocator (tests and other layers of libstoke). */
#ifndef STOKE_PINNED_INTERNAL_H
#define STOKE_PINNED_INTERNAL_H

/* Tests only: frees every block (cached, pending and live: events are synchronized first),
 * unregisters every registered range, forgets warnings, counters and settings, so that the next
 * call re-reads the environment.  Call it BEFORE stoke__registry_reset (blocks reference
 * backends).  Not thread-safe with respect to concurrent stoke_pinned_* calls. */
void stoke__pinned_reset(void);

#endif
