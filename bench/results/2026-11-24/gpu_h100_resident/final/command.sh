#!/usr/bin/env bash
set -u
export NCCL_NVLS_ENABLE=0
out=${OUT:-/tmp/out}
mkdir -p $out/full $out/mps
OUT=$out/full timeout 420 bench/gpu_run.sh run tests coll coll_kill 2>&1 | grep -E "^===|^---|PASSED|FAILED|SKIPPED \]|rank .*(grew|waited|without)|exit|Failure" | head -120
OUT=$out/mps GPU_RUN_MPS=1 timeout 150 bench/gpu_run.sh run resident 2>&1 | grep -E "^---|^allreduce|MPS|error"
