#!/usr/bin/env python3
"""Writes Redis protocol SET commands for `redis-cli --pipe` to stdout.

Usage: gen_sets.py START COUNT VALUE_SIZE
Keys are bench:START .. bench:START+COUNT-1 (all distinct, so DBSIZE is known); each value is
VALUE_SIZE bytes of pseudo-random printable text (no all-zero pages, no two values alike at the
same offset), so the memory a checkpoint must copy is what INFO memory reports.
"""
import random
import sys


def main() -> None:
    start, count, size = (int(a) for a in sys.argv[1:4])
    rng = random.Random(42)
    block = bytes(rng.randrange(33, 127) for _ in range(65536 + size))
    span = 65536
    out = sys.stdout.buffer
    vhdr = b"$%d\r\n" % size
    buf = []
    for i in range(start, start + count):
        key = b"bench:%d" % i
        off = (i * 7919) % span
        buf.append(b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n%s%s\r\n" % (len(key), key, vhdr, block[off:off + size]))
        if len(buf) >= 4096:
            out.write(b"".join(buf))
            buf.clear()
    out.write(b"".join(buf))
    out.flush()


if __name__ == "__main__":
    main()
