#!/usr/bin/env bash
# Scratch: resident kernel against the previous head's library, then the device collective
# tests (one GPU: under MPS, with the one-shot kernels kept).
here=$(pwd); bin=$here/.devbin/bin
export CUDA_MPS_PIPE_DIRECTORY=/tmp/ferry-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ferry-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
[ "$(nvidia-smi -L | wc -l)" -lt 2 ] && nvidia-cuda-mps-control -d && export FERRY_COLL_DEVICE_SHARED_GPU=1 && echo MPS
nvidia-smi -L
for round in 1 2 3; do
  for v in lib oldlib; do
    echo "--- round $round: $v"
    LD_LIBRARY_PATH=$here/.devbin/$v "$bin/ferryrun" --timeout 60 -n 2 "$bin/ferry-perf" allreduce -m cuda --check --sizes 8,1k,8k,4m,8m 2>&1 | grep "^allreduce"
  done
done
echo "--- gpu.coll -n 2 FERRY_COLL_DEVICE_SHARED_GPU=$FERRY_COLL_DEVICE_SHARED_GPU"
LD_LIBRARY_PATH=$here/.devbin/lib "$bin/ferryrun" --timeout 200 -n 2 "$bin/ferry_gpu_coll_tests" 2>&1 | tee $OUT/gpu_coll_mps.log | grep -E "^\[  |grew|Failure"
echo quit | nvidia-cuda-mps-control
