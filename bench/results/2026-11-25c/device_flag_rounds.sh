#!/bin/bash
# On the GPU machine, in the repository root, after bench/gpu_run.sh pack and with the previous
# head's libferry (dc6f99f: completion by events on CUDA 12+ drivers) in .devbin/lib_old; the new
# one (45dc0db: by a flag the GPU writes) in .devbin/lib. Interleaved rounds.
. .devlibs/env.sh
export NCCL_NVLS_ENABLE=0
b=.devbin/bin
for r in 1 2 3 4 5; do
  for lib in old new; do
    d=.devbin/lib; [ $lib = old ] && d=.devbin/lib_old
    echo "=== round $r $lib"
    LD_LIBRARY_PATH=$PWD/$d:$LD_LIBRARY_PATH $b/ferryrun --timeout 120 -n 2 $b/ferry-perf \
      get_lat put_bw get_bw -m cuda --sizes 8,64k --iterations 300 --window 64 2>&1 | grep -v "^#\|^test"
    LD_LIBRARY_PATH=$PWD/$d:$LD_LIBRARY_PATH $b/ferryrun --timeout 120 -n 2 $b/ferry-perf \
      latency bandwidth -m cuda:cuda --sizes 8,64k --iterations 300 2>&1 | grep -v "^#\|^test"
  done
done
