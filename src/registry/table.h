/* What the registry accepts of a backend (table.c). */
#ifndef STOKE_REGISTRY_TABLE_H
#define STOKE_REGISTRY_TABLE_H

#include <stddef.h>
#include <stdint.h>

#include "stoke/backend.h"

/* The capabilities the registry reports: the table's, with STOKE_CAP_IPC set exactly when the
 * IPC group is there (a v1 table cannot have it, whatever its caps say). */
uint64_t stoke__effective_caps(const stoke_backend *vt);

/* Checks a table an entry point returned: STOKE_OK, or STOKE_EABI with the reason in `why`
 * (version window, size, name, required functions, function groups). */
int stoke__validate_table(const stoke_backend *vt, char *why, size_t why_len);

#endif
