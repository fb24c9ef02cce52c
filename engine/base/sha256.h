/* SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for token_sha, prompt-cache keys and the
 * worker-key challenge on the engine's socket. */
#ifndef MUSE_SHA256_H
#define MUSE_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    uint32_t h[8];
    uint64_t bytes;
    uint8_t block[64];
    size_t used;
} muse_sha256;

void muse_sha256_init(muse_sha256 *s);
void muse_sha256_update(muse_sha256 *s, const void *data, size_t len);
void muse_sha256_final(muse_sha256 *s, uint8_t out[32]);
/* HMAC-SHA-256 of msg under key (any length: a key longer than 64 bytes is hashed first). */
void muse_hmac_sha256(const void *key, size_t key_len, const void *msg, size_t len,
                      uint8_t out[32]);
/* 1 when the n bytes of a and b are equal; the time depends on n only. */
int muse_equal_ct(const void *a, const void *b, size_t n);
/* Lowercase hex of a digest into hex[65]. */
void muse_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
