/* What the pre-copy's destination costs: process_vm_readv of N scattered pages of a child
 * that keeps writing its memory, then one read of every copied line (the encoder's read),
 * either into one large buffer read after all copies (the epoch loop today: pre-copy, then
 * encode) or into a 32-page ring read right after each batch (a copy fused with the
 * encoding). The caches are evicted before each round (a 64 MiB walk); rounds alternate the
 * two ways. Prints each round's time.
 *
 *   cc -O2 -o /tmp/copy_dest bench/copy_dest.c && taskset -c 0 /tmp/copy_dest [WRITER_CPU] [huge]
 *
 * WRITER_CPU (default: the same CPU as the reader, as Redis and its checkpointer in
 * bench/throughput.sh's pinned cases) is where the child writes. `huge` puts the large
 * buffer on transparent huge pages (2 MiB aligned, MADV_HUGEPAGE), as the epoch loop's copy
 * buffers are; without it the buffer is plain malloc memory (4 KiB pages). Reports only. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define PG 4096
#define REGION (64 << 20)
#define N 1900 /* Redis's pages per 10 ms epoch under redis-benchmark SET */
#define BATCH 32
#define ROUNDS 40

static double now_us(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
    char *mem = mmap(0, REGION, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) return perror("mmap"), 1;
    memset(mem, 3, REGION);
    pid_t child = fork();
    if (child == 0) {
        if (argc > 1) {
            cpu_set_t s;
            CPU_ZERO(&s);
            CPU_SET(atoi(argv[1]), &s);
            sched_setaffinity(0, sizeof s, &s);
        }
        for (uint64_t r = 1;;) { /* keep writing random pages */
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            mem[(r % (REGION / PG)) * PG + (r >> 40) % PG]++;
        }
    }
    static uint64_t addrs[N];
    size_t big_len = ((size_t)N * PG + (2 << 20) - 1) & ~(size_t)((2 << 20) - 1);
    char *big, *ring = aligned_alloc(PG, BATCH * PG);
    if (argc > 2 && strcmp(argv[2], "huge") == 0) {
        big = aligned_alloc(2 << 20, big_len);
        if (big) madvise(big, big_len, MADV_HUGEPAGE);
    } else {
        big = malloc(big_len);
    }
    if (!big || !ring) return perror("alloc"), 1;
    char *junk = malloc(64 << 20);
    memset(big, 0, (size_t)N * PG), memset(ring, 0, BATCH * PG), memset(junk, 0, 64 << 20);
    uint64_t r = 88172645463325252ull;
    volatile unsigned sink = 0;
    for (int round = 0; round < ROUNDS; round++) {
        for (int i = 0; i < N; i++) {
            r ^= r << 13, r ^= r >> 7, r ^= r << 17;
            addrs[i] = (uint64_t)mem + (r % (REGION / PG)) * PG;
        }
        qsort(addrs, N, sizeof addrs[0], cmp);
        for (size_t i = 0; i < (64 << 20); i += 64) junk[i]++;
        int fused = round % 2;
        double t = now_us();
        for (int i = 0; i < N; i += BATCH) {
            int n = N - i < BATCH ? N - i : BATCH;
            struct iovec local, remote[BATCH];
            for (int k = 0; k < n; k++)
                remote[k] = (struct iovec){(void *)addrs[i + k], PG};
            local = (struct iovec){fused ? ring : big + (size_t)i * PG, (size_t)n * PG};
            if (process_vm_readv(child, &local, 1, remote, n, 0) != (ssize_t)n * PG)
                perror("process_vm_readv");
            if (fused)
                for (int l = 0; l < n * PG; l += 64) sink += (unsigned char)ring[l];
        }
        if (!fused)
            for (size_t l = 0; l < (size_t)N * PG; l += 64) sink += (unsigned char)big[l];
        double us = now_us() - t;
        printf("%-7s %6.0f us  %.2f us a page\n", fused ? "ring" : "buffer", us, us / N);
    }
    kill(child, SIGKILL);
    return 0;
}
