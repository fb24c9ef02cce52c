/* SHA-256 against the FIPS 180-4 examples and a one-million-'a' message; HMAC-SHA-256
 * against RFC 4231's test cases; the constant-time compare. */
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

static void check_hmac(const void *key, size_t key_len, const char *msg, const char *want,
                       const char *what)
{
    uint8_t d[32];
    char hex[65];
    muse_hmac_sha256(key, key_len, msg, strlen(msg), d);
    muse_sha256_hex(d, hex);
    is_str(hex, want, "HMAC: %s", what);
}

int main(void)
{
    uint8_t k[131];
    memset(k, 0x0b, 20);
    check_hmac(k, 20, "Hi There",
               "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7",
               "RFC 4231 case 1");
    check_hmac("Jefe", 4, "what do ya want for nothing?",
               "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843",
               "RFC 4231 case 2");
    memset(k, 0xaa, sizeof k);
    check_hmac(k, 131, "Test Using Larger Than Block-Size Key - Hash Key First",
               "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54",
               "RFC 4231 case 6 (a key longer than a block is hashed first)");
    ok(muse_equal_ct("abcd", "abcd", 4) && !muse_equal_ct("abcd", "abce", 4) &&
           !muse_equal_ct("xbcd", "abcd", 4),
       "constant-time compare: equal, last byte differs, first byte differs");
    check("", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855", "empty");
    check("abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad", "abc");
    check("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1", "two blocks");
    check("a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0",
          "a million a, one byte at a time");
    return done_testing();
}
