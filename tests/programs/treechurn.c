/*
 * treechurn: a service whose process tree changes while it runs, for tests/tree_epochs.rs (the
 * epoch loop following processes that appear, exit and run execve between epochs).
 *
 * The main process (role 0) starts alone. Each process has a memory region of its own (PAGES
 * pages for the main process, WPAGES for a worker) filled from its generation, and answers
 * UDP commands on PORT + role:
 *   ping       -> "pong role=R"
 *   gen N      -> rewrites its region for generation N: "gen=N"
 *   state      -> "role=R pid=P ppid=Q gen=G digest=D execs=E" (D: FNV-1a of the region)
 * The main process also:
 *   fork K     -> forks worker K (role K, listening on PORT + K): "forked=PID"
 *   reap       -> reaps every child that exited: "reaped=PID:STATUS,..." or "reaped=none"
 *   threads    -> starts two threads: one blocked for good in a read() of a pipe nobody writes
 *                 (a system call in flight whenever a worker is forked), one mapping and
 *                 unmapping a page in a loop (a memory-layout call in flight most of the time):
 *                 "threads"; under the mprotect tracker, a worker forked meanwhile inherits
 *                 what they hold in the agent (its lock, its in-flight slots)
 *   quiet      -> ends both threads and joins them: "quiet"
 * A worker also:
 *   exit S     -> answers "bye", then exits with status S (its parent does not reap it)
 *   exec       -> answers "exec", then runs execve of its own executable, which comes back as
 *                 the same worker (same role, generation and region contents, in a new
 *                 address space; its region mapped at another size, so the layout differs);
 *                 if execve fails, the worker exits with status 100 + errno
 *
 *   treechurn [--port P] [--worker K --gen G --execs E]   (default port 7600)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include "udp.h"

#define PAGES 256
#define WPAGES 64

static int port = 7600, role, gen = 1, execs;
static unsigned char *region;
static size_t region_len;

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void fill(int g) {
    gen = g;
    for (size_t p = 0; p < region_len / 4096; p++) {
        unsigned char *page = region + p * 4096;
        memset(page, (g * 31 + role * 7 + (int)p) & 0xff, 4096);
        memcpy(page, &g, sizeof g);
    }
}

static uint64_t digest(void) {
    uint64_t h = 1469598103934665603ULL;
    for (size_t i = 0; i < region_len; i++) h = (h ^ region[i]) * 1099511628211ULL;
    return h;
}

/* The "threads" command's. */
static unsigned char blockbuf[4096] __attribute__((aligned(4096)));
static int blockpipe[2] = {-1, -1};
static volatile int quiet;
static pthread_t blocker_t, churner_t;

static void *blocker(void *arg) {
    (void)arg;
    while (!quiet) {
        if (read(blockpipe[0], blockbuf, sizeof blockbuf) < 0 && errno != EINTR) break;
    }
    return NULL;
}

static void *churner(void *arg) {
    (void)arg;
    while (!quiet) {
        volatile unsigned char *p =
            mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) die("mmap (churner)");
        p[0] = 1;
        munmap((void *)p, 4096);
    }
    return NULL;
}

static void map_region(size_t pages) {
    region_len = pages * 4096;
    region = mmap(NULL, region_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (region == MAP_FAILED) die("mmap");
}

static void serve(const char *self);

static void worker(const char *self, int k) {
    role = k;
    map_region(WPAGES);
    fill(gen);
    serve(self);
}

static void serve(const char *self) {
    int s = udp_bound(port + role);
    if (s < 0) die("bind");
    char buf[256], out[512];
    struct udp_peer from;
    for (;;) {
        udp_request(s, buf, sizeof buf, &from);
        int n = 0;
        if (strcmp(buf, "ping") == 0) {
            n = snprintf(out, sizeof out, "pong role=%d", role);
        } else if (strncmp(buf, "gen ", 4) == 0) {
            fill(atoi(buf + 4));
            n = snprintf(out, sizeof out, "gen=%d", gen);
        } else if (strcmp(buf, "state") == 0) {
            n = snprintf(out, sizeof out, "role=%d pid=%d ppid=%d gen=%d digest=%016llx execs=%d",
                         role, getpid(), getppid(), gen, (unsigned long long)digest(), execs);
        } else if (role == 0 && strncmp(buf, "fork ", 5) == 0) {
            int k = atoi(buf + 5);
            pid_t c = fork();
            if (c < 0) die("fork");
            if (c == 0) {
                close(s);
                if (blockpipe[0] >= 0) {
                    close(blockpipe[0]);
                    close(blockpipe[1]);
                }
                munmap(region, region_len);
                gen = 1;
                worker(self, k);
            }
            n = snprintf(out, sizeof out, "forked=%d", c);
        } else if (role == 0 && strcmp(buf, "threads") == 0) {
            if (pipe(blockpipe) < 0) die("pipe");
            quiet = 0;
            if (pthread_create(&blocker_t, NULL, blocker, NULL) != 0 ||
                pthread_create(&churner_t, NULL, churner, NULL) != 0)
                die("pthread_create");
            n = snprintf(out, sizeof out, "threads");
        } else if (role == 0 && strcmp(buf, "quiet") == 0) {
            quiet = 1;
            if (write(blockpipe[1], "q", 1) != 1) die("write");
            pthread_join(blocker_t, NULL);
            pthread_join(churner_t, NULL);
            close(blockpipe[0]);
            close(blockpipe[1]);
            blockpipe[0] = blockpipe[1] = -1;
            n = snprintf(out, sizeof out, "quiet");
        } else if (role == 0 && strcmp(buf, "reap") == 0) {
            n = snprintf(out, sizeof out, "reaped=");
            int any = 0, st;
            pid_t c;
            while ((c = waitpid(-1, &st, WNOHANG)) > 0) {
                n += snprintf(out + n, sizeof out - n, "%s%d:%d", any ? "," : "", c, st);
                any = 1;
            }
            if (!any) n += snprintf(out + n, sizeof out - n, "none");
        } else if (role > 0 && strncmp(buf, "exit ", 5) == 0) {
            udp_reply(s, "bye", 3, &from);
            _exit(atoi(buf + 5));
        } else if (role > 0 && strcmp(buf, "exec") == 0) {
            udp_reply(s, "exec", 4, &from);
            close(s);
            char p[16], k[16], g[16], e[16];
            snprintf(p, sizeof p, "%d", port);
            snprintf(k, sizeof k, "%d", role);
            snprintf(g, sizeof g, "%d", gen);
            snprintf(e, sizeof e, "%d", execs + 1);
            execl(self, "treechurn", "--port", p, "--worker", k, "--gen", g, "--execs", e,
                  (char *)NULL);
            int err = errno;
            perror("execl");
            _exit(100 + err);
        } else {
            n = snprintf(out, sizeof out, "unknown command");
        }
        udp_reply(s, out, n, &from);
    }
}

int main(int argc, char **argv) {
    int k = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);
        else if (strcmp(argv[i], "--worker") == 0 && i + 1 < argc) k = atoi(argv[++i]);
        else if (strcmp(argv[i], "--gen") == 0 && i + 1 < argc) gen = atoi(argv[++i]);
        else if (strcmp(argv[i], "--execs") == 0 && i + 1 < argc) execs = atoi(argv[++i]);
    }
    /* The executable, for execve (a path that stays valid after a restore). */
    static char self[4096];
    ssize_t l = readlink("/proc/self/exe", self, sizeof self - 1);
    if (l < 0) die("readlink");
    self[l] = 0;
    if (k > 0) {
        /* After execve: another region size than before, the same contents per page. */
        role = k;
        map_region(WPAGES + 16 * execs);
        fill(gen);
        serve(self);
    }
    map_region(PAGES);
    fill(gen);
    serve(self);
    return 0;
}
