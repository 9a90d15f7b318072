#!/usr/bin/env bash
# Where the CPU of a tracked Redis goes: Redis and its checkpointer share CPU 0 (as in
# bench/throughput.sh's pinned cases), redis-benchmark runs on CPU 1, and `perf record -C 0`
# samples CPU 0 for PERF_SECONDS in the middle of the load. Prints the throughput and CPU 0's
# time by thread and by the kernel paths and functions that make up the protection's cost
# (inclusive shares, so a path's callees are in its figure):
#   service: page faults   `asm_exc_page_fault` under the service's threads (the
#                          write-protect faults of the tracker, and ordinary ones)
#   epochs: copy           `process_vm_readv` (the pre-copy's and the pause's page copies)
#   epochs: encode         `PageCodec::encode_page` + `TwinStore::get`
#   epochs: ioctl          `ioctl` (PAGEMAP_SCAN, UFFDIO_WRITEPROTECT)
#   epochs: ptrace, open   the pause's stops and /proc reads
#
# Usage: bench/cpu_share.sh           (tracked, 10 ms epochs)
# Env:   MODE (tracked | untracked)  INTERVAL (10)  PERF_SECONDS (5)  REQUESTS (1500000)
#        TARDI (target/release/tardi, built if missing)  TARDI_ENV (extra VAR=VALUE words
#        for the service's `tardi` process, for an A/B of a build's hidden switch)
#        PROFILE_ARGS (more `tardi profile` arguments, e.g. "--no-precopy")
# Writes bench/out/cpu-share-STAMP.md and the perf data next to it. Asserts nothing.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
. "$HERE/lib.sh"
MODE="${MODE:-tracked}"
INTERVAL="${INTERVAL:-10}"
PERF_SECONDS="${PERF_SECONDS:-5}"
REQUESTS="${REQUESTS:-1500000}"
TARDI="${TARDI:-$ROOT/target/release/tardi}"
read -r -a TARDI_ENV <<<"${TARDI_ENV:-}"
read -r -a PROFILE_ARGS <<<"${PROFILE_ARGS:-}"

need_root "sandboxes and perf"
ensure_tools redis-server redis-server redis-benchmark redis-tools perf linux-perf python3 python3
[[ -x "$TARDI" ]] || (cd "$ROOT" && cargo build --release --bin tardi)

STAMP=$(date -u +%Y%m%d-%H%M%S)
OUT="$HERE/out/cpu-share-$STAMP"
mkdir -p "$OUT"
TMP=$(mktemp -d)
pid=""
cleanup() {
    [[ -n "$pid" ]] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$TMP"
}
trap cleanup EXIT

manifest="$ROOT/gramine-manifests/redis.manifest"
if [[ "$MODE" == tracked ]]; then
    taskset -c 0 env "${TARDI_ENV[@]}" "$TARDI" profile "$manifest" --interval "${INTERVAL}ms" \
        --duration 600s --out "$OUT/profile" "${PROFILE_ARGS[@]}" >"$TMP/log" 2>"$TMP/err" &
    pid=$!
    addr_of() { sed -nE 's/.*\(address ([0-9.]+),.*/\1/p' "$TMP/log" | head -1; }
else
    taskset -c 0 env "${TARDI_ENV[@]}" "$TARDI" run "$manifest" --json >"$TMP/log" 2>"$TMP/err" &
    pid=$!
    addr_of() { python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["address"])' "$TMP/log" 2>/dev/null || true; }
fi
addr=""
for _ in $(seq 200); do
    addr=$(addr_of)
    [[ -n "$addr" ]] && break
    sleep 0.1
done
[[ -n "$addr" ]] || { cat "$TMP/log" "$TMP/err" >&2; exit 1; }
for _ in $(seq 100); do
    redis-cli -h "$addr" ping >/dev/null 2>&1 && break
    sleep 0.1
done
bench() { taskset -c 1 redis-benchmark -h "$addr" -c 50 -n "$1" -r 100000 -d 64 -t set --csv; }
echo "warming up ($MODE, $addr)..." >&2
bench 300000 >/dev/null
bench "$REQUESTS" >"$TMP/bench.csv" &
load=$!
sleep 3
echo "perf on CPU 0 for ${PERF_SECONDS}s..." >&2
perf record -q -C 0 -g -o "$OUT/perf.data" -- sleep "$PERF_SECONDS" 2>/dev/null
wait "$load"
rps=$(tail -1 "$TMP/bench.csv" | cut -d, -f2 | tr -d '"')
# Reported once the service has stopped (while it ran, perf resolved none of the
# checkpointer's own symbols).
kill -INT "$pid"
wait "$pid" || true
pid=""

perf report -i "$OUT/perf.data" --children --sort comm,sym -q -g none --stdio 2>/dev/null >"$TMP/children"
perf report -i "$OUT/perf.data" --no-children --sort comm -q -g none --stdio 2>/dev/null >"$TMP/comms"
python3 - "$TMP/children" "$TMP/comms" "$rps" "$MODE" "$INTERVAL" "${TARDI_ENV[*]} ${PROFILE_ARGS[*]}" >"$OUT.md" <<'EOF'
import re, sys
children, comms, rps, mode, interval, extra = sys.argv[1:]
rows = []
for line in open(children):
    m = re.match(r"\s*([\d.]+)%\s+([\d.]+)%\s+(\S+)\s+\[[.k]\]\s+(.*\S)", line)
    if m:
        rows.append((float(m[1]), m[3], m[4]))
def share(comm_re, sym_re):
    return sum(p for p, c, s in rows if re.fullmatch(comm_re, c) and re.search(sym_re, s))
svc = r"redis-server|bio_.*|jemalloc_bg_thd|io_thd_.*"
parts = [
    ("service: page faults", share(svc, r"^asm_exc_page_fault$")),
    ("epochs: copy (process_vm_readv)", share("tardi-epochs", r"^__x64_sys_process_vm_readv$")),
    ("epochs: encode (encode_page, TwinStore::get)",
     share("tardi-epochs", r"PageCodec::encode_page$|TwinStore::get$")),
    ("epochs: ioctl (PAGEMAP_SCAN, write-protect)", share("tardi-epochs", r"^__x64_sys_ioctl$")),
    ("epochs: ptrace, wait4, open, getdents, readlink",
     share("tardi-epochs", r"^__x64_sys_(ptrace|wait4|openat|getdents64|readlinkat)$")),
]
by_comm = {}
for line in open(comms):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)", line)
    if m:
        by_comm[m[2]] = by_comm.get(m[2], 0) + float(m[1])
extra = f", {extra.strip()}" if extra.strip() else ""
print(f"# CPU 0 of {mode} Redis ({interval} ms epochs{extra}): {rps} SET/s\n")
print("| thread | share of CPU 0 |\n|---|---:|")
for c, p in sorted(by_comm.items(), key=lambda x: -x[1])[:8]:
    print(f"| {c} | {p:.1f}% |")
print("\n| path (inclusive) | share of CPU 0 |\n|---|---:|")
for name, p in parts:
    print(f"| {name} | {p:.1f}% |")
EOF
cat "$OUT.md"
