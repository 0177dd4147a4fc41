/* Has event_create but not event_destroy/record/query/synchronize. */
#define FAKE_NAME "halfevents"
#define FAKE_HALF_EVENTS
#include "fake_plugin.h"
