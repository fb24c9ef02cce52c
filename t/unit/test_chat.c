/* The chat renderer: CHAT.md's golden byte for byte, goldens of every branch (also kept in
 * docs/chat-goldens.md), validation errors naming the JSON path, and flattening to ids. */
#include "text/chat.h"
#include "tap.h"

/* CHAT.md "Golden rendering", copied verbatim. */
static const char CHAT_MD_GOLDEN[] =
    "<|start|>system<|message|>You are a helpful AI assistant.\n"
    "Knowledge cutoff: 2026-01-04.\n\nReasoning strength: high.\n\n"
    "In this environment you have access to a set of tools you can use to answer the user's "
    "question.\n\n"
    "You can invoke a function by writing a \"<atem:function_calls>\" block like the following:\n"
    "<atem:function_calls>\n<atem:invoke name=\"$FUNCTION_NAME\">\n"
    "<atem:parameter name=\"$PARAMETER_NAME\">$PARAMETER_VALUE</atem:parameter>\n"
    "...\n</atem:invoke>\n</atem:function_calls>\n\n"
    "String and scalar parameters should be specified as is, while lists and objects should use "
    "JSON format. Note that spaces for string values are not stripped. The output is not expected "
    "to be valid XML and is parsed with regular expressions.\n"
    "Here are the functions available in JSONSchema format:\n// Tool metadata\n"
    "{\"name\": \"weather\", \"description\": \"\"}\n"
    "{\"name\": \"math\", \"description\": \"\"}\n"
    "// Function schemas\n"
    "{\"name\": \"weather.get\", \"description\": \"Get weather\", \"parameters\": "
    "{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}}\n"
    "{\"name\": \"math.add\", \"description\": \"Add values\", \"parameters\": "
    "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}\n\n"
    "Here's an example of how to call a function in the tool set:\n"
    "(If the tool namespace is not specified, invoke the function directly as "
    "`example_function_name` rather than `example_tool_name.example_function_name`)\n\n"
    "to=example_tool_name.example_function_name\n\n"
    "<atem:function_calls>\n<atem:invoke name=\"example_tool_name.example_function_name\">\n"
    "<atem:parameter name=\"example_parameter_1\">value_1</atem:parameter>\n"
    "<atem:parameter name=\"example_parameter_2\">This is the value for the second parameter\nthat "
    "can span\n\"multiple\" lines\n</atem:parameter>\n"
    "</atem:invoke>\n</atem:function_calls>\n\n"
    "# Valid recipients: \"self\", \"weather.*\", \"math.*\", \"user\".<|eot|>"
    "<|start|>user<|message|>Weather?<|eot|>"
    "<|start|>tool weather.get<|message|><tool_output name=\"weather.get\">\n"
    "sunny\n</tool_output><|eot|>"
    "<|start|>assistant";

static const char GOLDEN_TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"weather.get\",\"description\":\"Get "
    "weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":"
    "\"string\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"math.add\",\"description\":\"Add "
    "values\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":"
    "\"integer\"}}}}}]";
static const char GOLDEN_MESSAGES[] =
    "[{\"role\":\"user\",\"content\":\"Weather?\"},"
    "{\"role\":\"tool\",\"name\":\"weather.get\",\"content\":\"sunny\"}]";

/* Renders; returns the text (malloc'd) or NULL with e filled. */
static char *render(const char *messages, const char *tools, const char *effort, muse_err *e,
                    muse_chat_render *keep)
{
    cJSON *m = cJSON_Parse(messages);
    cJSON *t = tools ? cJSON_Parse(tools) : NULL;
    MUSE_CHECK(m && (t || !tools));
    muse_chat_ids ids;
    muse_chat_ids_default(&ids);
    muse_chat_render r;
    char *text = NULL;
    if (muse_chat_render_messages(m, t, effort, &ids, &r, e) == 0) {
        text = muse_chat_render_text(&r, NULL);
        if (keep)
            *keep = r;
        else
            muse_chat_render_free(&r);
    }
    cJSON_Delete(m);
    cJSON_Delete(t);
    return text;
}

static void test_chat_md_golden(void)
{
    muse_err e = {{0}};
    muse_chat_render r;
    char *text = render(GOLDEN_MESSAGES, GOLDEN_TOOLS, NULL, &e, &r);
    ok(text != NULL, "CHAT.md golden renders (%s)", text ? "ok" : e.msg);
    if (!text) return;
    static const char bot[] = "<|begin_of_text|>";
    ok(strncmp(text, bot, strlen(bot)) == 0, "<|begin_of_text|> in front");
    is_str(text + strlen(bot), CHAT_MD_GOLDEN, "CHAT.md golden, byte for byte");
    ok(r.nsegs > 0 && r.segs[0].is_special && r.segs[0].id == 200000,
       "<|begin_of_text|> is a token, not text");
    ok(r.nfn == 2 && strcmp(r.fn_names[0], "weather.get") == 0 &&
           strcmp(r.fn_names[1], "math.add") == 0,
       "function names kept for the reply parser");
    muse_chat_render_free(&r);
    free(text);
}

typedef struct {
    const char *name, *messages, *tools, *effort;
    int after_system; /* compare only what follows the system block */
    const char *golden;
} golden_case;

static const golden_case GOLDENS[] = {
    {"no_tools", "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, NULL, 0,
     "<|begin_of_text|><|start|>system<|message|>You are a helpful AI assistant.\n"
     "Knowledge cutoff: 2026-01-04.\n"
     "\n"
     "Reasoning strength: high.\n"
     "\n"
     "<|eot|><|start|>user<|message|>Hi<|eot|><|start|>assistant"},
    {"custom_system_low",
     "[{\"role\":\"system\",\"content\":\"You are Muse, "
     "terse.\"},{\"role\":\"user\",\"content\":\"Hi\"}]",
     NULL, "low", 0,
     "<|begin_of_text|><|start|>system<|message|>You are Muse, terse.\n"
     "Knowledge cutoff: 2026-01-04.\n"
     "\n"
     "Reasoning strength: low.\n"
     "\n"
     "<|eot|><|start|>user<|message|>Hi<|eot|><|start|>assistant"},
    {"multi_turn_medium",
     "[{\"role\":\"user\",\"content\":\"Hi\"},{\"role\":\"assistant\",\"content\":\"Hello!\","
     "\"reasoning_content\":\"secret\"},{\"role\":\"user\",\"content\":\"Bye\"}]",
     NULL, "medium", 0,
     "<|begin_of_text|><|start|>system<|message|>You are a helpful AI assistant.\n"
     "Knowledge cutoff: 2026-01-04.\n"
     "\n"
     "Reasoning strength: medium.\n"
     "\n"
     "<|eot|><|start|>user<|message|>Hi<|eot|><|start|>assistant "
     "to=user<|message|>Hello!<|eot|><|start|>user<|message|>Bye<|eot|><|start|>assistant"},
    {"parallel_calls_by_id",
     "[{\"role\":\"user\",\"content\":\"Weather in Paris and "
     "1+2?\"},{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\",\"type\":"
     "\"function\",\"function\":{\"name\":\"weather.get\",\"arguments\":\"{\\\"city\\\":"
     "\\\"Paris\\\",\\\"days\\\":3}\"}},{\"id\":\"c2\",\"type\":\"function\",\"function\":{"
     "\"name\":\"math.add\",\"arguments\":\"{\\\"a\\\":1,\\\"b\\\":[2,{\\\"x\\\":true}]}\"}}]},{"
     "\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"sunny\"},{\"role\":\"tool\",\"tool_"
     "call_id\":\"c2\",\"content\":\"3\"},{\"role\":\"assistant\",\"content\":\"Sunny; "
     "3.\"},{\"role\":\"user\",\"content\":\"Thanks\"}]",
     "[{\"type\":\"function\",\"function\":{\"name\":\"weather.get\",\"description\":\"Get "
     "weather\",\"parameters\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}"
     "}}},{\"type\":\"function\",\"function\":{\"name\":\"math.add\",\"description\":\"Add "
     "values\",\"parameters\":{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}}}"
     "]",
     NULL, 1,
     "<|start|>user<|message|>Weather in Paris and 1+2?<|eot|><|start|>assistant "
     "to=weather.get<|message|><atem:function_calls>\n"
     "<atem:invoke name=\"weather.get\">\n"
     "<atem:parameter name=\"city\">Paris</atem:parameter>\n"
     "<atem:parameter name=\"days\">3</atem:parameter>\n"
     "</atem:invoke>\n"
     "</atem:function_calls><|eom|><|start|>assistant to=math.add<|message|><atem:function_calls>\n"
     "<atem:invoke name=\"math.add\">\n"
     "<atem:parameter name=\"a\">1</atem:parameter>\n"
     "<atem:parameter name=\"b\">[2,{\"x\":true}]</atem:parameter>\n"
     "</atem:invoke>\n"
     "</atem:function_calls><|eom|><|start|>tool weather.get<|message|><tool_output "
     "name=\"weather.get\">\n"
     "sunny\n"
     "</tool_output><|eot|><|start|>tool math.add<|message|><tool_output name=\"math.add\">\n"
     "3\n"
     "</tool_output><|eot|><|start|>assistant to=user<|message|>Sunny; "
     "3.<|eot|><|start|>user<|message|>Thanks<|eot|><|start|>assistant"},
    {"plain_namespaces", "[{\"role\":\"user\",\"content\":\"Time?\"}]",
     "[{\"type\":\"function\",\"function\":{\"name\":\"get_time\",\"description\":\"Current "
     "\\\"UTC\\\" "
     "time\"}},{\"type\":\"function\",\"function\":{\"name\":\"weather.get\",\"description\":\"W\","
     "\"parameters\":{\"type\":\"object\"}}},{\"type\":\"function\",\"function\":{\"name\":"
     "\"math\",\"description\":\"M\",\"parameters\":{}}},{\"type\":\"function\",\"function\":{"
     "\"name\":\"weather.set\",\"description\":\"S\",\"parameters\":{}}},{\"type\":\"function\","
     "\"function\":{\"name\":\"math.add\",\"description\":\"A\",\"parameters\":{}}}]",
     NULL, 0,
     "<|begin_of_text|><|start|>system<|message|>You are a helpful AI assistant.\n"
     "Knowledge cutoff: 2026-01-04.\n"
     "\n"
     "Reasoning strength: high.\n"
     "\n"
     "In this environment you have access to a set of tools you can use to answer the user's "
     "question.\n"
     "\n"
     "You can invoke a function by writing a \"<atem:function_calls>\" block like the following:\n"
     "<atem:function_calls>\n"
     "<atem:invoke name=\"$FUNCTION_NAME\">\n"
     "<atem:parameter name=\"$PARAMETER_NAME\">$PARAMETER_VALUE</atem:parameter>\n"
     "...\n"
     "</atem:invoke>\n"
     "</atem:function_calls>\n"
     "\n"
     "String and scalar parameters should be specified as is, while lists and objects should use "
     "JSON format. Note that spaces for string values are not stripped. The output is not expected "
     "to be valid XML and is parsed with regular expressions.\n"
     "Here are the functions available in JSONSchema format:\n"
     "// Tool metadata\n"
     "{\"name\": \"get_time\", \"description\": \"\"}\n"
     "{\"name\": \"weather\", \"description\": \"\"}\n"
     "{\"name\": \"math\", \"description\": \"\"}\n"
     "// Function schemas\n"
     "{\"name\": \"get_time\", \"description\": \"Current \\\"UTC\\\" time\", \"parameters\": "
     "{\"type\":\"object\",\"properties\":{}}}\n"
     "{\"name\": \"weather.get\", \"description\": \"W\", \"parameters\": {\"type\":\"object\"}}\n"
     "{\"name\": \"math\", \"description\": \"M\", \"parameters\": {}}\n"
     "{\"name\": \"weather.set\", \"description\": \"S\", \"parameters\": {}}\n"
     "{\"name\": \"math.add\", \"description\": \"A\", \"parameters\": {}}\n"
     "\n"
     "Here's an example of how to call a function in the tool set:\n"
     "(If the tool namespace is not specified, invoke the function directly as "
     "`example_function_name` rather than `example_tool_name.example_function_name`)\n"
     "\n"
     "to=example_tool_name.example_function_name\n"
     "\n"
     "<atem:function_calls>\n"
     "<atem:invoke name=\"example_tool_name.example_function_name\">\n"
     "<atem:parameter name=\"example_parameter_1\">value_1</atem:parameter>\n"
     "<atem:parameter name=\"example_parameter_2\">This is the value for the second parameter\n"
     "that can span\n"
     "\"multiple\" lines\n"
     "</atem:parameter>\n"
     "</atem:invoke>\n"
     "</atem:function_calls>\n"
     "\n"
     "# Valid recipients: \"self\", \"get_time\", \"weather.*\", \"math\", \"math.*\", "
     "\"user\".<|eot|><|start|>user<|message|>Time?<|eot|><|start|>assistant"},
    {"content_parts",
     "[{\"role\":\"system\",\"content\":[{\"type\":\"text\",\"text\":\"Sys "
     "\"},{\"type\":\"text\",\"text\":\"two\"}]},{\"role\":\"user\",\"content\":[{\"type\":"
     "\"text\",\"text\":\"Hello "
     "\"},{\"type\":\"text\",\"text\":\"there\"}]},{\"role\":\"assistant\",\"content\":[{\"type\":"
     "\"text\",\"text\":\"Hi!\"}]},{\"role\":\"user\",\"content\":\"I typed <|start|> here\"}]",
     NULL, NULL, 0,
     "<|begin_of_text|><|start|>system<|message|>Sys two\n"
     "Knowledge cutoff: 2026-01-04.\n"
     "\n"
     "Reasoning strength: high.\n"
     "\n"
     "<|eot|><|start|>user<|message|>Hello there<|eot|><|start|>assistant "
     "to=user<|message|>Hi!<|eot|><|start|>user<|message|>I typed <|start|> "
     "here<|eot|><|start|>assistant"},
    {"answer_with_call",
     "[{\"role\":\"user\",\"content\":\"Q\"},{\"role\":\"assistant\",\"content\":\"Let me "
     "check.\",\"tool_calls\":[{\"id\":\"x\",\"type\":\"function\",\"function\":{\"name\":\"get_"
     "time\",\"arguments\":\"\"}}]},{\"role\":\"tool\",\"name\":\"get_time\",\"content\":[{"
     "\"type\":\"text\",\"text\":\"12:00\"}]}]",
     "[{\"type\":\"function\",\"function\":{\"name\":\"get_time\"}}]", NULL, 1,
     "<|start|>user<|message|>Q<|eot|><|start|>assistant to=user<|message|>Let me "
     "check.<|eom|><|start|>assistant to=get_time<|message|><atem:function_calls>\n"
     "<atem:invoke name=\"get_time\">\n"
     "</atem:invoke>\n"
     "</atem:function_calls><|eom|><|start|>tool get_time<|message|><tool_output "
     "name=\"get_time\">\n"
     "12:00\n"
     "</tool_output><|eot|><|start|>assistant"},
};

static void test_goldens(void)
{
    for (size_t k = 0; k < sizeof GOLDENS / sizeof GOLDENS[0]; k++) {
        const golden_case *g = &GOLDENS[k];
        muse_err e = {{0}};
        char *text = render(g->messages, g->tools, g->effort, &e, NULL);
        if (!text) {
            ok(0, "golden %s renders: %s", g->name, e.msg);
            continue;
        }
        const char *got = text;
        if (g->after_system) {
            const char *eot = strstr(text, "<|eot|>");
            got = eot ? eot + strlen("<|eot|>") : text;
        }
        is_str(got, g->golden, "golden %s", g->name);
        free(text);
    }
}

static void expect_error(const char *messages, const char *tools, const char *effort,
                         const char *path, const char *what)
{
    muse_err e = {{0}};
    char *text = render(messages, tools, effort, &e, NULL);
    ok(text == NULL && strstr(e.msg, path) != NULL, "%s: error names %s", what, path);
    if (text || !strstr(e.msg, path)) diag("message: %s", text ? "(rendered)" : e.msg);
    free(text);
}

static void test_errors(void)
{
    expect_error(
        "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":[{\"type\":"
        "\"text\",\"text\":\"x\"},{\"type\":\"image_url\",\"image_url\":{\"url\":\"u\"}}]}]",
        NULL, NULL, "messages[1].content[1]", "image part");
    expect_error(
        "[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"tool\",\"tool_call_id\":\"zz\","
        "\"content\":\"r\"}]",
        NULL, NULL, "messages[1].tool_call_id", "unknown tool_call_id");
    expect_error("[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"user\",\"content\":\"b\"},"
                 "{\"role\":\"robot\",\"content\":\"c\"}]",
                 NULL, NULL, "messages[2].role", "unknown role");
    expect_error("[{\"content\":\"c\"}]", NULL, NULL, "messages[0].role", "missing role");
    expect_error("[{\"role\":\"user\"}]", NULL, NULL, "messages[0].content", "missing content");
    expect_error("[{\"role\":\"user\",\"content\":5}]", NULL, NULL, "messages[0].content",
                 "numeric content");
    expect_error("[]", NULL, NULL, "messages", "empty messages");
    expect_error("[{\"role\":\"user\",\"content\":\"a\"}]", NULL, "extreme", "reasoning_effort",
                 "bad reasoning_effort");
    expect_error("[{\"role\":\"user\",\"content\":\"a\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"bad name\"}}]", NULL,
                 "tools[0].function.name", "tool name with a space");
    expect_error("[{\"role\":\"user\",\"content\":\"a\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"f\"}},"
                 "{\"type\":\"function\",\"function\":{\"name\":\"f\"}}]",
                 NULL, "tools[1].function.name", "duplicate tool name");
    expect_error("[{\"role\":\"user\",\"content\":\"a\"}]",
                 "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":[]}}]", NULL,
                 "tools[0].function.parameters", "parameters not an object");
    expect_error("[{\"role\":\"user\",\"content\":\"a\"}]", "{\"type\":\"function\"}", NULL,
                 "tools", "tools not an array");
    expect_error("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
                 "\"function\":{\"name\":\"f\",\"arguments\":\"[1]\"}}]}]",
                 NULL, NULL, "messages[0].tool_calls[0].function.arguments",
                 "arguments not an object");
    expect_error("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
                 "\"function\":{\"arguments\":\"{}\"}}]}]",
                 NULL, NULL, "messages[0].tool_calls[0].function.name", "call without a name");
    expect_error("[{\"role\":\"tool\",\"content\":\"r\"}]", NULL, NULL, "messages[0]",
                 "tool result naming nothing");
}

static void test_arguments_as_object(void)
{
    muse_err e = {{0}};
    char *a = render("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
                     "\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"s\\\":\\\"x y\\\","
                     "\\\"n\\\":null}\"}}]}]",
                     NULL, NULL, &e, NULL);
    char *b = render("[{\"role\":\"assistant\",\"tool_calls\":[{\"id\":\"a\",\"type\":\"function\","
                     "\"function\":{\"name\":\"f\",\"arguments\":{\"s\":\"x y\",\"n\":null}}}]}]",
                     NULL, NULL, &e, NULL);
    ok(a && b && strcmp(a, b) == 0, "arguments as a JSON string or an object render the same");
    ok(a && strstr(a, "<atem:parameter name=\"s\">x y</atem:parameter>\n"
                      "<atem:parameter name=\"n\">null</atem:parameter>\n"),
       "string parameter as is, null as JSON");
    free(a);
    free(b);
}

/* Fake tokenizer: one id per byte, so special parsing is visibly off. */
static int byte_tokens(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                       size_t *cap, muse_err *e)
{
    (void)ctx;
    (void)e;
    for (size_t i = 0; i < len; i++) {
        if (*n == *cap) {
            *cap *= 2;
            int32_t *nb = realloc(*ids, *cap * sizeof **ids);
            MUSE_CHECK(nb != NULL);
            *ids = nb;
        }
        (*ids)[(*n)++] = (unsigned char)text[i];
    }
    return 0;
}

static void test_flatten(void)
{
    muse_err e = {{0}};
    muse_chat_render r;
    char *text = render("[{\"role\":\"user\",\"content\":\"<|start|>x\"}]", NULL, NULL, &e, &r);
    MUSE_CHECK(text != NULL);
    int32_t *ids = NULL;
    size_t n = 0;
    ok(muse_chat_render_flatten(&r, byte_tokens, NULL, &ids, &n, &e) == 0, "flatten");
    size_t specials = 0, text_bytes = 0;
    for (size_t k = 0; k < r.nsegs; k++)
        if (r.segs[k].is_special)
            specials++;
        else
            text_bytes += r.segs[k].len;
    is_int(n, specials + text_bytes, "flatten: one id per special plus the text's tokens");
    is_int(specials, 8, "8 control tokens: bot, system start/message/eot, user x3, start");
    ok(ids[0] == 200000 && ids[1] == 200022 && ids[n - 1] == 't' && ids[n - 10] == 200022,
       "flatten: ids in order, generation prompt last");
    size_t starts = 0;
    for (size_t k = 0; k < n; k++) starts += ids[k] == 200022;
    is_int(starts, 3, "user-typed <|start|> is text, not the control id");
    free(ids);
    free(text);
    muse_chat_render_free(&r);
}

/* With the real tokenizer (t/data/tokenizer_tiny.json has <|eot|> 300 and <|start|> 301 only). */
static void test_real_tokenizer(void)
{
    muse_tokenizer *t = NULL;
    muse_err e = {{0}};
    if (muse_tokenizer_load("t/data/tokenizer_tiny.json", &t, &e) != 0) {
        ok(0, "load t/data/tokenizer_tiny.json: %s", e.msg);
        return;
    }
    muse_chat_ids ids;
    ok(muse_chat_ids_from_tokenizer(t, &ids, &e) == -1 && strstr(e.msg, "<|begin_of_text|>"),
       "missing control token named: %s", e.msg);
    muse_chat_ids_default(&ids);
    ids.eot = muse_tokenizer_special_id(t, "<|eot|>");
    ids.start = muse_tokenizer_special_id(t, "<|start|>");
    cJSON *m = cJSON_Parse("[{\"role\":\"user\",\"content\":\"say <|start|> and <|eot|> 123\"}]");
    muse_chat_render r;
    int32_t *out = NULL;
    size_t n = 0;
    ok(muse_chat_render_messages(m, NULL, NULL, &ids, &r, &e) == 0 &&
           muse_chat_render_tokens(&r, t, &out, &n, &e) == 0,
       "render + tokenize with the real tokenizer");
    size_t starts = 0, eots = 0, segs_start = 0, segs_eot = 0, textlen = 0;
    char *joined = MUSE_CALLOC(r.text.len + 1, 1);
    int bytes_ok = 1;
    for (size_t k = 0; k < r.nsegs; k++) {
        segs_start += r.segs[k].is_special && r.segs[k].id == ids.start;
        segs_eot += r.segs[k].is_special && r.segs[k].id == ids.eot;
    }
    for (size_t k = 0; k < n; k++) {
        if (out[k] == ids.start || out[k] == ids.eot || out[k] >= 200000) {
            starts += out[k] == ids.start;
            eots += out[k] == ids.eot;
            continue;
        }
        size_t len = 0;
        const uint8_t *b = muse_tokenizer_token_bytes(t, out[k], &len);
        if (!b || textlen + len > r.text.len) {
            bytes_ok = 0;
            break;
        }
        memcpy(joined + textlen, b, len);
        textlen += len;
    }
    ok(starts == segs_start && eots == segs_eot,
       "control ids only where the renderer put them (user-typed ones are text)");
    ok(bytes_ok && textlen == r.text.len && memcmp(joined, r.text.p, r.text.len) == 0,
       "the text tokens decode back to the rendered text");
    free(joined);
    free(out);
    muse_chat_render_free(&r);
    cJSON_Delete(m);
    muse_tokenizer_free(t);
}

int main(void)
{
    test_chat_md_golden();
    test_goldens();
    test_errors();
    test_arguments_as_object();
    test_flatten();
    test_real_tokenizer();
    return done_testing();
}
