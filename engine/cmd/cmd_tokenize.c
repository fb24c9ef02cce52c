/* The tokenize / detokenize subcommands: ids comma-separated on one line <-> text. */
#include "cmd/cmd_tokenize.h"

#include <errno.h>

#include "base/flags.h"
#include "text/tokenizer.h"

#define EXIT_BAD_INPUT 2

typedef struct {
    const char *tokenizer, *text_file, *ids;
} cmd_flags;

/* Returns -1 when the flags are complete, else the exit code; `ids` picks detokenize's flags. */
static int parse_flags(int argc, char **argv, int ids, cmd_flags *f)
{
    const muse_flag table[] = {
        MUSE_FLAG_S("tokenizer", &f->tokenizer, "FILE", "the pack's tokenizer.json",
                    .required = true),
        ids ? (muse_flag)MUSE_FLAG_S("ids", &f->ids, "1,2,3", "the token ids", .def = "stdin")
            : (muse_flag)MUSE_FLAG_S("text-file", &f->text_file, "F", "the text", .def = "stdin"),
    };
    const muse_flags set = {
        .prog = ids ? "muse-engine detokenize" : "muse-engine tokenize",
        .about = ids ? "Prints the text of token ids (commas and/or white space between them).\n"
                     : "Prints the token ids of the text as 1,2,3.\n",
        .flags = table,
        .n = sizeof table / sizeof *table};
    return muse_flags_parse(&set, argc, argv);
}

static int read_stream(FILE *f, char **out, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = MUSE_MALLOC(cap);
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            char *grown = realloc(buf, cap);
            MUSE_CHECK(grown != NULL);
            buf = grown;
        }
    }
    if (ferror(f)) {
        free(buf);
        return -1;
    }
    buf[n] = '\0';
    *out = buf;
    *len = n;
    return 0;
}

static int load_tokenizer(const char *cmd, const char *path, muse_tokenizer **t)
{
    muse_err e;
    if (muse_tokenizer_load(path, t, &e) == 0) return 0;
    fprintf(stderr, "%s: --tokenizer: %s\n", cmd, e.msg); /* e names the file */
    return EXIT_BAD_INPUT;
}

static int read_text(const char *cmd, const char *path, char **text, size_t *len)
{
    FILE *f = path ? fopen(path, "rb") : stdin;
    if (!f) {
        fprintf(stderr, "%s: --text-file %s: cannot open: %s\n", cmd, path, strerror(errno));
        return EXIT_BAD_INPUT;
    }
    int rc = read_stream(f, text, len);
    if (path) fclose(f);
    if (rc) {
        fprintf(stderr, "%s: %s: read error\n", cmd, path ? path : "stdin");
        return EXIT_BAD_INPUT;
    }
    return 0;
}

static int print_ids(const int32_t *ids, size_t n)
{
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    putchar('\n');
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
}

int muse_cmd_tokenize(int argc, char **argv)
{
    cmd_flags f = {0};
    int rc = parse_flags(argc, argv, 0, &f);
    if (rc >= 0) return rc;
    muse_tokenizer *t;
    if ((rc = load_tokenizer(argv[0], f.tokenizer, &t))) return rc;
    char *text;
    size_t len;
    if ((rc = read_text(argv[0], f.text_file, &text, &len))) {
        muse_tokenizer_free(t);
        return rc;
    }
    int32_t *ids = NULL;
    size_t n = 0, cap = 0;
    muse_err e;
    if (muse_tokenize(t, text, len, &ids, &n, &cap, &e)) {
        fprintf(stderr, "%s: %s: %s\n", argv[0], f.text_file ? "--text-file" : "stdin", e.msg);
        rc = EXIT_BAD_INPUT;
    } else {
        rc = print_ids(ids, n);
    }
    free(ids);
    free(text);
    muse_tokenizer_free(t);
    return rc;
}

/* Parses ids separated by commas and/or whitespace. */
static int parse_ids(const char *cmd, const char *source, const char *s, int64_t vocab,
                     int32_t **ids, size_t *n)
{
    size_t cap = 64;
    *ids = MUSE_MALLOC(cap * sizeof **ids);
    *n = 0;
    for (;;) {
        while (*s == ',' || *s == ' ' || *s == '\t' || *s == '\n' || *s == '\r') s++;
        if (!*s) return 0;
        char *end;
        errno = 0;
        long long v = strtoll(s, &end, 10);
        if (end == s || errno || v < 0 || v >= vocab || (*end && !strchr(", \t\r\n", *end))) {
            size_t shown = strcspn(s, ", \t\r\n");
            fprintf(stderr, "%s: %s: '%.*s' is not a token id in [0, %lld)\n", cmd, source,
                    (int)(shown > 40 ? 40 : shown), s, (long long)vocab);
            free(*ids);
            *ids = NULL;
            return EXIT_BAD_INPUT;
        }
        if (*n == cap) {
            cap *= 2;
            int32_t *grown = realloc(*ids, cap * sizeof *grown);
            MUSE_CHECK(grown != NULL);
            *ids = grown;
        }
        (*ids)[(*n)++] = (int32_t)v;
        s = end;
    }
}

static int print_text(const char *cmd, const char *source, const muse_tokenizer *t,
                      const int32_t *ids, size_t n)
{
    size_t cap = 3 * (muse_tokenizer_max_token_bytes(t) + 3);
    char *out = MUSE_MALLOC(cap);
    muse_detok d = {0};
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        long got = muse_detok_push(t, &d, ids[i], out, cap);
        if (got < 0) {
            fprintf(stderr, "%s: %s: id %d is not in the tokenizer\n", cmd, source, ids[i]);
            rc = EXIT_BAD_INPUT;
        } else {
            fwrite(out, 1, (size_t)got, stdout);
        }
    }
    if (rc == 0) {
        long got = muse_detok_finish(&d, out, cap);
        fwrite(out, 1, (size_t)got, stdout);
        if (fflush(stdout) != 0 || ferror(stdout)) rc = 1;
    }
    free(out);
    return rc;
}

int muse_cmd_detokenize(int argc, char **argv)
{
    cmd_flags f = {0};
    int rc = parse_flags(argc, argv, 1, &f);
    if (rc >= 0) return rc;
    char *stdin_text = NULL;
    size_t stdin_len;
    if (!f.ids && read_stream(stdin, &stdin_text, &stdin_len)) {
        fprintf(stderr, "%s: stdin: read error\n", argv[0]);
        return EXIT_BAD_INPUT;
    }
    muse_tokenizer *t;
    if ((rc = load_tokenizer(argv[0], f.tokenizer, &t))) {
        free(stdin_text);
        return rc;
    }
    const char *source = f.ids ? "--ids" : "stdin";
    int32_t *ids;
    size_t n;
    rc = parse_ids(argv[0], source, f.ids ? f.ids : stdin_text, muse_tokenizer_vocab_size(t), &ids,
                   &n);
    if (rc == 0) rc = print_text(argv[0], source, t, ids, n);
    free(ids);
    free(stdin_text);
    muse_tokenizer_free(t);
    return rc;
}
