/* Its entry point returns an error. */
#define FAKE_NAME "entryfail"
#define FAKE_ENTRY_FAILS
#include "fake_plugin.h"
