/* A UDP socket bound to PORT on every address: what the UDP test programs (forktree.c,
 * sharedfds.c, unixsock.c) serve their commands on. Returns the socket, or -1 (errno set).
 * tests/common/programs.rs rebuilds a program when a header here is newer than its binary. */
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

#endif
