/* Byte-level BPE tokenizer: loads a Hugging Face tokenizer.json, pre-tokenizes with PCRE2,
 * merges lowest rank first, and decodes as a UTF-8 stream. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "text/tokenizer.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <pcre2.h>

#define MAX_TOKEN_ID   (1 << 24) /* far above any real vocabulary; bounds ids from the file */
#define MAX_FILE_BYTES (1L << 30)
#define MAX_PRE_STEPS  8
#define SMALL_PIECE    48 /* pieces up to this many bytes merge by scanning, longer by heap */
#define NO_RANK        INT32_MAX
#define GPT2_SPLIT_REGEX                                                                           \
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

typedef struct {
    uint32_t off, len;
} token_span;

/* bytes -> id, open addressing; keys live in the tokenizer's arena. */
typedef struct {
    uint32_t hash;
    int32_t id; /* -1: empty */
} bytes_slot;

/* (left id, right id) -> (rank, merged id), open addressing. */
typedef struct {
    uint64_t key; /* UINT64_MAX: empty */
    int32_t rank, merged;
} pair_slot;

typedef enum { STEP_SPLIT, STEP_BYTELEVEL } step_kind;

typedef struct {
    step_kind kind;
    pcre2_code *re; /* NULL: no split in this step (ByteLevel without use_regex) */
    int remove_matches, invert, add_prefix_space;
} pre_step;

struct muse_tokenizer {
    uint8_t *arena;
    token_span *tokens; /* by id; len UINT32_MAX marks an unused id */
    uint8_t *flags;     /* by id: TOKEN_ADDED | TOKEN_SPECIAL */
    int64_t vocab_size;
    size_t max_token_len;
    int32_t byte_id[256];
    bytes_slot *vocab_map;
    uint32_t vocab_mask;
    pair_slot *pairs;
    uint32_t pairs_mask;
    int ignore_merges;
    pre_step steps[MAX_PRE_STEPS];
    int nsteps;
    int32_t *added_ids;
    size_t nadded;
};

enum { TOKEN_ADDED = 1, TOKEN_SPECIAL = 2 };
#define NO_TOKEN UINT32_MAX

/* ---- hashing ---- */

static uint32_t hash_bytes(const uint8_t *s, size_t n)
{
    uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    return (uint32_t)h;
}

static uint32_t hash_pair(uint64_t key)
{
    key *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(key >> 32);
}

static uint32_t table_size_for(size_t n)
{
    uint32_t size = 16;
    while (size < 2 * n) size *= 2;
    return size;
}

static const uint8_t *token_ptr(const muse_tokenizer *t, int32_t id)
{
    return t->arena + t->tokens[id].off;
}

static int32_t vocab_lookup(const muse_tokenizer *t, const uint8_t *s, size_t n)
{
    uint32_t h = hash_bytes(s, n);
    for (uint32_t i = h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        const bytes_slot *slot = &t->vocab_map[i];
        if (slot->id < 0) return -1;
        if (slot->hash == h && t->tokens[slot->id].len == n &&
            memcmp(token_ptr(t, slot->id), s, n) == 0)
            return slot->id;
    }
}

/* Adds id under its bytes; returns the id already there when the bytes repeat, else -1. */
static int32_t vocab_insert(muse_tokenizer *t, int32_t id)
{
    const uint8_t *s = token_ptr(t, id);
    size_t n = t->tokens[id].len;
    uint32_t h = hash_bytes(s, n);
    for (uint32_t i = h & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        bytes_slot *slot = &t->vocab_map[i];
        if (slot->id < 0) {
            slot->id = id;
            slot->hash = h;
            return -1;
        }
        if (slot->hash == h && t->tokens[slot->id].len == n &&
            memcmp(token_ptr(t, slot->id), s, n) == 0)
            return slot->id;
    }
}

static const pair_slot *pair_lookup(const muse_tokenizer *t, int32_t left, int32_t right)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = hash_pair(key) & t->pairs_mask;; i = (i + 1) & t->pairs_mask) {
        const pair_slot *slot = &t->pairs[i];
        if (slot->key == key) return slot;
        if (slot->key == UINT64_MAX) return NULL;
    }
}

/* Keeps the first (lowest-ranked) merge of a pair, as Hugging Face does. */
static void pair_insert(muse_tokenizer *t, int32_t left, int32_t right, int32_t rank,
                        int32_t merged)
{
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t i = hash_pair(key) & t->pairs_mask;; i = (i + 1) & t->pairs_mask) {
        pair_slot *slot = &t->pairs[i];
        if (slot->key == key) return;
        if (slot->key == UINT64_MAX) {
            slot->key = key;
            slot->rank = rank;
            slot->merged = merged;
            return;
        }
    }
}

/* ---- UTF-8 ---- */

/* Decodes one code point at s (n bytes available); returns its length, 0 when invalid. */
static int utf8_decode(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (n == 0) return 0;
    uint8_t b = s[0];
    if (b < 0x80) {
        *cp = b;
        return 1;
    }
    int len = b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 0;
    if (len == 0 || (size_t)len > n) return 0;
    uint32_t c = b & (0x7F >> len);
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        c = c << 6 | (s[i] & 0x3F);
    }
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (c < min_cp[len] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return 0;
    *cp = c;
    return len;
}

/* ---- byte-level alphabet (GPT-2's bytes_to_unicode) ---- */

static int is_printable_byte(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
}

/* unicode_to_byte[cp] for cp < 324, or -1. */
static void build_unicode_to_byte(int16_t table[324])
{
    for (int i = 0; i < 324; i++) table[i] = -1;
    int shifted = 0;
    for (int b = 0; b < 256; b++) table[is_printable_byte(b) ? b : 256 + shifted++] = (int16_t)b;
}

/* Undoes the byte-level mapping of a vocab string into out (capacity >= strlen(s)). */
static int bytelevel_decode(const int16_t table[324], const char *s, uint8_t *out, size_t *len)
{
    size_t n = strlen(s), o = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        int l = utf8_decode((const uint8_t *)s + i, n - i, &cp);
        if (l == 0 || cp >= 324 || table[cp] < 0) return -1;
        out[o++] = (uint8_t)table[cp];
        i += (size_t)l;
    }
    *len = o;
    return 0;
}

/* ---- loading ---- */

typedef struct {
    uint8_t *data;
    size_t len, cap;
} byte_buf;

static uint32_t arena_add(byte_buf *b, const uint8_t *s, size_t n)
{
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->len + n) cap *= 2;
        uint8_t *grown = realloc(b->data, cap);
        MUSE_CHECK(grown != NULL);
        b->data = grown;
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    uint32_t off = (uint32_t)b->len;
    b->len += n;
    return off;
}

static int read_whole_file(const char *path, char **out, size_t *len, muse_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f) return muse_fail(e, "tokenizer %s: cannot open: %s", path, strerror(errno));
    byte_buf b = {0};
    uint8_t chunk[65536];
    size_t got;
    while ((got = fread(chunk, 1, sizeof chunk, f)) > 0) {
        if (b.len + got > (size_t)MAX_FILE_BYTES) {
            fclose(f);
            free(b.data);
            return muse_fail(e, "tokenizer %s: larger than %ld bytes", path, MAX_FILE_BYTES);
        }
        arena_add(&b, chunk, got);
    }
    int failed = ferror(f);
    fclose(f);
    if (failed) {
        free(b.data);
        return muse_fail(e, "tokenizer %s: read error", path);
    }
    *out = (char *)b.data;
    *len = b.len;
    return 0;
}

static int json_id(const cJSON *v, const char *where, const char *name, int32_t *id, muse_err *e)
{
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble >= MAX_TOKEN_ID ||
        v->valuedouble != (double)(int32_t)v->valuedouble)
        return muse_fail(e, "%s '%s': id must be an integer in [0, %d)", where, name, MAX_TOKEN_ID);
    *id = (int32_t)v->valuedouble;
    return 0;
}

static int is_null_or_absent(const cJSON *v)
{
    return !v || cJSON_IsNull(v);
}

static int compile_regex(const char *pattern, pcre2_code **out, const char *where, muse_err *e)
{
    int code;
    PCRE2_SIZE at;
    pcre2_code *re =
        pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                      PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &code, &at, NULL);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return muse_fail(e, "%s: regex does not compile at offset %zu: %s", where, (size_t)at,
                         (const char *)msg);
    }
    (void)pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter still works */
    *out = re;
    return 0;
}

static int parse_split(const cJSON *p, pre_step *step, muse_err *e)
{
    const cJSON *pattern = cJSON_GetObjectItemCaseSensitive(p, "pattern");
    const cJSON *regex = cJSON_GetObjectItemCaseSensitive(pattern, "Regex");
    if (!cJSON_IsString(regex)) {
        if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(pattern, "String")))
            return muse_fail(e, "pre_tokenizer Split: pattern type \"String\" is not supported; "
                                "only {\"Regex\": ...}");
        return muse_fail(e, "pre_tokenizer Split: pattern.Regex missing");
    }
    const cJSON *behavior = cJSON_GetObjectItemCaseSensitive(p, "behavior");
    const char *b = cJSON_IsString(behavior) ? behavior->valuestring : "(missing)";
    if (strcmp(b, "Isolated") == 0)
        step->remove_matches = 0;
    else if (strcmp(b, "Removed") == 0)
        step->remove_matches = 1;
    else
        return muse_fail(e,
                         "pre_tokenizer Split: behavior \"%s\" is not supported; "
                         "supported: \"Isolated\", \"Removed\"",
                         b);
    step->kind = STEP_SPLIT;
    step->invert = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "invert"));
    return compile_regex(regex->valuestring, &step->re, "pre_tokenizer Split pattern", e);
}

static int parse_bytelevel(const cJSON *p, pre_step *step, muse_err *e)
{
    step->kind = STEP_BYTELEVEL;
    step->add_prefix_space = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(p, "add_prefix_space"));
    const cJSON *use_regex = cJSON_GetObjectItemCaseSensitive(p, "use_regex");
    if (use_regex && !cJSON_IsTrue(use_regex)) return 0; /* HF's default is true */
    return compile_regex(GPT2_SPLIT_REGEX, &step->re, "pre_tokenizer ByteLevel", e);
}

static int parse_pre_step(muse_tokenizer *t, const cJSON *p, muse_err *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(p, "type");
    const char *name = cJSON_IsString(type) ? type->valuestring : "(missing)";
    if (t->nsteps == MAX_PRE_STEPS)
        return muse_fail(e, "pre_tokenizer: more than %d steps", MAX_PRE_STEPS);
    pre_step *step = &t->steps[t->nsteps];
    int rc;
    if (strcmp(name, "Split") == 0)
        rc = parse_split(p, step, e);
    else if (strcmp(name, "ByteLevel") == 0)
        rc = parse_bytelevel(p, step, e);
    else
        return muse_fail(e,
                         "pre_tokenizer type \"%s\" is not supported; supported: Sequence of "
                         "Split (Regex) and ByteLevel",
                         name);
    if (rc == 0) t->nsteps++;
    return rc;
}

static int parse_pre_tokenizer(muse_tokenizer *t, const cJSON *root, muse_err *e)
{
    const cJSON *pre = cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer");
    if (is_null_or_absent(pre))
        return muse_fail(e, "pre_tokenizer is null; byte-level BPE needs a ByteLevel step");
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(pre, "type");
    if (cJSON_IsString(type) && strcmp(type->valuestring, "Sequence") == 0) {
        const cJSON *item;
        cJSON_ArrayForEach(item, cJSON_GetObjectItemCaseSensitive(pre, "pretokenizers"))
        {
            if (parse_pre_step(t, item, e)) return -1;
        }
    } else if (parse_pre_step(t, pre, e)) {
        return -1;
    }
    for (int i = 0; i < t->nsteps; i++)
        if (t->steps[i].kind == STEP_BYTELEVEL) return 0;
    return muse_fail(e, "pre_tokenizer has no ByteLevel step; only byte-level BPE is supported");
}

static int check_model_options(const cJSON *model, muse_err *e)
{
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(model, "type");
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "BPE") != 0)
        return muse_fail(e, "model.type \"%s\" is not supported; only \"BPE\"",
                         cJSON_IsString(type) ? type->valuestring : "(missing)");
    static const char *const must_be_empty[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (size_t i = 0; i < 2; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, must_be_empty[i]);
        if (!is_null_or_absent(v) && !(cJSON_IsString(v) && v->valuestring[0] == '\0'))
            return muse_fail(e, "model.%s is not supported by byte-level BPE; must be null",
                             must_be_empty[i]);
    }
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "byte_fallback")))
        return muse_fail(e, "model.byte_fallback true is not supported; byte-level BPE only");
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (cJSON_IsNumber(dropout) && dropout->valuedouble != 0)
        return muse_fail(e, "model.dropout must be null for inference");
    return 0;
}

static int check_normalizer(const cJSON *root, muse_err *e)
{
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "normalizer");
    if (is_null_or_absent(norm)) return 0;
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(norm, "type");
    return muse_fail(e, "normalizer type \"%s\" is not supported; must be null",
                     cJSON_IsString(type) ? type->valuestring : "(missing)");
}

/* Highest id + 1 over model.vocab and added_tokens. */
static int count_ids(const cJSON *vocab, const cJSON *added, int64_t *size, muse_err *e)
{
    int64_t top = -1;
    const cJSON *item;
    cJSON_ArrayForEach(item, vocab)
    {
        int32_t id = 0;
        if (json_id(item, "model.vocab", item->string, &id, e)) return -1;
        if (id > top) top = id;
    }
    cJSON_ArrayForEach(item, added)
    {
        int32_t id = 0;
        const cJSON *content = cJSON_GetObjectItemCaseSensitive(item, "content");
        if (!cJSON_IsString(content))
            return muse_fail(e, "added_tokens: an entry has no string \"content\"");
        if (json_id(cJSON_GetObjectItemCaseSensitive(item, "id"), "added_tokens",
                    content->valuestring, &id, e))
            return -1;
        if (id > top) top = id;
    }
    if (top < 255) return muse_fail(e, "model.vocab: too small for byte-level BPE");
    *size = top + 1;
    return 0;
}

static int load_vocab(muse_tokenizer *t, const cJSON *vocab, byte_buf *arena, muse_err *e)
{
    int16_t table[324];
    build_unicode_to_byte(table);
    uint8_t *scratch = NULL;
    size_t scratch_cap = 0, count = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, vocab)
    {
        size_t n = strlen(item->string), len;
        int32_t id = (int32_t)item->valuedouble;
        if (n > scratch_cap) {
            free(scratch);
            scratch_cap = n * 2;
            scratch = MUSE_MALLOC(scratch_cap);
        }
        if (bytelevel_decode(table, item->string, scratch, &len)) {
            free(scratch);
            return muse_fail(e, "model.vocab '%s' (id %d): not a byte-level string", item->string,
                             id);
        }
        if (t->tokens[id].len != NO_TOKEN) {
            free(scratch);
            return muse_fail(e, "model.vocab: id %d is used twice ('%s')", id, item->string);
        }
        t->tokens[id].off = arena_add(arena, scratch, len);
        t->tokens[id].len = (uint32_t)len;
        if (len > t->max_token_len) t->max_token_len = len;
        count++;
    }
    free(scratch);
    /* The arena is final now, so the map can point into it. */
    t->arena = arena->data;
    t->vocab_mask = table_size_for(count) - 1;
    t->vocab_map = MUSE_MALLOC((size_t)(t->vocab_mask + 1) * sizeof *t->vocab_map);
    for (uint32_t i = 0; i <= t->vocab_mask; i++) t->vocab_map[i].id = -1;
    for (int64_t id = 0; id < t->vocab_size; id++) {
        if (t->tokens[id].len == NO_TOKEN) continue;
        int32_t other = vocab_insert(t, (int32_t)id);
        if (other >= 0)
            return muse_fail(e, "model.vocab: ids %d and %d stand for the same bytes", other,
                             (int)id);
    }
    for (int b = 0; b < 256; b++) {
        uint8_t byte = (uint8_t)b;
        t->byte_id[b] = vocab_lookup(t, &byte, 1);
    }
    return 0;
}

/* Splits one merges entry ("a b" or ["a", "b"]) into its two strings. */
static int merge_parts(const cJSON *m, size_t index, char **left, char **right, muse_err *e)
{
    if (cJSON_IsString(m)) {
        const char *s = m->valuestring, *space = strchr(s, ' ');
        if (!space || strchr(space + 1, ' '))
            return muse_fail(e, "model.merges[%zu] '%s': expected two tokens split by a space",
                             index, s);
        *left = strndup(s, (size_t)(space - s));
        *right = strdup(space + 1);
    } else if (cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 &&
               cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
               cJSON_IsString(cJSON_GetArrayItem(m, 1))) {
        *left = strdup(cJSON_GetArrayItem(m, 0)->valuestring);
        *right = strdup(cJSON_GetArrayItem(m, 1)->valuestring);
    } else {
        return muse_fail(e, "model.merges[%zu]: expected \"a b\" or [\"a\", \"b\"]", index);
    }
    MUSE_CHECK(*left && *right);
    return 0;
}

static int32_t lookup_vocab_string(const muse_tokenizer *t, const int16_t table[324], const char *s)
{
    size_t n = strlen(s), len;
    uint8_t *bytes = MUSE_MALLOC(n + 1);
    int32_t id = bytelevel_decode(table, s, bytes, &len) ? -1 : vocab_lookup(t, bytes, len);
    free(bytes);
    return id;
}

static int load_merge(muse_tokenizer *t, const int16_t table[324], const cJSON *m, size_t rank,
                      muse_err *e)
{
    char *left_s = NULL, *right_s = NULL;
    if (merge_parts(m, rank, &left_s, &right_s, e)) return -1;
    int32_t left = lookup_vocab_string(t, table, left_s);
    int32_t right = lookup_vocab_string(t, table, right_s);
    int rc = 0;
    if (left < 0 || right < 0) {
        rc = muse_fail(e, "model.merges[%zu] '%s %s': '%s' is not in model.vocab", rank, left_s,
                       right_s, left < 0 ? left_s : right_s);
    } else {
        size_t ll = t->tokens[left].len, rl = t->tokens[right].len;
        uint8_t *joined = MUSE_MALLOC(ll + rl);
        memcpy(joined, token_ptr(t, left), ll);
        memcpy(joined + ll, token_ptr(t, right), rl);
        int32_t merged = vocab_lookup(t, joined, ll + rl);
        free(joined);
        if (merged < 0)
            rc = muse_fail(e, "model.merges[%zu] '%s %s': the merged token is not in model.vocab",
                           rank, left_s, right_s);
        else
            pair_insert(t, left, right, (int32_t)rank, merged);
    }
    free(left_s);
    free(right_s);
    return rc;
}

static int load_merges(muse_tokenizer *t, const cJSON *merges, muse_err *e)
{
    if (!cJSON_IsArray(merges)) return muse_fail(e, "model.merges: missing or not a list");
    int16_t table[324];
    build_unicode_to_byte(table);
    size_t n = (size_t)cJSON_GetArraySize(merges);
    if (n >= INT32_MAX / 2) return muse_fail(e, "model.merges: too many entries");
    t->pairs_mask = table_size_for(n) - 1;
    t->pairs = MUSE_MALLOC((size_t)(t->pairs_mask + 1) * sizeof *t->pairs);
    for (uint32_t i = 0; i <= t->pairs_mask; i++) t->pairs[i].key = UINT64_MAX;
    size_t rank = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, merges)
    {
        if (load_merge(t, table, m, rank++, e)) return -1;
    }
    return 0;
}

/* Added tokens decode to their content; they are never produced from text. */
static int load_added(muse_tokenizer *t, const cJSON *added, byte_buf *arena, muse_err *e)
{
    size_t n = (size_t)cJSON_GetArraySize(added);
    t->added_ids = MUSE_MALLOC(n * sizeof *t->added_ids);
    const cJSON *item;
    cJSON_ArrayForEach(item, added)
    {
        const char *content = cJSON_GetObjectItemCaseSensitive(item, "content")->valuestring;
        int32_t id = (int32_t)cJSON_GetObjectItemCaseSensitive(item, "id")->valuedouble;
        if (t->flags[id] & TOKEN_ADDED)
            return muse_fail(e, "added_tokens: id %d is listed twice ('%s')", id, content);
        size_t len = strlen(content);
        if (len >= UINT32_MAX / 2)
            return muse_fail(e, "added_tokens '%.40s...': content too long", content);
        t->tokens[id].off = arena_add(arena, (const uint8_t *)content, len);
        t->tokens[id].len = (uint32_t)len;
        if (len > t->max_token_len) t->max_token_len = len;
        t->flags[id] |= TOKEN_ADDED;
        if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(item, "special")))
            t->flags[id] |= TOKEN_SPECIAL;
        t->added_ids[t->nadded++] = id;
    }
    t->arena = arena->data;
    return 0;
}

static int load_from_json(muse_tokenizer *t, const cJSON *root, muse_err *e)
{
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (!cJSON_IsObject(model)) return muse_fail(e, "\"model\" missing or not an object");
    if (check_model_options(model, e) || check_normalizer(root, e)) return -1;
    if (parse_pre_tokenizer(t, root, e)) return -1;
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(model, "vocab");
    if (!cJSON_IsObject(vocab)) return muse_fail(e, "model.vocab missing or not an object");
    const cJSON *added = cJSON_GetObjectItemCaseSensitive(root, "added_tokens");
    if (!is_null_or_absent(added) && !cJSON_IsArray(added))
        return muse_fail(e, "added_tokens: not a list");
    if (count_ids(vocab, added, &t->vocab_size, e)) return -1;
    t->tokens = MUSE_MALLOC((size_t)t->vocab_size * sizeof *t->tokens);
    for (int64_t i = 0; i < t->vocab_size; i++) t->tokens[i].len = NO_TOKEN;
    t->flags = MUSE_CALLOC((size_t)t->vocab_size, 1);
    t->ignore_merges = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(model, "ignore_merges"));
    byte_buf arena = {0};
    int rc = load_vocab(t, vocab, &arena, e);
    if (rc == 0) rc = load_merges(t, cJSON_GetObjectItemCaseSensitive(model, "merges"), e);
    if (rc == 0) rc = load_added(t, added, &arena, e);
    t->arena = arena.data;
    return rc;
}

int muse_tokenizer_load(const char *path, muse_tokenizer **out, muse_err *e)
{
    *out = NULL;
    char *text;
    size_t len;
    if (read_whole_file(path, &text, &len, e)) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!root) return muse_fail(e, "tokenizer %s: not valid JSON", path);
    muse_tokenizer *t = MUSE_CALLOC(1, sizeof *t);
    muse_err inner;
    int rc = load_from_json(t, root, &inner);
    cJSON_Delete(root);
    if (rc) {
        muse_tokenizer_free(t);
        return muse_fail(e, "tokenizer %s: %s", path, inner.msg);
    }
    *out = t;
    return 0;
}

void muse_tokenizer_free(muse_tokenizer *t)
{
    if (!t) return;
    for (int i = 0; i < t->nsteps; i++) pcre2_code_free(t->steps[i].re);
    free(t->arena);
    free(t->tokens);
    free(t->flags);
    free(t->vocab_map);
    free(t->pairs);
    free(t->added_ids);
    free(t);
}

/* ---- queries ---- */

int64_t muse_tokenizer_vocab_size(const muse_tokenizer *t)
{
    return t->vocab_size;
}

size_t muse_tokenizer_max_token_bytes(const muse_tokenizer *t)
{
    return t->max_token_len;
}

int32_t muse_tokenizer_special_id(const muse_tokenizer *t, const char *content)
{
    size_t n = strlen(content);
    for (size_t i = 0; i < t->nadded; i++) {
        int32_t id = t->added_ids[i];
        if (t->tokens[id].len == n && memcmp(token_ptr(t, id), content, n) == 0) return id;
    }
    return -1;
}

int muse_tokenizer_is_special(const muse_tokenizer *t, int32_t id)
{
    return id >= 0 && id < t->vocab_size && (t->flags[id] & TOKEN_SPECIAL);
}

const uint8_t *muse_tokenizer_token_bytes(const muse_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || id >= t->vocab_size || t->tokens[id].len == NO_TOKEN) return NULL;
    *len = t->tokens[id].len;
    return token_ptr(t, id);
}

/* ---- encoding ---- */

typedef struct {
    int32_t rank, pos, left, right, merged;
} merge_cand;

typedef struct {
    const muse_tokenizer *t;
    pcre2_match_data *match;
    int32_t **ids;
    size_t *n, *cap;
    muse_err *e;
    /* BPE scratch, grown to the longest piece */
    size_t scratch_cap;
    int32_t *sym, *rank, *merged, *next, *prev;
    merge_cand *heap;
    size_t nheap;
} encoder;

static void push_id(encoder *c, int32_t id)
{
    if (*c->n == *c->cap) {
        size_t cap = *c->cap ? *c->cap * 2 : 256;
        int32_t *grown = realloc(*c->ids, cap * sizeof *grown);
        MUSE_CHECK(grown != NULL);
        *c->ids = grown;
        *c->cap = cap;
    }
    (*c->ids)[(*c->n)++] = id;
}

static void grow_scratch(encoder *c, size_t n)
{
    if (n <= c->scratch_cap) return;
    size_t cap = c->scratch_cap ? c->scratch_cap : 64;
    while (cap < n) cap *= 2;
    int32_t **arrays[] = {&c->sym, &c->rank, &c->merged, &c->next, &c->prev};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) {
        free(*arrays[i]);
        *arrays[i] = MUSE_MALLOC(cap * sizeof(int32_t));
    }
    free(c->heap);
    c->heap = MUSE_MALLOC(cap * 3 * sizeof *c->heap); /* each merge pushes at most 2 */
    c->scratch_cap = cap;
}

static void pair_rank(const muse_tokenizer *t, int32_t left, int32_t right, int32_t *rank,
                      int32_t *merged)
{
    const pair_slot *p = pair_lookup(t, left, right);
    *rank = p ? p->rank : NO_RANK;
    *merged = p ? p->merged : -1;
}

/* Short pieces: rescan the pair ranks for the lowest (leftmost on ties) each merge. */
static void bpe_scan(encoder *c, size_t n)
{
    const muse_tokenizer *t = c->t;
    int32_t *sym = c->sym, *rank = c->rank, *merged = c->merged;
    for (size_t i = 0; i + 1 < n; i++) pair_rank(t, sym[i], sym[i + 1], &rank[i], &merged[i]);
    while (n > 1) {
        size_t best = 0;
        for (size_t i = 1; i + 1 < n; i++)
            if (rank[i] < rank[best]) best = i;
        if (rank[best] == NO_RANK) break;
        sym[best] = merged[best];
        size_t tail = n - best - 2;
        memmove(sym + best + 1, sym + best + 2, tail * sizeof *sym);
        memmove(rank + best + 1, rank + best + 2, (tail ? tail - 1 : 0) * sizeof *rank);
        memmove(merged + best + 1, merged + best + 2, (tail ? tail - 1 : 0) * sizeof *merged);
        n--;
        if (best > 0) pair_rank(t, sym[best - 1], sym[best], &rank[best - 1], &merged[best - 1]);
        if (best + 1 < n) pair_rank(t, sym[best], sym[best + 1], &rank[best], &merged[best]);
    }
    for (size_t i = 0; i < n; i++) push_id(c, sym[i]);
}

static int cand_less(const merge_cand *a, const merge_cand *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(encoder *c, merge_cand m)
{
    size_t i = c->nheap++;
    while (i > 0 && cand_less(&m, &c->heap[(i - 1) / 2])) {
        c->heap[i] = c->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    c->heap[i] = m;
}

static merge_cand heap_pop(encoder *c)
{
    merge_cand top = c->heap[0], last = c->heap[--c->nheap];
    size_t i = 0;
    for (;;) {
        size_t child = 2 * i + 1;
        if (child >= c->nheap) break;
        if (child + 1 < c->nheap && cand_less(&c->heap[child + 1], &c->heap[child])) child++;
        if (!cand_less(&c->heap[child], &last)) break;
        c->heap[i] = c->heap[child];
        i = child;
    }
    c->heap[i] = last;
    return top;
}

static void push_candidate(encoder *c, int32_t pos)
{
    int32_t right = c->next[pos];
    if (pos < 0 || right < 0) return;
    merge_cand m = {.pos = pos, .left = c->sym[pos], .right = c->sym[right]};
    pair_rank(c->t, m.left, m.right, &m.rank, &m.merged);
    if (m.rank != NO_RANK) heap_push(c, m);
}

/* Long pieces: linked symbols and a heap of candidate merges, checked when popped. */
static void bpe_heap(encoder *c, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        c->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
        c->prev[i] = (int32_t)i - 1;
    }
    c->nheap = 0;
    for (size_t i = 0; i + 1 < n; i++) push_candidate(c, (int32_t)i);
    while (c->nheap > 0) {
        merge_cand m = heap_pop(c);
        int32_t right = c->next[m.pos];
        if (c->sym[m.pos] != m.left || right < 0 || c->sym[right] != m.right) continue; /* stale */
        c->sym[m.pos] = m.merged;
        c->sym[right] = -1;
        c->next[m.pos] = c->next[right];
        if (c->next[right] >= 0) c->prev[c->next[right]] = m.pos;
        if (c->prev[m.pos] >= 0) push_candidate(c, c->prev[m.pos]);
        push_candidate(c, m.pos);
    }
    for (int32_t i = 0; i >= 0; i = c->next[i]) push_id(c, c->sym[i]);
}

static void bpe_piece(encoder *c, const uint8_t *s, size_t len)
{
    const muse_tokenizer *t = c->t;
    if (t->ignore_merges || len == 1) {
        int32_t whole = vocab_lookup(t, s, len);
        if (whole >= 0) {
            push_id(c, whole);
            return;
        }
    }
    grow_scratch(c, len);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) /* a byte missing from the vocab is dropped, as HF does */
        if (t->byte_id[s[i]] >= 0) c->sym[n++] = t->byte_id[s[i]];
    if (n == 0) return;
    if (n <= SMALL_PIECE)
        bpe_scan(c, n);
    else
        bpe_heap(c, n);
}

static int run_steps(encoder *c, int step, const uint8_t *s, size_t len);

static int emit_region(encoder *c, int step, const uint8_t *s, size_t len, int is_match)
{
    const pre_step *p = &c->t->steps[step];
    int delimiter = p->invert ? !is_match : is_match;
    if (len == 0 || (p->remove_matches && delimiter)) return 0;
    return run_steps(c, step + 1, s, len);
}

static int split_with(encoder *c, int step, const pcre2_code *re, const uint8_t *s, size_t len)
{
    size_t pos = 0;
    while (pos < len) {
        int rc = pcre2_match(re, s, len, pos, PCRE2_NOTEMPTY, c->match, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return muse_fail(c->e, "tokenize: pre-tokenizer regex failed at byte %zu: %s", pos,
                             (const char *)msg);
        }
        const PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->match);
        if (emit_region(c, step, s + pos, ov[0] - pos, 0)) return -1;
        if (emit_region(c, step, s + ov[0], ov[1] - ov[0], 1)) return -1;
        pos = ov[1];
    }
    return emit_region(c, step, s + pos, len - pos, 0);
}

static int bytelevel_step(encoder *c, int step, const uint8_t *s, size_t len)
{
    const pre_step *p = &c->t->steps[step];
    uint8_t *prefixed = NULL;
    if (p->add_prefix_space && s[0] != ' ') {
        prefixed = MUSE_MALLOC(len + 1);
        prefixed[0] = ' ';
        memcpy(prefixed + 1, s, len);
        s = prefixed;
        len++;
    }
    int rc = p->re ? split_with(c, step, p->re, s, len) : run_steps(c, step + 1, s, len);
    free(prefixed);
    return rc;
}

/* Applies pre-tokenizer step `step` and the later ones to one piece, then BPE. */
static int run_steps(encoder *c, int step, const uint8_t *s, size_t len)
{
    if (len == 0) return 0;
    if (step == c->t->nsteps) {
        bpe_piece(c, s, len);
        return 0;
    }
    const pre_step *p = &c->t->steps[step];
    if (p->kind == STEP_BYTELEVEL) return bytelevel_step(c, step, s, len);
    return split_with(c, step, p->re, s, len);
}

int muse_tokenize(const muse_tokenizer *t, const char *text, size_t len, int32_t **ids, size_t *n,
                  size_t *cap, muse_err *e)
{
    if (len > (size_t)INT32_MAX / 2) return muse_fail(e, "tokenize: text longer than 1 GiB");
    encoder c = {.t = t, .ids = ids, .n = n, .cap = cap, .e = e};
    c.match = pcre2_match_data_create(4, NULL);
    MUSE_CHECK(c.match != NULL);
    int rc = run_steps(&c, 0, (const uint8_t *)text, len);
    pcre2_match_data_free(c.match);
    int32_t *arrays[] = {c.sym, c.rank, c.merged, c.next, c.prev};
    for (size_t i = 0; i < sizeof arrays / sizeof arrays[0]; i++) free(arrays[i]);
    free(c.heap);
    return rc;
}

/* ---- streaming decode ---- */

typedef struct {
    char *out;
    size_t len, cap;
} out_buf;

static void put_bytes(out_buf *o, const void *s, size_t n)
{
    MUSE_CHECK(o->len + n <= o->cap); /* the caller sized out by muse_detok_bound */
    memcpy(o->out + o->len, s, n);
    o->len += n;
}

static void put_replacement(out_buf *o)
{
    put_bytes(o, "\xEF\xBF\xBD", 3);
}

static int utf8_length_of_lead(uint8_t b)
{
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

/* Whether b may follow the held bytes (the second byte's range depends on the lead). */
static int continues(const muse_detok *d, uint8_t b)
{
    if (d->nheld == 1) {
        switch (d->held[0]) {
        case 0xE0:
            return b >= 0xA0 && b <= 0xBF;
        case 0xED:
            return b >= 0x80 && b <= 0x9F;
        case 0xF0:
            return b >= 0x90 && b <= 0xBF;
        case 0xF4:
            return b >= 0x80 && b <= 0x8F;
        default:
            break;
        }
    }
    return b >= 0x80 && b <= 0xBF;
}

/* Feeds one byte: whole characters go out, a maximal invalid prefix becomes one U+FFFD. */
static void detok_byte(muse_detok *d, uint8_t b, out_buf *o)
{
    if (d->nheld > 0) {
        if (continues(d, b)) {
            d->held[d->nheld++] = b;
            if (d->nheld == utf8_length_of_lead(d->held[0])) {
                put_bytes(o, d->held, (size_t)d->nheld);
                d->nheld = 0;
            }
            return;
        }
        put_replacement(o);
        d->nheld = 0;
    }
    if (b < 0x80)
        put_bytes(o, &b, 1);
    else if (utf8_length_of_lead(b))
        d->held[d->nheld++] = b;
    else
        put_replacement(o);
}

size_t muse_detok_bound(const muse_tokenizer *t, int32_t id)
{
    size_t len = 0;
    if (!muse_tokenizer_token_bytes(t, id, &len)) return 0;
    return 3 * (len + 3); /* every byte, held ones included, could become U+FFFD */
}

long muse_detok_push(const muse_tokenizer *t, muse_detok *d, int32_t id, char *out, size_t cap)
{
    size_t len;
    const uint8_t *bytes = muse_tokenizer_token_bytes(t, id, &len);
    if (!bytes) return -1;
    out_buf o = {out, 0, cap};
    for (size_t i = 0; i < len; i++) detok_byte(d, bytes[i], &o);
    return (long)o.len;
}

long muse_detok_finish(muse_detok *d, char *out, size_t cap)
{
    out_buf o = {out, 0, cap};
    if (d->nheld > 0) put_replacement(&o);
    d->nheld = 0;
    return (long)o.len;
}

const uint8_t *muse_tokenizer_text_bytes(void *tokenizer, int32_t id, size_t *len)
{
    const muse_tokenizer *t = tokenizer;
    if (muse_tokenizer_is_special(t, id)) {
        *len = 0;
        return NULL;
    }
    return muse_tokenizer_token_bytes(t, id, len);
}
