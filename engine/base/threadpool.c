#include "base/threadpool.h"

#include <pthread.h>
#include <unistd.h>

#include "base/muse_common.h"

struct muse_pool {
    int threads;
    pthread_t *tids;
    pthread_mutex_t mu;
    pthread_cond_t start_cv, done_cv;
    muse_pool_fn fn;
    muse_pool_fn_t fn_t;
    void *ctx;
    long total;
    unsigned long generation; /* bumped per job so workers wake once */
    int pending;
    int stopping;
};

typedef struct {
    muse_pool *pool;
    int index;
} worker_arg;

static void run_part(muse_pool *pool, int index)
{
    long per = (pool->total + pool->threads - 1) / pool->threads;
    long begin = per * index, end = begin + per;
    if (end > pool->total) end = pool->total;
    if (begin >= end) return;
    if (pool->fn_t)
        pool->fn_t(pool->ctx, begin, end, index);
    else
        pool->fn(pool->ctx, begin, end);
}

static void *worker_main(void *p)
{
    worker_arg arg = *(worker_arg *)p;
    free(p);
    muse_pool *pool = arg.pool;
    unsigned long seen = 0;
    for (;;) {
        pthread_mutex_lock(&pool->mu);
        while (!pool->stopping && pool->generation == seen)
            pthread_cond_wait(&pool->start_cv, &pool->mu);
        if (pool->stopping) {
            pthread_mutex_unlock(&pool->mu);
            return NULL;
        }
        seen = pool->generation;
        pthread_mutex_unlock(&pool->mu);
        run_part(pool, arg.index);
        pthread_mutex_lock(&pool->mu);
        if (--pool->pending == 0) pthread_cond_signal(&pool->done_cv);
        pthread_mutex_unlock(&pool->mu);
    }
}

muse_pool *muse_pool_create(int threads)
{
    if (threads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        threads = n > 0 ? (int)n : 1;
    }
    muse_pool *pool = MUSE_CALLOC(1, sizeof *pool);
    pool->threads = threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->start_cv, NULL);
    pthread_cond_init(&pool->done_cv, NULL);
    /* index 0 is the calling thread; workers take 1..threads-1 */
    pool->tids = MUSE_CALLOC((size_t)threads, sizeof *pool->tids);
    for (int i = 1; i < threads; i++) {
        worker_arg *arg = MUSE_MALLOC(sizeof *arg);
        arg->pool = pool;
        arg->index = i;
        MUSE_CHECK(pthread_create(&pool->tids[i], NULL, worker_main, arg) == 0);
    }
    return pool;
}

int muse_pool_threads(const muse_pool *pool)
{
    return pool ? pool->threads : 1;
}

static void run_job(muse_pool *pool, muse_pool_fn fn, muse_pool_fn_t fn_t, void *ctx, long total)
{
    pthread_mutex_lock(&pool->mu);
    pool->fn = fn;
    pool->fn_t = fn_t;
    pool->ctx = ctx;
    pool->total = total;
    pool->pending = pool->threads - 1;
    pool->generation++;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mu);
    run_part(pool, 0);
    pthread_mutex_lock(&pool->mu);
    while (pool->pending > 0) pthread_cond_wait(&pool->done_cv, &pool->mu);
    pthread_mutex_unlock(&pool->mu);
}

void muse_pool_run(muse_pool *pool, muse_pool_fn fn, void *ctx, long total)
{
    if (total <= 0) return;
    if (!pool || pool->threads == 1 || total == 1) {
        fn(ctx, 0, total);
        return;
    }
    run_job(pool, fn, NULL, ctx, total);
}

void muse_pool_run_t(muse_pool *pool, muse_pool_fn_t fn, void *ctx, long total)
{
    if (total <= 0) return;
    if (!pool || pool->threads == 1 || total == 1) {
        fn(ctx, 0, total, 0);
        return;
    }
    run_job(pool, NULL, fn, ctx, total);
}

void muse_pool_destroy(muse_pool *pool)
{
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    pool->stopping = 1;
    pthread_cond_broadcast(&pool->start_cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->threads; i++) pthread_join(pool->tids[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->start_cv);
    pthread_cond_destroy(&pool->done_cv);
    free(pool->tids);
    free(pool);
}
