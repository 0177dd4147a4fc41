/* Does not export stoke_backend_entry. */
#define FAKE_NAME "noentry"
#define FAKE_NO_ENTRY
#include "fake_plugin.h"
