#!/bin/bash
top=$PWD
B=$top/.devdbg/bin
export LD_LIBRARY_PATH=$top/.devdbg/lib
nvidia-smi -L > $OUT/smi.txt 2>&1
for t in stream gpu coll; do
  case $t in stream) bin=ferry_gpu_stream_tests;; gpu) bin=ferry_gpu_tests;; coll) bin=ferry_gpu_coll_tests;; esac
  timeout 200 $B/ferryrun -n 2 $B/$bin > $OUT/final_$t.txt 2>&1; echo "rc=$?" >> $OUT/final_$t.txt
  echo "== $t"; grep -h "PASSED\|FAILED\|rc=" $OUT/final_$t.txt
done
FERRY_CUDA_IPC=0 timeout 150 $B/ferryrun -n 2 $B/ferry_gpu_tests > $OUT/final_gpu_staged.txt 2>&1; echo "rc=$?" >> $OUT/final_gpu_staged.txt
echo "== gpu staged"; grep -h "PASSED\|FAILED\|rc=" $OUT/final_gpu_staged.txt
timeout 60 stdbuf -oL $B/ferryrun -n 2 $B/ferry-perf sendrecv --graph 100 -m pinned:cuda --sizes 8,64k,1m --iterations 20000 > $OUT/final_perf_pinned_cuda.txt 2>&1; echo "rc=$?" >> $OUT/final_perf_pinned_cuda.txt
echo "== perf"; grep -h "^sendrecv\|rc=" $OUT/final_perf_pinned_cuda.txt
