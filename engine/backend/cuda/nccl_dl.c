/* Loads libnccl.so.2 once with dlopen and resolves the entry points of nccl_dl.h. */
#include "backend/cuda/nccl_dl.h"

#include <dlfcn.h>
#include <pthread.h>

static muse_nccl lib;
static int loaded; /* 1 loaded, -1 failed (the reason in why) */
static char why[300];
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* One symbol into *slot; -1 with the reason when missing. */
static int resolve(void *h, const char *name, void **slot)
{
    *slot = dlsym(h, name);
    if (*slot) return 0;
    snprintf(why, sizeof why, "libnccl.so.2 has no %s (NCCL older than 2.0?)", name);
    return -1;
}

static void load_once(void)
{
    void *h = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        snprintf(why, sizeof why, "%s", dlerror());
        loaded = -1;
        return;
    }
    /* POSIX allows void * to function pointer through dlsym; copy through memcpy for C11 */
    void *p[6];
    const char *names[6] = {"ncclGetErrorString", "ncclCommInitAll", "ncclCommDestroy",
                            "ncclAllGather",      "ncclGroupStart",  "ncclGroupEnd"};
    for (int i = 0; i < 6; i++)
        if (resolve(h, names[i], &p[i])) {
            dlclose(h);
            loaded = -1;
            return;
        }
    memcpy(&lib.GetErrorString, &p[0], sizeof p[0]);
    memcpy(&lib.CommInitAll, &p[1], sizeof p[1]);
    memcpy(&lib.CommDestroy, &p[2], sizeof p[2]);
    memcpy(&lib.AllGather, &p[3], sizeof p[3]);
    memcpy(&lib.GroupStart, &p[4], sizeof p[4]);
    memcpy(&lib.GroupEnd, &p[5], sizeof p[5]);
    loaded = 1;
}

const muse_nccl *muse_nccl_load(muse_err *e)
{
    pthread_mutex_lock(&lock);
    if (!loaded) load_once();
    pthread_mutex_unlock(&lock);
    if (loaded > 0) return &lib;
    return muse_fail(e,
                     "NCCL is needed for ranks on different GPUs without peer access, and "
                     "libnccl.so.2 could not be loaded (%s); install NCCL 2 (libnccl2), or put "
                     "the ranks on one GPU (--gpus 0,0) or on GPUs with peer access",
                     why),
           NULL;
}
