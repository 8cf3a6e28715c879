#!/usr/bin/env bash
# Scratch: device collective tests with 3 and 2 ranks on one GPU under MPS, one-shot kernels kept.
here=$(pwd); bin=$here/.devbin/bin
export LD_LIBRARY_PATH=$here/.devbin/lib
export CUDA_MPS_PIPE_DIRECTORY=/tmp/ferry-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ferry-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"; nvidia-smi -L
for n in 3 2; do
  echo "--- gpu.coll -n $n FERRY_COLL_DEVICE_SHARED_GPU=1 (MPS)"
  FERRY_COLL_DEVICE_SHARED_GPU=1 "$bin/ferryrun" --timeout 240 -n $n "$bin/ferry_gpu_coll_tests" 2>&1 | tee $OUT/mps_coll_$n.log | grep -E "^\[  |grew|Failure|ferryrun"
  echo "exit ${PIPESTATUS[0]}"
done
echo quit | nvidia-cuda-mps-control
