/* Small helpers shared by the muse-engine subcommands: strict flag parsing and token lists. */
#ifndef MUSE_CLI_H
#define MUSE_CLI_H

#include <stdint.h>

#include "base/muse_common.h"

/* Parses "1,2,3" (no spaces, no empty entries) into a malloc'd array. Errors name the flag
 * and the position of the bad entry. */
int muse_parse_ids(const char *flag, const char *text, int32_t **ids, size_t *n, muse_err *e);
/* Strict number parsing for a flag's value: the whole text, within [lo, hi]. */
int muse_parse_long(const char *flag, const char *text, long long lo, long long hi, long long *out,
                    muse_err *e);
int muse_parse_double(const char *flag, const char *text, double lo, double hi, double *out,
                      muse_err *e);

#endif
