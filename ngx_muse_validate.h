/*
 * ngx_muse_validate: the OpenAI request validation of ngx_muse_module as pure C (libc and
 * cJSON, no nginx), so t/unit tests it and t/fuzz fuzzes it without an nginx around it.
 */

#ifndef NGX_MUSE_VALIDATE_H
#define NGX_MUSE_VALIDATE_H

#include <stddef.h>
#include <stdint.h>

#define NGX_MUSE_V_CHAT         1
#define NGX_MUSE_V_COMPLETIONS  2
#define NGX_MUSE_V_PARAM_LEN    96

typedef struct {
    int            kind;            /* NGX_MUSE_V_CHAT or NGX_MUSE_V_COMPLETIONS */
    const char    *model_id;        /* the served id; "model" must equal it */
    size_t         model_id_len;
    size_t         max_json_values; /* items (values and keys) a body may hold */
} ngx_muse_vconf_t;

/* An OpenAI error: message, type and code are static strings; param a plain field path. */
typedef struct {
    unsigned       status;
    const char    *type;
    const char    *code;
    const char    *message;
    char           param[NGX_MUSE_V_PARAM_LEN];
} ngx_muse_verr_t;

/* Validates a request body of len bytes (need not be NUL-terminated). 0: valid, *flags holds
 * MUSE_REQ_* and *out a malloc'd compact JSON text of *out_len bytes to forward (free it).
 * -1: *err says why (status 400 or 404). */
int ngx_muse_validate_body(const ngx_muse_vconf_t *vc, const unsigned char *body, size_t len,
    uint32_t *flags, char **out, size_t *out_len, ngx_muse_verr_t *err);

#endif /* NGX_MUSE_VALIDATE_H */
