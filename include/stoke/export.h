/* stoke — symbol export.  The library is built with hidden visibility; only declarations
 * marked STOKE_API are exported from libstoke.so. */
#ifndef STOKE_EXPORT_H
#define STOKE_EXPORT_H

#if defined(STOKE_BUILDING_SHARED) && defined(__GNUC__)
#define STOKE_API __attribute__((visibility("default")))
#else
#define STOKE_API
#endif

#endif
