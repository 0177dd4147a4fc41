/* Reports a table smaller than ABI v1's. */
#define FAKE_NAME "small"
#define FAKE_SIZE 16
#include "fake_plugin.h"
