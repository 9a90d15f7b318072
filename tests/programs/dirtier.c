/*
 * dirtier.c — memory-dirtying UDP ping service (Tardigrade §5.1 workload).
 *
 * WHAT IT TESTS
 *   Checkpoint cost and downtime as a function of the rate at which a
 *   service dirties memory.  It maps a --mb MiB private anonymous region,
 *   touches every page once at start (so the whole region is resident), and
 *   then dirties pages at a fixed average rate while serving a UDP ping,
 *   so the harness can measure (a) service availability/latency during and
 *   across checkpoint/restore and (b) how many pages each incremental
 *   checkpoint has to copy.
 *
 * HOW IT DIRTIES
 *   R MB/s (MB = 10^6 bytes) = R*1e6/4096 pages/s.  Every 1 ms the main
 *   thread computes, from CLOCK_MONOTONIC time elapsed since start, how many
 *   page writes should have happened so far (floor(elapsed_s * R*1e6/4096))
 *   and performs the missing ones, so it catches up after being descheduled
 *   or frozen (e.g. across a checkpoint).  Each write is ONE byte in the
 *   next page, walking the region sequentially and wrapping around; the
 *   byte is at offset 0 of the page and its value is (lap + 1) & 0xff
 *   (lap = how many times the walk has wrapped; the initial touch writes
 *   0xff), so every lap changes every page's content.
 *   --rate-mbps 0 disables dirtying (the region is still touched once).
 *
 * COMMAND LINE
 *   dirtier [--port N] [--mb M] [--rate-mbps R] [--exit-after-ms MS]
 *     --port       UDP port on 0.0.0.0 (default 7100)
 *     --mb         region size in MiB (default 100, >= 1)
 *     --rate-mbps  dirtying rate in MB/s, may be fractional (default 10)
 *     --exit-after-ms  exit(0) by itself after MS ms
 *   Prints nothing except errors (exit status 2 on usage/setup errors).
 *
 * UDP PROTOCOL (served by a second thread blocked in recvfrom)
 *   ping  -> "pong <bytes_written_total> pages=<region pages> rate_mbps=<R>\n"
 *            bytes_written_total = number of single-byte page writes since
 *            start (== pages dirtied, counting repeats; dirtied memory is
 *            that times 4096 bytes).  The initial touch is not counted.
 *   exit  -> "bye\n", then exit status 0
 *   other -> "error unknown-command\n"
 *
 * Build: gcc -O2 -g -pthread -Wall -Wextra -o dirtier dirtier.c
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

static _Atomic uint64_t g_written;
static int g_sock;
static double g_rate;
static size_t g_pages;

static void die(const char *what) {
    fprintf(stderr, "dirtier: %s: %s\n", what, strerror(errno));
    exit(2);
}
static void usage(void) {
    fprintf(stderr, "usage: dirtier [--port N] [--mb M] [--rate-mbps R] [--exit-after-ms MS]\n");
    exit(2);
}
static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

static void *udp_main(void *arg) {
    (void)arg;
    char req[512], out[256];
    for (;;) {
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t r = recvfrom(g_sock, req, sizeof req - 1, 0, (struct sockaddr *)&from, &fl);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("recvfrom");
        }
        while (r > 0 && (req[r - 1] == '\n' || req[r - 1] == '\r' || req[r - 1] == ' ' || req[r - 1] == 0)) r--;
        req[r] = 0;
        int n, quit = 0;
        if (!strcmp(req, "ping"))
            n = snprintf(out, sizeof out, "pong %" PRIu64 " pages=%zu rate_mbps=%g\n", atomic_load(&g_written),
                         g_pages, g_rate);
        else if (!strcmp(req, "exit")) {
            n = snprintf(out, sizeof out, "bye\n");
            quit = 1;
        } else
            n = snprintf(out, sizeof out, "error unknown-command\n");
        while (sendto(g_sock, out, (size_t)n, 0, (struct sockaddr *)&from, fl) < 0 && errno == EINTR) {}
        if (quit) exit(0);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long port = 7100, mb = 100;
    long long exit_after_ms = -1;
    g_rate = 10.0;
    for (int a = 1; a < argc; a += 2) {
        if (a + 1 >= argc) usage();
        char *end;
        if (!strcmp(argv[a], "--rate-mbps")) {
            g_rate = strtod(argv[a + 1], &end);
            if (*end || !(g_rate >= 0)) usage();
            continue;
        }
        long long v = strtoll(argv[a + 1], &end, 10);
        if (*end || v < 0) usage();
        if (!strcmp(argv[a], "--port") && v <= 65535) port = (long)v;
        else if (!strcmp(argv[a], "--mb") && v >= 1 && v <= (1 << 20)) mb = (long)v;
        else if (!strcmp(argv[a], "--exit-after-ms")) exit_after_ms = v;
        else usage();
    }

    size_t size = (size_t)mb << 20;
    g_pages = size / PAGE;
    volatile uint8_t *mem = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) die("mmap");
    for (size_t p = 0; p < g_pages; p++) mem[p * PAGE] = 0xff;

    g_sock = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (g_sock < 0) die("socket");
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(g_sock, (struct sockaddr *)&sin, sizeof sin) != 0) die("bind");
    pthread_t th;
    int e = pthread_create(&th, NULL, udp_main, NULL);
    if (e) { errno = e; die("pthread_create"); }

    const double pages_per_ns = g_rate * 1e6 / PAGE / 1e9;
    const uint64_t start = now_ns();
    uint64_t done = 0;
    for (;;) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL); /* EINTR: just recompute early */
        uint64_t el = now_ns() - start;
        if (exit_after_ms >= 0 && el >= (uint64_t)exit_after_ms * 1000000ULL) exit(0);
        if (g_rate <= 0) continue;
        uint64_t target = (uint64_t)((double)el * pages_per_ns);
        while (done < target) {
            /* chunked so the counter stays fresh during a big catch-up */
            uint64_t end = target - done > 65536 ? done + 65536 : target;
            for (; done < end; done++) {
                uint64_t p = done % g_pages;
                mem[p * PAGE] = (uint8_t)(done / g_pages + 1);
            }
            atomic_store(&g_written, done);
        }
    }
}
