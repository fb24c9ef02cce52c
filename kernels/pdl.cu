/* pdl.cu: the one switch of programmatic dependent launch (pdl.cuh): on unless MUSE_PDL=0. */
#include <stdlib.h>

#include "pdl.cuh"

MUSE_K_API int muse_k_pdl_on(void)
{
    static const int on = [] {
        const char *v = getenv("MUSE_PDL");
        return !(v && v[0] == '0' && !v[1]);
    }();
    return on;
}
