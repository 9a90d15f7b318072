/* POSIX timers, interval timers, seccomp filters of its own and inotify watches, for
 * tests/timers_seccomp_inotify.rs. Two threads: main (serves UDP port 7000, reads inotify) and
 * a worker (its own timer, its own extra filter).
 *
 * At start:
 *   - POSIX timers (a filler is created and deleted first, so ids do not start at 0):
 *       A  SIGEV_SIGNAL, SIGRTMIN, every 20 ms, sigev_value 0xA      -> ticks_a
 *       B  SIGEV_THREAD_ID (the worker), SIGRTMIN+1, every 30 ms     -> ticks_b (wrong_thread
 *          counts deliveries to another thread)
 *       N  SIGEV_NONE, one shot in 1000 s                            -> none_left_ms
 *   - ITIMER_REAL every 50 ms (SIGALRM -> alarms); ITIMER_VIRTUAL one shot in 500 s of CPU
 *     time (never fires here -> virt_left_s).
 *   - seccomp (no_new_privs): F1 in main before the worker exists (both threads have it):
 *     getppid fails with errno 77, and sigaltstack kills the process (the program never calls
 *     it; a checkpointer reads the alternate signal stack with an injected sigaltstack: its
 *     filters must not apply to it); F2 in the worker only: getpgid fails with errno 78.
 *   - inotify: a watch on /tmp/gone (wd 1) removed at once, then /tmp/watched IN_MODIFY (wd 2)
 *     and /tmp IN_CREATE (wd 3).
 * Commands (UDP, one datagram each way):
 *   ping  -> pong
 *   state -> "ids=A,B,N[,C] ticks_a= ticks_b= ticks_c= alarms= wrong_thread= bad_value=
 *            none_left_ms= virt_left_s= ppid=ret/errno mpgid=ret/errno wpgid=ret/errno
 *            sid=ret/errno wds=2,3[,4] ev_watched= ev_created= ev_second="
 *            (ret/errno: -1/E when the call failed with E, else ok/0)
 *   more  -> creates timer C (SIGRTMIN+2, every 25 ms -> ticks_c), installs F3 in main only
 *            (getsid fails with errno 79), watches /tmp/second (IN_MODIFY, wd 4); replies "more"
 *   hold  -> blocks SIGALRM in main (the worker always does): once ITIMER_REAL expires its
 *            SIGALRM stays pending, and the kernel re-arms the timer only when the signal is
 *            taken, so getitimer reads a value of 0 meanwhile; replies "hold"
 *   release -> unblocks it; replies "release"
 * Build: gcc -O2 -pthread -o timers timers.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "reply.h"

static volatile sig_atomic_t ticks_a, ticks_b, ticks_c, alarms, wrong_thread, bad_value;
static volatile pid_t worker_tid;
static volatile int wpgid_ret, wpgid_errno;
static timer_t ta, tb, tn, tc;
static int have_c;
static int ino, wd_watched, wd_tmp, wd_second = -1;
static long ev_watched, ev_created, ev_second;

static void on_timer(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    if (si->si_code != SI_TIMER) { bad_value++; return; }
    if (sig == SIGRTMIN) {
        if (si->si_value.sival_ptr != (void *)0xA) bad_value++;
        ticks_a++;
    } else if (sig == SIGRTMIN + 1) {
        if (syscall(SYS_gettid) != worker_tid) wrong_thread++;
        ticks_b++;
    } else if (sig == SIGRTMIN + 2) {
        ticks_c++;
    }
}

static void on_alarm(int sig) { (void)sig; alarms++; }

static void handle(int sig, void (*h)(int, siginfo_t *, void *)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = h;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    if (sigaction(sig, &sa, NULL) < 0) die("sigaction");
}

/* A filter: calls `nr` fail with `err`, calls `kill_nr` kill the process, everything else
 * passes (x86-64 only). */
static void deny(int nr, int err, int kill_nr) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (err & SECCOMP_RET_DATA)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, kill_nr, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog p = {.len = sizeof f / sizeof f[0], .filter = f};
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &p) != 0) die("seccomp");
}

static timer_t make_timer(clockid_t clock, int notify, int sig, void *val, pid_t tid) {
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = notify;
    sev.sigev_signo = sig;
    sev.sigev_value.sival_ptr = val;
    if (notify == SIGEV_THREAD_ID) sev._sigev_un._tid = tid;
    timer_t t;
    if (timer_create(clock, &sev, &t) != 0) die("timer_create");
    return t;
}

static void arm(timer_t t, long value_ms, long interval_ms) {
    struct itimerspec its = {{interval_ms / 1000, (interval_ms % 1000) * 1000000},
                             {value_ms / 1000, (value_ms % 1000) * 1000000}};
    if (timer_settime(t, 0, &its, NULL) != 0) die("timer_settime");
}

static void *worker(void *arg) {
    (void)arg;
    worker_tid = syscall(SYS_gettid);
    /* Process-directed signals go to main. */
    sigset_t s;
    sigemptyset(&s);
    sigaddset(&s, SIGRTMIN);
    sigaddset(&s, SIGRTMIN + 2);
    sigaddset(&s, SIGALRM);
    pthread_sigmask(SIG_BLOCK, &s, NULL);
    deny(SYS_getpgid, 78, -1);
    for (;;) {
        long r = syscall(SYS_getpgid, 0);
        wpgid_errno = r < 0 ? errno : 0;
        wpgid_ret = r < 0 ? -1 : 0;
        pause();
    }
    return NULL;
}

static void call(const char *name, long nr) {
    errno = 0;
    long r = syscall(nr, 0);
    if (r < 0) put(" %s=-1/%d", name, errno);
    else put(" %s=ok/0", name);
}

static void touch(const char *p) {
    int fd = open(p, O_CREAT | O_WRONLY, 0644);
    if (fd < 0) die(p);
    close(fd);
}

static void state(void) {
    struct itimerspec its;
    long none_left = timer_gettime(tn, &its) == 0
                         ? its.it_value.tv_sec * 1000 + its.it_value.tv_nsec / 1000000
                         : -1;
    struct itimerval iv;
    long virt = getitimer(ITIMER_VIRTUAL, &iv) == 0 ? iv.it_value.tv_sec : -1;
    put("ids=%ld,%ld,%ld", (long)(intptr_t)ta, (long)(intptr_t)tb, (long)(intptr_t)tn);
    if (have_c) put(",%ld", (long)(intptr_t)tc);
    put(" ticks_a=%ld ticks_b=%ld ticks_c=%ld alarms=%ld wrong_thread=%ld bad_value=%ld",
        (long)ticks_a, (long)ticks_b, (long)ticks_c, (long)alarms, (long)wrong_thread,
        (long)bad_value);
    put(" none_left_ms=%ld virt_left_s=%ld", none_left, virt);
    /* Timer A's setting (diagnostics: disarmed, or armed with its signal never arriving?),
     * and SIGRTMIN pending or blocked in this thread. */
    long a_left_us = -1, a_iv_us = -1;
    if (timer_gettime(ta, &its) == 0) {
        a_left_us = its.it_value.tv_sec * 1000000 + its.it_value.tv_nsec / 1000;
        a_iv_us = its.it_interval.tv_sec * 1000000 + its.it_interval.tv_nsec / 1000;
    }
    sigset_t pend, cur;
    sigpending(&pend);
    pthread_sigmask(SIG_BLOCK, NULL, &cur);
    put(" a_left_us=%ld a_iv_us=%ld rtmin_pending=%d rtmin_blocked=%d", a_left_us, a_iv_us,
        sigismember(&pend, SIGRTMIN), sigismember(&cur, SIGRTMIN));
    call("ppid", SYS_getppid);
    call("mpgid", SYS_getpgid);
    put(" wpgid=%d/%d", wpgid_ret, wpgid_errno);
    call("sid", SYS_getsid);
    put(" wds=%d,%d", wd_watched, wd_tmp);
    if (wd_second >= 0) put(",%d", wd_second);
    put(" ev_watched=%ld ev_created=%ld ev_second=%ld", ev_watched, ev_created, ev_second);
}

static void read_events(void) {
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    for (;;) {
        ssize_t n = read(ino, buf, sizeof buf);
        if (n <= 0) return;
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *e = (struct inotify_event *)p;
            if (e->wd == wd_watched && (e->mask & IN_MODIFY)) ev_watched++;
            if (e->wd == wd_tmp && (e->mask & IN_CREATE)) ev_created++;
            if (e->wd == wd_second && (e->mask & IN_MODIFY)) ev_second++;
            p += sizeof *e + e->len;
        }
    }
}

int main(void) {
    handle(SIGRTMIN, on_timer);
    handle(SIGRTMIN + 1, on_timer);
    handle(SIGRTMIN + 2, on_timer);
    signal(SIGALRM, on_alarm);

    /* inotify first (the filler watch's IN_IGNORED is read by the loop). */
    touch("/tmp/watched");
    touch("/tmp/gone");
    touch("/tmp/second");
    ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (ino < 0) die("inotify_init1");
    int gone = inotify_add_watch(ino, "/tmp/gone", IN_MODIFY);
    if (gone < 0 || inotify_rm_watch(ino, gone) != 0) die("inotify filler");
    wd_watched = inotify_add_watch(ino, "/tmp/watched", IN_MODIFY);
    wd_tmp = inotify_add_watch(ino, "/tmp", IN_CREATE);
    if (wd_watched < 0 || wd_tmp < 0) die("inotify_add_watch");

    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) die("no_new_privs");
    deny(SYS_getppid, 77, SYS_sigaltstack);

    pthread_t th;
    if (pthread_create(&th, NULL, worker, NULL) != 0) die("pthread_create");
    while (!worker_tid) usleep(1000);

    timer_t filler = make_timer(CLOCK_MONOTONIC, SIGEV_NONE, 0, NULL, 0);
    ta = make_timer(CLOCK_MONOTONIC, SIGEV_SIGNAL, SIGRTMIN, (void *)0xA, 0);
    timer_delete(filler);
    tb = make_timer(CLOCK_MONOTONIC, SIGEV_THREAD_ID, SIGRTMIN + 1, (void *)0xB, worker_tid);
    tn = make_timer(CLOCK_REALTIME, SIGEV_NONE, 0, NULL, 0);
    arm(ta, 20, 20);
    arm(tb, 30, 30);
    arm(tn, 1000 * 1000, 0);
    struct itimerval real = {{0, 50000}, {0, 50000}}, virt = {{0, 0}, {500, 0}};
    if (setitimer(ITIMER_REAL, &real, NULL) || setitimer(ITIMER_VIRTUAL, &virt, NULL))
        die("setitimer");

    int s = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(7000)};
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    for (;;) {
        struct pollfd p[2] = {{s, POLLIN, 0}, {ino, POLLIN, 0}};
        if (poll(p, 2, 1000) < 0) {
            if (errno == EINTR) continue;
            die("poll");
        }
        if (p[1].revents) read_events();
        if (!p[0].revents) continue;
        char req[256];
        struct sockaddr_in from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(s, req, sizeof req - 1, MSG_DONTWAIT, (struct sockaddr *)&from, &fl);
        if (n < 0) continue;
        req[n] = 0;
        olen = 0;
        out[0] = 0;
        if (strcmp(req, "ping") == 0) {
            put("pong");
        } else if (strcmp(req, "state") == 0) {
            read_events();
            state();
        } else if (strcmp(req, "hold") == 0 || strcmp(req, "release") == 0) {
            sigset_t a;
            sigemptyset(&a);
            sigaddset(&a, SIGALRM);
            pthread_sigmask(req[0] == 'h' ? SIG_BLOCK : SIG_UNBLOCK, &a, NULL);
            put("%s", req);
        } else if (strcmp(req, "more") == 0) {
            if (!have_c) {
                tc = make_timer(CLOCK_MONOTONIC, SIGEV_SIGNAL, SIGRTMIN + 2, NULL, 0);
                arm(tc, 25, 25);
                have_c = 1;
                deny(SYS_getsid, 79, -1);
                wd_second = inotify_add_watch(ino, "/tmp/second", IN_MODIFY);
            }
            put("more");
        } else {
            put("unknown");
        }
        sendto(s, out, olen, 0, (struct sockaddr *)&from, fl);
    }
}
