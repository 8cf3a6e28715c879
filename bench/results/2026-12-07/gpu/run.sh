#!/usr/bin/env bash
# One GPU, two ranks sharing it; binaries from `bench/gpu_run.sh pack build`, carried as .devbin.
#   bash bench/results/2026-12-07/gpu/run.sh main|rest|sanitizer
# Ran once (main, one H100) at b7ee9cd, which added the `thread-idle` mode of
# ferry_gpu_stream_tests and was taken back (thread_idle.txt: the job stopped at its limit); the
# other outputs here are of that run. sanitizer did not run (no machine lent again).
# main: the send/recv launches that release their streams themselves (FERRY_COLL_DEVICE_SHARED_GPU=1
# keeps the send/recv kernels on a shared GPU): thread-idle, the send/recv tests, a peer killed
# during graph replays and a receive that never matches; then the whole stream suite with the
# defaults (on a shared GPU send/recv go by ferry's thread). sanitizer: compute-sanitizer's three
# tools over the send/recv tests with the kernels.
set -u
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
B=$PWD/.devbin/bin
o=/tmp/o
mkdir -p $o "$OUT"
nvidia-smi -L > $o/gpus.txt
F="Stream.GraphReplaysSendRecv:Stream.SendRecvGroupVerdictsOutliveTheirLaunch:Stream.SendRecvToItself:Stream.SendRecvHostBuffersSizesAndWaves"
case ${1:-main} in
  main|rest)
    # rest: all but thread-idle (which ../gpu2/run.sh runs its own way).
    export FERRY_COLL_DEVICE_SHARED_GPU=1
    if [ "${1:-main}" = main ]; then
      FERRY_TEST_STREAM_THREAD_IDLE=1 timeout 130 $B/ferryrun --timeout 120 -n 2 \
        $B/ferry_gpu_stream_tests thread-idle > $o/thread_idle.txt 2>&1
      echo "exit $?" >> $o/thread_idle.txt
    fi
    timeout 200 $B/ferryrun --timeout 190 -n 2 $B/ferry_gpu_stream_tests --gtest_filter="$F" \
      > $o/shared_p2p.txt 2>&1
    echo "exit $?" >> $o/shared_p2p.txt
    for mode in p2p-graph-death p2p-never-arrives; do
      FERRY_TIMEOUT=$([ $mode = p2p-never-arrives ] && echo 1 || echo 0) timeout 70 \
        $B/ferryrun --timeout 60 --keep-going -n 2 $B/ferry_gpu_stream_tests $mode \
        > $o/shared_$mode.txt 2>&1
      echo "exit $?" >> $o/shared_$mode.txt
    done
    unset FERRY_COLL_DEVICE_SHARED_GPU
    timeout 230 $B/ferryrun --timeout 220 -n 2 $B/ferry_gpu_stream_tests > $o/stream_default.txt 2>&1
    echo "exit $?" >> $o/stream_default.txt
    ;;
  sanitizer)
    export FERRY_COLL_DEVICE_SHARED_GPU=1
    F="Stream.GraphReplaysSendRecv:Stream.SendRecvGroupVerdictsOutliveTheirLaunch:Stream.SendRecvToItself"
    for tool in memcheck racecheck synccheck; do
      timeout 170 compute-sanitizer --tool $tool --report-api-errors no --target-processes all \
        --print-limit 30 $B/ferryrun --timeout 160 -n 2 $B/ferry_gpu_stream_tests \
        --gtest_filter="$F" > $o/sanitizer_$tool.txt 2>&1
      echo "exit $?" >> $o/sanitizer_$tool.txt
    done
    ;;
esac
for f in $o/*.txt; do
  echo "===== $(basename $f)"
  grep -E "^rank|PASSED|FAILED|Failure|ERROR SUMMARY|RACECHECK SUMMARY|^exit|error|Expected|Which is" $f | head -40
done > "$OUT/summary_${1:-main}.txt"
tar czf "$OUT/logs_${1:-main}.tgz" -C $o .
cat "$OUT/summary_${1:-main}.txt"
