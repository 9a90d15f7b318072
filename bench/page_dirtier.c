/*
 * page_dirtier.c: the UDP ping service of tests/programs/dirtier.c (same command line, same
 * protocol), except that it rewrites WHOLE pages with pseudo-random bytes instead of one byte
 * per page. Used by bench/replication.sh (`dirty` and `backups` with FULL_PAGES=1) to
 * reproduce Tardigrade's Figs. 4-5, whose ping server changes every byte it walks over: there a
 * dirtying rate of R MB/s is R MB/s of checkpoint data, whereas the one-byte-per-page dirtier's
 * pages delta-encode to a few bytes each and never load the replication link.
 *
 *   page_dirtier [--port N] [--mb M] [--rate-mbps R] [--exit-after-ms MS]
 *
 * R MB/s (10^6 bytes) = R*1e6/4096 whole pages per second, walked sequentially through an --mb
 * MiB region (touched once at start), caught up every 1 ms from CLOCK_MONOTONIC as in
 * dirtier.c. Page contents come from a xorshift64 generator: incompressible, and never the
 * same twice. UDP: "ping" -> "pong <pages written> pages=<region pages> rate_mbps=<R>\n",
 * "exit" -> "bye\n" and exit 0, anything else -> "error unknown-command\n".
 *
 * Build: cc -O2 -pthread -o page_dirtier bench/page_dirtier.c
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define PAGE 4096

static _Atomic uint64_t pages_written;
static int sock_fd;
static double rate_mbps = 10.0;
static size_t region_pages;

static void fail(const char *what) {
    fprintf(stderr, "page_dirtier: %s: %s\n", what, strerror(errno));
    exit(2);
}

static void usage(void) {
    fprintf(stderr, "usage: page_dirtier [--port N] [--mb M] [--rate-mbps R] [--exit-after-ms MS]\n");
    exit(2);
}

static uint64_t mono_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void *serve_udp(void *unused) {
    (void)unused;
    char in[512], out[256];
    for (;;) {
        struct sockaddr_storage peer;
        socklen_t plen = sizeof peer;
        ssize_t n = recvfrom(sock_fd, in, sizeof in - 1, 0, (struct sockaddr *)&peer, &plen);
        if (n < 0) {
            if (errno == EINTR) continue;
            fail("recvfrom");
        }
        while (n > 0 && (in[n - 1] == '\n' || in[n - 1] == '\r' || in[n - 1] == ' ' || in[n - 1] == 0)) n--;
        in[n] = 0;
        int len, bye = 0;
        if (strcmp(in, "ping") == 0) {
            len = snprintf(out, sizeof out, "pong %" PRIu64 " pages=%zu rate_mbps=%g\n",
                           atomic_load(&pages_written), region_pages, rate_mbps);
        } else if (strcmp(in, "exit") == 0) {
            len = snprintf(out, sizeof out, "bye\n");
            bye = 1;
        } else {
            len = snprintf(out, sizeof out, "error unknown-command\n");
        }
        while (sendto(sock_fd, out, (size_t)len, 0, (struct sockaddr *)&peer, plen) < 0 && errno == EINTR) {}
        if (bye) exit(0);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long port = 7100, mb = 100;
    long long exit_after_ms = -1;
    for (int i = 1; i < argc; i += 2) {
        if (i + 1 >= argc) usage();
        char *end;
        if (strcmp(argv[i], "--rate-mbps") == 0) {
            rate_mbps = strtod(argv[i + 1], &end);
            if (*end || !(rate_mbps >= 0)) usage();
            continue;
        }
        long long v = strtoll(argv[i + 1], &end, 10);
        if (*end || v < 0) usage();
        if (strcmp(argv[i], "--port") == 0 && v <= 65535) port = (long)v;
        else if (strcmp(argv[i], "--mb") == 0 && v >= 1 && v <= (1 << 20)) mb = (long)v;
        else if (strcmp(argv[i], "--exit-after-ms") == 0) exit_after_ms = v;
        else usage();
    }

    size_t bytes = (size_t)mb << 20;
    region_pages = bytes / PAGE;
    uint64_t *mem = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) fail("mmap");
    for (size_t p = 0; p < region_pages; p++) mem[p * (PAGE / 8)] = 1;

    sock_fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (sock_fd < 0) fail("socket");
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(sock_fd, (struct sockaddr *)&sin, sizeof sin) != 0) fail("bind");
    pthread_t t;
    int e = pthread_create(&t, NULL, serve_udp, NULL);
    if (e) {
        errno = e;
        fail("pthread_create");
    }

    const double pages_per_ns = rate_mbps * 1e6 / PAGE / 1e9;
    const uint64_t t0 = mono_ns();
    uint64_t done = 0, x = 0x9e3779b97f4a7c15ULL ^ t0;
    for (;;) {
        struct timespec tick = {0, 1000000};
        nanosleep(&tick, NULL);
        uint64_t elapsed = mono_ns() - t0;
        if (exit_after_ms >= 0 && elapsed >= (uint64_t)exit_after_ms * 1000000ULL) exit(0);
        if (rate_mbps <= 0) continue;
        uint64_t due = (uint64_t)((double)elapsed * pages_per_ns);
        while (done < due) {
            uint64_t *page = mem + (done % region_pages) * (PAGE / 8);
            for (int w = 0; w < PAGE / 8; w++) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                page[w] = x;
            }
            done++;
            if ((done & 255) == 0) atomic_store(&pages_written, done);
        }
        atomic_store(&pages_written, done);
    }
}
