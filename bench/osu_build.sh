# shellcheck shell=bash
# Sourced by the bench/osu_*.sh scripts. osu_build DIR SOURCE CC CXX: the OSU micro-benchmarks
# from SOURCE (a fetched copy, never committed) configured with CC/CXX and built in DIR, unmodified;
# a DIR that already holds a build is reused.
osu_build() {
  local dir=$1 source=$2 cc=$3 cxx=$4
  [ -x "$dir/c/mpi/pt2pt/standard/osu_latency" ] && return 0
  rm -rf "$dir"
  cp -r "$source" "$dir"
  (cd "$dir" && CC=$cc CXX=$cxx ./configure >configure.log 2>&1 && make -j"$(nproc)" >make.log 2>&1) ||
    { echo "osu: building with $cc failed (see $dir/*.log)" >&2; return 1; }
}
