/* A fixed pool of worker threads that split a range [0, total) into contiguous parts.
 * Each index is handled by exactly one thread, so results never depend on the split. */
#ifndef MUSE_THREADPOOL_H
#define MUSE_THREADPOOL_H

typedef struct muse_pool muse_pool;

/* fn(ctx, begin, end) handles indices [begin, end). */
typedef void (*muse_pool_fn)(void *ctx, long begin, long end);

muse_pool *muse_pool_create(int threads); /* threads <= 0: one per online core */
int muse_pool_threads(const muse_pool *pool);
/* Runs fn over [0, total) on all threads and returns when every part is done.
 * A NULL pool runs fn(ctx, 0, total) on the caller. */
void muse_pool_run(muse_pool *pool, muse_pool_fn fn, void *ctx, long total);
/* Same, but fn also learns which thread (0 .. threads-1) runs it, to index per-thread scratch. */
typedef void (*muse_pool_fn_t)(void *ctx, long begin, long end, int thread);
void muse_pool_run_t(muse_pool *pool, muse_pool_fn_t fn, void *ctx, long total);
void muse_pool_destroy(muse_pool *pool);

#endif
