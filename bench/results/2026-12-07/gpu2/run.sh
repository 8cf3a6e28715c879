#!/usr/bin/env bash
# One GPU, two ranks sharing it; binaries from `bench/gpu_run.sh pack build`, carried as .devbin.
#   bash bench/results/2026-12-07/gpu2/run.sh
# The send/recv launches that release their streams themselves (FERRY_COLL_DEVICE_SHARED_GPU=1
# keeps the send/recv kernels on a shared GPU): `thread-idle` with info logs and the ranks'
# stacks (cuda-gdb: and the kernels on the GPU) where it has not ended after 40 s; then
# ../gpu/run.sh's other checks (the send/recv tests, a peer killed during graph replays, a
# receive that never matches, the whole stream suite with the defaults).
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
B=$PWD/.devbin/bin
o=/tmp/o
mkdir -p $o "$OUT"
export FERRY_COLL_DEVICE_SHARED_GPU=1
FERRY_LOG_LEVEL=info FERRY_TEST_STREAM_THREAD_IDLE=1 $B/ferryrun --timeout 60 -n 2 \
  $B/ferry_gpu_stream_tests thread-idle > $o/thread_idle.txt 2>&1 &
job=$!
for i in $(seq 1 40); do kill -0 $job 2>/dev/null || break; sleep 1; done
if kill -0 $job 2>/dev/null; then
  for pid in $(pgrep -f "ferry_gpu_stream_tests thread-idle"); do
    [ "$(cat /proc/$pid/comm)" = ferry_gpu_strea ] || continue
    echo "=== pid $pid"
    g=$(command -v gdb || command -v cuda-gdb)
    if [ -n "$g" ]; then
      timeout 60 $g -p $pid -batch -ex "info cuda kernels" -ex "thread apply all bt 14" 2>&1 \
        | grep -vE "^\[New|^\[Thread|warning|^$" | head -100
    else
      for t in /proc/$pid/task/*; do echo "$t $(cat $t/comm) $(cat $t/wchan)"; cat $t/stack 2>/dev/null | head -5; done
    fi
  done > $o/stacks.txt 2>&1
fi
wait $job
echo "exit $?" >> $o/thread_idle.txt
unset FERRY_COLL_DEVICE_SHARED_GPU
# The send/recv tests on the shared GPU, a peer killed during graph replays, a receive that never
# matches, the whole stream suite with the defaults: as the first run's (its outputs under /tmp/o
# too, and its own summary under $OUT).
bash "$(dirname "$0")/../gpu/run.sh" rest > /dev/null
for f in $o/*.txt; do
  echo "===== $(basename $f)"
  if [ "$(basename $f)" = stacks.txt ]; then head -200 $f; continue; fi
  grep -E "^rank|PASSED|FAILED|Failure|^exit|error|warn|Expected|Which is" $f | head -60
done > "$OUT/summary.txt"
tar czf "$OUT/logs.tgz" -C $o .
cat "$OUT/summary.txt"
