/* The kernel registry's table (check/registry.h), made from the one list in backend/ops.h. */
#include "check/registry.h"

static const muse_kernel_entry table[] = {
#define MUSE_K_ROW(id, name, op, cuda, fast, ref, widths, tol, tol_fast, check)                    \
    {MUSE_K_##id, name, op, cuda, fast, ref, widths, tol, tol_fast},
    MUSE_KERNELS(MUSE_K_ROW)
#undef MUSE_K_ROW
};

const muse_kernel_entry *muse_kernel_registry(size_t *n)
{
    *n = sizeof table / sizeof *table;
    return table;
}

const muse_kernel_entry *muse_kernel_entry_of(muse_kernel_id id)
{
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (table[i].id == id) return &table[i];
    return NULL;
}

double muse_kernel_tol_fast(const muse_kernel_entry *k, int round16)
{
    if (k->tol_fast != MUSE_TOL_BY_OUTPUT) return k->tol_fast;
    return round16 ? 5e-4 : 2e-5;
}

int muse_kernel_rows(long max_rows, int fast, long rows[MUSE_KERNEL_MAX_ROW_COUNTS])
{
    static const long exact[] = {1, 16, 17}, fastr[] = {1, 4, 16, 17, 64, 256};
    const long *base = fast ? fastr : exact;
    int nb = fast ? 6 : 3, n = 0;
    for (int i = 0; i < nb; i++)
        if (base[i] < max_rows) rows[n++] = base[i];
    rows[n++] = max_rows;
    return n;
}

static const char *tol_text(double tol, char *buf, size_t len)
{
    if (tol == 0) return "bitwise";
    if (tol == MUSE_TOL_BY_OUTPUT) return "rel L2 5e-4 (fp16 out), 2e-5 (fp32 out)";
    snprintf(buf, len, "rel L2 %.0e", tol);
    return buf;
}

/* s with markdown's cell separator escaped */
static void cell(FILE *out, const char *s)
{
    for (; *s; s++) {
        if (*s == '|') fputc('\\', out);
        fputc(*s, out);
    }
}

void muse_kernel_contract_table(FILE *out)
{
    fprintf(out, "| kernel | operation | exact path: must equal (CPU) | exact bound | fast path "
                 "kernel | fast bound (against exact) | widths |\n");
    fprintf(out, "|---|---|---|---|---|---|---|\n");
    for (size_t i = 0; i < sizeof table / sizeof *table; i++) {
        const muse_kernel_entry *k = &table[i];
        char a[32], b[32];
        const char *cells[] = {k->name,
                               k->op,
                               k->reference,
                               k->cuda,
                               tol_text(k->tol, a, sizeof a),
                               k->fast ? k->fast : "the exact kernel",
                               tol_text(k->tol_fast, b, sizeof b),
                               k->widths};
        for (size_t c = 0; c < sizeof cells / sizeof *cells; c++) {
            fputs(c == 0 ? "| " : c == 3 ? " (" : c == 4 ? ") | " : " | ", out);
            cell(out, cells[c]);
        }
        fputs(" |\n", out);
    }
}
