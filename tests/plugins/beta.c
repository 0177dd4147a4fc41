/* A valid plugin named beta with 3 devices. */
#define FAKE_NAME    "beta"
#define FAKE_DEVICES 3
#include "fake_plugin.h"
