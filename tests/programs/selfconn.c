/*
 * selfconn: a UDP ping service (answers "ping" with "pong" on --port, default 7200) that holds
 * a TCP connection to itself over loopback, on which nothing is ever sent, and aborts as soon as
 * that connection breaks.
 *
 * A restore brings a connected TCP socket back reset (docs/ARCHITECTURE.md, fds.rs): restored
 * anywhere, this service crashes at once. It is the tests' service that "crashes right after
 * every restore", deterministically and on every machine, without anything injected: the
 * orchestrator must give it up after a bounded number of failovers instead of moving it round
 * for ever.
 *
 * Exits 1 on a setup error; aborts (no core dump) when the connection breaks.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static void die(const char *what)
{
    perror(what);
    _exit(1);
}

int main(int argc, char **argv)
{
    int port = 7200;
    for (int i = 1; i + 1 < argc; i++)
        if (strcmp(argv[i], "--port") == 0)
            port = atoi(argv[i + 1]);
    struct rlimit nocore = {0, 0};
    if (setrlimit(RLIMIT_CORE, &nocore) < 0)
        die("setrlimit");

    /* The loopback connection: a listener, a client connected to it, the accepted end. */
    struct sockaddr_in lo = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof lo;
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (l < 0 || bind(l, (struct sockaddr *)&lo, sizeof lo) < 0 || listen(l, 1) < 0 ||
        getsockname(l, (struct sockaddr *)&lo, &len) < 0)
        die("listening on loopback");
    int c = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c < 0 || connect(c, (struct sockaddr *)&lo, sizeof lo) < 0)
        die("connecting to itself");
    int a = accept4(l, NULL, NULL, SOCK_CLOEXEC);
    if (a < 0)
        die("accepting");
    close(l);

    int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in any = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    if (u < 0 || bind(u, (struct sockaddr *)&any, sizeof any) < 0)
        die("binding the UDP port");
    fprintf(stderr, "selfconn: serving on udp %d, connected to itself on tcp %d\n", port,
            ntohs(lo.sin_port));

    struct pollfd p[3] = {{.fd = u, .events = POLLIN}, {.fd = c, .events = POLLIN},
                          {.fd = a, .events = POLLIN}};
    for (;;) {
        if (poll(p, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        for (int i = 1; i < 3; i++) {
            if (p[i].revents == 0)
                continue;
            /* Nothing is ever sent on it: readiness means it broke (reset or closed). */
            char b;
            ssize_t r = recv(p[i].fd, &b, 1, MSG_DONTWAIT);
            if (r < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            fprintf(stderr, "selfconn: the loopback connection broke (%s): aborting\n",
                    r < 0 ? strerror(errno) : r == 0 ? "end of stream" : "unexpected data");
            abort();
        }
        if (p[0].revents & POLLIN) {
            char buf[64];
            struct sockaddr_in from;
            socklen_t fl = sizeof from;
            ssize_t n = recvfrom(u, buf, sizeof buf - 1, 0, (struct sockaddr *)&from, &fl);
            if (n >= 4 && memcmp(buf, "ping", 4) == 0)
                sendto(u, "pong\n", 5, 0, (struct sockaddr *)&from, fl);
        }
    }
}
