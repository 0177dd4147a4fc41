/* placeholder: the simdev helper replaces this file */
#include "stoke/backend.h"
__attribute__((visibility("default"))) int stoke_backend_entry(const stoke_backend_host *host, const stoke_backend **out)
{
    return STOKE_ENOTSUP;
}
