/* The vocabulary trie: every token's bytes, children of a node contiguous and in byte
 * order, so a walk against the automaton prunes a whole subtree at its first bad byte. */
#include "grammar/gram_internal.h"

#include "base/muse_common.h"

typedef struct {
    muse_gvocab *v;
    uint32_t *ids;
} build_ctx;

static const muse_gvocab *sort_v;
static int cmp_tok(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    size_t lx = sort_v->tok_len[x], ly = sort_v->tok_len[y], m = lx < ly ? lx : ly;
    int c = m ? memcmp(sort_v->tok_bytes[x], sort_v->tok_bytes[y], m) : 0;
    if (c) return c;
    if (lx != ly) return lx < ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Fills node (whose tokens are ids[lo, hi), sharing depth bytes) and its subtree. */
static void build(build_ctx *c, size_t lo, size_t hi, size_t depth, uint32_t node)
{
    muse_gvocab *v = c->v;
    v->node_tok[node] = -1;
    v->node_depth[node] = (uint16_t)depth;
    if (depth > v->max_depth) v->max_depth = depth;
    int32_t last = -1;
    while (lo < hi && v->tok_len[c->ids[lo]] == depth) {
        uint32_t t = c->ids[lo++];
        if (last < 0)
            v->node_tok[node] = (int32_t)t;
        else
            v->dup_next[last] = t;
        last = (int32_t)t;
    }
    size_t groups = 0;
    for (size_t i = lo; i < hi;) {
        uint8_t b = v->tok_bytes[c->ids[i]][depth];
        while (i < hi && v->tok_bytes[c->ids[i]][depth] == b) i++;
        groups++;
    }
    uint32_t first = (uint32_t)v->nnodes;
    v->nnodes += groups;
    v->node_first[node] = first;
    v->node_nchild[node] = (uint16_t)groups;
    uint32_t k = first;
    for (size_t i = lo; i < hi; k++) {
        size_t j = i;
        uint8_t b = v->tok_bytes[c->ids[i]][depth];
        while (j < hi && v->tok_bytes[c->ids[j]][depth] == b) j++;
        v->node_byte[k] = b;
        v->node_parent[k] = node;
        build(c, i, j, depth + 1, k);
        i = j;
    }
}

muse_gvocab *muse_gvocab_build(const uint8_t *const *bytes, const size_t *lens, size_t n)
{
    muse_gvocab *v = MUSE_CALLOC(1, sizeof *v);
    v->n = n;
    v->tok_bytes = MUSE_CALLOC(n, sizeof *v->tok_bytes);
    v->tok_len = MUSE_CALLOC(n, sizeof *v->tok_len);
    v->dup_next = MUSE_MALLOC(n * sizeof *v->dup_next);
    size_t total = 1, m = 0;
    for (size_t i = 0; i < n; i++) {
        v->dup_next[i] = UINT32_MAX;
        size_t l = bytes[i] ? lens[i] : 0;
        if (l > 65535) l = 0; /* no real token is this long: never allowed */
        v->tok_len[i] = l;
        if (l) {
            uint8_t *p = MUSE_MALLOC(l);
            memcpy(p, bytes[i], l);
            v->tok_bytes[i] = p;
            total += l;
            m++;
        }
    }
    uint32_t *ids = MUSE_MALLOC((m ? m : 1) * sizeof *ids);
    v->text_mask = MUSE_CALLOC((n + 7) / 8 + 1, 1);
    m = 0;
    for (size_t i = 0; i < n; i++)
        if (v->tok_len[i]) v->text_mask[i >> 3] |= (uint8_t)(1u << (i & 7));
    for (size_t i = 0; i < n; i++)
        if (v->tok_len[i]) ids[m++] = (uint32_t)i;
    sort_v = v; /* qsort has no context argument; building is single-threaded at startup */
    qsort(ids, m, sizeof *ids, cmp_tok);
    v->node_first = MUSE_MALLOC(total * sizeof *v->node_first);
    v->node_nchild = MUSE_MALLOC(total * sizeof *v->node_nchild);
    v->node_byte = MUSE_CALLOC(total, 1);
    v->node_parent = MUSE_CALLOC(total, sizeof *v->node_parent);
    v->node_depth = MUSE_MALLOC(total * sizeof *v->node_depth);
    v->node_tok = MUSE_MALLOC(total * sizeof *v->node_tok);
    v->nnodes = 1;
    build_ctx c = {v, ids};
    build(&c, 0, m, 0, 0);
    free(ids);
    v->node_tok_off = MUSE_CALLOC(v->nnodes + 1, sizeof *v->node_tok_off);
    v->tok_by_node = MUSE_MALLOC((m ? m : 1) * sizeof *v->tok_by_node);
    uint32_t at = 0;
    for (size_t k = 0; k < v->nnodes; k++) {
        v->node_tok_off[k] = at;
        for (int32_t t = v->node_tok[k]; t >= 0;) {
            v->tok_by_node[at++] = (uint32_t)t;
            t = v->dup_next[t] == UINT32_MAX ? -1 : (int32_t)v->dup_next[t];
        }
    }
    v->node_tok_off[v->nnodes] = at;
    return v;
}

void muse_gvocab_free(muse_gvocab *v)
{
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) free((void *)v->tok_bytes[i]);
    free(v->tok_bytes);
    free(v->tok_len);
    free(v->dup_next);
    free(v->node_first);
    free(v->node_nchild);
    free(v->node_byte);
    free(v->node_parent);
    free(v->node_depth);
    free(v->node_tok);
    free(v->node_tok_off);
    free(v->tok_by_node);
    free(v->text_mask);
    free(v);
}

size_t muse_gvocab_size(const muse_gvocab *v)
{
    return v->n;
}

const uint8_t *muse_gvocab_text_mask(const muse_gvocab *v)
{
    return v->text_mask;
}

const uint8_t *muse_gvocab_token(const muse_gvocab *v, int32_t t, size_t *len)
{
    *len = 0;
    if (t < 0 || (size_t)t >= v->n || !v->tok_len[t]) return NULL;
    *len = v->tok_len[t];
    return v->tok_bytes[t];
}
