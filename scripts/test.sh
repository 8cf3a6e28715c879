#!/usr/bin/env bash
# Quick start 2: installs what is missing, builds ferry and runs every test through CTest.
# Extra arguments go to ctest (e.g. -R mp).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
"$top/scripts/setup.sh"
cd "$build"
ctest --output-on-failure --timeout 900 "$@"
