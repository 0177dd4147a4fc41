/* Claims the name of a built-in backend. */
#define FAKE_NAME "cuda"
#include "fake_plugin.h"
