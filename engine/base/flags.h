/* One flag parser for every command: a table of flags (name, kind, bounds, default, help) that
 * parses --flag value and --flag=value, prints --help, and words every error the same way. */
#ifndef MUSE_FLAGS_H
#define MUSE_FLAGS_H

#include <stdbool.h>
#include <stdint.h>

#include "base/muse_common.h"

typedef enum {
    MUSE_FLAG_BOOL,   /* takes no value: sets *b to true */
    MUSE_FLAG_INT,    /* an integer in [lo, hi] into *i */
    MUSE_FLAG_INT64,  /* an integer in [lo, hi] into *l */
    MUSE_FLAG_DOUBLE, /* a finite number in [dlo, dhi] into *d */
    MUSE_FLAG_GIB,    /* a size in GiB (a number in [0, dhi]) into *d; muse_gib_bytes() converts */
    MUSE_FLAG_STRING, /* any text into *s */
    MUSE_FLAG_ENUM,   /* one of names[] (NULL-terminated): its index into *i */
    MUSE_FLAG_LIST,   /* repeatable text: s[(*count)++], at most hi times */
} muse_flag_kind;

typedef struct {
    const char *name; /* "streams" for --streams */
    muse_flag_kind kind;
    union {
        bool *b;
        int *i;
        long long *l;
        double *d;
        const char **s;
    };
    long long lo, hi;         /* INT, INT64 bounds; LIST: the most times */
    double dlo, dhi;          /* DOUBLE bounds; GIB: the largest size */
    const char *const *names; /* ENUM */
    int *count;               /* LIST: entries so far */
    const char *meta;         /* the value in help and errors: N, DIR (ENUM: a|b|c by default) */
    const char *help;         /* lines may continue after '\n' */
    const char *def;          /* the default as help shows it; NULL: the value before parsing;
                               * "": none shown */
    bool required;            /* absent: "--NAME META is required" */
} muse_flag;

/* Table entries, so a command's table reads one flag a line. */
#define MUSE_FLAG_B(n, p, h, ...)                                                                  \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_BOOL, .b = (p), .help = h, __VA_ARGS__                        \
    }
#define MUSE_FLAG_I(n, p, min, max, m, h, ...)                                                     \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_INT, .i = (p), .lo = min, .hi = max, .meta = m, .help = h,    \
        __VA_ARGS__                                                                                \
    }
#define MUSE_FLAG_L(n, p, min, max, m, h, ...)                                                     \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_INT64, .l = (p), .lo = min, .hi = max, .meta = m, .help = h,  \
        __VA_ARGS__                                                                                \
    }
#define MUSE_FLAG_D(n, p, min, max, m, h, ...)                                                     \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_DOUBLE, .d = (p), .dlo = min, .dhi = max, .meta = m,          \
        .help = h, __VA_ARGS__                                                                     \
    }
#define MUSE_FLAG_G(n, p, max, h, ...)                                                             \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_GIB, .d = (p), .dhi = max, .meta = "GIB", .help = h,          \
        __VA_ARGS__                                                                                \
    }
#define MUSE_FLAG_S(n, p, m, h, ...)                                                               \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_STRING, .s = (p), .meta = m, .help = h, __VA_ARGS__           \
    }
#define MUSE_FLAG_E(n, p, list, h, ...)                                                            \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_ENUM, .i = (p), .names = list, .help = h, __VA_ARGS__         \
    }
#define MUSE_FLAG_R(n, p, cnt, most, m, h, ...)                                                    \
    {                                                                                              \
        .name = n, .kind = MUSE_FLAG_LIST, .s = (p), .count = (cnt), .hi = most, .meta = m,        \
        .help = h, __VA_ARGS__                                                                     \
    }

/* A command's flags. */
typedef struct {
    const char *prog;  /* "muse-engine serve": starts every error and the usage line */
    const char *usage; /* after "usage: PROG "; NULL: the required flags, then [flags] */
    const char *about; /* what the command does, printed after the usage line */
    const muse_flag *flags;
    size_t n;
    FILE *out, *err; /* NULL: stdout (help), stderr (errors) */
} muse_flags;

/* muse_flags_parse's answer when the command should run; otherwise it returns the exit code. */
#define MUSE_FLAGS_RUN (-1)

/* Parses argv[1..argc) (argv[0] is the command) into the table's variables, which hold the
 * defaults on entry. Returns MUSE_FLAGS_RUN; 0 after printing --help (or -h); 2 after printing
 * an error that names the flag, the value and what is accepted. */
int muse_flags_parse(const muse_flags *set, int argc, char **argv);

/* Prints the help: the usage line, the about text, one entry a flag. */
void muse_flags_help(const muse_flags *set, FILE *f);

/* Prints "PROG: MESSAGE (see PROG --help)" and returns 2: the one way a command refuses input. */
MUSE_PRINTF(2, 3) int muse_flags_error(const muse_flags *set, const char *fmt, ...);

/* A command of a program made of several (muse-engine serve, muse-bench decode). */
typedef struct {
    const char *name;
    int (*run)(int argc, char **argv); /* argv[0] is the command's name */
    const char *what;
} muse_subcommand;

/* Runs the command argv[1] names with the rest of argv; --help (or -h) lists the commands,
 * --version prints version when given. Returns the exit code (2 for no or an unknown command). */
int muse_subcommand_run(const char *prog, const char *about, const char *version,
                        const muse_subcommand *cmds, size_t n, int argc, char **argv);

/* One integer in [lo, hi], the whole text: for the entries of a list flag ("1,2,4"). Errors
 * read "FLAG TEXT: must be an integer in LO .. HI". */
int muse_parse_int(const char *flag, const char *text, long long lo, long long hi, long long *out,
                   muse_err *e);

/* Parses "1,2,3" (no spaces, no empty entries) into a malloc'd array. Errors name the flag
 * and the position of the bad entry. */
int muse_parse_ids(const char *flag, const char *text, int32_t **ids, size_t *n, muse_err *e);

/* GiB as a GIB flag holds them, in bytes. */
static inline uint64_t muse_gib_bytes(double gib)
{
    return (uint64_t)(gib * 1073741824.0);
}

#endif
