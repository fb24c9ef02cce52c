/* Socket IO for the ranks' TCP links: every read and write bounded by a deadline (poll), a
 * closed or reset peer an error with the reason, never a signal (MSG_NOSIGNAL) or an abort. */
#ifndef MUSE_TP_NET_H
#define MUSE_TP_NET_H

#include <stddef.h>
#include <stdint.h>

#include "base/clock.h" /* deadlines are muse_now_ms_int() plus a timeout */
#include "base/muse_common.h"

/* Exactly len bytes to or from fd before deadline_ms (-1: no deadline). -1 with the reason
 * ("closed the connection", "no answer within 3000 ms", strerror) in e. */
int muse_net_write(int fd, const void *buf, size_t len, int64_t deadline_ms, muse_err *e);
int muse_net_read(int fd, void *buf, size_t len, int64_t deadline_ms, muse_err *e);

/* HOST:PORT (HOST a name, an IPv4 address or [IPv6]) into host and port; errors name flag. */
int muse_net_split(const char *flag, const char *hostport, char *host, size_t host_len, char *port,
                   size_t port_len, muse_err *e);

/* A listening socket on host:port (SO_REUSEADDR), or -1 with the reason. */
int muse_net_listen(const char *host, const char *port, muse_err *e);
/* One connection attempt to host:port before deadline_ms: the fd, or -1 with the reason. */
int muse_net_connect(const char *host, const char *port, int64_t deadline_ms, muse_err *e);
/* A connection accepted before deadline_ms: the fd (peer's address in peer), or -1. */
int muse_net_accept(int lfd, int64_t deadline_ms, char *peer, size_t peer_len, muse_err *e);
/* TCP_NODELAY and keepalive on a rank link: small sums go out at once, a dead host is seen. */
void muse_net_tune(int fd);

/* Little-endian fields of the handshake records. */
static inline void muse_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void muse_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t muse_get32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static inline uint64_t muse_get64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
