#!/usr/bin/env bash
# Checkpoint / restore benchmark for Redis under Tardi.
#
# For each data size: start Redis in a Tardi sandbox (`tardi run`, a private copy of
# gramine-manifests/redis.manifest named "bench-redis"), fill it with distinct keys until
# INFO memory used_memory reaches the size, take SNAPSHOTS full checkpoints with
# `tardi snapshot --json` (pause, quiesce and memory-copy times), then ROUNDS times: SIGTERM the
# running tardi, `tardi restore FILE --json`, record the restore phase timings, and check that
# DBSIZE equals the number of keys loaded. Prints markdown tables and writes them (plus the raw
# JSON lines) to bench/out/. Reports figures only; asserts nothing about them.
#
# Usage: bench/checkpoint_restore.sh            100 MiB only
#        BIG=1 bench/checkpoint_restore.sh      100 MiB and 1 GiB
# Env:   SIZES_MB   sizes in MiB of used_memory (default "100", or "100 1024" with BIG=1)
#        SNAPSHOTS  checkpoints per size (default 5)
#        ROUNDS     kill + restore rounds per size (default 3)
#        VALUE_SIZE bytes per value (default 1000)
#        WAIT_QUIET=N  before the snapshots and before each restore, wait up to N s for the
#                   machine to be <= 20% busy (other load distorts the figures; the busy % measured
#                   is reported either way)
#        WORK_DIR   where the checkpoint files' temporary directory is made (default /var/tmp;
#                   needs ~1.1x the largest size free)
# Run as root, from anywhere. Needs nothing named "bench-redis" running.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
OUT_DIR="$HERE/out"
NAME=bench-redis
DATA_HOST_DIR=/var/lib/tardi/$NAME
if [[ "${BIG:-0}" == 1 ]]; then SIZES_MB="${SIZES_MB:-100 1024}"; else SIZES_MB="${SIZES_MB:-100}"; fi
SNAPSHOTS="${SNAPSHOTS:-5}"
ROUNDS="${ROUNDS:-3}"
VALUE_SIZE="${VALUE_SIZE:-1000}"

. "$HERE/lib.sh"
need_root

# --- tools -------------------------------------------------------------------------------------
ensure_tools redis-server redis-server redis-cli redis-tools jq jq python3 python3

echo "building tardi (release)..." >&2
(cd "$ROOT" && cargo build --release -q) >&2
TARDI="$ROOT/target/release/tardi"

if [[ -S /run/tardi/$NAME/control.sock ]]; then
    echo "a sandbox named $NAME seems to be running (/run/tardi/$NAME/control.sock); stop it first" >&2
    exit 1
fi

WORK="$(mktemp -d "${WORK_DIR:-/var/tmp}/tardi-bench.XXXXXX")"
mkdir -p "$OUT_DIR"
STAMP="$(date +%Y%m%d-%H%M%S)"
OUT="$OUT_DIR/checkpoint_restore-$STAMP.md"
RAW="$OUT_DIR/checkpoint_restore-$STAMP.jsonl"
CUR_PID=""   # the foreground tardi (run or restore) currently serving

stop_current() {
    [[ -n "$CUR_PID" ]] || return 0
    local rc=0
    kill -TERM "$CUR_PID" 2>/dev/null || true
    wait "$CUR_PID" || rc=$?
    [[ $rc -eq 0 ]] || echo "warning: tardi (pid $CUR_PID) exited with status $rc" >&2
    CUR_PID=""
}
cleanup() {
    stop_current
    rm -rf "$WORK"
    if compgen -G "$DATA_HOST_DIR/data/core*" >/dev/null; then
        echo "the service dumped core: kept $DATA_HOST_DIR (remove it when done)" >&2
    else
        rm -rf "$DATA_HOST_DIR"
    fi
    if ! [[ -S /run/tardi/$NAME/control.sock ]]; then
        # Keep the service's log with the results, then remove what tardi leaves behind.
        [[ -f /run/tardi/$NAME/service.log ]] && cp /run/tardi/$NAME/service.log "$OUT_DIR/checkpoint_restore-$STAMP-service.log"
        rm -rf "/run/tardi/$NAME"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts "$@" (a foreground tardi command with --json) in the background and waits for its first
# stdout line. Sets CUR_PID, STARTED (the JSON line) and ADDR. Returns 1 if it exited first.
start_tardi() {
    local out="$WORK/tardi.out" err="$WORK/tardi.err"
    : > "$out"; : > "$err"
    "$@" > "$out" 2> "$err" &
    CUR_PID=$!
    while ! [[ -s "$out" ]] || [[ "$(tail -c1 "$out" | od -An -c | tr -d ' ')" != '\n' ]]; do
        if ! kill -0 "$CUR_PID" 2>/dev/null; then
            wait "$CUR_PID" || true
            CUR_PID=""
            echo "tardi exited before starting: $*" >&2
            sed 's/^/  stderr: /' "$err" >&2
            return 1
        fi
        sleep 0.002
    done
    STARTED="$(head -n1 "$out")"
    ADDR="$(jq -r .address <<<"$STARTED")"
}

rcli() { redis-cli -h "$ADDR" "$@"; }

wait_redis() {
    for _ in $(seq 1 2000); do
        [[ "$(rcli ping 2>/dev/null)" == PONG ]] && return 0
        sleep 0.005
    done
    echo "redis at $ADDR does not answer" >&2
    return 1
}

used_memory() { rcli info memory | tr -d '\r' | awk -F: '$1=="used_memory"{print $2}'; }

# Fills Redis with distinct keys until used_memory >= $1 bytes; prints the key count.
fill() {
    local target=$1 next=0 used per chunk
    used="$(used_memory)"
    # First guess: value + ~100 bytes of per-key overhead; then correct from what was observed.
    per=$((VALUE_SIZE + 100))
    while ((used < target)); do
        chunk=$(((target - used) / per + 1))
        ((next == 0)) && chunk=$((chunk * 95 / 100 + 1))
        python3 "$HERE/gen_sets.py" "$next" "$chunk" "$VALUE_SIZE" | rcli --pipe >/dev/null
        next=$((next + chunk))
        used="$(used_memory)"
        per=$(((used + next - 1) / next))
    done
    echo "$next"
}

# stats FIELD FILE: "min / median / max" of a numeric field over JSON lines, divided by $3.
stats() {
    jq -rs --arg f "$1" --argjson d "${3:-1}" '
        map(.[$f]) | sort | length as $n
        | (if $n % 2 == 1 then .[($n - 1) / 2] else (.[$n / 2 - 1] + .[$n / 2]) / 2 end) as $med
        | [.[0], $med, .[-1]] | map(. / $d | . * 10 | round / 10 | tostring) | join(" / ")' "$2"
}

MACHINE="$(nproc) CPUs, $(awk '/MemTotal/{printf "%.0f GiB RAM", $2/1048576}' /proc/meminfo), kernel $(uname -r), redis $(redis-server --version | awk '{sub("v=","",$3); print $3}')"
{
    echo "# Tardi checkpoint / restore benchmark ($STAMP)"
    echo
    echo "Machine: $MACHINE. Load average at start: $(cut -d' ' -f1-3 /proc/loadavg)."
    echo "Source: $(cd "$ROOT" && git rev-parse --short HEAD 2>/dev/null || echo unknown)$(cd "$ROOT" && git --no-optional-locks diff --quiet HEAD -- src checkpointer sandbox 2>/dev/null || echo ' + uncommitted changes')."
    echo "Redis filled with distinct ${VALUE_SIZE}-byte values until used_memory >= target;"
    echo "$SNAPSHOTS snapshots and $ROUNDS kill+restore rounds per size. Times: min / median / max."
} > "$OUT"
SNAP_ROWS=()
SNAP_FAILURES=()
RESTORE_ROWS=()

for mb in $SIZES_MB; do
    target=$((mb * 1024 * 1024))
    manifest="$WORK/$NAME.manifest"
    sed -e "s/^name = \"redis\"/name = \"$NAME\"/" \
        -e "s#file:/var/lib/tardi/redis/data#file:$DATA_HOST_DIR/data#" \
        "$ROOT/gramine-manifests/redis.manifest" > "$manifest"
    grep -q "^name = \"$NAME\"" "$manifest" || { echo "could not rename the manifest's sandbox" >&2; exit 1; }

    echo "== $mb MiB: starting redis" >&2
    start_tardi "$TARDI" run "$manifest" --json
    wait_redis
    keys="$(fill "$target")"
    dbsize="$(rcli dbsize)"
    used="$(used_memory)"
    echo "   loaded $dbsize keys, used_memory $used bytes" >&2
    [[ "$dbsize" == "$keys" ]] || echo "warning: DBSIZE $dbsize != keys written $keys" >&2

    busy="$(wait_quiet)"
    snapfile="$WORK/snap-$mb.tardi"
    snaps="$WORK/snaps-$mb.jsonl"
    : > "$snaps"
    for i in $(seq 1 "$SNAPSHOTS"); do
        if ! line="$("$TARDI" snapshot "$NAME" -o "$snapfile" --json 2> "$WORK/snap.err")"; then
            echo "   snapshot $i FAILED: $(cat "$WORK/snap.err")" >&2
            jq -nc --argjson mb "$mb" --arg err "$(cat "$WORK/snap.err")" \
                '{bench:"snapshot", size_mb:$mb, error:$err}' >> "$RAW"
            SNAP_FAILURES+=("$mb MiB snapshot $i: $(cat "$WORK/snap.err")")
            sleep 0.5
            kill -0 "$CUR_PID" 2>/dev/null || break # the service (and its tardi) is gone
            continue
        fi
        echo "$line" >> "$snaps"
        jq -c --argjson mb "$mb" --argjson used "$used" --argjson keys "$dbsize" --argjson busy "$busy" \
            '{bench:"snapshot", size_mb:$mb, cpu_busy_before_pct:$busy, used_memory:$used, keys:$keys} + .' <<<"$line" >> "$RAW"
        echo "   snapshot $i: $(jq -c '{pause_us,quiesce_us,memory_copy_us,bytes}' <<<"$line")" >&2
        sleep 0.2
    done
    if ! after="$(rcli dbsize 2>&1)" || [[ "$after" != "$dbsize" ]]; then
        echo "warning: after the snapshots DBSIZE is '$after' (was $dbsize)" >&2
        SNAP_FAILURES+=("$mb MiB: after the snapshots, DBSIZE answered '$after' (was $dbsize); tardi: $(tail -n +2 "$WORK/tardi.out" | tr '\n' ' ')")
    fi
    if [[ -n "$CUR_PID" ]] && ! kill -0 "$CUR_PID" 2>/dev/null; then
        echo "warning: the service's tardi has exited: $(tail -n +2 "$WORK/tardi.out" | tr '\n' ' ')" >&2
        stop_current
    fi
    [[ -s "$snaps" ]] || { echo "every snapshot failed; stopping" >&2; exit 1; }
    last="$(tail -n1 "$snaps")"
    SNAP_ROWS+=("| $mb MiB | $((used / 1048576)) | $dbsize | $(jq .threads <<<"$last") | $(jq '.bytes / 1048576 | round' <<<"$last") | $(jq '.memory_bytes / 1048576 | round' <<<"$last") | $(stats pause_us "$snaps" 1000) | $(stats quiesce_us "$snaps") | $(stats memory_copy_us "$snaps" 1000) | $busy% |")

    rest="$WORK/restores-$mb.jsonl"
    : > "$rest"
    for r in $(seq 1 "$ROUNDS"); do
        busy="$(wait_quiet)"
        stop_current
        echo "   round $r: restoring $(du -h "$snapfile" | cut -f1) checkpoint" >&2
        # A restore must get its old address back (same link index). A sandbox started by
        # someone else on this machine in the gap may hold it: then wait and try again.
        retries=0
        while :; do
            t0=$(date +%s%N)
            start_tardi "$TARDI" restore "$snapfile" --json && break
            if grep -q "is in use" "$WORK/tardi.err" && ((retries < 60)); then
                retries=$((retries + 1))
                echo "   round $r: address taken by another sandbox; retry $retries in 0.5 s" >&2
                jq -nc --argjson mb "$mb" --argjson r "$r" --arg err "$(cat "$WORK/tardi.err")" \
                    '{bench:"restore", size_mb:$mb, round:$r, error:$err, retried:true}' >> "$RAW"
                sleep 0.5
                continue
            fi
            RESTORE_ROWS+=("| $mb MiB | $r | restore failed: $(tr '\n' ' ' < "$WORK/tardi.err" | cut -c1-200) ||||||||")
            jq -nc --argjson mb "$mb" --argjson r "$r" --arg err "$(cat "$WORK/tardi.err")" \
                '{bench:"restore", size_mb:$mb, round:$r, error:$err}' >> "$RAW"
            continue 2
        done
        t_started=$(date +%s%N)
        if wait_redis; then got="$(rcli dbsize 2>&1)" || true; else got="no answer"; fi
        t_served=$(date +%s%N)
        ok=$([[ "$got" == "$dbsize" ]] && echo yes || echo "NO ($got)")
        ((retries == 0)) || ok="$ok (after $retries failed attempt(s): address in use)"
        jq -c '.restore' <<<"$STARTED" >> "$rest"
        jq -c --argjson mb "$mb" --argjson r "$r" --argjson busy "$busy" --arg got "$got" --argjson want "$dbsize" \
            --argjson started_ms "$(((t_started - t0) / 1000000))" --argjson served_ms "$(((t_served - t0) / 1000000))" \
            '{bench:"restore", size_mb:$mb, round:$r, cpu_busy_before_pct:$busy, dbsize:($got | tonumber? // $got), expected:$want, wall_to_started_ms:$started_ms, wall_to_dbsize_ms:$served_ms} + .restore' \
            <<<"$STARTED" >> "$RAW"
        echo "   round $r: $(jq -c .restore <<<"$STARTED"), DBSIZE $got (want $dbsize)" >&2
        RESTORE_ROWS+=("$(jq -r --arg mb "$mb" --arg r "$r" --arg ok "$ok" --arg w "$(((t_served - t0) / 1000000))" --arg busy "$busy" \
            '.restore | "| \($mb) MiB | \($r) | \(.read_verify_us / 1000 * 10 | round / 10) | \(.prepare_us / 1000 * 10 | round / 10) | \(.sandbox_us / 1000 * 10 | round / 10) | \(.restorer_us / 1000 * 10 | round / 10) | \(.cleanup_us / 1000 * 10 | round / 10) | \(.total_us / 1000 * 10 | round / 10) | \($w) | \($ok) | \($busy)% |"' <<<"$STARTED")")
    done
    if [[ -s "$rest" ]]; then
        RESTORE_ROWS+=("| $mb MiB | median | $(for f in read_verify_us prepare_us sandbox_us restorer_us cleanup_us total_us; do stats "$f" "$rest" 1000 | awk -F' / ' '{printf "%s | ", $2}'; done)| | |")
    fi
    stop_current
    rm -f "$snapfile"
done

{
    echo
    echo "## Full checkpoint (tardi snapshot)"
    echo
    echo "CPU busy = share of all CPUs busy with other work during the 2 s before the snapshots / the restore."
    echo
    echo "| data | used_memory MiB | keys | threads | file MiB | memory saved MiB | pause ms | quiesce µs | memory copy ms | CPU busy before |"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    printf '%s\n' "${SNAP_ROWS[@]}"
    for f in "${SNAP_FAILURES[@]}"; do echo; echo "FAILED: $f"; done
    echo
    echo "## Restore (SIGTERM the running sandbox, then tardi restore FILE)"
    echo
    echo "Phases from the started event, in ms. wall = from spawning \`tardi restore\` to the first DBSIZE reply."
    echo
    echo "| data | round | read+verify | prepare | sandbox | restorer | cleanup | total | wall | DBSIZE ok | CPU busy before |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"
    printf '%s\n' "${RESTORE_ROWS[@]}"
} >> "$OUT"
cat "$OUT"
echo >&2
echo "written: $OUT and $RAW" >&2
