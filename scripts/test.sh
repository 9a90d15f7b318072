#!/usr/bin/env bash
# The test command: sets up a fresh machine, checks formatting and lints, runs every test.
# Long campaigns are #[ignore]d; run them with: cargo test -- --ignored
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace
