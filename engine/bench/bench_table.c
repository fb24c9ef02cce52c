/* The table printer of muse-bench: text rows and the same rows as one JSON object. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "bench_table.h"

void bench_table_begin(bench_table *t, const char *bench, const char *title,
                       const char *const *cols, int ncols, int as_json)
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
    if (!as_json) {
        printf("%s (load average %.2f %.2f %.2f, %ld cores)\n", title, load[0], load[1], load[2],
               sysconf(_SC_NPROCESSORS_ONLN));
        for (int i = 0; i < ncols; i++) printf("%s%-16s", i ? " | " : "", cols[i]);
        printf("\n");
        for (int i = 0; i < ncols; i++) printf("%s----------------", i ? "-|-" : "");
        printf("\n");
    }
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
        if (!t->as_json) printf("%s%-16s", i ? " | " : "", cells[i]);
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

void bench_table_end(bench_table *t)
{
    if (t->as_json) {
        char *s = cJSON_PrintUnformatted(t->json);
        printf("%s\n", s);
        cJSON_free(s);
    } else {
        printf("\n");
    }
    cJSON_Delete(t->json);
    fflush(stdout);
}

const char *bench_fmt(const char *f, double v)
{
    static char bufs[16][48];
    static int at;
    char *b = bufs[at++ % 16];
    snprintf(b, sizeof bufs[0], f, v);
    return b;
}
