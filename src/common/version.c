#include "stoke/version.h"

int stoke_version(void)
{
    return STOKE_VERSION_NUMBER;
}

const char *stoke_version_string(void)
{
    return STOKE_VERSION_STRING;
}

unsigned stoke_build_features(void)
{
    unsigned f = 0;
#ifdef STOKE_HAVE_LIBURING
    f |= STOKE_FEATURE_LIBURING;
#endif
#ifdef STOKE_HAVE_LIBJPEG
    f |= STOKE_FEATURE_LIBJPEG;
#endif
#ifdef STOKE_HAVE_LIBCURL
    f |= STOKE_FEATURE_LIBCURL;
#endif
#ifdef STOKE_CHECK_INVARIANTS
    f |= STOKE_FEATURE_CHECK;
#endif
#ifdef STOKE_HAVE_ZLIB
    f |= STOKE_FEATURE_ZLIB;
#endif
    return f;
}
