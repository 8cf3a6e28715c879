export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=$PWD/.devbin/lib
B=$PWD/.devbin/bin
setsid timeout 150 compute-sanitizer --tool memcheck --target-processes all $B/ferryrun --timeout 140 -n 2 $B/ferry_gpu_coll_tests --gtest_filter='GpuColl.MixedHost*' > $OUT/san.log 2>&1 &
sleep 50
ps -eo pid,ppid,stat,wchan:32,etime,args > $OUT/ps.txt
for p in $(pgrep -f "ferry_gpu_coll_tests|ferryrun"); do
  echo "== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | cut -c1-150)"
  for t in /proc/$p/task/*; do echo "$(basename $t) $(cat $t/comm) wchan=$(cat $t/wchan) sys=$(cat $t/syscall | cut -d' ' -f1-3)"; done
done > $OUT/tasks.txt 2>&1
for p in $(pgrep -f "ferry_gpu_coll_tests"); do echo "=== bt $p"; timeout 40 cuda-gdb -p $p -batch -ex "info threads" -ex "thread apply all bt 12" 2>&1 | grep -v "^\[New\|^warning" | head -200; done > $OUT/bt.txt 2>&1
cat $OUT/san.log | tail -30; cat $OUT/tasks.txt; head -150 $OUT/bt.txt
