/*
 * sharedfds: a parent and two children that share open file descriptions, for
 * tests/process_tree.rs (process trees, phase 2a). Before forking, the parent (role 0) opens
 *
 *   - a listening TCP socket on PORT (both children accept on it, each in its main thread,
 *     blocking: the kernel wakes one waiter per connection, the one that waited longest);
 *   - a pipe with PIPE_DATA written into it and left there (its read end non-blocking);
 *   - /tmp/sharedfds.log, read-write, with "init\n" written (offset 5);
 *   - a connected pair of unix stream sockets with UNIX_DATA sent from the first end and not
 *     received yet, and a unix listener at /tmp/sharedfds.sock;
 *   - a second pipe, which only roles 1 (its read end) and 2 (its write end) keep: the parent
 *     closes it once they are forked;
 *
 * then forks roles 1 and 2, which inherit all of them. A connection accepted by role R gets
 * "served role=R pid=P\n" and is closed. Each process answers commands on UDP port
 * PORT + 1 + role (one datagram each; role 0 in its main thread, the children in a second
 * thread):
 *
 *   ping         -> "pong role=R"
 *   fds          -> "role=R pid=P listen=L pipe=RD,WR file=F pair=A,B ulisten=U q=RD,WR"
 *                   (-1: closed)
 *   readpipe N   -> "pipe=BYTES": at most 5 bytes read from the pipe (none when it is empty)
 *   write N TEXT -> writes TEXT to the file at the shared offset: "off=N" (the offset after)
 *   off          -> "off=N": the file's offset as this process sees it
 *   usend N TEXT -> sends TEXT from the pair's first end: "sent=K"
 *   urecv N      -> "unix=BYTES": at most 5 bytes received on the pair's second end
 *   qwrite N TEXT -> writes TEXT into the second pipe (role 2): "sent=K"
 *   qread N      -> "q=BYTES": at most 5 bytes read from the second pipe (role 1)
 *   closefile    -> closes this process's descriptor of the file: "file=-1"
 *
 * N makes those two commands unique: one equal to the last one (the client sent it again, its
 * reply late or lost) gets the last reply again instead of reading or writing twice.
 *
 *   sharedfds [--port P]   (default 7400)
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>
#include "udp.h"

#define PIPE_DATA "0123456789abcdefghij"
#define UNIX_DATA "UNIXQ"

static int role, port, listen_fd, pipe_fd[2], file_fd, pair[2], ulisten_fd, q[2];

static void die(const char *what) {
    perror(what);
    exit(2);
}

static void *control(void *arg) {
    (void)arg;
    int s = udp_bound(port + 1 + role);
    if (s < 0) die("bind control");
    for (;;) {
        char buf[256];
        struct udp_peer from;
        udp_request(s, buf, sizeof buf, &from);
        static char last_cmd[256], last_out[512];
        char out[512];
        int numbered = strncmp(buf, "readpipe ", 9) == 0 || strncmp(buf, "write ", 6) == 0 ||
                       strncmp(buf, "usend ", 6) == 0 || strncmp(buf, "urecv ", 6) == 0 ||
                       strncmp(buf, "qwrite ", 7) == 0 || strncmp(buf, "qread ", 6) == 0;
        if (numbered && strcmp(buf, last_cmd) == 0) {
            udp_reply(s, last_out, strlen(last_out), &from);
            continue;
        }
        if (strcmp(buf, "ping") == 0) {
            snprintf(out, sizeof out, "pong role=%d", role);
        } else if (strcmp(buf, "fds") == 0) {
            snprintf(out, sizeof out, "role=%d pid=%ld listen=%d pipe=%d,%d file=%d pair=%d,%d ulisten=%d q=%d,%d",
                     role, (long)syscall(SYS_getpid), listen_fd, pipe_fd[0], pipe_fd[1], file_fd, pair[0], pair[1],
                     ulisten_fd, q[0], q[1]);
        } else if (strncmp(buf, "readpipe ", 9) == 0) {
            char got[6] = {0};
            ssize_t k = read(pipe_fd[0], got, 5);
            snprintf(out, sizeof out, "pipe=%s", k > 0 ? got : "");
        } else if (strncmp(buf, "write ", 6) == 0 && strchr(buf + 6, ' ')) {
            const char *text = strchr(buf + 6, ' ') + 1;
            ssize_t k = write(file_fd, text, strlen(text));
            snprintf(out, sizeof out, "off=%ld", k < 0 ? -1L : (long)lseek(file_fd, 0, SEEK_CUR));
        } else if (strncmp(buf, "usend ", 6) == 0 && strchr(buf + 6, ' ')) {
            const char *text = strchr(buf + 6, ' ') + 1;
            snprintf(out, sizeof out, "sent=%ld", (long)send(pair[0], text, strlen(text), MSG_DONTWAIT));
        } else if (strncmp(buf, "urecv ", 6) == 0) {
            char got[6] = {0};
            ssize_t k = recv(pair[1], got, 5, MSG_DONTWAIT);
            snprintf(out, sizeof out, "unix=%s", k > 0 ? got : "");
        } else if (strncmp(buf, "qwrite ", 7) == 0 && strchr(buf + 7, ' ')) {
            const char *text = strchr(buf + 7, ' ') + 1;
            snprintf(out, sizeof out, "sent=%ld", (long)write(q[1], text, strlen(text)));
        } else if (strncmp(buf, "qread ", 6) == 0) {
            char got[6] = {0};
            ssize_t k = read(q[0], got, 5);
            snprintf(out, sizeof out, "q=%s", k > 0 ? got : "");
        } else if (strcmp(buf, "off") == 0) {
            snprintf(out, sizeof out, "off=%ld", (long)lseek(file_fd, 0, SEEK_CUR));
        } else if (strcmp(buf, "closefile") == 0) {
            /* This process's copy of the shared file goes (the others keep theirs). */
            if (file_fd >= 0) close(file_fd);
            file_fd = -1;
            snprintf(out, sizeof out, "file=-1");
        } else {
            snprintf(out, sizeof out, "unknown command");
        }
        if (numbered) {
            snprintf(last_cmd, sizeof last_cmd, "%s", buf);
            snprintf(last_out, sizeof last_out, "%s", out);
        }
        udp_reply(s, out, strlen(out), &from);
    }
    return NULL;
}

static void serve_connections(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, control, NULL) != 0) die("pthread_create");
    for (;;) {
        int c = accept(listen_fd, NULL, NULL);
        if (c < 0) {
            if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
            die("accept");
        }
        char out[128];
        int len = snprintf(out, sizeof out, "served role=%d pid=%ld\n", role, (long)syscall(SYS_getpid));
        if (write(c, out, len) < 0) { /* the client went away: nothing to do */ }
        close(c);
    }
}

int main(int argc, char **argv) {
    port = 7400;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);

    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd < 0) die("socket");
    int one = 1;
    setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    a.sin_addr.s_addr = htonl(INADDR_ANY);
    if (bind(listen_fd, (struct sockaddr *)&a, sizeof a) < 0) die("bind");
    if (listen(listen_fd, 64) < 0) die("listen");

    if (pipe(pipe_fd) < 0) die("pipe");
    if (fcntl(pipe_fd[0], F_SETFL, O_NONBLOCK) < 0) die("fcntl");
    if (write(pipe_fd[1], PIPE_DATA, strlen(PIPE_DATA)) != (ssize_t)strlen(PIPE_DATA)) die("write pipe");

    file_fd = open("/tmp/sharedfds.log", O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (file_fd < 0) die("open");
    if (write(file_fd, "init\n", 5) != 5) die("write file");

    if (socketpair(AF_UNIX, SOCK_STREAM, 0, pair) < 0) die("socketpair");
    if (send(pair[0], UNIX_DATA, strlen(UNIX_DATA), 0) != (ssize_t)strlen(UNIX_DATA)) die("send");
    ulisten_fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un u = {.sun_family = AF_UNIX, .sun_path = "/tmp/sharedfds.sock"};
    unlink(u.sun_path);
    if (ulisten_fd < 0 || bind(ulisten_fd, (struct sockaddr *)&u, sizeof u) < 0) die("bind unix");
    if (listen(ulisten_fd, 8) < 0) die("listen unix");
    if (pipe2(q, O_NONBLOCK) < 0) die("pipe2");

    for (int r = 1; r <= 2; r++) {
        pid_t c = fork();
        if (c < 0) die("fork");
        if (c == 0) {
            role = r;
            /* Role 1 keeps the second pipe's read end, role 2 its write end. */
            int drop = r == 1 ? 1 : 0;
            close(q[drop]);
            q[drop] = -1;
            serve_connections();
        }
    }
    role = 0;
    close(q[0]);
    close(q[1]);
    q[0] = q[1] = -1;
    control(NULL);
    return 0;
}
