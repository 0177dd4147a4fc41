/* A valid plugin named alpha with 2 devices. */
#define FAKE_NAME "alpha"
#include "fake_plugin.h"
