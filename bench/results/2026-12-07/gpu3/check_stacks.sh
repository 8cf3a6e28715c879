#!/usr/bin/env bash
# bash bench/results/2026-12-07/gpu3/check_stacks.sh: tests/nccl/torch_check.py check on one GPU
# (both ranks share it), ferry's library preloaded, with the workers' native stacks at 30 s.
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
TORCH_CHECK_VERBOSE=1 TORCH_CHECK_TIMEOUT=${LIMIT:-50} FERRY_LOG_LEVEL=${LEVEL:-info} \
  /opt/torch/.venv/bin/python tests/nccl/torch_check.py \
  --ferry "$PWD/.devbin/lib/ferry-nccl/libnccl.so.2" check > "$OUT/check.txt" 2>&1 &
sleep ${WAIT:-30}
for pid in $(pgrep -f "torch_check.py --worker"); do
  echo "=== $pid"
  g=$(command -v gdb || command -v cuda-gdb)
  [ -n "$g" ] && timeout 40 $g -p $pid -batch -ex "thread apply all bt 18" 2>&1 | grep -E "^#|^Thread" | grep -vE "libc.so|pthread_cond|futex|libpython|python3\.12" | head -120
done > "$OUT/stacks.txt" 2>&1
wait
grep -E "done|FAIL|HANG" "$OUT/check.txt" | tail -n 8
