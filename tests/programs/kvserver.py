#!/usr/bin/python3
"""A small multi-threaded TCP key-value server (Python 3 standard library only).

Tardi's second kind of test service: an interpreter with many threads, a big heap of small
objects and a background thread that keeps mutating state. Run by tests/python_service.rs
through gramine-manifests/python-kv.manifest.

    python3 kvserver.py [--port 8100] [--tick-ms 10]

One request per line, one reply line per request (pipelining is fine):

    PING           -> PONG
    SET key value  -> OK                  (value is the rest of the line, may contain spaces)
    GET key        -> VAL value | NIL
    INCR key       -> <new integer>       (a missing key counts as 0; ERR if not an integer)
    DEL key        -> 1 | 0
    COUNT          -> <number of keys>
    STATS          -> requests=<n> ticks=<n> keys=<n> conns=<n> pid=<pid> threads=<n>
    QUIT           -> BYE, then the server closes the connection

Anything else gets `ERR ...`. The background thread increments `ticks` every --tick-ms
milliseconds (under the same lock as the data), so a restored process must show it increasing.
"""

import argparse
import os
import socketserver
import sys
import threading
import time

LOCK = threading.Lock()
DATA = {}
STATE = {"requests": 0, "ticks": 0, "conns": 0}


def handle_line(line):
    """Executes one request line; returns the reply (without newline) or None to close."""
    parts = line.split(" ", 2)
    cmd = parts[0].upper()
    with LOCK:
        STATE["requests"] += 1
        if cmd == "PING" and len(parts) == 1:
            return "PONG"
        if cmd == "SET" and len(parts) == 3:
            DATA[parts[1]] = parts[2]
            return "OK"
        if cmd == "GET" and len(parts) == 2:
            v = DATA.get(parts[1])
            return "NIL" if v is None else "VAL " + v
        if cmd == "INCR" and len(parts) == 2:
            try:
                n = int(DATA.get(parts[1], "0")) + 1
            except ValueError:
                return "ERR value is not an integer"
            DATA[parts[1]] = str(n)
            return str(n)
        if cmd == "DEL" and len(parts) == 2:
            return "1" if DATA.pop(parts[1], None) is not None else "0"
        if cmd == "COUNT" and len(parts) == 1:
            return str(len(DATA))
        if cmd == "STATS" and len(parts) == 1:
            return "requests=%d ticks=%d keys=%d conns=%d pid=%d threads=%d" % (
                STATE["requests"],
                STATE["ticks"],
                len(DATA),
                STATE["conns"],
                os.getpid(),
                threading.active_count(),
            )
        if cmd == "QUIT":
            return None
    return "ERR unknown command or wrong number of arguments: %r" % line[:80]


class Handler(socketserver.BaseRequestHandler):
    def handle(self):
        with LOCK:
            STATE["conns"] += 1
        sock = self.request
        buf = b""
        try:
            while True:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    return
                buf += chunk
                if len(buf) > (1 << 20) and b"\n" not in buf:
                    sock.sendall(b"ERR line too long\n")
                    return
                # Answer every complete line received so far with one send (pipelining).
                *lines, buf = buf.split(b"\n")
                out = []
                for raw in lines:
                    line = raw.decode("utf-8", "replace").rstrip("\r")
                    if line == "":
                        continue
                    reply = handle_line(line)
                    if reply is None:
                        out.append("BYE")
                        sock.sendall(("\n".join(out) + "\n").encode())
                        return
                    out.append(reply)
                if out:
                    sock.sendall(("\n".join(out) + "\n").encode())
        except OSError:
            # A connection that was open at checkpoint time comes back reset: just drop it.
            return
        finally:
            with LOCK:
                STATE["conns"] -= 1


class Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 64


def ticker(period):
    while True:
        time.sleep(period)
        with LOCK:
            STATE["ticks"] += 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=8100)
    ap.add_argument("--tick-ms", type=float, default=10.0)
    args = ap.parse_args()
    threading.Thread(target=ticker, args=(args.tick_ms / 1000.0,), name="ticker", daemon=True).start()
    with Server(("0.0.0.0", args.port), Handler) as srv:
        print("kvserver: listening on port %d, pid %d" % (args.port, os.getpid()), flush=True)
        srv.serve_forever(poll_interval=0.5)


if __name__ == "__main__":
    sys.exit(main())
