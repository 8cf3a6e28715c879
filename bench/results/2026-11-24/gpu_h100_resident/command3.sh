#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
bin=$PWD/.devbin/bin
out=${OUT:-/tmp/out}
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog
nvidia-cuda-mps-control -d && echo "MPS started"
sleep 1
for shared in 0 1; do
  echo "=== MPS -n 3 FERRY_COLL_DEVICE_RESIDENT_SHARED=$shared"
  FERRY_COLL_DEVICE_RESIDENT_SHARED=$shared timeout 45 $bin/ferryrun --timeout 40 -n 3 $bin/ferry_gpu_coll_tests \
    --gtest_filter='*Large*' 2>&1 | tee $out/mps3_$shared.log | grep -E "^\[  |OK|rank|Failure|error|SKIP|timed|timeout" | head -20
done
echo "=== MPS -n 3 ferry-perf allreduce 4m+"
timeout 30 $bin/ferryrun --timeout 25 -n 3 $bin/ferry-perf allreduce -m cuda --sizes 8,64k,4m,8m --iterations 20 2>&1 | tail -6
echo quit | nvidia-cuda-mps-control
echo "=== no MPS -n 3 ferry-perf allreduce"
timeout 30 $bin/ferryrun --timeout 25 -n 3 $bin/ferry-perf allreduce -m cuda --sizes 8,64k,4m,8m --iterations 20 2>&1 | tail -6
