#!/usr/bin/env bash
# The demo: a replicated redis on a local lab of three machines (network namespaces), a client
# writing and verifying, and a power cut of the primary's machine. The backup takes over; the
# client carries on, on the same TCP connection, with nothing lost. Leaves nothing behind.
#
#   1. installs what is missing and builds Tardi (release);
#   2. `tardi lab up`: machines m1 m2 m3, a cluster of three orchestrators o1 o2 o3 (raft),
#      a client node;
#   3. `tardi deploy gramine-manifests/redis.manifest --backups 1` (Debian's redis-server);
#   4. a client in the client node writes key:N = value-N for 8 s (its connection survives the
#      failover; it would reconnect if it did not);
#   5. after 3 s, `tardi lab kill` of the primary's machine (SIGKILL of everything, link down);
#   6. `tardi status` shows the new view; the client reads back every acknowledged write;
#   7. `tardi lab down`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q
T=$PWD/target/release/tardi
cleanup() { "$T" lab down >/dev/null 2>&1 || true; }
trap cleanup EXIT
"$T" lab down >/dev/null 2>&1 || true

echo "== tardi lab up --machines 3 --orchestrators 3"
"$T" lab up --machines 3 --orchestrators 3 | sed -n '/^NODE/,/^client/p'
in_client() { "$T" lab exec client -- "$@"; }
echo "== tardi deploy gramine-manifests/redis.manifest --backups 1"
in_client "$T" deploy "$PWD/gramine-manifests/redis.manifest" --backups 1
status=$(in_client "$T" status --json)
field() { python3 -c "import json,sys; s=json.load(sys.stdin)['services'][0]; print(s['$1'])" <<<"$status"; }
addr=$(field address); primary=$(field primary)
echo "== redis is at $addr; its primary runs on $primary"
in_client "$T" status | sed -n '/^orchestrator cluster/,/^machines/{/^machines/!p};/^service/,$p'

echo "== a client writes and verifies for 8 s; the primary's machine loses power after 3 s"
in_client python3 "$PWD/scripts/demo_client.py" "$addr" 6379 8 &
client=$!
sleep 3
echo "== tardi lab kill $primary"
"$T" lab kill "$primary" >/dev/null
sleep 1
in_client "$T" status | sed -n '/^service/,$p'
wait "$client" || { echo "demo: FAILED (the client lost writes or never got a reply)"; exit 1; }
echo "== view history"
in_client "$T" status --json | python3 -c '
import json, sys
for h in json.load(sys.stdin)["services"][0]["history"]:
    v, p, b, why = h["view"], h["primary"], ", ".join(h["backups"]), h["reason"]
    took = h["activated_ms"] - h["proposed_ms"] if h["activated_ms"] else None
    print("  view %d: primary %s, backups [%s]: %s%s" % (v, p, b, why, "" if took is None else ", active after %d ms" % took))'
echo "== demo OK (tardi lab down cleans up)"
