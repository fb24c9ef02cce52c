/* Shared helpers: errors that name the thing and the fix, CHECK macros, fp16/bf16 rounding. */
#ifndef MUSE_COMMON_H
#define MUSE_COMMON_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MUSE_VERSION "0.1.0"

/* An error message travels up by value; every failing function returns -1 and fills it. */
typedef struct {
    char msg[1024];
} muse_err;

#if defined(__GNUC__)
#define MUSE_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define MUSE_PRINTF(a, b)
#endif

/* Formats into e (when not NULL) and returns -1, so callers can `return muse_fail(e, ...)`. */
static inline MUSE_PRINTF(2, 3) int muse_fail(muse_err *e, const char *fmt, ...)
{
    if (e) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->msg, sizeof e->msg, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Aborts with file:line on a broken invariant (a bug, never bad input). */
#define MUSE_CHECK(cond)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "muse: %s:%d: check failed: %s\n", __FILE__, __LINE__, #cond);         \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

static inline void *muse_xmalloc(size_t n, const char *file, int line)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "muse: %s:%d: out of memory allocating %zu bytes\n", file, line, n);
        abort();
    }
    return p;
}
static inline void *muse_xcalloc(size_t n, size_t sz, const char *file, int line)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p) {
        fprintf(stderr, "muse: %s:%d: out of memory allocating %zu x %zu bytes\n", file, line, n,
                sz);
        abort();
    }
    return p;
}
#define MUSE_MALLOC(n)     muse_xmalloc((n), __FILE__, __LINE__)
#define MUSE_CALLOC(n, sz) muse_xcalloc((n), (sz), __FILE__, __LINE__)

/* Growable bytes, always NUL-terminated once written. */
typedef struct {
    char *p;
    size_t len, cap;
} muse_buf;

static inline void muse_buf_add(muse_buf *b, const void *s, size_t n)
{
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->p = (char *)realloc(b->p, b->cap);
        MUSE_CHECK(b->p);
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

#include "base/f16.h" /* fp16 / bf16: exact IEEE conversions, round to nearest even */

#endif
