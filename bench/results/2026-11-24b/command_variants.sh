#!/usr/bin/env bash
# Scratch: device allreduce, variants interleaved with NCCL.
here=$(pwd); bin=$here/.devbin/bin; export LD_LIBRARY_PATH=$here/.devbin/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib | head -1)
sizes=${SIZES:-64k,1m,4m,8m,16m,32m,64m}
for round in 1 2; do
  for v in "" "FERRY_COLL_DEVICE_ONESHOT=64m"; do
    echo "--- round $round: ${v:-default}"
    env $v "$bin/ferryrun" --timeout 120 -n 2 "$bin/ferry-perf" allreduce -m cuda --check --sizes $sizes 2>&1 | grep "^allreduce"
  done
  echo "--- round $round: nccl"
  LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/ferryrun" --timeout 120 -n 2 "$bin/nccl_perf" --allreduce --sizes $sizes 2>&1 | grep "^allreduce"
done
