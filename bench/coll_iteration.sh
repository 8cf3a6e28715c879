#!/usr/bin/env bash
# A collective and a barrier per iteration (bench/coll_iteration.c), built with ferry's mpicc and
# with Debian's Open MPI, run interleaved: for each rank count, collective and size the medians of
# the rounds of the collective's part (what OSU's benchmarks report) and of the whole iteration,
# and the ratios Open MPI / ferry (> 1: ferry faster). Where the ranks outnumber the CPUs, the
# part a rooted collective shows depends on the order in which the barrier before it let the ranks
# go; the iteration does not.
#   bench/coll_iteration.sh [ROUNDS] [RANKS...]     (default 5 rounds; 3 4 ranks)
# COLL="bcast reduce" and SIZES="8 64 256" (bytes) choose what runs; ITERATIONS (10000).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=${1:-5}
shift $(($# > 0 ? 1 : 0))
ranks_list=${*:-3 4}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# shellcheck source=bench/osu_build.sh
source "$top/bench/osu_build.sh"
"$build/tools/mpicc" -O2 "$top/bench/coll_iteration.c" -o "$work/ferry"
mpicc.openmpi -O2 "$top/bench/coll_iteration.c" -o "$work/openmpi"
results=$work/results.tsv
: >"$results"
# measure ROUND RANKS COLLECTIVE SIZE SIDE: one run, one line of the results.
measure() {
  local out
  out=$(mpi_side "$5" "$2" "$work/$5" "$3" "$4" "${ITERATIONS:-10000}") ||
    { echo "coll_iteration: $3 of $4 B on $2 ranks ($5) failed:" >&2; echo "$out" | tail -5 >&2; exit 1; }
  echo "$out" | awk -v r="$1" -v n="$2" -v s="$5" \
    '$3 == "call" {print r "\t" n "\t" $1 "\t" $2 "\t" s "\t" $4 "\t" $8}' >>"$results"
}
for round in $(seq "$rounds"); do
  echo "round $round/$rounds" >&2
  for n in $ranks_list; do
    for c in ${COLL:-bcast reduce}; do
      for size in ${SIZES:-8 64 256}; do
        measure "$round" "$n" "$c" "$size" ferry
        measure "$round" "$n" "$c" "$size" openmpi
      done
    done
  done
done
python3 - "$results" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(lambda: collections.defaultdict(list))
for line in open(sys.argv[1]):
    rnd, n, c, size, side, call, iteration = line.split()
    runs[(int(n), c, int(size))][side].append((float(call), float(iteration)))
print("| ranks | collective | size | ferry call (us) | Open MPI call | call ratio "
      "| ferry iteration | Open MPI iteration | iteration ratio |")
print("|---|---|---|---|---|---|---|---|---|")
for (n, c, size), sides in sorted(runs.items()):
    f, o = sides.get("ferry", []), sides.get("openmpi", [])
    if not f or not o:
        continue
    fc, fi = statistics.median(x[0] for x in f), statistics.median(x[1] for x in f)
    oc, oi = statistics.median(x[0] for x in o), statistics.median(x[1] for x in o)
    print(f"| {n} | {c} | {size} | {fc:.2f} | {oc:.2f} | {oc / fc:.2f} | {fi:.2f} | {oi:.2f} "
          f"| {oi / fi:.2f} |")
PY
