#!/usr/bin/env bash
# A rank killed with SIGKILL at each named point (FERRY_TEST_CRASH_AT): ferryrun reports which rank
# and why, stops the others within seconds, exits 137, and nothing is left in /dev/shm.
#   crash_test.sh FERRYRUN MP_TESTS
set -u
ferryrun=$1 program=$2
passed=0 failed=0
# shellcheck source=shm_leftovers.sh
. "$(dirname "${BASH_SOURCE[0]}")/shm_leftovers.sh"
check() {  # name ranks point victim [test-program arguments]
  local name=$1 n=$2 point=$3 victim=$4
  shift 4
  local before after start elapsed rc out
  before=$(leftovers)
  start=$(date +%s%N)
  out=$(FERRY_TEST_CRASH_AT=$point FERRY_TEST_CRASH_RANK=$victim \
        timeout 120 "$ferryrun" -n "$n" "$program" "$@" 2>&1 >/dev/null)
  rc=$?
  elapsed=$(( ($(date +%s%N) - start) / 1000000 ))  # ms
  after=$(leftovers)
  local why=""
  [ "$rc" -eq 137 ] || why+="exit code $rc, expected 137; "
  echo "$out" | grep -q "rank $victim .*signal 9" || why+="no report naming rank $victim and signal 9; "
  [ "$elapsed" -lt 30000 ] || why+="took ${elapsed} ms; "
  [ "$before" = "$after" ] || why+="left in /dev/shm: $(comm -13 <(echo "$before") <(echo "$after")); "
  if [ -z "$why" ]; then
    passed=$((passed + 1)); echo "ok   $name (${elapsed} ms)"
  else
    failed=$((failed + 1)); echo "FAIL $name: $why"; echo "$out" | tail -5
  fi
}
check "kill after creating the segment, before peers mapped it" 3 segment-created 1
check "kill right after init" 3 initialized 0
check "kill a sender at its first send" 3 first-send 1
check "kill a random one of 8 ranks mid-job" 8 first-send $((RANDOM % 8))
# One short test before finalize: the whole suite takes 20 s under TSan, and the time limit is for
# the ending, not for the tests.
check "kill in finalize" 3 finalize 2 --gtest_filter='*ZeroByteMessagesCarryTheirTag'
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
