#!/usr/bin/env bash
# Coverage-guided fuzzing of tardi-image's decoders with AFL++ (cargo-afl; stable Rust is
# enough). Targets (src/): `apply` (a checkpoint's metadata and page data, read and applied by a
# receiver) and `page` (one encoded page decoded against a twin).
#
#   image/fuzz/run.sh [SECONDS]     # per target; default 60
#
# First use installs cargo-afl from crates.io and builds the AFL++ it bundles (a few minutes).
# Exits non-zero if a target crashed (a panic or an abort is a crash); the inputs are kept in
# $CARGO_TARGET_DIR/fuzz/out/TARGET/default/crashes. Replay one outside AFL with
#   $CARGO_TARGET_DIR/fuzz/release/TARGET < FILE
# Each run starts from the seeds (the test chain), with a fresh output directory.
set -euo pipefail
secs=${1:-60}
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$here/../../target}/fuzz"
if ! cargo afl --version >/dev/null 2>&1; then
  echo "fuzz: installing cargo-afl"
  cargo install --locked cargo-afl --version '^0.18'
fi
if ! out=$(cargo afl config --build 2>&1) && ! grep -q "already built" <<<"$out"; then
  echo "$out" >&2
  exit 1
fi
cargo afl build --release --locked
seeds="$CARGO_TARGET_DIR/seeds"
"$CARGO_TARGET_DIR/release/seeds" "$seeds"
# No UI, no CPU binding (cores are shared), no complaints about a piped core pattern or CPU
# frequency scaling: this runs on CI machines as they are.
export AFL_NO_UI=1 AFL_NO_AFFINITY=1 AFL_SKIP_CPUFREQ=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
failed=0
for target in apply page; do
  dir="$CARGO_TARGET_DIR/out/$target"
  rm -rf "$dir"
  mkdir -p "$CARGO_TARGET_DIR/out"
  echo "fuzz: $target for ${secs}s"
  cargo afl fuzz -V "$secs" -i "$seeds/$target" -o "$dir" "$CARGO_TARGET_DIR/release/$target" \
    > "$dir.log" 2>&1 || { tail -20 "$dir.log" >&2; exit 1; }
  grep -a "Statistics" "$dir.log" | sed 's/\x1b\[[0-9;]*m//g' || true
  crashes=$(find "$dir/default/crashes" -type f ! -name README.txt | wc -l)
  if [ "$crashes" -gt 0 ]; then
    echo "fuzz: $target crashed on $crashes inputs, kept in $dir/default/crashes" >&2
    failed=1
  fi
done
exit $failed
