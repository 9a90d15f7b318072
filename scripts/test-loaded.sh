#!/usr/bin/env bash
# The test command under load: `./scripts/test.sh` while `stress-ng` keeps a CPU hog running
# on each core (TARDI_LOAD_CPUS, default: every core), so that tests whose preconditions
# depend on timing show up on a fast machine too. Installs stress-ng if it is missing. The
# hog is stopped however the tests end; the exit code is the tests'.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v stress-ng >/dev/null 2>&1; then
  echo "test-loaded: installing stress-ng"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq stress-ng >/dev/null; }
fi
cpus="${TARDI_LOAD_CPUS:-$(nproc)}"
stress-ng --cpu "$cpus" --quiet &
hog=$!
trap 'kill "$hog" 2>/dev/null || true; wait "$hog" 2>/dev/null || true' EXIT
echo "test-loaded: stress-ng --cpu $cpus (pid $hog)"
./scripts/test.sh "$@"
