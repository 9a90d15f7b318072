/*
 * bad_resources: a small UDP service that holds one resource the checkpointer cannot (yet)
 * capture, for tests/bad_inputs.rs. `tardi snapshot` of it must fail with a message naming the
 * resource, and the service must keep running afterwards.
 *
 *   bad_resources [--port N] MODE
 *
 * MODE (what the process holds while it serves):
 *   none            nothing unusual (a control case: snapshots work)
 *   unixsock        a connected AF_UNIX socketpair with a descriptor in flight in it (SCM_RIGHTS,
 *                   sent, not received yet)
 *   shared-epoll    a forked child process (pauses forever) that shares an epoll instance
 *                   with us (one open file description held by two processes, whose interest
 *                   list names our descriptor numbers)
 *   zombie-core     a child that dumped core (SIGABRT, core file in /dev/shm) and is never reaped
 *   orphan          a grandchild process (pauses forever) whose parent, our child, exited: it
 *                   is reparented to the sandbox's init, so it is no child of the service
 *   unlinked-private  a POSIX shared memory object mapped privately (MAP_PRIVATE) and then
 *                   unlinked (shm_unlink); one mapped shared is captured
 *   sysv-tail       a System V attachment whose first page was unmapped
 *   memfd           an open memfd
 *   pending-signal  SIGUSR1, SIGUSR2 and SIGRTMIN blocked; SIGUSR1 and SIGRTMIN (twice, values
 *                   42 and 43) queued to the process, SIGUSR2 to the main thread alone. "ping"
 *                   reports what is pending now; "drain" takes every pending one
 *                   (sigtimedwait) and answers "drained" and the list, in the order taken
 *   inotify-queued  an inotify watch on / with an IN_OPEN event queued, never read
 *
 * Protocol (UDP, default port 7100): "ping" -> "pong <n> <mode> <detail>" where n counts the
 * pings answered so far (including this one); "exit" -> "bye", then exit(0).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* pending-signal mode: the detail of each pong is what is pending at that moment. */
static int pending_mode;

static void pending_detail(char *out, size_t len) {
    sigset_t p;
    sigpending(&p);
    snprintf(out, len, "pending=%s%s%s", sigismember(&p, SIGUSR1) ? "SIGUSR1," : "",
             sigismember(&p, SIGUSR2) ? "SIGUSR2," : "", sigismember(&p, SIGRTMIN) ? "SIGRTMIN" : "");
}

/* Takes every pending signal of the three, reporting each (an RT one with its value). */
static int drain(char *out, size_t len) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGUSR1);
    sigaddset(&set, SIGUSR2);
    sigaddset(&set, SIGRTMIN);
    struct timespec zero = {0, 0};
    int n = snprintf(out, len, "drained");
    siginfo_t si;
    while (sigtimedwait(&set, &si, &zero) > 0) {
        if (si.si_signo == SIGRTMIN)
            n += snprintf(out + n, len - n, " SIGRTMIN:%d", si.si_value.sival_int);
        else
            n += snprintf(out + n, len - n, " %s", si.si_signo == SIGUSR1 ? "SIGUSR1" : "SIGUSR2");
    }
    return n;
}

static void die(const char *what) {
    perror(what);
    exit(2);
}

int main(int argc, char **argv) {
    int port = 7100;
    const char *mode = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc)
            port = atoi(argv[++i]);
        else
            mode = argv[i];
    }
    if (!mode) {
        fprintf(stderr, "usage: %s [--port N] none|unixsock|shared-epoll|zombie-core|orphan|unlinked-private|sysv-tail|memfd|pending-signal|inotify-queued\n", argv[0]);
        return 2;
    }

    char detail[128] = "-";
    if (strcmp(mode, "none") == 0) {
    } else if (strcmp(mode, "unixsock") == 0) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0) die("socketpair");
        char byte = 'x';
        struct iovec iov = {.iov_base = &byte, .iov_len = 1};
        union { struct cmsghdr h; char buf[CMSG_SPACE(sizeof(int))]; } c;
        memset(&c, 0, sizeof c);
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = c.buf,
                             .msg_controllen = sizeof c.buf};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        int passed = 0; /* stdin */
        memcpy(CMSG_DATA(cm), &passed, sizeof passed);
        if (sendmsg(sv[0], &msg, 0) != 1) die("sendmsg");
        snprintf(detail, sizeof detail, "fds=%d,%d", sv[0], sv[1]);
    } else if (strcmp(mode, "shared-epoll") == 0) {
        int p[2];
        if (pipe(p) < 0) die("pipe");
        int ep = epoll_create1(0);
        struct epoll_event ev = {.events = EPOLLIN, .data = {.fd = p[0]}};
        if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, p[0], &ev) < 0) die("epoll");
        pid_t child = fork();
        if (child < 0) die("fork");
        if (child == 0) {
            for (;;) pause();
        }
        snprintf(detail, sizeof detail, "child=%d epoll=%d", (int)child, ep);
    } else if (strcmp(mode, "zombie-core") == 0) {
        pid_t child = fork();
        if (child < 0) die("fork");
        if (child == 0) {
            struct rlimit unlimited = {RLIM_INFINITY, RLIM_INFINITY};
            setrlimit(RLIMIT_CORE, &unlimited);
            if (chdir("/dev/shm") < 0) _exit(1);
            abort();
        }
        /* Wait until it has exited, leaving it a zombie. */
        siginfo_t si;
        if (waitid(P_PID, child, &si, WEXITED | WNOWAIT) < 0) die("waitid");
        snprintf(detail, sizeof detail, "zombie=%d code=%d", (int)child, si.si_code);
    } else if (strcmp(mode, "orphan") == 0) {
        int p[2];
        if (pipe(p) < 0) die("pipe");
        pid_t child = fork();
        if (child < 0) die("fork");
        if (child == 0) {
            pid_t grandchild = fork();
            if (grandchild < 0) _exit(1);
            if (grandchild == 0) {
                close(p[0]);
                close(p[1]);
                for (;;) pause();
            }
            if (write(p[1], &grandchild, sizeof grandchild) != sizeof grandchild) _exit(1);
            _exit(0);
        }
        pid_t grandchild = 0;
        if (read(p[0], &grandchild, sizeof grandchild) != sizeof grandchild) die("read");
        close(p[0]);
        close(p[1]);
        if (waitpid(child, NULL, 0) < 0) die("waitpid");
        snprintf(detail, sizeof detail, "grandchild=%d", (int)grandchild);
    } else if (strcmp(mode, "unlinked-private") == 0) {
        int fd = shm_open("/bad-shm", O_RDWR | O_CREAT, 0600);
        if (fd < 0 || ftruncate(fd, 4096) < 0) die("shm_open");
        char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) die("mmap");
        strcpy(p, "shared");
        close(fd);
        if (shm_unlink("/bad-shm") < 0) die("shm_unlink");
        snprintf(detail, sizeof detail, "shm=%p", (void *)p);
    } else if (strcmp(mode, "sysv-tail") == 0) {
        int id = shmget(IPC_PRIVATE, 2 * 4096, IPC_CREAT | 0600);
        char *p = id < 0 ? (void *)-1 : shmat(id, NULL, 0);
        if (p == (void *)-1) die("shmat");
        strcpy(p + 4096, "tail");
        if (munmap(p, 4096) < 0) die("munmap");
        snprintf(detail, sizeof detail, "shmid=%d tail=%p", id, (void *)(p + 4096));
    } else if (strcmp(mode, "memfd") == 0) {
        int fd = memfd_create("bad-memfd", 0);
        if (fd < 0) die("memfd_create");
        snprintf(detail, sizeof detail, "memfd=%d", fd);
    } else if (strcmp(mode, "pending-signal") == 0) {
        sigset_t set;
        sigemptyset(&set);
        sigaddset(&set, SIGUSR1);
        sigaddset(&set, SIGUSR2);
        sigaddset(&set, SIGRTMIN);
        if (sigprocmask(SIG_BLOCK, &set, NULL) < 0) die("sigprocmask");
        if (kill(getpid(), SIGUSR1) != 0) die("kill");
        union sigval v = {.sival_int = 42};
        if (sigqueue(getpid(), SIGRTMIN, v) != 0) die("sigqueue");
        v.sival_int = 43;
        if (sigqueue(getpid(), SIGRTMIN, v) != 0) die("sigqueue");
        if (tgkill(getpid(), gettid(), SIGUSR2) != 0) die("tgkill");
        pending_mode = 1;
    } else if (strcmp(mode, "inotify-queued") == 0) {
        int fd = inotify_init1(IN_CLOEXEC);
        if (fd < 0 || inotify_add_watch(fd, "/", IN_OPEN) < 0) die("inotify");
        int d = open("/", O_RDONLY | O_DIRECTORY);
        if (d < 0) die("open /");
        close(d);
        snprintf(detail, sizeof detail, "inotify=%d", fd);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }

    int s = socket(AF_INET, SOCK_DGRAM, 0);
    if (s < 0) die("socket");
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port), .sin_addr = {htonl(INADDR_ANY)}};
    if (bind(s, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    printf("bad_resources: mode %s (%s), udp port %d\n", mode, detail, port);
    fflush(stdout);

    unsigned long n = 0;
    for (;;) {
        char buf[256];
        struct sockaddr_in peer;
        socklen_t plen = sizeof peer;
        ssize_t r = recvfrom(s, buf, sizeof buf - 1, 0, (struct sockaddr *)&peer, &plen);
        if (r < 0) {
            if (errno == EINTR) continue;
            die("recvfrom");
        }
        buf[r] = 0;
        char out[256];
        int len;
        if (strncmp(buf, "ping", 4) == 0) {
            n++;
            if (pending_mode) pending_detail(detail, sizeof detail);
            len = snprintf(out, sizeof out, "pong %lu %s %s", n, mode, detail);
        } else if (strncmp(buf, "drain", 5) == 0 && pending_mode) {
            len = drain(out, sizeof out);
        } else if (strncmp(buf, "exit", 4) == 0) {
            sendto(s, "bye", 3, 0, (struct sockaddr *)&peer, plen);
            return 0;
        } else {
            len = snprintf(out, sizeof out, "error: unknown request");
        }
        sendto(s, out, len, 0, (struct sockaddr *)&peer, plen);
    }
}
