/*
 * segv_barrier: an app with its own SIGSEGV handler and its own mprotect calls, the way a
 * garbage collector's write barrier works. It must behave the same under Tardi's mprotect
 * write tracker, whose agent also handles SIGSEGV and serves mprotect.
 *
 * Loop: protect a page of its region read-only (mprotect), write to it; the handler counts the
 * fault, makes the page writable again (mprotect) and returns, so the write completes. Every
 * write must fault exactly once and land. It also reads into a heap buffer with read() (the
 * kernel writes there) from a pipe it fills itself.
 *
 * Prints "ok <round>" on stdout every 1000 rounds; on any inconsistency prints "FAIL ..." and
 * exits 1. Runs until killed, or for --rounds N then exits 0 printing "done <faults>".
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PAGES 64
static unsigned char *region;
static volatile long faults;
static long page_size;

static void on_segv(int sig, siginfo_t *si, void *uc)
{
    (void)sig;
    (void)uc;
    uintptr_t a = (uintptr_t)si->si_addr;
    uintptr_t base = (uintptr_t)region;
    if (a < base || a >= base + PAGES * page_size) {
        /* Not ours: die the default way. */
        signal(SIGSEGV, SIG_DFL);
        return;
    }
    faults++;
    void *page = (void *)(a & ~(uintptr_t)(page_size - 1));
    if (mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0)
        _exit(3);
}

int main(int argc, char **argv)
{
    long rounds = -1;
    if (argc > 2 && strcmp(argv[1], "--rounds") == 0)
        rounds = atol(argv[2]);
    page_size = sysconf(_SC_PAGESIZE);
    region = mmap(NULL, PAGES * page_size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                  -1, 0);
    if (region == MAP_FAILED)
        return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigfillset(&sa.sa_mask); /* blocks everything, SIGSEGV included: a common pattern */
    if (sigaction(SIGSEGV, &sa, NULL) != 0)
        return 2;
    int fds[2];
    if (pipe(fds) != 0)
        return 2;
    unsigned char *buf = malloc(1 << 16);
    unsigned long sum = 0, expect = 0;
    for (long r = 0; rounds < 0 || r < rounds; r++) {
        int p = (int)(r % PAGES);
        unsigned char *page = region + (size_t)p * page_size;
        long before = faults;
        if (mprotect(page, page_size, PROT_READ) != 0) {
            printf("FAIL mprotect: round %ld\n", r);
            return 1;
        }
        /* Faults once, the handler opens the page. Volatile: the store must happen before
         * `faults` is read again. */
        ((volatile unsigned char *)page)[r % page_size] = (unsigned char)r;
        if (faults != before + 1 || page[r % page_size] != (unsigned char)r) {
            printf("FAIL round %ld: faults %ld -> %ld\n", r, before, faults);
            fflush(stdout);
            return 1;
        }
        expect += (unsigned char)r;
        /* The kernel writes into the heap buffer. */
        unsigned char msg[64];
        memset(msg, (int)(r & 0xff), sizeof msg);
        if (write(fds[1], msg, sizeof msg) != (ssize_t)sizeof msg ||
            read(fds[0], buf + (r % 1000) * 64, sizeof msg) != (ssize_t)sizeof msg ||
            buf[(r % 1000) * 64 + 7] != (unsigned char)(r & 0xff)) {
            printf("FAIL read into the heap: round %ld\n", r);
            fflush(stdout);
            return 1;
        }
        sum += page[r % page_size];
        if (sum != expect) {
            printf("FAIL sum: round %ld\n", r);
            return 1;
        }
        if (r % 1000 == 999) {
            printf("ok %ld\n", r + 1);
            fflush(stdout);
            usleep(1000);
        }
    }
    printf("done %ld\n", faults);
    return 0;
}
