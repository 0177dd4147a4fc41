#include "stoke/version.h"

int stoke_version(void)
{
    return STOKE_VERSION_NUMBER;
}

const char *stoke_version_string(void)
{
    return STOKE_VERSION_STRING;
}
