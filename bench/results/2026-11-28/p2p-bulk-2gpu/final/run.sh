#!/bin/bash
# Session run 1: bulk ring for stream send/recv past the inline limit.
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
b=$PWD/.devbin/bin; o=$OUT/r; mkdir -p $o
(cd .devbin && tar xJf nt.tar.xz)
nvidia-smi -L
for mode in ipc p2p_4k; do
  env=(); [ $mode = p2p_4k ] && env=(FERRY_STREAM_P2P=4k)
  timeout 150 env "${env[@]}" $b/ferryrun --timeout 140 -n 2 $b/ferry_gpu_stream_tests > $o/stream_$mode.txt 2>&1
  echo "stream $mode rc=$? $(grep -cE '^\[       OK' $o/stream_$mode.txt) ok; $(grep -E '^\[  (PASSED|FAILED)|Failure' $o/stream_$mode.txt | sort | uniq -c | tr '\n' ' ')"
done
for t in sendrecv alltoall; do
  for lib in ferry nccl; do
    d=$PWD/.devbin/lib/ferry-nccl; [ $lib = nccl ] && d=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
    LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH timeout 90 $b/${t}_perf -g 2 -b 64K -e 256M -f 4 -c 1 > $o/nt_${lib}_$t.txt 2>&1
    echo "$lib $t rc=$?"; grep -E "^ +[0-9]+ |Out of|Avg bus" $o/nt_${lib}_$t.txt
  done
done
timeout 150 $b/ferryrun --timeout 140 -n 2 $b/ferry-perf sendrecv --stream -m cuda --check --sizes 256k,1m,4m,16m,64m,256m > $o/perf_sendrecv.txt 2>&1
echo "perf rc=$?"; cat $o/perf_sendrecv.txt | tail -12
GPU_RUN_TORCH_PARTS=check TORCH_CHECK_TIMEOUT=100 GPU_RUN_CUPY=0 OUT=$o timeout 200 bash bench/gpu_run.sh run nccl_python 2>&1 | tail -15
for m in p2p-graph-death p2p-never-arrives; do
  FERRY_TIMEOUT=$([[ $m = *never* ]] && echo 1 || echo 0) timeout 70 $b/ferryrun --timeout 60 --keep-going -n 2 $b/ferry_gpu_stream_tests $m > $o/$m.txt 2>&1
  echo "$m rc=$?"; grep -E "^rank|error" $o/$m.txt | head -6
done
cd $OUT && tar cJf r.tar.xz r && rm -rf r
