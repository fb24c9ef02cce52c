/* muse-bench's output: one plain-text table per benchmark, mirrored into one JSON object
 * (--json) with the load average and the core count; optionally written to a file with the
 * command line and the date, and compared row by row with an earlier run's file (--baseline). */
#ifndef MUSE_BENCH_TABLE_H
#define MUSE_BENCH_TABLE_H

#include <stddef.h>

#include <cjson/cJSON.h>

#define BENCH_TABLE_HEADS 8

typedef struct {
    const char *title;
    const char *const *cols;
    int ncols;
    cJSON *json, *rows;
    int as_json;
    char heads[BENCH_TABLE_HEADS][256]; /* lines printed under the title */
    int n_heads;
    const char *json_path;   /* write the JSON object here at the end (NULL: nowhere) */
    cJSON *baseline;         /* an earlier run's JSON object, or NULL */
    const char *const *keys; /* the columns that match a row with its baseline row */
    int nkeys;
    const char *ratio_col; /* the column divided by its baseline value */
} bench_table;

/* What --json FILE and --baseline FILE ask of a table. ratio_col over keys' match. */
typedef struct {
    const char *json_path, *baseline_path;
    const char *const *keys;
    int nkeys;
    const char *ratio_col;
    int argc; /* the subcommand's argv, recorded as the command line */
    char **argv;
} bench_table_io;

/* Starts a table: prints the title with the load average and the header (text mode). */
void bench_table_begin(bench_table *t, const char *bench, const char *title,
                       const char *const *cols, int ncols, int as_json);
/* bench_table_begin in two steps, for tables with head lines or files: open (nothing printed),
 * then bench_table_head / bench_table_io, then bench_table_header prints. */
void bench_table_open(bench_table *t, const char *bench, const char *title, const char *const *cols,
                      int ncols, int as_json);
void bench_table_header(bench_table *t);
/* A key: text line under the title (a field of the JSON object); before bench_table_header. */
void bench_table_head(bench_table *t, const char *key, const char *text);
/* A number field of the JSON object only. */
void bench_table_number(bench_table *t, const char *key, double v);
/* Records the command line and the date, and reads the baseline: -1 with why naming the file
 * when it is unreadable or not this benchmark's muse-bench JSON. Before bench_table_header. */
int bench_table_io_setup(bench_table *t, const bench_table_io *io, char *why, size_t why_len);
/* One row of ncols cells: printed as given; in JSON a number when the cell parses as one. With a
 * baseline, one more cell: this row's ratio_col over the matching baseline row's ("-": none). */
void bench_table_row(bench_table *t, const char *const *cells);
/* A key: text note under the table (a field of the JSON object). */
void bench_table_note(bench_table *t, const char *key, const char *text);
/* Prints the JSON object (--json) or a blank line, writes the JSON file, frees the table;
 * -1 when the file could not be written (said on stderr). */
int bench_table_end(bench_table *t);

/* Frees the table without printing or writing anything (an error before any row). */
void bench_table_discard(bench_table *t);

/* Formats one number into one of 16 rotating buffers, for table cells. */
const char *bench_fmt(const char *f, double v);

#endif
