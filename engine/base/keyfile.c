/* Reading a secret key file, refusing a loose one (keyfile.h). */
#include "base/keyfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void wipe(uint8_t *p, size_t n)
{
    volatile uint8_t *v = p; /* a plain memset of a dying buffer may be dropped */
    for (size_t i = 0; i < n; i++) v[i] = 0;
}

int muse_key_file_read(const char *path, uid_t owner, uint8_t *key, size_t *len, char *err,
                       size_t err_cap)
{
    struct stat st;
    uint8_t buf[MUSE_KEY_MAX_BYTES + 64];
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        snprintf(err, err_cap, "key file %s: %s%s", path, strerror(errno),
                 errno == ELOOP ? " (a symbolic link: name the file itself)" : "");
        return -1;
    }
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, err_cap, "key file %s is not a regular file", path);
        close(fd);
        return -1;
    }
    if ((st.st_uid != owner && st.st_uid != 0) || (st.st_mode & 077)) {
        snprintf(err, err_cap,
                 "key file %s (mode %04o, owner uid %u) can be read or changed by others than "
                 "uid %u and root: chown it to that user and chmod 0600",
                 path, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)owner);
        close(fd);
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof buf);
    close(fd);
    while (n > 0 &&
           (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    if (n < (ssize_t)MUSE_KEY_MIN_BYTES || n > (ssize_t)MUSE_KEY_MAX_BYTES) {
        snprintf(err, err_cap,
                 "key file %s holds %zd bytes, not %u..%u: make one with "
                 "`openssl rand -hex 32 > %s`",
                 path, n < 0 ? (ssize_t)0 : n, MUSE_KEY_MIN_BYTES, MUSE_KEY_MAX_BYTES, path);
        wipe(buf, sizeof buf);
        return -1;
    }
    memcpy(key, buf, (size_t)n);
    *len = (size_t)n;
    wipe(buf, sizeof buf);
    return 0;
}
