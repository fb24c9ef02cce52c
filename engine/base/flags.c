/* The table-driven flag parser every command uses (see flags.h), and the value parsers it shares
 * with commands that read lists. */
#include "base/flags.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>

#define MAX_FLAGS  128 /* a table's entries; a command has a few dozen at most */
#define HELP_COL   24  /* width of the "--name META" column in help */
#define HELP_WIDTH 99  /* a help line's most characters */

static FILE *err_of(const muse_flags *set)
{
    return set->err ? set->err : stderr;
}

int muse_flags_error(const muse_flags *set, const char *fmt, ...)
{
    FILE *f = err_of(set);
    va_list ap;
    va_start(ap, fmt);
    fprintf(f, "%s: ", set->prog);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fprintf(f, " (see %s --help)\n", set->prog);
    return 2;
}

/* The value as errors show it: quoted when empty, cut when long. */
static const char *shown(const char *text, char *buf, size_t len)
{
    if (!*text) return "''";
    snprintf(buf, len, "%.40s%s", text, strlen(text) > 40 ? "..." : "");
    return buf;
}

int muse_parse_int(const char *flag, const char *text, long long lo, long long hi, long long *out,
                   muse_err *e)
{
    char *end = NULL, buf[64];
    errno = 0;
    long long v = *text && !isspace((unsigned char)*text) ? strtoll(text, &end, 10) : 0;
    if (!end || *end || errno || v < lo || v > hi)
        return muse_fail(e, "%s %s: must be an integer in %lld .. %lld", flag,
                         shown(text, buf, sizeof buf), lo, hi);
    *out = v;
    return 0;
}

static int parse_number(const char *flag, const char *text, double lo, double hi, bool gib,
                        double *out, muse_err *e)
{
    char *end = NULL, buf[64];
    errno = 0;
    double v = *text && !isspace((unsigned char)*text) ? strtod(text, &end) : NAN;
    if (!end || *end || errno || !isfinite(v) || !(v >= lo && v <= hi))
        return gib ? muse_fail(e, "%s %s: must be a size in GiB, 0 .. %g", flag,
                               shown(text, buf, sizeof buf), hi)
                   : muse_fail(e, "%s %s: must be a number in %g .. %g", flag,
                               shown(text, buf, sizeof buf), lo, hi);
    *out = v;
    return 0;
}

int muse_parse_ids(const char *flag, const char *text, int32_t **ids, size_t *n, muse_err *e)
{
    if (!text || !*text)
        return muse_fail(e, "%s is empty: give token ids as a comma-separated list, e.g. %s 1,2,3",
                         flag, flag);
    size_t cap = 1;
    for (const char *p = text; *p; p++) cap += *p == ',';
    int32_t *v = MUSE_MALLOC(cap * sizeof *v);
    size_t count = 0;
    const char *p = text;
    for (;;) {
        char *end = NULL;
        errno = 0;
        long long x = (*p >= '0' && *p <= '9') ? strtoll(p, &end, 10) : -1;
        if (x < 0 || errno || x > INT32_MAX || (*end != ',' && *end != 0)) {
            free(v);
            return muse_fail(
                e, "%s: entry %zu is not a token id (a non-negative integer); fix the list", flag,
                count + 1);
        }
        v[count++] = (int32_t)x;
        if (*end == 0) break;
        p = end + 1;
    }
    *ids = v;
    *n = count;
    return 0;
}

static const muse_flag *find(const muse_flags *set, const char *name, size_t len)
{
    for (size_t i = 0; i < set->n; i++)
        if (strlen(set->flags[i].name) == len && strncmp(set->flags[i].name, name, len) == 0)
            return &set->flags[i];
    return NULL;
}

static bool takes_value(const muse_flag *f)
{
    return f->kind != MUSE_FLAG_BOOL;
}

static bool is_help(const char *arg)
{
    return strcmp(arg, "--help") == 0 || strcmp(arg, "-h") == 0;
}

/* ENUM's names as "a|b|c" (or the given meta) into buf. */
static const char *meta_of(const muse_flag *f, char *buf, size_t len)
{
    if (f->meta || f->kind != MUSE_FLAG_ENUM) return f->meta ? f->meta : "";
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; f->names[i] && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, "%s%s", i ? "|" : "", f->names[i]);
    return buf;
}

/* Checks and stores one value; the message names the flag, the value and what is accepted. */
static int store(const muse_flag *f, const char *text, muse_err *e)
{
    char flag[80], buf[256];
    snprintf(flag, sizeof flag, "--%s", f->name);
    long long v = 0;
    double d = 0;
    switch (f->kind) {
    case MUSE_FLAG_BOOL:
        *f->b = true;
        return 0;
    case MUSE_FLAG_INT:
    case MUSE_FLAG_INT64:
        if (muse_parse_int(flag, text, f->lo, f->hi, &v, e)) return -1;
        if (f->kind == MUSE_FLAG_INT)
            *f->i = (int)v;
        else
            *f->l = v;
        return 0;
    case MUSE_FLAG_DOUBLE:
    case MUSE_FLAG_GIB:
        if (parse_number(flag, text, f->kind == MUSE_FLAG_GIB ? 0 : f->dlo, f->dhi,
                         f->kind == MUSE_FLAG_GIB, &d, e))
            return -1;
        *f->d = d;
        return 0;
    case MUSE_FLAG_STRING:
        *f->s = text;
        return 0;
    case MUSE_FLAG_ENUM:
        for (int i = 0; f->names[i]; i++)
            if (strcmp(text, f->names[i]) == 0) {
                *f->i = i;
                return 0;
            }
        {
            char names[256];
            size_t at = 0;
            names[0] = 0;
            for (int i = 0; f->names[i] && at < sizeof names; i++)
                at += (size_t)snprintf(names + at, sizeof names - at, "%s%s",
                                       !i                ? ""
                                       : f->names[i + 1] ? ", "
                                                         : " or ",
                                       f->names[i]);
            return muse_fail(e, "%s %s: must be %s", flag, shown(text, buf, sizeof buf), names);
        }
    case MUSE_FLAG_LIST:
        if (*f->count >= f->hi) return muse_fail(e, "%s: at most %lld times", flag, f->hi);
        f->s[(*f->count)++] = text;
        return 0;
    }
    return muse_fail(e, "%s: unknown flag kind", flag);
}

/* --help wins wherever it stands, and shows the defaults before any flag changed them. */
static bool wants_help(const muse_flags *set, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (is_help(arg)) return true;
        if (strncmp(arg, "--", 2) != 0 || strchr(arg, '=')) continue;
        const muse_flag *f = find(set, arg + 2, strlen(arg + 2));
        if (f && takes_value(f) && i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) i++;
    }
    return false;
}

int muse_flags_parse(const muse_flags *set, int argc, char **argv)
{
    MUSE_CHECK(set->n <= MAX_FLAGS);
    if (wants_help(set, argc, argv)) {
        muse_flags_help(set, set->out ? set->out : stdout);
        return 0;
    }
    bool seen[MAX_FLAGS] = {0};
    char buf[64], mb[256];
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (strncmp(arg, "--", 2) != 0 || !arg[2])
            return muse_flags_error(set, "unexpected argument %s", shown(arg, buf, sizeof buf));
        const char *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg - 2) : strlen(arg + 2);
        const muse_flag *f = find(set, arg + 2, len);
        if (!f)
            return muse_flags_error(set, "unknown flag --%.*s", (int)(len > 60 ? 60 : len),
                                    arg + 2);
        const char *value = NULL;
        if (!takes_value(f)) {
            if (eq) return muse_flags_error(set, "--%s takes no value", f->name);
        } else if (eq) {
            value = eq + 1;
        } else if (i + 1 < argc && strncmp(argv[i + 1], "--", 2) != 0) {
            value = argv[++i];
        } else {
            return muse_flags_error(set, "--%s needs a value: %s", f->name,
                                    meta_of(f, mb, sizeof mb));
        }
        muse_err e = {{0}};
        if (store(f, value, &e)) return muse_flags_error(set, "%s", e.msg);
        seen[f - set->flags] = true;
    }
    for (size_t i = 0; i < set->n; i++)
        if (set->flags[i].required && !seen[i])
            return muse_flags_error(set, "--%s %s is required", set->flags[i].name,
                                    meta_of(&set->flags[i], mb, sizeof mb));
    return MUSE_FLAGS_RUN;
}

/* "(1 .. 4096, default 4)" from the bounds and the value the variable holds now. */
static void note_of(const muse_flag *f, char *buf, size_t len)
{
    char range[96] = "", def[96] = "";
    if (f->kind == MUSE_FLAG_INT || f->kind == MUSE_FLAG_INT64)
        snprintf(range, sizeof range, "%lld .. %lld", f->lo, f->hi);
    else if (f->kind == MUSE_FLAG_DOUBLE)
        snprintf(range, sizeof range, "%g .. %g", f->dlo, f->dhi);
    else if (f->kind == MUSE_FLAG_LIST)
        snprintf(range, sizeof range, "up to %lld times", f->hi);
    if (f->required)
        def[0] = 0; /* a required flag has no default */
    else if (f->def)
        snprintf(def, sizeof def, "%s", f->def);
    else if (f->kind == MUSE_FLAG_INT)
        snprintf(def, sizeof def, "%d", *f->i);
    else if (f->kind == MUSE_FLAG_INT64)
        snprintf(def, sizeof def, "%lld", *f->l);
    else if (f->kind == MUSE_FLAG_DOUBLE || f->kind == MUSE_FLAG_GIB)
        snprintf(def, sizeof def, "%g", *f->d);
    else if (f->kind == MUSE_FLAG_STRING && *f->s)
        snprintf(def, sizeof def, "%s", *f->s);
    else if (f->kind == MUSE_FLAG_ENUM)
        snprintf(def, sizeof def, "%s", f->names[*f->i]);
    const char *parts[3] = {f->required ? "required" : "", range, def};
    size_t at = 0;
    buf[0] = 0;
    for (int i = 0; i < 3; i++)
        if (parts[i][0] && at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s%s%s", at ? ", " : " (",
                                   i == 2 ? "default " : "", parts[i]);
    if (at && at < len) snprintf(buf + at, len - at, ")");
}

static void entry(FILE *out, const char *left, const char *help, const char *note)
{
    int w = fprintf(out, "  %s", left);
    if (w > HELP_COL + 1) {
        fprintf(out, "\n");
        w = 0;
    }
    fprintf(out, "%*s", HELP_COL + 2 - w, "");
    int col = HELP_COL + 2;
    for (const char *p = help; *p; p++) {
        fputc(*p, out);
        col++;
        if (*p == '\n' && p[1]) col = fprintf(out, "%*s", HELP_COL + 2, "");
    }
    if (*note && col + (int)strlen(note) > HELP_WIDTH) /* the note goes on a line of its own */
        fprintf(out, "\n%*s%s\n", HELP_COL + 2, "", note + 1);
    else
        fprintf(out, "%s\n", note);
}

void muse_flags_help(const muse_flags *set, FILE *out)
{
    char mb[256], left[256], note[256];
    fprintf(out, "usage: %s", set->prog);
    if (set->usage) {
        fprintf(out, " %s\n", set->usage);
    } else {
        for (size_t i = 0; i < set->n; i++)
            if (set->flags[i].required)
                fprintf(out, " --%s %s", set->flags[i].name,
                        meta_of(&set->flags[i], mb, sizeof mb));
        fprintf(out, " [flags]\n");
    }
    if (set->about) fprintf(out, "%s", set->about);
    fprintf(out, "\nflags:\n");
    for (size_t i = 0; i < set->n; i++) {
        const muse_flag *f = &set->flags[i];
        const char *meta = meta_of(f, mb, sizeof mb);
        snprintf(left, sizeof left, "--%s%s%s", f->name, meta[0] ? " " : "", meta);
        note_of(f, note, sizeof note);
        entry(out, left, f->help ? f->help : "", note);
    }
    entry(out, "--help", "print this help", "");
}

static void list_commands(const char *prog, const char *about, const muse_subcommand *cmds,
                          size_t n, FILE *f)
{
    if (about) fprintf(f, "%s\n", about);
    fprintf(f, "usage: %s COMMAND [--help | flags]\n\ncommands:\n", prog);
    for (size_t i = 0; i < n; i++) fprintf(f, "  %-13s %s\n", cmds[i].name, cmds[i].what);
    fprintf(f, "\n%s COMMAND --help lists the command's flags. Bad input exits with code 2.\n",
            prog);
}

int muse_subcommand_run(const char *prog, const char *about, const char *version,
                        const muse_subcommand *cmds, size_t n, int argc, char **argv)
{
    if (argc < 2) {
        list_commands(prog, about, cmds, n, stderr);
        return 2;
    }
    if (is_help(argv[1])) {
        list_commands(prog, about, cmds, n, stdout);
        return 0;
    }
    if (version && strcmp(argv[1], "--version") == 0) {
        printf("%s %s\n", prog, version);
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (strcmp(argv[1], cmds[i].name) == 0) return cmds[i].run(argc - 1, argv + 1);
    fprintf(stderr, "%s: unknown command '%.60s'\n\n", prog, argv[1]);
    list_commands(prog, about, cmds, n, stderr);
    return 2;
}
