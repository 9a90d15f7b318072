/*
 * stackgrow: grows its main thread's stack on command, with no system call that changes the
 * memory layout: the kernel extends the [stack] mapping on the faults below it. A checkpointer
 * that carries the layout between pauses when no layout call was made must still see the
 * grown part (and the bytes written into it).
 *
 * Serves one-byte commands from stdin, answering each with one byte 'k' on stdout once done:
 *   g  recurse 64 KiB deeper than the deepest point so far, writing every frame (new contents
 *      every time), and return: the grown pages stay mapped with what was written
 *   w  write into the already grown region again (through a deep recursion to the same depth)
 *   f  write the next page of `filedata`, an initialised array: a private mapping of the
 *      program's file whose page is copied on write by this first write, again with no call
 * Only read(2) and write(2) are called between commands. Exits 0 at end of input.
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static unsigned depth_kib = 256;
/* Initialised, so in .data: mapped privately from the program's file. */
static volatile unsigned char filedata[64 * 4096] = {1};
static unsigned file_pages;
static unsigned round_no;

/* One 4 KiB frame per level, filled with the level and the round. noinline and the use of the
 * buffer after the call keep the compiler from merging or dropping the frames. */
__attribute__((noinline)) static unsigned grow(unsigned levels)
{
    volatile unsigned char buf[4000];
    for (unsigned i = 0; i < sizeof buf; i += 61)
        buf[i] = (unsigned char)(levels * 7 + round_no);
    unsigned below = levels ? grow(levels - 1) : 0;
    return below + buf[levels % sizeof buf];
}

int main(void)
{
    char c;
    while (read(0, &c, 1) == 1) {
        round_no++;
        if (c == 'g')
            depth_kib += 64;
        else if (c == 'f')
            filedata[(file_pages++ % 64) * 4096 + 100] = (unsigned char)(round_no + 1);
        else if (c != 'w')
            return 1;
        volatile unsigned sink = grow(depth_kib / 4);
        (void)sink;
        if (write(1, "k", 1) != 1)
            return 1;
    }
    return 0;
}
