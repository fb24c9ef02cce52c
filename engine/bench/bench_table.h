/* muse-bench's output: one plain-text table per benchmark, mirrored into one JSON object
 * (--json) with the load average and the core count. */
#ifndef MUSE_BENCH_TABLE_H
#define MUSE_BENCH_TABLE_H

#include <cjson/cJSON.h>

typedef struct {
    const char *title;
    const char *const *cols;
    int ncols;
    cJSON *json, *rows;
    int as_json;
} bench_table;

/* Starts a table: prints the title with the load average and the header (text mode). */
void bench_table_begin(bench_table *t, const char *bench, const char *title,
                       const char *const *cols, int ncols, int as_json);
/* One row of ncols cells: printed as given; in JSON a number when the cell parses as one. */
void bench_table_row(bench_table *t, const char *const *cells);
/* A key: text note under the table (a field of the JSON object). */
void bench_table_note(bench_table *t, const char *key, const char *text);
/* Prints the JSON object (--json) or a blank line, and frees the table. */
void bench_table_end(bench_table *t);

/* Formats one number into one of 16 rotating buffers, for table cells. */
const char *bench_fmt(const char *f, double v);

#endif
