#!/usr/bin/env bash
# What the divergence check ([tardi.scrub]) costs a pause: Redis with 200,000 keys under the
# epoch loop, a check at every pause against none, for the default slice (256 pages) and a
# large one (4,096). Prints markdown rows (docs/BENCHMARKS.md, "The divergence check").
set -euo pipefail
cd "$(dirname "$0")/.."
command -v redis-server >/dev/null || apt-get install -y redis-server
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q -p tardi-checkpointer --example scrub_cost
for pages in 256 4096; do
  ./target/release/examples/scrub_cost --pages "$pages" --keys 200000
done
