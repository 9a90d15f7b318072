/* Every kind of unix-domain socket Tardi restores, with bytes queued, plus a file in /tmp
 * written and mapped MAP_SHARED. Answers UDP on port 7000:
 *   ping   -> pong
 *   state  -> one line describing every socket (type, names, bytes queued) and the /tmp
 *             files (names, sizes, content hashes), the mapped counter, and the credentials;
 *             reading it changes nothing
 *   tick   -> the counter in the shared mapping + 1, and a new file /tmp/tick<N>
 *   drain  -> receives everything queued, in order, then sends a message through every pair
 *             and accepts the pending connection; reports what it read
 * Build: gcc -O1 -o unixsock unixsock.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <stdarg.h>
#include <stddef.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define REPLY_SIZE 65536
#include "reply.h"
#include "udp.h"

enum { STREAM_A, STREAM_B, DGRAM_A, DGRAM_B, SEQ_A, SEQ_B, LISTENER, CLIENT, ACCEPTED,
       PENDING, ABSTRACT, UNBOUND, NSOCK };
static const char *names[NSOCK] = {"stream_a", "stream_b", "dgram_a", "dgram_b", "seq_a",
                                   "seq_b", "listener", "client", "accepted", "pending",
                                   "abstract", "unbound"};
static int fds[NSOCK];
static volatile uint64_t *counter;

static void sendstr(int fd, const char *s) {
    if (send(fd, s, strlen(s), MSG_DONTWAIT) != (ssize_t)strlen(s)) die("send");
}

static socklen_t sun_path(struct sockaddr_un *a, const char *p, int abstract) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(p);
    memcpy(a->sun_path + (abstract ? 1 : 0), p, n);
    return offsetof(struct sockaddr_un, sun_path) + n + (abstract ? 1 : 1);
}

static void addr_str(int fd, int peer) {
    struct sockaddr_un a;
    socklen_t l = sizeof a;
    memset(&a, 0, sizeof a);
    int r = peer ? getpeername(fd, (struct sockaddr *)&a, &l) : getsockname(fd, (struct sockaddr *)&a, &l);
    if (r < 0) { put("-"); return; }
    size_t n = l - offsetof(struct sockaddr_un, sun_path);
    if (l <= offsetof(struct sockaddr_un, sun_path)) put("unnamed");
    else if (a.sun_path[0] == 0) put("@%.*s", (int)n - 1, a.sun_path + 1);
    else put("%s", a.sun_path);
}

static uint64_t hash(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void state(void) {
    for (int i = 0; i < NSOCK; i++) {
        int ty = 0, acc = 0, q = 0;
        socklen_t l = sizeof ty;
        getsockopt(fds[i], SOL_SOCKET, SO_TYPE, &ty, &l);
        l = sizeof acc;
        getsockopt(fds[i], SOL_SOCKET, SO_ACCEPTCONN, &acc, &l);
        if (!acc) ioctl(fds[i], FIONREAD, &q);
        put("%s:%d:%d:%d:", names[i], ty, acc, q);
        addr_str(fds[i], 0);
        put(">");
        addr_str(fds[i], 1);
        put(" ");
    }
    struct stat st;
    put("sockfile=%s ", stat("/tmp/srv.sock", &st) == 0 && S_ISSOCK(st.st_mode) ? "sock" : "none");
    DIR *d = opendir("/tmp");
    if (!d) die("opendir");
    struct dirent *e;
    char *list[256];
    int n = 0;
    while ((e = readdir(d)) && n < 256)
        if (e->d_name[0] != '.') list[n++] = strdup(e->d_name);
    closedir(d);
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(list[i], list[j]) > 0) { char *t = list[i]; list[i] = list[j]; list[j] = t; }
    for (int i = 0; i < n; i++) {
        char p[300];
        snprintf(p, sizeof p, "/tmp/%s", list[i]);
        int f = open(p, O_RDONLY);
        unsigned char buf[65536];
        ssize_t r = f >= 0 ? read(f, buf, sizeof buf) : -1;
        if (f >= 0) close(f);
        put("%s=%zd:%016llx ", list[i], r, r > 0 ? (unsigned long long)hash(buf, r) : 0ull);
        free(list[i]);
    }
    put("counter=%llu uid=%d/%d gid=%d/%d", (unsigned long long)*counter, getuid(), geteuid(),
        getgid(), getegid());
}

static void drain_one(int i) {
    put("%s[", names[i]);
    char buf[4096];
    for (;;) {
        ssize_t r = recv(fds[i], buf, sizeof buf, MSG_DONTWAIT);
        if (r < 0) break;
        if (r == 0) { put("EOF"); break; }
        put("%.*s|", (int)r, buf);
    }
    put("] ");
}

static void talk(int a, int b, const char *msg) {
    sendstr(fds[a], msg);
    char buf[256];
    ssize_t r = recv(fds[b], buf, sizeof buf, 0);
    put("%s->%s:%.*s ", names[a], names[b], r > 0 ? (int)r : 0, buf);
}

static void drain(void) {
    for (int i = 0; i < NSOCK; i++)
        if (i != LISTENER) drain_one(i);
    talk(STREAM_A, STREAM_B, "s1");
    talk(STREAM_B, STREAM_A, "s2");
    talk(DGRAM_A, DGRAM_B, "d1");
    talk(DGRAM_B, DGRAM_A, "d2");
    talk(SEQ_A, SEQ_B, "q1");
    talk(SEQ_B, SEQ_A, "q2");
    talk(CLIENT, ACCEPTED, "c1");
    talk(ACCEPTED, CLIENT, "c2");
    int p = accept4(fds[LISTENER], NULL, NULL, SOCK_NONBLOCK);
    put("pending_accepted=%d ", p >= 0);
    if (p >= 0) {
        sendstr(fds[PENDING], "p1");
        char buf[16];
        usleep(1000);
        ssize_t r = recv(p, buf, sizeof buf, MSG_DONTWAIT);
        put("pending->accepted:%.*s ", r > 0 ? (int)r : 0, buf);
        close(p);
    }
    struct sockaddr_un a;
    socklen_t al = sun_path(&a, "tardi-test-abstract", 1);
    int t = socket(AF_UNIX, SOCK_DGRAM, 0);
    sendto(t, "a3", 2, 0, (struct sockaddr *)&a, al);
    close(t);
    char buf[16];
    ssize_t r = recv(fds[ABSTRACT], buf, sizeof buf, MSG_DONTWAIT);
    put("abstract_again:%.*s", r > 0 ? (int)r : 0, buf);
}

int main(void) {
    int sv[2];
    const int types[3] = {SOCK_STREAM, SOCK_DGRAM, SOCK_SEQPACKET};
    const char *tag[3] = {"S", "D", "Q"};
    for (int t = 0; t < 3; t++) {
        if (socketpair(AF_UNIX, types[t], 0, sv) < 0) die("socketpair");
        fds[2 * t] = sv[0];
        fds[2 * t + 1] = sv[1];
        char m[32];
        for (int k = 1; k <= 3; k++) {
            snprintf(m, sizeof m, "%s-a2b-%d", tag[t], k);
            sendstr(sv[0], m);
        }
        snprintf(m, sizeof m, "%s-b2a-1", tag[t]);
        sendstr(sv[1], m);
    }
    unlink("/tmp/srv.sock");
    struct sockaddr_un a;
    socklen_t al = sun_path(&a, "/tmp/srv.sock", 0);
    fds[LISTENER] = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(fds[LISTENER], (struct sockaddr *)&a, al) < 0) die("bind");
    if (listen(fds[LISTENER], 16) < 0) die("listen");
    fds[CLIENT] = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fds[CLIENT], (struct sockaddr *)&a, al) < 0) die("connect");
    fds[ACCEPTED] = accept(fds[LISTENER], NULL, NULL);
    if (fds[ACCEPTED] < 0) die("accept");
    sendstr(fds[CLIENT], "hello-from-client");
    sendstr(fds[ACCEPTED], "hello-from-server");
    sendstr(fds[ACCEPTED], "+more");
    fds[PENDING] = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fds[PENDING], (struct sockaddr *)&a, al) < 0) die("connect pending");
    fds[ABSTRACT] = socket(AF_UNIX, SOCK_DGRAM, 0);
    al = sun_path(&a, "tardi-test-abstract", 1);
    if (bind(fds[ABSTRACT], (struct sockaddr *)&a, al) < 0) die("bind abstract");
    int t = socket(AF_UNIX, SOCK_DGRAM, 0);
    sendto(t, "a1", 2, 0, (struct sockaddr *)&a, al);
    sendto(t, "a2-longer", 9, 0, (struct sockaddr *)&a, al);
    close(t);
    fds[UNBOUND] = socket(AF_UNIX, SOCK_DGRAM, 0);

    int f = open("/tmp/mapped", O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (f < 0) die("open /tmp/mapped");
    char page[8192];
    for (size_t i = 0; i < sizeof page; i++) page[i] = (char)('a' + i % 26);
    if (write(f, page, sizeof page) != sizeof page) die("write");
    char *m = mmap(NULL, sizeof page, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
    if (m == MAP_FAILED) die("mmap");
    close(f);
    counter = (volatile uint64_t *)(m + 4096);
    *counter = 1;
    FILE *w = fopen("/tmp/written", "w");
    fprintf(w, "written before the checkpoint\n");
    fclose(w);

    int u = udp_bound(7000);
    if (u < 0) die("bind udp");
    for (;;) {
        char req[256];
        struct udp_peer from;
        udp_request(u, req, sizeof req, &from);
        olen = 0;
        out[0] = 0;
        if (!strcmp(req, "ping")) put("pong");
        else if (!strcmp(req, "state")) state();
        else if (!strcmp(req, "drain")) drain();
        else if (!strcmp(req, "tick")) {
            *counter += 1;
            char p[64];
            snprintf(p, sizeof p, "/tmp/tick%llu", (unsigned long long)*counter);
            FILE *tf = fopen(p, "w");
            fprintf(tf, "tick %llu\n", (unsigned long long)*counter);
            fclose(tf);
            put("ticked %llu", (unsigned long long)*counter);
        } else if (!strcmp(req, "exit")) exit(0);
        else put("unknown");
        udp_reply(u, out, olen, &from);
    }
}
