/* Helpers every built-in backend shares. */
#include <string.h>

#include "backends/builtin.h"

int stoke__props_out(stoke_device_props *out, const stoke_device_props *props)
{
    size_t n = out->size < sizeof(*props) ? out->size : sizeof(*props);
    memcpy(out, props, n);
    out->size = (uint32_t)n;
    return STOKE_OK;
}
