/* The fill worker: one thread that fills the tables of grammars compiled through the cache, so
 * a request's compile costs its caller (the scheduler) only the rules, not the trie walks
 * (milliseconds to seconds at a vocabulary of 200k). A mask on a grammar not yet filled waits
 * for it; the scheduler asks muse_grammar_ready first and holds the lane meanwhile. */
#include "grammar/gram_internal.h"

#include "base/muse_common.h"

static pthread_mutex_t q_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cv = PTHREAD_COND_INITIALIZER;
static muse_grammar *q_head, *q_tail;
static bool q_started;

static void *fill_worker(void *arg)
{
    (void)arg;
    for (;;) {
        pthread_mutex_lock(&q_mu);
        while (!q_head) pthread_cond_wait(&q_cv, &q_mu);
        muse_grammar *g = q_head;
        q_head = g->fill_next;
        if (!q_head) q_tail = NULL;
        pthread_mutex_unlock(&q_mu);
        gram_tables_fill(g);
        muse_grammar_put(g); /* the worker's reference */
    }
    return NULL;
}

void gram_fill_async(muse_grammar *g)
{
    pthread_mutex_lock(&q_mu);
    if (!q_started) {
        pthread_t t;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        q_started = pthread_create(&t, &a, fill_worker, NULL) == 0;
        pthread_attr_destroy(&a);
        if (!q_started) { /* no thread: fill here, as muse_grammar_compile does */
            pthread_mutex_unlock(&q_mu);
            gram_tables_fill(g);
            muse_grammar_put(g);
            return;
        }
    }
    g->fill_next = NULL;
    if (q_tail)
        q_tail->fill_next = g;
    else
        q_head = g;
    q_tail = g;
    pthread_cond_signal(&q_cv);
    pthread_mutex_unlock(&q_mu);
}
