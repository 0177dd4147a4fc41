/* Its host_alloc returns 7: not a stoke status code (they are 0 or negative).  Named to sort
 * after alpha.so in the plugin directory the registry test loads. */
#define FAKE_NAME     "allocpositive"
#define FAKE_ALLOC_RC 7
#include "fake_plugin.h"
