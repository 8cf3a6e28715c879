#!/usr/bin/env bash
# Side-by-side, interleaved: ferry-perf against UCX's ucx_perftest (UCX_TLS=sm,self) and Open MPI
# (ob1 + vader, through bench/mpi_pingpong.c), on this machine. The vCPUs of these VMs move between
# placements every few seconds, so each round runs all three back to back and the ratios are taken
# per round; the report gives the median of each and of the per-round ratios.
#   bench/compare.sh [ROUNDS]     (default 7; installs ucx-utils, openmpi-bin, libopenmpi-dev)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=${1:-7}

need=()
for p in ucx-utils openmpi-bin libopenmpi-dev python3; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
"$top/scripts/setup.sh" ferryrun ferry-perf >/dev/null
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
mpicc -O2 -o "$work/mpi_pingpong" "$top/bench/mpi_pingpong.c"

port=$((20000 + RANDOM % 20000))
ferry() {  # test size iterations
  # Output is parsed after the run: a python3 starting beside the benchmark takes a vCPU from it.
  local out
  out=$("$build/tools/ferryrun" -n 2 "$build/tools/ferry-perf" "$1" --sizes "$2" --iterations "$3" --csv)
  echo "$out" | awk -F, 'NR == 2 { print ($4 != "" ? $4 : $5) }'
}
ucx() {  # ucx-test size iterations -> latency (us) or bandwidth (GB/s)
  port=$((port + 1))
  UCX_TLS=sm,self ucx_perftest -t "$1" -s "$2" -n "$3" -w 1000 -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  UCX_TLS=sm,self ucx_perftest 127.0.0.1 -p "$port" -t "$1" -s "$2" -n "$3" -w 1000 2>/dev/null |
    awk -v t="$1" '/^Final:/ { if (t == "tag_lat") print $5; else printf "%.4f\n", $7 * 1048576 / 1e9 }'
  wait "$server" || true
}
ompi() {  # latency|bandwidth size iterations
  mpirun.openmpi --allow-run-as-root --oversubscribe -np 2 --mca pml ob1 --mca btl vader,self \
    "$work/mpi_pingpong" "$1" "$2" "$3" 2>/dev/null | tail -1
}

results="$work/results.tsv"
for round in $(seq "$rounds"); do
  echo "round $round/$rounds" >&2
  printf 'lat8\t%s\t%s\t%s\n' "$(ferry latency 8 20000)" "$(ucx tag_lat 8 20000)" \
    "$(ompi latency 8 20000)" >>"$results"
  printf 'lat64k\t%s\t%s\t%s\n' "$(ferry latency 65536 3000)" "$(ucx tag_lat 65536 3000)" \
    "$(ompi latency 65536 3000)" >>"$results"
  printf 'bw4m\t%s\t%s\t%s\n' "$(ferry bandwidth 4194304 10)" "$(ucx tag_bw 4194304 640)" \
    "$(ompi bandwidth 4194304 10)" >>"$results"
done

python3 - "$results" "$rounds" <<'PY'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().split("\n") if line]
names = {"lat8": "8 B half round trip (us)", "lat64k": "64 KiB half round trip (us)",
         "bw4m": "4 MiB bandwidth, window 64 (GB/s)"}
print(f"| metric ({sys.argv[2]} interleaved rounds, medians) | ferry | UCX | Open MPI | ferry/UCX | ferry/best |")
print("|---|---|---|---|---|---|")
for key, name in names.items():
    data = [(float(f), float(u), float(o)) for k, f, u, o in rows if k == key]
    f = statistics.median(d[0] for d in data)
    u = statistics.median(d[1] for d in data)
    o = statistics.median(d[2] for d in data)
    lower_is_better = key.startswith("lat")
    best = (min if lower_is_better else max)
    r_u = statistics.median(d[0] / d[1] for d in data)
    r_b = statistics.median(d[0] / best(d[1], d[2]) for d in data)
    print(f"| {name} | {f:.3f} | {u:.3f} | {o:.3f} | {r_u:.2f} | {r_b:.2f} |")
print()
print("Per round (ferry, UCX, Open MPI):")
for k, f, u, o in rows:
    print(f"    {k:7s} {float(f):9.3f} {float(u):9.3f} {float(o):9.3f}")
PY
