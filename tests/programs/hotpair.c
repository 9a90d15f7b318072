/*
 * hotpair: two pages side by side in two mappings, written on command, so that a test can put
 * them in a chosen state at each epoch of the checkpointer: page A is anonymous, page B (right
 * after it) a private mapping of a file, copied on write. Both written every epoch become hot
 * pages (left writable, copied in every pause); the test then replaces A with a new mapping and
 * writes B once more.
 *
 * Usage: hotpair FILE (created, one page). Prints A's address (hex) on a line, then serves
 * one-byte commands from stdin, answering each with one byte 'k' on stdout once done:
 *   w  write both pages (new contents every time)
 *   r  replace A with a new anonymous mapping at the same address (MAP_FIXED) and write it
 *   b  write B only
 *   z  zap B (MADV_DONTNEED: its copy is dropped, it shows the file again)
 *   l  read B (after a zap: maps the file's page, read-only)
 *   f  write new bytes into the file itself (through a descriptor): B shows them unless it
 *      holds a copy of its own
 * Exits 0 at end of input, 1 on any error.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define PG 4096

static void die(const char *what)
{
    perror(what);
    _exit(1);
}

/* New contents: the counter in a few places of the page. */
static void scribble(volatile unsigned char *page, uint64_t n)
{
    for (int i = 0; i < 8; i++)
        page[(n * 97 + (uint64_t)i * 509) % PG] = (unsigned char)(n + (uint64_t)i);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: hotpair FILE\n");
        return 1;
    }
    static unsigned char fill[PG];
    memset(fill, 0x5a, sizeof fill);
    int fd = open(argv[1], O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, fill, PG) != PG)
        die("creating the file");
    unsigned char *a = mmap(NULL, 2 * PG, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (a == MAP_FAILED)
        die("mmap");
    unsigned char *b = mmap(a + PG, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_FIXED, fd, 0);
    if (b != a + PG)
        die("mmap of the file");
    char line[64];
    int n = snprintf(line, sizeof line, "%lx\n", (unsigned long)a);
    if (write(1, line, (size_t)n) != n)
        die("write");
    uint64_t count = 0;
    static volatile unsigned char sink;
    for (;;) {
        char c;
        ssize_t r = read(0, &c, 1);
        if (r == 0)
            return 0;
        if (r < 0)
            die("read");
        count++;
        switch (c) {
        case 'w':
            scribble(a, count);
            scribble(b, count);
            break;
        case 'r':
            if (mmap(a, PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                     -1, 0) != a)
                die("mmap over A");
            scribble(a, count);
            break;
        case 'b':
            scribble(b, count);
            break;
        case 'z':
            if (madvise(b, PG, MADV_DONTNEED) != 0)
                die("madvise");
            break;
        case 'l':
            sink += b[100];
            break;
        case 'f': {
            unsigned char bytes[16];
            memset(bytes, (int)(count & 0xff), sizeof bytes);
            if (pwrite(fd, bytes, sizeof bytes, 64) != (ssize_t)sizeof bytes)
                die("pwrite");
            break;
        }
        default:
            fprintf(stderr, "hotpair: unknown command %c\n", c);
            return 1;
        }
        if (write(1, "k", 1) != 1)
            die("write");
    }
}
