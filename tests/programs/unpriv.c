/*
 * unpriv: a process tree whose children run as an ordinary user, for tests/tree_epochs.rs (the
 * mprotect tracker's agent in processes that have neither CAP_SYS_ADMIN nor no_new_privs).
 *
 *   role 0  main process, root
 *   role 1  child, drops to user and group 65534 (setgroups, setresgid, setresuid), then starts
 *           a second thread (which only waits)
 *   role 2  child, drops to 65534 the same way; sets no_new_privs itself when told ("nnp")
 *
 * Each process then binds its own UDP socket on PORT + role and holds memory that is a pure
 * function of (role, generation): a 256 KiB heap buffer and a 16 KiB static array. Commands
 * (UDP, one datagram each, answered by the process that owns the port; safe to repeat):
 *   ping    -> "pong role=R"
 *   state   -> "role=R pid=P ppid=PP uid=R,E,S gen=N ok=0|1 digest=HEX nnp=0|1 tids=T1,T2..."
 *              ok=1 when every byte of the buffers is what generation N must hold; digest is
 *              FNV-1a 64 of both buffers; nnp is what prctl(PR_GET_NO_NEW_PRIVS) answers
 *   kernel  -> "nnp=A,B..." the NoNewPrivs line of /proc/self/task/T/status of every thread,
 *              in TID order (what the kernel holds, whatever prctl answers)
 *   gen N   -> writes generation N if it is newer than the one held; "gen=N"
 *   nnp     -> prctl(PR_SET_NO_NEW_PRIVS, 1): "nnp-set=0" (or "nnp-set=-1 errno=E")
 *
 *   unpriv [--port P]   (default 7700)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "generation.h"
#include "udp.h"

#define NOBODY 65534

static void die(const char *what) {
    perror(what);
    exit(2);
}

/* The process's thread ids, ascending. Returns how many (at most 64). */
static int thread_ids(long *ids) {
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
    return n;
}

/* "T1,T2,..." */
static void tid_list(char *out, size_t len) {
    long ids[64];
    int n = thread_ids(ids);
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at < len; i++)
        at += snprintf(out + at, len - at, i ? ",%ld" : "%ld", ids[i]);
}

/* The NoNewPrivs value of every thread's status, "A,B,..." in TID order. */
static void kernel_nnp(char *out, size_t len) {
    long ids[64];
    int n = thread_ids(ids);
    size_t at = 0;
    out[0] = 0;
    for (int i = 0; i < n && at < len; i++) {
        char path[64], line[256];
        snprintf(path, sizeof path, "/proc/self/task/%ld/status", ids[i]);
        const char *v = "?";
        FILE *f = fopen(path, "r");
        while (f && fgets(line, sizeof line, f))
            if (strncmp(line, "NoNewPrivs:", 11) == 0) {
                v = strchr(line, '1') ? "1" : "0";
                break;
            }
        if (f) fclose(f);
        at += snprintf(out + at, len - at, i ? ",%s" : "%s", v);
    }
}

static void *waiter(void *arg) {
    (void)arg;
    for (;;) pause();
    return NULL;
}

static void drop_to_nobody(void) {
    if (setgroups(0, NULL) < 0) die("setgroups");
    if (setresgid(NOBODY, NOBODY, NOBODY) < 0) die("setresgid");
    if (setresuid(NOBODY, NOBODY, NOBODY) < 0) die("setresuid");
}

static void serve(int port) {
    heap = malloc(HEAP_LEN);
    if (!heap) die("malloc");
    write_generation(1);
    if (role == 1) {
        pthread_t t;
        if (pthread_create(&t, NULL, waiter, NULL) != 0) die("pthread_create");
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
            tid_list(tids, sizeof tids);
            uid_t r, e, su;
            getresuid(&r, &e, &su);
            snprintf(out, sizeof out,
                     "role=%d pid=%ld ppid=%ld uid=%d,%d,%d gen=%ld ok=%d digest=%016llx nnp=%d tids=%s",
                     role, (long)syscall(SYS_getpid), (long)getppid(), (int)r, (int)e, (int)su,
                     generation, consistent(), (unsigned long long)digest(),
                     prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), tids);
        } else if (strcmp(buf, "kernel") == 0) {
            char v[256];
            kernel_nnp(v, sizeof v);
            snprintf(out, sizeof out, "nnp=%s", v);
        } else if (strncmp(buf, "gen ", 4) == 0) {
            long g = atol(buf + 4);
            if (g > generation) write_generation(g);
            snprintf(out, sizeof out, "gen=%ld", generation);
        } else if (strcmp(buf, "nnp") == 0) {
            int rc = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
            if (rc == 0)
                snprintf(out, sizeof out, "nnp-set=0");
            else
                snprintf(out, sizeof out, "nnp-set=%d errno=%d", rc, errno);
        } else {
            snprintf(out, sizeof out, "unknown command");
        }
        udp_reply(s, out, strlen(out), &from);
    }
}

int main(int argc, char **argv) {
    int port = 7700;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);
    for (int r = 1; r <= 2; r++) {
        pid_t c = fork();
        if (c < 0) die("fork");
        if (c > 0) continue;
        role = r;
        drop_to_nobody();
        serve(port);
    }
    serve(port);
    return 0;
}
