#!/usr/bin/env bash
# Fault-tolerant communicators (resilience_test.cpp): revoke, agree and shrink with a rank
# SIGKILLed before, during and after each, under `ferryrun --keep-going -n 4`. A scenario passes
# when ferryrun exits as expected (137 where a rank was killed), every survivor reports 0
# failures, and nothing is left in /dev/shm.
#   resilience_test.sh FERRYRUN RESILIENCE_TEST [ofi]
set -u
ferryrun=$1 program=$2 with_ofi=${3:-}
passed=0 failed=0
# shellcheck source=shm_leftovers.sh
. "$(dirname "${BASH_SOURCE[0]}")/shm_leftovers.sh"
before=$(leftovers)
# `run WHAT RC SURVIVORS [VAR=VALUE...] -- PROGRAM-ARGS...`
run() {
  local what=$1 want_rc=$2 survivors=$3 vars=()
  shift 3
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  local out rc
  out=$(env FERRY_TIMEOUT=30 "${vars[@]}" timeout 60 "$ferryrun" --keep-going -n 4 "$program" "$@" 2>&1)
  rc=$?
  local ok
  ok=$(echo "$out" | grep -c "^rank [0-9]: $*, 0 failures")
  if [ "$rc" -eq "$want_rc" ] && [ "$ok" -eq "$survivors" ] && [ "$before" = "$(leftovers)" ]; then
    passed=$((passed + 1))
    echo "ok   $what $(echo "$out" | grep -o 'took [0-9.]* ms' | head -1)"
  else
    failed=$((failed + 1)); echo "FAIL $what: rc $rc, $ok of $survivors survivors ok"
    echo "$out" | tail -12
  fi
}
variants=("" "FERRY_WAIT_MODE=block")
[ "$with_ofi" = ofi ] && variants+=("FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp")
for variant in "${variants[@]}"; do
  # shellcheck disable=SC2086
  set -- $variant
  tag=${variant:+ ($variant)}
  run "revoke ends blocked and pending collectives; agree and shrink on it$tag" 0 4 "$@" -- revoke
  run "a timeout names the call and who had not arrived$tag" 0 4 "$@" FERRY_TIMEOUT=1 -- \
    never-arrives
  run "the revoker dies having told one member$tag" 137 3 "$@" FERRY_TEST_CRASH_AT=mid-revoke \
    FERRY_TEST_CRASH_RANK=0 -- revoke-death
  for call in agree shrink; do
    run "$call: a rank died before$tag" 137 3 "$@" -- "$call" before 3
    run "$call: a rank died after an agreement$tag" 137 3 "$@" -- "$call" after 2
    run "$call: a rank dies sending its contribution$tag" 137 3 "$@" FERRY_TEST_CRASH_AT=mid-agree \
      FERRY_TEST_CRASH_RANK=1 -- "$call" during 1
    run "$call: the first coordinator dies mid-round$tag" 137 3 "$@" FERRY_TEST_CRASH_AT=mid-decide \
      FERRY_TEST_CRASH_RANK=0 -- "$call" during 0
    run "$call: a rank ended its Context without joining$tag" 0 4 "$@" -- "$call" departs 1
  done
done
# The wait board: a program asks for it (Context::wait_report), and ferryrun prints it when the
# job times out (rank 3 never joins the others' barrier).
run "the wait report names each rank's call and whom it waits for" 0 4 -- report
out=$(timeout 60 "$ferryrun" --timeout 2 -n 4 "$program" stuck 2>&1)
rc=$?
board=$(echo "$out" | sed -n '/where the ranks were at the timeout/,$p')
waiting=$(echo "$board" | grep -c "^  rank [012]: waiting [0-9.]* s: barrier .* on communicator 0 .*waiting for member 3 (rank 3)")
if [ "$rc" -eq 124 ] && [ "$waiting" -eq 3 ] &&
   echo "$board" | grep -q "^  rank 3: running, not waiting in ferry" && [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   ferryrun --timeout prints who waits for what"
else
  failed=$((failed + 1)); echo "FAIL ferryrun --timeout prints who waits for what: rc $rc, $waiting lines"
  echo "$out" | tail -12
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
