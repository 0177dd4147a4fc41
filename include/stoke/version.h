/* stoke — version. */
#ifndef STOKE_VERSION_H
#define STOKE_VERSION_H

#include "stoke/export.h"

#define STOKE_VERSION_MAJOR  0
#define STOKE_VERSION_MINOR  1
#define STOKE_VERSION_PATCH  0
#define STOKE_VERSION_STRING "0.1.0"
/* One integer that compares in release order: MAJOR*10000 + MINOR*100 + PATCH. */
#define STOKE_VERSION_NUMBER                                                                       \
    (STOKE_VERSION_MAJOR * 10000 + STOKE_VERSION_MINOR * 100 + STOKE_VERSION_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually loaded (may differ from the headers compiled against):
 * stoke_version() returns STOKE_VERSION_NUMBER of that build; stoke_version_string() its
 * "MAJOR.MINOR.PATCH" form, a static string (never NULL, never to be freed).  Both are
 * thread-safe and cannot fail. */
STOKE_API int stoke_version(void);
STOKE_API const char *stoke_version_string(void);

/* The optional parts built into the loaded library, each present when the build machine had
 * its library at configure time (CMake says which it found):
 * STOKE_FEATURE_LIBURING  the npy source's io=uring (liburing)
 * STOKE_FEATURE_LIBJPEG   the images: source and .jpg members of tar: shards (libjpeg-turbo)
 * STOKE_FEATURE_LIBCURL   remote data: tar:http(s)://..., tar:s3://..., npy: URLs (libcurl)
 * STOKE_FEATURE_CHECK     the loader's lifecycle check (STOKE_CHECK_INVARIANTS; Debug builds)
 * STOKE_FEATURE_ZLIB      CRC-32 of shards in sidecar indexes, checked by the shard cache (zlib)
 * Bits are never renumbered; new ones are appended. */
#define STOKE_FEATURE_LIBURING 0x1u
#define STOKE_FEATURE_LIBJPEG  0x2u
#define STOKE_FEATURE_CHECK    0x4u
#define STOKE_FEATURE_LIBCURL  0x8u
#define STOKE_FEATURE_ZLIB     0x10u

/* Returns the STOKE_FEATURE_* bits of the loaded library, OR'ed together.  Thread-safe, cannot
 * fail. */
STOKE_API unsigned stoke_build_features(void);

#ifdef __cplusplus
}
#endif
#endif
