#!/usr/bin/env bash
# Builds ferry's libFuzzer targets with clang++ (objects cached in BUILD_DIR) and runs each for a
# bounded time over a copy of its committed seed corpus. Exits non-zero when any target finds a
# crash, sanitizer report, leak or timeout, and prints the path of the input that triggers it.
#
#   tests/fuzz/run.sh [SECONDS_PER_TARGET] [BUILD_DIR]     defaults: 20, build-fuzz
#   FUZZ_TARGETS="store_frames config_value" tests/fuzz/run.sh 60    only these targets
set -euo pipefail

seconds=${1:-20}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${2:-$root/build-fuzz}
mkdir -p "$build"
build=$(cd "$build" && pwd)
cd "$root"

# Each target: its harness plus the ferry sources it needs.
store_sources="src/bootstrap/store_protocol.cpp src/util/status.cpp"
declare -A needs=(
  [store_frames]="$store_sources"
  [store_server]="$store_sources src/bootstrap/store_server.cpp src/bootstrap/store_connections.cpp src/util/log.cpp"
  [shm_address]="src/transport/shm/address.cpp src/util/status.cpp"
  [config_value]="src/util/config.cpp src/util/status.cpp"
  [address_blob]="src/proto/address_blob.cpp src/util/status.cpp"
  [ofi_wire]="src/transport/ofi/wire.cpp src/transport/ofi/order.cpp"
  [pmi_wire]="src/bootstrap/pmi.cpp src/util/config.cpp src/util/status.cpp src/util/log.cpp src/util/node.cpp"
  # The engine without the CUDA module (cuda/none.cpp) and the libfabric transport (the build
  # leaves FERRY_HAVE_OFI undefined): fuzzing needs neither a driver nor a NIC. NCCL's API
  # (src/nccl) is a library of its own on top.
  [engine_am]="$(find src -name '*.cpp' ! -path 'src/cuda/impl/*' ! -path 'src/cuda/driver.cpp' \
                 ! -path 'src/transport/ofi/*' ! -path 'src/nccl/*' | sort | tr '\n' ' ')"
)
all_targets="store_frames store_server shm_address config_value address_blob ofi_wire pmi_wire engine_am"
targets=${FUZZ_TARGETS:-$all_targets}

# ---- the compiler ----
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
apt_install() {
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get install -y "$@" || { as_root apt-get update && as_root apt-get install -y "$@"; }
}
if ! command -v clang++ >/dev/null 2>&1; then
  echo "clang++ not found: installing clang and libclang-rt-14-dev"
  apt_install clang libclang-rt-14-dev
fi
cxx=${CXX_FUZZ:-clang++}
probe=$build/probe
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' \
  >"$probe.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe.cpp" -o "$probe" 2>/dev/null; then
  major=$("$cxx" -dumpversion | cut -d. -f1)
  echo "$cxx cannot link libFuzzer: installing libclang-rt-$major-dev"
  apt_install "libclang-rt-$major-dev"
fi
rm -f "$probe" "$probe.cpp"

# ---- build (objects are reused while the flags, the sources and their headers are unchanged) ----
gen=$build/gen/ferry
mkdir -p "$gen"
version=$(sed -n 's/^project(ferry VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
IFS=. read -r v_major v_minor v_patch <<<"$version"
sed -e "s/@PROJECT_VERSION_MAJOR@/$v_major/" -e "s/@PROJECT_VERSION_MINOR@/$v_minor/" \
  -e "s/@PROJECT_VERSION_PATCH@/$v_patch/" -e "s/@PROJECT_VERSION@/$version/" \
  include/ferry/version.hpp.in >"$gen/version.hpp.new"
cmp -s "$gen/version.hpp.new" "$gen/version.hpp" 2>/dev/null || mv "$gen/version.hpp.new" "$gen/version.hpp"
rm -f "$gen/version.hpp.new"

flags=(-std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
  -Wall -Wextra -Wno-missing-field-initializers -Isrc -Iinclude -I"$build/gen" -Itests/fuzz)
stamp="$("$cxx" --version | head -n1) ${flags[*]}"
if [ "$(cat "$build/flags" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$build/obj" "$build/bin"
  printf '%s' "$stamp" >"$build/flags"
fi

# True when $1 (an object) is missing or older than anything in its dependency file $2.
stale() {
  [ -f "$1" ] && [ -f "$2" ] || return 0
  local dep
  for dep in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$2"); do
    [ "$dep" -nt "$1" ] && return 0
  done
  return 1
}

compile() {  # source -> prints its object
  local src=$1 obj=$build/obj/${1%.cpp}.o
  if stale "$obj" "${obj%.o}.d"; then
    mkdir -p "$(dirname "$obj")"
    echo "  compile $src" >&2
    "$cxx" "${flags[@]}" -MMD -MF "${obj%.o}.d" -c "$src" -o "$obj" || return 1
  fi
  echo "$obj"
}

jobs=${FUZZ_JOBS:-$(nproc)}
echo "== building in $build ($jobs at a time)"
mkdir -p "$build/bin"
for target in $targets; do
  [ -n "${needs[$target]+x}" ] || { echo "unknown target '$target' (known: $all_targets)"; exit 2; }
done
# Every source the targets need, once, $jobs compilers at a time; the loop below then finds each
# object fresh and links.
sources=$(for target in $targets; do echo "tests/fuzz/${target}_fuzz.cpp" ${needs[$target]}; done |
  tr ' ' '\n' | grep . | sort -u)
running=0
for src in $sources; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || { echo "compiling failed" >&2; exit 1; }
    running=$((running - 1))
  fi
  compile "$src" >/dev/null &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || { echo "compiling failed" >&2; exit 1; }
  running=$((running - 1))
done
for target in $targets; do
  objs=()
  for src in "tests/fuzz/${target}_fuzz.cpp" ${needs[$target]}; do
    obj=$(compile "$src") || { echo "compiling $src failed" >&2; exit 1; }
    objs+=("$obj")
  done
  bin=$build/bin/${target}_fuzz
  relink=0
  [ -f "$bin" ] || relink=1
  for obj in "${objs[@]}"; do [ "$obj" -nt "$bin" ] && relink=1; done
  if [ "$relink" -eq 1 ]; then
    echo "  link $target"
    "$cxx" "${flags[@]}" "${objs[@]}" -pthread -o "$bin"
  fi
done

# ---- run ($jobs targets at a time; each prints its lines into its work folder) ----
echo "== running each target for $seconds s (nice 10, $jobs at a time); work files in $build/run"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
run_target() {  # target -> $build/run/$target/{log,result}; the result's first word: ok or FINDING
  local target=$1 work=$build/run/$1 rc=0 execs artifacts artifact
  rm -rf "$work"
  mkdir -p "$work/corpus" "$work/artifacts"
  # A copy: what the run adds to its corpus stays out of the committed one.
  cp -R "tests/fuzz/corpus/$target/." "$work/corpus/"
  nice -n 10 "$build/bin/${target}_fuzz" -max_total_time="$seconds" -timeout=25 \
    -print_final_stats=1 -artifact_prefix="$work/artifacts/" "$work/corpus" >"$work/log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n1)
  # slow-unit-* files are reports, not findings.
  artifacts=$(find "$work/artifacts" -type f \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
    -o -name 'oom-*' \) | sort)
  if [ "$rc" -eq 0 ] && [ -z "$artifacts" ]; then
    printf 'ok %-13s %12s executions  no findings\n' "$target" "${execs:-?}" >"$work/result"
    return
  fi
  {
    printf 'FINDING %-13s %12s executions  FINDING (exit %d); log: %s\n' "$target" "${execs:-?}" \
      "$rc" "$work/log"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error:|fuzz invariant failed|==[0-9]+== ERROR: libFuzzer)' \
      "$work/log" | head -n 5 | sed 's/^/    /' || true
    for artifact in $artifacts; do
      echo "    reproducer: $artifact   (replay: $build/bin/${target}_fuzz $artifact)"
    done
    [ -n "$artifacts" ] || echo "    no reproducer written; see the log"
  } >"$work/result"
}
running=0
for target in $targets; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
  run_target "$target" &
  running=$((running + 1))
done
wait
failed=0 clean=0 found=0
for target in $targets; do
  result=$build/run/$target/result
  if [ "$(cut -d' ' -f1 "$result" 2>/dev/null | head -n1)" = ok ]; then
    cut -d' ' -f2- "$result"
    clean=$((clean + 1))
  else
    [ -f "$result" ] && sed '1s/^FINDING //' "$result" || echo "$target: no result (see $build/run/$target/log)"
    failed=1
    found=$((found + 1))
  fi
done
echo "fuzz: $clean passed, $found failed"
exit "$failed"
