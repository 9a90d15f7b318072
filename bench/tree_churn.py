#!/usr/bin/env python3
"""What a process that appears between epochs costs (issue 8, step 2 of docs/PROCESS-TREES.md):
PostgreSQL 15 (gramine-manifests/postgres.manifest, a fresh data directory) under a load of
one client connection per row (`psql -c "insert ..."`, so a backend forked and gone each
time), first unprotected (`tardi run`), then under `tardi profile --json` (10 ms epochs, the
default tracker): connections per second in each, and the pause, bytes and pause parts of the
epochs that captured a new process whole (`whole_processes` > 0) against those that did not.
Asserts nothing; prints a markdown table and writes it with the raw figures to
bench/out/tree-churn-STAMP.{md,json}.

Usage: bench/tree_churn.py          Env: SECS (10)
Run as root after `cargo build --release`; needs postgresql-15 and psql (scripts/setup.sh).
"""
import json, os, shutil, signal, statistics, subprocess, sys, tempfile, time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tree_snapshot import ROOT, TARDI, postgres, psql, ready, run_json, stop  # noqa: E402

SECS = int(os.environ.get("SECS", "10"))
LOAD = ("psql -h {a} -U postgres -c 'create table if not exists t (id int, v text)' >/dev/null 2>&1; "
        "i=0; while :; do i=$((i+1)); psql -h {a} -U postgres -At "
        "-c \"insert into t values ($i, 'row $i')\" >/dev/null 2>&1 && echo $i >> {log}; done")


def count(log):
    try:
        return sum(1 for _ in open(log))
    except FileNotFoundError:
        return 0


def unprotected(path, tmp):
    """Connections per second against the service under `tardi run`."""
    p, ev = run_json(["run", path], "address")
    addr = ev["address"]
    ready(lambda: psql(addr, "select 1").returncode == 0)
    log = os.path.join(tmp, "unprotected.log")
    load = subprocess.Popen(["sh", "-c", LOAD.format(a=addr, log=log)], start_new_session=True)
    time.sleep(SECS)
    os.killpg(load.pid, signal.SIGTERM)
    load.wait()
    stop(p)
    time.sleep(0.5)
    return count(log) / SECS


def profiled(path, tmp):
    """The same load under `tardi profile --json`: its epochs, and connections per second."""
    log = os.path.join(tmp, "profiled.log")
    r = subprocess.run([TARDI, "profile", path, "--json", "--duration", f"{SECS}s", "--interval", "10ms",
                        "--load", LOAD.format(a="{address}", log=log)],
                       capture_output=True, text=True, timeout=SECS + 120)
    if r.returncode != 0:
        raise RuntimeError(f"tardi profile: {r.stderr}")
    lines = [json.loads(l) for l in r.stdout.splitlines() if l.strip()]
    return [l for l in lines if not l.get("summary")], count(log) / SECS


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0


def main():
    tmp = tempfile.mkdtemp(prefix="tree-churn-")
    os.chmod(tmp, 0o755)
    try:
        path = postgres(tmp, "bchurn")
        base = unprotected(path, tmp)
        epochs, tracked = profiled(path, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    whole = [e for e in epochs if e.get("whole_processes", 0) > 0]
    rest = [e for e in epochs if e.get("whole_processes", 0) == 0]
    rows = []
    for label, es in [("a new process captured whole", whole), ("no new process", rest)]:
        ps = [e["pause_us"] for e in es]
        rows.append({
            "epochs": label, "count": len(es),
            "pause_p50_us": statistics.median(ps) if ps else 0, "pause_p99_us": pct(ps, 0.99),
            "bytes_p50": statistics.median(e["encoded_bytes"] for e in es) if es else 0,
            "processes_p50": statistics.median(e.get("processes", 0) for e in es) if es else 0,
            "scan_copy_p50_us": statistics.median(e["scan_us"] + e["copy_us"] for e in es) if es else 0,
        })
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    lines = [f"PostgreSQL, one connection per row, {SECS} s each: **{base:.0f} connections/s unprotected, "
             f"{tracked:.0f}/s under `tardi profile` (10 ms epochs) = {100 * tracked / base if base else 0:.0f}%**; "
             f"{len(epochs)} epochs, {sum(e.get('whole_processes', 0) for e in epochs)} processes captured whole.", "",
             "| epochs | count | processes (p50) | pause p50 µs | pause p99 µs | scan + copy p50 µs | bytes p50 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['epochs']} | {r['count']} | {r['processes_p50']:.0f} | {r['pause_p50_us']:.0f} | "
                     f"{r['pause_p99_us']:.0f} | {r['scan_copy_p50_us']:.0f} | {r['bytes_p50']:.0f} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(ROOT, "bench/out"), exist_ok=True)
    out = os.path.join(ROOT, f"bench/out/tree-churn-{stamp}")
    open(out + ".md", "w").write(text + "\n")
    json.dump({"unprotected_per_s": base, "profiled_per_s": tracked, "rows": rows, "epochs": epochs},
              open(out + ".json", "w"), indent=1)
    print(f"written: {out}.md, {out}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
