/* A probe that fills its reason buffer without a terminating NUL (and fails). */
#define FAKE_NAME "nonul"
#define FAKE_REASON_NO_NUL
#include "fake_plugin.h"
