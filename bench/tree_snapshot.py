#!/usr/bin/env python3
"""Snapshot pause and restore time of process trees against one process of the same memory
size (issue 8): nginx (a master and two workers, gramine-manifests/nginx.manifest), PostgreSQL
15 (a postmaster and five background processes, gramine-manifests/postgres.manifest, a fresh
data directory with a 10,000-row table) and, for each, bench/idle_tree.c with no workers and a
region that makes its checkpoint's memory the tree's. Each case: `tardi run`, `tardi snapshot`
(its "paused" and "memory" figures), kill, `tardi restore --json` (its restore timings), kill;
REPS times. Asserts nothing; prints a markdown table and writes it with the raw figures to
bench/out/tree-snapshot-STAMP.{md,json}.

Usage: bench/tree_snapshot.py          Env: REPS (3)
Run as root after `cargo build --release`; needs nginx-light, postgresql-15 and psql
(scripts/setup.sh installs them).
"""
import json, os, re, shutil, signal, statistics, subprocess, sys, tempfile, time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARDI = os.path.join(ROOT, "target/release/tardi")
REPS = int(os.environ.get("REPS", "3"))
PG = "/usr/lib/postgresql/15/bin"


def run_json(args, want_key, timeout=60):
    """Starts a foreground `tardi run/restore --json`, returns (process, its first JSON event)."""
    p = subprocess.Popen([TARDI] + args + ["--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line:
        raise RuntimeError(f"{args}: {p.stderr.read()}")
    ev = json.loads(line)
    if want_key not in ev:
        raise RuntimeError(f"{args}: {ev}")
    return p, ev


def stop(p):
    p.send_signal(signal.SIGINT)
    try:
        p.wait(20)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def ready(check, limit=60):
    t0 = time.time()
    while time.time() - t0 < limit:
        if check():
            return
        time.sleep(0.1)
    raise RuntimeError("the service never became ready")


def manifest(tmp, shipped, repl, name):
    text = open(os.path.join(ROOT, "gramine-manifests", shipped)).read()
    for a, b in repl:
        assert a in text, (shipped, a)
        text = text.replace(a, b)
    path = os.path.join(tmp, name + ".manifest")
    open(path, "w").write(text)
    return path


def nginx(tmp, name):
    return manifest(tmp, "nginx.manifest", [
        ('uri = "file:/srv/nginx"', f'uri = "file:{ROOT}/gramine-manifests/nginx"'),
        ("file:/var/lib/tardi/nginx/data", f"file:{tmp}/nginx-data"),
        ('name = "nginx"', f'name = "{name}"'),
    ], name)


def psql(addr, sql):
    return subprocess.run(["psql", "-h", addr, "-U", "postgres", "-At", "-c", sql],
                          capture_output=True, text=True, env=dict(os.environ, PGCONNECT_TIMEOUT="5"))


def postgres(tmp, name):
    home = os.path.join(tmp, "pg")
    os.makedirs(home, exist_ok=True)
    subprocess.run(["chown", "-R", "postgres", tmp], check=True)
    data = os.path.join(home, "data")
    subprocess.run(["runuser", "-u", "postgres", "--", f"{PG}/initdb", "-D", data, "--auth=trust",
                    "-U", "postgres"], check=True, capture_output=True)
    with open(os.path.join(data, "pg_hba.conf"), "a") as f:
        f.write("host all all 0.0.0.0/0 trust\n")
    return manifest(tmp, "postgres.manifest", [
        ('uri = "file:/var/lib/tardi/postgres/data"', f'uri = "file:{data}"'),
        ('name = "postgres"', f'name = "{name}"'),
    ], name)


def single(tmp, name, mb):
    exe = os.path.join(ROOT, "target/bench/idle_tree")
    path = os.path.join(tmp, name + ".manifest")
    open(path, "w").write(f'libos.entrypoint = "{exe}"\nloader.argv = ["idle_tree", "--workers", "0", "--main-mb", "{mb}"]\n\n[tardi]\nname = "{name}"\n')
    return path


def case(label, path, name, check, setup_after=None):
    out = []
    snap = os.path.join(os.path.dirname(path), name + ".tardi")
    for rep in range(REPS):
        p, ev = run_json(["run", path], "address")
        addr = ev["address"]
        ready(lambda: check(addr))
        if setup_after and rep == 0:
            setup_after(addr)
        r = subprocess.run([TARDI, "snapshot", name, "-o", snap], capture_output=True, text=True)
        m = re.search(r"\(([\d.]+) MB of memory, (\d+) threads\); paused ([\d.]+) ms", r.stdout + r.stderr)
        if not m:
            raise RuntimeError(f"snapshot {name}: {r.stdout}{r.stderr}")
        stop(p)
        time.sleep(0.5)
        p, ev = run_json(["restore", snap], "address")
        ready(lambda: check(addr))
        stop(p)
        time.sleep(0.5)
        out.append({"memory_mb": float(m.group(1)), "threads": int(m.group(2)), "pause_ms": float(m.group(3)),
                    "restore": ev.get("restore", {})})
        print(f"[tree_snapshot] {label} rep {rep}: pause {m.group(3)} ms, restore {ev.get('restore', {}).get('total_us', 0) / 1e3:.0f} ms", file=sys.stderr)
    return out


def http_ok(addr):
    try:
        r = subprocess.run(["curl", "-s", "-m", "2", f"http://{addr}:8080/"], capture_output=True)
        return r.returncode == 0
    except FileNotFoundError:
        import urllib.request
        try:
            urllib.request.urlopen(f"http://{addr}:8080/", timeout=2).read()
            return True
        except Exception:
            return False


def main():
    subprocess.run(["cc", "-O2", "-o", os.path.join(ROOT, "target/bench/idle_tree"), os.path.join(ROOT, "bench/idle_tree.c")], check=True)
    tmp = tempfile.mkdtemp(prefix="tree-snapshot-")
    os.chmod(tmp, 0o755)
    results = {}
    try:
        results["nginx"] = case("nginx", nginx(tmp, "bnginx"), "bnginx", http_ok)
        results["postgres"] = case("postgres", postgres(tmp, "bpg"), "bpg",
                                   lambda a: psql(a, "select 1").returncode == 0,
                                   lambda a: psql(a, "create table t(id int primary key, v text); insert into t select g, md5(g::text) from generate_series(1,10000) g"))
        for tree in ["nginx", "postgres"]:
            # The memory the tree's checkpoint holds, less what idle_tree holds besides its region.
            mb = max(4, round(statistics.median(r["memory_mb"] for r in results[tree]) * 1e6 / 2**20) - 1)
            name = f"bsingle-{tree}"
            results[f"single ({tree}'s size)"] = case(f"single-{tree}", single(tmp, name, mb), name,
                                                      lambda a: True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    lines = [f"{REPS} runs each; medians.", "",
             "| service | processes (threads) | memory MB | snapshot pause ms | restore total ms | restore: restorer ms |",
             "|---|---:|---:|---:|---:|---:|"]
    for k, rs in results.items():
        med = lambda f: statistics.median(f(r) for r in rs)
        lines.append(f"| {k} | {rs[0]['threads']} | {med(lambda r: r['memory_mb']):.1f} | {med(lambda r: r['pause_ms']):.1f} | "
                     f"{med(lambda r: r['restore'].get('total_us', 0)) / 1e3:.0f} | {med(lambda r: r['restore'].get('restorer_us', 0)) / 1e3:.0f} |")
    text = "\n".join(lines)
    print(text)
    os.makedirs(os.path.join(ROOT, "bench/out"), exist_ok=True)
    base = os.path.join(ROOT, f"bench/out/tree-snapshot-{stamp}")
    open(base + ".md", "w").write(text + "\n")
    json.dump(results, open(base + ".json", "w"), indent=1)
    print(f"written: {base}.md, {base}.json", file=sys.stderr)


if __name__ == "__main__":
    main()
