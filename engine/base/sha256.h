/* SHA-256 (FIPS 180-4), for token_sha and prompt-cache keys. */
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
/* Lowercase hex of a digest into hex[65]. */
void muse_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
