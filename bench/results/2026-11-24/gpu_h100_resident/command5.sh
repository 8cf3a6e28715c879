#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
bin=$PWD/.devbin/bin
for n in 2 3; do
  for r in 1 2; do
    echo "--- -n $n round $r: default (one-shot kernels on the shared GPU)"
    timeout 100 $bin/ferryrun --timeout 90 -n $n $bin/ferry-perf allreduce -m cuda --check --sizes 8,64k,1m,4m --iterations 200 2>&1 | grep -E "^allreduce|error"
    echo "--- -n $n round $r: FERRY_COLL_DEVICE_ONESHOT=0"
    FERRY_COLL_DEVICE_ONESHOT=0 timeout 100 $bin/ferryrun --timeout 90 -n $n $bin/ferry-perf allreduce -m cuda --check --sizes 8,64k,1m,4m --iterations 200 2>&1 | grep -E "^allreduce|error"
  done
done
