#define _DEFAULT_SOURCE /* usleep */
/* Starts a thread from its constructor, then reports ABI version 99: rejected, and never
 * unloaded while that thread runs its code. */
#define FAKE_NAME "ctorthread"
#define FAKE_ABI  99
#define FAKE_CTOR_THREAD
#include "fake_plugin.h"
