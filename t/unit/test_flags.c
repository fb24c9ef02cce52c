/* The flag parser: every kind, bounds, bad values, unknown flags, missing values, --flag=value
 * and --flag value, required flags, and the --help text printed from the table. */
#include "base/flags.h"
#include "tap.h"

typedef struct {
    bool verbose;
    int n;
    long long big;
    double ratio, gib;
    const char *name;
    int color;
    const char *dirs[3];
    int ndirs;
} vars;

static const char *const colors[] = {"red", "green", "blue", NULL};

static char out_text[8192], err_text[8192];

/* Parses argv (NULL-terminated, after the command) into v, which starts at the defaults;
 * the help and error text land in out_text and err_text. */
static int parse(vars *v, bool name_required, const char *const *args)
{
    *v = (vars){.n = 4, .big = 1LL << 40, .ratio = 0.5, .gib = 1, .name = "x", .color = 1};
    const muse_flag table[] = {
        MUSE_FLAG_B("verbose", &v->verbose, "say more"),
        MUSE_FLAG_I("n", &v->n, 1, 256, "N", "how many"),
        MUSE_FLAG_L("big", &v->big, -5, 1LL << 50, "B", "a large one"),
        MUSE_FLAG_D("ratio", &v->ratio, 0, 1, "R", "a fraction"),
        MUSE_FLAG_G("gib", &v->gib, 64, "a budget"),
        MUSE_FLAG_S("name", &v->name, "NAME", "a name", .required = name_required),
        MUSE_FLAG_E("color", &v->color, colors, "a color"),
        MUSE_FLAG_R("dir", v->dirs, &v->ndirs, 3, "DIR", "a folder", .def = ""),
    };
    char *argv[32] = {"cmd"};
    int argc = 1;
    while (args[argc - 1]) argv[argc] = (char *)args[argc - 1], argc++;
    FILE *out = fmemopen(out_text, sizeof out_text, "w"),
         *err = fmemopen(err_text, sizeof err_text, "w");
    const muse_flags set = {.prog = "muse-x",
                            .about = "Does x.\n",
                            .flags = table,
                            .n = sizeof table / sizeof *table,
                            .out = out,
                            .err = err};
    int rc = muse_flags_parse(&set, argc, argv);
    fclose(out);
    fclose(err);
    return rc;
}

#define ARGS(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A refusal: exit code 2 and exactly this message. */
static void refuses(const char *const *args, const char *want, const char *what)
{
    vars v;
    is_int(parse(&v, false, args), 2, "%s: exit code 2", what);
    char full[512];
    snprintf(full, sizeof full, "muse-x: %s (see muse-x --help)\n", want);
    is_str(err_text, full, "%s: the message", what);
}

int main(void)
{
    vars v;
    is_int(parse(&v, false, (const char *const[]){NULL}), MUSE_FLAGS_RUN, "no flags: run");
    ok(!v.verbose && v.n == 4 && v.big == 1LL << 40 && v.ratio == 0.5 && v.gib == 1 &&
           strcmp(v.name, "x") == 0 && v.color == 1 && v.ndirs == 0,
       "no flags: the defaults stay");

    is_int(parse(&v, false,
                 ARGS("--verbose", "--n", "256", "--big", "-5", "--ratio", "0.25", "--gib", "1.5",
                      "--name", "y", "--color", "blue", "--dir", "a", "--dir", "b")),
           MUSE_FLAGS_RUN, "every kind as --flag value");
    ok(v.verbose && v.n == 256 && v.big == -5 && v.ratio == 0.25 && v.gib == 1.5 &&
           strcmp(v.name, "y") == 0 && v.color == 2,
       "every kind is stored");
    ok(v.ndirs == 2 && strcmp(v.dirs[0], "a") == 0 && strcmp(v.dirs[1], "b") == 0,
       "a repeatable flag keeps each value in order");
    is_int(muse_gib_bytes(v.gib), 1610612736, "1.5 GiB in bytes");

    is_int(parse(&v, false,
                 ARGS("--n=1", "--big=1125899906842624", "--ratio=1", "--gib=0",
                      "--name=", "--color=red", "--dir=c")),
           MUSE_FLAGS_RUN, "every kind as --flag=value");
    ok(v.n == 1 && v.big == 1LL << 50 && v.ratio == 1 && v.gib == 0 && strcmp(v.name, "") == 0 &&
           v.color == 0 && v.ndirs == 1 && strcmp(v.dirs[0], "c") == 0,
       "--flag=value stores the bounds themselves and an empty string");
    parse(&v, false, ARGS("--n", "3", "--n", "9"));
    is_int(v.n, 9, "a flag given twice: the last wins");

    refuses(ARGS("--n", "0"), "--n 0: must be an integer in 1 .. 256", "an int below its bounds");
    refuses(ARGS("--n=257"), "--n 257: must be an integer in 1 .. 256", "an int above its bounds");
    refuses(ARGS("--n", "4x"), "--n 4x: must be an integer in 1 .. 256", "an int with a tail");
    refuses(ARGS("--n", " 4"), "--n  4: must be an integer in 1 .. 256", "an int after a space");
    refuses(ARGS("--n="), "--n '': must be an integer in 1 .. 256", "an empty int");
    refuses(ARGS("--big", "99999999999999999999"),
            "--big 99999999999999999999: must be an integer in -5 .. 1125899906842624",
            "an int64 past long long");
    refuses(ARGS("--ratio", "1.5"), "--ratio 1.5: must be a number in 0 .. 1", "a double above");
    refuses(ARGS("--ratio", "nan"), "--ratio nan: must be a number in 0 .. 1", "a NaN");
    refuses(ARGS("--ratio", "0.5s"), "--ratio 0.5s: must be a number in 0 .. 1", "a double's tail");
    refuses(ARGS("--gib", "-1"), "--gib -1: must be a size in GiB, 0 .. 64", "a negative size");
    refuses(ARGS("--gib", "65"), "--gib 65: must be a size in GiB, 0 .. 64", "a size too large");
    refuses(ARGS("--color", "pink"), "--color pink: must be red, green or blue", "an unknown name");
    refuses(ARGS("--dir", "a", "--dir", "b", "--dir", "c", "--dir", "d"), "--dir: at most 3 times",
            "a repeatable flag once too often");
    refuses(ARGS("--bogus", "1"), "unknown flag --bogus", "an unknown flag");
    refuses(ARGS("--bogus=1"), "unknown flag --bogus", "an unknown flag with =");
    refuses(ARGS("--nn", "1"), "unknown flag --nn", "no prefix matching");
    refuses(ARGS("stray"), "unexpected argument stray", "a positional argument");
    refuses(ARGS("--"), "unexpected argument --", "a bare --");
    refuses(ARGS("--n"), "--n needs a value: N", "a missing value at the end");
    refuses(ARGS("--name", "--verbose"), "--name needs a value: NAME", "a flag where a value goes");
    refuses(ARGS("--color"), "--color needs a value: red|green|blue", "an enum's missing value");
    refuses(ARGS("--verbose=yes"), "--verbose takes no value", "a value for a bool");

    is_int(parse(&v, true, ARGS("--n", "2")), 2, "a required flag left out: exit code 2");
    is_str(err_text, "muse-x: --name NAME is required (see muse-x --help)\n",
           "a required flag left out: the message");
    is_int(parse(&v, true, ARGS("--name", "z")), MUSE_FLAGS_RUN, "a required flag given: run");

    is_int(parse(&v, false, ARGS("--n", "7", "--help")), 0, "--help: exit code 0");
    is_int(v.n, 4, "--help stores nothing");
    const char *want = "usage: muse-x [flags]\n"
                       "Does x.\n"
                       "\n"
                       "flags:\n"
                       "  --verbose               say more\n"
                       "  --n N                   how many (1 .. 256, default 4)\n"
                       "  --big B                 a large one (-5 .. 1125899906842624, default "
                       "1099511627776)\n"
                       "  --ratio R               a fraction (0 .. 1, default 0.5)\n"
                       "  --gib GIB               a budget (default 1)\n"
                       "  --name NAME             a name (default x)\n"
                       "  --color red|green|blue  a color (default green)\n"
                       "  --dir DIR               a folder (up to 3 times)\n"
                       "  --help                  print this help\n";
    is_str(out_text, want, "--help prints the table: kinds, bounds, defaults");
    is_int(parse(&v, true, ARGS("-h")), 0, "-h is --help, even with a required flag left out");
    ok(strncmp(out_text, "usage: muse-x --name NAME [flags]\n", 34) == 0,
       "the usage line names the required flags");
    ok(strstr(out_text, "  --name NAME             a name (required)\n") != NULL,
       "a required flag shows no default");
    is_int(parse(&v, false, ARGS("--name", "--help")), 0,
           "--help after a flag that wants a value is still --help");

    muse_err e = {{0}};
    long long x = 0;
    ok(muse_parse_int("--streams", "12", 1, 16, &x, &e) == 0 && x == 12, "muse_parse_int reads 12");
    ok(muse_parse_int("--streams", "17", 1, 16, &x, &e) == -1 &&
           strcmp(e.msg, "--streams 17: must be an integer in 1 .. 16") == 0,
       "muse_parse_int names the flag, the value and the bounds");
    return done_testing();
}
