#!/usr/bin/env bash
# Quick start 1: installs what is missing, builds ferry, and runs ferry-perf between two processes
# over shared memory (latency and bandwidth, 1 B to 64 MiB). Extra arguments go to ferry-perf.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
"$top/scripts/setup.sh" ferryrun ferry-perf
exec "$build/tools/ferryrun" -n 2 -- "$build/tools/ferry-perf" "$@"
