/* stoke — status codes.
 *
 * Every stoke function that can fail returns an int: STOKE_OK (0) on success or one of the
 * negative STOKE_E* codes below.  The numbers are part of the ABI: a code is never renumbered
 * or reused, new codes are appended.  Detail about a failure (which file, which sample, the
 * driver's own message) is in stoke_last_error() and goes to the log callback; the code says
 * only what kind of failure it was.
 */
#ifndef STOKE_STATUS_H
#define STOKE_STATUS_H

#include "stoke/export.h"

#ifdef __cplusplus
extern "C" {
#endif

/* X(NAME, value, message): the one list every status code comes from. */
#define STOKE_STATUS_MAP(X)                                                            \
    X(OK, 0, "success")                                                                \
    X(EINVAL, -1, "invalid argument")                                                  \
    X(ENOMEM, -2, "out of memory")                                                     \
    X(ENOENT, -3, "not found")                                                         \
    X(EIO, -4, "input/output error")                                                   \
    X(ENOTSUP, -5, "operation not supported by this backend")                          \
    X(ENODEV, -6, "no accelerator or device available")                                \
    X(EABI, -7, "plugin ABI mismatch")                                                 \
    X(EBACKEND, -8, "accelerator backend or driver call failed")                       \
    X(ETIMEDOUT, -9, "timed out")                                                      \
    X(EBUSY, -10, "resource busy or operation still pending")                          \
    X(EFORMAT, -11, "malformed input data")                                            \
    X(ELIMIT, -12, "limit exceeded")                                                   \
    X(ESTATE, -13, "operation not valid in the current state")                         \
    X(ECANCELED, -14, "operation canceled")                                            \
    X(EDATA, -15, "dataset failed to produce a sample")                                \
    X(EEND, -16, "end of data")                                                        \
    X(ERANGE, -17, "value out of range")

typedef enum stoke_status {
#define STOKE__STATUS_ENUM(name, value, msg) STOKE_##name = (value),
    STOKE_STATUS_MAP(STOKE__STATUS_ENUM)
#undef STOKE__STATUS_ENUM
} stoke_status;

/* Returns a static English message for `code` ("unknown status" for codes not in the list).
 * Never NULL; the string is static (never freed, valid for the life of the process).
 * Thread-safe; cannot fail. */
STOKE_API const char *stoke_strerror(int code);

/* Returns the symbolic name of `code` ("STOKE_ENOMEM"), or "STOKE_UNKNOWN".  Never NULL; a
 * static string, never to be freed.  Thread-safe; cannot fail. */
STOKE_API const char *stoke_err_name(int code);

/* Returns the detail of the most recent failure of a stoke call made on the calling thread
 * ("npy /data/x.npy: header truncated at byte 61"), or "" if there was none.  Never NULL.
 * Meaningful right after a call returned a negative code: a successful call does not, in
 * general, clear it (a stale message may remain), though some calls (device.h, the pinned
 * allocator) clear it when they start, and a plugin's warnings also land in it.  The string is
 * owned by stoke (per-thread storage, at most 1023 characters; a longer message keeps its start
 * and its end, where the reason is, joined by " ... "): the pointer stays valid until
 * the thread exits, but its contents change at the next failure (or clear) on this thread, so
 * copy it to keep it.  Thread-safe (the message is per thread); cannot fail. */
STOKE_API const char *stoke_last_error(void);

#ifdef __cplusplus
}
#endif
#endif
