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

/* ---- fp16 / bf16: exact IEEE conversions, round to nearest even ---- */

static inline float muse_bits_to_f32(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t muse_f32_to_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float muse_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t mant = h & 0x3FFu;
    if (exp == 0x1F) return muse_bits_to_f32(sign | 0x7F800000u | (mant << 13));
    if (exp == 0) {
        /* subnormal: mant * 2^-24, exact in fp32 */
        float v = (float)mant * 5.9604644775390625e-08f;
        return sign ? -v : v;
    }
    return muse_bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

static inline uint16_t muse_f32_to_f16(float f)
{
    uint32_t x = muse_f32_to_bits(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7FFFFFFFu;
    if (ax >= 0x7F800000u) return (uint16_t)(sign | 0x7C00u | (ax > 0x7F800000u ? 0x200u : 0));
    if (ax >= 0x477FF000u) return (uint16_t)(sign | 0x7C00u); /* rounds to >= 65520: inf */
    if (ax < 0x38800000u) {
        /* result is subnormal or zero: scale so the integer part is the fp16 mantissa */
        if (ax < 0x33000000u) return (uint16_t)sign; /* below half the smallest subnormal */
        uint32_t e = ax >> 23;
        uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
        uint32_t shift = 126u - e; /* 14 + (112 - (e-127)) ... m >> (shift) gives 2^-24 units */
        uint32_t q = m >> shift;
        uint32_t rem = m & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1u);
        if (rem > half || (rem == half && (q & 1u))) q++;
        return (uint16_t)(sign | q);
    }
    uint32_t q = ((ax >> 13) - (112u << 10));
    uint32_t rem = ax & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* The value an fp16 store would keep. */
static inline float muse_round_f16(float f)
{
    return muse_f16_to_f32(muse_f32_to_f16(f));
}

static inline float muse_bf16_to_f32(uint16_t b)
{
    return muse_bits_to_f32((uint32_t)b << 16);
}
static inline uint16_t muse_f32_to_bf16(float f)
{
    uint32_t x = muse_f32_to_bits(f);
    if ((x & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((x >> 16) | 0x40u);
    x += 0x7FFFu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

#endif
