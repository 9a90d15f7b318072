"""mpserver: a Python `multiprocessing` service (tests/multiprocessing.rs,
gramine-manifests/python-mp.manifest).

The main process serves UDP and hands work to a `multiprocessing.Pool` of two worker
processes (forked): the pool's task and result queues are pipes shared by the three
processes, guarded by locks that are POSIX semaphores (named files in /dev/shm, unlinked at
once and mapped shared by every process), and the pool runs three threads of its own in the
main process. Each worker keeps a running total of the numbers it was given.

Commands (UDP, one datagram each):
  ping      -> "pong"
  work N    -> adds 1..N over the pool, one task each;
               "served=S workers=PID:TOTAL,PID:TOTAL" where S counts every task ever served
               and TOTAL is the highest running total each worker reported
  pids      -> "pids=PID,PID" (the pool's workers)

  python3 mpserver.py [--port P]   (default 7600)
"""

import multiprocessing
import os
import socket
import sys

TOTAL = 0


def add(x):
    """Runs in a worker: its own running total."""
    global TOTAL
    TOTAL += x
    return os.getpid(), TOTAL


def main():
    port = 7600
    if "--port" in sys.argv:
        port = int(sys.argv[sys.argv.index("--port") + 1])
    pool = multiprocessing.get_context("fork").Pool(2)
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    served = 0
    totals = {}
    while True:
        data, peer = sock.recvfrom(512)
        words = data.decode(errors="replace").split()
        if words == ["ping"]:
            reply = "pong"
        elif len(words) == 2 and words[0] == "work" and words[1].isdigit():
            for pid, total in pool.map(add, range(1, int(words[1]) + 1), chunksize=1):
                totals[pid] = max(totals.get(pid, 0), total)
                served += 1
            workers = ",".join(f"{p}:{t}" for p, t in sorted(totals.items()))
            reply = f"served={served} workers={workers}"
        elif words == ["pids"]:
            reply = "pids=" + ",".join(str(p) for p in sorted(w.pid for w in pool._pool))
        else:
            reply = "unknown"
        sock.sendto(reply.encode(), peer)


if __name__ == "__main__":
    main()
