#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
bin=$PWD/.devbin/bin
out=${OUT:-/tmp/out}
mkdir -p $out/full
OUT=$out/full timeout 400 bench/gpu_run.sh run tests coll coll_kill 2>&1 | tail -80
export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mpslog
mkdir -p /tmp/mps /tmp/mpslog $out/mps
nvidia-cuda-mps-control -d && echo "MPS started"
sleep 1
export FERRY_COLL_DEVICE_RESIDENT_SHARED=1
OUT=$out/mps timeout 150 bench/gpu_run.sh run coll coll_kill 2>&1 | tail -40
echo quit | nvidia-cuda-mps-control
