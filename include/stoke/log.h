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
 * newline (at most 1535 characters; longer messages are truncated), owned by stoke and valid
 * only during the call.  `user` is the pointer given to stoke_log_set_callback.  It may be
 * called from any thread (the caller's, stoke's workers, a backend's), but never concurrently:
 * stoke holds one global lock around each call, so calls are serialized and a slow sink slows
 * every logging thread.  It must not call back into stoke: a stoke call that logs, or
 * stoke_log_set_callback, would deadlock on that lock. */
typedef void (*stoke_log_fn)(void *user, int level, const char *msg);

/* Installs `fn` (NULL restores the default stderr sink) with its `user` pointer (may be NULL;
 * stoke stores it and passes it back, never frees it).  It waits for a message being delivered
 * to finish: once it returns, the previous sink is never called again, and its `user` may be
 * freed.  Cannot fail.  Thread-safe (must not be called from inside a sink, see above). */
STOKE_API void stoke_log_set_callback(stoke_log_fn fn, void *user);

/* Sets the most verbose level delivered to the sink (overrides STOKE_LOG).  A value below
 * STOKE_LOG_ERROR or above STOKE_LOG_TRACE is clamped to that end.  Cannot fail.  Thread-safe. */
STOKE_API void stoke_log_set_level(int level);

/* Returns the current level: the last stoke_log_set_level, else STOKE_LOG read at the first
 * call (an unknown value is reported on stderr and means warn), else STOKE_LOG_WARN.
 * Cannot fail.  Thread-safe. */
STOKE_API int stoke_log_get_level(void);

/* Returns "error", "warn", "info", "debug" or "trace" ("?" for any other value): a static
 * string, never NULL, never to be freed.  Thread-safe. */
STOKE_API const char *stoke_log_level_name(int level);

#ifdef __cplusplus
}
#endif
#endif
