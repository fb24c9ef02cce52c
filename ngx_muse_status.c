/*
 * ngx_muse_status: the module's status pages: /v1/models from the config, /health from the
 * engine's health page (seqlock) plus the module's own view of the engine, and /metrics as
 * Prometheus text derived from the same page.
 */

#include <cjson/cJSON.h>

#include "ngx_muse_module.h"

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
    h = (muse_ring_header *) m->base;
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

ngx_int_t
ngx_muse_status_page(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf)
{
    ngx_uint_t  healthy;
    cJSON      *root;

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
