/* Loads fine, but its probe fails. */
#define FAKE_NAME "probefail"
#define FAKE_PROBE_FAILS
#include "fake_plugin.h"
