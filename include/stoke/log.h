/* stoke — logging.
 *
 * All diagnostics go through one callback.  The default callback writes
 * "stoke: LEVEL: message" to stderr for messages at or above the current level, which is WARN
 * unless STOKE_LOG says otherwise (error, warn, info, debug, trace).
 */
#ifndef STOKE_LOG_H
#define STOKE_LOG_H

#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum stoke_log_level {
    STOKE_LOG_ERROR = 0,
    STOKE_LOG_WARN = 1,
    STOKE_LOG_INFO = 2,
    STOKE_LOG_DEBUG = 3,
    STOKE_LOG_TRACE = 4
} stoke_log_level;

/* A log sink.  `level` is a stoke_log_level, `msg` a NUL-terminated line without trailing
 * newline, valid only during the call.  May be called from any stoke thread, concurrently:
 * the callback must be thread-safe.  It must not call back into stoke. */
typedef void (*stoke_log_fn)(void *user, int level, const char *msg);

/* Installs `fn` (NULL restores the default stderr sink) with its `user` pointer.
 * Thread-safe; messages already being delivered may still reach the previous sink. */
STOKE_API void stoke_log_set_callback(stoke_log_fn fn, void *user);

/* Sets the most verbose level delivered to the sink (overrides STOKE_LOG).  Thread-safe. */
STOKE_API void stoke_log_set_level(int level);

/* Returns the current level.  Thread-safe. */
STOKE_API int stoke_log_get_level(void);

/* Returns "error", "warn", "info", "debug" or "trace" ("?" otherwise). */
STOKE_API const char *stoke_log_level_name(int level);

#ifdef __cplusplus
}
#endif
#endif
