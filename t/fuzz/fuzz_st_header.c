/* libFuzzer: muse_st_parse_header over arbitrary header JSON. The first byte picks the data
 * section length (small, or near 2^64 to reach the overflow checks); the rest is the JSON. */
#include <stddef.h>
#include <stdint.h>

#include "pack/safetensors.h"

static uint64_t data_len_from(uint8_t b)
{
    return b < 0xF0 ? (uint64_t)b * 16 : UINT64_MAX >> (b - 0xF0);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    uint64_t data_len = data_len_from(data[0]);
    muse_tensor *t = NULL;
    size_t n = 0;
    muse_err e = {{0}};
    int rc =
        muse_st_parse_header((const char *)data + 1, size - 1, NULL, data_len, "fuzz", &t, &n, &e);
    if (rc != 0 && (t || n || !e.msg[0])) __builtin_trap(); /* a refusal must say why */
    for (size_t i = 0; rc == 0 && i < n; i++) {
        /* what the parser promises about every tensor it hands out */
        uint64_t nbytes = (uint64_t)t[i].numel * muse_dtype_size(t[i].dtype);
        if (!t[i].name || !t[i].name[0] || t[i].ndim < 0 || t[i].ndim > MUSE_MAX_DIMS ||
            t[i].numel < 0 || t[i].nbytes != nbytes || nbytes > data_len || t[i].data)
            __builtin_trap();
    }
    muse_st_free_tensors(t, n);
    return 0;
}
