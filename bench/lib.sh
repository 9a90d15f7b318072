# Shared helpers for the bench/*.sh scripts (sourced, not run).

# Percentage of all CPUs busy (not idle, not iowait) over the next $1 seconds (default 1),
# measured from /proc/stat.
cpu_busy_pct() {
    local a b
    a=($(head -n1 /proc/stat))
    sleep "${1:-1}"
    b=($(head -n1 /proc/stat))
    local total=0 idle i
    for i in 1 2 3 4 5 6 7 8; do total=$((total + b[i] - a[i])); done
    idle=$((b[4] - a[4] + b[5] - a[5]))
    ((total > 0)) || { echo 0; return; }
    echo $((100 * (total - idle) / total))
}

# Other load on this machine distorts every figure: with WAIT_QUIET=N (seconds), wait up to N
# seconds for the CPUs to be at most 20% busy (over 2 s) before measuring. Prints the busy
# percentage measured last; never fails.
wait_quiet() {
    local limit="${WAIT_QUIET:-0}" start=$SECONDS busy
    busy="$(cpu_busy_pct 2)"
    while ((busy > 20 && SECONDS - start < limit)); do
        echo "   machine ${busy}% busy; waiting for it to quieten (WAIT_QUIET=$limit s)" >&2
        sleep 3
        busy="$(cpu_busy_pct 2)"
    done
    echo "$busy"
}

# Exits unless run as root; $1 says why root is needed.
need_root() {
    [[ $EUID -eq 0 ]] || { echo "run as root${1:+ ($1)}" >&2; exit 1; }
}

# Installs what is missing, given pairs of a command and the Debian packages that provide it:
#   ensure_tools cc "gcc libc6-dev" jq jq
ensure_tools() {
    local need=()
    while (($# >= 2)); do
        command -v "$1" >/dev/null || need+=($2)
        shift 2
    done
    if ((${#need[@]})); then
        echo "installing ${need[*]}..." >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >&2
    fi
}

# A scratch directory $WORK (/tmp/tardi-$1.*) holding the `threads` target built from
# threads.c. On exit the target whose PID is in $TARGET_PID is killed and $WORK removed.
threads_workdir() {
    WORK="$(mktemp -d "/tmp/tardi-$1.XXXXXX")"
    TARGET_PID=""
    trap _threads_cleanup EXIT
    trap 'exit 130' INT TERM
    cc -O2 -Wall -pthread -o "$WORK/threads" "$HERE/threads.c"
}

_threads_cleanup() {
    if [[ -n "$TARGET_PID" ]] && kill -0 "$TARGET_PID" 2>/dev/null; then
        kill -KILL "$TARGET_PID" 2>/dev/null || true
        wait "$TARGET_PID" 2>/dev/null || true
    fi
    rm -rf "$WORK"
}
