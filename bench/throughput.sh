#!/usr/bin/env bash
# Throughput and latency of a protected service against the same service untracked, in one run
# (issue "Checkpoint path": the share of its speed a service keeps).
#
#   redis      redis-benchmark -c 50 -r 100000 -d 64 -t set,get (unpipelined), -n REDIS_N
#   memcached  examples/kv_load.rs: 50 connections, closed loop, 64-byte values over 100,000
#              keys, set then get, KV_SECONDS each (Debian has no memtier_benchmark)
#
# Each service is measured
#   untracked   `tardi run`, load from this machine;
#   tracked     `tardi profile --interval MSms` (checkpoints taken and encoded, sent nowhere),
#               load from this machine; the pause figures come from its epochs.json;
#   replicated  one primary and one backup in the local lab (`tardi lab up --machines 2`),
#               deployed with `[tardi.epoch] interval_ms = MS`, load from the lab's client node,
#               output held until each epoch is acknowledged;
# at each epoch interval of EPOCHS (default "5 10 20" ms).
#
# CPUs (PIN, default 1): the untracked and tracked services (with their checkpointer) run on
# CPU SVC_CPUS (0), the load generator on LOAD_CPUS (1). Unpinned on a 2-CPU machine,
# redis-benchmark alone keeps one CPU 100% busy against the untracked service (it, not the
# service, is the bottleneck), so what the checkpointer's CPU costs shows up as load
# generator time lost, not as service time lost. Pinned, the service shares its own CPU with
# its protection, as on a machine whose clients are elsewhere. PIN=0 leaves the scheduler
# free (the figures before 2026-11-26). The replicated cases are not pinned (the lab's
# primary, backup and client would need three CPUs).
#
# Writes bench/out/throughput-STAMP.md (markdown tables) and bench/out/throughput-STAMP.jsonl
# (one object per case). Reports figures only; asserts nothing.
#
# Usage: bench/throughput.sh [SERVICES...]   SERVICES: redis memcached (default: both)
# Env:   EPOCHS ("5 10 20")  REDIS_N (500000)  KV_SECONDS (5)  MODES ("untracked tracked replicated")
#        PIN (1)  SVC_CPUS (0)  LOAD_CPUS (1)   see "CPUs" above
#        TARDI         the tardi binary to measure (default: the one built here), for A/B runs
#        WAIT_QUIET=N  wait up to N s for the CPUs to be <= 20% busy before each case
#        EPOCH_TOML    more lines for the tracked and replicated cases' [tardi.epoch] table,
#                      for an A/B of a setting (e.g. EPOCH_TOML="encode_budget = 0"); recorded
#                      in each case's "epoch_toml"
# Run as root (namespaces, sandboxes). About 6 minutes per service on an idle machine.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT_DIR="$HERE/out"
. "$HERE/lib.sh"
SERVICES=("$@")
((${#SERVICES[@]})) || SERVICES=(redis memcached)
read -r -a EPOCHS <<<"${EPOCHS:-5 10 20}"
read -r -a MODES <<<"${MODES:-untracked tracked replicated}"
REDIS_N="${REDIS_N:-500000}"
KV_SECONDS="${KV_SECONDS:-5}"
PIN="${PIN:-1}"
SVC_PIN=() LOAD_PIN=()
if ((PIN)); then
    SVC_PIN=(taskset -c "${SVC_CPUS:-0}")
    LOAD_PIN=(taskset -c "${LOAD_CPUS:-1}")
fi

need_root "network namespaces and sandboxes"
ensure_tools redis-server redis-server redis-benchmark redis-tools memcached memcached python3 python3

echo "building tardi and kv_load (release)..." >&2
(cd "$ROOT" && cargo build --release -q && cargo build --release -q --example kv_load) >&2
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
TARDI="${TARDI:-$TARGET/release/tardi}"
KV="$TARGET/release/examples/kv_load"
mkdir -p "$OUT_DIR"
STAMP="$(date -u +%Y%m%d-%H%M%S)"
JSONL="$OUT_DIR/throughput-$STAMP.jsonl"
MD="$OUT_DIR/throughput-$STAMP.md"
TMP="$(mktemp -d /tmp/tardi-throughput.XXXXXX)"
LAB_OURS=0
cleanup() {
    pkill -INT -f "$TARDI (run|profile) $TMP" 2>/dev/null || true
    # The lab is global on this machine: take it down only if this run brought it up (without
    # a replicated case, another user's lab is left alone).
    ((LAB_OURS)) && { "$TARDI" lab down >/dev/null 2>&1 || true; }
    rm -rf "$TMP"
}
trap cleanup EXIT

# The manifest of SERVICE with [tardi.epoch] interval_ms = MS (a copy in $TMP).
manifest() {
    local svc=$1 ms=$2 m="$TMP/$1-$2.manifest"
    cp "$ROOT/gramine-manifests/$svc.manifest" "$m"
    grep -q '^\[tardi.epoch\]' "$m" && { echo "$svc.manifest has [tardi.epoch]: update manifest()" >&2; exit 1; }
    printf '\n[tardi.epoch]\ninterval_ms = %s\n' "$ms" >>"$m"
    [[ -z "${EPOCH_TOML:-}" ]] || printf '%s\n' "$EPOCH_TOML" >>"$m"
    echo "$m"
}

# Runs the load of SERVICE against ADDR, through PREFIX (e.g. `tardi lab exec client --`);
# prints one JSON object per test: {"test","rps","p50_ms","p99_ms"}.
load() {
    local svc=$1 addr=$2; shift 2
    case $svc in
        redis)
            "$@" redis-benchmark -h "$addr" -c 50 -n "$REDIS_N" -r 100000 -d 64 -t set,get --csv 2>/dev/null |
                python3 -c '
import csv, json, sys
rows = list(csv.reader(sys.stdin))
head = rows[0]
for r in rows[1:]:
    d = dict(zip(head, r))
    print(json.dumps({"test": d["test"], "rps": float(d["rps"]), "p50_ms": float(d["p50_latency_ms"]), "p99_ms": float(d["p99_latency_ms"])}))'
            ;;
        memcached)
            for t in set get; do
                "$@" "$KV" --addr "$addr:11211" --test "$t" --seconds "$KV_SECONDS" |
                    python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
print(json.dumps({"test": d["test"].upper(), "rps": d["rps"], "p50_ms": d["p50_ms"], "p99_ms": d["p99_ms"], "errors": d["errors"]}))'
            done
            ;;
    esac
}

port_of() { case $1 in redis) echo 6379 ;; memcached) echo 11211 ;; esac; }

# Waits until ADDR:PORT accepts TCP connections (through PREFIX).
wait_port() {
    local addr=$1 port=$2; shift 2
    for _ in $(seq 100); do
        "$@" bash -c "exec 3<>/dev/tcp/$addr/$port" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "nothing listens on $addr:$port" >&2
    return 1
}

record() { # SERVICE MODE MS(or -) EXTRA_JSON, load results on stdin
    python3 -c '
import json, os, sys
svc, mode, ms, extra = sys.argv[1:5]
extra = json.loads(extra)
for line in sys.stdin:
    d = json.loads(line)
    d.update({"service": svc, "mode": mode, "epoch_ms": None if ms == "-" else float(ms)}, **extra)
    if mode != "untracked" and os.environ.get("EPOCH_TOML"):
        d["epoch_toml"] = os.environ["EPOCH_TOML"]
    print(json.dumps(d))' "$@" | tee -a "$JSONL" >&2
}

untracked() {
    local svc=$1 m="$TMP/$1-run.manifest"
    cp "$ROOT/gramine-manifests/$svc.manifest" "$m"
    "${SVC_PIN[@]}" "$TARDI" run "$m" --json >"$TMP/run.json" 2>"$TMP/run.err" &
    local pid=$!
    for _ in $(seq 100); do grep -q started "$TMP/run.json" 2>/dev/null && break; sleep 0.1; done
    local addr
    addr=$(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["address"])' "$TMP/run.json")
    wait_port "$addr" "$(port_of "$svc")"
    wait_quiet >&2
    local busy; busy=$(cpu_busy_pct 1)
    load "$svc" "$addr" "${LOAD_PIN[@]}" | record "$svc" untracked - "{\"cpu_busy_before\": $busy, \"pinned\": $PIN}"
    kill -INT "$pid"; wait "$pid" || true
}

tracked() {
    local svc=$1 ms=$2 m out="$TMP/prof-$1-$2"
    m=$(manifest "$svc" "$ms")
    "${SVC_PIN[@]}" "$TARDI" profile "$m" --interval "${ms}ms" --duration 600s --out "$out" >"$TMP/prof.log" 2>"$TMP/prof.err" &
    local pid=$!
    local addr=""
    for _ in $(seq 200); do
        addr=$(sed -nE 's/.*\(address ([0-9.]+),.*/\1/p' "$TMP/prof.log" | head -1)
        [[ -n "$addr" ]] && break
        sleep 0.1
    done
    [[ -n "$addr" ]] || { cat "$TMP/prof.log" "$TMP/prof.err" >&2; exit 1; }
    wait_port "$addr" "$(port_of "$svc")"
    wait_quiet >&2
    local busy; busy=$(cpu_busy_pct 1)
    local res; res=$(load "$svc" "$addr" "${LOAD_PIN[@]}")
    kill -INT "$pid"; wait "$pid" || true
    local pause
    pause=$(python3 "$HERE/pause_parts.py" --json "$out/epochs.json")
    echo "$res" | record "$svc" tracked "$ms" "{\"cpu_busy_before\": $busy, \"pinned\": $PIN, \"epochs\": $pause}"
}

replicated() {
    local svc=$1 ms=$2 m
    m=$(manifest "$svc" "$ms")
    local L=("$TARDI" lab exec client --)
    "${L[@]}" "$TARDI" deploy "$m" --backups 1 --timeout 120s >/dev/null
    local addr
    addr=$("${L[@]}" "$TARDI" status --json | python3 -c '
import json, sys
s = json.load(sys.stdin)
print(next(x["address"] for x in s["services"] if x["name"] == sys.argv[1]))' "$svc")
    wait_port "$addr" "$(port_of "$svc")" "${L[@]}"
    sleep 1
    wait_quiet >&2
    local busy; busy=$(cpu_busy_pct 1)
    load "$svc" "$addr" "${L[@]}" | record "$svc" replicated "$ms" "{\"cpu_busy_before\": $busy}"
    "${L[@]}" "$TARDI" undeploy "$svc" >/dev/null
}

echo "# Throughput, $STAMP (commit $(git -C "$ROOT" rev-parse --short HEAD), PIN=$PIN${EPOCH_TOML:+, [tardi.epoch] + $EPOCH_TOML}); load at start $(cut -d' ' -f1-3 /proc/loadavg)" >"$MD"
for svc in "${SERVICES[@]}"; do
    for mode in "${MODES[@]}"; do
        case $mode in
            untracked) echo "[throughput] $svc untracked" >&2; untracked "$svc" ;;
            tracked) for ms in "${EPOCHS[@]}"; do echo "[throughput] $svc tracked $ms ms" >&2; tracked "$svc" "$ms"; done ;;
            replicated)
                LAB_OURS=1
                "$TARDI" lab down >/dev/null 2>&1 || true
                "$TARDI" lab up --machines 2 >/dev/null
                for ms in "${EPOCHS[@]}"; do echo "[throughput] $svc replicated $ms ms" >&2; replicated "$svc" "$ms"; done
                "$TARDI" lab down >/dev/null
                LAB_OURS=0
                ;;
            *) echo "unknown mode $mode" >&2; exit 2 ;;
        esac
    done
done
python3 - "$JSONL" >>"$MD" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
for svc in dict.fromkeys(r["service"] for r in rows):
    print(f"\n## {svc}\n")
    print("| test | mode | epoch ms | req/s | of untracked | p50 ms | p99 ms | pause p50 / p99 ms (tracked; the loop's CPU time in it, p50) | epochs/s | interval p50 ms | lengthened |")
    print("|---|---|---:|---:|---:|---:|---:|---|---:|---:|---:|")
    for test in dict.fromkeys(r["test"] for r in rows if r["service"] == svc):
        base = next((r["rps"] for r in rows if r["service"] == svc and r["test"] == test and r["mode"] == "untracked"), None)
        for r in rows:
            if r["service"] != svc or r["test"] != test:
                continue
            share = f"**{100 * r['rps'] / base:.1f}%**" if base and r["mode"] != "untracked" else ""
            e = r.get("epochs")
            pause = (f"{e['pause_p50_us'] / 1000:.2f} / {e['pause_p99_us'] / 1000:.2f}"
                     + (f" (cpu {e['pause_cpu_p50_us'] / 1000:.2f})" if e.get('pause_cpu_p50_us') else "")) if e else ""
            eps = f"{e['epochs_per_s']:.0f}" if e else ""
            ivl = f"{e.get('interval_p50_us', 0) / 1000:.1f}" if e else ""
            lng = f"{100 * e.get('lengthened_share', 0):.0f}%" if e else ""
            ms = "" if r["epoch_ms"] is None else f"{r['epoch_ms']:g}"
            print(f"| {test} | {r['mode']} | {ms} | {r['rps']:.0f} | {share} | {r['p50_ms']:.3f} | {r['p99_ms']:.3f} | {pause} | {eps} | {ivl} | {lng} |")
EOF
cat "$MD"
echo "raw: $JSONL" >&2
