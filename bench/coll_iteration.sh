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
"$build/tools/mpicc" -O2 "$top/bench/coll_iteration.c" -o "$work/ferry"
mpicc.openmpi -O2 "$top/bench/coll_iteration.c" -o "$work/openmpi"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
results=$work/results.tsv
: >"$results"
for round in $(seq "$rounds"); do
  for n in $ranks_list; do
    echo "round $round/$rounds, $n ranks" >&2
    for c in ${COLL:-bcast reduce}; do
      for size in ${SIZES:-8 64 256}; do
        for side in ferry openmpi; do
          if [ "$side" = ferry ]; then
            line=$(timeout 120 "$build/tools/mpiexec" -n "$n" "$work/ferry" "$c" "$size" \
                   "${ITERATIONS:-10000}")
          else
            line=$(timeout 120 mpirun.openmpi --oversubscribe --bind-to none -n "$n" \
                   "$work/openmpi" "$c" "$size" "${ITERATIONS:-10000}" 2>/dev/null)
          fi
          echo "$line" | awk -v r="$round" -v n="$n" -v s="$side" \
            '$3 == "call" {print r "\t" n "\t" $1 "\t" $2 "\t" s "\t" $4 "\t" $8}' >>"$results"
        done
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
