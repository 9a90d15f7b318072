/*
 * filer.c — a service whose state lives both in memory and in a private directory.
 *
 * WHAT IT TESTS
 *   That a checkpoint's files are consistent with its memory, and that a restore brings both
 *   back together (issue 3, item 7). The counter `n` lives in memory; every step the program
 *   first checks that the directory agrees with it, then changes the directory in every way a
 *   service does:
 *     - writes state.tmp and renames it over state          (create, write, rename)
 *     - appends "n\n" to log through a descriptor kept open (write through an open fd)
 *     - truncates log to zero once it passes 4 KiB          (truncate)
 *     - every 8 steps creates dir d<n>/x and removes d<n-32> (mkdir, delete)
 *     - keeps a symlink "latest" -> "d<last multiple of 8>"
 *
 * CHECKS (each step, before changing anything)
 *   state == n; the log's last line == n (or the log is empty just after a truncation);
 *   d<k>/x holds "k" for the last multiple of 8 k <= n; latest points at it.
 *   On a mismatch it writes the reason to <dir>/FAIL and exits 3.
 *
 * USAGE: filer DIR        (DIR: the private directory, a sandbox path)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *dir;
static char path_buf[4096];

static const char *at(const char *fmt, ...)
{
    char name[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    snprintf(path_buf, sizeof path_buf, "%s/%s", dir, name);
    return path_buf;
}

static void fail(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    int fd = open(at("FAIL"), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
        (void)!write(fd, msg, strlen(msg));
        close(fd);
    }
    fprintf(stderr, "filer: %s\n", msg);
    exit(3);
}

/* Reads a whole small file into buf (NUL-terminated); -1 if missing. */
static long slurp(const char *p, char *buf, size_t cap)
{
    int fd = open(p, O_RDONLY);
    if (fd < 0)
        return -1;
    long n = read(fd, buf, cap - 1);
    close(fd);
    if (n < 0)
        n = 0;
    buf[n] = 0;
    return n;
}

static void put(const char *p, const char *text)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        fail("writing %s: %s", p, strerror(errno));
    close(fd);
}

static void check(unsigned long n, int log_fd)
{
    char buf[8192];
    if (slurp(at("state"), buf, sizeof buf) < 0 || strtoul(buf, NULL, 10) != n)
        fail("state is '%s', memory says %lu", buf, n);
    long len = slurp(at("log"), buf, sizeof buf);
    if (len < 0)
        fail("log is missing at %lu", n);
    off_t off = lseek(log_fd, 0, SEEK_CUR);
    if (off != len)
        fail("log descriptor offset %ld, file length %ld at %lu", (long)off, len, n);
    if (len > 0) {
        buf[len - 1] = 0; /* drop the last newline */
        char *last = strrchr(buf, '\n');
        unsigned long v = strtoul(last ? last + 1 : buf, NULL, 10);
        if (v != n)
            fail("log ends with %lu, memory says %lu", v, n);
    }
    unsigned long k = n / 8 * 8;
    if (k > 0) {
        if (slurp(at("d%lu/x", k), buf, sizeof buf) < 0 || strtoul(buf, NULL, 10) != k)
            fail("d%lu/x is '%s' at %lu", k, buf, n);
        char target[64], want[64];
        ssize_t t = readlink(at("latest"), target, sizeof target - 1);
        target[t < 0 ? 0 : t] = 0;
        snprintf(want, sizeof want, "d%lu", k);
        if (strcmp(target, want) != 0)
            fail("latest -> '%s', want '%s' at %lu", target, want, n);
    }
    if (k >= 40) {
        struct stat st;
        if (stat(at("d%lu", k - 40), &st) == 0)
            fail("d%lu should have been removed at %lu", k - 40, n);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: filer DIR\n");
        return 2;
    }
    dir = argv[1];
    unsigned long n = 0;
    char text[64];
    put(at("state"), "0");
    int log_fd = open(at("log"), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0644);
    if (log_fd < 0)
        fail("opening log: %s", strerror(errno));
    for (;;) {
        check(n, log_fd);
        n++;
        snprintf(text, sizeof text, "%lu", n);
        char tmp[4096];
        snprintf(tmp, sizeof tmp, "%s", at("state.tmp"));
        put(tmp, text);
        if (rename(tmp, at("state")) != 0)
            fail("rename: %s", strerror(errno));
        if (lseek(log_fd, 0, SEEK_END) > 4096 && ftruncate(log_fd, 0) != 0)
            fail("truncate: %s", strerror(errno));
        lseek(log_fd, 0, SEEK_END);
        snprintf(text, sizeof text, "%lu\n", n);
        if (write(log_fd, text, strlen(text)) != (ssize_t)strlen(text))
            fail("append: %s", strerror(errno));
        if (n % 8 == 0) {
            if (mkdir(at("d%lu", n), 0755) != 0)
                fail("mkdir d%lu: %s", n, strerror(errno));
            snprintf(text, sizeof text, "%lu", n);
            put(at("d%lu/x", n), text);
            if (n > 40) {
                unlink(at("d%lu/x", n - 40));
                if (rmdir(at("d%lu", n - 40)) != 0)
                    fail("rmdir d%lu: %s", n - 40, strerror(errno));
            }
            snprintf(text, sizeof text, "d%lu", n);
            unlink(at("latest.tmp"));
            char tmp2[4096];
            snprintf(tmp2, sizeof tmp2, "%s", at("latest.tmp"));
            if (symlink(text, tmp2) != 0 || rename(tmp2, at("latest")) != 0)
                fail("symlink: %s", strerror(errno));
        }
        usleep(300);
    }
}
