/* SHA-256 against the FIPS 180-4 examples and a one-million-'a' message. */
#include "base/sha256.h"
#include "tap.h"

static void check(const char *msg, size_t repeat, const char *want, const char *what)
{
    muse_sha256 s;
    muse_sha256_init(&s);
    for (size_t i = 0; i < repeat; i++) muse_sha256_update(&s, msg, strlen(msg));
    uint8_t d[32];
    char hex[65];
    muse_sha256_final(&s, d);
    muse_sha256_hex(d, hex);
    is_str(hex, want, "%s", what);
}

int main(void)
{
    check("", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    check("abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    check("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "two blocks");
    check("a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
          "a million a, one byte at a time");
    return done_testing();
}
