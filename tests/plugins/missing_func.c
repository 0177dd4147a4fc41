/* Leaves the required host_alloc NULL. */
#define FAKE_NAME "nohostalloc"
#define FAKE_NO_HOST_ALLOC
#include "fake_plugin.h"
