/* The table printer of muse-bench: text rows and the same rows as one JSON object, optionally
 * written to a file and compared with an earlier run's file row by row. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bench_table.h"

void bench_table_open(bench_table *t, const char *bench, const char *title, const char *const *cols,
                      int ncols, int as_json)
{
    *t = (bench_table){.title = title, .cols = cols, .ncols = ncols, .as_json = as_json};
    t->json = cJSON_CreateObject();
    cJSON_AddStringToObject(t->json, "bench", bench);
    double load[3] = {0};
    FILE *f = fopen("/proc/loadavg", "r");
    if (f) {
        if (fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
        fclose(f);
    }
    cJSON_AddItemToObject(t->json, "loadavg", cJSON_CreateDoubleArray(load, 3));
    cJSON_AddNumberToObject(t->json, "cores", (double)sysconf(_SC_NPROCESSORS_ONLN));
    t->rows = cJSON_AddArrayToObject(t->json, "rows");
}

static void print_cell(int i, const char *s)
{
    printf("%s%-16s", i ? " | " : "", s);
}

void bench_table_header(bench_table *t)
{
    if (t->as_json) return;
    const cJSON *load = cJSON_GetObjectItem(t->json, "loadavg");
    printf("%s (load average %.2f %.2f %.2f, %ld cores)\n", t->title,
           cJSON_GetArrayItem(load, 0)->valuedouble, cJSON_GetArrayItem(load, 1)->valuedouble,
           cJSON_GetArrayItem(load, 2)->valuedouble, sysconf(_SC_NPROCESSORS_ONLN));
    for (int i = 0; i < t->n_heads; i++) printf("  %s\n", t->heads[i]);
    int n = t->ncols + (t->baseline != NULL);
    for (int i = 0; i < t->ncols; i++) print_cell(i, t->cols[i]);
    if (t->baseline) print_cell(1, "x baseline");
    printf("\n");
    for (int i = 0; i < n; i++) printf("%s----------------", i ? "-|-" : "");
    printf("\n");
}

void bench_table_begin(bench_table *t, const char *bench, const char *title,
                       const char *const *cols, int ncols, int as_json)
{
    bench_table_open(t, bench, title, cols, ncols, as_json);
    bench_table_header(t);
}

void bench_table_head(bench_table *t, const char *key, const char *text)
{
    cJSON_AddStringToObject(t->json, key, text);
    if (t->n_heads < BENCH_TABLE_HEADS)
        snprintf(t->heads[t->n_heads++], sizeof t->heads[0], "%s: %s", key, text);
}

void bench_table_number(bench_table *t, const char *key, double v)
{
    cJSON_AddNumberToObject(t->json, key, v);
}

/* The whole file as a string, or NULL with errno set. */
static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *s = malloc(cap);
    while (s) {
        n += fread(s + n, 1, cap - n - 1, f);
        if (n < cap - 1) break;
        char *grown = realloc(s, cap *= 2);
        if (!grown) free(s);
        s = grown;
    }
    int failed = ferror(f);
    fclose(f);
    if (!s || failed) {
        free(s);
        errno = failed ? EIO : ENOMEM;
        return NULL;
    }
    s[n] = 0;
    return s;
}

static int load_baseline(bench_table *t, const char *path, char *why, size_t len)
{
    const char *bench = cJSON_GetObjectItem(t->json, "bench")->valuestring;
    char *text = read_all(path);
    if (!text)
        return snprintf(why, len, "--baseline %s: cannot read it: %s", path, strerror(errno)), -1;
    cJSON *j = cJSON_Parse(text);
    free(text);
    const cJSON *b = cJSON_GetObjectItem(j, "bench"), *rows = cJSON_GetObjectItem(j, "rows");
    if (!cJSON_IsObject(j) || !cJSON_IsString(b) || !cJSON_IsArray(rows)) {
        snprintf(why, len,
                 "--baseline %s is not muse-bench JSON (%s); write one with muse-bench %s "
                 "--json FILE",
                 path, j ? "no \"bench\" name and \"rows\" list" : "not JSON", bench);
        cJSON_Delete(j);
        return -1;
    }
    if (strcmp(b->valuestring, bench)) {
        snprintf(why, len, "--baseline %s is muse-bench %.40s JSON, not %s", path, b->valuestring,
                 bench);
        cJSON_Delete(j);
        return -1;
    }
    t->baseline = j;
    return 0;
}

int bench_table_io_setup(bench_table *t, const bench_table_io *io, char *why, size_t why_len)
{
    char cmd[2048] = "muse-bench";
    for (int i = 0; i < io->argc; i++) {
        size_t at = strlen(cmd);
        snprintf(cmd + at, sizeof cmd - at, " %s", io->argv[i]);
    }
    cJSON_AddStringToObject(t->json, "command", cmd);
    char date[32];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    cJSON_AddStringToObject(t->json, "date", date);
    t->json_path = io->json_path && strcmp(io->json_path, "-") ? io->json_path : NULL;
    t->keys = io->keys;
    t->nkeys = io->nkeys;
    t->ratio_col = io->ratio_col;
    if (io->baseline_path) {
        if (load_baseline(t, io->baseline_path, why, why_len)) return -1;
        cJSON_AddStringToObject(t->json, "baseline", io->baseline_path);
    }
    return 0;
}

static int same_value(const cJSON *a, const cJSON *b)
{
    if (cJSON_IsNumber(a) && cJSON_IsNumber(b)) return a->valuedouble == b->valuedouble;
    return cJSON_IsString(a) && cJSON_IsString(b) && !strcmp(a->valuestring, b->valuestring);
}

/* This row's ratio_col over the baseline row whose keys are the same; NAN without one. */
static double baseline_ratio(const bench_table *t, const cJSON *row)
{
    const cJSON *b;
    cJSON_ArrayForEach(b, cJSON_GetObjectItem(t->baseline, "rows"))
    {
        int match = 1;
        for (int k = 0; k < t->nkeys && match; k++)
            match = same_value(cJSON_GetObjectItem(row, t->keys[k]),
                               cJSON_GetObjectItem(b, t->keys[k]));
        const cJSON *now = cJSON_GetObjectItem(row, t->ratio_col),
                    *was = cJSON_GetObjectItem(b, t->ratio_col);
        if (match && cJSON_IsNumber(now) && cJSON_IsNumber(was) && was->valuedouble != 0)
            return now->valuedouble / was->valuedouble;
    }
    return NAN;
}

void bench_table_row(bench_table *t, const char *const *cells)
{
    cJSON *row = cJSON_CreateObject();
    for (int i = 0; i < t->ncols; i++) {
        char *end;
        double v = strtod(cells[i], &end);
        if (*cells[i] && *end == 0 && isfinite(v))
            cJSON_AddNumberToObject(row, t->cols[i], v);
        else
            cJSON_AddStringToObject(row, t->cols[i], cells[i]);
        if (!t->as_json) print_cell(i, cells[i]);
    }
    if (t->baseline) {
        double r = baseline_ratio(t, row);
        if (isfinite(r))
            cJSON_AddNumberToObject(row, "x baseline", r);
        else
            cJSON_AddNullToObject(row, "x baseline");
        if (!t->as_json) print_cell(1, isfinite(r) ? bench_fmt("%.3f", r) : "-");
    }
    if (!t->as_json) printf("\n");
    cJSON_AddItemToArray(t->rows, row);
    fflush(stdout); /* long benchmarks: show each row as it is measured */
}

void bench_table_note(bench_table *t, const char *key, const char *text)
{
    cJSON_AddStringToObject(t->json, key, text);
    if (!t->as_json) printf("  %s: %s\n", key, text);
}

static int write_json(const char *path, const cJSON *j)
{
    char *s = cJSON_Print(j);
    FILE *f = fopen(path, "w");
    int ok = f && s && fputs(s, f) >= 0 && fputc('\n', f) != EOF;
    if (f && fclose(f)) ok = 0;
    if (!ok) fprintf(stderr, "muse-bench: --json %s: cannot write it: %s\n", path, strerror(errno));
    cJSON_free(s);
    return ok ? 0 : -1;
}

int bench_table_end(bench_table *t)
{
    if (t->as_json) {
        char *s = cJSON_PrintUnformatted(t->json);
        printf("%s\n", s);
        cJSON_free(s);
    } else {
        printf("\n");
    }
    int rc = t->json_path ? write_json(t->json_path, t->json) : 0;
    cJSON_Delete(t->json);
    cJSON_Delete(t->baseline);
    fflush(stdout);
    return rc;
}

void bench_table_discard(bench_table *t)
{
    cJSON_Delete(t->json);
    cJSON_Delete(t->baseline);
}

const char *bench_fmt(const char *f, double v)
{
    static char bufs[16][48];
    static int at;
    char *b = bufs[at++ % 16];
    snprintf(b, sizeof bufs[0], f, v);
    return b;
}
