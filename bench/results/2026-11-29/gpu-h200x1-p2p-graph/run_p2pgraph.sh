#!/bin/bash
# Stream send/recv replayed from graphs, buffers on the GPU or host: does any stop?
top=$PWD
. $top/.devdbg/libs/env.sh >/dev/null 2>&1
export LD_LIBRARY_PATH=$top/.devdbg/lib:${LD_LIBRARY_PATH:-}
B=$top/.devdbg/bin
for mem in ${MEMS:-cuda pinned:cuda cuda:pinned pinned}; do
  tag=${mem/:/_}
  FERRY_LOG_LEVEL=info timeout 60 $B/ferryrun -n 2 $B/ferry-perf sendrecv --graph 100 -m $mem \
    --sizes 8,64k,1m --iterations 20000 > $OUT/g_$tag.txt 2>&1 &
  pid=$!
  for i in $(seq 40); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    for p in $(pgrep -f "bin/ferry-perf"); do
      [ "$(cat /proc/$p/comm)" = ferry-perf ] || continue
      echo "=== pid $p" >> $OUT/g_${tag}_bt.txt
      timeout 30 gdb -batch -nx -ex "set pagination off" -ex "thread apply all bt 20" -p $p >> $OUT/g_${tag}_bt.txt 2>&1
    done
  fi
  wait $pid; echo "rc=$?" >> $OUT/g_$tag.txt
  echo "== $mem"; tail -6 $OUT/g_$tag.txt
done
