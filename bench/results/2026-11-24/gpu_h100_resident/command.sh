#!/usr/bin/env bash
# one-off device session script (not committed)
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
bin=$PWD/.devbin/bin
out=${OUT:-/tmp/out}
nvidia-smi -L
ls -l /usr/bin/nvidia-cuda-mps-* /usr/local/nvidia/bin 2>&1 | head
echo "=== shared override, time-sliced"
FERRY_COLL_DEVICE_RESIDENT_SHARED=1 timeout 200 $bin/ferryrun --timeout 190 -n 2 $bin/ferry_gpu_coll_tests \
  --gtest_filter='*Resident*:*AllreduceMatches*:*DifferentCounts*' 2>&1 | tee $out/coll_shared_timesliced.log | grep -E "^\[  |rank|Failure|error|SKIP" | head -30
echo "=== default (no resident: shared GPU)"
timeout 100 $bin/ferryrun --timeout 90 -n 2 $bin/ferry_gpu_coll_tests --gtest_filter='*Resident*' 2>&1 | tee $out/coll_default.log | grep -E "^\[  |rank|Failure|error|SKIP" | head
if command -v nvidia-cuda-mps-control >/dev/null; then
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
  mkdir -p /tmp/mps /tmp/mpslog
  nvidia-cuda-mps-control -d && echo "MPS started"
  sleep 1
  echo "=== MPS: shared override"
  FERRY_COLL_DEVICE_RESIDENT_SHARED=1 timeout 200 $bin/ferryrun --timeout 190 -n 2 $bin/ferry_gpu_coll_tests 2>&1 | tee $out/coll_shared_mps.log | grep -E "^\[  |rank|Failure|error|SKIP" | head -30
  for r in 1 2 3; do
    echo "--- round $r resident"
    FERRY_COLL_DEVICE_RESIDENT_SHARED=1 timeout 60 $bin/ferryrun -n 2 $bin/ferry-perf allreduce -m cuda --check --sizes 8,1k,8k,64k 2>&1 | tee -a $out/perf_resident_mps.txt
    echo "--- round $r launched"
    FERRY_COLL_DEVICE_RESIDENT=0 timeout 60 $bin/ferryrun -n 2 $bin/ferry-perf allreduce -m cuda --check --sizes 8,1k,8k,64k 2>&1 | tee -a $out/perf_launched_mps.txt
  done
  echo quit | nvidia-cuda-mps-control
  cat /tmp/mpslog/control.log 2>/dev/null | tail -5
fi
