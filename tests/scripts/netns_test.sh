#!/usr/bin/env bash
# Two "nodes" on one machine: two network namespaces joined by a veth pair, two ranks in each.
# Ranks of a namespace talk over shm, ranks of different ones over libfabric (tcp on the veth
# addresses, which exist only inside the namespaces). Runs the multi-process suite, then kills a
# rank of one "node" mid-job. The namespaces are created and removed here; without the rights to
# make them the test is skipped (exit 77) and says so.
#   netns_test.sh FERRYRUN MP_TESTS FAULT_TEST [RESILIENCE_TEST]
set -u
ferryrun=$1 program=$2 fault=$3 resilience=${4:-}
id=$$
ns_a=ferry-a-$id ns_b=ferry-b-$id if_a=fva$id if_b=fvb$id
cleanup() { ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; }
trap cleanup EXIT
# shellcheck source=two_namespaces.sh
. "$(dirname "${BASH_SOURCE[0]}")/two_namespaces.sh"
if ! two_namespaces "$ns_a" "$ns_b" "$if_a" "$if_b" 10.231.7; then
  echo "SKIP: cannot create network namespaces here (needs iproute2, root and CAP_SYS_ADMIN)"
  exit 77
fi

# Ranks 0 and 1 run in the first namespace, the others in the second, each told its place on
# its "node" as a launcher of two nodes would (FERRY_LOCAL_RANK, FERRY_LOCAL_SIZE).
place='if [ "$FERRY_RANK" -lt 2 ]; then
  ns='$ns_a' nic='$if_a' local=$FERRY_RANK count=2
else
  ns='$ns_b' nic='$if_b' local=$((FERRY_RANK - 2)) count=$((FERRY_SIZE - 2))
fi
exec ip netns exec "$ns" env FERRY_LOCAL_RANK=$local FERRY_LOCAL_SIZE=$count \
  FERRY_OFI_PROVIDER=tcp FI_TCP_IFACE="$nic" "$@"'
passed=0 failed=0
out=$(timeout 300 "$ferryrun" --timeout 280 -n 4 bash -c "$place" bash "$program" 2>&1)
rc=$?
if [ $rc -eq 0 ] && [ "$(echo "$out" | grep -c '^\[  PASSED  \]')" -eq 4 ]; then
  passed=$((passed + 1)); echo "ok   the multi-process suite, 2+2 ranks in two namespaces"
else
  failed=$((failed + 1)); echo "FAIL the multi-process suite in two namespaces: rc $rc"
  echo "$out" | grep -E "Failure|FAILED|error|warning" | head -20
fi
# Rank 2, alone in the second namespace, is killed with messages pending (tests/mp/fault_test.cpp);
# ranks 0 and 1 see it over ofi: by pidfd (same boot id and pid namespace), then as if remote,
# by keepalives over the veth.
for detect in "" "FERRY_TEST_OFI_REMOTE=1 FERRY_KEEPALIVE=0.2"; do
  # shellcheck disable=SC2086
  out=$(env $detect timeout 60 "$ferryrun" --keep-going -n 3 bash -c "$place" bash "$fault" 2>&1)
  rc=$?
  if [ $rc -eq 137 ] && [ "$(echo "$out" | grep -c "peer failure seen in .* 0 failures")" -eq 2 ]; then
    passed=$((passed + 1))
    echo "ok   a rank of the other namespace killed (${detect:-pidfd}): $(echo "$out" | grep -o 'seen in [0-9.]* ms' | tr '\n' ' ')"
  else
    failed=$((failed + 1)); echo "FAIL a rank of the other namespace killed (${detect:-pidfd}): rc $rc"
    echo "$out" | tail -8
  fi
done
# Ranks 2 and 3 in the second namespace; rank 3 is killed while ranks 0 and 1 only wait to
# receive from it. With keepalives 30 s apart, they learn it from rank 2, which saw it exit.
if [ -n "$resilience" ]; then
  out=$(FERRY_TEST_OFI_REMOTE=1 FERRY_KEEPALIVE=30 FERRY_TIMEOUT=20 timeout 60 "$ferryrun" \
        --keep-going -n 4 bash -c "$place" bash "$resilience" death-notice 2>&1)
  rc=$?
  if [ $rc -eq 137 ] && [ "$(echo "$out" | grep -c "death-notice, 0 failures")" -eq 3 ]; then
    passed=$((passed + 1))
    echo "ok   a death on the other node told by a rank there: $(echo "$out" | grep -o 'seen in [0-9.]* ms' | tr '\n' ' ')"
  else
    failed=$((failed + 1)); echo "FAIL a death on the other node told by a rank there: rc $rc"
    echo "$out" | tail -8
  fi
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
