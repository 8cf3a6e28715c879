#!/usr/bin/env bash
# ferry's one-sided operations against ucx_perftest (ucx-utils) between two processes of this
# node, interleaved: each round runs ferry-perf's test and then ucx_perftest's counterpart, back to
# back, so both see the same vCPU placement. Prints one line per round and test, then medians and
# the median of the per-round ratios (ferry / ucx: below 1 is faster for latency, above 1 for
# bandwidth).
#   put_lat 8 B   <-> ucp_put_lat  (half round trip of a put ping-pong, us)
#   get_lat 8 B   <-> ucp_get      (time per get, us)
#   put_bw  4 MiB <-> ucp_put_bw   (GB/s)
#   get_bw  4 MiB <-> ucp_get      (GB/s)
#   atomic_add 8  <-> ucp_add      (time per add, us)
#   latency 8 B   <-> tag_lat      (half round trip of a tagged-message ping-pong, us; with RMA_ALT)
#   bench/rma_compare.sh [ROUNDS]     (default 5; installs ucx-utils where missing)
# RMA_ALT="VAR=value ...": each round also runs ferry with those variables (a third column; the
# tagged-message latency is added), e.g. RMA_ALT=FERRY_OFI_PASSTHRU=off.
# RMA_TESTS="latency put_lat ...": only those of the tests above.
# RMA_REGISTER=1: ferry's exposed buffer is the program's own memory given to register_memory
# (reached by CMA on this node) instead of memory from allocate_memory.
# RMA_THREADS (default single): ferry's FERRY_THREADS. ucx_perftest's worker runs at its default
# thread level, single (-M single: only the thread that made it calls it), so ferry's like-for-like
# setting is FERRY_THREADS=single; RMA_THREADS=multi measures ferry's default, which takes a lock
# on every call.
# RMA_NET=tcp: both sides over TCP on the loopback instead of shared memory: ferry through
# libfabric's tcp provider (FERRY_TRANSPORTS=self,ofi, FERRY_OFI_RMA=$RMA_OFI: default auto,
# native once granted; messages for puts and gets by messages),
# ucx_perftest with UCX_TLS=tcp.
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=${1:-5}
ferry_env=(FERRY_THREADS="${RMA_THREADS:-single}")
ucx_env=()
if [ "${RMA_NET:-}" = tcp ]; then
  ferry_env+=(FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp FERRY_OFI_RMA="${RMA_OFI:-auto}")
  ucx_env+=(UCX_TLS=tcp)
fi

dpkg-query -W -f='${Status}' ucx-utils 2>/dev/null | grep -q "install ok installed" ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq ucx-utils >/dev/null; }
"$top/scripts/setup.sh" ferryrun ferry-perf >/dev/null

# test size iterations ucx-test ucx-column (of ucx_perftest's "Final:" line: 3 = average
# latency in us, 5 = average bandwidth in MB/s)
cases=(
  "put_lat 8 100000 ucp_put_lat 3"
  "get_lat 8 50000 ucp_get 3"
  "put_bw 4194304 200 ucp_put_bw 5"
  "get_bw 4194304 200 ucp_get 5"
  "atomic_add 8 50000 ucp_add 3"
)
if [ -n "${RMA_ALT:-}" ]; then cases=("latency 8 50000 tag_lat 3" "${cases[@]}"); fi
if [ -n "${RMA_TESTS:-}" ]; then
  chosen=()
  for c in "${cases[@]}"; do [[ " $RMA_TESTS " == *" ${c%% *} "* ]] && chosen+=("$c"); done
  cases=("${chosen[@]}")
fi
ferry() {  # test size iterations [VAR=value...] -> us per op, or GB/s for *_bw
  local out
  # shellcheck disable=SC2086
  out=$(env "${ferry_env[@]}" ${4:-} "$build/tools/ferryrun" -n 2 "$build/tools/ferry-perf" "$1" --sizes "$2" \
    --iterations "$3" --csv ${RMA_REGISTER:+--register})
  case $1 in
    *_bw) echo "$out" | awk -F, 'NR == 2 { print $5 }' ;;
    *) echo "$out" | awk -F, 'NR == 2 { print $4 }' ;;
  esac
}
port=$((20000 + RANDOM % 20000))
ucx() {  # ucx-test size iterations column -> the same unit
  port=$((port + 1))
  env "${ucx_env[@]}" ucx_perftest -p "$port" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  local value
  value=$(env "${ucx_env[@]}" ucx_perftest -p "$port" -t "$1" -s "$2" -n "$3" 127.0.0.1 2>/dev/null |
    awk -v c="$4" '/Final:/ { print $(c + 1) }')
  wait "$server" || true
  if [ "$4" = 5 ]; then value=$(python3 -c "print(${value:-0} * 1048576 / 1e9)"); fi
  echo "$value"
}

results=$(mktemp); trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$rounds"); do
  for c in "${cases[@]}"; do
    set -- $c
    f=$(ferry "$1" "$2" "$3"); u=$(ucx "$4" "$2" "$3" "$5")
    a=""; if [ -n "${RMA_ALT:-}" ]; then a=$(ferry "$1" "$2" "$3" "$RMA_ALT"); fi
    echo "$round $1 $2 $f $u $a" | tee -a "$results"
  done
done
echo "# test  size  ferry(median)  ucx(median)  ferry/ucx(median of rounds)  [alt(median)  alt/ucx]   (us per op; GB/s for _bw)"
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if len(l.split()) in (5, 6)]
for test in dict.fromkeys(r[1] for r in rows):
    mine = [(float(r[3]), float(r[4])) for r in rows if r[1] == test and float(r[4]) > 0]
    if not mine:
        continue
    f = statistics.median(a for a, _ in mine); u = statistics.median(b for _, b in mine)
    ratio = statistics.median(a / b for a, b in mine)
    size = next(r[2] for r in rows if r[1] == test)
    line = f"{test:11s} {size:>8s}  {f:10.3f}  {u:10.3f}  {ratio:6.2f}"
    alt = [(float(r[5]), float(r[4])) for r in rows if r[1] == test and len(r) == 6 and float(r[4]) > 0]
    if alt:
        line += f"  {statistics.median(a for a, _ in alt):10.3f}  {statistics.median(a / b for a, b in alt):6.2f}"
    print(line)
PY
