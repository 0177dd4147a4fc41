/* Its entry point returns 5: not a stoke status code (they are 0 or negative). */
#define FAKE_NAME     "entrypositive"
#define FAKE_ENTRY_RC 5
#include "fake_plugin.h"
