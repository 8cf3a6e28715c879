#!/usr/bin/env bash
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib NCCL_NVLS_ENABLE=0
bin=$PWD/.devbin/bin
out=${OUT:-/tmp/out}
export FERRY_COLL_DEVICE_RESIDENT_SHARED=1
for n in 2 3; do
  echo "=== coll_kill -n $n, resident kept on the shared GPU (time-sliced)"
  timeout 90 $bin/ferryrun --timeout 80 --keep-going -n $n $bin/ferry_fault_test coll-death-device 2>&1 \
    | tee -a $out/coll_kill_resident.log | grep -E "rank|FAIL|SKIP"
  echo "exit ${PIPESTATUS[0]}"
done
ls /dev/shm | head
