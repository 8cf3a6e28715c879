export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0; B=.devbin/bin; o=/tmp/o; mkdir -p $o
(
FERRY_CUDA_IPC=0 timeout 100 $B/ferryrun --timeout 90 -n 2 $B/ferry_gpu_stream_tests > $o/stream_staged.log 2>&1; echo "staged exit $?"
timeout 60 $B/ferryrun --timeout 50 -n 2 $B/ferry_gpu_stream_tests > $o/stream_ipc.log 2>&1; echo "ipc exit $?"
for r in 1 2; do
timeout 60 $B/ferryrun -n 2 $B/ferry-perf sendrecv send --stream -m cuda --check --sizes 1m,16m,64m,256m > $o/ring_default_$r.txt 2>&1; echo "ring stream $r exit $?"
timeout 60 $B/ferryrun -n 2 $B/ferry-perf sendrecv --graph 100 -m cuda --check --sizes 1m,16m,64m,256m >> $o/ring_default_$r.txt 2>&1; echo "ring graph $r exit $?"
timeout 60 $B/sendrecv_perf -b 1M -e 256M -f 4 -g 2 -G 0 -c 1 > $o/nccl_$r.txt 2>&1
timeout 60 $B/sendrecv_perf -b 1M -e 256M -f 4 -g 2 -G 100 -c 1 >> $o/nccl_$r.txt 2>&1
done
) > $o/summary.txt 2>&1
cat $o/summary.txt; grep -E "PASSED|FAILED|\] Stream.Graphs" $o/stream_staged.log $o/stream_ipc.log; grep -hvE "^#" $o/ring_default_*.txt | grep -E "sendrecv|send " ; grep -hE "^ +[0-9]" $o/nccl_*.txt; tar czf $OUT/final.tgz -C /tmp o
