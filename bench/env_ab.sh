#!/usr/bin/env bash
# ferry against itself under two settings, interleaved: each round runs `ferryrun -n 2 ferry-perf
# ARGS` with the variables of A and then with those of B, back to back, so both see the same vCPU
# placement. Prints every round's csv, then per test and size the medians and the median of the
# per-round ratios B/A (below 1 is faster for latencies, above 1 for bandwidths).
#   bench/env_ab.sh ROUNDS "VAR=a ..." "VAR=b ..." FERRY_PERF_ARGS...
# AB_BUILD=DIR among a side's variables runs that side from another build (two commits
# against each other: build the other one's tools/ferryrun and tools/ferry-perf in DIR).
# e.g. bench/env_ab.sh 5 "FERRY_OFI_PROVIDER=tcp" "FERRY_OFI_PROVIDER=net" latency bandwidth \
#        --sizes 8,64k,1m,4m        (with FERRY_TRANSPORTS=self,ofi in the environment)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=$1 a=$2 b=$3
shift 3
"$top/scripts/setup.sh" ferryrun ferry-perf >/dev/null

results=$(mktemp); trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$rounds"); do
  for side in A B; do
    vars=$a; [ "$side" = B ] && vars=$b
    echo "# round $round $side: $vars"
    side_build=$build
    for v in $vars; do
      case $v in AB_BUILD=*) side_build=${v#AB_BUILD=} ;; esac
    done
    # shellcheck disable=SC2086
    out=$(env $vars "$side_build/tools/ferryrun" -n 2 "$side_build/tools/ferry-perf" "$@" --csv)
    echo "$out"
    echo "$out" | awk -F, -v r="$round" -v s="$side" \
      'NR > 1 && NF >= 5 { print r, s, $1, $2, ($4 != "" ? $4 : $5) }' >>"$results"
  done
done
echo "# test  size  A(median)  B(median)  B/A(median of rounds)   (latency us; bandwidth GB/s)"
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
keys = list(dict.fromkeys((r[2], r[3]) for r in rows))
for test, size in keys:
    mine = {}
    for r in rows:
        if (r[2], r[3]) == (test, size):
            mine.setdefault(r[0], {})[r[1]] = float(r[4])
    pairs = [(v["A"], v["B"]) for v in mine.values() if "A" in v and "B" in v]
    if not pairs:
        continue
    print(f"{test:11s} {size:>9s}  {statistics.median(p[0] for p in pairs):10.3f}"
          f"  {statistics.median(p[1] for p in pairs):10.3f}"
          f"  {statistics.median(p[1] / p[0] for p in pairs):6.2f}")
PY
