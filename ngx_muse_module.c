/*
 * ngx_muse_module: the HTTP face of muse: the directives, and the handler that checks the API
 * key and method, validates an OpenAI-style request (ngx_muse_validate.c) and hands it to the
 * engine (ngx_muse_transport.c); the status pages are ngx_muse_status.c. docs/nginx.md
 * documents the directives, docs/abi.md the protocol with the engine.
 */

#include "ngx_muse_module.h"

#include <pwd.h>
#include <sys/un.h>

#include "ngx_muse_validate.h"

#define NGX_MUSE_MAX_KEY_LEN  256    /* API keys are compared over this many bytes */
#define NGX_MUSE_MAX_KEYS     16

static ngx_int_t ngx_muse_init(ngx_conf_t *cf);
static void *ngx_muse_create_loc_conf(ngx_conf_t *cf);
static char *ngx_muse_merge_loc_conf(ngx_conf_t *cf, void *parent, void *child);
static char *ngx_muse_engine_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_muse_serve_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_muse_api_key_file(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static char *ngx_muse_cache_scope(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
static ngx_int_t ngx_muse_handler(ngx_http_request_t *r);

static ngx_conf_enum_t ngx_muse_health_views[] = {
    { ngx_string("full"), NGX_MUSE_HEALTH_FULL },
    { ngx_string("public"), NGX_MUSE_HEALTH_PUBLIC },
    { ngx_null_string, 0 }
};

static ngx_command_t ngx_muse_commands[] = {
    { ngx_string("muse_engine"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE23,
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
    { ngx_string("muse_handshake_timeout"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_msec_slot, NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_muse_loc_conf_t, handshake_timeout), NULL },
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
    { ngx_string("muse_health_view"),
      NGX_HTTP_MAIN_CONF|NGX_HTTP_SRV_CONF|NGX_HTTP_LOC_CONF|NGX_CONF_TAKE1,
      ngx_conf_set_enum_slot, NGX_HTTP_LOC_CONF_OFFSET,
      offsetof(ngx_muse_loc_conf_t, health_view), &ngx_muse_health_views },
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

ngx_module_t  ngx_muse_module = {
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
    mcf->handshake_timeout = NGX_CONF_UNSET_MSEC;
    mcf->api_keys = NGX_CONF_UNSET_PTR;
    mcf->scope_index = NGX_CONF_UNSET;
    mcf->health_view = NGX_CONF_UNSET_UINT;
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
    ngx_conf_merge_msec_value(conf->handshake_timeout, prev->handshake_timeout,
                              NGX_MUSE_HANDSHAKE_MS);
    if (conf->handshake_timeout == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "\"muse_handshake_timeout\" must be more "
                           "than 0, e.g. 1s (how long a worker waits for the engine's hello)");
        return NGX_CONF_ERROR;
    }
    ngx_conf_merge_ptr_value(conf->api_keys, prev->api_keys, NULL);
    ngx_conf_merge_value(conf->scope_index, prev->scope_index, -1);
    ngx_conf_merge_uint_value(conf->health_view, prev->health_view, NGX_MUSE_HEALTH_FULL);
    ngx_conf_merge_uint_value(conf->max_json_values, prev->max_json_values,
                              MUSE_LIMIT_JSON_VALUES);

    if (conf->serve != 0 && conf->serve != NGX_MUSE_SERVE_MODELS && conf->engine == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"muse_serve\" needs \"muse_engine <socket> <engine user>\" "
                           "in this location or above");
        return NGX_CONF_ERROR;
    }
    return NGX_CONF_OK;
}

/* Every directory from / down to the socket's must be a real directory (lstat: a symbolic link
 * anywhere is refused, its owner could point it elsewhere) owned by the engine's user or root
 * and writable by nobody else; above the socket's own directory a sticky one (/tmp) may be
 * world-writable. Anyone else could put a listener of their own in the socket's place. For a
 * directory not made yet, the last one that exists is held to the socket directory's rule. */
static ngx_int_t
ngx_muse_check_one_dir(ngx_conf_t *cf, u_char *dir, ngx_uid_t uid, ngx_uint_t own)
{
    ngx_file_info_t  fi;
    char             mode[8];

    if (lstat((char *) dir, &fi) == -1) {
        if (ngx_errno == NGX_ENOENT) {
            return NGX_DECLINED;
        }
        ngx_conf_log_error(NGX_LOG_EMERG, cf, ngx_errno,
                           "muse_engine: cannot check the socket directory \"%s\"", dir);
        return NGX_ERROR;
    }
    if (S_ISLNK(fi.st_mode)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "muse_engine: \"%s\" on the socket's path is a symbolic link, "
                           "which its owner could point elsewhere: name the real directory "
                           "(e.g. /run, not /var/run)", dir);
        return NGX_ERROR;
    }
    if (!ngx_is_dir(&fi)) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "muse_engine: \"%s\" above the socket is not a directory", dir);
        return NGX_ERROR;
    }
    if ((fi.st_uid != uid && fi.st_uid != 0)
        || ((fi.st_mode & (S_IWGRP|S_IWOTH)) && (own || !(fi.st_mode & S_ISVTX))))
    {
        snprintf(mode, sizeof(mode), "%04o", (unsigned) (fi.st_mode & 07777));
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "muse_engine: the socket directory \"%s\" (mode %s, owner uid %d) "
                           "can be written by others than the engine's user: make it owned "
                           "by that user (or root) and not group- or world-writable, e.g. "
                           "chmod 0750 and chgrp the workers' group", dir, mode,
                           (int) fi.st_uid);
        return NGX_ERROR;
    }
    return NGX_OK;
}

static char *
ngx_muse_check_socket_dir(ngx_conf_t *cf, ngx_str_t *path, ngx_uid_t uid)
{
    u_char      dir[sizeof(((struct sockaddr_un *) 0)->sun_path)], pre[sizeof(dir)];
    size_t      n, i, last = 1;
    ngx_int_t   rc;

    ngx_cpystrn(dir, path->data, path->len + 1);
    n = (u_char *) strrchr((char *) dir, '/') - dir;    /* the path is absolute */
    n = n ? n : 1;                                       /* a socket in / itself */
    /* from / down: each prefix is checked before anything below it is believed */
    ngx_cpystrn(pre, (u_char *) "/", 2);
    rc = ngx_muse_check_one_dir(cf, pre, uid, n == 1);
    for (i = 2; rc == NGX_OK && i <= n; i++) {
        if (i < n && dir[i] != '/') {
            continue;
        }
        ngx_memcpy(pre, dir, i);
        pre[i] = '\0';
        rc = ngx_muse_check_one_dir(cf, pre, uid, i == n);
        last = rc == NGX_OK ? i : last;
    }
    if (rc == NGX_DECLINED) {
        /* whoever may write the last existing directory can make the rest */
        pre[last] = '\0';
        if (ngx_muse_check_one_dir(cf, pre, uid, 1) != NGX_OK) {
            return NGX_CONF_ERROR;
        }
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0, "muse_engine: the socket's directory does not "
                           "exist yet; create it owned by the engine's user, mode 0750");
        return NGX_CONF_OK;
    }
    return rc == NGX_OK ? NGX_CONF_OK : NGX_CONF_ERROR;
}

static char *
ngx_muse_engine_directive(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_muse_loc_conf_t  *mcf = conf;
    ngx_str_t            *value = cf->args->elts;
    ngx_muse_engine_t    *eng;
    struct passwd        *pw;
    ngx_int_t             n;
    u_char                name[256];

    if (mcf->engine != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }
    if (value[1].len < 2 || value[1].data[0] != '/'
        || value[1].len >= sizeof(((struct sockaddr_un *) 0)->sun_path))
    {
        return "socket path must be absolute and at most 107 bytes";
    }
    if (value[2].len > 0 && value[2].data[0] == '/') {
        return "takes the engine's user as its second argument now, not a shm name: the "
               "engine hands its segment over the socket (docs/nginx.md), e.g. "
               "muse_engine /run/muse/engine.sock muse";
    }
    if (value[2].len == 0 || value[2].len >= sizeof(name)) {
        return "needs the user muse-engine runs as, e.g. muse_engine /run/muse/engine.sock muse";
    }
    eng = ngx_pcalloc(cf->pool, sizeof(ngx_muse_engine_t));
    if (eng == NULL) {
        return NGX_CONF_ERROR;
    }
    ngx_cpystrn(name, value[2].data, value[2].len + 1);
    n = ngx_atoi(value[2].data, value[2].len);
    pw = getpwnam((char *) name);
    if (pw != NULL) {
        eng->uid = pw->pw_uid;
    } else if (n != NGX_ERROR) {
        eng->uid = (ngx_uid_t) n;
    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "muse_engine: no user \"%V\" on this system: "
                           "name the user muse-engine serve runs as (or its uid)", &value[2]);
        return NGX_CONF_ERROR;
    }
    if (ngx_muse_check_socket_dir(cf, &value[1], eng->uid) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }
    if (cf->args->nelts == 4) {
        /* the worker key: read here, by the master before it drops privileges; the workers
         * inherit it in memory and answer the engine's challenge with it */
        u_char  path[NGX_MAX_PATH];
        char    err[512];

        if (value[3].len == 0 || value[3].data[0] != '/' || value[3].len >= sizeof(path)) {
            return "takes the worker key file as an absolute path, e.g. muse_engine "
                   "/run/muse/engine.sock muse /etc/muse/worker.key";
        }
        ngx_cpystrn(path, value[3].data, value[3].len + 1);
        if (muse_key_file_read((char *) path, eng->uid, eng->key, &eng->key_len, err,
                               sizeof(err)) != 0)
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0, "muse_engine: the worker %s", err);
            return NGX_CONF_ERROR;
        }
    }
    eng->socket_path.data = ngx_pstrdup(cf->pool, &value[1]);
    eng->user.data = ngx_pstrdup(cf->pool, &value[2]);
    if (eng->socket_path.data == NULL || eng->user.data == NULL) {
        return NGX_CONF_ERROR;
    }
    eng->socket_path.len = value[1].len;
    eng->user.len = value[2].len;
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

ngx_int_t
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

ngx_int_t
ngx_muse_send_body(ngx_http_request_t *r, ngx_uint_t status, const char *type, u_char *data,
    size_t len)
{
    ngx_buf_t            *b;
    ngx_chain_t           out;
    ngx_int_t             rc;
    ngx_muse_loc_conf_t  *mcf;

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
        mcf = ngx_http_get_module_loc_conf(r, ngx_muse_module);
        if (ngx_muse_add_header(r, "Allow", mcf->serve == NGX_MUSE_SERVE_CHAT
                                            || mcf->serve == NGX_MUSE_SERVE_COMPLETIONS
                                            ? "POST" : "GET, HEAD") != NGX_OK)
        {
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
ngx_int_t
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
/* handlers                                                                                    */

static void
ngx_muse_body_handler(ngx_http_request_t *r)
{
    ngx_muse_loc_conf_t      *mcf = ngx_http_get_module_loc_conf(r, ngx_muse_module);
    ngx_muse_ctx_t           *ctx;
    ngx_http_cleanup_t       *cln;
    ngx_http_variable_value_t *vv;
    ngx_muse_verr_t           err;
    ngx_muse_vconf_t          vc;
    ngx_str_t                 json;
    ngx_uint_t                flags = 0;
    uint32_t                  vflags;
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
    vc.kind = mcf->serve == NGX_MUSE_SERVE_CHAT ? NGX_MUSE_V_CHAT : NGX_MUSE_V_COMPLETIONS;
    vc.model_id = (const char *) mcf->model_id.data;
    vc.model_id_len = mcf->model_id.len;
    vc.max_json_values = mcf->max_json_values;
    if (ngx_muse_validate_body(&vc, body, len, &vflags, &err) != 0) {
        ngx_http_finalize_request(r, ngx_muse_send_error(r, err.status, err.type,
                                  err.param[0] ? err.param : NULL, err.code, err.message));
        return;
    }
    flags = vflags;
    /* forwarded as the client wrote it: strict JSON, so the engine's parser reads the same
     * values, and no number goes through a double on the way */
    json.data = body;
    json.len = len;
    ctx = ngx_pcalloc(r->pool, sizeof(ngx_muse_ctx_t));
    cln = ngx_http_cleanup_add(r, 0);
    if (ctx == NULL || cln == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }
    if (mcf->scope_index >= 0) {
        vv = ngx_http_get_indexed_variable(r, mcf->scope_index);
        if (vv && !vv->not_found && vv->len > 0) {
            /* any length: only its keyed digest crosses to the engine */
            ctx->scope.data = vv->data;
            ctx->scope.len = vv->len;
            ctx->has_scope = 1;
        }
    }
    ctx->request = r;
    ctx->engine = mcf->engine;
    ctx->body = json;
    ctx->kind = mcf->serve == NGX_MUSE_SERVE_CHAT ? MUSE_KIND_CHAT : MUSE_KIND_COMPLETIONS;
    ctx->flags = flags;
    ctx->stream = (flags & MUSE_REQ_STREAM) ? 1 : 0;
    ctx->started = ngx_current_msec;
    cln->handler = ngx_muse_cleanup;
    cln->data = ctx;
    ngx_http_set_ctx(r, ctx, ngx_muse_module);

    rc = ngx_muse_submit(ctx, &why);
    if (rc == NGX_ABORT) {
        ngx_http_finalize_request(r, ngx_muse_send_error(r, NGX_HTTP_REQUEST_ENTITY_TOO_LARGE,
                                  "invalid_request_error", NULL, "request_too_large",
                                  "the request is larger than the engine's request area; "
                                  "send less, or start muse-engine serve with a larger "
                                  "--request-kib"));
        return;
    }
    if (rc != NGX_OK) {
        ngx_http_finalize_request(r, ngx_muse_unavailable(r, why));
        return;
    }
    r->read_event_handler = ngx_http_test_reading;
    r->write_event_handler = ngx_muse_client_write;
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
ngx_muse_handler(ngx_http_request_t *r)
{
    ngx_muse_loc_conf_t  *mcf = ngx_http_get_module_loc_conf(r, ngx_muse_module);
    ngx_int_t             rc;

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
        if (ngx_http_discard_request_body(r) != NGX_OK) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
        return ngx_muse_send_error(r, NGX_HTTP_NOT_ALLOWED, "invalid_request_error", NULL,
                                   "method_not_allowed", "use GET or HEAD");
    }
    if (ngx_http_discard_request_body(r) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    return ngx_muse_status_page(r, mcf);
}
