/* The request limits both sides enforce: ngx_muse_module refuses past them with a 400 naming the
 * field, and the engine (serve/request.c) checks them again, from this one header, so the two
 * can never drift. Plain C11 constants, no includes of either side. */
#ifndef MUSE_LIMITS_H
#define MUSE_LIMITS_H

#define MUSE_LIMIT_STOPS           4          /* "stop": a string or up to this many */
#define MUSE_LIMIT_STOP_BYTES      256        /* bytes of one stop string (>= 1) */
#define MUSE_LIMIT_TOP_K_MAX       1073741824 /* top_k in [0, this]; 0 = off */
#define MUSE_LIMIT_MAX_TOKENS      2147483647 /* max_tokens / max_completion_tokens in [1, this] */
#define MUSE_LIMIT_TOKEN_ID_MAX    2147483647 /* token ids of a completions prompt in [0, this] */
#define MUSE_LIMIT_MESSAGES        4096       /* chat messages */
#define MUSE_LIMIT_TOOLS           128        /* chat tools */
#define MUSE_LIMIT_TOOL_NAME_BYTES 64         /* a function name: 1..this bytes */
#define MUSE_LIMIT_SCHEMA_DEPTH    64         /* nesting of a tool's parameter schema */
#define MUSE_LIMIT_JSON_NESTING    200        /* nesting of any JSON in a request body */
#define MUSE_LIMIT_JSON_VALUES     1048576    /* default item count: a 524288-id prompt twice */
#define MUSE_LIMIT_TEMPERATURE_MAX 2          /* temperature in [0, this] */
/* seed: an integer in [-2^63, 2^64 - 1], read from its own text (never through a double); a
 * negative s is the seed 2^64 + s, so every int64 and every uint64 (what muse.seed echoes) works */
#define MUSE_LIMIT_SEED_MIN (-9223372036854775807LL - 1)
#define MUSE_LIMIT_SEED_MAX 18446744073709551615ULL

/* A limit as a string literal, for error messages that name it. */
#define MUSE_STR(x)  #x
#define MUSE_XSTR(x) MUSE_STR(x)

#endif
