#!/usr/bin/env bash
# What each extra idle process of a tree adds to an epoch's pause (issue 8's target: at most
# 0.3 ms per idle process, measured with 1, 2, 4 and 8 workers). bench/idle_tree.c: a main
# process that answers pings and dirties ~16 pages a millisecond, and WORKERS children that
# touched MB MiB each and sleep. Each case runs `tardi profile` (10 ms epochs, the userfaultfd
# tracker, the manifest defaults otherwise) for SECS seconds and reads the pause percentiles
# and the per-epoch parts from its epochs.json. Asserts nothing; prints a markdown table and
# writes it, with the raw summaries, to bench/out/tree-pause-STAMP.{md,json}.
#
# Usage: bench/tree_pause.sh        Env: WORKERS ("0 1 2 4 8") SECS (10) MB (4) REPS (1)
# Run as root. Needs gcc and a release build (cargo build --release).
set -euo pipefail
cd "$(dirname "$0")/.."
WORKERS=${WORKERS:-"0 1 2 4 8"}
SECS=${SECS:-10}
MB=${MB:-4}
REPS=${REPS:-1}
stamp=$(date -u +%Y%m%d-%H%M%S)
out=bench/out/tree-pause-$stamp
mkdir -p bench/out target/bench
cc -O2 -o target/bench/idle_tree bench/idle_tree.c
tardi=$PWD/target/release/tardi
[ -x "$tardi" ] || cargo build --release -p tardi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "[tree_pause] commit $(git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
results=()
for rep in $(seq "$REPS"); do
  for n in $WORKERS; do
    m=$tmp/idle-$n.manifest
    cat > "$m" <<M
libos.entrypoint = "$PWD/target/bench/idle_tree"
loader.argv = ["idle_tree", "--workers", "$n", "--mb", "$MB"]

[tardi]
name = "idle-tree-$n"
M
    echo "[tree_pause] $n workers, rep $rep" >&2
    "$tardi" profile "$m" --duration "${SECS}s" --out "$tmp/out-$n-$rep" >"$tmp/log-$n-$rep" 2>&1 || {
      cat "$tmp/log-$n-$rep" >&2; exit 1; }
    results+=("$n:$rep:$tmp/out-$n-$rep")
  done
done
python3 - "$out" "$MB" "${results[@]}" <<'PY'
import json, statistics, sys
out, mb, cases = sys.argv[1], sys.argv[2], sys.argv[3:]
rows, raw = [], []
def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))] if v else 0
for c in cases:
    n, rep, d = c.split(":", 2)
    s = json.load(open(f"{d}/summary.json"))
    ep = json.load(open(f"{d}/epochs.json"))
    epochs = ep if isinstance(ep, list) else ep.get("epochs", [])
    pause = [e["pause_us"] for e in epochs if "pause_us" in e]
    quiesce = [e.get("quiesce_us", 0) for e in epochs]
    resume = [e.get("resume_us", 0) for e in epochs]
    rows.append((int(n), int(rep), len(pause), statistics.median(pause), pct(pause, 90),
                 pct(pause, 99), statistics.median(quiesce), statistics.median(resume)))
    raw.append({"workers": int(n), "rep": int(rep), "summary": s})
base = {r[1]: r[3] for r in rows if r[0] == 0}
lines = [f"Idle workers of {mb} MiB each; main process dirtying ~16 pages/ms; 10 ms epochs (uffd).", "",
         "| workers | processes | epochs | pause p50 µs | p90 | p99 | quiesce p50 | resume p50 | added per extra process (p50 vs 0 workers) µs |",
         "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for n, rep, k, p50, p90, p99, q, r in sorted(rows):
    add = f"{(p50 - base[rep]) / n:.0f}" if n and rep in base else "—"
    lines.append(f"| {n} | {n + 1} | {k} | {p50:.0f} | {p90:.0f} | {p99:.0f} | {q:.0f} | {r:.0f} | {add} |")
text = "\n".join(lines)
print(text)
open(out + ".md", "w").write(text + "\n")
json.dump(raw, open(out + ".json", "w"), indent=1)
print(f"\nwritten: {out}.md, {out}.json", file=sys.stderr)
PY
