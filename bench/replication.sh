#!/usr/bin/env bash
# Replication benchmarks on the local lab (network namespaces; Tardigrade NSDI'15 §5.2–5.6,
# Figs. 3–6). Each replicated case is measured against the same service unreplicated
# (`tardi run` in machine m1) in the same run. Driven by examples/replication_bench/:
#
#   ping       UDP ping latency CDF (sequential pings from the client node) and the primary's
#              epoch-interval CDF (instances run with --epoch-log), dirtier at 0 MB/s  (Fig. 3)
#   dirty      ping latency and checkpoint size against the dirtying rate, 0-50% of a link
#              throttled to 1 Gb/s (instances run with --link-bandwidth 1gbit)       (Figs. 4-5)
#   backups    one against two backups, at 0/10/20% dirtying                           (Fig. 6)
#   failover   the longest silence a pinging client sees when the primary's, or a backup's,
#              machine loses power at a random moment (20 trials each)                  (§5.6)
#   redis      redis-benchmark -c 50 -t set,get, unpipelined and -P 16
#   floor      the same Redis with its output held per epoch and nothing captured: the output
#              gate alone, the gate and an acknowledgement from m2, and the service also stopped
#              (ptrace) at each boundary, against unreplicated and against Tardi in one lab:
#              the bound any checkpoint-replication design meets on this machine (not in the
#              default set)
#   transport  gRPC stream against plain TCP round trip (instance/examples/transport_rtt.rs)
#
# Writes bench/out/replication-<part>-STAMP.json (raw figures; the failover part also keeps the
# daemons' logs in bench/out/replication-failover-STAMP-logs/), prints markdown tables (also
# in bench/out/replication-STAMP.md) and draws docs/img/replication-*.png. Reports figures only;
# asserts nothing about them. The lab is one per machine: each case waits for it (other users'
# tests) and holds it only while measuring. Traffic stays inside the lab's namespaces.
#
# Usage: bench/replication.sh [PARTS...]   PARTS: failover redis floor ping dirty backups transport
#                                          (default: all, in that order)
# Env:   WAIT_QUIET=N   before each case, wait up to N s for the CPUs to be <= 20% busy (the busy
#                       share of the 1 s before each case is recorded either way)
#        PINGS (10000)  ping: pings per case;  DIRTY_PINGS (3000): dirty and backups
#        TRIALS (20)    failover: trials per fault;  FAILOVER_RATE (10) MB/s, FAILOVER_MB (100) MiB
#        REDIS_N (100000) REDIS_NP (1000000)   redis-benchmark -n, unpipelined and -P 16 (redis, floor)
#        RATES ("0,12.5,25,37.5,50,62.5")  dirty: MB/s;  BACKUP_RATES ("0,12.5,25")
#        FULL_PAGES=1   dirty and backups with bench/page_dirtier.c (whole pages of random bytes,
#                       as Tardigrade's ping server: checkpoints as large as the dirtying) instead
#                       of the dirtier (one byte per page: delta-encoded to almost nothing);
#                       results and plots get the suffix -full
#        KEEP_SCRATCH=1 keep the scratch directory (the instances' epoch logs, one JSON line per
#                       epoch with the pause's parts: `bench/pause_parts.py` reads them)
#        TARDI         the tardi binary to measure (default: the one built here), for A/B runs
#        REDIS_MANIFEST another manifest for the redis part (e.g. with other [tardi.epoch] knobs)
#        EXTRA          more arguments for replication_bench (e.g. --fresh-lab)
# Run as root (namespaces, sandboxes). Needs gcc, redis-server and redis-benchmark. The whole
# set takes about 30-40 minutes on an idle machine (much longer on a busy one).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT_DIR="$HERE/out"
. "$HERE/lib.sh"
PARTS=("$@")
((${#PARTS[@]})) || PARTS=(failover redis ping dirty backups transport)

need_root "network namespaces and sandboxes"
ensure_tools cc "gcc libc6-dev" redis-server redis-server redis-benchmark redis-tools

echo "building tardi and replication_bench (release)..." >&2
(cd "$ROOT" && cargo build --release -q && cargo build --release -q --example replication_bench) >&2
TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
BENCH="$TARGET/release/examples/replication_bench"
mkdir -p "$ROOT/target/tardi-test-programs" "$OUT_DIR"
DIRTIER="$ROOT/target/tardi-test-programs/dirtier"
cc -O2 -g -pthread -Wall -Wextra -o "$DIRTIER" "$ROOT/tests/programs/dirtier.c"
FULL=()
if [[ "${FULL_PAGES:-0}" == 1 ]]; then
    cc -O2 -g -pthread -Wall -Wextra -o "$ROOT/target/tardi-test-programs/page_dirtier" "$HERE/page_dirtier.c"
    FULL=(--full-pages "$ROOT/target/tardi-test-programs/page_dirtier")
fi

STAMP="$(date -u +%Y%m%d-%H%M%S)"
OUT="$OUT_DIR/replication-$STAMP.md"
COMMON=(--tardi "${TARDI:-$TARGET/release/tardi}" --dirtier "$DIRTIER" --stamp "$STAMP")
[[ "${WAIT_QUIET:-0}" == 0 ]] || COMMON+=(--wait-quiet "${WAIT_QUIET}s")

{
    echo "# Tardi replication benchmarks ($STAMP)"
    echo
    echo "Machine: $(nproc) CPUs, $(awk '/MemTotal/{printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), kernel $(uname -r), redis $(redis-server --version | awk '{sub("v=","",$3); print $3}'). Load average at start: $(cut -d' ' -f1-3 /proc/loadavg); CPUs $(cpu_busy_pct 1)% busy."
    src="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if ! (cd "$ROOT" && git --no-optional-locks diff --quiet HEAD 2>/dev/null); then
        src="$src + uncommitted changes in $(cd "$ROOT" && git --no-optional-locks diff --name-only HEAD | tr '\n' ' ')"
    fi
    echo "Source: $src."
    echo "Command: $0 ${PARTS[*]} (WAIT_QUIET=${WAIT_QUIET:-0} FULL_PAGES=${FULL_PAGES:-0} TRIALS=${TRIALS:-20} FAILOVER_MB=${FAILOVER_MB:-100})."
    echo
} | tee "$OUT"

for part in "${PARTS[@]}"; do
    echo "[replication.sh] $part: CPUs $(cpu_busy_pct 1)% busy, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    case "$part" in
        ping)
            "$BENCH" ping "${COMMON[@]}" --pings "${PINGS:-10000}" ${EXTRA:-} ;;
        dirty)
            "$BENCH" dirty "${COMMON[@]}" "${FULL[@]}" --dirty-pings "${DIRTY_PINGS:-3000}" \
                --rates "${RATES:-0,12.5,25,37.5,50,62.5}" ${EXTRA:-} ;;
        backups)
            "$BENCH" backups "${COMMON[@]}" "${FULL[@]}" --dirty-pings "${DIRTY_PINGS:-3000}" \
                --backup-rates "${BACKUP_RATES:-0,12.5,25}" ${EXTRA:-} ;;
        failover)
            "$BENCH" failover "${COMMON[@]}" --trials "${TRIALS:-20}" \
                --failover-rate "${FAILOVER_RATE:-10}" --failover-mb "${FAILOVER_MB:-100}" ${EXTRA:-} ;;
        redis|floor)
            "$BENCH" "$part" "${COMMON[@]}" --redis-n "${REDIS_N:-100000}" --redis-np "${REDIS_NP:-1000000}" ${EXTRA:-} ;;
        transport)
            echo
            echo "### Transport round trip (cargo run --release -p tardi-instance --example transport_rtt)"
            echo
            (cd "$ROOT" && cargo run --release -q -p tardi-instance --example transport_rtt) ;;
        *) echo "unknown part $part (failover redis floor ping dirty backups transport)" >&2; exit 2 ;;
    esac | tee -a "$OUT"
done
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)." | tee -a "$OUT"
echo "written: $OUT, $OUT_DIR/replication-*-$STAMP.json (raw) and docs/img/replication-*.png" >&2
