#!/usr/bin/env bash
# Stream collectives past one kernel's size in rounds of kernels (77c4ff8), on one GPU shared by
# two ranks; binaries from `bench/gpu_run.sh pack build` carried as .devbin, and where
# .devbin/old holds the libferry.so and ferry-nccl/libnccl.so.2 of the commit before, the
# PyTorch part against them first.
#   bash bench/results/2026-12-07/gpu5/run.sh
set -u
B=$PWD/.devbin/bin
g3=bench/results/2026-12-07/gpu3
export FERRY_COLL_DEVICE_SHARED_GPU=1
mkdir -p "$OUT/fsdp_old" "$OUT/fsdp_new"
if [ -d .devbin/old ]; then
  echo "=== before: fsdp_cpu_after.py on the commit before"
  # probe.sh takes the library from $PWD/.devbin/lib: run it from a tree whose .devbin/lib is
  # the old one.
  mkdir -p /tmp/oldrun/.devbin && ln -sfn "$PWD/.devbin/old" /tmp/oldrun/.devbin/lib
  ln -sfn "$PWD/bench" /tmp/oldrun/bench
  ( cd /tmp/oldrun && OUT=$OUT/fsdp_old PROBE=../gpu5/fsdp_cpu_after.py WAIT=90 LEVEL=warn \
      bash $g3/probe.sh )
fi
echo "=== now: fsdp_cpu_after.py"
OUT=$OUT/fsdp_new PROBE=../gpu5/fsdp_cpu_after.py WAIT=100 LEVEL=warn bash $g3/probe.sh
echo "=== now: thread-idle (the stream thread starts no hand-off)"
FERRY_TEST_STREAM_THREAD_IDLE=1 LD_LIBRARY_PATH=$PWD/.devbin/lib timeout 170 $B/ferryrun --timeout 160 \
  -n 2 $B/ferry_gpu_stream_tests thread-idle 2>&1 | grep -E "^rank|error|warn|timed out" | head -24
echo "=== now: rounds against the host forms"
LD_LIBRARY_PATH=$PWD/.devbin/lib timeout 200 $B/ferryrun --timeout 190 -n 2 $B/ferry_gpu_stream_tests \
  --gtest_filter='Stream.CallsInRoundsMatchTheirHostForm:Stream.GraphReplaysEveryCollective' \
  2>&1 | grep -E "OK|FAILED|PASSED|Failure|Expected|Which|timed out" | tail -16
