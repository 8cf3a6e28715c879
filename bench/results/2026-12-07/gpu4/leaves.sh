#!/usr/bin/env bash
# A rank that ends its Context, alive, while the others' stream call waits for it inside a
# kernel (tests/mp/gpu_stream_test.cpp `leaves`, `p2p-leaves`), without FERRY_TIMEOUT; binaries
# from `bench/gpu_run.sh pack build` carried as .devbin, and where .devbin/old holds an earlier
# libferry.so (the same test against it), that one first. Then the stream suite's kernel tests
# that a change of the kernels could break: a peer killed during graph replays, a call that never
# matches, graph replays of allreduce and send/recv.
#   bash bench/results/2026-12-07/gpu4/leaves.sh
set -u
B=$PWD/.devbin/bin
run() {  # label, library folder, ferryrun's timeout, test arguments...
  local label=$1 lib=$2 limit=$3
  shift 3
  echo "=== $label: $*"
  LD_LIBRARY_PATH=$lib FERRY_TIMEOUT=0 timeout $((limit + 10)) $B/ferryrun --timeout $limit --keep-going -n 2 \
    $B/ferry_gpu_stream_tests "$@" 2>&1 | grep -vE "^\[ *(RUN|OK) " | tail -12
  echo "exit ${PIPESTATUS[0]}"
}
if [ -d .devbin/old ]; then
  run "before" "$PWD/.devbin/old" 10 leaves
fi
for mode in leaves p2p-leaves; do run "now" "$PWD/.devbin/lib" 30 $mode; done
for mode in graph-death p2p-graph-death; do run "now" "$PWD/.devbin/lib" 30 $mode; done
export FERRY_TIMEOUT=1
for mode in never-arrives p2p-never-arrives; do
  echo "=== now: $mode (FERRY_TIMEOUT=1)"
  LD_LIBRARY_PATH=$PWD/.devbin/lib timeout 40 $B/ferryrun --timeout 30 -n 2 \
    $B/ferry_gpu_stream_tests $mode 2>&1 | tail -4
done
unset FERRY_TIMEOUT
echo "=== now: graph replays"
LD_LIBRARY_PATH=$PWD/.devbin/lib timeout 120 $B/ferryrun --timeout 110 -n 2 $B/ferry_gpu_stream_tests \
  --gtest_filter='Stream.GraphReplaysAllreduce:Stream.GraphReplaysSendRecv:Stream.MixesWithHostCalls' \
  2>&1 | grep -E "OK|FAILED|PASSED|Failure" | tail -10
