#!/usr/bin/env bash
# The test command: sets up a fresh machine, checks formatting and lints, runs every test.
# Long campaigns are #[ignore]d; run them with: cargo test -- --ignored
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# tardi-image's mutation tests run TARDI_FUZZ_SECS (default 20) inside this. Every test binary
# runs even after one failed (--no-fail-fast), so one failure does not hide the others; cargo
# still exits non-zero if any test failed.
cargo test --workspace --no-fail-fast
# Its decoders under AFL++ (coverage-guided) for TARDI_AFL_SECS per target (0 skips it).
if [ "${TARDI_AFL_SECS:-30}" != 0 ]; then
  ./image/fuzz/run.sh "${TARDI_AFL_SECS:-30}"
fi
