#!/usr/bin/env bash
# The fault campaign (issues 7 and 26; results in docs/RELIABILITY.md): on the local lab (3
# machines, 3 orchestrators, mutual TLS), Debian's redis (or memcached: --service) deployed with
# one backup (--backups N), trials of
#
#   primary      power cut (kill -9 of every process, link down) of the primary's machine
#   backup       power cut of a backup's machine
#   leader       power cut of the leader orchestrator
#   partition    the primary's machine cut off from the network, healed after recovery
#   daemon       the primary's tardi instance killed alone (its sandbox left running)
#   minority     an orchestrator that is not the leader partitioned for 2 s
#   slow-backup  a backup's machine held to 2% of a CPU for 3 s
#   lossy        30% of the checkpoint stream's packets to a backup dropped for 3 s
#   asym         everything a backup's machine sends to the primary's dropped for 3 s
#
# each at a random moment under concurrent clients (SET/GET registers, INCR counters; memcached:
# registers only) whose histories are checked for linearizability and lost acknowledged writes
# by Porcupine (bench/linearizability, fetched through the Go module proxy), with the longest
# time the clients saw no successful operation (the failover gap). The victim is brought back
# after each trial; a trial that does not recover is counted and the lab rebuilt. Driven by
# examples/fault_campaign/ (its doc says what a trial does; faults.rs what each fault is).
#
# Writes bench/out/campaign-STAMP/: results.json (every trial), summary.md (the table per
# fault), histories/ and logs/ of trials that failed a check or did not recover, illegal/
# (Porcupine's visualizations). Not part of the test suite: it holds the lab for a long time.
#
# Usage: bench/campaign.sh [--trials N] [--faults primary,backup,...] [--service redis|memcached]
#                          [--backups N] [--clients N] [--recovery-timeout 20s] [--seed N]
#                          [--keep-histories] [--stamp STAMP]
#        (default 5 trials per fault; issue 26 asks for 100: about 6 s per trial)
# Run as root (namespaces, sandboxes). Needs go (>= 1.21), redis-server and memcached.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ROOT="$(dirname "$HERE")"
. "$HERE/lib.sh"

need_root "network namespaces and sandboxes"
ensure_tools redis-server redis-server
ensure_tools memcached memcached
command -v go >/dev/null || { echo "go is needed for the checker (Porcupine)" >&2; exit 1; }

TARGET="${CARGO_TARGET_DIR:-$ROOT/target}"
CHECKER="$TARGET/linearizability"
echo "building the checker, tardi and fault_campaign (release)..." >&2
(cd "$HERE/linearizability" && go test ./... >&2 && go build -o "$CHECKER" .)
(cd "$ROOT" && cargo build --release -q --bin tardi && cargo build --release -q --example fault_campaign) >&2
exec "$TARGET/release/examples/fault_campaign" --checker "$CHECKER" "$@"
