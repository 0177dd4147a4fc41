/* Reports ABI version 99, outside the host's window. */
#define FAKE_NAME "badabi"
#define FAKE_ABI  99
#include "fake_plugin.h"
