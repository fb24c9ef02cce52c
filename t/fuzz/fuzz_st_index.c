/* libFuzzer: muse_st_parse_index over arbitrary model.safetensors.index.json text. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "pack/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char **names = NULL, **shards = NULL;
    size_t n = 0;
    muse_err e = {{0}};
    int rc = muse_st_parse_index((const char *)data, size, &names, &shards, &n, &e);
    if (rc != 0 && (names || shards || n || !e.msg[0])) __builtin_trap();
    for (size_t i = 0; rc == 0 && i < n; i++) {
        /* shard names must stay inside the pack directory */
        const char *s = shards[i];
        if (!names[i] || !s || !s[0] || strchr(s, '/') || !strcmp(s, ".") || !strcmp(s, ".."))
            __builtin_trap();
    }
    muse_st_free_index(names, shards, n);
    return 0;
}
