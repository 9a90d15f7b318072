#!/usr/bin/env bash
# A local demo: Debian's redis-server in a Tardi sandbox, 100,000 keys, a full checkpoint, the
# sandbox killed, the checkpoint restored, every key checked. Leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release -q
T=target/release/tardi
dir=$(mktemp -d)
sed -e 's/name = "redis"/name = "demo-redis"/' \
    -e "s|file:/var/lib/tardi/redis/data|file:$dir/data|" gramine-manifests/redis.manifest > "$dir/demo.manifest"
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; rm -rf "$dir"; }
trap cleanup EXIT

start() { # start "run MANIFEST" or "restore FILE"; sets pid and addr
  "$T" $1 --json > "$dir/events" 2> "$dir/stderr" & pid=$!
  for _ in $(seq 100); do [ -s "$dir/events" ] && break; sleep 0.1; done
  [ -s "$dir/events" ] || { cat "$dir/stderr"; exit 1; }
  head -1 "$dir/events"
  addr=$(head -1 "$dir/events" | python3 -c 'import json,sys; print(json.load(sys.stdin)["address"])')
  for _ in $(seq 100); do redis-cli -h "$addr" ping >/dev/null 2>&1 && break; sleep 0.1; done
}

echo "== tardi run gramine-manifests/redis.manifest (as demo-redis)"
start "run $dir/demo.manifest"
echo "== loading 100,000 keys into $addr"
python3 -c 'import sys
for i in range(100000):
    k, v = f"key:{i}", f"value-{i}"
    sys.stdout.write(f"*3\r\n$3\r\nSET\r\n${len(k)}\r\n{k}\r\n${len(v)}\r\n{v}\r\n")' | redis-cli -h "$addr" --pipe | tail -1
echo "   DBSIZE: $(redis-cli -h "$addr" dbsize)"
echo "== tardi snapshot demo-redis -o $dir/redis.tardi"
"$T" snapshot demo-redis -o "$dir/redis.tardi"
redis-cli -h "$addr" set written-after-snapshot 1 >/dev/null
echo "== killing the sandbox"
kill "$pid"; wait "$pid" || true; pid=
echo "== tardi restore $dir/redis.tardi"
start "restore $dir/redis.tardi"
n=$(redis-cli -h "$addr" dbsize)
echo "   DBSIZE after restore: $n (written-after-snapshot: '$(redis-cli -h "$addr" get written-after-snapshot)')"
[ "$n" = 100000 ] || { echo "demo: FAILED"; exit 1; }
echo "   key:4242 = $(redis-cli -h "$addr" get key:4242)"
echo "== demo OK"
