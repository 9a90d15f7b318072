/*
 * idle_tree.c: a process tree for bench/tree_pause.sh (issue 8: what each extra idle process
 * adds to an epoch's pause). The main process answers UDP pings on PORT and writes one byte
 * per page of the first 4 MiB of a MAIN_MB MiB region every millisecond-ish (a busy main
 * process); it forks WORKERS children first, each of which touches MB MiB of its own memory
 * once and then sleeps in pause() forever (an idle worker: nginx's or a pool's between
 * requests). Nothing is shared but stdio.
 *
 *   idle_tree [--port P] [--workers N] [--mb M] [--main-mb M]   (defaults 7700, 0, 4, 4)
 *
 * Build: cc -O2 -o idle_tree bench/idle_tree.c
 */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static char *region(size_t mb) {
    size_t len = mb << 20;
    char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) {
        perror("mmap");
        exit(2);
    }
    for (size_t i = 0; i < len; i += 4096) p[i] = (char)(i >> 12);
    return p;
}

int main(int argc, char **argv) {
    int port = 7700, workers = 0, mb = 4, main_mb = 4;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--port") == 0) port = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--workers") == 0) workers = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--mb") == 0) mb = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--main-mb") == 0) main_mb = atoi(argv[i + 1]);
    }
    for (int w = 0; w < workers; w++) {
        pid_t c = fork();
        if (c < 0) {
            perror("fork");
            exit(2);
        }
        if (c == 0) {
            region((size_t)mb);
            for (;;) pause();
        }
    }
    char *mine = region(main_mb < 4 ? 4 : (size_t)main_mb);
    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) {
        perror("bind");
        exit(2);
    }
    size_t page = 0;
    for (;;) {
        struct pollfd p = {.fd = s, .events = POLLIN};
        if (poll(&p, 1, 1) > 0) {
            char buf[64];
            struct sockaddr_in from;
            socklen_t len = sizeof from;
            ssize_t n = recvfrom(s, buf, sizeof buf, 0, (struct sockaddr *)&from, &len);
            if (n > 0) sendto(s, "pong", 4, 0, (struct sockaddr *)&from, len);
        }
        /* 16 pages a millisecond: ~160 dirty pages per 10 ms epoch. */
        for (int k = 0; k < 16; k++, page = (page + 1) % 1024) mine[page * 4096]++;
    }
}
