/* safetensors: parse and check headers, mmap one file or an indexed set of shards, write files.
 * Nothing from a file is trusted: every length, offset, shape and name is checked first. */
#include "pack/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define ST_MAX_HEADER_BYTES 100000000ull /* what the reference implementation accepts */
#define ST_MAX_INDEX_BYTES  100000000ull
#define ST_MAX_EXACT_INT    9007199254740992.0 /* 2^53: larger JSON numbers lose digits */
#define ST_INDEX_NAME       "model.safetensors.index.json"
#define ST_SUFFIX           ".safetensors"
#define ST_CORRUPT          "the file is corrupt or truncated, re-download or re-make the pack"

static const char *const dtype_names[MUSE_DT_COUNT] = {"F16", "BF16", "F32", "I16", "I32"};
static const size_t dtype_sizes[MUSE_DT_COUNT] = {2, 2, 4, 2, 4};

const char *muse_dtype_name(muse_dtype dt)
{
    MUSE_CHECK((unsigned)dt < MUSE_DT_COUNT);
    return dtype_names[dt];
}

size_t muse_dtype_size(muse_dtype dt)
{
    MUSE_CHECK((unsigned)dt < MUSE_DT_COUNT);
    return dtype_sizes[dt];
}

int muse_dtype_parse(const char *s, muse_dtype *out)
{
    for (int i = 0; s && i < MUSE_DT_COUNT; i++) {
        if (strcmp(s, dtype_names[i]) == 0) {
            *out = (muse_dtype)i;
            return 0;
        }
    }
    return -1;
}

/* ---- name table: open addressing over borrowed keys, for ~100k tensors ---- */

typedef struct {
    const char *key; /* NULL: empty slot */
    size_t val;
} name_slot;

typedef struct {
    name_slot *slots;
    size_t mask;
} name_table;

static uint64_t hash_name(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

static void table_init(name_table *t, size_t n)
{
    size_t cap = 16;
    while (cap < 2 * n) cap *= 2;
    t->slots = MUSE_CALLOC(cap, sizeof *t->slots);
    t->mask = cap - 1;
}

static void table_free(name_table *t)
{
    free(t->slots);
    t->slots = NULL;
}

static name_slot *table_slot(const name_table *t, const char *key)
{
    size_t i = (size_t)hash_name(key) & t->mask;
    while (t->slots[i].key && strcmp(t->slots[i].key, key) != 0) i = (i + 1) & t->mask;
    return &t->slots[i];
}

/* Inserts key -> val; when the key is already there returns 1 with its value in *existing.
 * The table was sized for every key, so it never fills. */
static int table_put(name_table *t, const char *key, size_t val, size_t *existing)
{
    name_slot *s = table_slot(t, key);
    if (s->key) {
        *existing = s->val;
        return 1;
    }
    s->key = key;
    s->val = val;
    return 0;
}

static const name_slot *table_get(const name_table *t, const char *key)
{
    const name_slot *s = table_slot(t, key);
    return s->key ? s : NULL;
}

/* ---- header parsing ---- */

/* A JSON number that is a non-negative integer small enough to be exact in a double. */
static int json_exact_uint(const cJSON *v, uint64_t *out)
{
    if (!cJSON_IsNumber(v)) return -1;
    double d = v->valuedouble;
    if (!isfinite(d) || d < 0 || d >= ST_MAX_EXACT_INT || d != floor(d)) return -1;
    *out = (uint64_t)d;
    return 0;
}

static void format_shape(char *buf, size_t cap, const int64_t *shape, int ndim)
{
    size_t used = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && used < cap; i++)
        used +=
            (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (used < cap) snprintf(buf + used, cap - used, "]");
}

static int parse_dtype(const cJSON *v, const char *file, const char *name, muse_tensor *t,
                       muse_err *e)
{
    if (!cJSON_IsString(v))
        return muse_fail(e, "%s: tensor '%s': dtype is not a string; %s", file, name, ST_CORRUPT);
    if (muse_dtype_parse(v->valuestring, &t->dtype) != 0)
        return muse_fail(e,
                         "%s: tensor '%s': dtype '%s' is not supported (muse reads F16, BF16, "
                         "F32, I16, I32); convert the checkpoint to one of these and re-make the "
                         "pack",
                         file, name, v->valuestring);
    return 0;
}

static int parse_shape(const cJSON *v, const char *file, const char *name, muse_tensor *t,
                       muse_err *e)
{
    if (!cJSON_IsArray(v))
        return muse_fail(e, "%s: tensor '%s': shape is not an array; %s", file, name, ST_CORRUPT);
    uint64_t numel = 1;
    int ndim = 0;
    for (const cJSON *d = v->child; d; d = d->next) {
        if (ndim == MUSE_MAX_DIMS)
            return muse_fail(e,
                             "%s: tensor '%s': shape has more than %d dimensions, which muse "
                             "does not support; re-make the pack",
                             file, name, MUSE_MAX_DIMS);
        uint64_t dim;
        if (json_exact_uint(d, &dim) != 0)
            return muse_fail(e,
                             "%s: tensor '%s': shape entry %d is not a non-negative integer "
                             "below 2^53; %s",
                             file, name, ndim, ST_CORRUPT);
        if (__builtin_mul_overflow(numel, dim, &numel) || numel > (uint64_t)INT64_MAX)
            return muse_fail(e, "%s: tensor '%s': shape has more elements than fit in 64 bits; %s",
                             file, name, ST_CORRUPT);
        t->shape[ndim++] = (int64_t)dim;
    }
    t->ndim = ndim;
    t->numel = (int64_t)numel;
    return 0;
}

static int parse_offsets(const cJSON *v, const char *file, const char *name, uint64_t *begin,
                         uint64_t *end, muse_err *e)
{
    if (!cJSON_IsArray(v) || !v->child || !v->child->next || v->child->next->next ||
        json_exact_uint(v->child, begin) != 0 || json_exact_uint(v->child->next, end) != 0)
        return muse_fail(e,
                         "%s: tensor '%s': data_offsets is not an array of two non-negative "
                         "integers [begin, end]; %s",
                         file, name, ST_CORRUPT);
    if (*begin > *end)
        return muse_fail(e, "%s: tensor '%s': data_offsets [%llu, %llu] end before they begin; %s",
                         file, name, (unsigned long long)*begin, (unsigned long long)*end,
                         ST_CORRUPT);
    return 0;
}

/* Checks the three fields are each there exactly once and nothing else is. */
static int find_entry_fields(const cJSON *item, const char *file, const char *name,
                             const cJSON *fields[3], muse_err *e)
{
    static const char *const wanted[3] = {"dtype", "shape", "data_offsets"};
    if (!cJSON_IsObject(item))
        return muse_fail(e,
                         "%s: tensor '%s': entry is not an object with dtype, shape and "
                         "data_offsets; %s",
                         file, name, ST_CORRUPT);
    fields[0] = fields[1] = fields[2] = NULL;
    for (const cJSON *f = item->child; f; f = f->next) {
        int k = 0;
        while (k < 3 && !(f->string && strcmp(f->string, wanted[k]) == 0)) k++;
        if (k == 3)
            return muse_fail(e,
                             "%s: tensor '%s': unknown field '%s' (expected dtype, shape, "
                             "data_offsets); %s",
                             file, name, f->string ? f->string : "", ST_CORRUPT);
        if (fields[k])
            return muse_fail(e, "%s: tensor '%s': field '%s' appears twice; %s", file, name,
                             wanted[k], ST_CORRUPT);
        fields[k] = f;
    }
    for (int k = 0; k < 3; k++)
        if (!fields[k])
            return muse_fail(e, "%s: tensor '%s': field '%s' is missing; %s", file, name, wanted[k],
                             ST_CORRUPT);
    return 0;
}

static int parse_entry(const cJSON *item, const char *file, const uint8_t *data_base,
                       uint64_t data_len, muse_tensor *t, uint64_t *begin, muse_err *e)
{
    const char *name = t->name;
    const cJSON *fields[3];
    uint64_t end;
    if (find_entry_fields(item, file, name, fields, e) != 0 ||
        parse_dtype(fields[0], file, name, t, e) != 0 ||
        parse_shape(fields[1], file, name, t, e) != 0 ||
        parse_offsets(fields[2], file, name, begin, &end, e) != 0)
        return -1;
    char shape[160];
    format_shape(shape, sizeof shape, t->shape, t->ndim);
    uint64_t nbytes;
    if (__builtin_mul_overflow((uint64_t)t->numel, (uint64_t)dtype_sizes[t->dtype], &nbytes) ||
        nbytes != end - *begin)
        return muse_fail(e,
                         "%s: tensor '%s': data_offsets [%llu, %llu] do not match shape %s of %s "
                         "(%llu bytes); %s",
                         file, name, (unsigned long long)*begin, (unsigned long long)end, shape,
                         dtype_names[t->dtype],
                         (unsigned long long)((uint64_t)t->numel * dtype_sizes[t->dtype]),
                         ST_CORRUPT);
    if (end > data_len)
        return muse_fail(e,
                         "%s: tensor '%s': data_offsets [%llu, %llu] run past the end of the "
                         "data section (%llu bytes); %s",
                         file, name, (unsigned long long)*begin, (unsigned long long)end,
                         (unsigned long long)data_len, ST_CORRUPT);
    t->nbytes = (size_t)nbytes;
    t->data = data_base ? data_base + *begin : NULL;
    t->file = file;
    return 0;
}

static int check_metadata(const cJSON *meta, const char *file, muse_err *e)
{
    if (!cJSON_IsObject(meta))
        return muse_fail(e, "%s: __metadata__ is not an object of strings; %s", file, ST_CORRUPT);
    for (const cJSON *m = meta->child; m; m = m->next)
        if (!cJSON_IsString(m))
            return muse_fail(e, "%s: __metadata__ entry '%s' is not a string; %s", file,
                             m->string ? m->string : "", ST_CORRUPT);
    return 0;
}

typedef struct {
    uint64_t begin, end;
    size_t idx;
} span;

static int span_cmp(const void *a, const void *b)
{
    const span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Two tensors may not share a byte; empty tensors share none. */
static int check_overlaps(const muse_tensor *t, const uint64_t *begins, size_t n, const char *file,
                          muse_err *e)
{
    span *s = MUSE_MALLOC(n * sizeof *s);
    for (size_t i = 0; i < n; i++) s[i] = (span){begins[i], begins[i] + t[i].nbytes, i};
    qsort(s, n, sizeof *s, span_cmp);
    int rc = 0;
    const span *widest = NULL; /* the non-empty span reaching furthest so far */
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (s[i].begin == s[i].end) continue;
        if (widest && s[i].begin < widest->end)
            rc =
                muse_fail(e,
                          "%s: tensors '%s' [%llu, %llu] and '%s' [%llu, %llu] overlap in the "
                          "data section; %s",
                          file, t[widest->idx].name, (unsigned long long)widest->begin,
                          (unsigned long long)widest->end, t[s[i].idx].name,
                          (unsigned long long)s[i].begin, (unsigned long long)s[i].end, ST_CORRUPT);
        if (!widest || s[i].end > widest->end) widest = &s[i];
    }
    free(s);
    return rc;
}

/* Parses the header object's entries into t (n slots, names NULL) and begins. */
static int parse_entries(const cJSON *root, const char *file, const uint8_t *data_base,
                         uint64_t data_len, muse_tensor *t, uint64_t *begins, size_t n, muse_err *e)
{
    name_table names;
    table_init(&names, n);
    size_t k = 0, seen_meta = 0, dup;
    int rc = 0;
    for (const cJSON *c = root->child; c && rc == 0; c = c->next) {
        const char *name = c->string ? c->string : "";
        if (strcmp(name, "__metadata__") == 0) {
            rc = seen_meta++ ? muse_fail(e, "%s: __metadata__ appears twice; %s", file, ST_CORRUPT)
                             : check_metadata(c, file, e);
            continue;
        }
        MUSE_CHECK(k < n);
        t[k].name = strdup(name);
        MUSE_CHECK(t[k].name);
        if (!*name)
            rc = muse_fail(e, "%s: a tensor has an empty name; %s", file, ST_CORRUPT);
        else if (table_put(&names, t[k].name, k, &dup))
            rc = muse_fail(e, "%s: tensor '%s' appears twice in the header; %s", file, name,
                           ST_CORRUPT);
        else
            rc = parse_entry(c, file, data_base, data_len, &t[k], &begins[k], e);
        k++;
    }
    table_free(&names);
    return rc;
}

int muse_st_parse_header(const char *json, size_t len, const uint8_t *data_base, uint64_t data_len,
                         const char *file, muse_tensor **out, size_t *n, muse_err *e)
{
    *out = NULL;
    *n = 0;
    if (!file) file = "(safetensors header)";
    const char *stop = NULL;
    cJSON *root = json && len ? cJSON_ParseWithLengthOpts(json, len, &stop, 0) : NULL;
    if (!root) {
        size_t at = stop && stop >= json && stop <= json + len ? (size_t)(stop - json) : 0;
        return muse_fail(e, "%s: the header is not valid JSON (error near byte %zu of %zu); %s",
                         file, at, len, ST_CORRUPT);
    }
    size_t tail = stop && stop >= json && stop <= json + len ? (size_t)(stop - json) : len;
    while (tail < len && strchr(" \t\r\n", json[tail]) && json[tail]) tail++;
    if (tail < len || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return muse_fail(e, "%s: the header is not one JSON object (stray byte at %zu of %zu); %s",
                         file, tail, len, ST_CORRUPT);
    }
    size_t count = 0;
    for (const cJSON *c = root->child; c; c = c->next)
        if (!c->string || strcmp(c->string, "__metadata__") != 0) count++;
    muse_tensor *t = MUSE_CALLOC(count, sizeof *t);
    uint64_t *begins = MUSE_CALLOC(count, sizeof *begins);
    int rc = parse_entries(root, file, data_base, data_len, t, begins, count, e);
    if (rc == 0) rc = check_overlaps(t, begins, count, file, e);
    cJSON_Delete(root);
    free(begins);
    if (rc != 0) {
        muse_st_free_tensors(t, count);
        return -1;
    }
    *out = t;
    *n = count;
    return 0;
}

void muse_st_free_tensors(muse_tensor *t, size_t n)
{
    if (!t) return;
    for (size_t i = 0; i < n; i++) free((char *)t[i].name);
    free(t);
}

/* ---- index parsing ---- */

static int plain_file_name(const char *s)
{
    return *s && !strchr(s, '/') && strcmp(s, ".") != 0 && strcmp(s, "..") != 0;
}

static int parse_weight_map(const cJSON *map, const char *file, char **names, char **shards,
                            size_t n, muse_err *e)
{
    name_table seen;
    table_init(&seen, n);
    size_t k = 0, dup;
    int rc = 0;
    for (const cJSON *c = map->child; c && rc == 0; c = c->next, k++) {
        const char *name = c->string ? c->string : "";
        names[k] = strdup(name);
        MUSE_CHECK(names[k]);
        if (!*name)
            rc = muse_fail(e, "%s: weight_map has an empty tensor name; fix the index", file);
        else if (!cJSON_IsString(c))
            rc = muse_fail(e,
                           "%s: weight_map entry for tensor '%s' is not a shard file name; fix "
                           "the index",
                           file, name);
        else if (!plain_file_name(c->valuestring))
            rc = muse_fail(e,
                           "%s: weight_map puts tensor '%s' in shard '%s', which is not a plain "
                           "file name in the pack directory; fix the index",
                           file, name, c->valuestring);
        else if (table_put(&seen, names[k], k, &dup))
            rc = muse_fail(e, "%s: weight_map lists tensor '%s' twice; fix the index", file, name);
        if (rc == 0) {
            shards[k] = strdup(c->valuestring);
            MUSE_CHECK(shards[k]);
        }
    }
    table_free(&seen);
    return rc;
}

static int parse_index_named(const char *json, size_t len, const char *file, char ***names,
                             char ***shards, size_t *n, muse_err *e)
{
    *names = *shards = NULL;
    *n = 0;
    const char *stop = NULL;
    cJSON *root = json && len ? cJSON_ParseWithLengthOpts(json, len, &stop, 0) : NULL;
    size_t tail = stop && stop >= json && stop <= json + len ? (size_t)(stop - json) : len;
    while (root && tail < len && json[tail] && strchr(" \t\r\n", json[tail])) tail++;
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(root, "weight_map");
    const cJSON *meta = cJSON_GetObjectItemCaseSensitive(root, "metadata");
    int rc = 0;
    if (!root || tail < len || !cJSON_IsObject(root))
        rc = muse_fail(e,
                       "%s: not one valid JSON object (error near byte %zu of %zu); fix or "
                       "re-download the index",
                       file, tail, len);
    else if (!cJSON_IsObject(map) || !map->child)
        rc = muse_fail(e,
                       "%s: no weight_map object naming each tensor's shard; fix or "
                       "re-download the index",
                       file);
    else if (meta && !cJSON_IsObject(meta))
        rc = muse_fail(e, "%s: metadata is not an object; fix or re-download the index", file);
    if (rc == 0) {
        size_t count = 0;
        for (const cJSON *c = map->child; c; c = c->next) count++;
        char **nm = MUSE_CALLOC(count, sizeof *nm);
        char **sh = MUSE_CALLOC(count, sizeof *sh);
        rc = parse_weight_map(map, file, nm, sh, count, e);
        if (rc == 0) {
            *names = nm;
            *shards = sh;
            *n = count;
        } else {
            muse_st_free_index(nm, sh, count);
        }
    }
    cJSON_Delete(root);
    return rc;
}

int muse_st_parse_index(const char *json, size_t len, char ***names, char ***shards, size_t *n,
                        muse_err *e)
{
    return parse_index_named(json, len, ST_INDEX_NAME, names, shards, n, e);
}

void muse_st_free_index(char **names, char **shards, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (names) free(names[i]);
        if (shards) free(shards[i]);
    }
    free(names);
    free(shards);
}

/* ---- opening a pack ---- */

typedef struct {
    char *path;
    void *map;
    size_t map_len;
} st_shard;

struct muse_st {
    st_shard *shards;
    size_t n_shards;
    muse_tensor *tensors;
    size_t n;
    name_table by_name;
    uint64_t total_bytes;
};

static char *path_join(const char *dir, const char *name)
{
    size_t dl = strlen(dir), nl = strlen(name);
    int slash = dl > 0 && dir[dl - 1] != '/';
    char *p = MUSE_MALLOC(dl + (size_t)slash + nl + 1);
    memcpy(p, dir, dl);
    if (slash) p[dl] = '/';
    memcpy(p + dl + (size_t)slash, name, nl + 1);
    return p;
}

static int is_regular_file(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* Maps a whole regular file read-only. */
static int map_file(const char *path, void **map, size_t *len, muse_err *e)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT)
        return muse_fail(e, "%s: no such file; the pack is incomplete, re-download or re-make it",
                         path);
    if (fd < 0)
        return muse_fail(e, "%s: cannot open (%s); check the path and permissions", path,
                         strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return muse_fail(e, "%s: not a regular file; a pack holds plain .safetensors files", path);
    }
    if (sb.st_size < 8 || (uint64_t)sb.st_size > SIZE_MAX) {
        close(fd);
        return muse_fail(e, "%s: file is %lld bytes, too short for a safetensors header; %s", path,
                         (long long)sb.st_size, ST_CORRUPT);
    }
    *len = (size_t)sb.st_size;
    *map = mmap(NULL, *len, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    close(fd);
    if (*map == MAP_FAILED) {
        *map = NULL;
        return muse_fail(e, "%s: cannot mmap %zu bytes (%s)", path, *len, strerror(err));
    }
    return 0;
}

static uint64_t read_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

/* Maps one shard and parses its header; the shard's path must outlive the tensors. */
static int open_shard(st_shard *sh, muse_tensor **t, size_t *n, muse_err *e)
{
    if (map_file(sh->path, &sh->map, &sh->map_len, e) != 0) return -1;
    const uint8_t *base = sh->map;
    uint64_t header_len = read_le64(base);
    if (header_len == 0 || header_len >= ST_MAX_HEADER_BYTES)
        return muse_fail(e,
                         "%s: header length %llu is not in [1, %llu); the file is corrupt or not "
                         "a safetensors file, re-download or re-make the pack",
                         sh->path, (unsigned long long)header_len, ST_MAX_HEADER_BYTES);
    if (header_len > sh->map_len - 8)
        return muse_fail(e, "%s: header length %llu exceeds the %zu bytes after it; %s", sh->path,
                         (unsigned long long)header_len, sh->map_len - 8, ST_CORRUPT);
    return muse_st_parse_header((const char *)base + 8, (size_t)header_len, base + 8 + header_len,
                                sh->map_len - 8 - header_len, sh->path, t, n, e);
}

/* Reads a whole (index) file into memory, refusing absurd sizes. */
static int read_small_file(const char *path, char **buf, size_t *len, muse_err *e)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return muse_fail(e, "%s: cannot open (%s); check the path and permissions", path,
                         strerror(errno));
    struct stat sb;
    if (fstat(fileno(f), &sb) != 0 || sb.st_size < 0 ||
        (uint64_t)sb.st_size >= ST_MAX_INDEX_BYTES) {
        fclose(f);
        return muse_fail(e, "%s: unreadable or larger than %llu bytes; fix the index", path,
                         ST_MAX_INDEX_BYTES);
    }
    size_t want = (size_t)sb.st_size;
    *buf = MUSE_MALLOC(want);
    *len = fread(*buf, 1, want, f);
    int failed = ferror(f) || *len != want;
    fclose(f);
    if (failed) {
        free(*buf);
        *buf = NULL;
        return muse_fail(e, "%s: read %zu of %zu bytes; the file changed or the disk failed", path,
                         *len, want);
    }
    return 0;
}

/* Gathers every shard's tensors into one array and one name table; a name in two shards fails. */
static int merge_shards(muse_st *st, muse_tensor **per, const size_t *counts, muse_err *e)
{
    size_t total = 0;
    for (size_t s = 0; s < st->n_shards; s++) total += counts[s];
    st->tensors = MUSE_CALLOC(total, sizeof *st->tensors);
    table_init(&st->by_name, total);
    for (size_t s = 0; s < st->n_shards; s++) {
        for (size_t i = 0; i < counts[s]; i++) {
            muse_tensor *t = &st->tensors[st->n++];
            *t = per[s][i];
            per[s][i].name = NULL; /* moved: st owns it now */
            size_t other;
            if (table_put(&st->by_name, t->name, st->n - 1, &other))
                return muse_fail(e,
                                 "tensor '%s' is in both %s and %s; the pack is corrupt, "
                                 "re-download or re-make it",
                                 t->name, st->tensors[other].file, t->file);
            st->total_bytes += t->nbytes;
        }
    }
    return 0;
}

/* Opens the named shard files (plain names inside dir) into st. */
static int open_shards(muse_st *st, const char *dir, const char *const *files, size_t n_files,
                       muse_err *e)
{
    st->shards = MUSE_CALLOC(n_files, sizeof *st->shards);
    muse_tensor **per = MUSE_CALLOC(n_files, sizeof *per);
    size_t *counts = MUSE_CALLOC(n_files, sizeof *counts);
    int rc = 0;
    for (size_t s = 0; s < n_files && rc == 0; s++) {
        st->shards[s].path = path_join(dir, files[s]);
        st->n_shards = s + 1;
        rc = open_shard(&st->shards[s], &per[s], &counts[s], e);
    }
    if (rc == 0) rc = merge_shards(st, per, counts, e);
    for (size_t s = 0; s < n_files; s++) muse_st_free_tensors(per[s], counts[s]);
    free(per);
    free(counts);
    return rc;
}

/* Every indexed tensor must be in the shard the index names. */
static int check_index_against_shards(const muse_st *st, const char *index_path, char *const *names,
                                      char *const *shard_of, size_t n, const name_table *shard_ids,
                                      muse_err *e)
{
    for (size_t i = 0; i < n; i++) {
        const st_shard *want = &st->shards[table_get(shard_ids, shard_of[i])->val];
        const muse_tensor *t = muse_st_find(st, names[i]);
        if (!t)
            return muse_fail(e,
                             "%s: weight_map puts tensor '%s' in shard %s, which has no such "
                             "tensor; the pack is incomplete, re-download or re-make it",
                             index_path, names[i], want->path);
        if (t->file != want->path)
            return muse_fail(e,
                             "%s: weight_map puts tensor '%s' in shard %s, but it is in %s; fix "
                             "the index or re-make the pack",
                             index_path, names[i], want->path, t->file);
    }
    return 0;
}

static int open_indexed(muse_st *st, const char *dir, const char *index_path, muse_err *e)
{
    char *json = NULL, **names = NULL, **shard_of = NULL;
    size_t len = 0, n = 0;
    if (read_small_file(index_path, &json, &len, e) != 0) return -1;
    int rc = parse_index_named(json, len, index_path, &names, &shard_of, &n, e);
    free(json);
    if (rc != 0) return -1;
    name_table shard_ids;
    table_init(&shard_ids, n);
    const char **files = MUSE_CALLOC(n, sizeof *files);
    size_t n_files = 0, id;
    for (size_t i = 0; i < n; i++)
        if (!table_put(&shard_ids, shard_of[i], n_files, &id)) files[n_files++] = shard_of[i];
    rc = open_shards(st, dir, files, n_files, e);
    if (rc == 0) rc = check_index_against_shards(st, index_path, names, shard_of, n, &shard_ids, e);
    free(files);
    table_free(&shard_ids);
    muse_st_free_index(names, shard_of, n);
    return rc;
}

static int has_suffix(const char *s, const char *suffix)
{
    size_t sl = strlen(s), fl = strlen(suffix);
    return sl > fl && strcmp(s + sl - fl, suffix) == 0;
}

/* Finds the one *.safetensors in dir; *found is malloc'd, NULL when there is none. */
static int find_single_file(const char *dir, char **found, muse_err *e)
{
    *found = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    size_t count = 0;
    char second[256] = "";
    for (const struct dirent *de; (de = readdir(d));) {
        if (!has_suffix(de->d_name, ST_SUFFIX)) continue;
        char *full = path_join(dir, de->d_name);
        int regular = is_regular_file(full);
        free(full);
        if (!regular) continue;
        if (count++ == 0)
            *found = strdup(de->d_name);
        else if (count == 2)
            snprintf(second, sizeof second, "%s", de->d_name);
    }
    closedir(d);
    if (count > 1) {
        int rc = muse_fail(e,
                           "%s holds %zu .safetensors files (%s, %s, ...) but no %s; add the "
                           "index or keep only one file",
                           dir, count, *found, second, ST_INDEX_NAME);
        free(*found);
        *found = NULL;
        return rc;
    }
    return 0;
}

/* On failure errno tells why (ENOENT: it does not exist). */
static int is_directory(const char *path)
{
    struct stat sb;
    if (stat(path, &sb) != 0) return 0;
    errno = S_ISDIR(sb.st_mode) ? 0 : ENOTDIR;
    return S_ISDIR(sb.st_mode);
}

static int open_pack(muse_st *st, const char *dir, muse_err *e)
{
    if (!is_directory(dir))
        return muse_fail(e,
                         "%s is not a model pack: no %s or *.safetensors found (%s); point it "
                         "at the directory that holds the model's safetensors files",
                         dir, ST_INDEX_NAME,
                         errno == ENOENT ? "no such directory" : "not a directory");
    char *index_path = path_join(dir, ST_INDEX_NAME);
    if (is_regular_file(index_path)) {
        int rc = open_indexed(st, dir, index_path, e);
        free(index_path);
        return rc;
    }
    free(index_path);
    char *single = path_join(dir, "model" ST_SUFFIX);
    int has_model = is_regular_file(single);
    free(single);
    single = NULL;
    if (has_model) {
        single = strdup("model" ST_SUFFIX);
        MUSE_CHECK(single);
    } else if (find_single_file(dir, &single, e) != 0) {
        return -1;
    }
    if (!single)
        return muse_fail(e,
                         "%s is not a model pack: no %s or *.safetensors found; point it at the "
                         "directory that holds the model's safetensors files",
                         dir, ST_INDEX_NAME);
    const char *files[1] = {single};
    int rc = open_shards(st, dir, files, 1, e);
    free(single);
    return rc;
}

int muse_st_open(const char *dir, muse_st **out, muse_err *e)
{
    *out = NULL;
    muse_st *st = MUSE_CALLOC(1, sizeof *st);
    if (open_pack(st, dir, e) != 0) {
        muse_st_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

int muse_st_from_memory(muse_tensor *t, size_t n, void *block, size_t block_len, muse_st **out,
                        muse_err *e)
{
    *out = NULL;
    muse_st *st = MUSE_CALLOC(1, sizeof *st);
    st->n_shards = 1;
    st->shards = MUSE_CALLOC(1, sizeof *st->shards);
    st->shards[0] =
        (st_shard){.path = strdup("(synthetic weights)"), .map = block, .map_len = block_len};
    MUSE_CHECK(st->shards[0].path);
    for (size_t i = 0; i < n; i++) t[i].file = st->shards[0].path;
    size_t counts[1] = {n};
    muse_tensor *per[1] = {t};
    int rc = merge_shards(st, per, counts, e);
    muse_st_free_tensors(t, n);
    if (rc) {
        muse_st_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

void muse_st_close(muse_st *st)
{
    if (!st) return;
    muse_st_free_tensors(st->tensors, st->n);
    table_free(&st->by_name);
    for (size_t s = 0; s < st->n_shards; s++) {
        if (st->shards[s].map) munmap(st->shards[s].map, st->shards[s].map_len);
        free(st->shards[s].path);
    }
    free(st->shards);
    free(st);
}

const muse_tensor *muse_st_find(const muse_st *st, const char *name)
{
    if (!st->by_name.slots || !name) return NULL;
    const name_slot *s = table_get(&st->by_name, name);
    return s ? &st->tensors[s->val] : NULL;
}

size_t muse_st_count(const muse_st *st)
{
    return st->n;
}

const muse_tensor *muse_st_at(const muse_st *st, size_t i)
{
    return i < st->n ? &st->tensors[i] : NULL;
}

uint64_t muse_st_total_bytes(const muse_st *st)
{
    return st->total_bytes;
}

/* ---- writing ---- */

static MUSE_PRINTF(2, 3) void buf_printf(muse_buf *b, const char *fmt, ...)
{
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    MUSE_CHECK(n >= 0 && (size_t)n < sizeof small); /* only short numeric pieces go here */
    muse_buf_add(b, small, (size_t)n);
}

/* Writes s as a JSON string literal; bytes >= 0x80 pass through as UTF-8. */
static void buf_json_string(muse_buf *b, const char *s)
{
    muse_buf_add(b, "\"", 1);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\') {
            char esc[2] = {'\\', (char)c};
            muse_buf_add(b, esc, 2);
        } else if (c < 0x20) {
            buf_printf(b, "\\u%04x", c);
        } else {
            muse_buf_add(b, &c, 1);
        }
    }
    muse_buf_add(b, "\"", 1);
}

static int entry_nbytes(const muse_st_entry *en, uint64_t *nbytes, muse_err *e, const char *path)
{
    const char *name = en->name ? en->name : "(null)";
    if (!en->name || !*en->name)
        return muse_fail(e, "%s: a tensor to write has no name (a bug in the caller)", path);
    if ((unsigned)en->dtype >= MUSE_DT_COUNT || en->ndim < 0 || en->ndim > MUSE_MAX_DIMS)
        return muse_fail(e, "%s: tensor '%s': bad dtype %d or ndim %d (a bug in the caller)", path,
                         name, (int)en->dtype, en->ndim);
    uint64_t n = dtype_sizes[en->dtype];
    for (int d = 0; d < en->ndim; d++)
        if (en->shape[d] < 0 || (double)en->shape[d] >= ST_MAX_EXACT_INT ||
            __builtin_mul_overflow(n, (uint64_t)en->shape[d], &n))
            return muse_fail(e, "%s: tensor '%s': shape entry %d (%lld) is negative or too large",
                             path, name, d, (long long)en->shape[d]);
    if (n && !en->data)
        return muse_fail(e, "%s: tensor '%s': no data (a bug in the caller)", path, name);
    *nbytes = n;
    return 0;
}

/* Builds the header JSON (padded with spaces to a multiple of 8) for entries written in order. */
static int build_header(const char *path, const muse_st_entry *en, size_t n, muse_buf *h,
                        uint64_t *sizes, muse_err *e)
{
    name_table seen;
    table_init(&seen, n);
    muse_buf_add(h, "{\"__metadata__\":{\"format\":\"pt\"}", 31);
    uint64_t offset = 0;
    size_t dup;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        rc = entry_nbytes(&en[i], &sizes[i], e, path);
        if (rc == 0 && table_put(&seen, en[i].name, i, &dup))
            rc = muse_fail(e, "%s: tensor '%s' is given twice", path, en[i].name);
        if (rc != 0) break;
        muse_buf_add(h, ",", 1);
        buf_json_string(h, en[i].name);
        buf_printf(h, ":{\"dtype\":\"%s\",\"shape\":[", dtype_names[en[i].dtype]);
        for (int d = 0; d < en[i].ndim; d++)
            buf_printf(h, "%s%lld", d ? "," : "", (long long)en[i].shape[d]);
        buf_printf(h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)offset,
                   (unsigned long long)(offset + sizes[i]));
        offset += sizes[i];
    }
    table_free(&seen);
    muse_buf_add(h, "}", 1);
    while (h->len % 8) muse_buf_add(h, " ", 1);
    if (rc == 0 && h->len >= ST_MAX_HEADER_BYTES)
        rc = muse_fail(e, "%s: header of %zu bytes exceeds the safetensors limit; split the shard",
                       path, h->len);
    return rc;
}

static int write_all(FILE *f, const void *p, size_t n)
{
    return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1;
}

/* Writes parts to path.tmp and renames it over path, so a failed write never leaves a file. */
static int write_file_atomically(const char *path, const void *const *parts, const size_t *sizes,
                                 size_t n_parts, muse_err *e)
{
    char *tmp = MUSE_MALLOC(strlen(path) + 5);
    sprintf(tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        int rc = muse_fail(e, "%s: cannot create (%s); check the directory exists and is writable",
                           tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    int rc = 0;
    for (size_t i = 0; i < n_parts && rc == 0; i++) rc = write_all(f, parts[i], sizes[i]);
    if (fclose(f) != 0) rc = -1;
    if (rc != 0 || rename(tmp, path) != 0) {
        rc = muse_fail(e, "%s: write failed (%s); check free disk space", path, strerror(errno));
        unlink(tmp);
    }
    free(tmp);
    return rc;
}

int muse_st_write(const char *path, const muse_st_entry *entries, size_t n, muse_err *e)
{
    muse_buf h = {0};
    uint64_t *sizes = MUSE_CALLOC(n, sizeof *sizes);
    int rc = build_header(path, entries, n, &h, sizes, e);
    if (rc == 0) {
        uint8_t len_le[8];
        for (int i = 0; i < 8; i++) len_le[i] = (uint8_t)((uint64_t)h.len >> (8 * i));
        const void **parts = MUSE_MALLOC((n + 2) * sizeof *parts);
        size_t *part_sizes = MUSE_MALLOC((n + 2) * sizeof *part_sizes);
        parts[0] = len_le;
        part_sizes[0] = 8;
        parts[1] = h.p;
        part_sizes[1] = h.len;
        for (size_t i = 0; i < n; i++) {
            parts[i + 2] = entries[i].data;
            part_sizes[i + 2] = (size_t)sizes[i];
        }
        rc = write_file_atomically(path, parts, part_sizes, n + 2, e);
        free(parts);
        free(part_sizes);
    }
    free(h.p);
    free(sizes);
    return rc;
}

int muse_st_write_index(const char *path, const char *const *names, const char *const *shards,
                        size_t n, uint64_t total_bytes, muse_err *e)
{
    muse_buf b = {0};
    name_table seen;
    table_init(&seen, n);
    buf_printf(&b, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {",
               (unsigned long long)total_bytes);
    int rc = 0;
    size_t dup;
    for (size_t i = 0; i < n && rc == 0; i++) {
        if (!names[i] || !*names[i] || !shards[i] || !plain_file_name(shards[i]))
            rc = muse_fail(e,
                           "%s: entry %zu has no tensor name or a shard that is not a plain "
                           "file name (a bug in the caller)",
                           path, i);
        else if (table_put(&seen, names[i], i, &dup))
            rc = muse_fail(e, "%s: tensor '%s' is given twice", path, names[i]);
        if (rc != 0) break;
        muse_buf_add(&b, i ? ",\n    " : "\n    ", i ? 6 : 5);
        buf_json_string(&b, names[i]);
        muse_buf_add(&b, ": ", 2);
        buf_json_string(&b, shards[i]);
    }
    table_free(&seen);
    muse_buf_add(&b, "\n  }\n}\n", 7);
    if (rc == 0) {
        const void *parts[1] = {b.p};
        size_t sizes[1] = {b.len};
        rc = write_file_atomically(path, parts, sizes, 1, e);
    }
    free(b.p);
    return rc;
}

float muse_tensor_f32(const muse_tensor *t, int64_t i)
{
    const uint8_t *p = t->data;
    uint16_t h;
    float f;
    switch (t->dtype) {
    case MUSE_DT_F16:
        memcpy(&h, p + 2 * i, 2);
        return muse_f16_to_f32(h);
    case MUSE_DT_BF16:
        memcpy(&h, p + 2 * i, 2);
        return muse_bf16_to_f32(h);
    case MUSE_DT_F32:
        memcpy(&f, p + 4 * i, 4);
        return f;
    default:
        MUSE_CHECK(!"muse_tensor_f32 on an integer tensor");
        return 0;
    }
}
