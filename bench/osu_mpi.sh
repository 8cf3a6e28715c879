#!/usr/bin/env bash
# The OSU micro-benchmarks (7.4, from a fetched copy, never committed) on ferry's MPI: configured
# with ferry's mpicc/mpicxx, built unmodified; each point-to-point and collective benchmark runs
# with validation (-c) on RANKS ranks, each one-sided one (OSU 7.4's have no -c) in every window
# kind and synchronisation it offers on 2 ranks. With OPENMPI=1 the same source is also built
# with Open MPI's mpicc, and osu_latency (8 B), osu_bw (4 MiB) and osu_allreduce (8 B, 1 MiB)
# run interleaved ROUNDS times, ferry then Open MPI, giving medians and the median of per-round
# ratios (> 1: ferry better).
# Other than 2 ranks, the benchmarks of exactly two ranks (pt2pt but osu_multi_lat, which takes an
# even count, and one-sided) are left out. OSU_LIST="osu_bcast osu_allreduce ..." runs only those;
# OSU_MAX sets the largest size validated (default 1 MiB); OSU_WORK keeps the builds for the next
# run.
#   bench/osu_mpi.sh OSU_SOURCE_DIR [RANKS] [ROUNDS]
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
src=$1 ranks=${2:-2} rounds=${3:-5}
if [ -n "${OSU_WORK:-}" ]; then  # the builds are kept there and reused by the next run
  work=$OSU_WORK; mkdir -p "$work"
else
  work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
fi

# shellcheck source=bench/osu_build.sh
source "$top/bench/osu_build.sh"
osu_build "$work/ferry" "$src" "$build/tools/mpicc" "$build/tools/mpicxx"
osu=$work/ferry/c/mpi
benchmarks="pt2pt/standard/osu_latency pt2pt/standard/osu_bw pt2pt/standard/osu_bibw
  pt2pt/standard/osu_multi_lat pt2pt/persistent/osu_latency_persistent
  pt2pt/persistent/osu_bw_persistent"
for c in barrier bcast reduce allreduce allgather allgatherv alltoall alltoallv alltoallw gather \
         gatherv scatter scatterv reduce_scatter reduce_scatter_block; do
  benchmarks+=" collective/blocking/osu_$c"
done
for c in ibarrier ibcast ireduce iallreduce iallgather iallgatherv ialltoall ialltoallv ialltoallw \
         igather igatherv iscatter iscatterv ireduce_scatter ireduce_scatter_block; do
  benchmarks+=" collective/non_blocking/osu_$c"
done
max=${OSU_MAX:-1048576}
selected() {  # whether benchmark $1 (a path) runs in this job
  local name=${1##*/}
  if [ -n "${OSU_LIST:-}" ] && [[ " $OSU_LIST " != *" $name "* ]]; then return 1; fi
  case $name in
    osu_multi_lat) [ $((ranks % 2)) -eq 0 ] ;;
    osu_latency* | osu_bw* | osu_bibw) [ "$ranks" -eq 2 ] ;;
    *) return 0 ;;
  esac
}
echo "== validation (-c), $ranks ranks, 1 B to $max B"
for b in $benchmarks; do
  selected "$b" || continue
  if [[ $b == *barrier ]]; then  # no message size, no validation: it must end well
    if out=$(timeout 300 "$build/tools/mpiexec" -n "$ranks" "$osu/$b" 2>&1); then
      printf '%-40s ran: %s us\n' "$(basename "$b")" "$(echo "$out" | awk '/^ *[0-9.]+( +[0-9.]+)* *$/ {v = $1} END {print v}')"
    else
      printf '%-40s FAILED\n' "$(basename "$b")"; echo "$out" | tail -5
    fi
    continue
  fi
  out=$(timeout 600 "$build/tools/mpiexec" -n "$ranks" "$osu/$b" -c -m "1:$max" 2>&1) || true
  pass=$(echo "$out" | grep -c " Pass$" || true)
  fail=$(echo "$out" | grep -c " Fail$" || true)
  printf '%-40s %3d sizes passed, %d failed\n' "$(basename "$b")" "$pass" "$fail"
  [ "$fail" -eq 0 ] && [ "$pass" -gt 0 ] || echo "$out" | tail -5
done
# OSU's one-sided tests have no -c: each runs (two ranks, as they require) in every window
# kind and synchronisation it offers, and must end well with a figure for every size.
one_sided=""
for b in put_latency get_latency acc_latency get_acc_latency fop_latency cas_latency put_bw get_bw \
         put_bibw; do
  if [ "$ranks" -eq 2 ] && selected "osu_$b"; then one_sided+=" $b"; fi
done
[ -z "$one_sided" ] || echo "== one-sided, 2 ranks, 1 B to 64 KiB (no validation in OSU 7.4)"
for b in $one_sided; do
  for w in create allocate; do
    syncs="lock flush flush_local lock_all pscw fence"
    case $b in put_bibw) syncs="pscw fence" ;; fop_latency|cas_latency|get_acc_latency) syncs="lock flush" ;; esac
    for sync in $syncs; do
      out=$(timeout 120 "$build/tools/mpiexec" -n 2 "$osu/one-sided/osu_$b" -w "$w" -s "$sync" \
            -m 1:65536 2>&1)
      rc=$?
      sizes=$(echo "$out" | grep -cE '^[0-9]+ ' || true)
      printf '%-20s -w %-8s -s %-11s exit %d, %2d sizes, 8 B: %s\n' "osu_$b" "$w" "$sync" "$rc" \
        "$sizes" "$(echo "$out" | awk '$1 == 8 {print $2}')"
    done
  done
done
[ "${OPENMPI:-0}" = 1 ] || exit 0

osu_build "$work/openmpi" "$src" mpicc.openmpi mpicxx.openmpi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ompi=(mpirun --oversubscribe --bind-to none -n "$ranks")
value() {  # the last column's value at size $1 of a benchmark's output
  awk -v s="$1" '$1 == s {print $2}'
}
cases=("osu_allreduce collective/blocking 8" "osu_allreduce collective/blocking 1048576")
[ "$ranks" -ne 2 ] || cases=("osu_latency pt2pt/standard 8" "osu_bw pt2pt/standard 4194304" "${cases[@]}")
for c in "${cases[@]}"; do
  read -r name dir size <<<"$c"
  : >"$work/$name-$size"
  for _ in $(seq 1 "$rounds"); do
    f=$("$build/tools/mpiexec" -n "$ranks" "$work/ferry/c/mpi/$dir/$name" -m "$size:$size" | value "$size")
    o=$("${ompi[@]}" "$work/openmpi/c/mpi/$dir/$name" -m "$size:$size" 2>/dev/null | value "$size")
    echo "$f $o" >>"$work/$name-$size"
  done
  python3 - "$name" "$size" "$work/$name-$size" <<'PY'
import statistics, sys
name, size, path = sys.argv[1], sys.argv[2], sys.argv[3]
rows = [tuple(map(float, l.split())) for l in open(path) if l.strip()]
f = [r[0] for r in rows]; o = [r[1] for r in rows]
bw = name == "osu_bw"
ratios = [(a / b) if bw else (b / a) for a, b in rows]
print(f"{name} {size} B: ferry {statistics.median(f):.2f} (runs {', '.join(f'{x:.2f}' for x in f)}), "
      f"Open MPI {statistics.median(o):.2f} (runs {', '.join(f'{x:.2f}' for x in o)}), "
      f"{'MB/s' if bw else 'us'}; ratio (>1: ferry better) {statistics.median(ratios):.2f}")
PY
done
