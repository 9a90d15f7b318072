/* An experiment for bench/quiesce.sh's analysis, not part of Tardi: the same quiescence as
 * tardi_checkpointer::ptrace::Stopped::stop (list /proc/PID/task, PTRACE_SEIZE + PTRACE_INTERRUPT
 * every thread, wait for every interrupt stop, rescan; then PTRACE_DETACH every thread), with the
 * wait done two ways:
 *   block - waitpid(tid, __WALL), as the library does: the tracer sleeps, its CPU may go idle
 *   poll  - waitpid(tid, __WALL | WNOHANG) in a loop: the tracer spins until the stop arrives
 *   nap   - waitpid(WNOHANG), sleeping 2, 4, 8 ... µs (at most 1 ms) between tries
 *   nap1  - as nap, with the thread's timer slack set to 1 ns (PR_SET_TIMERSLACK; the default
 *           50 µs slack lets every short nanosleep last ~50 µs or more)
 * On a VM whose idle vCPUs halt at once, the difference is the cost of waking a halted vCPU.
 * Signal-delivery stops are not handled (the target, bench/threads.c, receives no signals).
 *
 * Usage: stop_variants block|poll|nap|nap1 PID [ITERATIONS] [GAP_MS]
 * Prints {"variant","threads","stop_us":{min,median,p99,max},"cycle_us":{...}}.
 * Build: cc -O2 -o stop_variants stop_variants.c */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/ptrace.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef PTRACE_EVENT_STOP
#define PTRACE_EVENT_STOP 128
#endif
#define MAXT 1024

static int poll_mode, nap_mode;

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static int list_tids(int pid, int *out) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", pid);
    DIR *d = opendir(path);
    if (!d) return -1;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < MAXT)
        if (e->d_name[0] != '.') out[n++] = atoi(e->d_name);
    closedir(d);
    return n;
}

static void wait_stop(int tid) {
    int status;
    long nap = 2;
    for (;;) {
        int r = waitpid(tid, &status, __WALL | (poll_mode || nap_mode ? WNOHANG : 0));
        if (r == 0) { /* not stopped yet */
            if (nap_mode) {
                struct timespec ts = {0, nap * 1000};
                nanosleep(&ts, NULL);
                nap = nap * 2 > 1000 ? 1000 : nap * 2;
            }
            continue;
        }
        if (r < 0) {
            if (errno == EINTR) continue;
            perror("waitpid");
            exit(1);
        }
        if ((status >> 16) == PTRACE_EVENT_STOP) return;
        fprintf(stderr, "unexpected stop of %d: %#x\n", tid, status);
        exit(1);
    }
}

static int contains(const int *v, int n, int x) {
    for (int i = 0; i < n; i++)
        if (v[i] == x) return 1;
    return 0;
}

/* Returns the number of threads stopped (their tids in `stopped`). */
static int stop_all(int pid, int *stopped) {
    int n = 0, now[MAXT], fresh[MAXT];
    for (;;) {
        int m = list_tids(pid, now), k = 0;
        for (int i = 0; i < m; i++)
            if (!contains(stopped, n, now[i])) fresh[k++] = now[i];
        if (k == 0) return n;
        for (int i = 0; i < k; i++) {
            if (ptrace(PTRACE_SEIZE, fresh[i], 0, 0) || ptrace(PTRACE_INTERRUPT, fresh[i], 0, 0)) {
                perror("seize/interrupt");
                exit(1);
            }
        }
        for (int i = 0; i < k; i++) {
            wait_stop(fresh[i]);
            stopped[n++] = fresh[i];
        }
    }
}

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void summary(const char *name, double *v, int n) {
    qsort(v, n, sizeof *v, cmp);
    printf("\"%s\":{\"min\":%.1f,\"median\":%.1f,\"p99\":%.1f,\"max\":%.1f}", name, v[0],
           v[(int)((n - 1) * 0.5 + 0.5)], v[(int)((n - 1) * 0.99 + 0.5)], v[n - 1]);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s block|poll|nap|nap1 PID [ITERATIONS] [GAP_MS]\n", argv[0]);
        return 2;
    }
    poll_mode = !strcmp(argv[1], "poll");
    nap_mode = !strncmp(argv[1], "nap", 3);
    if (!strcmp(argv[1], "nap1")) prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
    int pid = atoi(argv[2]);
    int iters = argc > 3 ? atoi(argv[3]) : 200;
    int gap_ms = argc > 4 ? atoi(argv[4]) : 2;
    double *stop = calloc(iters, sizeof *stop), *cycle = calloc(iters, sizeof *cycle);
    int tids[MAXT], n = 0;
    for (int i = 0; i < iters; i++) {
        double t0 = now_us();
        n = stop_all(pid, tids);
        double t1 = now_us();
        for (int j = 0; j < n; j++) ptrace(PTRACE_DETACH, tids[j], 0, 0);
        double t2 = now_us();
        stop[i] = t1 - t0;
        cycle[i] = t2 - t0;
        struct timespec g = {0, gap_ms * 1000000L};
        nanosleep(&g, NULL);
    }
    printf("{\"variant\":\"%s\",\"threads\":%d,", argv[1], n);
    summary("stop_us", stop, iters);
    printf(",");
    summary("cycle_us", cycle, iters);
    printf("}\n");
    return 0;
}
