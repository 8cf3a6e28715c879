#!/usr/bin/env bash
# ferry over libfabric against fabtests' fi_pingpong (libfabric-bin) on the same provider,
# interleaved: each round runs ferry-perf's ping-pong (FERRY_TRANSPORTS=self,ofi) and then
# fi_pingpong at each size, back to back, so both see the same vCPU placement. Both report the
# half round trip; ping-pong bandwidth is size / half round trip. Prints one line per round and
# size, and the median of the per-round ratios. A third column runs ferry with FERRY_OFI_RMA=off
# (rendezvous by the receiver's clear-to-send and a tagged transfer, not by fi_read).
#   bench/ofi_compare.sh [ROUNDS] [PROVIDER]     (default 7 rounds, tcp; installs libfabric-bin)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=${1:-7}
provider=${2:-tcp}
sizes=(8 65536 1048576 4194304)

dpkg-query -W -f='${Status}' libfabric-bin 2>/dev/null | grep -q "install ok installed" ||
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libfabric-bin >/dev/null; }
"$top/scripts/setup.sh" ferryrun ferry-perf >/dev/null

iterations() { if [ "$1" -le 65536 ]; then echo 5000; else echo 200; fi; }
ferry() {  # size [VAR=value] -> half round trip in us
  local out
  out=$(env ${2:-FERRY_OFI_RMA=auto} FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=$provider \
    "$build/tools/ferryrun" -n 2 \
    "$build/tools/ferry-perf" latency --sizes "$1" --iterations "$(iterations "$1")" --csv)
  echo "$out" | awk -F, 'NR == 2 { print $4 }'
}
port=$((20000 + RANDOM % 20000))
pingpong() {  # size -> half round trip in us
  port=$((port + 1))
  local n; n=$(iterations "$1")
  fi_pingpong -p "$provider" -e rdm -B "$port" -I "$n" -S "$1" >/dev/null 2>&1 &
  local server=$!
  sleep 0.3
  fi_pingpong -p "$provider" -e rdm -P "$port" -I "$n" -S "$1" 127.0.0.1 2>/dev/null |
    awk 'NR == 2 { print $7 }'
  wait "$server" || true
}

results=$(mktemp); trap 'rm -f "$results"' EXIT
for round in $(seq 1 "$rounds"); do
  for size in "${sizes[@]}"; do
    f=$(ferry "$size"); p=$(pingpong "$size"); t=$(ferry "$size" FERRY_OFI_RMA=off)
    echo "$round $size $f $p $t" | tee -a "$results"
  done
done
echo "# size  ferry_us(median)  fi_pingpong_us(median)  ratio(median of rounds)  ferry_GBps  fi_pingpong_GBps  rma_off_us(median)  rma_off_ratio"
python3 - "$results" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
for size in sorted({int(r[1]) for r in rows}):
    mine = [(float(r[2]), float(r[3]), float(r[4])) for r in rows if int(r[1]) == size and len(r) == 5]
    f = statistics.median(a for a, _, _ in mine); p = statistics.median(b for _, b, _ in mine)
    t = statistics.median(c for _, _, c in mine)
    ratio = statistics.median(a / b for a, b, _ in mine)
    off = statistics.median(c / b for _, b, c in mine)
    print(f"{size:9d}  {f:10.2f}  {p:10.2f}  {ratio:6.2f}  {size / f / 1e3:7.3f}  {size / p / 1e3:7.3f}  {t:10.2f}  {off:6.2f}")
PY
