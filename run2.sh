#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-} NCCL_NVLS_ENABLE=0
. .devlibs/env.sh
bin=.devbin/bin
nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
timeout 150 bench/gpu_run.sh run coll 2>&1 | tail -30
for r in 1 2 3; do
  for slice in 0 8k; do
    echo "--- round $r FERRY_COLL_DEVICE_ONESHOT_SLICE=$slice"
    FERRY_COLL_DEVICE_ONESHOT_SLICE=$slice timeout 60 $bin/ferryrun -n 2 $bin/ferry-perf allreduce -m cuda --check --sizes 8,64k,1m,4m 2>&1 | tee -a $OUT/oneshot_slice.txt | grep -E "^allreduce|rror"
  done
  LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH timeout 60 $bin/ferryrun -n 2 $bin/nccl_perf --allreduce --sizes 8,64k,1m,4m 2>&1 | grep -v "^NCCL INFO" | tee -a $OUT/oneshot_nccl.txt | tail -6
done
timeout 240 bench/gpu_run.sh run ofi 2>&1 | tail -60
