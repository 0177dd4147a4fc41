/* Has ipc_export_mem but not ipc_import_mem/ipc_close_mem (ABI v2). */
#define FAKE_NAME "halfipc"
#define FAKE_HALF_IPC
#include "fake_plugin.h"
