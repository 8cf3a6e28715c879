#!/bin/bash
top=$PWD
. $top/.devdbg/libs/env.sh >/dev/null 2>&1
B=$top/.devdbg/bin
one() {  # LIBDIR TAG MEM
  LD_LIBRARY_PATH=$1:${LD_LIBRARY_PATH:-} timeout 50 stdbuf -oL $B/ferryrun -n 2 $B/ferry-perf sendrecv --graph 100 -m $3 --sizes 8,64k,1m --iterations 20000 > $OUT/$2.txt 2>&1 &
  local pid=$!
  for i in $(seq 40); do sleep 1; kill -0 $pid 2>/dev/null || break; done
  if kill -0 $pid 2>/dev/null; then
    for p in $(pgrep -f "bin/ferry-perf"); do
      [ "$(cat /proc/$p/comm)" = ferry-perf ] || continue
      echo "=== pid $p" >> $OUT/$2_gdb.txt
      timeout 20 gdb -batch -nx -ex "set pagination off" -ex "thread apply all bt 20" -p $p >> $OUT/$2_gdb.txt 2>&1
    done
  fi
  wait $pid; echo "rc=$?" >> $OUT/$2.txt
  echo "== $2"; grep -h "^sendrecv\|rc=" $OUT/$2.txt
}
one $top/.devdbg/lib_broken broken_pc pinned:cuda
one $top/.devdbg/lib fixed_pc pinned:cuda
