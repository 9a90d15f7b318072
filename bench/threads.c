/* A target for bench/quiesce.sh: a process with exactly N threads (the main thread included),
 * all doing the same thing until killed:
 *   futex  - blocked in FUTEX_WAIT on a word that never changes
 *   sleep  - blocked in nanosleep (1 hour at a time)
 *   busy   - spinning in user space, never entering the kernel
 * Usage: threads MODE N. Prints "ready PID" on stdout once every thread has started.
 * Build: cc -O2 -pthread -o threads threads.c */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum mode { FUTEX, SLEEP, BUSY };
static enum mode mode;
static atomic_int started;
static int never = 0;
static volatile unsigned long sink;

static void work(void) {
    atomic_fetch_add(&started, 1);
    for (;;) {
        switch (mode) {
        case FUTEX:
            syscall(SYS_futex, &never, FUTEX_WAIT_PRIVATE, 0, NULL, NULL, 0);
            break;
        case SLEEP: {
            struct timespec ts = {3600, 0};
            nanosleep(&ts, NULL);
            break;
        }
        case BUSY:
            for (unsigned long i = 0; i < 1000000; i++)
                sink += i;
            break;
        }
    }
}

static void *thread_main(void *arg) {
    (void)arg;
    work();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s futex|sleep|busy N\n", argv[0]);
        return 2;
    }
    if (!strcmp(argv[1], "futex"))
        mode = FUTEX;
    else if (!strcmp(argv[1], "sleep"))
        mode = SLEEP;
    else if (!strcmp(argv[1], "busy"))
        mode = BUSY;
    else {
        fprintf(stderr, "unknown mode %s\n", argv[1]);
        return 2;
    }
    int n = atoi(argv[2]);
    if (n < 1) {
        fprintf(stderr, "N must be >= 1\n");
        return 2;
    }
    for (int i = 1; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, NULL, thread_main, NULL) != 0) {
            perror("pthread_create");
            return 1;
        }
    }
    while (atomic_load(&started) < n - 1)
        usleep(1000);
    printf("ready %d\n", getpid());
    fflush(stdout);
    atomic_fetch_add(&started, 1);
    work();
}
