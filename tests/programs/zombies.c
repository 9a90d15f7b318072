/*
 * zombies: a process tree with children that exited and were not reaped, for
 * tests/process_tree.rs. The main process (role 0) forks:
 *
 *   A  exits with status 7
 *   B  leads its own process group, then dies of SIGTERM (default action)
 *   C  leads its own session, becomes user 65534, exits with status 0
 *   role 1, a live child that forks D, which dies of SIGKILL
 *
 * and each parent waits (without reaping: waitid WNOWAIT) until its zombies have exited. Each
 * counts the SIGCHLD it received (a handler; SIGCHLD is never blocked). Commands (UDP on
 * PORT + role):
 *   ping   -> "pong role=R"
 *   state  -> "role=R pid=P sigchld=N zombies=PID:PGID:SID:UID:CODE:STATUS,..." where each
 *             zombie is peeked with waitid(WNOWAIT | WNOHANG) (CODE: si_code; STATUS: si_status;
 *             "-" for the whole entry's fields when there is nothing to peek: reaped or alive)
 *   reap   -> reaps every zombie with waitpid: "reaped=PID:STATUS,..." (STATUS in waitpid's form)
 *
 *   zombies [--port P]   (default 7500)
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include "udp.h"

static int role;
static volatile sig_atomic_t sigchld;
static pid_t zombies[3];
static int nzombies;

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void on_sigchld(int sig) {
    (void)sig;
    sigchld++;
}

/* Forks a child that runs KIND and exits; records it as a zombie to be. */
static void spawn(int kind) {
    pid_t c = fork();
    if (c < 0) die("fork");
    if (c == 0) {
        switch (kind) {
        case 'A':
            _exit(7);
        case 'B':
            setpgid(0, 0);
            signal(SIGTERM, SIG_DFL);
            raise(SIGTERM);
            _exit(99);
        case 'C':
            setsid();
            if (setresuid(65534, 65534, 65534) < 0) _exit(98);
            _exit(0);
        case 'D':
            kill(getpid(), SIGKILL);
            _exit(97);
        }
        _exit(96);
    }
    zombies[nzombies++] = c;
}

/* Waits until every zombie to be has exited, leaving each unreaped. */
static void wait_exited(void) {
    for (int i = 0; i < nzombies; i++) {
        siginfo_t si;
        while (waitid(P_PID, zombies[i], &si, WEXITED | WNOWAIT) < 0)
            ;
    }
}

static void serve(int port) {
    int s = udp_bound(port + role);
    if (s < 0) die("bind");
    char buf[256], out[1024];
    struct udp_peer from;
    for (;;) {
        udp_request(s, buf, sizeof buf, &from);
        int n = 0;
        if (strcmp(buf, "ping") == 0) {
            n = snprintf(out, sizeof out, "pong role=%d", role);
        } else if (strcmp(buf, "state") == 0) {
            n = snprintf(out, sizeof out, "role=%d pid=%d sigchld=%d zombies=", role, (int)getpid(),
                         (int)sigchld);
            for (int i = 0; i < nzombies; i++) {
                siginfo_t si;
                memset(&si, 0, sizeof si);
                pid_t z = zombies[i];
                int r = waitid(P_PID, z, &si, WEXITED | WNOWAIT | WNOHANG);
                if (r == 0 && si.si_pid == z)
                    n += snprintf(out + n, sizeof out - n, "%s%d:%d:%d:%d:%d:%d", i ? "," : "", (int)z,
                                  (int)getpgid(z), (int)getsid(z), (int)si.si_uid, si.si_code, si.si_status);
                else
                    n += snprintf(out + n, sizeof out - n, "%s%d:-", i ? "," : "", (int)z);
            }
        } else if (strcmp(buf, "reap") == 0) {
            n = snprintf(out, sizeof out, "reaped=");
            for (int i = 0; i < nzombies; i++) {
                int st = -1;
                pid_t r = waitpid(zombies[i], &st, WNOHANG);
                n += snprintf(out + n, sizeof out - n, "%s%d:%d", i ? "," : "", (int)r, r > 0 ? st : -1);
            }
        } else {
            n = snprintf(out, sizeof out, "unknown");
        }
        udp_reply(s, out, (size_t)n, &from);
    }
}

int main(int argc, char **argv) {
    int port = 7500;
    if (argc == 3 && strcmp(argv[1], "--port") == 0) port = atoi(argv[2]);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigchld;
    sa.sa_flags = SA_RESTART;
    if (sigaction(SIGCHLD, &sa, NULL) < 0) die("sigaction");
    pid_t live = fork();
    if (live < 0) die("fork");
    if (live == 0) {
        role = 1;
        spawn('D');
    } else {
        spawn('A');
        spawn('B');
        spawn('C');
    }
    wait_exited();
    serve(port);
    return 0;
}
