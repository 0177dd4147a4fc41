/* What the registry accepts (table.c): a backend's function table, a backend's name, and a
 * spec "name[:index]" (stoke__parse_accel_spec, registry.h). */
#include <ctype.h>
#include <stdint.h>
#include <string.h>

#include "common/env.h"
#include "common/internal.h"
#include "registry/registry.h"
#include "registry/table.h"

/* The first missing member of the ABI v2 IPC group when the table has some of it, else NULL.
 * A v1 table has no such group (its v1 ipc_export/ipc_import placeholders are never called). */
static const char *ipc_group_missing(const stoke_backend *vt)
{
    if (vt->abi_version < 2)
        return NULL;
    if (!vt->ipc_export_mem && !vt->ipc_import_mem && !vt->ipc_close_mem)
        return NULL;
    return !vt->ipc_export_mem   ? "ipc_export_mem"
           : !vt->ipc_import_mem ? "ipc_import_mem"
           : !vt->ipc_close_mem  ? "ipc_close_mem"
                                 : NULL;
}

/* The capabilities the registry reports: the table's, with STOKE_CAP_IPC set exactly when the
 * IPC group is there (a v1 table cannot have it, whatever its caps say). */
uint64_t stoke__effective_caps(const stoke_backend *vt)
{
    return (vt->caps & ~(uint64_t)STOKE_CAP_IPC) | (stoke__vt_has_ipc(vt) ? STOKE_CAP_IPC : 0);
}

/* The characters a name in STOKE_ACCELERATOR=name[:index] may have (stoke__parse_accel_spec). */
static int name_char_ok(unsigned char c)
{
    return isalnum(c) || c == '_' || c == '-';
}

static int name_chars_ok(const char *name)
{
    for (; *name; name++)
        if (!name_char_ok((unsigned char)*name))
            return 0;
    return 1;
}

/* Checks a table the entry point returned; fills `why` and returns STOKE_EABI if unusable. */
int stoke__validate_table(const stoke_backend *vt, char *why, size_t why_len)
{
    if (!vt) {
        stoke__strlcpy(why, "entry point returned no table", why_len);
        return STOKE_EABI;
    }
    if (vt->abi_version < STOKE_BACKEND_ABI_MIN || vt->abi_version > STOKE_BACKEND_ABI_VERSION) {
        stoke__fmt(why, why_len, "ABI version %u outside the accepted window %d..%d",
                   vt->abi_version, STOKE_BACKEND_ABI_MIN, STOKE_BACKEND_ABI_VERSION);
        return STOKE_EABI;
    }
    if (vt->size < STOKE_BACKEND_V1_SIZE) {
        stoke__fmt(why, why_len, "function table of %u bytes is smaller than ABI v1's %zu",
                   vt->size, (size_t)STOKE_BACKEND_V1_SIZE);
        return STOKE_EABI;
    }
    if (vt->abi_version >= 2 && vt->size < STOKE_BACKEND_V2_SIZE) {
        stoke__fmt(why, why_len,
                   "function table of %u bytes is smaller than ABI v2's %zu (the "
                   "table says abi_version %u)",
                   vt->size, (size_t)STOKE_BACKEND_V2_SIZE, vt->abi_version);
        return STOKE_EABI;
    }
    if (!vt->name || !vt->name[0] || strlen(vt->name) >= sizeof(((stoke_backend_info *)0)->name)) {
        stoke__strlcpy(why, "backend has no valid name", why_len);
        return STOKE_EABI;
    }
    if (!name_chars_ok(vt->name)) {
        stoke__fmt(why, why_len,
                   "backend name '%s' has a character other than letters, digits, "
                   "'_' and '-' (STOKE_ACCELERATOR=name[:index] could not choose it)",
                   vt->name);
        return STOKE_EABI;
    }
    const char *missing = !vt->probe          ? "probe"
                          : !vt->device_count ? "device_count"
                          : !vt->device_props ? "device_props"
                          : !vt->host_alloc   ? "host_alloc"
                          : !vt->host_free    ? "host_free"
                          : !vt->is_pinned    ? "is_pinned"
                                              : NULL;
    if (missing) {
        stoke__fmt(why, why_len, "required function %s is missing", missing);
        return STOKE_EABI;
    }
    /* Optional functions come in groups: a table that has one of a group has all of it. */
    missing = vt->stream_create && !vt->stream_destroy     ? "stream_destroy"
              : vt->stream_create && !vt->copy_h2d_async   ? "copy_h2d_async"
              : vt->event_create && !vt->event_destroy     ? "event_destroy"
              : vt->event_create && !vt->event_record      ? "event_record"
              : vt->event_create && !vt->event_query       ? "event_query"
              : vt->event_create && !vt->event_synchronize ? "event_synchronize"
              : vt->device_alloc && !vt->device_free       ? "device_free"
              : vt->host_register && !vt->host_unregister  ? "host_unregister"
                                                           : NULL;
    if (!missing)
        missing = ipc_group_missing(vt);
    if (missing) {
        stoke__fmt(why, why_len,
                   "function %s is missing (required with the functions it goes "
                   "with)",
                   missing);
        return STOKE_EABI;
    }
    /* Without stream_synchronize nothing could wait for a queued copy before its buffers are
     * freed or reused. */
    if ((vt->stream_create || vt->stream_destroy || vt->copy_h2d_async || vt->copy_d2h_async) &&
        !vt->stream_synchronize) {
        stoke__strlcpy(why,
                       "function stream_synchronize is missing (required whenever the "
                       "backend has streams or copies)",
                       why_len);
        return STOKE_EABI;
    }
    return STOKE_OK;
}

int stoke__parse_accel_spec(const char *spec, char *name, size_t name_len, int *index)
{
    const char *colon = strchr(spec, ':');
    size_t n = colon ? (size_t)(colon - spec) : strlen(spec);
    if (n == 0 || n >= name_len)
        return STOKE_EINVAL;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)spec[i];
        if (!name_char_ok(c))
            return STOKE_EINVAL;
        name[i] = (char)tolower(c);
    }
    name[n] = '\0';
    *index = -1;
    if (colon) {
        uint64_t v;
        if (stoke__parse_u64(colon + 1, &v) != 0 || v > 1000000)
            return STOKE_EINVAL;
        *index = (int)v;
    }
    return STOKE_OK;
}

/* Computes the selection into `s` (under the lock). */
