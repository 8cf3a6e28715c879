#!/usr/bin/env bash
# Stream allreduces and reduces among three or more past one kernel's size in rounds of kernels,
# on one GPU shared by three ranks (FERRY_COLL_DEVICE_SHARED_GPU=1); binaries from
# `bench/gpu_run.sh pack build` carried as .devbin, and where .devbin/old holds the libferry.so and
# ferry-nccl/libnccl.so.2 of the commit before, the PyTorch part against them last.
#   bash bench/results/2026-12-08/gpu1/run.sh
set -u
B=$PWD/.devbin/bin
L=$PWD/.devbin/lib
g3=bench/results/2026-12-07/gpu3
probe=../../2026-12-08/gpu1/allreduce_cpu_after.py  # from probe.sh's folder
export FERRY_COLL_DEVICE_SHARED_GPU=1
mkdir -p "$OUT/torch_old" "$OUT/torch_new"
tests='Stream.CallsInRoundsMatchTheirHostForm:Stream.EveryCollectiveMatchesItsHostForm:Stream.GraphReplaysEveryCollective'
show='OK|FAILED|PASSED|Failure|Expected|Which|timed out|error'
echo "=== now: allreduce_cpu_after.py, 3 ranks"
OUT=$OUT/torch_new RANKS=3 PROBE=$probe WAIT=100 LEVEL=warn bash $g3/probe.sh
for n in 3 2; do
  echo "=== now: thread-idle (the stream thread starts no hand-off), $n ranks"
  FERRY_TEST_STREAM_THREAD_IDLE=1 LD_LIBRARY_PATH=$L timeout 120 $B/ferryrun --timeout 110 \
    -n $n $B/ferry_gpu_stream_tests thread-idle 2>&1 | grep -E "^rank|error|warn|timed out" | head -30
  echo "=== now: rounds against the host forms, $n ranks"
  LD_LIBRARY_PATH=$L timeout 200 $B/ferryrun --timeout 190 -n $n $B/ferry_gpu_stream_tests \
    --gtest_filter="$tests" 2>&1 | grep -E "$show" | tail -20
done
echo "=== now: launched kernels, 3 ranks"
LD_LIBRARY_PATH=$L timeout 120 $B/ferryrun --timeout 110 -n 3 $B/ferry_gpu_coll_tests 2>&1 |
  grep -E "$show" | tail -14
if [ -d .devbin/old ]; then
  echo "=== before: allreduce_cpu_after.py on the commit before, 3 ranks"
  # probe.sh takes the library from $PWD/.devbin/lib: run it from a tree whose .devbin/lib is
  # the old one.
  mkdir -p /tmp/oldrun/.devbin && ln -sfn "$PWD/.devbin/old" /tmp/oldrun/.devbin/lib
  ln -sfn "$PWD/bench" /tmp/oldrun/bench
  ( cd /tmp/oldrun && OUT=$OUT/torch_old RANKS=3 PROBE=$probe WAIT=60 LEVEL=warn \
      bash $g3/probe.sh )
fi
