#!/usr/bin/env bash
# A/B experiment behind the quiesce analysis in docs/BENCHMARKS.md: the library's stop algorithm
# re-implemented in C (bench/stop_variants.c) with four ways of waiting for each thread's stop
# (block, poll, nap, nap1; see the C file), run interleaved on the same target process so that
# they see the same machine conditions. Not a benchmark of Tardi's code itself.
#
# Usage: bench/stop_variants.sh      (root; writes bench/out/stop_variants-DATE.md)
# Env:   ITERATIONS (200), GAP_MS (2), THREADS ("1 4 16"), MODES ("futex busy"),
#        VARIANTS ("block poll nap nap1"), REPEAT (2: each variant runs this many times per case)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT_DIR="$HERE/out"
ITERATIONS="${ITERATIONS:-200}"
GAP_MS="${GAP_MS:-2}"
THREADS="${THREADS:-1 4 16}"
MODES="${MODES:-futex busy}"
VARIANTS="${VARIANTS:-block poll nap nap1}"
REPEAT="${REPEAT:-2}"

. "$HERE/lib.sh"
need_root "ptrace of another process"
ensure_tools cc "gcc libc6-dev" jq jq

threads_workdir stopvar
cc -O2 -Wall -o "$WORK/stop_variants" "$HERE/stop_variants.c"

mkdir -p "$OUT_DIR"
OUT="$OUT_DIR/stop_variants-$(date +%Y%m%d-%H%M%S).md"
{
    echo "## Stop variants (C replica of Stopped::stop), $ITERATIONS cycles $GAP_MS ms apart, $REPEAT interleaved runs per variant"
    echo
    echo "Machine: $(nproc) CPUs, kernel $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ); CPU busy before: $(cpu_busy_pct 2)%."
    echo
    echo "| threads | state | variant | stop median µs (each run) | stop min µs (lowest) | stop p99 µs (highest) |"
    echo "|---:|---|---|---|---:|---:|"
} | tee "$OUT"
for mode in $MODES; do
    for n in $THREADS; do
        "$WORK/threads" "$mode" "$n" > "$WORK/ready" &
        TARGET_PID=$!
        for _ in $(seq 1 500); do [[ -s "$WORK/ready" ]] && break; sleep 0.01; done
        sleep 0.2
        declare -A med=() mins=() p99=()
        for _ in $(seq 1 "$REPEAT"); do
            for v in $VARIANTS; do
                j="$("$WORK/stop_variants" "$v" "$TARGET_PID" "$ITERATIONS" "$GAP_MS")"
                med[$v]+="$(jq .stop_us.median <<<"$j") "
                mins[$v]+="$(jq .stop_us.min <<<"$j") "
                p99[$v]+="$(jq .stop_us.p99 <<<"$j") "
            done
        done
        kill -KILL "$TARGET_PID"; wait "$TARGET_PID" 2>/dev/null || true; TARGET_PID=""
        for v in $VARIANTS; do
            echo "| $n | $mode | $v | ${med[$v]% } | $(awk '{m=$1; for (i=2;i<=NF;i++) if ($i<m) m=$i; print m}' <<<"${mins[$v]}") | $(awk '{m=$1; for (i=2;i<=NF;i++) if ($i>m) m=$i; print m}' <<<"${p99[$v]}") |" | tee -a "$OUT"
        done
        unset med mins p99
    done
done
echo >&2
echo "written: $OUT" >&2
