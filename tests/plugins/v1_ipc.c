/* An ABI v1 plugin (table of the v1 size) that claims STOKE_CAP_IPC and fills the v1
 * ipc_export/ipc_import placeholders: accepted, but without IPC. */
#define FAKE_NAME "oldipc"
#define FAKE_ABI  1
#define FAKE_SIZE STOKE_BACKEND_V1_SIZE
#define FAKE_V1_IPC
#include "fake_plugin.h"
