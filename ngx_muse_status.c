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

static void
ngx_muse_set_string(cJSON *obj, const char *key, const char *value)
{
    cJSON_DeleteItemFromObjectCaseSensitive(obj, key);
    cJSON_AddStringToObject(obj, key, value);
}

/* Reads the health page under the seqlock; adds heartbeat_age_ms; 503 unless serving. What
 * the module saw itself (a doorbell closed by the engine, a refused connect, a hello that did
 * not come: why) overrides the page at once. */
static cJSON *
ngx_muse_health_json(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf, const char *why,
    ngx_uint_t *healthy)
{
    ngx_muse_map_t    *m;
    muse_ring_header  *h;
    cJSON             *root = NULL, *eng, *st;
    u_char            *text;
    uint64_t           len = 0, age_ms;
    uint32_t           state;
    const char        *down;

    *healthy = 0;
    m = mcf->engine->map;
    down = ngx_muse_down_reason(mcf->engine);
    if (m == NULL) {
        root = cJSON_CreateObject();
        cJSON_AddStringToObject(root, "status", "down");
        cJSON_AddStringToObject(root, "reason", down ? down : why ? why : "engine not running");
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
    if (down) {
        *healthy = 0;
        ngx_muse_set_string(root, "status", "down");
    }
    if (state == MUSE_ENGINE_FATAL) {    /* the engine's last word says the most */
        ngx_muse_set_string(root, "reason", "engine reported a fatal error");
    } else if (down) {
        ngx_muse_set_string(root, "reason", down);
    } else if (age_ms > NGX_MUSE_STALE_MS) {
        ngx_muse_set_string(root, "reason", "engine heartbeat stale");
    } else if (!*healthy && why) {
        ngx_muse_set_string(root, "reason", why);
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


/* A label value from the engine's page: short, letters, digits and _ - . : only. */
static ngx_uint_t
ngx_muse_metrics_label_ok(const char *v)
{
    size_t  i;

    for (i = 0; v[i]; i++) {
        if (i >= 32 || !(isalnum((unsigned char) v[i]) || ngx_strchr("_-.:", v[i]))) {
            return 0;
        }
    }
    return 1;
}


/* Each rank's memory terms as gauges: muse_rank_memory_<term>{rank,device,arch}. */
static u_char *
ngx_muse_metrics_ranks(u_char *p, u_char *end, cJSON *ranks)
{
    cJSON       *rk, *mem, *c, *dev, *arch, *id;
    const char  *d, *a;

    for (rk = cJSON_IsArray(ranks) ? ranks->child : NULL; rk; rk = rk->next) {
        id = cJSON_GetObjectItemCaseSensitive(rk, "rank");
        dev = cJSON_GetObjectItemCaseSensitive(rk, "device");
        arch = cJSON_GetObjectItemCaseSensitive(rk, "arch");
        mem = cJSON_GetObjectItemCaseSensitive(rk, "memory");
        d = cJSON_IsString(dev) ? dev->valuestring : "";
        a = cJSON_IsString(arch) ? arch->valuestring : "";
        if (!cJSON_IsNumber(id) || !cJSON_IsObject(mem) || !ngx_muse_metrics_label_ok(d)
            || !ngx_muse_metrics_label_ok(a))
        {
            continue;
        }
        for (c = mem->child; c; c = c->next) {
            if (!cJSON_IsNumber(c) || ngx_strlen(c->string) > 64) {
                continue;
            }
            p = ngx_slprintf(p, end,
                             "muse_rank_memory_%s{rank=\"%d\",device=\"%s\",arch=\"%s\"} %.0f\n",
                             c->string, (int) id->valuedouble, d, a, c->valuedouble);
        }
    }
    return p;
}


/* Prometheus text from the health page's numbers. */
static ngx_int_t
ngx_muse_metrics(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf, const char *why)
{
    static const char  *groups[] = { "counters", "streams", "prompt_cache", NULL };
    ngx_uint_t          healthy;
    cJSON              *root = ngx_muse_health_json(r, mcf, why, &healthy), *g, *c, *eng;
    u_char             *buf, *p, *end;
    size_t              cap = 65536;
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
    p = ngx_muse_metrics_ranks(p, end, cJSON_GetObjectItemCaseSensitive(root, "ranks"));
    cJSON_Delete(root);
    return ngx_muse_send_body(r, NGX_HTTP_OK, "text/plain; version=0.0.4", buf, p - buf);
}

/* The page, from what this worker knows now (why: what went wrong reaching the engine). */
ngx_int_t
ngx_muse_status_answer(ngx_http_request_t *r, const char *why)
{
    ngx_muse_loc_conf_t  *mcf = ngx_http_get_module_loc_conf(r, ngx_muse_module);
    ngx_uint_t            healthy;
    cJSON                *root, *pub, *st, *rs;

    if (mcf->serve == NGX_MUSE_SERVE_METRICS) {
        return ngx_muse_metrics(r, mcf, why);
    }
    root = ngx_muse_health_json(r, mcf, why, &healthy);
    if (root && mcf->health_view == NGX_MUSE_HEALTH_PUBLIC) {
        /* liveness only: counters, cache and histograms stay behind the full view */
        pub = cJSON_CreateObject();
        st = cJSON_GetObjectItemCaseSensitive(root, "status");
        rs = cJSON_GetObjectItemCaseSensitive(root, "reason");
        cJSON_AddStringToObject(pub, "status", cJSON_IsString(st) ? st->valuestring : "down");
        if (cJSON_IsString(rs)) {
            cJSON_AddStringToObject(pub, "reason", rs->valuestring);
        }
        cJSON_Delete(root);
        root = pub;
    }
    return ngx_muse_send_cjson(r, healthy ? NGX_HTTP_OK : NGX_HTTP_SERVICE_UNAVAILABLE, root,
                               "application/json");
}

/* /v1/models at once; /health and /metrics connect to the engine first: a refused connect
 * answers at once, else the page answers from the segment the engine's hello names, after at
 * most muse_handshake_timeout. Never from the segment alone: a stopped engine's heartbeat
 * looks fresh for 3 s, and a dead one's too when a new engine took its socket. */
ngx_int_t
ngx_muse_status_page(ngx_http_request_t *r, ngx_muse_loc_conf_t *mcf)
{
    ngx_muse_ctx_t      *ctx;
    ngx_http_cleanup_t  *cln;
    const char          *why = NULL;

    if (mcf->serve == NGX_MUSE_SERVE_MODELS) {
        return ngx_muse_models(r, mcf);
    }
    ctx = ngx_pcalloc(r->pool, sizeof(ngx_muse_ctx_t));
    cln = ngx_http_cleanup_add(r, 0);
    if (ctx == NULL || cln == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }
    ctx->request = r;
    ctx->engine = mcf->engine;
    ctx->status = 1;
    ctx->started = ngx_current_msec;
    cln->handler = ngx_muse_cleanup;
    cln->data = ctx;
    ngx_http_set_ctx(r, ctx, ngx_muse_module);
    if (ngx_muse_connect(ctx, &why) != NGX_OK) {
        return ngx_muse_status_answer(r, why);
    }
    ngx_muse_arm_timer(ctx);
    r->main->count++;
    return NGX_DONE;
}
