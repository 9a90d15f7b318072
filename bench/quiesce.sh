#!/usr/bin/env bash
# Quiesce benchmark: how long Tardi's ptrace quiescence (tardi_checkpointer::ptrace::Stopped::stop:
# PTRACE_SEIZE + PTRACE_INTERRUPT every thread, wait for every interrupt stop) takes, and the full
# stop + resume (PTRACE_DETACH) cycle, for a process of 1, 4 and 16 threads that are either blocked
# (futex wait, nanosleep) or spinning in user space.
#
# Usage: bench/quiesce.sh            (run as root; writes bench/out/quiesce-DATE.md)
# Env:   ITERATIONS (default 200)    stop/resume cycles per case
#        THREADS    (default "1 4 16")
#        MODES      (default "futex sleep busy")
#        GAP_MS     (default 2) pause between cycles. With 0 the CPUs never go idle between a
#                   resume and the next stop; a real checkpointer sleeps for its epoch (~10 ms),
#                   so the default keeps that idle period in the figures
#        WAIT_QUIET=N  before each case, wait up to N s for the machine to be <= 20% busy
#                   (other processes' load distorts the figures; the busy % is reported)
#        RT=1       run the tracer as SCHED_FIFO 50 (chrt), to separate ptrace's own cost from
#                   waiting for a CPU (the tracer competes with busy threads on few cores)
#        PIN=same      pin the target's threads and the tracer to CPU 0 (no cross-CPU wake-ups)
#        PIN=split     pin the target's threads to CPU 0 and the tracer to CPU 1 (every stop and
#                      wake-up crosses CPUs)
# Reports figures only; it asserts nothing about them.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT_DIR="$HERE/out"
ITERATIONS="${ITERATIONS:-200}"
THREADS="${THREADS:-1 4 16}"
MODES="${MODES:-futex sleep busy}"
GAP_MS="${GAP_MS:-2}"

. "$HERE/lib.sh"
need_root "ptrace of another process"

ensure_tools cc "gcc libc6-dev" jq jq

echo "building quiesce_bench (release)..." >&2
(cd "$ROOT" && cargo build --release -q -p tardi-checkpointer --example quiesce_bench) >&2
BENCH="$ROOT/target/release/examples/quiesce_bench"
TRACER=("$BENCH"); TRACER_DESC="tracer at default priority (SCHED_OTHER, nice 0)"
if [[ "${RT:-0}" == 1 ]]; then TRACER=(chrt -f 50 "$BENCH"); TRACER_DESC="tracer SCHED_FIFO 50"; fi
threads_workdir quiesce

mkdir -p "$OUT_DIR"
STAMP="$(date +%Y%m%d-%H%M%S)"
SUFFIX=""; [[ "${RT:-0}" == 1 ]] && SUFFIX="-rt"
[[ "$GAP_MS" == 2 ]] || SUFFIX="$SUFFIX-gap$GAP_MS"
TARGET_WRAP=(); PIN_DESC=""
case "${PIN:-}" in
    "") ;;
    same) TARGET_WRAP=(taskset -c 0); TRACER=(taskset -c 0 "${TRACER[@]}"); SUFFIX="$SUFFIX-pin-same"
          PIN_DESC=", target and tracer pinned to CPU 0" ;;
    split) TARGET_WRAP=(taskset -c 0); TRACER=(taskset -c 1 "${TRACER[@]}"); SUFFIX="$SUFFIX-pin-split"
          PIN_DESC=", target pinned to CPU 0, tracer to CPU 1" ;;
    *) echo "PIN must be same or split" >&2; exit 2 ;;
esac

OUT="$OUT_DIR/quiesce-$STAMP$SUFFIX.md"
{
    echo "## Quiesce: Stopped::stop + resume, $ITERATIONS cycles per case $GAP_MS ms apart, $TRACER_DESC$PIN_DESC"
    echo
    echo "Machine: $(nproc) CPUs, kernel $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ); load average before: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Source: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" && git --no-optional-locks diff --quiet HEAD -- checkpointer 2>/dev/null || echo ' + uncommitted changes in checkpointer/')."
    echo
    echo "Idle states: $(cat /sys/devices/system/cpu/cpuidle/current_driver 2>/dev/null || echo unknown) cpuidle driver, guest_halt_poll_ns=$(cat /sys/module/haltpoll/parameters/guest_halt_poll_ns 2>/dev/null || echo n/a)."
    echo
    echo "CPU busy = share of all CPUs busy with other work during the 2 s before each case."
    echo "list tasks = one listing of /proc/PID/task (each stop does at least two)."
    echo
    echo "| threads | state | stop min µs | stop median µs | stop p99 µs | stop max µs | stop+resume min µs | stop+resume median µs | stop+resume p99 µs | list tasks median µs | CPU busy before |"
    echo "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
} | tee "$OUT"

for mode in $MODES; do
    for n in $THREADS; do
        busy="$(wait_quiet)"
        "${TARGET_WRAP[@]}" "$WORK/threads" "$mode" "$n" > "$WORK/ready" &
        TARGET_PID=$!
        for _ in $(seq 1 500); do [[ -s "$WORK/ready" ]] && break; sleep 0.01; done
        [[ -s "$WORK/ready" ]] || { echo "threads $mode $n did not start" >&2; exit 1; }
        sleep 0.2 # let every thread reach its steady state (blocked or spinning)
        got="$(ls "/proc/$TARGET_PID/task" | wc -l)"
        [[ "$got" -eq "$n" ]] || { echo "expected $n threads, found $got" >&2; exit 1; }
        json="$("${TRACER[@]}" "$TARGET_PID" "$ITERATIONS" "$GAP_MS")"
        kill -KILL "$TARGET_PID"; wait "$TARGET_PID" 2>/dev/null || true; TARGET_PID=""
        jq -r --arg mode "$mode" --arg busy "$busy" '"| \(.threads) | \($mode) | \(.stop_us.min) | \(.stop_us.median) | \(.stop_us.p99) | \(.stop_us.max) | \(.cycle_us.min) | \(.cycle_us.median) | \(.cycle_us.p99) | \(.list_tids_us.median) | \($busy)% |"' <<<"$json" | tee -a "$OUT"
        jq -c --arg mode "$mode" --argjson busy "$busy" '{mode:$mode, cpu_busy_before_pct:$busy} + .' <<<"$json" >> "$OUT_DIR/quiesce-$STAMP$SUFFIX.jsonl"
    done
done
echo >&2
echo "written: $OUT" >&2
