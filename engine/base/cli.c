#include "base/cli.h"

#include <errno.h>
#include <math.h>

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

int muse_parse_long(const char *flag, const char *text, long long lo, long long hi, long long *out,
                    muse_err *e)
{
    char *end;
    errno = 0;
    long long v = text && *text ? strtoll(text, &end, 10) : 0;
    if (!text || !*text || *end || errno || v < lo || v > hi)
        return muse_fail(e, "%s must be an integer in %lld .. %lld", flag, lo, hi);
    *out = v;
    return 0;
}

int muse_parse_double(const char *flag, const char *text, double lo, double hi, double *out,
                      muse_err *e)
{
    char *end;
    errno = 0;
    double v = text && *text ? strtod(text, &end) : NAN;
    if (!text || !*text || *end || errno || !(v >= lo && v <= hi))
        return muse_fail(e, "%s must be a number in [%g, %g]", flag, lo, hi);
    *out = v;
    return 0;
}
