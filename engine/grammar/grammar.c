/* Compiling a schema into a grammar bound to a vocabulary, and the cache of compiled
 * grammars keyed by kind and canonical schema text. */
#include "grammar/gram_internal.h"

#include <cjson/cJSON.h>

#include "base/muse_common.h"

/* The kinds whose text is parsed (the others ignore it). */
static bool has_text(int kind)
{
    return kind == MUSE_GRAMMAR_JSON_SCHEMA || kind == MUSE_GRAMMAR_LITERALS ||
           kind == MUSE_GRAMMAR_ATEM;
}

char *muse_grammar_canonical(const char *text, size_t len)
{
    cJSON *j = cJSON_ParseWithLength(text, len);
    if (!j) return NULL;
    char *s = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    return s;
}

/* The rules only: the tables are the caller's to fill (now, or on the fill worker). */
static int compile_rules(int kind, const char *text, size_t len, const muse_gvocab *v,
                         muse_grammar **out, muse_gerr *err)
{
    memset(err, 0, sizeof *err);
    *out = NULL;
    cJSON *schema = NULL;
    if (has_text(kind)) {
        schema = cJSON_ParseWithLength(text, len);
        if (!schema) {
            snprintf(err->keyword, sizeof err->keyword, "schema");
            snprintf(err->path, sizeof err->path, "/");
            snprintf(err->msg, sizeof err->msg, "the schema is not valid JSON");
            return -1;
        }
    }
    gram_builder b = {0};
    int64_t root = gram_schema_compile(&b, schema, kind, err);
    cJSON_Delete(schema);
    if (root < 0) {
        gb_free(&b);
        return -1;
    }
    muse_grammar *g = MUSE_CALLOC(1, sizeof *g);
    gb_finish(&b, g);
    g->root = (uint32_t)root;
    g->vocab = v;
    g->kind = kind;
    g->refs = 1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    atomic_init(&g->ready, 0);
    *out = g;
    return 0;
}

int muse_grammar_compile(int kind, const char *text, size_t len, const muse_gvocab *v,
                         muse_grammar **out, muse_gerr *err)
{
    int rc = compile_rules(kind, text, len, v, out, err);
    if (rc == 0) gram_tables_fill(*out);
    return rc;
}

void muse_grammar_free(muse_grammar *g)
{
    if (!g) return;
    gram_tables_free(g);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    free(g->el);
    free(g->alts);
    free(g->rule_alt);
    free(g->rule_nalt);
    free(g->sets);
    free(g->key);
    free(g);
}

size_t muse_grammar_elements(const muse_grammar *g)
{
    return g->nel;
}

void muse_grammar_table_stats(const muse_grammar *g, muse_gtable_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!muse_grammar_ready(g)) return;
    out->bytes = g->table_bytes;
    out->tables = g->npres;
    out->untabled = g->untabled;
    out->fill_s = g->fill_s;
}

/* The cache: a short list (distinct schemas in use are few); entries stay while referenced
 * and unreferenced ones are kept for the next request up to CACHE_KEEP of them and
 * CACHE_BYTES of tables, newest first. */
#define CACHE_KEEP  64
#define CACHE_BYTES ((size_t)512 << 20)
static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static muse_grammar *cache_head;

int muse_grammar_get(int kind, const char *text, size_t len, const muse_gvocab *v,
                     muse_grammar **out, muse_gerr *err)
{
    char *key = has_text(kind) ? muse_grammar_canonical(text, len) : NULL;
    if (has_text(kind) && !key) return muse_grammar_compile(kind, text, len, v, out, err);
    pthread_mutex_lock(&cache_mu);
    for (muse_grammar *g = cache_head; g; g = g->next) {
        if (g->kind == kind && g->vocab == v &&
            ((!key && !g->key) || (key && g->key && strcmp(key, g->key) == 0))) {
            g->refs++;
            pthread_mutex_unlock(&cache_mu);
            free(key);
            *out = g;
            return 0;
        }
    }
    pthread_mutex_unlock(&cache_mu);
    if (compile_rules(kind, key ? key : text, key ? strlen(key) : len, v, out, err)) {
        free(key);
        return -1;
    }
    muse_grammar *g = *out;
    g->key = key;
    g->refs = 3; /* the caller's, the cache's and the fill worker's */
    gram_fill_async(g);
    pthread_mutex_lock(&cache_mu);
    g->next = cache_head;
    cache_head = g;
    /* drop unreferenced entries past CACHE_KEEP or CACHE_BYTES (a filled one's bytes) */
    size_t kept = 0, bytes = 0;
    for (muse_grammar **pp = &cache_head; *pp;) {
        muse_grammar *e = *pp;
        if (muse_grammar_ready(e)) bytes += e->table_bytes;
        if ((++kept > CACHE_KEEP || bytes > CACHE_BYTES) && e->refs == 1) {
            *pp = e->next;
            muse_grammar_free(e);
            continue;
        }
        pp = &e->next;
    }
    pthread_mutex_unlock(&cache_mu);
    return 0;
}

void muse_grammar_put(muse_grammar *g)
{
    if (!g) return;
    pthread_mutex_lock(&cache_mu);
    bool gone = --g->refs == 0;
    pthread_mutex_unlock(&cache_mu);
    if (gone) muse_grammar_free(g);
}
