/*
 * forktree: a process tree for tests/process_tree.rs. The main process forks three children,
 * one of which forks a grandchild:
 *
 *   role 0  main process                     (the sandbox made it a session leader)
 *   role 1  child, leads its own process group   (setpgid(0, 0))
 *   role 2  child, leads its own session         (setsid())
 *   role 3  child, stays in its parent's group and session, has a second thread; forks
 *           role 4
 *   role 4  grandchild, leads its own process group
 *
 * Each process then binds its own UDP socket on PORT + role (after forking: no descriptor but
 * stdio is shared) and holds memory that is a pure function of (role, generation): a 256 KiB
 * heap buffer, a 16 KiB static array and a counter. Commands (UDP, one datagram each, answered
 * by the process that owns the port; safe to repeat):
 *   ping    -> "pong role=R"
 *   state   -> "role=R pid=P ppid=PP pgid=G sid=S gen=N ok=0|1 digest=HEX tids=T1,T2..."
 *              ok=1 when every byte of the buffers is what generation N must hold; digest is
 *              FNV-1a 64 of both buffers
 *   gen N   -> writes generation N if it is newer than the one held; "gen=N"
 *   spawn   -> forks a child that exits with status 5, reaps it: "spawned=PID status=S"
 *
 *   forktree [--port P]   (default 7300)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <pthread.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "generation.h"
#include "udp.h"

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* The process's thread ids, ascending, as "T1,T2,...". */
static void thread_ids(char *out, size_t len) {
    long ids[64];
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *e;
    while (d && (e = readdir(d)) && n < 64)
        if (e->d_name[0] != '.') ids[n++] = atol(e->d_name);
    if (d) closedir(d);
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && ids[j - 1] > ids[j]; j--) {
            long t = ids[j];
            ids[j] = ids[j - 1];
            ids[j - 1] = t;
        }
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += snprintf(out + at, len - at, i ? ",%ld" : "%ld", ids[i]);
}

static void *sleeper(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

static void serve(int port) {
    heap = malloc(HEAP_LEN);
    if (!heap) die("malloc");
    write_generation(1);
    if (role == 3) {
        pthread_t t;
        if (pthread_create(&t, NULL, sleeper, NULL) != 0) die("pthread_create");
    }
    int s = udp_bound(port + role);
    if (s < 0) die("bind");
    for (;;) {
        char buf[256];
        struct udp_peer from;
        udp_request(s, buf, sizeof buf, &from);
        char out[512];
        if (strcmp(buf, "ping") == 0) {
            snprintf(out, sizeof out, "pong role=%d", role);
        } else if (strcmp(buf, "state") == 0) {
            char tids[256];
            thread_ids(tids, sizeof tids);
            snprintf(out, sizeof out, "role=%d pid=%ld ppid=%ld pgid=%ld sid=%ld gen=%ld ok=%d digest=%016llx tids=%s",
                     role, (long)syscall(SYS_getpid), (long)getppid(), (long)getpgid(0), (long)getsid(0),
                     generation, consistent(), (unsigned long long)digest(), tids);
        } else if (strcmp(buf, "spawn") == 0) {
            pid_t c = fork();
            if (c == 0) _exit(5);
            int st = -1;
            if (c > 0) waitpid(c, &st, 0);
            snprintf(out, sizeof out, "spawned=%ld status=%d", (long)c, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        } else if (strncmp(buf, "gen ", 4) == 0) {
            long g = atol(buf + 4);
            if (g > generation) write_generation(g);
            snprintf(out, sizeof out, "gen=%ld", generation);
        } else {
            snprintf(out, sizeof out, "unknown command");
        }
        udp_reply(s, out, strlen(out), &from);
    }
}

int main(int argc, char **argv) {
    int port = 7300;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);
    for (int r = 1; r <= 3; r++) {
        pid_t c = fork();
        if (c < 0) die("fork");
        if (c > 0) continue;
        role = r;
        if (r == 1 && setpgid(0, 0) < 0) die("setpgid");
        if (r == 2 && setsid() < 0) die("setsid");
        if (r == 3) {
            pid_t g = fork();
            if (g < 0) die("fork");
            if (g == 0) {
                role = 4;
                if (setpgid(0, 0) < 0) die("setpgid");
            }
        }
        serve(port);
    }
    serve(port);
    return 0;
}
