#!/usr/bin/env bash
# A rank SIGKILLed mid-job under `ferryrun --keep-going`: the survivors' operations with it fail
# with kPeerFailed (checked inside fault_test), they finish their own work and exit 0, ferryrun
# reports the death and exits 137, nothing is left in /dev/shm, and the job ends in seconds.
#   fault_test.sh FERRYRUN FAULT_TEST
set -u
ferryrun=$1 program=$2
passed=0 failed=0
leftovers() { ls /dev/shm 2>/dev/null | grep '^ferry-' | sort; }
before=$(leftovers)
for variant in "" "FERRY_SHM_CMA_THRESHOLD=0" "FERRY_SHM_CMA=0"; do
  start=$(date +%s%N)
  out=$(env $variant timeout 60 "$ferryrun" --keep-going -n 3 "$program" 2>&1)
  rc=$?
  elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
  why=""
  [ "$rc" -eq 137 ] || why+="exit code $rc, expected 137; "
  echo "$out" | grep -q "rank 2 .*signal 9" || why+="ferryrun did not report rank 2; "
  [ "$(echo "$out" | grep -c "peer failure seen in .* 0 failures")" -eq 2 ] || why+="survivors failed; "
  echo "$out" | grep -q "^FAIL" && why+="a check failed; "
  [ "$elapsed" -lt 20000 ] || why+="took $elapsed ms; "
  [ "$before" = "$(leftovers)" ] || why+="left files in /dev/shm; "
  if [ -z "$why" ]; then
    passed=$((passed + 1))
    echo "ok   ${variant:-default}: $(echo "$out" | grep -o 'seen in [0-9.]* ms' | tr '\n' ' ')(${elapsed} ms)"
  else
    failed=$((failed + 1)); echo "FAIL ${variant:-default}: $why"; echo "$out" | tail -15
  fi
done
out=$(FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 FERRY_SHM_CMA=0 \
      timeout 60 "$ferryrun" --keep-going -n 3 "$program" pipeline 2>&1)
rc=$?
if [ "$rc" -eq 137 ] && [ "$(echo "$out" | grep -c "mid-pipeline kill, 0 failures")" -eq 2 ] &&
   [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   a sender killed mid-pipeline fails the receive"
else
  failed=$((failed + 1)); echo "FAIL mid-pipeline kill: rc $rc"; echo "$out" | tail -5
fi
out=$(FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 FERRY_TEST_HOST_STAGING=1 \
      FERRY_CUDA_STAGE_CHUNK=64k timeout 60 "$ferryrun" --keep-going -n 3 "$program" pipeline 2>&1)
rc=$?
if [ "$rc" -eq 137 ] && [ "$(echo "$out" | grep -c "mid-pipeline kill, 0 failures")" -eq 2 ] &&
   [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   a sender killed mid-staging (the device fallback ring) fails the receive"
else
  failed=$((failed + 1)); echo "FAIL mid-staging kill: rc $rc"; echo "$out" | tail -5
fi
out=$(FERRY_TEST_HOST_STAGING=1 FERRY_TEST_STAGE_OPEN_FAIL=1 FERRY_TIMEOUT=10 FERRY_CUDA_STAGE_CHUNK=64k \
      timeout 60 "$ferryrun" -n 3 "$program" stagefail 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && [ "$(echo "$out" | grep -c "staging refused, 0 failures")" -eq 3 ] &&
   [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   a receiver that cannot map the staging ring fails both sides"
else
  failed=$((failed + 1)); echo "FAIL staging refused: rc $rc"; echo "$out" | tail -6
fi
out=$(FERRY_TEST_CRASH_AT=mid-claim FERRY_TEST_CRASH_RANK=2 \
      timeout 60 "$ferryrun" --keep-going -n 3 "$program" hole 2>&1)
rc=$?
if [ "$rc" -eq 137 ] && [ "$(echo "$out" | grep -c "dead producer, 0 failures")" -eq 2 ] &&
   [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   a producer killed between claim and publish leaves no stuck FIFO"
else
  failed=$((failed + 1)); echo "FAIL hole left by a dead producer: rc $rc"; echo "$out" | tail -5
fi
out=$(FERRY_TIMEOUT=0.5 FERRY_SHM_CMA_THRESHOLD=0 FERRY_TEST_GET_DELAY=1 \
      timeout 60 "$ferryrun" -n 3 "$program" withdraw 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && [ "$(echo "$out" | grep -c "withdrawn while read, 0 failures")" -eq 3 ]; then
  passed=$((passed + 1)); echo "ok   a send withdrawn while its receiver reads it is not delivered"
else
  failed=$((failed + 1)); echo "FAIL withdrawn while read: rc $rc"; echo "$out" | tail -6
fi
out=$(FERRY_TIMEOUT=0.5 timeout 60 "$ferryrun" -n 3 "$program" timeout 2>&1)
rc=$?
if [ "$rc" -eq 0 ] && [ "$(echo "$out" | grep -c "timeouts, 0 failures")" -eq 3 ]; then
  passed=$((passed + 1)); echo "ok   FERRY_TIMEOUT bounds blocking send, recv and probe"
else
  failed=$((failed + 1)); echo "FAIL FERRY_TIMEOUT: rc $rc"; echo "$out" | tail -8
fi
start=$(date +%s%N)
out=$(timeout 60 "$ferryrun" -n 3 "$program" abort 2>&1)
rc=$?
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$rc" -eq 7 ] && echo "$out" | grep -q "rank 1 .*aborted the job with code 7: fault_test asked for it" &&
   [ "$elapsed" -lt 10000 ] && [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   Context::abort ends every rank (${elapsed} ms)"
else
  failed=$((failed + 1)); echo "FAIL Context::abort: rc $rc, ${elapsed} ms"; echo "$out" | tail -5
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
