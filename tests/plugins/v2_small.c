/* Says ABI v2 but reports a table of the v1 size (without the IPC group). */
#define FAKE_NAME "v2small"
#define FAKE_ABI  2
#define FAKE_SIZE STOKE_BACKEND_V1_SIZE
#include "fake_plugin.h"
