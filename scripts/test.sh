#!/usr/bin/env bash
# Quick start 2: installs what is missing, builds ferry and runs every test through CTest.
# Extra arguments go to ctest (e.g. -R mp).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
"$top/scripts/setup.sh"
cd "$build"
# Sanitized builds: suppressions for third-party libraries only, each explained in its file.
export LSAN_OPTIONS="suppressions=$top/tests/sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
ctest --output-on-failure --timeout 900 "$@"
