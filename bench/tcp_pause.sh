#!/usr/bin/env bash
# What carrying TCP connections costs the pause (issue 28; docs/BENCHMARKS.md, "TCP connections
# in the pause"): the epoch loop on redis-server (outside a sandbox, loopback) with 0, 50, 500
# and 5,000 client connections, idle and busy; per case the pause and the part of it that reads
# the connections (TCP repair: sequence numbers, both queues, window, options), median and 99th
# percentile. Run by checkpointer/examples/tcp_pause.rs. Reports figures only.
#
# Usage: bench/tcp_pause.sh [--conns 0,50,500,5000] [--epochs 300]
# Run as root (ptrace, TCP repair). Needs redis-server.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
. "$HERE/lib.sh"

need_root "ptrace and TCP repair"
ensure_tools redis-server redis-server
# 5,000 connections on each side, and redis's own descriptors.
ulimit -n "$(ulimit -Hn)"
echo "building tcp_pause (release)..." >&2
(cd "$ROOT" && cargo build --release -q -p tardi-checkpointer --example tcp_pause) >&2
echo "Machine: $(nproc) CPUs, kernel $(uname -r), commit $(cd "$ROOT" && git rev-parse --short HEAD), load $(cut -d' ' -f1-3 /proc/loadavg)."
exec "${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/tcp_pause" "$@"
