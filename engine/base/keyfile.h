/* Reading a secret key file (the worker key the engine and nginx's master share), refusing
 * one anybody else could read, write or swap. Plain POSIX: the nginx module builds it too. */
#ifndef MUSE_KEYFILE_H
#define MUSE_KEYFILE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define MUSE_KEY_MIN_BYTES 32u
#define MUSE_KEY_MAX_BYTES 256u

/* Reads path into key (MUSE_KEY_MAX_BYTES): a regular file reached without a link (O_NOFOLLOW),
 * owned by owner or root, no group or other permission bits, of 32..256 bytes once trailing
 * whitespace is dropped (`openssl rand -hex 32 > FILE` makes one). 0 ok (*len set); -1 and
 * err (err_cap bytes) names the file, what is wrong and the fix. */
int muse_key_file_read(const char *path, uid_t owner, uint8_t *key, size_t *len, char *err,
                       size_t err_cap);

#endif
