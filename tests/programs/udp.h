/* The UDP command socket of the test programs (forktree.c, sharedfds.c, unixsock.c):
 * udp_bound(PORT) is a socket bound to PORT on every address (or -1, errno set);
 * udp_request() reads the next command, udp_reply() answers it.
 * testkit/src/programs.rs rebuilds a program when a header here is newer than its binary. */
#ifndef TARDI_TEST_UDP_H
#define TARDI_TEST_UDP_H

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

static int udp_bound(int port) {
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) return -1;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0) {
        close(s);
        return -1;
    }
    return s;
}

/* The next request on socket S: a NUL-terminated string in BUF (at most SIZE - 1 bytes), its
 * sender in FROM. Failed reads (a signal) are retried. */
struct udp_peer {
    struct sockaddr_in addr;
    socklen_t len;
};

static void udp_request(int s, char *buf, size_t size, struct udp_peer *from) {
    for (;;) {
        from->len = sizeof from->addr;
        ssize_t n = recvfrom(s, buf, size - 1, 0, (struct sockaddr *)&from->addr, &from->len);
        if (n < 0) continue;
        buf[n] = 0;
        return;
    }
}

/* Sends LEN bytes of REPLY back to FROM. */
static void udp_reply(int s, const void *reply, size_t len, const struct udp_peer *from) {
    sendto(s, reply, len, 0, (const struct sockaddr *)&from->addr, from->len);
}

#endif
