#!/usr/bin/env bash
# Incremental-checkpoint benchmark: the epoch loop (tardi_checkpointer::epoch, userfaultfd
# write-protect in async mode + PAGEMAP_SCAN) on the memory-dirtying UDP service
# (tests/programs/dirtier.c) and on Redis under redis-benchmark, outside any sandbox (tracking
# is the same inside one). Four parts, all run by checkpointer/examples/epoch_bench.rs:
#
#   1. slowdown  the dirtier at 0/10/50/200 MB/s, untracked vs tracked (10 ms epochs, the default
#                cap, 4,000 pages since 2026-11-26 and 1,000 before, and cap off): its CPU time,
#                minor faults, UDP ping round trips, and whether it kept its rate
#   2. pause     pause per epoch at ~10, 100, 1,000 and 10,000 dirty pages (cap off), and its parts
#   3. bytes     page-granular bytes vs encoded bytes per codec, on the dirtier at 50 MB/s, on
#                Redis under `redis-benchmark -t set,get,incr,lpush -r 100000 -d 64
#                -n 10000000 -q`, and on Redis under SETs of random values
#   4. hot       hot pages on (hot_epochs 3) vs off (0): pause, write faults per epoch (the
#                target's minor-fault delta), hot pages, bytes
#
# Prints markdown tables and writes them to bench/out/epochs-STAMP.md; the raw JSON lines (one per
# case, and one per epoch unless RAW_EPOCHS=0) go to bench/out/epochs-STAMP.jsonl and
# redis-benchmark's output to bench/out/epochs-STAMP-redis-benchmark.log.
# Reports figures only; asserts nothing about them. Takes about 5 minutes on an idle machine.
#
# Usage: bench/epochs.sh [PARTS...]       PARTS: slowdown pause bytes hot (default: all four)
# Env:   WAIT_QUIET=N   before each case, wait up to N s for the CPUs to be <= 20% busy (the busy
#                       % of the 1 s before each case, and the other processes' share of the CPUs
#                       during it, are reported either way)
#        SECS (6) PINGS (200) RATES ("0,10,50,200") MODES ("none,uffd,uffd-nocap,mprotect") REPS (1)
#                       slowdown: seconds per case, pings per case, MB/s, modes, repetitions
#        POINTS ("10:10:500,100:10:500,700:10:500,1000:10:500,10000:100:200")
#                       pause: target dirty pages:interval ms:epochs. The dirtier catches up
#                       after each pause, so an epoch holds more pages than the target (700 →
#                       about 1,000); the tables report what was achieved
#        EPOCHS (300)   bytes and hot: epochs per case (after the warm-up)
#        ROUNDS (2)     hot: interleaved on/off rounds
#        MB (100)       dirtier region, MiB
#        PORT (17100) REDIS_PORT (16390)
#        RAW_EPOCHS (1) per-epoch JSON lines in the .jsonl
#        TRACKER (uffd) the tracker for pause, bytes and hot (slowdown has its own modes)
#        PRECOPY (1)    0: no dirty-page pre-copy in pause, bytes and hot
#        ENCODE_BUDGET  the encoding's budget (EpochConfig::encode_budget; default its default)
# Run as root (ptrace). Needs gcc, redis-server and redis-benchmark.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT_DIR="$HERE/out"
. "$HERE/lib.sh"
PARTS=("$@")
((${#PARTS[@]})) || PARTS=(slowdown pause bytes hot)

need_root "ptrace of another process"
ensure_tools cc "gcc libc6-dev" redis-server redis-server redis-benchmark redis-tools

echo "building epoch_bench (release)..." >&2
(cd "$ROOT" && cargo build --release -q -p tardi-checkpointer --example epoch_bench) >&2
BENCH="${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/epoch_bench"
mkdir -p "$ROOT/target/bench" "$OUT_DIR"
DIRTIER="$ROOT/target/bench/dirtier"
cc -O2 -g -pthread -Wall -Wextra -o "$DIRTIER" "$ROOT/tests/programs/dirtier.c"

STAMP="$(date +%Y%m%d-%H%M%S)"
OUT="$OUT_DIR/epochs-$STAMP.md"
RAW="$OUT_DIR/epochs-$STAMP.jsonl"
RLOG="$OUT_DIR/epochs-$STAMP-redis-benchmark.log"
LOG="$OUT_DIR/epochs-$STAMP.log"
COMMON=(--dirtier "$DIRTIER" --raw "$RAW" --raw-epochs "${RAW_EPOCHS:-1}" --wait-quiet "${WAIT_QUIET:-0}"
        --mb "${MB:-100}" --port "${PORT:-17100}" --redis-port "${REDIS_PORT:-16390}" --bench-log "$RLOG")

{
    echo "# Tardi incremental checkpoints ($STAMP)"
    echo
    echo "Machine: $(nproc) CPUs, $(awk '/MemTotal/{printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), kernel $(uname -r), redis $(redis-server --version | awk '{sub("v=","",$3); print $3}'). Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    # Read-only git queries: which commit, and a fingerprint of uncommitted library changes
    # (other people edit checkpointer/src while benchmarks run).
    src="$(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    if ! (cd "$ROOT" && git --no-optional-locks diff --quiet HEAD -- checkpointer/src 2>/dev/null); then
        src="$src + uncommitted changes in $(cd "$ROOT" && git --no-optional-locks diff --name-only HEAD -- checkpointer/src | tr '\n' ' ')(diff sha256 $(cd "$ROOT" && git --no-optional-locks diff HEAD -- checkpointer/src | sha256sum | cut -c1-12))"
    fi
    echo "Source: $src."
    echo "Command: $0 ${PARTS[*]} (WAIT_QUIET=${WAIT_QUIET:-0})."
    echo
    echo "CPU busy before = all CPUs' busy share in the 1 s before a case (nothing of ours running)."
    echo "other load = the share of all CPUs (user + system time) used by processes other than the"
    echo "benchmark, its target and redis-benchmark during the case."
    echo
} | tee "$OUT"

for part in "${PARTS[@]}"; do
    case "$part" in
        slowdown)
            "$BENCH" slowdown "${COMMON[@]}" --secs "${SECS:-6}" --pings "${PINGS:-200}" \
                --rates "${RATES:-0,10,50,200}" --modes "${MODES:-none,uffd,uffd-nocap,mprotect}" --reps "${REPS:-1}" ;;
        pause)
            "$BENCH" pause "${COMMON[@]}" --points "${POINTS:-10:10:500,100:10:500,700:10:500,1000:10:500,10000:100:200}" ;;
        bytes)
            "$BENCH" bytes "${COMMON[@]}" --epochs "${EPOCHS:-300}" --targets dirtier,redis,redis-rand ;;
        hot)
            "$BENCH" hot "${COMMON[@]}" --epochs "${EPOCHS:-300}" --rounds "${ROUNDS:-2}" ;;
        *) echo "unknown part $part (slowdown, pause, bytes, hot)" >&2; exit 2 ;;
    esac 2> >(tee -a "$LOG" >&2) | tee -a "$OUT"
done
echo "Load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)." | tee -a "$OUT"
echo >&2
echo "written: $OUT, $RAW, $LOG (progress, Redis load phases) and $RLOG" >&2
