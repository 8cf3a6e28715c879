#!/bin/bash
# Session run 2: bulk ring, double-buffered places; graphs; torch.
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
b=$PWD/.devbin/bin; o=$OUT/r; mkdir -p $o
(cd .devbin && tar xJf nt.tar.xz)
for mode in ipc p2p_4k; do
  env=(); [ $mode = p2p_4k ] && env=(FERRY_STREAM_P2P=4k)
  timeout 150 env "${env[@]}" $b/ferryrun --timeout 140 -n 2 $b/ferry_gpu_stream_tests > $o/stream_$mode.txt 2>&1
  echo "stream $mode rc=$? $(grep -cE '^\[       OK' $o/stream_$mode.txt) ok; $(grep -E '^\[  (PASSED|FAILED)|Failure' $o/stream_$mode.txt | sort | uniq -c | tr '\n' ' ')"
done
nl=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
for round in 1 2; do
for t in sendrecv alltoall; do
  for g in 0 100; do
  for lib in ferry nccl; do
    d=$PWD/.devbin/lib/ferry-nccl; [ $lib = nccl ] && d=$nl
    f=$o/nt_${lib}_${t}_G${g}_$round.txt
    LD_LIBRARY_PATH=$d:$LD_LIBRARY_PATH timeout 60 $b/${t}_perf -g 2 -b 64K -e 256M -f 4 -c 1 -G $g > $f 2>&1
    echo "$lib $t -G $g rc=$? $(grep -E 'Out of' $f)"; grep -E "^ +[0-9]+ " $f | awk '{printf "%s:%s/%s ", $1, $6, $10}'; echo
  done; done
done; done
for g in "--stream" "--graph 100"; do
timeout 100 $b/ferryrun --timeout 90 -n 2 $b/ferry-perf sendrecv $g -m cuda --check --sizes 64k,256k,1m,4m,16m,64m,256m > $o/perf_sendrecv.txt 2>&1
echo "perf $g rc=$?"; grep "^sendrecv" $o/perf_sendrecv.txt | awk '{printf "%s:%s ", $2, $4}'; echo
done
GPU_RUN_TORCH_PARTS="check ddp kill" GPU_RUN_TORCH_ROUNDS=1 TORCH_CHECK_TIMEOUT=100 OUT=$o timeout 300 bash bench/gpu_run.sh run nccl_python 2>&1 | tail -12
for m in p2p-graph-death p2p-never-arrives; do
  FERRY_TIMEOUT=$([[ $m = *never* ]] && echo 1 || echo 0) timeout 70 $b/ferryrun --timeout 60 --keep-going -n 2 $b/ferry_gpu_stream_tests $m > $o/$m.txt 2>&1
  echo "$m rc=$?"; grep -E "^rank" $o/$m.txt | head -4
done
cd $OUT && tar cJf r.tar.xz r && rm -rf r
