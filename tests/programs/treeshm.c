/*
 * treeshm: a parent and two children sharing memory, for tests/process_tree.rs (process trees,
 * shared memory). Before forking, the parent (role 0) makes
 *
 *   anon   MAP_SHARED|MAP_ANONYMOUS, 4 pages (inherited by the children);
 *   sv1    a System V IPC_PRIVATE segment, 4 pages + 100 bytes, attached and marked for
 *          removal (IPC_RMID), the attachment inherited by the children (3 attachments);
 *   sv2    a System V segment with a key, 4 pages, which the parent does not attach: each
 *          child attaches it itself after the fork (2 attachments);
 *   posix  shm_open("/tardi-tree"), 4 pages, mapped shared (the mapping inherited);
 *
 * and each child, after the fork, maps 2 pages of MAP_SHARED|MAP_ANONYMOUS memory of its own
 * ("own": an object only that process maps). Role R writes page R of every shared object it
 * maps (the parent also sv1's last 100 bytes) and both pages of its own object with bytes that
 * are a function of the object, the page and a generation; page 3 of each shared object holds
 * a marker string (see poke/peek). Each process answers one datagram per command on UDP port
 * PORT + role:
 *
 *   ping        -> "pong role=R"
 *   gen G       -> writes generation G into its pages: "gen=G"
 *   state       -> "role=R pid=P ppid=Q gen=G ok=1 anon=H sv1=H sv2=H posix=H own=H sv1id=I
 *                  sv2id=J nattch1=N nattch2=M dest1=D dest2=E": ok=1 when every written page
 *                  of every object it maps holds generation G (the test gives every process
 *                  the same one); H a hash of the whole object (0: not mapped); the
 *                  segments' ids, attachment counts and whether each is marked for removal
 *   poke O TEXT -> writes TEXT at page 3 of object O (anon, sv1, sv2, posix): "poked"
 *   peek O      -> "O=TEXT": the marker of object O as this process sees it
 *
 *   treeshm [--port P]   (default 7500)
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "reply.h"
#include "udp.h"

#define PG 4096
#define MARK (3 * PG + 64)

enum { ANON, SV1, SV2, POSIX, OWN, NOBJ };
static const char *names[NOBJ] = {"anon", "sv1", "sv2", "posix", "own"};
static const size_t sizes[NOBJ] = {4 * PG, 4 * PG + 100, 4 * PG, 4 * PG, 2 * PG};
static unsigned char *map[NOBJ];
static int role, sv1, sv2;
static unsigned long gen;

static unsigned char pattern(int o, size_t j, unsigned long g) {
    return (unsigned char)(o * 31 + (j / PG) * 17 + g * 7 + j * 13 + 1);
}

/* The byte ranges role R writes in object O: [start, end). */
static void range(int o, int r, size_t *start, size_t *end) {
    *start = *end = 0;
    if (o == OWN) {
        if (r == role) *end = sizes[OWN];
        return;
    }
    if (o == SV2 && r == 0) return;
    *start = (size_t)r * PG;
    *end = *start + PG;
}

static void write_gen(void) {
    for (int o = 0; o < NOBJ; o++) {
        if (!map[o]) continue;
        size_t s, e;
        range(o, role, &s, &e);
        for (size_t j = s; j < e; j++) map[o][j] = pattern(o, j, gen);
        if (o == SV1 && role == 0)
            for (size_t j = 4 * PG; j < sizes[SV1]; j++) map[o][j] = pattern(o, j, gen);
    }
}

static int check_gen(void) {
    for (int o = 0; o < NOBJ; o++) {
        if (!map[o]) continue;
        for (int r = 0; r < 3; r++) {
            size_t s, e;
            range(o, r, &s, &e);
            for (size_t j = s; j < e; j++)
                if (map[o][j] != pattern(o, j, gen)) return 0;
        }
        if (o == SV1)
            for (size_t j = 4 * PG; j < sizes[SV1]; j++)
                if (map[o][j] != pattern(o, j, gen)) return 0;
    }
    return 1;
}

static uint64_t hash(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; p && i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return p ? h : 0;
}

static unsigned long nattch(int id) {
    struct shmid_ds ds;
    return shmctl(id, IPC_STAT, &ds) == 0 ? (unsigned long)ds.shm_nattch : 0;
}

static int marked(int id) {
    struct shmid_ds ds;
    return shmctl(id, IPC_STAT, &ds) == 0 ? (ds.shm_perm.mode & SHM_DEST) != 0 : -1;
}

static int object(const char *name) {
    for (int o = 0; o < OWN; o++)
        if (strcmp(name, names[o]) == 0 && map[o]) return o;
    return -1;
}

static void serve(int port) {
    int s = udp_bound(port + role);
    if (s < 0) die("bind control");
    for (;;) {
        char buf[256];
        struct udp_peer from;
        udp_request(s, buf, sizeof buf, &from);
        olen = 0;
        if (strcmp(buf, "ping") == 0) {
            put("pong role=%d", role);
        } else if (strncmp(buf, "gen ", 4) == 0) {
            gen = strtoul(buf + 4, NULL, 10);
            write_gen();
            put("gen=%lu", gen);
        } else if (strcmp(buf, "state") == 0) {
            put("role=%d pid=%ld ppid=%ld gen=%lu ok=%d", role, (long)syscall(SYS_getpid), (long)getppid(), gen,
                check_gen());
            for (int o = 0; o < NOBJ; o++)
                put(" %s=%016llx", names[o], (unsigned long long)hash(map[o], sizes[o]));
            put(" sv1id=%d sv2id=%d nattch1=%lu nattch2=%lu dest1=%d dest2=%d", sv1, sv2, nattch(sv1), nattch(sv2),
                marked(sv1), marked(sv2));
        } else if (strncmp(buf, "poke ", 5) == 0 && strchr(buf + 5, ' ')) {
            char *text = strchr(buf + 5, ' ');
            *text++ = 0;
            int o = object(buf + 5);
            if (o < 0) {
                put("no object %s", buf + 5);
            } else {
                size_t n = strlen(text) < 63 ? strlen(text) : 63;
                memcpy(map[o] + MARK, text, n);
                map[o][MARK + n] = 0;
                put("poked");
            }
        } else if (strncmp(buf, "peek ", 5) == 0) {
            int o = object(buf + 5);
            if (o < 0)
                put("no object %s", buf + 5);
            else
                put("%s=%.63s", buf + 5, (const char *)map[o] + MARK);
        } else {
            put("unknown command");
        }
        udp_reply(s, out, olen, &from);
    }
}

static unsigned char *shared_anon(size_t size) {
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap anon");
    return p;
}

static unsigned char *attach(int id) {
    void *p = shmat(id, NULL, 0);
    if (p == (void *)-1) die("shmat");
    return p;
}

int main(int argc, char **argv) {
    int port = 7500;
    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--port") == 0 && i + 1 < argc) port = atoi(argv[++i]);

    map[ANON] = shared_anon(sizes[ANON]);
    sv1 = shmget(IPC_PRIVATE, sizes[SV1], IPC_CREAT | 0600);
    if (sv1 < 0) die("shmget sv1");
    map[SV1] = attach(sv1);
    if (shmctl(sv1, IPC_RMID, NULL) < 0) die("IPC_RMID sv1");
    sv2 = shmget(0x7a7d0101, sizes[SV2], IPC_CREAT | 0640);
    if (sv2 < 0) die("shmget sv2");
    int fd = shm_open("/tardi-tree", O_CREAT | O_RDWR | O_TRUNC, 0600);
    if (fd < 0) die("shm_open");
    if (ftruncate(fd, sizes[POSIX]) < 0) die("ftruncate");
    map[POSIX] = mmap(NULL, sizes[POSIX], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map[POSIX] == MAP_FAILED) die("mmap posix");
    close(fd);

    for (int r = 1; r <= 2; r++) {
        pid_t c = fork();
        if (c < 0) die("fork");
        if (c == 0) {
            role = r;
            map[SV2] = attach(sv2);
            map[OWN] = shared_anon(sizes[OWN]);
            write_gen();
            serve(port);
        }
    }
    role = 0;
    write_gen();
    serve(port);
    return 0;
}
