#!/usr/bin/env bash
# `cmake --install` gives a user what they need: headers, libferry.so, the tools, a CMake package
# (find_package(ferry) -> ferry::ferry) and a pkg-config file. Builds a small program both ways.
#   install_test.sh BUILD_DIR
set -u
build=$1
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix

if cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" 2>&1; then ok "cmake --install"
else bad "cmake --install"; cat "$tmp/install.log"; fi
for f in include/ferry/ferry.hpp include/ferry/status.hpp include/ferry/version.hpp bin/ferryrun \
         bin/ferry-perf bin/ferry-info lib/cmake/ferry/ferryConfig.cmake lib/pkgconfig/ferry.pc; do
  [ -e "$prefix/$f" ] || bad "missing $f"
done
ls "$prefix"/lib/libferry.so* >/dev/null 2>&1 && ok "installed files present" || bad "no libferry.so"

mkdir -p "$tmp/app"
cat >"$tmp/app/main.cpp" <<'CPP'
#include <ferry/ferry.hpp>
#include <cstdio>
int main() {
  ferry::Context ctx = ferry::Context::init();
  int peer = (ctx.rank() + 1) % ctx.size(), from = (ctx.rank() + ctx.size() - 1) % ctx.size();
  int out = 1000 + ctx.rank(), in = -1;
  ferry::Request r = ctx.irecv(&in, sizeof(in), from, 3);
  if (!ctx.send(&out, sizeof(out), peer, 3) || !r.wait() || in != 1000 + from) return 1;
  std::printf("rank %d of %d got %d (ferry %s)\n", ctx.rank(), ctx.size(), in, FERRY_VERSION_STRING);
  return 0;
}
CPP
cat >"$tmp/app/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(app CXX)
find_package(ferry REQUIRED)
add_executable(app main.cpp)
target_link_libraries(app PRIVATE ferry::ferry)
CM
if cmake -S "$tmp/app" -B "$tmp/app/build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/cm.log" 2>&1 &&
   cmake --build "$tmp/app/build" >>"$tmp/cm.log" 2>&1 &&
   "$prefix/bin/ferryrun" -n 2 "$tmp/app/build/app" >"$tmp/run.out" &&
   grep -q "rank 1 of 2 got 1000" "$tmp/run.out"; then
  ok "find_package(ferry) -> ferry::ferry builds and runs under the installed ferryrun"
else bad "find_package consumer"; cat "$tmp/cm.log"; fi

if flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs ferry) &&
   g++ "$tmp/app/main.cpp" -o "$tmp/app/pc" $flags -Wl,-rpath,"$prefix/lib" 2>"$tmp/pc.log" &&
   "$tmp/app/pc" >"$tmp/pc.out" && grep -q "rank 0 of 1 got 1000" "$tmp/pc.out"; then
  ok "pkg-config --cflags --libs ferry builds a program that runs alone"
else bad "pkg-config consumer"; cat "$tmp/pc.log"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
