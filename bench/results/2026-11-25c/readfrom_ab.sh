#!/bin/bash
# ferry over tcp (pass-through): rendezvous by direct transfer below 1 MiB (default) against
# reads at every size (FERRY_OFI_READ_FROM=0, the behaviour before), interleaved rounds.
cd /work/main
e="FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp"
for r in 1 2 3 4; do
  for v in -1 0; do
    echo "# round $r FERRY_OFI_READ_FROM=$v"
    env $e FERRY_OFI_READ_FROM=$v build/tools/ferryrun -n 2 build/tools/ferry-perf latency bandwidth \
      --sizes 64k,256k,512k,1m,4m --csv 2>&1
  done
done
