/* The streaming reply parser against a fake vocabulary: ids 0-255 are single bytes, 300+ are
 * multi-byte pieces (greedy longest match), 200000+ are the control tokens. */
#include <time.h>

#include "text/reply.h"
#include "tap.h"

#define BOT        200000
#define EOS        200001
#define EOM        200007
#define EOT        200008
#define START      200022
#define MSG        200023
#define CONFIG_EOS 200010

static const char *const pieces[] = {
    " to",
    "=",
    "self",
    "user",
    "assistant",
    " to=user",
    "<|eom|>",
    "<|start|>",
    "Hello",
    " world",
    "weather",
    ".get",
    "math.add",
    "<atem:function_calls>\n",
    "<atem:invoke name=\"",
    "\">\n",
    "<atem:parameter name=\"",
    "</atem:parameter>\n",
    "</atem:invoke>\n",
    "</atem:function_calls>",
    "EN",
    "\xC3\xA9t\xC3\xA9", /* "été": a multi-byte token */
};
#define NPIECES (sizeof pieces / sizeof pieces[0])

static uint8_t single[256];

static const uint8_t *token_bytes(void *ctx, int32_t id, size_t *len)
{
    (void)ctx;
    if (id >= 0 && id < 256) {
        *len = 1;
        return &single[id];
    }
    if (id >= 300 && id < 300 + (int32_t)NPIECES) {
        *len = strlen(pieces[id - 300]);
        return (const uint8_t *)pieces[id - 300];
    }
    return NULL;
}

/* Independent UTF-8 check (scalar values, no overlongs or surrogates). */
static int utf8_ok(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        if (!k || i + k > n) return 0;
        unsigned long cp = k == 1 ? c : k == 2 ? (c & 0x1Fu) : k == 3 ? (c & 0x0Fu) : (c & 7u);
        for (size_t j = 1; j < k; j++) {
            if (((unsigned char)s[i + j] >> 6) != 2) return 0;
            cp = (cp << 6) | ((unsigned char)s[i + j] & 0x3Fu);
        }
        unsigned long min = k == 1 ? 0 : k == 2 ? 0x80 : k == 3 ? 0x800 : 0x10000;
        if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
        i += k;
    }
    return 1;
}

typedef struct {
    char reasoning[8192], content[8192];
    size_t nreasoning, ncontent;
    int content_events, unsplit, bad_delta, events_after_finish, finished;
    char names[8][64], args[8][512], ids[8][40];
    int call_index[8];
    int ncalls;
    char finish[32];
} collected;

static void on_event(void *ctx, const muse_reply_ev *ev)
{
    collected *c = ctx;
    if (c->finished) c->events_after_finish++;
    switch (ev->kind) {
    case MUSE_EV_REASONING:
    case MUSE_EV_CONTENT:
        if (ev->len == 0 || !utf8_ok(ev->text, ev->len)) c->bad_delta++;
        if (ev->kind == MUSE_EV_CONTENT) {
            if (ev->unsplit) c->unsplit++;
            c->content_events++;
            if (c->ncontent + ev->len < sizeof c->content) {
                memcpy(c->content + c->ncontent, ev->text, ev->len);
                c->ncontent += ev->len;
            }
        } else if (c->nreasoning + ev->len < sizeof c->reasoning) {
            memcpy(c->reasoning + c->nreasoning, ev->text, ev->len);
            c->nreasoning += ev->len;
        }
        break;
    case MUSE_EV_TOOL_CALL:
        if (c->ncalls < 8) {
            snprintf(c->names[c->ncalls], 64, "%s", ev->name);
            snprintf(c->args[c->ncalls], 512, "%s", ev->arguments);
            snprintf(c->ids[c->ncalls], 40, "%s", ev->call_id);
            c->call_index[c->ncalls] = ev->call_index;
        }
        c->ncalls++;
        break;
    case MUSE_EV_FINISH:
        snprintf(c->finish, sizeof c->finish, "%s", ev->finish_reason);
        c->finished = 1;
        break;
    }
}

static const char *const fns[] = {"weather.get", "math.add", "get_time"};

typedef struct {
    const char *const *stops;
    size_t nstops;
    int parallel;
    uint64_t seed;
} opts;

static muse_reply *make(collected *c, opts o)
{
    memset(c, 0, sizeof *c);
    static const int32_t eos[] = {CONFIG_EOS};
    muse_reply_config cfg = {0};
    muse_chat_ids_default(&cfg.ids);
    cfg.stop_ids = eos;
    cfg.nstop_ids = 1;
    cfg.function_names = fns;
    cfg.nfunction_names = 3;
    cfg.stop_strings = o.stops;
    cfg.nstop_strings = o.nstops;
    cfg.parallel_tool_calls = o.parallel;
    cfg.call_id_seed = o.seed ? o.seed : 42;
    cfg.token_bytes = token_bytes;
    cfg.emit = on_event;
    cfg.emit_ctx = c;
    muse_reply *r = NULL;
    muse_err e = {{0}};
    if (muse_reply_create(&cfg, &r, &e) != 0) diag("create failed: %s", e.msg);
    return r;
}

/* Script: text (greedy pieces, else bytes) with controls @bot@ @eos@ @eom@ @eot@ @start@ @msg@
 * @ceos@ (the config's eos). Returns the index of the first push that returned 1 (ids pushed
 * after it are still pushed), or -1. *npushed gets the number of ids. */
static int feed(muse_reply *r, const char *script, int *npushed)
{
    static const struct {
        const char *mark;
        int32_t id;
    } ctl[] = {{"@bot@", BOT},     {"@eos@", EOS}, {"@eom@", EOM},        {"@eot@", EOT},
               {"@start@", START}, {"@msg@", MSG}, {"@ceos@", CONFIG_EOS}};
    int first_stop = -1, n = 0;
    const char *p = script;
    while (*p) {
        int32_t id = -1;
        size_t adv = 0;
        for (size_t k = 0; k < sizeof ctl / sizeof ctl[0] && id < 0; k++)
            if (strncmp(p, ctl[k].mark, strlen(ctl[k].mark)) == 0) {
                id = ctl[k].id;
                adv = strlen(ctl[k].mark);
            }
        size_t best = 0;
        for (size_t k = 0; k < NPIECES && id < 0; k++) { /* longest piece */
            size_t len = strlen(pieces[k]);
            if (len > best && strncmp(p, pieces[k], len) == 0) {
                best = len;
                adv = len;
            }
        }
        for (size_t k = 0; k < NPIECES && id < 0 && best; k++)
            if (strlen(pieces[k]) == best && strncmp(p, pieces[k], best) == 0)
                id = 300 + (int32_t)k;
        if (id < 0) {
            id = (unsigned char)*p;
            adv = 1;
        }
        if (muse_reply_push(r, id) && first_stop < 0) first_stop = n;
        n++;
        p += adv;
    }
    if (npushed) *npushed = n;
    return first_stop;
}

static cJSON *args_of(collected *c, int k)
{
    return cJSON_Parse(c->args[k]);
}

static void test_reasoning_then_answer(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    int n;
    int stop = feed(r, " to=self@msg@Think.@eom@@start@assistant to=user@msg@Hello world@eot@", &n);
    is_str(c.finish, "stop", "answer: finish stop");
    is_int(stop, n - 1, "answer: push returns 1 at <|eot|>, not before");
    ok(c.nreasoning == 6 && memcmp(c.reasoning, "Think.", 6) == 0, "reasoning is 'Think.'");
    ok(c.ncontent == 11 && memcmp(c.content, "Hello world", 11) == 0, "content is 'Hello world'");
    is_int(c.unsplit, 0, "answer: no unsplit fallback");
    is_int(c.bad_delta, 0, "answer: every delta non-empty valid UTF-8");
    is_int(muse_reply_reasoning_tokens(r), 7, "reasoning tokens: 6 bytes + <|eom|>");
    is_int(muse_reply_push(r, 'x'), 1, "pushes after the end are ignored");
    is_int(c.events_after_finish, 0, "no events after FINISH");
    muse_reply_destroy(r);
}

static void test_header_split_over_tokens(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    int32_t ids[] = {300 /* " to" */, 301 /* "=" */, 'u', 's', 'e', 'r', MSG, 308 /* Hello */, EOT};
    int stopped_early = 0;
    for (size_t i = 0; i + 1 < sizeof ids / sizeof ids[0]; i++)
        stopped_early |= muse_reply_push(r, ids[i]);
    is_int(stopped_early, 0, "split header: no stop before <|eot|>");
    ok(c.ncontent == 5 && memcmp(c.content, "Hello", 5) == 0, "split header: content streamed");
    is_int(muse_reply_push(r, EOT), 1, "split header: <|eot|> stops");
    muse_reply_destroy(r);
}

static void test_tool_call(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    int n;
    int stop =
        feed(r,
             " to=weather.get@msg@<atem:function_calls>\n<atem:invoke name=\"weather.get\">\n"
             "<atem:parameter name=\"city\">Paris</atem:parameter>\n"
             "<atem:parameter name=\"days\">3</atem:parameter>\n"
             "</atem:invoke>\n</atem:function_calls>@eom@@start@tool weather.get@msg@x",
             &n);
    is_int(c.ncalls, 1, "tool call: one call");
    is_str(c.names[0], "weather.get", "tool call: name");
    is_str(c.args[0], "{\"city\":\"Paris\",\"days\":3}", "tool call: arguments, number as JSON");
    is_str(c.finish, "tool_calls", "tool call: finish tool_calls");
    ok(stop >= 0 && stop < n - 10, "tool call: generation stops at the end of the call message");
    is_int(c.ncontent, 0, "tool call: no content");
    ok(strncmp(c.ids[0], "call_", 5) == 0 && strlen(c.ids[0]) == 29, "call id: call_ + 24 chars");
    int alnum = 1;
    for (const char *q = c.ids[0] + 5; *q; q++)
        if (!((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || (*q >= '0' && *q <= '9')))
            alnum = 0;
    ok(alnum, "call id: letters and digits");
    muse_reply_destroy(r);
}

static const char PARALLEL_BLOCK[] =
    " to=weather.get@msg@<atem:function_calls>\n"
    "<atem:invoke name=\"weather.get\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n"
    "</atem:invoke>\n"
    "<atem:invoke name=\"math.add\">\n<atem:parameter name=\"a\">1.5</atem:parameter>\n"
    "<atem:parameter name=\"b\">[1,2]</atem:parameter>\n</atem:invoke>\n"
    "</atem:function_calls>@eom@";

static void test_parallel_invokes_and_ids(void)
{
    collected c, d;
    muse_reply *r = make(&c, (opts){.seed = 7});
    int stop = feed(r, PARALLEL_BLOCK, NULL);
    is_int(c.ncalls, 2, "parallel invokes in one block: two calls");
    is_str(c.names[1], "math.add", "second invoke's name");
    is_str(c.args[1], "{\"a\":1.5,\"b\":[1,2]}", "second invoke's arguments as JSON");
    ok(c.call_index[0] == 0 && c.call_index[1] == 1, "call indexes 0, 1");
    ok(strcmp(c.ids[0], c.ids[1]) != 0, "call ids differ within a reply");
    ok(stop >= 0, "parallel block + <|eom|> without parallel_tool_calls: stops");
    muse_reply_destroy(r);
    muse_reply *r2 = make(&d, (opts){.seed = 7});
    feed(r2, PARALLEL_BLOCK, NULL);
    is_str(d.ids[1], c.ids[1], "call ids are deterministic in the seed");
    muse_reply_reset(r2, 8);
    memset(&d, 0, sizeof d);
    feed(r2, PARALLEL_BLOCK, NULL);
    is_int(d.ncalls, 2, "reset: the parser parses a new turn");
    ok(strcmp(d.ids[0], c.ids[0]) != 0, "another seed gives other ids");
    muse_reply_destroy(r2);
}

static void test_several_call_messages(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){.parallel = 1});
    int n;
    int stop =
        feed(r,
             " to=get_time@msg@<atem:function_calls>\n<atem:invoke name=\"get_time\">\n"
             "</atem:invoke>\n</atem:function_calls>@eom@"
             "@start@assistant to=math.add@msg@<atem:function_calls>\n"
             "<atem:invoke name=\"math.add\">\n<atem:parameter name=\"a\">2</atem:parameter>\n"
             "</atem:invoke>\n</atem:function_calls>@eom@"
             "@start@tool get_time@msg@12:00@eot@",
             &n);
    is_int(c.ncalls, 2, "two call messages in one turn: two calls");
    is_str(c.args[0], "{}", "a call without parameters has arguments {}");
    is_str(c.names[1], "math.add", "second message's call");
    is_str(c.finish, "tool_calls", "several call messages: finish tool_calls");
    ok(stop >= 0 && stop < n - 5, "stops at the first header that is not another call");
    is_int(c.ncontent, 0, "the model's fake tool output is not emitted");
    muse_reply_destroy(r);

    r = make(&c, (opts){.parallel = 1});
    feed(r,
         " to=get_time@msg@<atem:invoke name=\"get_time\">\n</atem:invoke>@eom@"
         "@start@assistant to=user@msg@It is noon@eot@",
         NULL);
    is_int(c.ncalls, 1, "call without wrapper is accepted");
    is_int(c.ncontent, 0, "an answer after a call (without its result) is not emitted");
    is_str(c.finish, "tool_calls", "answer after call: finish tool_calls");
    muse_reply_destroy(r);
}

static void test_atem_values(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    feed(r,
         " to=math.add@msg@<atem:function_calls>\n<atem:invoke name=\"math.add\">\n"
         "<atem:parameter name=\"t\">true</atem:parameter>\n"
         "<atem:parameter name=\"o\">{\"k\": [1, null]}</atem:parameter>\n"
         "<atem:parameter name=\"s\"> two words </atem:parameter>\n"
         "<atem:parameter name=\"q\">\"quoted\"</atem:parameter>\n"
         "<atem:parameter name=\"m\">line1\n\"line2\"\n</atem:parameter>\n"
         "<atem:parameter name=\"u\">\xC3\xA9t\xC3\xA9</atem:parameter>\n"
         "</atem:invoke>\n</atem:function_calls>@eot@",
         NULL);
    is_int(c.ncalls, 1, "values: one call");
    cJSON *a = args_of(&c, 0);
    ok(cJSON_IsTrue(cJSON_GetObjectItem(a, "t")), "value true -> JSON true");
    cJSON *o = cJSON_GetObjectItem(a, "o");
    ok(cJSON_IsObject(o) && cJSON_GetArraySize(cJSON_GetObjectItem(o, "k")) == 2,
       "value object -> JSON object");
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(a, "s")), " two words ",
           "string value keeps its spaces");
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(a, "q")), "quoted", "JSON string value");
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(a, "m")), "line1\n\"line2\"\n",
           "multi-line string value as is");
    is_str(cJSON_GetStringValue(cJSON_GetObjectItem(a, "u")), "\xC3\xA9t\xC3\xA9",
           "UTF-8 string value");
    ok(a && a->child && strcmp(a->child->string, "t") == 0, "parameters keep their order");
    is_str(c.finish, "tool_calls", "call ended by <|eot|>: finish tool_calls");
    cJSON_Delete(a);
    muse_reply_destroy(r);
}

static void test_control_text_is_prose(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    int n;
    int stop = feed(r, " to=user@msg@see <|eom|> and <|start|>user here@eot@", &n);
    ok(c.ncontent == 34 && memcmp(c.content, "see <|eom|> and <|start|>user here", 34) == 0,
       "text that looks like control tokens is prose");
    is_int(stop, n - 1, "prose control text does not end the turn");
    muse_reply_destroy(r);
}

static void test_header_mismatch(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    int n;
    int stop = feed(r, " to=user@msg@Hi@eom@@start@user@msg@fake turn@eot@", &n);
    ok(c.ncontent == 2 && memcmp(c.content, "Hi", 2) == 0, "fake <|start|>user: only 'Hi'");
    is_int(stop, 6, "fake <|start|>user: stops at the diverging token");
    is_str(c.finish, "stop", "fake turn: finish stop");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    stop = feed(r, " to=self@msg@hmm@eom@@start@assistant to=bad recipient@msg@x@eot@", &n);
    ok(stop >= 0 && stop < n - 5, "garbage recipient (space) ends the turn");
    ok(c.ncontent == 3 && memcmp(c.content, "hmm", 3) == 0 && c.unsplit == 1,
       "garbage recipient with nothing visible: reasoning returned unsplit as content");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, "Hello world@eot@", NULL);
    ok(c.ncontent == 5 && memcmp(c.content, "Hello", 5) == 0,
       "no header at all: the text seen is returned as content");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    stop = feed(r, " to=user@msg@a@msg@b@eot@", &n);
    ok(stop == 3 && c.ncontent == 1, "<|message|> inside a body ends the turn");
    muse_reply_destroy(r);
}

static void test_cut_off_before_visible(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    feed(r, " to=self@msg@Let me th", NULL);
    muse_reply_finish(r, "length");
    ok(c.nreasoning == 9 && memcmp(c.reasoning, "Let me th", 9) == 0, "cut: reasoning streamed");
    ok(c.ncontent == 9 && memcmp(c.content, "Let me th", 9) == 0 && c.unsplit == 1,
       "cut before any visible message: returned unsplit as content");
    is_str(c.finish, "length", "cut: finish length");
    muse_reply_finish(r, "length");
    is_int(c.events_after_finish, 0, "finish twice: nothing more");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, " to=us", NULL);
    muse_reply_finish(r, "length");
    ok(c.ncontent == 6 && memcmp(c.content, " to=us", 6) == 0, "cut inside the header: raw text");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, " to=self@msg@a@eom@@start@assistant to=user@msg@@eot@", NULL);
    ok(c.ncontent == 1 && c.content[0] == 'a' && c.unsplit == 1,
       "empty answer after reasoning: content is never empty");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, "@eot@", NULL);
    ok(c.content_events == 0 && strcmp(c.finish, "stop") == 0, "empty turn: no content events");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, " to=user@msg@Hel", NULL);
    muse_reply_finish(r, "length");
    ok(c.ncontent == 3 && c.unsplit == 0, "cut during the answer: content as is, not repeated");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, " to=weather.get@msg@<atem:function_calls>\n<atem:inv", NULL);
    muse_reply_finish(r, "length");
    ok(c.ncalls == 0 && c.ncontent == 31, "cut inside a call: body returned as content");
    is_str(c.finish, "length", "cut inside a call: finish length");
    muse_reply_destroy(r);
}

static void test_stop_strings(void)
{
    static const char *const stops[] = {"END", "\xC3\xA9t\xC3\xA9!"};
    collected c;
    muse_reply *r = make(&c, (opts){.stops = stops, .nstops = 2});
    feed(r, " to=user@msg@abcEN", NULL);
    ok(c.ncontent == 3 && memcmp(c.content, "abc", 3) == 0, "stop prefix 'EN' held back");
    int stop = feed(r, "D more@eot@", NULL);
    ok(c.ncontent == 3, "stop spanning two tokens: stop text not emitted");
    is_int(stop, 0, "stop string: push returns 1 on the completing token");
    is_str(c.finish, "stop", "stop string: finish stop");
    muse_reply_destroy(r);

    r = make(&c, (opts){.stops = stops, .nstops = 2});
    feed(r, " to=user@msg@abcENX", NULL);
    ok(c.ncontent == 6 && memcmp(c.content, "abcENX", 6) == 0, "unfinished stop prefix released");
    feed(r, "\xC3\xA9t\xC3\xA9?@eot@", NULL); /* multi-byte token, prefix of a stop, then not */
    ok(c.ncontent == 12 && memcmp(c.content + 6, "\xC3\xA9t\xC3\xA9?", 6) == 0,
       "multi-byte stop prefix released");
    is_int(c.bad_delta, 0, "stop holds keep deltas valid UTF-8");
    muse_reply_destroy(r);

    r = make(&c, (opts){.stops = stops, .nstops = 2});
    feed(r, " to=self@msg@thinking END hidden", NULL);
    ok(c.nreasoning == 9 && memcmp(c.reasoning, "thinking ", 9) == 0, "stop string in reasoning");
    ok(c.ncontent == 9 && c.unsplit == 1, "stop before any answer: reasoning returned as content");
    muse_reply_destroy(r);

    muse_reply_config bad = {0};
    static const char *const long_stop[] = {""};
    bad.stop_strings = long_stop;
    bad.nstop_strings = 1;
    bad.token_bytes = token_bytes;
    bad.emit = on_event;
    muse_reply *x = NULL;
    muse_err e = {{0}};
    ok(muse_reply_create(&bad, &x, &e) == -1 && strstr(e.msg, "stop[0]"), "empty stop refused");
}

static void test_utf8(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    feed(r, " to=user@msg@a\xC3", NULL);
    ok(c.ncontent == 1, "incomplete UTF-8 held back");
    feed(r, "\xA9", NULL);
    ok(c.ncontent == 3 && memcmp(c.content, "a\xC3\xA9", 3) == 0, "completed char emitted");
    feed(r,
         "\xFF"
         "b\xE2\x82",
         NULL);
    ok(c.ncontent == 7 && memcmp(c.content + 3,
                                 "\xEF\xBF\xBD"
                                 "b",
                                 4) == 0,
       "invalid byte becomes U+FFFD");
    muse_reply_finish(r, "length");
    ok(c.ncontent == 10 && memcmp(c.content + 7, "\xEF\xBF\xBD", 3) == 0,
       "unfinished char flushed as U+FFFD");
    is_int(c.bad_delta, 0, "UTF-8: every delta valid");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, " to=user@msg@\xED\xA0\x80x\xF0\x9F\x98\x80@eot@", NULL); /* surrogate, then emoji */
    is_int(c.bad_delta, 0, "surrogate bytes replaced");
    ok(c.ncontent >= 5 && memcmp(c.content + c.ncontent - 5, "x\xF0\x9F\x98\x80", 5) == 0,
       "4-byte char kept");
    muse_reply_destroy(r);
}

static void test_malformed_tool_body(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    feed(r, " to=weather.get@msg@just words@eot@", NULL);
    ok(c.ncalls == 0 && c.ncontent == 10 && memcmp(c.content, "just words", 10) == 0,
       "tool body without <atem:invoke: content");
    is_str(c.finish, "stop", "malformed body: finish stop");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    static const char body[] = "<atem:function_calls>\n<atem:invoke name=\"nope\">\n"
                               "</atem:invoke>\n</atem:function_calls>";
    char script[512];
    snprintf(script, sizeof script, " to=nope@msg@%s@eom@@start@assistant to=user@msg@ok@eot@",
             body);
    int n;
    int stop = feed(r, script, &n);
    ok(c.ncalls == 0 && c.ncontent == strlen(body) + 2 &&
           memcmp(c.content, body, strlen(body)) == 0,
       "unknown function: body as content, and the turn goes on");
    is_int(stop, n - 1, "unknown function: no early stop");
    muse_reply_destroy(r);

    r = make(&c, (opts){0});
    feed(r, " to=math.add@msg@<atem:invoke name=\"math.add\">\n<atem:parameter name=\"a\">1@eot@",
         NULL);
    ok(c.ncalls == 0 && c.ncontent > 0, "unterminated parameter: content");
    muse_reply_destroy(r);
}

static void test_end_ids(void)
{
    collected c;
    muse_reply *r = make(&c, (opts){0});
    int n;
    int stop = feed(r, " to=user@msg@x@ceos@y", &n);
    ok(stop == 3 && c.ncontent == 1, "the config's eos id ends the turn");
    muse_reply_destroy(r);
    r = make(&c, (opts){0});
    stop = feed(r, " to=user@msg@x@eos@", &n);
    ok(stop == 3 && strcmp(c.finish, "stop") == 0, "<|end_of_text|> ends the turn");
    muse_reply_destroy(r);
    r = make(&c, (opts){0});
    feed(r, " to=self@msg@r@start@assistant to=user@msg@a@eot@", NULL);
    ok(c.nreasoning == 1 && c.ncontent == 1 && c.content[0] == 'a',
       "<|start|> without <|eom|> ends the message");
    muse_reply_destroy(r);
}

static void count_event(void *ctx, const muse_reply_ev *ev)
{
    *(size_t *)ctx += ev->len;
}

static void test_speed(void)
{
    static const char *const stops[] = {
        "STOP-STRING-ONE-XXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXXX", "zz", "qq", "##"};
    muse_reply_config cfg = {0};
    muse_chat_ids_default(&cfg.ids);
    cfg.stop_strings = stops;
    cfg.nstop_strings = 4;
    cfg.token_bytes = token_bytes;
    cfg.emit = count_event;
    size_t emitted = 0;
    cfg.emit_ctx = &emitted;
    muse_reply *r = NULL;
    muse_err e = {{0}};
    ok(muse_reply_create(&cfg, &r, &e) == 0, "speed: create");
    muse_reply_push(r, 300);
    muse_reply_push(r, 301);
    muse_reply_push(r, 'u');
    muse_reply_push(r, 's');
    muse_reply_push(r, 'e');
    muse_reply_push(r, 'r');
    muse_reply_push(r, MSG);
    const int N = 2000000;
    int32_t cycle[] = {308, 309, 'S', 'T', 'O', ' ', 321, 'z', ' ', '\n'};
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int stopped = 0;
    for (int i = 0; i < N; i++) stopped |= muse_reply_push(r, cycle[i % 10]);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    ok(!stopped && emitted > (size_t)N, "speed: a 2M-token answer streams through");
    diag("push: %.1f M tokens/s (%.0f ns/token) with 4 stop strings", N / s / 1e6, s * 1e9 / N);
    ok(s * 1e9 / N < 2000, "push costs under 2 us per token, flat in the reply length");
    muse_reply_destroy(r);
}

int main(void)
{
    for (int i = 0; i < 256; i++) single[i] = (uint8_t)i;
    test_reasoning_then_answer();
    test_header_split_over_tokens();
    test_tool_call();
    test_parallel_invokes_and_ids();
    test_several_call_messages();
    test_atem_values();
    test_control_text_is_prose();
    test_header_mismatch();
    test_cut_off_before_visible();
    test_stop_strings();
    test_utf8();
    test_malformed_tool_body();
    test_end_ids();
    test_speed();
    return done_testing();
}
