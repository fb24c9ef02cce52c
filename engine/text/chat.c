/* The Muse chat renderer (CHAT.md): request messages + tools -> text segments and control ids.
 * The rules decided where CHAT.md leaves a choice are listed in docs/chat-goldens.md. */
#include "text/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FN_NAME_MAX 128

static const char DEFAULT_SYSTEM_TEXT[] = "You are a helpful AI assistant.";
static const char KNOWLEDGE_CUTOFF[] = "\nKnowledge cutoff: 2026-01-04.\n\nReasoning strength: ";

/* The tool preamble up to the tool metadata lines, byte for byte as the model was trained. */
static const char TOOL_PREAMBLE[] =
    "In this environment you have access to a set of tools you can use to answer the user's "
    "question.\n\n"
    "You can invoke a function by writing a \"<atem:function_calls>\" block like the following:\n"
    "<atem:function_calls>\n<atem:invoke name=\"$FUNCTION_NAME\">\n"
    "<atem:parameter name=\"$PARAMETER_NAME\">$PARAMETER_VALUE</atem:parameter>\n"
    "...\n</atem:invoke>\n</atem:function_calls>\n\n"
    "String and scalar parameters should be specified as is, while lists and objects should use "
    "JSON format. Note that spaces for string values are not stripped. The output is not "
    "expected to be valid XML and is parsed with regular expressions.\n"
    "Here are the functions available in JSONSchema format:\n// Tool metadata\n";

static const char TOOL_EXAMPLE[] =
    "\nHere's an example of how to call a function in the tool set:\n"
    "(If the tool namespace is not specified, invoke the function directly as "
    "`example_function_name` rather than `example_tool_name.example_function_name`)\n\n"
    "to=example_tool_name.example_function_name\n\n"
    "<atem:function_calls>\n<atem:invoke name=\"example_tool_name.example_function_name\">\n"
    "<atem:parameter name=\"example_parameter_1\">value_1</atem:parameter>\n"
    "<atem:parameter name=\"example_parameter_2\">This is the value for the second parameter\n"
    "that can span\n\"multiple\" lines\n</atem:parameter>\n"
    "</atem:invoke>\n</atem:function_calls>\n\n";

void muse_chat_ids_default(muse_chat_ids *ids)
{
    ids->begin_of_text = 200000;
    ids->end_of_text = 200001;
    ids->eom = 200007;
    ids->eot = 200008;
    ids->start = 200022;
    ids->message = 200023;
}

/* ---- output building ---- */

static void put_bytes(muse_chat_render *r, const char *s, size_t n)
{
    muse_buf_add(&r->text, s, n);
}

static muse_chat_seg *new_seg(muse_chat_render *r)
{
    if (r->nsegs == r->segcap) {
        size_t cap = r->segcap ? r->segcap * 2 : 32;
        muse_chat_seg *ns = realloc(r->segs, cap * sizeof *ns);
        MUSE_CHECK(ns != NULL);
        r->segs = ns;
        r->segcap = cap;
    }
    muse_chat_seg *s = &r->segs[r->nsegs++];
    memset(s, 0, sizeof *s);
    return s;
}

/* Appends text, growing the last segment when it is text too. */
static void put_text(muse_chat_render *r, const char *s, size_t n)
{
    if (n == 0) return;
    muse_chat_seg *last = r->nsegs ? &r->segs[r->nsegs - 1] : NULL;
    if (!last || last->is_special) {
        last = new_seg(r);
        last->off = r->text.len;
    }
    put_bytes(r, s, n);
    last->len += n;
}

static void put_str(muse_chat_render *r, const char *s)
{
    put_text(r, s, strlen(s));
}

static void put_special(muse_chat_render *r, int32_t id)
{
    muse_chat_seg *s = new_seg(r);
    s->is_special = 1;
    s->id = id;
    s->off = r->text.len;
}

/* Writes v as a compact JSON value (strings quoted and escaped). */
static void put_json(muse_chat_render *r, const cJSON *v)
{
    char *s = cJSON_PrintUnformatted(v);
    MUSE_CHECK(s != NULL);
    put_str(r, s);
    free(s);
}

static void put_json_string(muse_chat_render *r, const char *s)
{
    cJSON *tmp = cJSON_CreateString(s);
    MUSE_CHECK(tmp != NULL);
    put_json(r, tmp);
    cJSON_Delete(tmp);
}

/* ---- validation helpers ---- */

/* Names become header text and recipients, so they must fit the reply parser's grammar. */
static int valid_function_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > FN_NAME_MAX || s[0] == '.' || s[n - 1] == '.') return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        int ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                 c == '_' || c == '-' || c == '.' || c == ':';
        if (!ok) return 0;
    }
    return 1;
}

static int fail_name(muse_err *e, const char *path)
{
    return muse_fail(e,
                     "%s must be a function name of 1-%d characters A-Z a-z 0-9 _ - . : (not "
                     "starting or ending with '.'); fix the name",
                     path, FN_NAME_MAX);
}

/* Text of a content field: a string, or an array of {"type":"text","text":...} parts
 * concatenated. null/absent gives "" when allow_null. Appends into *acc. */
static int content_text(const cJSON *content, const char *path, int allow_null, char **acc,
                        size_t *acclen, muse_err *e)
{
    if (!content || cJSON_IsNull(content)) {
        if (allow_null) return 0;
        return muse_fail(e,
                         "%s is missing: give the message text as a string or an array of "
                         "{\"type\":\"text\",\"text\":...} parts",
                         path);
    }
    if (cJSON_IsString(content)) {
        size_t n = strlen(content->valuestring);
        char *nb = realloc(*acc, *acclen + n + 1);
        MUSE_CHECK(nb != NULL);
        memcpy(nb + *acclen, content->valuestring, n + 1);
        *acc = nb;
        *acclen += n;
        return 0;
    }
    if (!cJSON_IsArray(content))
        return muse_fail(e,
                         "%s must be a string or an array of {\"type\":\"text\",\"text\":...} "
                         "parts",
                         path);
    int j = 0;
    for (const cJSON *part = content->child; part; part = part->next, j++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type))
            return muse_fail(e, "%s[%d] must be an object {\"type\":\"text\",\"text\":\"...\"}",
                             path, j);
        if (strcmp(type->valuestring, "text") != 0)
            return muse_fail(e,
                             "%s[%d] has type other than \"text\": this model reads text only; "
                             "send the content as text parts",
                             path, j);
        if (!cJSON_IsString(text)) return muse_fail(e, "%s[%d].text must be a string", path, j);
        size_t n = strlen(text->valuestring);
        char *nb = realloc(*acc, *acclen + n + 1);
        MUSE_CHECK(nb != NULL);
        memcpy(nb + *acclen, text->valuestring, n + 1);
        *acc = nb;
        *acclen += n;
    }
    if (!*acc) {
        *acc = MUSE_CALLOC(1, 1);
    }
    return 0;
}

/* Renders a content field as text into r. */
static int put_content(muse_chat_render *r, const cJSON *content, const char *path, int allow_null,
                       muse_err *e)
{
    char *text = NULL;
    size_t n = 0;
    if (content_text(content, path, allow_null, &text, &n, e) != 0) {
        free(text);
        return -1;
    }
    put_text(r, text ? text : "", n);
    free(text);
    return 0;
}

/* ---- tools ---- */

typedef struct {
    const char *name, *description;
    const cJSON *parameters;
} tool_fn;

static int parse_tools(const cJSON *tools, tool_fn **out, size_t *nout, muse_err *e)
{
    *out = NULL;
    *nout = 0;
    if (!tools || cJSON_IsNull(tools)) return 0;
    if (!cJSON_IsArray(tools))
        return muse_fail(e, "tools must be an array of {\"type\":\"function\",\"function\":{...}}");
    size_t n = (size_t)cJSON_GetArraySize(tools);
    tool_fn *fns = MUSE_CALLOC(n ? n : 1, sizeof *fns);
    size_t k = 0;
    for (const cJSON *t = tools->child; t; t = t->next, k++) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
        const cJSON *desc = cJSON_GetObjectItemCaseSensitive(fn, "description");
        const cJSON *params = cJSON_GetObjectItemCaseSensitive(fn, "parameters");
        char path[64];
        if (!cJSON_IsObject(t) ||
            (type && !(cJSON_IsString(type) && strcmp(type->valuestring, "function") == 0))) {
            free(fns);
            return muse_fail(e, "tools[%zu] must be {\"type\":\"function\",\"function\":{...}}", k);
        }
        if (!cJSON_IsObject(fn)) {
            free(fns);
            return muse_fail(e,
                             "tools[%zu].function must be an object with name, description "
                             "and parameters",
                             k);
        }
        snprintf(path, sizeof path, "tools[%zu].function.name", k);
        if (!cJSON_IsString(name) || !valid_function_name(name->valuestring)) {
            free(fns);
            return fail_name(e, path);
        }
        for (size_t i = 0; i < k; i++)
            if (strcmp(fns[i].name, name->valuestring) == 0) {
                free(fns);
                return muse_fail(e,
                                 "%s repeats the name of tools[%zu]: give each function a "
                                 "distinct name",
                                 path, i);
            }
        if (desc && !cJSON_IsNull(desc) && !cJSON_IsString(desc)) {
            free(fns);
            return muse_fail(e, "tools[%zu].function.description must be a string", k);
        }
        if (params && !cJSON_IsNull(params) && !cJSON_IsObject(params)) {
            free(fns);
            return muse_fail(e, "tools[%zu].function.parameters must be a JSON Schema object", k);
        }
        fns[k].name = name->valuestring;
        fns[k].description = cJSON_IsString(desc) ? desc->valuestring : "";
        fns[k].parameters = cJSON_IsObject(params) ? params : NULL;
    }
    *out = fns;
    *nout = k;
    return 0;
}

/* Namespace of a function: the part before its last dot, or the whole plain name. */
static size_t namespace_len(const char *name)
{
    const char *dot = strrchr(name, '.');
    return dot ? (size_t)(dot - name) : strlen(name);
}

/* Index of the first function whose namespace equals fns[k]'s. */
static size_t first_of_namespace(const tool_fn *fns, size_t k)
{
    size_t nl = namespace_len(fns[k].name);
    for (size_t i = 0; i < k; i++)
        if (namespace_len(fns[i].name) == nl && memcmp(fns[i].name, fns[k].name, nl) == 0) return i;
    return k;
}

/* Valid recipient entries of namespace ns: "ns.*" when it has dotted functions, "ns" when a
 * plain function has that name (both when both). */
static void put_recipients_of(muse_chat_render *r, const tool_fn *fns, size_t nfns, size_t k)
{
    size_t nl = namespace_len(fns[k].name);
    int plain = 0, dotted = 0;
    for (size_t i = k; i < nfns; i++) {
        if (namespace_len(fns[i].name) != nl || memcmp(fns[i].name, fns[k].name, nl) != 0) continue;
        if (fns[i].name[nl] == '\0')
            plain = 1;
        else
            dotted = 1;
    }
    if (plain) {
        put_str(r, ", \"");
        put_text(r, fns[k].name, nl);
        put_str(r, "\"");
    }
    if (dotted) {
        put_str(r, ", \"");
        put_text(r, fns[k].name, nl);
        put_str(r, ".*\"");
    }
}

static void put_tool_preamble(muse_chat_render *r, const tool_fn *fns, size_t nfns)
{
    put_str(r, TOOL_PREAMBLE);
    for (size_t k = 0; k < nfns; k++) {
        if (first_of_namespace(fns, k) != k) continue;
        put_str(r, "{\"name\": ");
        char ns[FN_NAME_MAX + 1];
        size_t nl = namespace_len(fns[k].name);
        memcpy(ns, fns[k].name, nl);
        ns[nl] = '\0';
        put_json_string(r, ns);
        put_str(r, ", \"description\": \"\"}\n");
    }
    put_str(r, "// Function schemas\n");
    for (size_t k = 0; k < nfns; k++) {
        put_str(r, "{\"name\": ");
        put_json_string(r, fns[k].name);
        put_str(r, ", \"description\": ");
        put_json_string(r, fns[k].description);
        put_str(r, ", \"parameters\": ");
        if (fns[k].parameters)
            put_json(r, fns[k].parameters);
        else
            put_str(r, "{\"type\":\"object\",\"properties\":{}}");
        put_str(r, "}\n");
    }
    put_str(r, TOOL_EXAMPLE);
    put_str(r, "# Valid recipients: \"self\"");
    for (size_t k = 0; k < nfns; k++)
        if (first_of_namespace(fns, k) == k) put_recipients_of(r, fns, nfns, k);
    put_str(r, ", \"user\".");
}

/* ---- messages ---- */

/* Earlier calls (id -> function name) in render order, for tool results by tool_call_id. */
typedef struct {
    const char **ids, **names;
    size_t n, cap;
} call_table;

static void remember_call(call_table *ct, const cJSON *call, const char *name)
{
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(call, "id");
    if (!cJSON_IsString(id)) return;
    if (ct->n == ct->cap) {
        ct->cap = ct->cap ? ct->cap * 2 : 16;
        ct->ids = realloc(ct->ids, ct->cap * sizeof *ct->ids);
        ct->names = realloc(ct->names, ct->cap * sizeof *ct->names);
        MUSE_CHECK(ct->ids && ct->names);
    }
    ct->ids[ct->n] = id->valuestring;
    ct->names[ct->n++] = name;
}

/* The function name of the latest earlier call with this id, or NULL. Searching backwards
 * finds the usual case (the call just before its result) at once. */
static const char *name_of_call(const call_table *ct, const char *id)
{
    for (size_t k = ct->n; k-- > 0;)
        if (strcmp(ct->ids[k], id) == 0) return ct->names[k];
    return NULL;
}

static const char *role_of(const cJSON *m)
{
    const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
    return cJSON_IsString(role) ? role->valuestring : NULL;
}

static int is_system_role(const char *role)
{
    return strcmp(role, "system") == 0 || strcmp(role, "developer") == 0;
}

/* The system text: the request's system messages joined by "\n", or the default. */
static int system_text(const cJSON *messages, char **text, size_t *len, muse_err *e)
{
    *text = NULL;
    *len = 0;
    int i = 0;
    for (const cJSON *m = messages->child; m; m = m->next, i++) {
        const char *role = role_of(m);
        if (!role || !is_system_role(role)) continue;
        char path[64];
        snprintf(path, sizeof path, "messages[%d].content", i);
        if (*len > 0) {
            char *nb = realloc(*text, *len + 2);
            MUSE_CHECK(nb != NULL);
            nb[(*len)++] = '\n';
            nb[*len] = '\0';
            *text = nb;
        }
        if (content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), path, 0, text, len, e))
            return -1;
    }
    return 0;
}

static int put_system_block(muse_chat_render *r, const cJSON *messages, const char *effort,
                            const tool_fn *fns, size_t nfns, muse_err *e)
{
    char *text = NULL;
    size_t len = 0;
    if (system_text(messages, &text, &len, e) != 0) {
        free(text);
        return -1;
    }
    put_special(r, r->ids.start);
    put_str(r, "system");
    put_special(r, r->ids.message);
    if (len > 0)
        put_text(r, text, len);
    else
        put_str(r, DEFAULT_SYSTEM_TEXT);
    free(text);
    put_str(r, KNOWLEDGE_CUTOFF);
    put_str(r, effort);
    put_str(r, ".\n\n");
    if (nfns > 0) put_tool_preamble(r, fns, nfns);
    put_special(r, r->ids.eot);
    return 0;
}

/* The arguments of an earlier call as a JSON object: a JSON string holding an object (OpenAI),
 * or an object as is; "" or absent means {}. *owned is set when the caller must delete. */
static int call_arguments(const cJSON *args, const char *path, cJSON **obj, int *owned, muse_err *e)
{
    *owned = 0;
    if (!args || cJSON_IsNull(args) ||
        (cJSON_IsString(args) && args->valuestring[strspn(args->valuestring, " \t\r\n")] == 0)) {
        *obj = cJSON_CreateObject();
        MUSE_CHECK(*obj != NULL);
        *owned = 1;
        return 0;
    }
    if (cJSON_IsObject(args)) {
        *obj = (cJSON *)args;
        return 0;
    }
    cJSON *parsed = cJSON_IsString(args) ? cJSON_Parse(args->valuestring) : NULL;
    if (!cJSON_IsObject(parsed)) {
        cJSON_Delete(parsed);
        return muse_fail(e, "%s must be a string holding a JSON object (the call's arguments)",
                         path);
    }
    *obj = parsed;
    *owned = 1;
    return 0;
}

/* <|start|>assistant to=NAME<|message|>{ATEM}<|eom|> */
static int put_earlier_call(muse_chat_render *r, call_table *ct, const cJSON *call,
                            const char *path, muse_err *e)
{
    const cJSON *fn = cJSON_GetObjectItemCaseSensitive(call, "function");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(fn, "name");
    char sub[128];
    if (!cJSON_IsObject(call) || !cJSON_IsObject(fn))
        return muse_fail(e,
                         "%s must be {\"id\":...,\"type\":\"function\",\"function\":{\"name\":"
                         "...,\"arguments\":...}}",
                         path);
    snprintf(sub, sizeof sub, "%s.function.name", path);
    if (!cJSON_IsString(name) || !valid_function_name(name->valuestring)) return fail_name(e, sub);
    snprintf(sub, sizeof sub, "%s.function.arguments", path);
    cJSON *args = NULL;
    int owned = 0;
    if (call_arguments(cJSON_GetObjectItemCaseSensitive(fn, "arguments"), sub, &args, &owned, e))
        return -1;
    put_special(r, r->ids.start);
    put_str(r, "assistant to=");
    put_str(r, name->valuestring);
    put_special(r, r->ids.message);
    put_str(r, "<atem:function_calls>\n<atem:invoke name=\"");
    put_str(r, name->valuestring);
    put_str(r, "\">\n");
    for (const cJSON *p = args->child; p; p = p->next) {
        put_str(r, "<atem:parameter name=\"");
        put_str(r, p->string);
        put_str(r, "\">");
        if (cJSON_IsString(p))
            put_str(r, p->valuestring);
        else
            put_json(r, p);
        put_str(r, "</atem:parameter>\n");
    }
    put_str(r, "</atem:invoke>\n</atem:function_calls>");
    put_special(r, r->ids.eom);
    remember_call(ct, call, name->valuestring);
    if (owned) cJSON_Delete(args);
    return 0;
}

static int put_assistant(muse_chat_render *r, call_table *ct, const cJSON *m, int i, muse_err *e)
{
    char path[96];
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (calls && !cJSON_IsNull(calls) && !cJSON_IsArray(calls))
        return muse_fail(e, "messages[%d].tool_calls must be an array", i);
    int ncalls = cJSON_IsArray(calls) ? cJSON_GetArraySize(calls) : 0;
    char *text = NULL;
    size_t len = 0;
    snprintf(path, sizeof path, "messages[%d].content", i);
    if (content_text(cJSON_GetObjectItemCaseSensitive(m, "content"), path, 1, &text, &len, e)) {
        free(text);
        return -1;
    }
    /* An answer with calls after it is one message of the same turn: it ends with <|eom|>. */
    if (len > 0 || ncalls == 0) {
        put_special(r, r->ids.start);
        put_str(r, "assistant to=user");
        put_special(r, r->ids.message);
        put_text(r, text ? text : "", len);
        put_special(r, ncalls ? r->ids.eom : r->ids.eot);
    }
    free(text);
    int k = 0;
    for (const cJSON *c = ncalls ? calls->child : NULL; c; c = c->next, k++) {
        snprintf(path, sizeof path, "messages[%d].tool_calls[%d]", i, k);
        if (put_earlier_call(r, ct, c, path, e) != 0) return -1;
    }
    return 0;
}

static int put_tool_result(muse_chat_render *r, const call_table *ct, const cJSON *m, int i,
                           muse_err *e)
{
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(m, "name");
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(m, "tool_call_id");
    const char *fn = NULL;
    char path[96];
    if (cJSON_IsString(name)) {
        snprintf(path, sizeof path, "messages[%d].name", i);
        if (!valid_function_name(name->valuestring)) return fail_name(e, path);
        fn = name->valuestring;
    } else if (cJSON_IsString(id)) {
        fn = name_of_call(ct, id->valuestring);
        if (!fn)
            return muse_fail(e,
                             "messages[%d].tool_call_id matches no id in an earlier "
                             "assistant message's tool_calls: give the id of the call this "
                             "result answers, or the function's name",
                             i);
    } else {
        return muse_fail(e,
                         "messages[%d] (role tool) needs tool_call_id (the id of the call it "
                         "answers) or name (the function's name)",
                         i);
    }
    put_special(r, r->ids.start);
    put_str(r, "tool ");
    put_str(r, fn);
    put_special(r, r->ids.message);
    put_str(r, "<tool_output name=\"");
    put_str(r, fn);
    put_str(r, "\">\n");
    snprintf(path, sizeof path, "messages[%d].content", i);
    if (put_content(r, cJSON_GetObjectItemCaseSensitive(m, "content"), path, 0, e)) return -1;
    put_str(r, "\n</tool_output>");
    put_special(r, r->ids.eot);
    return 0;
}

static int put_message(muse_chat_render *r, call_table *ct, const cJSON *m, int i, muse_err *e)
{
    char path[96];
    if (!cJSON_IsObject(m))
        return muse_fail(e, "messages[%d] must be an object with role and content", i);
    const char *role = role_of(m);
    if (!role)
        return muse_fail(e,
                         "messages[%d].role must be one of \"system\", \"user\", "
                         "\"assistant\", \"tool\"",
                         i);
    if (is_system_role(role)) return 0; /* rendered in the system block */
    if (strcmp(role, "user") == 0) {
        put_special(r, r->ids.start);
        put_str(r, "user");
        put_special(r, r->ids.message);
        snprintf(path, sizeof path, "messages[%d].content", i);
        if (put_content(r, cJSON_GetObjectItemCaseSensitive(m, "content"), path, 0, e)) return -1;
        put_special(r, r->ids.eot);
        return 0;
    }
    if (strcmp(role, "assistant") == 0) return put_assistant(r, ct, m, i, e);
    if (strcmp(role, "tool") == 0) return put_tool_result(r, ct, m, i, e);
    return muse_fail(e,
                     "messages[%d].role must be one of \"system\", \"user\", \"assistant\", "
                     "\"tool\"",
                     i);
}

static int check_effort(const char *effort, muse_err *e)
{
    if (strcmp(effort, "low") == 0 || strcmp(effort, "medium") == 0 || strcmp(effort, "high") == 0)
        return 0;
    return muse_fail(e, "reasoning_effort must be \"low\", \"medium\" or \"high\"");
}

static void keep_function_names(muse_chat_render *r, const tool_fn *fns, size_t nfns)
{
    r->fn_names = MUSE_CALLOC(nfns ? nfns : 1, sizeof *r->fn_names);
    for (size_t k = 0; k < nfns; k++) r->fn_names[k] = strdup(fns[k].name);
    r->nfn = nfns;
}

int muse_chat_render_messages(const cJSON *messages, const cJSON *tools,
                              const char *reasoning_effort, const muse_chat_ids *ids,
                              muse_chat_render *out, muse_err *e)
{
    memset(out, 0, sizeof *out);
    out->ids = *ids;
    const char *effort = reasoning_effort ? reasoning_effort : "high";
    if (check_effort(effort, e) != 0) return -1;
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return muse_fail(e, "messages must be a non-empty array of {\"role\":...,\"content\":...}");
    tool_fn *fns;
    size_t nfns;
    if (parse_tools(tools, &fns, &nfns, e) != 0) return -1;
    put_special(out, ids->begin_of_text);
    int rc = put_system_block(out, messages, effort, fns, nfns, e);
    call_table calls = {0};
    int i = 0;
    for (const cJSON *m = messages->child; rc == 0 && m; m = m->next, i++)
        rc = put_message(out, &calls, m, i, e);
    free(calls.ids);
    free(calls.names);
    if (rc == 0) {
        put_special(out, ids->start);
        put_str(out, "assistant");
        keep_function_names(out, fns, nfns);
    }
    free(fns);
    if (rc != 0) muse_chat_render_free(out);
    return rc;
}

void muse_chat_render_free(muse_chat_render *r)
{
    free(r->text.p);
    free(r->segs);
    for (size_t k = 0; k < r->nfn; k++) free(r->fn_names[k]);
    free(r->fn_names);
    muse_chat_ids ids = r->ids;
    memset(r, 0, sizeof *r);
    r->ids = ids;
}

int muse_chat_render_flatten(const muse_chat_render *r, muse_chat_tokenize_fn fn, void *ctx,
                             int32_t **ids, size_t *n, muse_err *e)
{
    size_t cap = r->text.len / 3 + r->nsegs + 16;
    *ids = MUSE_MALLOC(cap * sizeof **ids);
    *n = 0;
    for (size_t k = 0; k < r->nsegs; k++) {
        const muse_chat_seg *s = &r->segs[k];
        if (s->is_special) {
            if (*n == cap) {
                cap *= 2;
                int32_t *nb = realloc(*ids, cap * sizeof **ids);
                MUSE_CHECK(nb != NULL);
                *ids = nb;
            }
            (*ids)[(*n)++] = s->id;
        } else if (fn(ctx, r->text.p + s->off, s->len, ids, n, &cap, e) != 0) {
            free(*ids);
            *ids = NULL;
            *n = 0;
            return -1;
        }
    }
    return 0;
}

static const char *special_name(const muse_chat_ids *ids, int32_t id)
{
    if (id == ids->begin_of_text) return "<|begin_of_text|>";
    if (id == ids->end_of_text) return "<|end_of_text|>";
    if (id == ids->eom) return "<|eom|>";
    if (id == ids->eot) return "<|eot|>";
    if (id == ids->start) return "<|start|>";
    if (id == ids->message) return "<|message|>";
    return "<|?|>";
}

char *muse_chat_render_text(const muse_chat_render *r, size_t *len)
{
    muse_buf t = {0};
    muse_buf_add(&t, "", 0); /* an empty rendering is still a string */
    for (size_t k = 0; k < r->nsegs; k++) {
        const muse_chat_seg *s = &r->segs[k];
        if (s->is_special)
            muse_buf_add(&t, special_name(&r->ids, s->id), strlen(special_name(&r->ids, s->id)));
        else
            muse_buf_add(&t, r->text.p + s->off, s->len);
    }
    if (len) *len = t.len;
    return t.p;
}
