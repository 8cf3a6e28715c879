#!/usr/bin/env bash
# Scratch: 3 ranks on one GPU under MPS, one-shot kernels kept: the library before the grid limit,
# then this one (LargeAllreduce only).
here=$(pwd); bin=$here/.devbin/bin
export CUDA_MPS_PIPE_DIRECTORY=/tmp/ferry-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ferry-mps-log
mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
nvidia-cuda-mps-control -d && echo "MPS started"
for lib in prevlib lib; do
  echo "--- $lib: gpu.coll -n 3 FERRY_COLL_DEVICE_SHARED_GPU=1 FERRY_TIMEOUT=20 (MPS) LargeAllreduce"
  FERRY_TIMEOUT=20 FERRY_COLL_DEVICE_SHARED_GPU=1 LD_LIBRARY_PATH=$here/.devbin/$lib timeout 90 "$bin/ferryrun" --timeout 80 -n 3 "$bin/ferry_gpu_coll_tests" --gtest_filter='*LargeAllreduce*' 2>&1 | tee $OUT/mps3_$lib.log | grep -E "^\[  |Failure|ferryrun|timed out|Expected|Which is" | head -20
  echo "exit ${PIPESTATUS[0]}"
done
echo quit | nvidia-cuda-mps-control
