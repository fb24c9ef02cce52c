/*
 * ngx_muse_module: the HTTP face of muse. Validates OpenAI-style requests, hands them to the
 * engine through its shared-memory segment (engine/muse_ring.h) and a doorbell socket, and
 * writes the engine's event records back as SSE or a JSON body. /health, /v1/models and
 * /metrics come from the segment. docs/nginx.md documents the directives.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <cjson/cJSON.h>
#include <ctype.h>
#include <math.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "abi/muse_ring.h"

#define NGX_MUSE_SERVE_CHAT        1
#define NGX_MUSE_SERVE_COMPLETIONS 2
#define NGX_MUSE_SERVE_MODELS      3
#define NGX_MUSE_SERVE_HEALTH      4
#define NGX_MUSE_SERVE_METRICS     5

#define NGX_MUSE_STALE_MS     3000
#define NGX_MUSE_MAX_KEY_LEN  256    /* API keys are compared over this many bytes */
#define NGX_MUSE_MAX_KEYS     16
#define NGX_MUSE_BATCH        64
#define NGX_MUSE_BUF_SIZE     4096
#define NGX_MUSE_PATH_LEN     96
#define NGX_MUSE_MAX_DEPTH    64
#define NGX_MUSE_MAX_NESTING  200        /* any JSON in a request body */
#define NGX_MUSE_MAX_JSON_VALUES  1048576 /* items: a 524288-id prompt fits twice */

/* One mapping of the engine's segment in this worker; retired mappings live until their last
 * request lets go. */
typedef struct ngx_muse_map_s {
    u_char                 *base;
    muse_ring_header        lay;    /* the checked layout: never re-read from the segment */
    size_t                  size;
    dev_t                   dev;
    ino_t                   ino;
    ngx_uint_t              refs;
    unsigned                retired:1;
} ngx_muse_map_t;

typedef struct {
    ngx_str_t               socket_path;
    ngx_str_t               shm_name;     /* NUL-terminated */
    ngx_muse_map_t         *map;          /* current mapping in this worker */
    ngx_uint_t              abi_logged;
} ngx_muse_engine_t;

typedef struct {
    ngx_uint_t              serve;
    ngx_muse_engine_t      *engine;
    ngx_str_t               model_id;
    ngx_msec_t              queue_timeout;
    ngx_msec_t              idle_timeout;
    ngx_array_t            *api_keys;     /* of ngx_str_t */
    ngx_int_t               scope_index;
    ngx_uint_t              max_json_values;
} ngx_muse_loc_conf_t;

typedef struct {
    ngx_http_request_t     *request;
    ngx_muse_engine_t      *engine;
    ngx_muse_map_t         *map;
    ngx_connection_t       *peer;         /* the doorbell; closing it cancels */
    uint64_t                seg_generation;
    uint64_t                slot_generation;
    uint32_t                slot;
    ngx_msec_t              started;
    ngx_msec_t              last_event;
    ngx_chain_t            *free;
    ngx_chain_t            *busy;
    unsigned                stream:1;
    unsigned                headers_sent:1;
    unsigned                admitted:1;     /* the engine has sent a record: idle timer now */
    unsigned                peer_eof:1;
    unsigned                finished:1;
} ngx_muse_ctx_t;

typedef struct {
    ngx_uint_t              status;
    const char             *type;
    const char             *code;
    const char             *message;
    char                    param[NGX_MUSE_PATH_LEN];
} ngx_muse_verr_t;

static ngx_int_t ngx_muse_init(ngx_conf_t *cf);
static void *ngx_muse_create_loc_conf(ngx_conf_t *cf);
static char *ngx_muse_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child);
static char *ngx_muse_engine_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_muse_serve_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_muse_api_key_file(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_muse_cache_scope(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_muse_handler(ngx_http_request_t *r);
static void ngx_muse_drain(ngx_muse_ctx_t *ctx);
static void ngx_muse_finish(ngx_muse_ctx_t *ctx, ngx_int_t rc);

static ngx_command_t ngx_muse_commands[] = {
    { ngx_string("muse_engine"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE2,
      ngx_muse_engine_directive, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL },
    { ngx_string("muse_serve"),
      NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_muse_serve_directive, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL },
    { ngx_string("muse_model_id"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_str_slot, NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_muse_loc_conf_t, model_id), NULL },
    { ngx_string("muse_queue_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot, NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_muse_loc_conf_t, queue_timeout), NULL },
    { ngx_string("muse_idle_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot, NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_muse_loc_conf_t, idle_timeout), NULL },
    { ngx_string("muse_api_key_file"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_muse_api_key_file, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL },
    { ngx_string("muse_cache_scope"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_muse_cache_scope, NGX_HTTP_LOC_CONF_OFFSET, 0, NULL },
    { ngx_string("muse_max_json_values"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_num_slot, NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_muse_loc_conf_t, max_json_values), NULL },
    ngx_null_command
};

static ngx_http_module_t ngx_muse_module_ctx = {
    NULL, ngx_muse_init, NULL, NULL, NULL, NULL,
    ngx_muse_create_loc_conf, ngx_muse_merge_loc_conf
};

ngx_module_t ngx_muse_module = {
    NGX_MODULE_V1, &ngx_muse_module_ctx, ngx_muse_commands, NGX_HTTP_MODULE,
    NULL, NULL, NULL, NULL, NULL, NULL, NULL, NGX_MODULE_V1_PADDING
};

/* ------------------------------------------------------------------------------------------ */
/* configuration                                                                               */

static void *
ngx_muse_create_loc_conf(ngx_conf_t *cf)
{
    ngx_muse_loc_conf_t  *mcf;

    mcf = ngx_pcalloc(cf->pool, sizeof(ngx_muse_loc_conf_t));
    if (mcf == NULL) {
        return NULL;
    }
    mcf->serve = NGX_CONF_UNSET_UINT;
    mcf->engine = NGX_CONF_UNSET_PTR;
    mcf->queue_timeout = NGX_CONF_UNSET_MSEC;
    mcf->max_json_values = NGX_CONF_UNSET_UINT;
    mcf->idle_timeout = NGX_CONF_UNSET_MSEC;
    mcf->api_keys = NGX_CONF_UNSET_PTR;
    mcf->scope_index = NGX_CONF_UNSET;
    return mcf;
}

static char *
ngx_muse_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child)
{
    ngx_muse_loc_conf_t  *prev = parent;
    ngx_muse_loc_conf_t  *conf = child;

    ngx_conf_merge_uint_value(conf->serve, prev->serve, 0);
    ngx_conf_merge_ptr_value(conf->engine, prev->engine, NULL);
    ngx_conf_merge_str_value(conf->model_id, prev->model_id, "muse-spark");
    ngx_conf_merge_msec_value(conf->queue_timeout, prev->queue_timeout, 60000);
    ngx_conf_merge_msec_value(conf->idle_timeout, prev->idle_timeout, 60000);
    ngx_conf_merge_ptr_value(conf->api_keys, prev->api_keys, NULL);
    ngx_conf_merge_value(conf->scope_index, prev->scope_index, -1);
    ngx_conf_merge_uint_value(conf->max_json_values, prev->max_json_values,
                              NGX_MUSE_MAX_JSON_VALUES);

    if (conf->serve != 0 && conf->serve != NGX_MUSE_SERVE_MODELS && conf->engine == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"muse_serve\" needs \"muse_engine <socket> <shm name>\" "
                           "in this location or above");
        return NGX_CONF_ERROR;
    }
    return NGX_CONF_OK;
}

static char *
ngx_muse_engine_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_muse_loc_conf_t  *mcf = conf;
    ngx_str_t            *value = cf->args->elts;
    ngx_muse_engine_t    *eng;

    if (mcf->engine != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }
    if (value[1].len == 0 || value[1].len >= sizeof(((struct sockaddr_un *) 0)->sun_path)) {
        return "socket path must be 1..107 bytes";
    }
    if (value[2].len < 2 || value[2].len > 250 || value[2].data[0] != '/'
        || ngx_strlchr(value[2].data + 1, value[2].data + value[2].len, '/') != NULL)
    {
        return "shm name must look like /muse-engine (one leading slash)";
    }
    eng = ngx_pcalloc(cf->pool, sizeof(ngx_muse_engine_t));
    if (eng == NULL) {
        return NGX_CONF_ERROR;
    }
    eng->socket_path.data = ngx_pstrdup(cf->pool, &value[1]);
    eng->shm_name.data = ngx_pnalloc(cf->pool, value[2].len + 1);
    if (eng->socket_path.data == NULL || eng->shm_name.data == NULL) {
        return NGX_CONF_ERROR;
    }
    eng->socket_path.len = value[1].len;
    ngx_cpystrn(eng->shm_name.data, value[2].data, value[2].len + 1);
    eng->shm_name.len = value[2].len;
    mcf->engine = eng;
    return NGX_CONF_OK;
}

static char *
ngx_muse_serve_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    static const char        *names[] = { "chat", "completions", "models", "health",
                                          "metrics" };
    ngx_muse_loc_conf_t      *mcf = conf;
    ngx_str_t                *value = cf->args->elts;
    ngx_http_core_loc_conf_t *clcf;
    ngx_uint_t                i;

    for (i = 0; i < 5; i++) {
        if (value[1].len == ngx_strlen(names[i])
            && ngx_strncmp(value[1].data, names[i], value[1].len) == 0)
        {
            mcf->serve = i + 1;
            clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
            clcf->handler = ngx_muse_handler;
            return NGX_CONF_OK;
        }
    }
    return "must be chat, completions, models, health or metrics";
}

/* One key a line; blank lines and # comments skipped. Read once at startup. */
static char *
ngx_muse_api_key_file(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_muse_loc_conf_t  *mcf = conf;
    ngx_str_t            *value = cf->args->elts, *key;
    ngx_file_t            file;
    ngx_file_info_t       fi;
    u_char               *buf, *p, *end, *eol;
    ssize_t               n;

    if (mcf->api_keys != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }
    if (ngx_conf_full_name(cf->cycle, &value[1], 1) != NGX_OK) {
        return NGX_CONF_ERROR;
    }
    ngx_memzero(&file, sizeof(ngx_file_t));
    file.name = value[1];
    file.log = cf->log;
    file.fd = ngx_open_file(value[1].data, NGX_FILE_RDONLY, NGX_FILE_OPEN, 0);
    if (file.fd == NGX_INVALID_FILE) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno, "cannot open api key file \"%V\"",
                           &value[1]);
        return NGX_CONF_ERROR;
    }
    if (ngx_fd_info(file.fd, &fi) == NGX_FILE_ERROR || ngx_file_size(&fi) > 65536) {
        ngx_close_file(file.fd);
        return "api key file must be a readable file under 64 KiB";
    }
    buf = ngx_pnalloc(cf->pool, (size_t) ngx_file_size(&fi) + 1);
    n = buf ? ngx_read_file(&file, buf, (size_t) ngx_file_size(&fi), 0) : NGX_ERROR;
    ngx_close_file(file.fd);
    if (n == NGX_ERROR) {
        return NGX_CONF_ERROR;
    }
    mcf->api_keys = ngx_array_create(cf->pool, 4, sizeof(ngx_str_t));
    if (mcf->api_keys == NULL) {
        return NGX_CONF_ERROR;
    }
    for (p = buf, end = buf + n; p < end; p = eol + 1) {
        eol = ngx_strlchr(p, end, '\n');
        if (eol == NULL) {
            eol = end;
        }
        u_char *s = p, *e = eol;
        while (s < e && (*s == ' ' || *s == '\t')) { s++; }
        while (e > s && (e[-1] == ' ' || e[-1] == '\t' || e[-1] == '\r')) { e--; }
        if (s == e || *s == '#') {
            continue;
        }
        if (mcf->api_keys->nelts >= NGX_MUSE_MAX_KEYS) {
            return "has more than 16 keys";
        }
        if (e - s > NGX_MUSE_MAX_KEY_LEN) {
            return "has a key longer than 256 bytes";
        }
        key = ngx_array_push(mcf->api_keys);
        key->data = s;
        key->len = e - s;
    }
    if (mcf->api_keys->nelts == 0) {
        return "api key file holds no key";
    }
    return NGX_CONF_OK;
}

static char *
ngx_muse_cache_scope(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_muse_loc_conf_t  *mcf = conf;
    ngx_str_t            *value = cf->args->elts, name;

    if (mcf->scope_index != NGX_CONF_UNSET) {
        return "is duplicate";
    }
    if (value[1].len < 2 || value[1].data[0] != '$') {
        return "needs a variable, e.g. muse_cache_scope $remote_user";
    }
    name.data = value[1].data + 1;
    name.len = value[1].len - 1;
    mcf->scope_index = ngx_http_get_variable_index(cf, &name);
    return mcf->scope_index == NGX_ERROR ? NGX_CONF_ERROR : NGX_CONF_OK;
}

static ngx_int_t
ngx_muse_init(ngx_conf_t *cf)
{
    return NGX_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* responses                                                                                   */

static ngx_int_t
ngx_muse_add_header(ngx_http_request_t *r, const char *name, const char *value)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }
    h->hash = 1;
    h->key.data = (u_char *) name;
    h->key.len = ngx_strlen(name);
    h->value.data = (u_char *) value;
    h->value.len = ngx_strlen(value);
    return NGX_OK;
}

static ngx_int_t
ngx_muse_send_body(ngx_http_request_t *r, ngx_uint_t status, const char *type, u_char *data,
    size_t len)
{
    ngx_buf_t    *b;
    ngx_chain_t   out;
    ngx_int_t     rc;

    r->headers_out.status = status;
    r->headers_out.content_type.data = (u_char *) type;
    r->headers_out.content_type.len = ngx_strlen(type);
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_length_n = len;
    if (status == NGX_HTTP_SERVICE_UNAVAILABLE || status == NGX_HTTP_TOO_MANY_REQUESTS) {
        if (ngx_muse_add_header(r, "Retry-After", "1") != NGX_OK) {
            return NGX_ERROR;
        }
    }
    if (status == NGX_HTTP_NOT_ALLOWED) {
        if (ngx_muse_add_header(r, "Allow", "POST") != NGX_OK) {
            return NGX_ERROR;
        }
    }
    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only || len == 0) {
        return rc;
    }
    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }
    b->pos = data;
    b->last = data + len;
    b->memory = 1;
    b->last_buf = (r == r->main) ? 1 : 0;
    b->last_in_chain = 1;
    out.buf = b;
    out.next = NULL;
    return ngx_http_output_filter(r, &out);
}

/* OpenAI error JSON. message and param are ours, never user bytes. */
static ngx_int_t
ngx_muse_send_error(ngx_http_request_t *r, ngx_uint_t status, const char *type,
    const char *param, const char *code, const char *message)
{
    u_char  *buf, *p;
    size_t   len;

    len = 128 + ngx_strlen(type) + ngx_strlen(message) + (param ? ngx_strlen(param) : 4)
          + (code ? ngx_strlen(code) : 4);
    buf = ngx_pnalloc(r->pool, len);
    if (buf == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    p = ngx_snprintf(buf, len, "{\"error\":{\"message\":\"%s\",\"type\":\"%s\",\"param\":%s%s%s,"
                     "\"code\":%s%s%s}}\n", message, type, param ? "\"" : "",
                     param ? param : "null", param ? "\"" : "", code ? "\"" : "",
                     code ? code : "null", code ? "\"" : "");
    return ngx_muse_send_body(r, status, "application/json", buf, p - buf);
}

static ngx_int_t
ngx_muse_unavailable(ngx_http_request_t *r, const char *message)
{
    return ngx_muse_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE, "server_error", NULL,
                               "engine_unavailable", message);
}

/* ------------------------------------------------------------------------------------------ */
/* the engine's segment                                                                        */

static uint64_t
ngx_muse_mono_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t) ts.tv_sec * 1000000000ULL + (uint64_t) ts.tv_nsec;
}

static void
ngx_muse_map_unref(ngx_muse_map_t *m)
{
    if (m == NULL) {
        return;
    }
    if (m->refs > 0) {
        m->refs--;
    }
    if (m->refs == 0 && m->retired) {
        munmap(m->base, m->size);
        ngx_free(m);
    }
}

static muse_ring_header *
ngx_muse_hdr(ngx_muse_map_t *m)
{
    return (muse_ring_header *) m->base;
}

/* The current segment, remapped when the engine recreated it (new inode) or when the old
 * mapping says DOWN. NULL when the engine is absent or speaks another ABI (logged once). */
static ngx_muse_map_t *
ngx_muse_attach(ngx_muse_engine_t *eng, ngx_log_t *log)
{
    int               fd;
    struct stat       st;
    void             *base;
    const char       *why;
    ngx_muse_map_t   *m;
    muse_ring_header  lay;
    muse_ring_header *h;

    fd = shm_open((char *) eng->shm_name.data, O_RDWR, 0);
    if (fd == -1) {
        ngx_log_error(NGX_LOG_INFO, log, ngx_errno, "muse: engine segment \"%V\" absent",
                      &eng->shm_name);
        return NULL;
    }
    if (fstat(fd, &st) == -1) {
        close(fd);
        return NULL;
    }
    m = eng->map;
    if (m && m->dev == st.st_dev && m->ino == st.st_ino && (off_t) m->size == st.st_size) {
        close(fd);
        return m;
    }
    if (m) {
        m->retired = 1;
        eng->map = NULL;
        m->refs++;
        ngx_muse_map_unref(m);
    }
    if (st.st_size < (off_t) sizeof(muse_ring_header)) {
        close(fd);
        return NULL;
    }
    base = mmap(NULL, st.st_size, PROT_READ|PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (base == MAP_FAILED) {
        ngx_log_error(NGX_LOG_ERR, log, ngx_errno, "muse: mmap of \"%V\" failed",
                      &eng->shm_name);
        return NULL;
    }
    /* check a private copy: the shared header could change between check and use */
    ngx_memcpy(&lay, base, sizeof(lay));
    h = &lay;
    if (muse_ring_check_header(h, st.st_size, &why) != 0) {
        if (h->magic == MUSE_RING_MAGIC && h->abi_version != MUSE_RING_ABI_VERSION) {
            ngx_log_error(NGX_LOG_ERR, log, 0,
                          "muse: engine segment \"%V\" speaks ABI version %uD, this module "
                          "speaks %uD: upgrade the engine and the module together",
                          &eng->shm_name, h->abi_version, (uint32_t) MUSE_RING_ABI_VERSION);
        } else {
            ngx_log_error(NGX_LOG_ERR, log, 0, "muse: engine segment \"%V\" refused: %s",
                          &eng->shm_name, why);
        }
        munmap(base, st.st_size);
        return NULL;
    }
    m = ngx_alloc(sizeof(ngx_muse_map_t), log);
    if (m == NULL) {
        munmap(base, st.st_size);
        return NULL;
    }
    m->base = base;
    m->lay = lay;
    m->size = st.st_size;
    m->dev = st.st_dev;
    m->ino = st.st_ino;
    m->refs = 0;
    m->retired = 0;
    eng->map = m;
    return m;
}

/* ------------------------------------------------------------------------------------------ */
/* validation                                                                                  */

/* A param echoed into an error must be a plain field name (it can come from the client). */
static int
ngx_muse_param_safe(const char *p)
{
    size_t  i;

    for (i = 0; p[i]; i++) {
        if (i >= 64 || !(isalnum((u_char) p[i]) || ngx_strchr("_.[]-", p[i]))) {
            return 0;
        }
    }
    return i > 0;
}

static ngx_int_t
ngx_muse_bad(ngx_muse_verr_t *err, const char *param, const char *message)
{
    err->status = NGX_HTTP_BAD_REQUEST;
    err->type = "invalid_request_error";
    err->code = NULL;
    err->message = message;
    err->param[0] = '\0';
    if (param && ngx_muse_param_safe(param)) {
        ngx_cpystrn((u_char *) err->param, (u_char *) param, sizeof(err->param));
    }
    return NGX_ERROR;
}

static ngx_int_t
ngx_muse_bad_at(ngx_muse_verr_t *err, const char *fmt, int i, int j, const char *message)
{
    char  path[NGX_MUSE_PATH_LEN];

    ngx_snprintf((u_char *) path, sizeof(path) - 1, fmt, i, j)[0] = '\0';
    return ngx_muse_bad(err, path, message);
}

static int
ngx_muse_is_int(cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && floor(v->valuedouble) == v->valuedouble
           && v->valuedouble >= lo && v->valuedouble <= hi;
}

static int
ngx_muse_is_num(cJSON *v, double lo, double hi)
{
    return cJSON_IsNumber(v) && isfinite(v->valuedouble) && v->valuedouble >= lo
           && v->valuedouble <= hi;
}

/* Strict UTF-8: no overlong forms, no surrogates, nothing past U+10FFFF. */
static int
ngx_muse_utf8_ok(const u_char *p, size_t n)
{
    size_t    i = 0, k, len;
    uint32_t  cp, min;

    while (i < n) {
        u_char c = p[i];
        if (c < 0x80) { i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; min = 0x80; }
        else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; min = 0x800; }
        else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; min = 0x10000; }
        else { return 0; }
        if (i + len > n) { return 0; }
        for (k = 1; k < len; k++) {
            if ((p[i + k] & 0xC0) != 0x80) { return 0; }
            cp = (cp << 6) | (p[i + k] & 0x3F);
        }
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) { return 0; }
        i += len;
    }
    return 1;
}

static int
ngx_muse_key_cmp(const void *a, const void *b)
{
    return strcmp(*(char * const *) a, *(char * const *) b);
}

/* Every string valid UTF-8, no duplicate keys (depth: ngx_muse_json_shape bounded it). Names
 * the top-level field. */
static ngx_int_t
ngx_muse_check_tree(cJSON *node, const char *field, int depth, ngx_muse_verr_t *err,
    ngx_pool_t *pool)
{
    cJSON   *c;
    char   **keys;
    size_t   n = 0, i;

    if (cJSON_IsString(node) && !ngx_muse_utf8_ok((u_char *) node->valuestring,
                                                  ngx_strlen(node->valuestring)))
    {
        return ngx_muse_bad(err, field, "string is not valid UTF-8");
    }
    if (!cJSON_IsArray(node) && !cJSON_IsObject(node)) {
        return NGX_OK;
    }
    for (c = node->child; c; c = c->next) {
        n++;
        if (c->string && !ngx_muse_utf8_ok((u_char *) c->string, ngx_strlen(c->string))) {
            return ngx_muse_bad(err, depth ? field : NULL, "object key is not valid UTF-8");
        }
        if (ngx_muse_check_tree(c, depth ? field : c->string, depth + 1, err, pool)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    }
    if (!cJSON_IsObject(node) || n < 2) {
        return NGX_OK;
    }
    keys = ngx_palloc(pool, n * sizeof(char *));
    if (keys == NULL) {
        return ngx_muse_bad(err, field, "out of memory");
    }
    for (i = 0, c = node->child; c; c = c->next) {
        keys[i++] = c->string;
    }
    ngx_qsort(keys, n, sizeof(char *), ngx_muse_key_cmp);
    for (i = 1; i < n; i++) {
        if (strcmp(keys[i - 1], keys[i]) == 0) {
            ngx_pfree(pool, keys);
            return ngx_muse_bad(err, depth ? field : keys[i], "duplicate key in object");
        }
    }
    ngx_pfree(pool, keys);
    return NGX_OK;
}

static int
ngx_muse_depth(cJSON *node)
{
    int     d = 0, x;
    cJSON  *c;

    for (c = node->child; c; c = c->next) {
        x = ngx_muse_depth(c);
        d = x > d ? x : d;
    }
    return d + 1;
}

static int
ngx_muse_str_in(cJSON *v, const char **set)
{
    if (!cJSON_IsString(v)) {
        return 0;
    }
    for (; *set; set++) {
        if (strcmp(v->valuestring, *set) == 0) {
            return 1;
        }
    }
    return 0;
}

static ngx_int_t
ngx_muse_check_stop(cJSON *v, ngx_muse_verr_t *err)
{
    cJSON  *c;
    int     n = 0;

    if (cJSON_IsString(v)) {
        if (v->valuestring[0] == '\0' || ngx_strlen(v->valuestring) > 1024) {
            return ngx_muse_bad(err, "stop", "stop string must be 1..1024 bytes");
        }
        return NGX_OK;
    }
    if (!cJSON_IsArray(v)) {
        return ngx_muse_bad(err, "stop", "stop must be a string or an array of strings");
    }
    for (c = v->child; c; c = c->next) {
        if (++n > 4) {
            return ngx_muse_bad(err, "stop", "at most 4 stop strings");
        }
        if (!cJSON_IsString(c) || c->valuestring[0] == '\0'
            || ngx_strlen(c->valuestring) > 1024)
        {
            return ngx_muse_bad(err, "stop", "stop strings must be strings of 1..1024 bytes");
        }
    }
    return NGX_OK;
}

static ngx_int_t
ngx_muse_check_messages(cJSON *msgs, ngx_muse_verr_t *err)
{
    static const char  *roles[] = { "system", "developer", "user", "assistant", "tool", NULL };
    cJSON              *m, *role, *content, *part, *type;
    int                 i = 0, j;

    if (!cJSON_IsArray(msgs)) {
        return ngx_muse_bad(err, "messages", "messages must be an array");
    }
    if (msgs->child == NULL) {
        return ngx_muse_bad(err, "messages", "messages must not be empty");
    }
    for (m = msgs->child; m; m = m->next, i++) {
        if (i >= 4096) {
            return ngx_muse_bad(err, "messages", "at most 4096 messages");
        }
        if (!cJSON_IsObject(m)) {
            return ngx_muse_bad_at(err, "messages[%d]", i, 0, "each message must be an object");
        }
        role = cJSON_GetObjectItemCaseSensitive(m, "role");
        if (!ngx_muse_str_in(role, roles)) {
            return ngx_muse_bad_at(err, "messages[%d].role", i, 0,
                                   "role must be system, developer, user, assistant or tool");
        }
        content = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (content == NULL || cJSON_IsNull(content)) {
            if (strcmp(role->valuestring, "assistant") == 0
                && cJSON_GetObjectItemCaseSensitive(m, "tool_calls"))
            {
                continue;
            }
            return ngx_muse_bad_at(err, "messages[%d].content", i, 0, "content is required");
        }
        if (cJSON_IsString(content)) {
            continue;
        }
        if (!cJSON_IsArray(content)) {
            return ngx_muse_bad_at(err, "messages[%d].content", i, 0,
                                   "content must be a string or an array of text parts");
        }
        for (j = 0, part = content->child; part; part = part->next, j++) {
            type = cJSON_IsObject(part) ? cJSON_GetObjectItemCaseSensitive(part, "type") : NULL;
            if (!cJSON_IsString(type)) {
                return ngx_muse_bad_at(err, "messages[%d].content[%d]", i, j,
                                       "content parts must be objects with a type");
            }
            if (strcmp(type->valuestring, "text") != 0) {
                return ngx_muse_bad_at(err, "messages[%d].content[%d]", i, j,
                                       "only text content parts are supported (no images "
                                       "or audio)");
            }
            if (!cJSON_IsString(cJSON_GetObjectItemCaseSensitive(part, "text"))) {
                return ngx_muse_bad_at(err, "messages[%d].content[%d].text", i, j,
                                       "text part needs a string text");
            }
        }
    }
    return NGX_OK;
}

static ngx_int_t
ngx_muse_check_tools(cJSON *tools, cJSON *choice, ngx_muse_verr_t *err)
{
    static const char  *modes[] = { "auto", "none", "required", NULL };
    cJSON              *t, *fn, *name, *params, *cn;
    int                 i = 0, found = 0;

    if (tools) {
        if (!cJSON_IsArray(tools)) {
            return ngx_muse_bad(err, "tools", "tools must be an array");
        }
        for (t = tools->child; t; t = t->next, i++) {
            if (i >= 128) {
                return ngx_muse_bad(err, "tools", "at most 128 tools");
            }
            fn = cJSON_IsObject(t) ? cJSON_GetObjectItemCaseSensitive(t, "function") : NULL;
            if (!cJSON_IsObject(t)
                || !ngx_muse_str_in(cJSON_GetObjectItemCaseSensitive(t, "type"),
                                    (const char *[]) { "function", NULL })
                || !cJSON_IsObject(fn))
            {
                return ngx_muse_bad_at(err, "tools[%d]", i, 0,
                                       "a tool must be {\\\"type\\\":\\\"function\\\","
                                       "\\\"function\\\":{...}}");
            }
            name = cJSON_GetObjectItemCaseSensitive(fn, "name");
            if (!cJSON_IsString(name) || name->valuestring[0] == '\0'
                || ngx_strlen(name->valuestring) > 64)
            {
                return ngx_muse_bad_at(err, "tools[%d].function.name", i, 0,
                                       "function name must be a string of 1..64 bytes");
            }
            params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
            if (params && (!cJSON_IsObject(params)
                           || ngx_muse_depth(params) > NGX_MUSE_MAX_DEPTH))
            {
                return ngx_muse_bad_at(err, "tools[%d].function.parameters", i, 0,
                                       "parameters must be a JSON schema object nested at "
                                       "most 64 deep");
            }
        }
    }
    if (choice == NULL || ngx_muse_str_in(choice, modes)) {
        return NGX_OK;
    }
    fn = cJSON_IsObject(choice) ? cJSON_GetObjectItemCaseSensitive(choice, "function") : NULL;
    cn = fn ? cJSON_GetObjectItemCaseSensitive(fn, "name") : NULL;
    if (!cJSON_IsString(cn)) {
        return ngx_muse_bad(err, "tool_choice",
                            "tool_choice must be auto, none, required or a named function");
    }
    for (t = tools ? tools->child : NULL; t; t = t->next) {
        name = cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(t, "function"),
                                                "name");
        found |= cJSON_IsString(name) && strcmp(name->valuestring, cn->valuestring) == 0;
    }
    return found ? NGX_OK
                 : ngx_muse_bad(err, "tool_choice", "tool_choice names no function in tools");
}

/* Fields whose meaning the server does not implement: 400 naming them, never a silent 200. */
static ngx_int_t
ngx_muse_check_unsupported(cJSON *root, ngx_uint_t kind, ngx_muse_verr_t *err)
{
    static const char  *refused[] = { "logit_bias", "response_format", "top_logprobs",
                                      "functions", "function_call", "audio", "modalities",
                                      "prediction", "web_search_options", NULL };
    const char        **f;
    cJSON              *v;

    for (f = refused; *f; f++) {
        if (cJSON_GetObjectItemCaseSensitive(root, *f)) {
            return ngx_muse_bad(err, *f, "this field is not supported by this server");
        }
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "logprobs");
    if (v && !cJSON_IsFalse(v) && !cJSON_IsNull(v)) {
        return ngx_muse_bad(err, "logprobs", "logprobs is not supported by this server");
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "frequency_penalty");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        return ngx_muse_bad(err, "frequency_penalty", "only frequency_penalty 0 is supported");
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "presence_penalty");
    if (v && !(cJSON_IsNumber(v) && v->valuedouble == 0)) {
        return ngx_muse_bad(err, "presence_penalty", "only presence_penalty 0 is supported");
    }
    if (kind == NGX_MUSE_SERVE_COMPLETIONS) {
        v = cJSON_GetObjectItemCaseSensitive(root, "echo");
        if (v && !cJSON_IsFalse(v)) {
            return ngx_muse_bad(err, "echo", "echo is not supported by this server");
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (v && !cJSON_IsNull(v)) {
            return ngx_muse_bad(err, "suffix", "suffix is not supported by this server");
        }
        v = cJSON_GetObjectItemCaseSensitive(root, "best_of");
        if (v && !ngx_muse_is_int(v, 1, 1)) {
            return ngx_muse_bad(err, "best_of", "only best_of 1 is supported");
        }
    }
    return NGX_OK;
}

static ngx_int_t
ngx_muse_check_prompt(cJSON *prompt, ngx_muse_verr_t *err)
{
    cJSON  *c;

    if (cJSON_IsString(prompt)) {
        return NGX_OK;
    }
    if (!cJSON_IsArray(prompt) || prompt->child == NULL) {
        return ngx_muse_bad(err, "prompt", "prompt must be a string or a non-empty array of "
                                           "token ids");
    }
    for (c = prompt->child; c; c = c->next) {
        if (!ngx_muse_is_int(c, 0, 2147483647.0)) {
            return ngx_muse_bad(err, "prompt", "token ids must be integers >= 0");
        }
    }
    return NGX_OK;
}

/* The request fields of API.md. Sets *flags (MUSE_REQ_*). */
static ngx_int_t
ngx_muse_validate(ngx_muse_loc_conf_t *mcf, cJSON *root, ngx_uint_t *flags,
    ngx_muse_verr_t *err)
{
    static const char  *efforts[] = { "low", "medium", "high", NULL };
    cJSON              *v, *inc;

    if (!cJSON_IsObject(root)) {
        return ngx_muse_bad(err, NULL, "the request body must be a JSON object");
    }
    if (ngx_muse_check_unsupported(root, mcf->serve, err) != NGX_OK) {
        return NGX_ERROR;
    }
    v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (v && !cJSON_IsString(v)) {
        return ngx_muse_bad(err, "model", "model must be a string");
    }
    if (v && (ngx_strlen(v->valuestring) != mcf->model_id.len
              || ngx_strncmp(v->valuestring, mcf->model_id.data, mcf->model_id.len) != 0))
    {
        ngx_muse_bad(err, "model", "The model does not exist or you do not have access to it.");
        err->status = NGX_HTTP_NOT_FOUND;
        err->code = "model_not_found";
        return NGX_ERROR;
    }
    if (mcf->serve == NGX_MUSE_SERVE_CHAT) {
        if (ngx_muse_check_messages(cJSON_GetObjectItemCaseSensitive(root, "messages"), err)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
        if (ngx_muse_check_tools(cJSON_GetObjectItemCaseSensitive(root, "tools"),
                                 cJSON_GetObjectItemCaseSensitive(root, "tool_choice"), err)
            != NGX_OK)
        {
            return NGX_ERROR;
        }
    } else if (ngx_muse_check_prompt(cJSON_GetObjectItemCaseSensitive(root, "prompt"), err)
               != NGX_OK)
    {
        return NGX_ERROR;
    }
    *flags = 0;
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream"))) {
        if (!cJSON_IsBool(v)) {
            return ngx_muse_bad(err, "stream", "stream must be a boolean");
        }
        *flags |= cJSON_IsTrue(v) ? MUSE_REQ_STREAM : 0;
    }
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stream_options"))) {
        inc = cJSON_IsObject(v) ? cJSON_GetObjectItemCaseSensitive(v, "include_usage") : NULL;
        if (!cJSON_IsObject(v) || (inc && !cJSON_IsBool(inc))) {
            return ngx_muse_bad(err, "stream_options",
                                "stream_options must be {\\\"include_usage\\\": boolean}");
        }
        *flags |= cJSON_IsTrue(inc) ? MUSE_REQ_INCLUDE_USAGE : 0;
    }
#define NGX_MUSE_RANGE(name, test, msg)                                                     \
    if ((v = cJSON_GetObjectItemCaseSensitive(root, name)) && !(test)) {                     \
        return ngx_muse_bad(err, name, msg);                                                 \
    }
    NGX_MUSE_RANGE("max_tokens", ngx_muse_is_int(v, 1, 2147483647.0),
                   "max_tokens must be an integer from 1 to 2147483647")
    NGX_MUSE_RANGE("max_completion_tokens", ngx_muse_is_int(v, 1, 2147483647.0),
                   "max_completion_tokens must be an integer from 1 to 2147483647")
    NGX_MUSE_RANGE("temperature", ngx_muse_is_num(v, 0, 2),
                   "temperature must be a number from 0 to 2")
    NGX_MUSE_RANGE("top_p", ngx_muse_is_num(v, 0, 1) && v->valuedouble > 0,
                   "top_p must be a number in (0, 1]")
    NGX_MUSE_RANGE("top_k", ngx_muse_is_int(v, 0, 2147483647.0),
                   "top_k must be an integer >= 0 (0 = off)")
    NGX_MUSE_RANGE("min_p", ngx_muse_is_num(v, 0, 1), "min_p must be a number from 0 to 1")
    NGX_MUSE_RANGE("seed", ngx_muse_is_int(v, -9007199254740992.0, 9007199254740992.0),
                   "seed must be an integer")
    NGX_MUSE_RANGE("n", ngx_muse_is_int(v, 1, 1), "only n = 1 is supported")
    NGX_MUSE_RANGE("parallel_tool_calls", cJSON_IsBool(v),
                   "parallel_tool_calls must be a boolean")
    NGX_MUSE_RANGE("reasoning_effort", ngx_muse_str_in(v, efforts),
                   "reasoning_effort must be low, medium or high")
    NGX_MUSE_RANGE("user", cJSON_IsString(v), "user must be a string")
#undef NGX_MUSE_RANGE
    if ((v = cJSON_GetObjectItemCaseSensitive(root, "stop"))) {
        if (ngx_muse_check_stop(v, err) != NGX_OK) {
            return NGX_ERROR;
        }
    }
    return NGX_OK;
}

/* A JSON escape \u0000 (not itself escaped) would become a NUL that cJSON silently cuts at. */
static int
ngx_muse_has_nul_escape(const u_char *p, size_t n)
{
    size_t  i, k;

    for (i = 0; i + 6 <= n; i++) {
        if (p[i] != '\\' || p[i + 1] != 'u' || ngx_strncmp(p + i + 2, "0000", 4) != 0) {
            continue;
        }
        for (k = 0; k < i && p[i - 1 - k] == '\\'; k++) { /* count backslashes before */ }
        if (k % 2 == 0) {
            return 1;
        }
    }
    return 0;
}

/* Counts the items (values and object keys) and the nesting of a JSON text without building
 * it, so a body of millions of tiny items or a 100k-deep one is refused before cJSON spends
 * its ~64 bytes an item on it. */
static ngx_int_t
ngx_muse_json_shape(ngx_muse_loc_conf_t *mcf, u_char *p, size_t len, ngx_muse_verr_t *err)
{
    u_char      *end = p + len;
    ngx_uint_t   items = 0, depth = 0, in_string = 0, expect = 1;

    for ( /* void */ ; p < end; p++) {
        if (in_string) {
            if (*p == '\\' && p + 1 < end) {
                p++;    /* the escaped character, maybe a quote */
            } else if (*p == '"') {
                in_string = 0;
            }
            continue;
        }
        if (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n') {
            continue;
        }
        if (expect && *p != ']' && *p != '}' && ++items > mcf->max_json_values) {
            return ngx_muse_bad(err, NULL,
                                "the request has more JSON items (values and keys) than "
                                "muse_max_json_values allows; send less, or raise "
                                "muse_max_json_values");
        }
        expect = 0;
        switch (*p) {
        case '"':
            in_string = 1;
            break;
        case '[':
        case '{':
            if (++depth > NGX_MUSE_MAX_NESTING) {
                return ngx_muse_bad(err, NULL,
                                    "the request nests JSON deeper than 200 levels");
            }
            expect = 1;
            break;
        case ']':
        case '}':
            depth -= depth > 0;
            break;
        case ',':
        case ':':
            expect = 1;
            break;
        }
    }
    return NGX_OK;
}

/* Parses and validates; on success *out is the compact JSON in r->pool. */
static ngx_int_t
ngx_muse_parse(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf, u_char *body, size_t len,
    ngx_str_t *out, ngx_uint_t *flags, ngx_muse_verr_t *err)
{
    cJSON       *root;
    char        *printed;
    ngx_int_t    rc;

    if (len == 0) {
        return ngx_muse_bad(err, NULL, "the request body is empty; send a JSON object");
    }
    if (ngx_strlchr(body, body + len, '\0') != NULL || ngx_muse_has_nul_escape(body, len)) {
        return ngx_muse_bad(err, NULL, "NUL characters are not allowed in the request");
    }
    if (ngx_muse_json_shape(mcf, body, len, err) != NGX_OK) {
        return NGX_ERROR;
    }
    root = cJSON_ParseWithOpts((char *) body, NULL, 1);
    if (root == NULL) {
        return ngx_muse_bad(err, NULL, "the request body is not valid JSON");
    }
    rc = ngx_muse_check_tree(root, NULL, 0, err, r->pool);
    if (rc == NGX_OK) {
        rc = ngx_muse_validate(mcf, root, flags, err);
    }
    if (rc == NGX_OK) {
        printed = cJSON_PrintUnformatted(root);
        if (printed == NULL) {
            cJSON_Delete(root);
            return ngx_muse_bad(err, NULL, "out of memory");
        }
        out->len = ngx_strlen(printed);
        out->data = ngx_pnalloc(r->pool, out->len);
        if (out->data) {
            ngx_memcpy(out->data, printed, out->len);
        }
        cJSON_free(printed);
        rc = out->data ? NGX_OK : ngx_muse_bad(err, NULL, "out of memory");
    }
    cJSON_Delete(root);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* request body, in memory or spilled to a temp file                                           */

static u_char *
ngx_muse_read_body(ngx_http_request_t *r, size_t *len)
{
    ngx_chain_t  *cl;
    ngx_buf_t    *b;
    size_t        total = 0, n;
    ssize_t       got;
    u_char       *buf, *p;

    if (r->request_body == NULL) {
        *len = 0;
        return (u_char *) "";
    }
    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        total += b->in_file ? (size_t) (b->file_last - b->file_pos) : (size_t) (b->last - b->pos);
    }
    buf = ngx_pnalloc(r->pool, total + 1);
    if (buf == NULL) {
        return NULL;
    }
    p = buf;
    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;
        if (b->in_file) {
            n = (size_t) (b->file_last - b->file_pos);
            got = ngx_read_file(b->file, p, n, b->file_pos);
            if (got != (ssize_t) n) {
                return NULL;
            }
            p += n;
        } else {
            p = ngx_cpymem(p, b->pos, b->last - b->pos);
        }
    }
    *p = '\0';
    *len = total;
    return buf;
}

/* ------------------------------------------------------------------------------------------ */
/* submitting to the engine                                                                    */

static void
ngx_muse_close_peer(ngx_muse_ctx_t *ctx)
{
    if (ctx->peer) {
        ngx_close_connection(ctx->peer);   /* removes its events and timers */
        ctx->peer = NULL;
    }
    if (ctx->map) {
        ngx_muse_map_unref(ctx->map);
        ctx->map = NULL;
    }
}

/* Client gone, timeout or request freed: the doorbell closes, the engine cancels. */
static void
ngx_muse_cleanup(void *data)
{
    ngx_muse_ctx_t  *ctx = data;

    ctx->finished = 1;
    ngx_muse_close_peer(ctx);
}

static void
ngx_muse_finish(ngx_muse_ctx_t *ctx, ngx_int_t rc)
{
    ngx_http_request_t  *r = ctx->request;

    if (ctx->finished) {
        return;
    }
    ctx->finished = 1;
    ngx_muse_close_peer(ctx);
    ngx_http_finalize_request(r, rc);
}

static void
ngx_muse_peer_write(ngx_event_t *wev)
{
}

static void
ngx_muse_arm_timer(ngx_muse_ctx_t *ctx)
{
    ngx_muse_loc_conf_t  *mcf;
    ngx_msec_t            t;

    ngx_msec_t            waited;

    mcf = ngx_http_get_module_loc_conf(ctx->request, ngx_muse_module);
    if (ctx->headers_sent || ctx->admitted) {
        t = mcf->idle_timeout;
    } else {
        /* the queue deadline counts from the request's start, not from the last wake-up */
        waited = ngx_current_msec - ctx->started;
        t = waited < mcf->queue_timeout ? mcf->queue_timeout - waited : 1;
    }
    ngx_add_timer(ctx->peer->read, t);
}

static void
ngx_muse_peer_read(ngx_event_t *rev)
{
    ngx_connection_t     *pc = rev->data, *c;
    ngx_muse_ctx_t       *ctx = pc->data;
    ngx_http_request_t   *r = ctx->request;
    u_char                buf[256];
    ssize_t               n;

    c = r->connection;
    if (rev->timedout) {
        rev->timedout = 0;
        if (!ctx->headers_sent && !ctx->admitted) {
            ngx_log_error(NGX_LOG_WARN, c->log, 0, "muse: no answer from the engine within "
                          "muse_queue_timeout; cancelling");
            ngx_muse_finish(ctx, ngx_muse_send_error(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                            "server_error", NULL, "queue_timeout",
                            "the engine did not start this request in time; retry later"));
        } else if (c->buffered || ctx->busy) {
            /* the client is the slow side, not the engine: send_timeout governs that */
            ngx_muse_arm_timer(ctx);
            return;
        } else {
            ctx->peer_eof = 1;   /* idle: treat as a dead engine */
            ngx_log_error(NGX_LOG_WARN, c->log, 0, "muse: engine idle past muse_idle_timeout");
            ngx_muse_drain(ctx);
        }
        ngx_http_run_posted_requests(c);
        return;
    }
    for ( ;; ) {
        n = recv(pc->fd, buf, sizeof(buf), 0);
        if (n > 0) {
            continue;
        }
        if (n == 0 || (ngx_socket_errno != NGX_EAGAIN && ngx_socket_errno != NGX_EINTR)) {
            ctx->peer_eof = 1;
        }
        rev->ready = 0;
        break;
    }
    if (!ctx->peer_eof && ngx_handle_read_event(rev, 0) != NGX_OK) {
        ctx->peer_eof = 1;
    }
    ngx_muse_drain(ctx);
    ngx_http_run_posted_requests(c);
}

/* Claims a free slot (CAS), writes the record, connects the doorbell and sends the claim. */
static ngx_int_t
ngx_muse_submit(ngx_http_request_t *r, ngx_muse_ctx_t *ctx, ngx_str_t *body,
    ngx_uint_t kind, ngx_uint_t flags, ngx_str_t *scope, const char **why)
{
    muse_ring_header     *h;
    muse_ring_slot       *sl = NULL;
    muse_claim_msg        msg;
    struct sockaddr_un    sa;
    ngx_uint_t            i, start;
    uint32_t              want;
    int                   fd;
    ngx_connection_t     *pc;

    ctx->map = ngx_muse_attach(ctx->engine, r->connection->log);
    if (ctx->map == NULL) {
        return *why = "the engine is not running", NGX_DECLINED;
    }
    ctx->map->refs++;
    h = ngx_muse_hdr(ctx->map);
    if (atomic_load(&h->state) != MUSE_ENGINE_SERVING) {
        return *why = "the engine is starting or stopping; retry later", NGX_DECLINED;
    }
    if ((ngx_muse_mono_ns() - atomic_load(&h->heartbeat_ns)) / 1000000 > NGX_MUSE_STALE_MS) {
        return *why = "the engine is not answering; retry later", NGX_DECLINED;
    }
    if (muse_request_record_bytes(scope->len, body->len) > ctx->map->lay.request_bytes) {
        return *why = "too large", NGX_ABORT;
    }
    start = (ngx_uint_t) ngx_pid + (ngx_uint_t) ngx_random();
    for (i = 0; i < ctx->map->lay.slot_count; i++) {
        ctx->slot = (uint32_t) ((start + i) % ctx->map->lay.slot_count);
        sl = muse_ring_slot_at(ctx->map->base, &ctx->map->lay, ctx->slot);
        want = MUSE_SLOT_FREE;
        if (atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_CLAIMED)) {
            break;
        }
        sl = NULL;
    }
    if (sl == NULL) {
        return *why = "all engine slots are busy; retry later", NGX_DECLINED;
    }
    ctx->seg_generation = ctx->map->lay.generation;
    ctx->slot_generation = atomic_fetch_add(&sl->generation, 1) + 1;
    atomic_store(&sl->owner_pid, (uint32_t) ngx_pid);
    atomic_store(&sl->claim_ns, ngx_muse_mono_ns());
    atomic_store(&sl->head, 0);
    atomic_store(&sl->tail, 0);
    atomic_store(&sl->wake, 0);
    if (muse_request_encode(muse_ring_request_area(sl), ctx->map->lay.request_bytes, ctx->slot_generation,
                            kind, (uint32_t) flags, scope->data, scope->len, body->data,
                            body->len) != 0)
    {
        want = MUSE_SLOT_CLAIMED;
        atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_FREE);
        return *why = "request record does not fit", NGX_ABORT;
    }
    /* only from CLAIMED: the engine's reaper may have taken back a slot it thought dead */
    want = MUSE_SLOT_CLAIMED;
    if (!atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_SUBMITTED)) {
        return *why = "the engine took the slot back; retry", NGX_DECLINED;
    }

    fd = socket(AF_UNIX, SOCK_STREAM|SOCK_NONBLOCK|SOCK_CLOEXEC, 0);
    ngx_memzero(&sa, sizeof(sa));
    sa.sun_family = AF_UNIX;
    ngx_memcpy(sa.sun_path, ctx->engine->socket_path.data, ctx->engine->socket_path.len);
    ngx_memzero(&msg, sizeof(msg));
    msg.magic = MUSE_CLAIM_MAGIC;
    msg.abi_version = MUSE_RING_ABI_VERSION;
    msg.segment_generation = ctx->seg_generation;
    msg.slot_generation = ctx->slot_generation;
    msg.slot = ctx->slot;
    if (fd == -1 || connect(fd, (struct sockaddr *) &sa, sizeof(sa)) == -1
        || send(fd, &msg, sizeof(msg), MSG_NOSIGNAL) != (ssize_t) sizeof(msg))
    {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, ngx_socket_errno,
                      "muse: cannot reach the engine's socket");
        if (fd != -1) {
            close(fd);
        }
        want = MUSE_SLOT_SUBMITTED;
        atomic_compare_exchange_strong(&sl->state, &want, MUSE_SLOT_FREE);
        return *why = "the engine is not answering; retry later", NGX_DECLINED;
    }
    pc = ngx_get_connection(fd, r->connection->log);
    if (pc == NULL) {
        close(fd);   /* the engine sees EOF and frees the slot */
        return *why = "out of connections", NGX_DECLINED;
    }
    pc->data = ctx;
    pc->read->handler = ngx_muse_peer_read;
    pc->write->handler = ngx_muse_peer_write;
    pc->read->log = pc->write->log = pc->log;
    pc->write->ready = 1;
    ctx->peer = pc;
    if (ngx_handle_read_event(pc->read, 0) != NGX_OK) {
        return *why = "cannot watch the engine socket", NGX_DECLINED;
    }
    return NGX_OK;
}

/* ------------------------------------------------------------------------------------------ */
/* engine events -> HTTP output                                                                */

static ngx_int_t
ngx_muse_start_output(ngx_muse_ctx_t *ctx)
{
    ngx_http_request_t        *r = ctx->request;
    ngx_http_core_loc_conf_t  *clcf;
    ngx_int_t                  rc;

    r->headers_out.status = NGX_HTTP_OK;
    r->headers_out.content_length_n = -1;
    if (ctx->stream) {
        ngx_str_set(&r->headers_out.content_type, "text/event-stream");
        /* small events must not wait for Nagle, as with unbuffered proxying */
        clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);
        if (clcf->tcp_nodelay && ngx_tcp_nodelay(r->connection) != NGX_OK) {
            return NGX_ERROR;
        }
        if (ngx_muse_add_header(r, "Cache-Control", "no-cache") != NGX_OK
            || ngx_muse_add_header(r, "X-Accel-Buffering", "no") != NGX_OK)
        {
            return NGX_ERROR;
        }
    } else {
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    ctx->headers_sent = 1;
    rc = ngx_http_send_header(r);
    if (rc == NGX_ERROR || rc > NGX_OK) {
        return NGX_ERROR;
    }
    ngx_muse_arm_timer(ctx);
    return ngx_http_send_special(r, NGX_HTTP_FLUSH);
}

/* A buffer of at least size bytes from the free list (reused across events). */
static ngx_buf_t *
ngx_muse_get_buf(ngx_muse_ctx_t *ctx, ngx_chain_t ***last, size_t size)
{
    ngx_chain_t  *cl;
    ngx_buf_t    *b;
    size_t        cap = size > NGX_MUSE_BUF_SIZE ? size : NGX_MUSE_BUF_SIZE;

    cl = ngx_chain_get_free_buf(ctx->request->pool, &ctx->free);
    if (cl == NULL) {
        return NULL;
    }
    b = cl->buf;
    if (b->start == NULL || (size_t) (b->end - b->start) < size) {
        b->start = ngx_palloc(ctx->request->pool, cap);
        if (b->start == NULL) {
            return NULL;
        }
        b->end = b->start + cap;
    }
    b->pos = b->last = b->start;
    b->temporary = 1;
    b->tag = (ngx_buf_tag_t) &ngx_muse_module;
    b->flush = 1;
    **last = cl;
    *last = &cl->next;
    cl->next = NULL;
    return b;
}

static ngx_int_t
ngx_muse_fail_stream(ngx_muse_ctx_t *ctx, const char *code, const char *message)
{
    ngx_http_request_t  *r = ctx->request;
    ngx_chain_t         *out = NULL, **last = &out;
    ngx_buf_t           *b;
    ngx_int_t            rc;

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0, "muse: %s", message);
    if (!ctx->headers_sent) {
        return ngx_muse_send_error(r, code[0] == 'b' ? NGX_HTTP_BAD_GATEWAY
                                                     : NGX_HTTP_SERVICE_UNAVAILABLE,
                                   "server_error", NULL, code, message);
    }
    if (!ctx->stream) {
        /* half a JSON body must not end like a whole one: abort the connection */
        return NGX_ERROR;
    }
    b = ngx_muse_get_buf(ctx, &last, 256 + ngx_strlen(message));
    if (b == NULL) {
        return NGX_ERROR;
    }
    if (ctx->stream) {
        b->last = ngx_sprintf(b->last, "data: {\"error\":{\"message\":\"%s\",\"type\":"
                              "\"server_error\",\"param\":null,\"code\":\"%s\"}}\n\n",
                              message, code);
    }
    b->last_buf = 1;
    rc = ngx_http_output_filter(r, out);
    return rc == NGX_ERROR ? NGX_ERROR : NGX_OK;
}

static void
ngx_muse_client_write(ngx_http_request_t *r);

/* Output is backed up: wait for the client, under send_timeout. 0, or NGX_ERROR. */
static ngx_int_t
ngx_muse_wait_client(ngx_http_request_t *r)
{
    ngx_connection_t          *c = r->connection;
    ngx_http_core_loc_conf_t  *clcf = ngx_http_get_module_loc_conf(r, ngx_http_core_module);

    if (!c->write->ready && !c->write->timer_set) {
        ngx_add_timer(c->write, clcf->send_timeout);
    }
    return ngx_handle_write_event(c->write, clcf->send_lowat) == NGX_OK ? NGX_OK : NGX_ERROR;
}

/* Takes records from the ring while nginx's output keeps up; stops when it backs up. */
static void
ngx_muse_drain(ngx_muse_ctx_t *ctx)
{
    ngx_http_request_t   *r = ctx->request;
    ngx_connection_t     *c = r->connection;
    muse_ring_header     *h;
    muse_ring_slot       *sl;
    muse_event_header     ev;
    ngx_chain_t          *out, **last;
    ngx_buf_t            *b;
    const char           *why;
    uint64_t              head, tail;
    ngx_uint_t            n, end = 0;
    ngx_int_t             rc;
    u_char               *ring;

    if (ctx->finished || ctx->map == NULL) {
        return;
    }
    h = ngx_muse_hdr(ctx->map);
    sl = muse_ring_slot_at(ctx->map->base, &ctx->map->lay, ctx->slot);
    ring = muse_ring_event_area(sl, &ctx->map->lay);

    for ( ;; ) {
        if (c->buffered || ctx->busy) {
            /* back-pressure: the client write handler resumes us */
            if (ngx_muse_wait_client(r) != NGX_OK) {
                ngx_muse_finish(ctx, NGX_ERROR);
            }
            return;
        }
        if (h->generation != ctx->seg_generation
            || atomic_load(&sl->generation) != ctx->slot_generation)
        {
            ngx_muse_finish(ctx, ngx_muse_fail_stream(ctx, "engine_unavailable",
                            "the engine restarted during this request"));
            return;
        }
        atomic_store(&sl->wake, 0);
        out = NULL;
        last = &out;
        for (n = 0; n < NGX_MUSE_BATCH && !end; n++) {
            head = atomic_load(&sl->head);
            tail = atomic_load(&sl->tail);
            rc = muse_ring_peek(ring, ctx->map->lay.ring_bytes, head, tail, ctx->slot_generation, &ev,
                                &why);
            if (rc == 0) {
                break;
            }
            if (rc < 0) {
                ngx_log_error(NGX_LOG_ERR, c->log, 0, "muse: corrupt record from the engine "
                              "in slot %uD: %s", ctx->slot, why);
                ngx_muse_finish(ctx, ngx_muse_fail_stream(ctx, "bad_engine_record",
                                "the engine sent a corrupt record"));
                return;
            }
            ctx->admitted = 1;
            if (ev.type == MUSE_EV_KEEPALIVE && !ctx->stream) {
                /* a non-streaming answer is still being made: nothing to send yet */
                atomic_store(&sl->tail, tail + muse_event_record_bytes(ev.length));
                ctx->last_event = ngx_current_msec;
                continue;
            }
            if (ev.type == MUSE_EV_ERROR && ctx->headers_sent && !ctx->stream) {
                /* a non-streaming body already began: it cannot turn into an error now */
                ngx_muse_finish(ctx, NGX_ERROR);
                return;
            }
            if (ev.type == MUSE_EV_ERROR && !ctx->headers_sent) {
                u_char *p = ngx_pnalloc(r->pool, ev.length);
                if (p == NULL) {
                    ngx_muse_finish(ctx, NGX_ERROR);
                    return;
                }
                muse_ring_copy_out(ring, ctx->map->lay.ring_bytes, tail + sizeof(ev), p, ev.length);
                atomic_store(&sl->tail, tail + muse_event_record_bytes(ev.length));
                ctx->headers_sent = 1;
                ngx_muse_finish(ctx, ngx_muse_send_body(r, ev.http_status, "application/json",
                                                        p, ev.length));
                return;
            }
            if (!ctx->headers_sent && ngx_muse_start_output(ctx) == NGX_ERROR) {
                ngx_muse_finish(ctx, NGX_ERROR);
                return;
            }
            b = ngx_muse_get_buf(ctx, &last, ev.length + 32);
            if (b == NULL) {
                ngx_muse_finish(ctx, NGX_ERROR);
                return;
            }
            if (ev.type == MUSE_EV_KEEPALIVE) {
                if (ctx->stream) {
                    b->last = ngx_cpymem(b->last, ": keepalive\n\n", 13);
                }
            } else if (ev.type == MUSE_EV_END) {
                if (ctx->stream) {
                    b->last = ngx_cpymem(b->last, "data: [DONE]\n\n", 14);
                }
                b->last_buf = 1;
                end = 1;
            } else {
                if (ctx->stream) {
                    b->last = ngx_cpymem(b->last, "data: ", 6);
                }
                muse_ring_copy_out(ring, ctx->map->lay.ring_bytes, tail + sizeof(ev), b->last, ev.length);
                b->last += ev.length;
                if (ctx->stream) {
                    b->last = ngx_cpymem(b->last, "\n\n", 2);
                }
                if (ev.type == MUSE_EV_ERROR) {   /* after the stream started: then it ends */
                    b->last_buf = 1;
                    end = 1;
                }
            }
            if (b->last == b->pos) {
                b->temporary = 0;   /* an empty END/keepalive: a special buffer, not data */
            }
            atomic_store(&sl->tail, tail + muse_event_record_bytes(ev.length));
        }
        if (out == NULL) {
            break;
        }
        ctx->last_event = ngx_current_msec;
        rc = ngx_http_output_filter(r, out);
        ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &out,
                                (ngx_buf_tag_t) &ngx_muse_module);
        if (rc == NGX_ERROR) {
            ngx_muse_finish(ctx, NGX_ERROR);
            return;
        }
        if (end) {
            ngx_muse_finish(ctx, rc);
            return;
        }
        if (c->buffered || ctx->busy) {
            if (ngx_muse_wait_client(r) != NGX_OK) {
                ngx_muse_finish(ctx, NGX_ERROR);
            }
            return;
        }
    }
    if (ctx->peer_eof) {
        /* the engine closed without END: died, or idle past muse_idle_timeout */
        ngx_muse_finish(ctx, ngx_muse_fail_stream(ctx, "engine_unavailable",
                        "the engine stopped before finishing this request"));
        return;
    }
    if (ctx->peer) {
        ngx_muse_arm_timer(ctx);
    }
}

/* nginx's output drained (or send_timeout): flush, then take more records. */
static void
ngx_muse_client_write(ngx_http_request_t *r)
{
    ngx_muse_ctx_t  *ctx = ngx_http_get_module_ctx(r, ngx_muse_module);
    ngx_event_t     *wev = r->connection->write;
    ngx_chain_t     *none = NULL;   /* update_chains dereferences its out argument */
    ngx_int_t        rc;

    if (ctx == NULL || ctx->finished) {
        return;
    }
    if (wev->timedout) {
        ngx_log_error(NGX_LOG_INFO, r->connection->log, NGX_ETIMEDOUT,
                      "client timed out (send_timeout); cancelling");
        r->connection->timedout = 1;
        ngx_muse_finish(ctx, NGX_HTTP_REQUEST_TIME_OUT);
        return;
    }
    if (wev->timer_set) {
        ngx_del_timer(wev);
    }
    rc = ngx_http_output_filter(r, NULL);
    ngx_chain_update_chains(r->pool, &ctx->free, &ctx->busy, &none,
                            (ngx_buf_tag_t) &ngx_muse_module);
    if (rc == NGX_ERROR) {
        ngx_muse_finish(ctx, NGX_ERROR);
        return;
    }
    ngx_muse_drain(ctx);
}

/* ------------------------------------------------------------------------------------------ */
/* handlers                                                                                    */

static void
ngx_muse_body_handler(ngx_http_request_t *r)
{
    ngx_muse_loc_conf_t      *mcf = ngx_http_get_module_loc_conf(r, ngx_muse_module);
    ngx_muse_ctx_t           *ctx;
    ngx_http_cleanup_t       *cln;
    ngx_http_variable_value_t *vv;
    ngx_muse_verr_t           err;
    ngx_str_t                 json, scope = ngx_null_string;
    ngx_uint_t                flags = 0;
    u_char                   *body;
    size_t                    len;
    const char               *why = "";
    ngx_int_t                 rc;

    body = ngx_muse_read_body(r, &len);
    if (body == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    ngx_memzero(&err, sizeof(err));
    if (ngx_muse_parse(r, mcf, body, len, &json, &flags, &err) != NGX_OK) {
        ngx_http_finalize_request(r, ngx_muse_send_error(r, err.status, err.type,
                                  err.param[0] ? err.param : NULL, err.code, err.message));
        return;
    }
    if (mcf->scope_index >= 0) {
        vv = ngx_http_get_indexed_variable(r, mcf->scope_index);
        if (vv && !vv->not_found) {
            if (vv->len > MUSE_RING_MAX_SCOPE) {
                /* cutting it could merge two tenants' caches: refuse instead */
                ngx_http_finalize_request(r, ngx_muse_send_error(r, NGX_HTTP_BAD_REQUEST,
                    "invalid_request_error", NULL, "cache_scope_too_long",
                    "the prompt-cache scope of this request is longer than 256 bytes"));
                return;
            }
            scope.data = vv->data;
            scope.len = vv->len;
        }
    }
    ctx = ngx_pcalloc(r->pool, sizeof(ngx_muse_ctx_t));
    cln = ngx_http_cleanup_add(r, 0);
    if (ctx == NULL || cln == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    ctx->request = r;
    ctx->engine = mcf->engine;
    ctx->stream = (flags & MUSE_REQ_STREAM) ? 1 : 0;
    ctx->started = ngx_current_msec;
    cln->handler = ngx_muse_cleanup;
    cln->data = ctx;
    ngx_http_set_ctx(r, ctx, ngx_muse_module);

    rc = ngx_muse_submit(r, ctx, &json, mcf->serve == NGX_MUSE_SERVE_CHAT ? MUSE_KIND_CHAT
                         : MUSE_KIND_COMPLETIONS, flags, &scope, &why);
    if (rc == NGX_ABORT) {
        ngx_muse_close_peer(ctx);
        ngx_http_finalize_request(r, ngx_muse_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                  "invalid_request_error", NULL, "request_too_large",
                                  "the request is larger than the engine's request area; "
                                  "send less, or start muse-engine serve with a larger "
                                  "--request-kib"));
        return;
    }
    if (rc != NGX_OK) {
        ngx_muse_close_peer(ctx);
        ngx_http_finalize_request(r, ngx_muse_unavailable(r, why));
        return;
    }
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_muse_client_write;
    ngx_muse_arm_timer(ctx);
}

/* Constant time over every configured key and over the longer of the two lengths. */
static ngx_int_t
ngx_muse_check_key(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf)
{
    ngx_str_t        *keys, tok;
    ngx_table_elt_t  *auth = r->headers_in.authorization;
    ngx_uint_t        i, k, match = 0, diff;

    if (mcf->api_keys == NULL) {
        return NGX_OK;
    }
    if (auth == NULL || auth->value.len < 8
        || ngx_strncasecmp(auth->value.data, (u_char *) "Bearer ", 7) != 0)
    {
        return NGX_DECLINED;
    }
    tok.data = auth->value.data + 7;
    tok.len = auth->value.len - 7;
    if (tok.len > NGX_MUSE_MAX_KEY_LEN) {
        return NGX_DECLINED;   /* the client's own length: no secret in refusing it early */
    }
    keys = mcf->api_keys->elts;
    for (i = 0; i < mcf->api_keys->nelts; i++) {
        /* always the same number of steps: the time tells nothing of the keys' lengths */
        diff = tok.len ^ keys[i].len;
        for (k = 0; k < NGX_MUSE_MAX_KEY_LEN; k++) {
            diff |= (k < tok.len ? tok.data[k] : 0) ^ (k < keys[i].len ? keys[i].data[k] : 0);
        }
        match |= (diff == 0);
    }
    return match ? NGX_OK : NGX_DECLINED;
}

static ngx_int_t
ngx_muse_models(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf)
{
    size_t   len = 128 + mcf->model_id.len;
    u_char  *buf = ngx_pnalloc(r->pool, len), *p;

    if (buf == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    p = ngx_snprintf(buf, len, "{\"object\":\"list\",\"data\":[{\"id\":\"%V\",\"object\":"
                     "\"model\",\"created\":0,\"owned_by\":\"muse\"}]}\n", &mcf->model_id);
    return ngx_muse_send_body(r, NGX_HTTP_OK, "application/json", buf, p - buf);
}

/* Reads the health page under the seqlock; adds heartbeat_age_ms; 503 unless serving. */
static cJSON *
ngx_muse_health_json(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf, ngx_uint_t *healthy)
{
    ngx_muse_map_t    *m;
    muse_ring_header  *h;
    cJSON             *root = NULL, *eng, *st;
    u_char            *text;
    uint64_t           len = 0, age_ms;
    uint32_t           state;

    *healthy = 0;
    m = ngx_muse_attach(mcf->engine, r->connection->log);
    if (m == NULL) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "status", "down");
        cJSON_AddStringToObject(root, "reason", "engine not running");
        return root;
    }
    h = ngx_muse_hdr(m);
    text = ngx_pnalloc(r->pool, m->lay.health_bytes + 1);
    if (text && muse_health_read(muse_ring_health(m->base, &m->lay), m->lay.health_bytes, text,
                                 m->lay.health_bytes, &len) == 0)
    {
        text[len] = '\0';
        root = cJSON_ParseWithOpts((char *) text, NULL, 1);
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "status", "starting");
    }
    state = atomic_load(&h->state);
    age_ms = (ngx_muse_mono_ns() - atomic_load(&h->heartbeat_ns)) / 1000000;
    eng = cJSON_GetObjectItemCaseSensitive(root, "engine");
    if (!cJSON_IsObject(eng)) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "engine");
        eng = cJSON_AddObjectToObject(root, "engine");
    }
    cJSON_DeleteItemFromObjectCaseSensitive(eng, "heartbeat_age_ms");
    cJSON_AddNumberToObject(eng, "heartbeat_age_ms", (double) age_ms);
    st = cJSON_GetObjectItemCaseSensitive(root, "status");
    *healthy = state == MUSE_ENGINE_SERVING && age_ms <= NGX_MUSE_STALE_MS && cJSON_IsString(st)
               && (strcmp(st->valuestring, "ok") == 0
                   || strcmp(st->valuestring, "degraded") == 0);
    if (!*healthy && (!cJSON_IsString(st) || strcmp(st->valuestring, "ok") == 0)) {
        cJSON_DeleteItemFromObjectCaseSensitive(root, "status");
        cJSON_AddStringToObject(root, "status", state == MUSE_ENGINE_STARTING ? "starting"
                                                                               : "down");
    }
    if (age_ms > NGX_MUSE_STALE_MS) {
        cJSON_AddStringToObject(root, "reason", "engine heartbeat stale");
    } else if (state == MUSE_ENGINE_FATAL) {
        cJSON_AddStringToObject(root, "reason", "engine reported a fatal error");
    }
    return root;
}

static ngx_int_t
ngx_muse_send_cjson(ngx_http_request_t *r, ngx_uint_t status, cJSON *root, const char *type)
{
    char    *s = root ? cJSON_PrintUnformatted(root) : NULL;
    u_char  *copy;
    size_t   n;

    cJSON_Delete(root);
    if (s == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    n = ngx_strlen(s);
    copy = ngx_pnalloc(r->pool, n + 1);
    if (copy == NULL) {
        cJSON_free(s);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    ngx_memcpy(copy, s, n);
    copy[n] = '\n';
    cJSON_free(s);
    return ngx_muse_send_body(r, status, type, copy, n + 1);
}

/* Histograms as the engine publishes them: {"le":[..],"counts":[cumulative..],"sum","count"}. */
static u_char *
ngx_muse_metrics_histograms(u_char *p, u_char *end, cJSON *hists)
{
    cJSON  *h, *le, *counts, *l, *n, *sum, *count;

    for (h = cJSON_IsObject(hists) ? hists->child : NULL; h; h = h->next) {
        le = cJSON_GetObjectItemCaseSensitive(h, "le");
        counts = cJSON_GetObjectItemCaseSensitive(h, "counts");
        sum = cJSON_GetObjectItemCaseSensitive(h, "sum");
        count = cJSON_GetObjectItemCaseSensitive(h, "count");
        if (!cJSON_IsArray(le) || !cJSON_IsArray(counts) || !cJSON_IsNumber(sum)
            || !cJSON_IsNumber(count) || ngx_strlen(h->string) > 64
            || cJSON_GetArraySize(le) != cJSON_GetArraySize(counts))
        {
            continue;
        }
        p = ngx_slprintf(p, end, "# TYPE muse_%s histogram\n", h->string);
        for (l = le->child, n = counts->child; l && n; l = l->next, n = n->next) {
            if (cJSON_IsNumber(l) && cJSON_IsNumber(n)) {
                p = ngx_slprintf(p, end, "muse_%s_bucket{le=\"%.3f\"} %.0f\n", h->string,
                                 l->valuedouble, n->valuedouble);
            }
        }
        p = ngx_slprintf(p, end, "muse_%s_bucket{le=\"+Inf\"} %.0f\nmuse_%s_sum %.3f\n"
                         "muse_%s_count %.0f\n", h->string, count->valuedouble, h->string,
                         sum->valuedouble, h->string, count->valuedouble);
    }
    return p;
}


/* Prometheus text from the health page's numbers. */
static ngx_int_t
ngx_muse_metrics(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf)
{
    static const char  *groups[] = { "counters", "streams", "prompt_cache", NULL };
    ngx_uint_t          healthy;
    cJSON              *root = ngx_muse_health_json(r, mcf, &healthy), *g, *c, *eng;
    u_char             *buf, *p, *end;
    size_t              cap = 16384;
    const char        **gn;

    buf = ngx_pnalloc(r->pool, cap);
    if (buf == NULL || root == NULL) {
        cJSON_Delete(root);
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    p = buf;
    end = buf + cap;
    p = ngx_slprintf(p, end, "# TYPE muse_up gauge\nmuse_up %d\n", healthy ? 1 : 0);
    eng = cJSON_GetObjectItemCaseSensitive(root, "engine");
    c = eng ? cJSON_GetObjectItemCaseSensitive(eng, "heartbeat_age_ms") : NULL;
    if (cJSON_IsNumber(c)) {
        p = ngx_slprintf(p, end, "muse_heartbeat_age_seconds %.3f\n", c->valuedouble / 1000);
    }
    for (gn = groups; *gn; gn++) {
        g = cJSON_GetObjectItemCaseSensitive(root, *gn);
        for (c = cJSON_IsObject(g) ? g->child : NULL; c; c = c->next) {
            if (!cJSON_IsNumber(c) || ngx_strlen(c->string) > 64) {
                continue;
            }
            p = ngx_slprintf(p, end, "muse_%s_%s%s %.3f\n", *gn, c->string,
                             **gn == 'c' ? "_total" : "", c->valuedouble);
        }
    }
    p = ngx_muse_metrics_histograms(p, end,
                                    cJSON_GetObjectItemCaseSensitive(root, "histograms"));
    cJSON_Delete(root);
    return ngx_muse_send_body(r, NGX_HTTP_OK, "text/plain; version=0.0.4", buf, p - buf);
}

static ngx_int_t
ngx_muse_handler(ngx_http_request_t *r)
{
    ngx_muse_loc_conf_t  *mcf = ngx_http_get_module_loc_conf(r, ngx_muse_module);
    ngx_uint_t            healthy;
    ngx_int_t             rc;
    cJSON                *root;

    if (ngx_muse_check_key(r, mcf) != NGX_OK) {
        if (ngx_http_discard_request_body(r) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        if (ngx_muse_add_header(r, "WWW-Authenticate", "Bearer") != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        return ngx_muse_send_error(r, NGX_HTTP_UNAUTHORIZED, "invalid_request_error", NULL,
                                   "invalid_api_key", "missing or wrong API key");
    }
    if (mcf->serve == NGX_MUSE_SERVE_CHAT || mcf->serve == NGX_MUSE_SERVE_COMPLETIONS) {
        if (r->method != NGX_HTTP_POST) {
            if (ngx_http_discard_request_body(r) != NGX_OK) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }
            return ngx_muse_send_error(r, NGX_HTTP_NOT_ALLOWED, "invalid_request_error", NULL,
                                       "method_not_allowed", "use POST");
        }
        rc = ngx_http_read_client_request_body(r, ngx_muse_body_handler);
        if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
            return rc;
        }
        return NGX_DONE;
    }
    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }
    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    switch (mcf->serve) {
    case NGX_MUSE_SERVE_MODELS:
        return ngx_muse_models(r, mcf);
    case NGX_MUSE_SERVE_HEALTH:
        root = ngx_muse_health_json(r, mcf, &healthy);
        return ngx_muse_send_cjson(r, healthy ? NGX_HTTP_OK : NGX_HTTP_SERVICE_UNAVAILABLE, root,
                                   "application/json");
    default:
        return ngx_muse_metrics(r, mcf);
    }
}
