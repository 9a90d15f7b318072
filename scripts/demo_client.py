#!/usr/bin/env python3
"""A verifying redis client for the demo: writes key:i = value-i for `seconds`, reconnecting
when the connection breaks (a failover resets it), and reports every pause in service it saw.
Then it reads every acknowledged key back and fails if one is missing or wrong.

Usage: demo_client.py HOST PORT SECONDS
"""
import socket
import sys
import time


def connect(host, port):
    s = socket.create_connection((host, port), timeout=2)
    s.settimeout(5)
    return s, s.makefile("rb")


def command(conn, *args):
    sock, reader = conn
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a.encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    sock.sendall(out)
    line = reader.readline()
    if not line:
        raise ConnectionError("closed")
    if line[:1] == b"$":
        n = int(line[1:])
        if n < 0:
            return None
        data = reader.read(n + 2)
        return data[:-2].decode()
    return line[1:].strip().decode()


def main():
    host, port, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    acked, conn, i, connects = [], None, 0, 0
    start = last_ok = time.monotonic()
    gaps = []
    while time.monotonic() - start < seconds:
        try:
            if conn is None:
                conn = connect(host, port)
                connects += 1
            if command(conn, "SET", f"key:{i}", f"value-{i}") == "OK":
                now = time.monotonic()
                if now - last_ok > 0.1:
                    gaps.append(now - last_ok)
                    same = "on the same connection" if connects == 1 else f"on connection {connects}"
                    print(f"  client: service back after {1000 * (now - last_ok):.0f} ms {same}; "
                          f"{len(acked)} writes acknowledged so far", flush=True)
                last_ok = now
                acked.append(i)
                i += 1
                if i % 2000 == 0:
                    print(f"  client: {i} writes acknowledged", flush=True)
        except (OSError, ConnectionError):
            if conn is not None:
                print(f"  client: connection lost after write {i} "
                      f"({1000 * (time.monotonic() - last_ok):.0f} ms since the last reply); "
                      "reconnecting", flush=True)
            conn = None
            time.sleep(0.01)
    conn = None
    deadline = time.monotonic() + 20
    while conn is None:
        try:
            conn = connect(host, port)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    lost = [k for k in acked if command(conn, "GET", f"key:{k}") != f"value-{k}"]
    print(f"  client: {len(acked)} writes acknowledged on {connects} connection(s), {len(lost)} lost"
          + (f"; longest pause {1000 * max(gaps):.0f} ms" if gaps else ""), flush=True)
    sys.exit(1 if lost or not acked else 0)


if __name__ == "__main__":
    main()
