#!/usr/bin/env bash
# Runs one test N times in a row and stops at the first failure: for a failure that shows once in
# a few hundred runs (say `full_checkpoint_mid_stream_and_failures_churn_uffd`, issue 26).
#   scripts/repeat-test.sh N TEST_FILE TEST_NAME [--release]
# e.g. scripts/repeat-test.sh 200 incremental full_checkpoint_mid_stream_and_failures_churn_uffd --release
# Builds the test binary once (cargo test --no-run), then runs the binary itself, the one test
# (--exact), each run's output kept under target/repeat/ only when it fails. Prints a line per
# run (its time) and the tally; exits non-zero at the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 3 ] || { echo "usage: $0 N TEST_FILE TEST_NAME [--release]" >&2; exit 2; }
n=$1 file=$2 name=$3 profile=${4:-}
export PATH="$HOME/.cargo/bin:$PATH"
bin=$(cargo test $profile --test "$file" --no-run --message-format=json 2>/dev/null \
  | python3 -c 'import json,sys
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["kind"]==["test"]:
        print(m["executable"])' | tail -1)
[ -x "$bin" ] || { echo "repeat-test: no test binary for $file" >&2; exit 2; }
out="${CARGO_TARGET_DIR:-target}/repeat"
mkdir -p "$out"
start=$(date +%s)
for i in $(seq 1 "$n"); do
  t0=$(date +%s.%N)
  if ! "$bin" "$name" --exact --test-threads=1 >"$out/last.log" 2>&1; then
    cp "$out/last.log" "$out/failed-$i.log"
    echo "run $i of $n FAILED after $((i - 1)) passes in a row: $out/failed-$i.log"
    exit 1
  fi
  grep -q "1 passed" "$out/last.log" || { echo "run $i: the test did not run (name?)"; exit 2; }
  printf 'run %d of %d passed in %.1f s\n' "$i" "$n" "$(echo "$(date +%s.%N) - $t0" | bc)"
done
echo "$n of $n passed in a row ($name, $(( $(date +%s) - start )) s)"
