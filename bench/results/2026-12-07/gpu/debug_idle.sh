#!/usr/bin/env bash
# thread-idle (b7ee9cd) with info logs; stacks of the ranks after 40 s where it has not ended.
# Never ran: no GPU machine was lent again in the session.
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
B=$PWD/.devbin/bin
FERRY_LOG_LEVEL=info FERRY_TEST_STREAM_THREAD_IDLE=1 FERRY_COLL_DEVICE_SHARED_GPU=1 \
  $B/ferryrun --timeout 80 -n 2 $B/ferry_gpu_stream_tests thread-idle > /tmp/idle.txt 2>&1 &
job=$!
for i in $(seq 1 40); do kill -0 $job 2>/dev/null || break; sleep 1; done
if kill -0 $job 2>/dev/null; then
  for pid in $(pgrep -f "ferry_gpu_stream_tests thread-idle" | grep -v $job); do
    echo "=== pid $pid"
    if command -v gdb >/dev/null; then
      gdb -p $pid -batch -ex "thread apply all bt 12" 2>/dev/null | grep -E "^#|^Thread" | head -60
    else
      for t in /proc/$pid/task/*; do echo "$t $(cat $t/comm) $(cat $t/wchan)"; done
    fi
  done > /tmp/stacks.txt 2>&1
fi
wait $job
echo "exit $?" >> /tmp/idle.txt
cat /tmp/idle.txt /tmp/stacks.txt 2>/dev/null | tail -120
