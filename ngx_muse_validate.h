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
#define NGX_MUSE_V_TEXT_LEN     192

typedef struct {
    int            kind;            /* NGX_MUSE_V_CHAT or NGX_MUSE_V_COMPLETIONS */
    const char    *model_id;        /* the served id; "model" must equal it */
    size_t         model_id_len;
    size_t         max_json_values; /* items (values and keys) a body may hold */
} ngx_muse_vconf_t;

/* An OpenAI error: type and code are static strings, message points at a static string or at
 * text (ours: never user bytes, no quotes); param a plain field path. offset: the byte of the
 * body a JSON syntax error is at (0-based), else (size_t) -1. */
typedef struct {
    unsigned       status;
    const char    *type;
    const char    *code;
    const char    *message;
    char           param[NGX_MUSE_V_PARAM_LEN];
    char           text[NGX_MUSE_V_TEXT_LEN];
    size_t         offset;
} ngx_muse_verr_t;

/* Checks that body is one RFC 8259 JSON text (no leading zeros, no trailing commas, no raw
 * control bytes in strings, valid escapes, no lone surrogate escapes), holds at most
 * max_values items and nests at most MUSE_LIMIT_JSON_NESTING deep; \u0000 is refused too.
 * Bytes >= 0x80 inside strings pass (their UTF-8 is checked per field after parsing). 0: it
 * is; -1: *err names the byte offset and why. */
int ngx_muse_json_check(const unsigned char *body, size_t len, size_t max_values,
    ngx_muse_verr_t *err);

/* Validates a request body of len bytes (need not be NUL-terminated): ngx_muse_json_check,
 * then cJSON, then field by field (API.md), integers read exactly from their own text. 0:
 * valid, *flags holds MUSE_REQ_*, and the body is forwarded to the engine as it is (nothing
 * is re-printed). -1: *err says why (status 400 or 404). */
int ngx_muse_validate_body(const ngx_muse_vconf_t *vc, const unsigned char *body, size_t len,
    uint32_t *flags, ngx_muse_verr_t *err);

#endif /* NGX_MUSE_VALIDATE_H */
