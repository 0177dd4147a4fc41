/* Has streams (stream_create, stream_destroy, copy_h2d_async) but no stream_synchronize: nothing
 * could wait for its copies, so the registry must reject it at load. */
#define FAKE_NAME "nostreamsync"
#define FAKE_STREAMS_NO_SYNC
#include "fake_plugin.h"
