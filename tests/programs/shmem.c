/* Shared memory of every kind Tardi restores, written with recognisable patterns:
 *   anon   MAP_SHARED|MAP_ANONYMOUS, 8 pages, mapped twice (the second mapping made by
 *          mremap(old_size 0): the same object at another address)
 *   s1     System V segment with a key, 5 pages + 123 bytes, mode 0640, attached read-write
 *          and a second time read-only (SHM_RDONLY)
 *   s2     System V IPC_PRIVATE segment, 3 pages, attached and marked IPC_RMID
 *   s3     System V segment with a key, 2 pages, not attached (written through a short
 *          attachment at every tick)
 *   posix  shm_open("/tardi-shm"), 4 pages, mapped twice
 *   file   /tmp/shared.map, 2 pages, mapped shared
 * Every byte of every object is a function of the generation (see `pattern`): some pages are
 * all zeros at each generation. Answers UDP on port 7000:
 *   ping   -> pong
 *   state  -> gen, whether every byte matches the generation, per object its ids, key, size,
 *             mode, owner, attachment count and a hash; reading it changes nothing
 *   tick   -> the next generation, written through one mapping of each object (alternating)
 *   share  -> writes through one mapping of each object read through the other (and, for the
 *             anonymous object and s2, through a forked child's mapping), then puts the
 *             generation's bytes back; reports what was seen
 * Build: gcc -O2 -o shmem shmem.c
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define REPLY_SIZE 8192
#include "reply.h"

#define PG 4096

enum { ANON, S1, S2, S3, POSIX, FILEM, NOBJ };
static const char *names[NOBJ] = {"anon", "s1", "s2", "s3", "posix", "file"};
static size_t sizes[NOBJ] = {8 * PG, 5 * PG + 123, 3 * PG, 2 * PG, 4 * PG, 2 * PG};
/* Two mappings of each object (the second NULL where there is one only). */
static unsigned char *map1[NOBJ], *map2[NOBJ];
static int ids[NOBJ] = {-1, -1, -1, -1, -1, -1};
static const key_t keys[NOBJ] = {0, 0x7a7d0001, IPC_PRIVATE, 0x7a7d0003, 0, 0};
static uint64_t gen;

static unsigned char pattern(int o, uint64_t g, size_t j) {
    size_t page = j / PG;
    if ((page + g + (size_t)o) % 3 == 0) return 0; /* an all-zero page */
    return (unsigned char)(o * 31 + g * 7 + j * 13 + page * 5 + 1);
}

static unsigned char *attach_s3(void) {
    unsigned char *p = shmat(ids[S3], NULL, 0);
    if (p == (void *)-1) die("shmat s3");
    return p;
}

static void write_gen(void) {
    for (int o = 0; o < NOBJ; o++) {
        unsigned char *m = (gen % 2 && map2[o] && o != S1) ? map2[o] : map1[o];
        if (o == S3) m = attach_s3();
        for (size_t j = 0; j < sizes[o]; j++) m[j] = pattern(o, gen, j);
        if (o == S3) shmdt(m);
    }
}

static uint64_t hash(const unsigned char *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static void state(void) {
    int ok = 1;
    put("gen=%llu", (unsigned long long)gen);
    for (int o = 0; o < NOBJ; o++) {
        unsigned char *m = o == S3 ? attach_s3() : map1[o];
        for (size_t j = 0; j < sizes[o]; j++)
            if (m[j] != pattern(o, gen, j) || (map2[o] && map2[o][j] != m[j])) {
                if (ok) put(" bad=%s@%zu", names[o], j);
                ok = 0;
                break;
            }
        put(" %s_hash=%016llx", names[o], (unsigned long long)hash(m, sizes[o]));
        if (o == S3) shmdt(m);
        if (ids[o] >= 0) {
            struct shmid_ds ds;
            if (shmctl(ids[o], IPC_STAT, &ds) < 0) {
                put(" %s_stat=%s", names[o], strerror(errno));
                continue;
            }
            put(" %s_id=%d %s_key=%x %s_size=%zu %s_mode=%o %s_owner=%u:%u %s_nattch=%lu",
                names[o], ids[o], names[o], (unsigned)ds.shm_perm.__key, names[o],
                (size_t)ds.shm_segsz, names[o], (unsigned)ds.shm_perm.mode, names[o],
                ds.shm_perm.uid, ds.shm_perm.gid, names[o], (unsigned long)ds.shm_nattch);
        }
    }
    /* The read-only attachment still refuses writes: mprotect to writable fails. */
    put(" s1_ro=%s", mprotect(map2[S1], PG, PROT_READ | PROT_WRITE) < 0 ? "yes" : "no");
    put(" ok=%d", ok);
}

/* Writes a marker through map1 and reads it through map2 (and through a child's mapping). */
static void share(void) {
    for (int o = 0; o < NOBJ; o++) {
        size_t at = sizes[o] - 1;
        unsigned char old = map1[o] ? map1[o][at] : 0;
        if (o == S3) continue;
        if (map2[o]) {
            unsigned char *w = o == S1 ? map1[o] : map2[o], *r = o == S1 ? map2[o] : map1[o];
            w[at] = 0xA5;
            put(" %s_twin=%s", names[o], r[at] == 0xA5 ? "shared" : "private");
            w[at] = old;
        }
        if (o == ANON || o == S2) {
            pid_t c = fork();
            if (c == 0) {
                map1[o][at] = 0x5A;
                _exit(0);
            }
            if (c < 0) die("fork");
            waitpid(c, NULL, 0);
            put(" %s_fork=%s", names[o], map1[o][at] == 0x5A ? "shared" : "private");
            map1[o][at] = old;
        }
    }
}

static void setup(void) {
    /* Anonymous: one object, two mappings. */
    map1[ANON] = mmap(NULL, sizes[ANON], PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (map1[ANON] == MAP_FAILED) die("mmap anon");
    map2[ANON] = mremap(map1[ANON], 0, sizes[ANON], MREMAP_MAYMOVE);
    if (map2[ANON] == MAP_FAILED) die("mremap anon");
    /* System V, after two segments made and removed: the ids are not the first ones a fresh
     * namespace hands out (the kernel counts a sequence number up per slot). */
    for (int i = 0; i < 2; i++) {
        int t = shmget(IPC_PRIVATE, PG, IPC_CREAT | 0600);
        if (t < 0 || shmctl(t, IPC_RMID, NULL) < 0) die("throwaway segment");
    }
    for (int o = S1; o <= S3; o++) {
        ids[o] = shmget(keys[o], sizes[o], IPC_CREAT | 0640);
        if (ids[o] < 0) die("shmget");
    }
    map1[S1] = shmat(ids[S1], NULL, 0);
    map2[S1] = shmat(ids[S1], NULL, SHM_RDONLY);
    map1[S2] = shmat(ids[S2], NULL, 0);
    if (map1[S1] == (void *)-1 || map2[S1] == (void *)-1 || map1[S2] == (void *)-1) die("shmat");
    if (shmctl(ids[S2], IPC_RMID, NULL) < 0) die("IPC_RMID");
    struct shmid_ds ds;
    if (shmctl(ids[S1], IPC_STAT, &ds) < 0) die("IPC_STAT");
    ds.shm_perm.uid = 1234;
    ds.shm_perm.gid = 5678;
    ds.shm_perm.mode = 0660;
    if (shmctl(ids[S1], IPC_SET, &ds) < 0) die("IPC_SET");
    /* POSIX shared memory: two mappings of /dev/shm/tardi-shm. */
    int fd = shm_open("/tardi-shm", O_RDWR | O_CREAT, 0600);
    if (fd < 0 || ftruncate(fd, sizes[POSIX]) < 0) die("shm_open");
    map1[POSIX] = mmap(NULL, sizes[POSIX], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    map2[POSIX] = mmap(NULL, sizes[POSIX], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map1[POSIX] == MAP_FAILED || map2[POSIX] == MAP_FAILED) die("mmap posix");
    close(fd);
    /* A file in the /tmp tmpfs. */
    fd = open("/tmp/shared.map", O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, sizes[FILEM]) < 0) die("open /tmp/shared.map");
    map1[FILEM] = mmap(NULL, sizes[FILEM], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (map1[FILEM] == MAP_FAILED) die("mmap file");
    close(fd);
    write_gen();
}

int main(void) {
    setvbuf(stdout, NULL, _IONBF, 0);
    setup();
    int u = socket(AF_INET, SOCK_DGRAM, 0);
    struct sockaddr_in in = {.sin_family = AF_INET, .sin_port = htons(7000)};
    if (u < 0 || bind(u, (struct sockaddr *)&in, sizeof in) < 0) die("bind");
    for (;;) {
        char req[64];
        struct sockaddr_storage from;
        socklen_t fl = sizeof from;
        ssize_t n = recvfrom(u, req, sizeof req - 1, 0, (struct sockaddr *)&from, &fl);
        if (n < 0) {
            if (errno == EINTR) continue;
            die("recvfrom");
        }
        req[n] = 0;
        olen = 0;
        if (!strcmp(req, "ping")) put("pong");
        else if (!strcmp(req, "state")) state();
        else if (!strcmp(req, "tick")) {
            gen++;
            write_gen();
            put("gen=%llu", (unsigned long long)gen);
        } else if (!strcmp(req, "share")) share();
        else put("unknown");
        sendto(u, out, olen, 0, (struct sockaddr *)&from, fl);
    }
}
