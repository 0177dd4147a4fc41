/* A program outside the tree that uses an installed stoke (checked by scripts/check-install.sh). */
#include <stdio.h>
#include <stoke/stoke.h>

int main(void)
{
    stoke_accelerator_info acc;
    int rc = stoke_accelerator_get(&acc);
    printf("stoke %s: accelerator %s (%s)\n", stoke_version_string(),
           rc == STOKE_OK ? acc.backend : "none", stoke_err_name(rc));
    return (rc == STOKE_OK || rc == STOKE_ENODEV) ? 0 : 1;
}
