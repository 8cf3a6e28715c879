#!/bin/bash
# ferry over tcp passed through, interleaved rounds: the default FERRY_OFI_READ_FROM (tagged
# transfers below the read size, fi_read from there) against reads at every size
# (FERRY_OFI_READ_FROM=0, the behaviour before).
#   readfrom_ab.sh ROUNDS SIZES
# readfrom_ab.txt: 4 64k,256k,512k,1m,4m, with the read size then at 1 MiB;
# readfrom_final_ab.txt: 5 64k,128k,256k,384k,512k, at the final 512 KiB.
cd "$(dirname "$0")/../../.."
e="FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp"
for r in $(seq 1 "$1"); do
  for v in -1 0; do
    echo "# round $r FERRY_OFI_READ_FROM=$v"
    env $e FERRY_OFI_READ_FROM=$v build/tools/ferryrun -n 2 build/tools/ferry-perf latency bandwidth \
      --sizes "$2" --csv 2>&1
  done
done
