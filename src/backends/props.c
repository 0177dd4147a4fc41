/* Helpers every built-in backend shares. */
#include <stdio.h>
#include <string.h>

#include "backends/builtin.h"

int stoke__props_out(stoke_device_props *out, const stoke_device_props *props)
{
    size_t n = out->size < sizeof(*props) ? out->size : sizeof(*props);
    memcpy(out, props, n);
    out->size = (uint32_t)n;
    return STOKE_OK;
}

int stoke__backend_vfail(const char *backend, int oom, int code, const char *name, const char *text,
                         const char *fmt, va_list ap)
{
    char call[160];
    vsnprintf(call, sizeof(call), fmt, ap);
    return stoke__fail(oom ? STOKE_ENOMEM : STOKE_EBACKEND, "%s: %s: %s (%d): %s", backend, call,
                       name, code, text);
}
