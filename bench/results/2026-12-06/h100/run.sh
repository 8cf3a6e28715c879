#!/usr/bin/env bash
# One H100 (nvidia-h100-x1), two ranks sharing it; binaries from `bench/gpu_run.sh pack build`
# at 1aef65b, carried as .devbin. The send/recv tests of the stream suite under compute-sanitizer
# (memcheck twice: with the driver API errors reported, then without), then ferry_gpu_tests in
# ipc and staged modes and the stream suite (ipc).
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
B=$PWD/.devbin/bin
mkdir -p /tmp/o
F="Stream.GraphReplaysSendRecv:Stream.SendRecvGroupOrderedEverySize:Stream.SendRecvGroupVerdictsOutliveTheirLaunch:Stream.SendRecvToItself:Stream.GraphsOfStagedSendRecvAsTheFirstCalls"
for tool in memcheck racecheck synccheck; do
  timeout 190 compute-sanitizer --tool $tool --target-processes all --print-limit 20 \
    $B/ferryrun --timeout 180 -n 2 $B/ferry_gpu_stream_tests --gtest_filter="$F" \
    > /tmp/o/${tool}_p2p.txt 2>&1
done
timeout 190 compute-sanitizer --tool memcheck --report-api-errors no --target-processes all \
  --print-limit 50 $B/ferryrun --timeout 180 -n 2 $B/ferry_gpu_stream_tests --gtest_filter="$F" \
  > /tmp/o/memcheck_noapi.txt 2>&1
FERRY_CUDA_IPC=1 $B/ferryrun --timeout 150 -n 2 $B/ferry_gpu_tests > /tmp/o/gpu_ipc.log 2>&1
FERRY_CUDA_IPC=0 $B/ferryrun --timeout 150 -n 2 $B/ferry_gpu_tests > /tmp/o/gpu_staged.log 2>&1
$B/ferryrun --timeout 200 -n 2 $B/ferry_gpu_stream_tests > /tmp/o/stream_ipc.log 2>&1
tar czf "$OUT/run.tgz" -C /tmp/o .
# Second call: the send/recv kernels kept on the shared GPU (FERRY_COLL_DEVICE_SHARED_GPU=1; by
# default two ranks on one GPU go by ferry's thread), plain and under each tool (shared_*.txt).
export FERRY_COLL_DEVICE_SHARED_GPU=1
F="Stream.GraphReplaysSendRecv:Stream.SendRecvGroupVerdictsOutliveTheirLaunch:Stream.SendRecvToItself"
$B/ferryrun --timeout 100 -n 2 $B/ferry_gpu_stream_tests --gtest_filter="$F" > /tmp/o/shared_plain.txt 2>&1
for tool in memcheck racecheck synccheck; do
  timeout 170 compute-sanitizer --tool $tool --report-api-errors no --target-processes all \
    --print-limit 30 $B/ferryrun --timeout 160 -n 2 $B/ferry_gpu_stream_tests --gtest_filter="$F" \
    > /tmp/o/shared_${tool}.txt 2>&1
done
