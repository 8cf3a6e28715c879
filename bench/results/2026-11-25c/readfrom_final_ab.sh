#!/bin/bash
# ferry over tcp passed through, at the final default (tagged transfers below 512 KiB, reads from
# there) against reads at every size (FERRY_OFI_READ_FROM=0, the behaviour before), interleaved.
cd "$(dirname "$0")/../../.."
e="FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp"
for r in 1 2 3 4 5; do
  for v in -1 0; do
    echo "# round $r FERRY_OFI_READ_FROM=$v"
    env $e FERRY_OFI_READ_FROM=$v build/tools/ferryrun -n 2 build/tools/ferry-perf latency bandwidth \
      --sizes 64k,128k,256k,384k,512k --csv 2>&1
  done
done
