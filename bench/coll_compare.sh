#!/usr/bin/env bash
# Collectives side by side, interleaved: ferry-perf's allreduce and broadcast against Open MPI's
# MPI_Allreduce / MPI_Bcast (ob1 + vader, through bench/mpi_coll.c, which times the same loop:
# warmup, barrier, ITERATIONS back to back, slowest rank's time per operation, NCCL's bus
# bandwidth). For N = 2 and 4 ranks, each round runs ferry and then Open MPI back to back at each
# test and size, since the vCPUs of these VMs move between placements every few seconds; the
# report gives, per N, the median of each and of the per-round ratios, which are taken so that
# > 1 always means ferry is better (Open MPI/ferry for latency, ferry/Open MPI for bandwidth).
# N = 4 on this 2-vCPU VM is oversubscribed for both (ferry's wait loop yields the CPU after a
# number of empty polls; Open MPI runs with --oversubscribe --bind-to none).
#   bench/coll_compare.sh [ROUNDS]     (default 5; installs openmpi-bin, libopenmpi-dev)
# COLL_CASES=mid: allreduce, broadcast, allgather, reduce_scatter (for these two the size in all, as
# ferry-perf's) and reduce (to rank 0) latency at 128 KiB, 256 KiB, 512 KiB and 1 MiB instead of the
# issue's sizes (8 B, 64 KiB, 16 MiB); COLL_CASES=reduce: reduce at the issue's sizes. COLL_RANKS="2 3 4": the rank counts (default "2 4").
# COLL_ALT="VAR=value ...": each round also runs ferry with those variables (a third column and
# its ratio to Open MPI), e.g. COLL_ALT=FERRY_COLL_NODE=64k. COLL_CASES=small: barrier, and the
# other five at 8 B and 64 KiB (allgather and reduce_scatter at 64 B and 64 KiB in all). Each
# table gives the spread between rounds too: (slowest - fastest) / median, per side.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=${1:-5}

need=()
for p in openmpi-bin libopenmpi-dev python3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
"$top/scripts/setup.sh" ferryrun ferry-perf >/dev/null
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_coll" "$top/bench/mpi_coll.c"

# Each case: key, test, size, iterations, metric (latency in us or bus bandwidth in GB/s).
cases=(
  "ar8 allreduce 8 20000 latency"
  "ar64k allreduce 65536 2000 latency"
  "ar16m allreduce 16777216 50 busbw"
  "bc8 broadcast 8 20000 latency"
  "bc64k broadcast 65536 2000 latency"
  "bc16m broadcast 16777216 50 busbw"
)
if [ "${COLL_CASES:-}" = mid ]; then
  cases=(
    "ar128k allreduce 131072 1000 latency"
    "ar256k allreduce 262144 500 latency"
    "ar512k allreduce 524288 300 latency"
    "ar1m allreduce 1048576 200 latency"
    "bc128k broadcast 131072 1000 latency"
    "bc256k broadcast 262144 500 latency"
    "bc512k broadcast 524288 300 latency"
    "bc1m broadcast 1048576 200 latency"
    "ag128k allgather 131072 1000 latency"
    "ag256k allgather 262144 500 latency"
    "ag512k allgather 524288 300 latency"
    "ag1m allgather 1048576 200 latency"
    "rs128k reduce_scatter 131072 1000 latency"
    "rs256k reduce_scatter 262144 500 latency"
    "rs512k reduce_scatter 524288 300 latency"
    "rs1m reduce_scatter 1048576 200 latency"
    "rd128k reduce 131072 1000 latency"
    "rd256k reduce 262144 500 latency"
    "rd512k reduce 524288 300 latency"
    "rd1m reduce 1048576 200 latency"
  )
elif [ "${COLL_CASES:-}" = small ]; then
  # The small host collectives: barrier, and 8 B and 64 KiB of the others (allgather and
  # reduce_scatter 64 B in all, so that 8 ranks have a block each).
  cases=(
    "br barrier 1 20000 latency"
    "bc8 broadcast 8 20000 latency"
    "bc64k broadcast 65536 2000 latency"
    "rd8 reduce 8 20000 latency"
    "rd64k reduce 65536 2000 latency"
    "ar8 allreduce 8 20000 latency"
    "ar64k allreduce 65536 2000 latency"
    "ag64 allgather 64 20000 latency"
    "ag64k allgather 65536 2000 latency"
    "rs64 reduce_scatter 64 20000 latency"
    "rs64k reduce_scatter 65536 2000 latency"
  )
elif [ "${COLL_CASES:-}" = reduce ]; then
  cases=(
    "rd8 reduce 8 20000 latency"
    "rd64k reduce 65536 2000 latency"
    "rd16m reduce 16777216 50 busbw"
  )
fi

ferry() {  # ranks test size iterations latency|busbw [VAR=value...]
  # Output is parsed after the run: a python3 starting beside the benchmark takes a vCPU from it.
  local out
  # shellcheck disable=SC2086
  out=$(env ${6:-} "$build/tools/ferryrun" -n "$1" "$build/tools/ferry-perf" "$2" --sizes "$3" \
    --iterations "$4" --csv)
  echo "$out" | awk -F, -v m="$5" 'NR == 2 { print (m == "latency" ? $4 : $5) }'
}
ompi() {  # ranks test size iterations latency|busbw
  mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none -np "$1" --mca pml ob1 \
    --mca btl vader,self "$work/mpi_coll" "$2" "$3" "$4" 2>/dev/null |
    tail -1 | awk -v m="$5" '{ print (m == "latency" ? $1 : $2) }'
}

results="$work/results.tsv"
for n in ${COLL_RANKS:-2 4}; do
  for round in $(seq "$rounds"); do
    echo "$n ranks, round $round/$rounds" >&2
    for c in "${cases[@]}"; do
      read -r key test size iters metric <<<"$c"
      f=$(ferry "$n" "$test" "$size" "$iters" "$metric")
      o=$(ompi "$n" "$test" "$size" "$iters" "$metric")
      if [ -z "$f" ] || [ -z "$o" ]; then
        echo "coll_compare: no result for $test $size at $n ranks (ferry '$f', Open MPI '$o')" >&2
        exit 1
      fi
      a=""
      if [ -n "${COLL_ALT:-}" ]; then a=$(ferry "$n" "$test" "$size" "$iters" "$metric" "$COLL_ALT"); fi
      printf '%s\t%s\t%s\t%s\t%s\n' "$n" "$key" "$f" "$o" "$a" >>"$results"
    done
  done
done

python3 - "$results" "$rounds" "${COLL_ALT:-}" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().split("\n") if line]
alt = sys.argv[3]
def name(key):
    if key == "br":
        return "barrier latency (us)"
    test = {"ar": "allreduce", "bc": "broadcast", "ag": "allgather", "rs": "reduce_scatter",
            "rd": "reduce"}[key[:2]]
    size = key[2:]
    size = size[:-1] + " KiB" if size.endswith("k") else size[:-1] + " MiB" if size.endswith("m") else size + " B"
    metric = "bus bandwidth (GB/s)" if key.endswith("16m") else "latency (us)"
    return f"{test} {size} {metric}"
def ratio(key, mine, theirs):  # > 1: ferry better
    return mine / theirs if key.endswith("16m") else theirs / mine
keys = list(dict.fromkeys(r[1] for r in rows))
for n in sorted({r[0] for r in rows}, key=int):
    print(f"{n} ranks. Ratio > 1 means ferry is better (Open MPI/ferry for latency, "
          "ferry/Open MPI for bandwidth).")
    print()
    extra = f" | ferry with {alt} | its ratio" if alt else ""
    print(f"| metric ({n} ranks, {sys.argv[2]} interleaved rounds, medians) | ferry | Open MPI "
          f"| per-round ratio | ferry spread | Open MPI spread{extra} |")
    print("|---|---|---|---|---|---|" + ("---|---|" if alt else ""))
    for key in keys:
        data = [(float(f), float(o), a) for k_n, k, f, o, a in rows if k_n == n and k == key]
        f = statistics.median(d[0] for d in data)
        o = statistics.median(d[1] for d in data)
        r = statistics.median(ratio(key, d[0], d[1]) for d in data)
        spread = lambda xs: (max(xs) - min(xs)) / statistics.median(xs)
        sf = spread([d[0] for d in data])
        so = spread([d[1] for d in data])
        line = f"| {name(key)} | {f:.3f} | {o:.3f} | {r:.2f} | {sf:.2f} | {so:.2f} |"
        if alt:
            a = statistics.median(float(d[2]) for d in data)
            ra = statistics.median(ratio(key, float(d[2]), d[1]) for d in data)
            line += f" {a:.3f} | {ra:.2f} |"
        print(line)
    print()
print("Per round (ranks, ferry, Open MPI" + (", ferry with " + alt if alt else "") + "):")
for n, k, f, o, a in rows:
    print(f"    {n} {k:6s} {float(f):10.3f} {float(o):10.3f}" + (f" {float(a):10.3f}" if a else ""))
PY
