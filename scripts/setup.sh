#!/usr/bin/env bash
# Installs what Tardi needs on a fresh Debian 12 machine (idempotent): the services and the browser
# (headless Chromium, for the status page's test) the tests use, the tools the sandbox calls, and a
# Rust toolchain if there is none.
set -euo pipefail
need=()
for pkg_bin in redis-server:/usr/bin/redis-server redis-tools:/usr/bin/redis-cli \
               iproute2:/usr/sbin/ip util-linux:/usr/bin/nsenter gcc:/usr/bin/gcc \
               python3:/usr/bin/python3 clang:/usr/bin/clang libclang-dev:/usr/lib/llvm-14/lib/libclang.so \
               fonts-dejavu-core:/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf \
               protobuf-compiler:/usr/bin/protoc nftables:/usr/sbin/nft iptables:/usr/sbin/iptables-nft \
               memcached:/usr/bin/memcached nginx-light:/usr/sbin/nginx systemd:/usr/bin/systemd-analyze \
               postgresql-15:/usr/lib/postgresql/15/bin/postgres postgresql-client-15:/usr/bin/psql \
               chromium:/usr/bin/chromium; do
  [ -e "${pkg_bin#*:}" ] || need+=("${pkg_bin%%:*}")
done
if [ ${#need[@]} -gt 0 ]; then
  echo "setup: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Debian starts a system redis on 127.0.0.1:6379 and a system nginx on port 80; Tardi's
# sandboxes have their own network namespaces and do not need them stopped, but they waste
# memory on a CI machine.
if command -v systemctl >/dev/null 2>&1; then
  systemctl stop redis-server nginx postgresql 2>/dev/null || true
fi
if ! command -v cargo >/dev/null 2>&1; then
  [ -x "$HOME/.cargo/bin/cargo" ] || { echo "setup: no Rust toolchain (install rustup)"; exit 1; }
  export PATH="$HOME/.cargo/bin:$PATH"
fi
[ "$(id -u)" = 0 ] || { echo "setup: Tardi needs root (namespaces, ptrace, veth)"; exit 1; }
