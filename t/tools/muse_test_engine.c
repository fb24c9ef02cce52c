/* A scripted engine for the transport tests: the real ring server, no model. Every request is
 * answered with a few OpenAI records; words in the last message (or prompt) pick the script:
 *   (default) role chunk, "Hello", " world", "!" --gap-ms apart, finish chunk, [usage], END
 *   CTX       400 context_length_exceeded before any byte
 *   ERRMID    two chunks, then an error record (the stream ends with data: {"error":...})
 *   ECHO      the content is the request body the engine received plus the cache scope
 *   HANG      never answers (until cancelled: the slot is freed on the worker's close)
 *   KEEPALIVE a keepalive comment record first
 * Usage: muse-test-engine --shm /name --socket path [--slots N] [--abi V] [--gid G]
 *        [--gap-ms MS] [--health ok|fatal] [--worker-key FILE]
 * Prints "ready" on stdout once serving; SIGTERM stops it cleanly. */
#include <cjson/cJSON.h>
#include <signal.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/flags.h"
#include "base/keyfile.h"
#include "serve/ring_server.h"

enum { S_DEFAULT, S_CTX, S_ERRMID, S_ECHO, S_HANG };

typedef struct {
    int used, script, step, keepalive;
    muse_slot_ref ref;
    uint32_t flags, kind;
    long long next_ms;
    char *echo; /* ECHO: JSON string of body + scope */
} stream;

static volatile sig_atomic_t stop_now;
static void on_term(int sig)
{
    (void)sig, stop_now = 1;
}

static long long now_ms(void)
{
    return (long long)muse_now_ms();
}

/* The text the script keys on: last message's content, or the prompt. */
static const char *request_text(cJSON *root)
{
    cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages"), *last = NULL, *c;
    cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsString(prompt)) return prompt->valuestring;
    for (c = msgs ? msgs->child : NULL; c; c = c->next) last = c;
    c = last ? cJSON_GetObjectItemCaseSensitive(last, "content") : NULL;
    if (cJSON_IsString(c)) return c->valuestring;
    if (cJSON_IsArray(c) && c->child) {
        cJSON *t = cJSON_GetObjectItemCaseSensitive(c->child, "text");
        if (cJSON_IsString(t)) return t->valuestring;
    }
    return "";
}

static void start_stream(muse_server *server, stream *st, const muse_request *rq)
{
    cJSON *root = cJSON_Parse(rq->body);
    const char *text = root ? request_text(root) : "";
    memset(st, 0, sizeof *st);
    st->used = 1;
    st->ref = rq->ref;
    st->flags = rq->flags;
    st->kind = rq->kind;
    st->script = strstr(text, "CTX")      ? S_CTX
                 : strstr(text, "ERRMID") ? S_ERRMID
                 : strstr(text, "ECHO")   ? S_ECHO
                 : strstr(text, "HANG")   ? S_HANG
                                          : S_DEFAULT;
    st->keepalive = strstr(text, "KEEPALIVE") != NULL;
    if (st->script == S_ECHO) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "body", rq->body);
        /* the scope arrives as a keyed digest: echo it and the key, in hex, for the test */
        char scope[2 * MUSE_RING_MAX_SCOPE + 1], key[2 * MUSE_SCOPE_KEY_BYTES + 1];
        for (size_t i = 0; i < rq->scope_len && i < MUSE_RING_MAX_SCOPE; i++)
            snprintf(scope + 2 * i, 3, "%02x", (unsigned)(uint8_t)rq->scope[i]);
        scope[2 * (rq->scope_len < MUSE_RING_MAX_SCOPE ? rq->scope_len : MUSE_RING_MAX_SCOPE)] = 0;
        for (size_t i = 0; i < MUSE_SCOPE_KEY_BYTES; i++)
            snprintf(key + 2 * i, 3, "%02x", (unsigned)muse_server_scope_key(server)[i]);
        cJSON_AddStringToObject(o, "scope", scope);
        cJSON_AddStringToObject(o, "scope_key", key);
        char *s = cJSON_PrintUnformatted(o);
        cJSON *str = cJSON_CreateString(s);
        st->echo = cJSON_PrintUnformatted(str); /* a JSON string literal */
        cJSON_free(s);
        cJSON_Delete(str);
        cJSON_Delete(o);
    }
    cJSON_Delete(root);
    st->next_ms = now_ms();
}

/* One step of the script; returns 1 when the stream is complete. */
static int step_stream(muse_server *s, stream *st, int gap_ms)
{
    char buf[65536];
    int stream_mode = (st->flags & MUSE_REQ_STREAM) != 0, rc = 0, n;
    const char *obj = st->kind == MUSE_KIND_CHAT ? "chat.completion" : "text_completion";
    static const char *words[] = {"Hello", " world", "!"};
    if (st->script == S_HANG) return 0;
    if (st->script == S_CTX) {
        n = snprintf(buf, sizeof buf,
                     "{\"error\":{\"message\":\"This model's maximum context length is 128 "
                     "tokens. However, you requested 129 tokens.\",\"type\":"
                     "\"invalid_request_error\",\"param\":\"messages\",\"code\":"
                     "\"context_length_exceeded\"}}");
        return muse_server_emit(s, st->ref, MUSE_EV_ERROR, 400, buf, (size_t)n) != 1;
    }
    if (st->keepalive) {
        rc = muse_server_emit(s, st->ref, MUSE_EV_KEEPALIVE, 0, NULL, 0);
        if (rc == 0) st->keepalive = 0;
        return rc < 0;
    }
    if (!stream_mode) {
        if (st->script == S_ECHO)
            n = snprintf(buf, sizeof buf,
                         "{\"id\":\"t\",\"object\":\"%s\",\"model\":\"muse-spark\",\"choices\":"
                         "[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":%s},"
                         "\"finish_reason\":\"stop\"}]}",
                         obj, st->echo);
        else
            n = snprintf(buf, sizeof buf,
                         "{\"id\":\"t\",\"object\":\"%s\",\"model\":\"muse-spark\",\"choices\":"
                         "[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":"
                         "\"Hello world!\"},\"finish_reason\":\"stop\"}],\"usage\":"
                         "{\"prompt_tokens\":3,\"completion_tokens\":3,\"total_tokens\":6}}",
                         obj);
        return muse_server_emit(s, st->ref, MUSE_EV_BODY, 0, buf, (size_t)n) != 1;
    }
    /* streaming: step 0 role, 1..3 words, 4 finish, 5 usage */
    if (st->step == 0) {
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"t\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":"
                     "0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}");
    } else if (st->step <= 3) {
        if (st->script == S_ERRMID && st->step == 3) {
            n = snprintf(buf, sizeof buf,
                         "{\"error\":{\"message\":\"the engine failed during decoding\","
                         "\"type\":\"server_error\",\"param\":null,\"code\":\"engine_error\"}}");
            rc = muse_server_emit(s, st->ref, MUSE_EV_ERROR, 500, buf, (size_t)n);
            return rc != 1;
        }
        const char *w = st->script == S_ECHO && st->step == 1 ? NULL : words[st->step - 1];
        if (w)
            n = snprintf(buf, sizeof buf,
                         "{\"id\":\"t\",\"object\":\"chat.completion.chunk\",\"choices\":[{"
                         "\"index\":0,\"delta\":{\"content\":\"%s\"}}]}",
                         w);
        else
            n = snprintf(buf, sizeof buf,
                         "{\"id\":\"t\",\"object\":\"chat.completion.chunk\",\"choices\":[{"
                         "\"index\":0,\"delta\":{\"content\":%s}}]}",
                         st->echo);
    } else if (st->step == 4) {
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"t\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":"
                     "0,\"delta\":{},\"finish_reason\":\"stop\"}],\"muse\":{\"token_sha\":"
                     "\"00\"}}");
    } else if (st->step == 5 && (st->flags & MUSE_REQ_INCLUDE_USAGE)) {
        n = snprintf(buf, sizeof buf,
                     "{\"id\":\"t\",\"object\":\"chat.completion.chunk\",\"choices\":[],"
                     "\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":3,\"total_tokens\":"
                     "6}}");
    } else {
        return 1;
    }
    rc = muse_server_emit(s, st->ref, MUSE_EV_DATA, 0, buf, (size_t)n);
    if (rc < 0) return 1;
    if (rc == 0) {
        st->step++;
        st->next_ms = now_ms() + (st->step >= 1 && st->step <= 4 ? gap_ms : 0);
    }
    return 0;
}

/* streams.slots_busy: shared-memory slots not yet FREE (tests wait for 0 after a cancel) */
static void publish_health(muse_server *s, const char *status, int running, int slots)
{
    char buf[1024];
    int n =
        snprintf(buf, sizeof buf,
                 "{\"status\":\"%s\",\"model\":\"muse-spark\",\"engine\":{\"pid\":%d,"
                 "\"version\":\"test\",\"uptime_s\":1},\"streams\":{\"running\":%d,"
                 "\"queued\":0,\"max\":%d,\"slots_busy\":%d},\"context_length\":128,\"counters\":{"
                 "\"requests\":0,\"tokens_in\":0,\"tokens_out\":0,\"errors\":0,"
                 "\"cancelled\":0}}",
                 status, (int)getpid(), running, slots, muse_server_busy_slots(s));
    muse_server_set_health(s, buf, (size_t)n);
}

int main(int argc, char **argv)
{
    muse_server_opts o = {.shm_name = "/muse-test",
                          .socket_path = "/tmp/muse-test.sock",
                          .slots = 4,
                          .socket_gid = -1};
    static const char *const healths[] = {"ok", "fatal", NULL};
    int health_i = 0, gap_ms = 100, abi = 0;
    const char *key_file = NULL;
    const muse_flag table[] = {
        MUSE_FLAG_S("shm", &o.shm_name, "NAME", "the shared-memory segment"),
        MUSE_FLAG_S("socket", &o.socket_path, "PATH", "the doorbell socket"),
        MUSE_FLAG_I("slots", &o.slots, 1, 4096, "N", "request slots"),
        MUSE_FLAG_I("abi", &abi, 0, 1 << 30, "V", "the ABI version the segment claims",
                    .def = "this build's"),
        MUSE_FLAG_I("gid", &o.socket_gid, -1, 1 << 30, "G",
                    "the socket's group; -1: the process's"),
        MUSE_FLAG_I("gap-ms", &gap_ms, 0, 60000, "MS", "between two chunks of an answer"),
        MUSE_FLAG_E("health", &health_i, healths, "the state /health and the segment show"),
        MUSE_FLAG_S("worker-key", &key_file, "FILE",
                    "the key a peer must prove it holds before it gets the segment"),
    };
    const muse_flags set = {.prog = "muse-test-engine",
                            .about = "A scripted engine for the transport tests: the real ring "
                                     "server, no model.\n",
                            .flags = table,
                            .n = sizeof table / sizeof *table};
    int rc = muse_flags_parse(&set, argc, argv);
    if (rc != MUSE_FLAGS_RUN) return rc;
    o.abi_version = (uint32_t)abi;
    uint8_t key[MUSE_KEY_MAX_BYTES];
    char kerr[512];
    if (key_file) {
        if (muse_key_file_read(key_file, geteuid(), key, &o.worker_key_len, kerr, sizeof kerr)) {
            fprintf(stderr, "muse-test-engine: --worker-key: %s\n", kerr);
            return 2;
        }
        o.worker_key = key;
    }
    const char *health = healths[health_i];
    muse_server *s;
    muse_err e = {{0}};
    if (muse_server_start(&o, &s, &e) != 0) {
        fprintf(stderr, "muse-test-engine: %s\n", e.msg);
        return 1;
    }
    signal(SIGTERM, on_term);
    signal(SIGINT, on_term);
    signal(SIGPIPE, SIG_IGN);
    stream *streams = calloc((size_t)o.slots, sizeof *streams);
    publish_health(s, health, 0, o.slots);
    muse_server_set_state(s, strcmp(health, "fatal") ? MUSE_ENGINE_SERVING : MUSE_ENGINE_FATAL);
    printf("ready\n");
    fflush(stdout);
    long long last_health = 0;
    while (!stop_now) {
        muse_request rq;
        int running = 0;
        muse_server_wait(s, 5);
        while (muse_server_next_request(s, &rq) == 1) {
            for (int i = 0; i < o.slots; i++)
                if (!streams[i].used) {
                    start_stream(s, &streams[i], &rq);
                    break;
                }
        }
        for (int i = 0; i < o.slots; i++) {
            stream *st = &streams[i];
            if (!st->used) continue;
            running++;
            int done = muse_server_is_cancelled(s, st->ref);
            if (!done && now_ms() >= st->next_ms) done = step_stream(s, st, gap_ms);
            if (done) {
                muse_server_finish(s, st->ref);
                free(st->echo);
                st->used = 0;
            }
        }
        if (now_ms() - last_health >= 200) {
            publish_health(s, health, running, o.slots);
            last_health = now_ms();
        }
    }
    muse_server_stop(s);
    free(streams);
    return 0;
}
