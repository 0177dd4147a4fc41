/* Reports ABI version 0, below the host's window. */
#define FAKE_NAME "oldabi"
#define FAKE_ABI  0
#include "fake_plugin.h"
