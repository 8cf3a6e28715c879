#!/bin/bash
# On the GPU machine, in the repository root, after bench/gpu_run.sh pack and with the previous
# head's libferry in .devbin/lib_old: device one-sided and message windows, the library before
# (old) and after (new) copies report completion by a flag the GPU writes (read once per stream
# and poll pass) instead of events, interleaved.
. .devlibs/env.sh
export NCCL_NVLS_ENABLE=0
b=.devbin/bin
for r in 1 2 3; do
  for lib in old new; do
    d=.devbin/lib; [ $lib = old ] && d=.devbin/lib_old
    echo "=== round $r $lib"
    LD_LIBRARY_PATH=$PWD/$d:$LD_LIBRARY_PATH $b/ferryrun --timeout 120 -n 2 $b/ferry-perf \
      put_bw get_bw -m cuda --sizes 8,64k,1m --iterations 300 --window 64 2>&1 | grep -v "^#"
    LD_LIBRARY_PATH=$PWD/$d:$LD_LIBRARY_PATH $b/ferryrun --timeout 120 -n 2 $b/ferry-perf \
      bandwidth -m cuda:cuda --sizes 64k,1m --iterations 300 2>&1 | grep -v "^#\|^test"
  done
done
