#!/usr/bin/env bash
# The fault campaign (issue 7; results in docs/RELIABILITY.md): on the local lab (3 machines,
# 3 orchestrators, mutual TLS), Debian's redis deployed with one backup, trials of
#
#   primary    power cut (kill -9 of every process, link down) of the primary's machine
#   backup     power cut of the backup's machine
#   leader     power cut of the leader orchestrator
#   partition  the primary's machine cut off from the network, healed after recovery
#
# each at a random moment under concurrent clients (SET/GET registers, INCR counters) whose
# histories are checked for linearizability and lost acknowledged writes by Porcupine
# (bench/linearizability, fetched through the Go module proxy), with the longest time the
# clients saw no successful operation (the failover gap). The victim is brought back after
# each trial (`Lab::start` / `Lab::heal`); a trial that does not recover is counted and the lab
# rebuilt. Driven by examples/fault_campaign.rs (its doc says what a trial does).
#
# Writes bench/out/campaign-STAMP/: results.json (every trial), summary.md (the table per
# fault), histories/ and logs/ of trials that failed a check or did not recover, illegal/
# (Porcupine's visualizations). Not part of the test suite: it holds the lab for a long time.
#
# Usage: bench/campaign.sh [--trials N] [--faults primary,backup,leader,partition] [--clients N]
#                          [--recovery-timeout S] [--seed N] [--keep-histories] [--stamp STAMP]
#        (default 5 trials per fault; issue 7 asks for 100: about 6 s per trial)
# Run as root (namespaces, sandboxes). Needs go (>= 1.21) and redis-server.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
. "$HERE/lib.sh"

need_root "network namespaces and sandboxes"
ensure_tools redis-server redis-server
command -v go >/dev/null || { echo "go is needed for the checker (Porcupine)" >&2; exit 1; }

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
CHECKER="$TARGET/linearizability"
echo "building the checker, tardi and fault_campaign (release)..." >&2
(cd "$HERE/linearizability" && go test ./... >&2 && go build -o "$CHECKER" .)
(cd "$ROOT" && cargo build --release -q --bin tardi && cargo build --release -q --example fault_campaign) >&2
exec "$TARGET/release/examples/fault_campaign" --checker "$CHECKER" "$@"
