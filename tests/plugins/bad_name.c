/* A name STOKE_ACCELERATOR=name[:index] could not choose: rejected. */
#define FAKE_NAME "my gpu"
#include "fake_plugin.h"
