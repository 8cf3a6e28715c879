#!/usr/bin/env bash
# Recovery time of a job that loses a rank: examples/resilient_training kills its last rank at
# step 10 and the survivors revoke, shrink and redo the allreduce; it prints how long that took
# (from the failed allreduce's return on member 0 to the redone one's end). Cases:
#   one node, 8 ranks over shared memory;
#   two "nodes", 16 ranks: two network namespaces joined by a veth pair (8 ranks in each, ofi tcp
#   between them, a death across them seen as a remote one, by failed sends and keepalives
#   (FERRY_TEST_OFI_REMOTE=1, FERRY_KEEPALIVE at its default of 1 s), where this machine lets us make namespaces (root), else every peer
#   taken as remote on one node (the same detection, without the namespaces).
# Then how soon a death is seen with the CPUs saturated (two busy processes per CPU beside the
# job): tests/mp/fault_test's victim dies 100 ms after a barrier while the others wait on it;
# printed is the time from the kill to the error (their wait's length less those 100 ms), on
# one node (pidfd), and across the namespaces (death notice from the victim's node-mate,
# resilience_test death-notice, keepalives 30 s apart).
#   bench/resilience.sh BUILD_DIR [ROUNDS]
set -u
build=$1 rounds=${2:-5}
ferryrun=$build/tools/ferryrun program=$build/examples/resilient_training
# `times LABEL [VAR=VALUE...] -- FERRYRUN-ARGS...`: the recovery time of each round, and the median.
times() {
  local label=$1 vars=() values=()
  shift
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  for _ in $(seq "$rounds"); do
    out=$(env "${vars[@]}" timeout 120 "$ferryrun" --keep-going "$@" 2>&1)
    values+=("$(echo "$out" | grep -o 'took [0-9.]* ms' | grep -o '[0-9.]*')")
    echo "$out" | grep -q "every step's gradient checked" || { echo "  FAIL:"; echo "$out" | grep -v "^step\|finalize" | head -20; }
  done
  printf '%-58s %s  median %s ms\n' "$label" "${values[*]}" \
    "$(printf '%s\n' "${values[@]}" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}')"
}
times "one node, 8 ranks (shm)" -- -n 8 "$program"
id=$$ ns_a=ferry-ra-$$ ns_b=ferry-rb-$$ if_a=fra$$ if_b=frb$$
busy=()
cleanup() {
  ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null
  [ ${#busy[@]} -eq 0 ] || kill "${busy[@]}" 2>/dev/null
}
trap cleanup EXIT
remote=(FERRY_TEST_OFI_REMOTE=1)
# shellcheck source=../tests/scripts/two_namespaces.sh
. "$(dirname "${BASH_SOURCE[0]}")/../tests/scripts/two_namespaces.sh"
if two_namespaces "$ns_a" "$ns_b" "$if_a" "$if_b" 10.231.9; then
  place='half=$((FERRY_SIZE / 2))
  if [ "$FERRY_RANK" -lt $half ]; then ns='$ns_a' nic='$if_a' local=$FERRY_RANK
  else ns='$ns_b' nic='$if_b' local=$((FERRY_RANK - half)); fi
  exec ip netns exec "$ns" env FERRY_LOCAL_RANK=$local FERRY_LOCAL_SIZE=$half \
    FERRY_OFI_PROVIDER=tcp FI_TCP_IFACE="$nic" "$@"'
  times "two namespace nodes, 16 ranks (shm + ofi tcp, keepalives)" "${remote[@]}" -- \
    -n 16 bash -c "$place" bash "$program"
else
  times "16 ranks, every peer remote (ofi tcp, keepalives)" FERRY_TRANSPORTS=self,ofi \
    FERRY_OFI_PROVIDER=tcp "${remote[@]}" -- -n 16 "$program"
fi

# Detection with the CPUs saturated.
for _ in $(seq $((2 * $(nproc)))); do
  sh -c 'while :; do :; done' &
  busy+=($!)
done
detect() {
  local label=$1 offset=$2 values=()
  shift 2
  for _ in $(seq "$rounds"); do
    out=$("$@" 2>&1)
    for v in $(echo "$out" | grep -o 'seen in [0-9.]* ms' | grep -o '[0-9.]*'); do
      values+=("$(awk -v v="$v" -v o="$offset" 'BEGIN { printf "%.1f", v - o }')")
    done
  done
  printf '%-58s %s  max %s ms\n' "$label" "${values[*]}" \
    "$(printf '%s\n' "${values[@]}" | sort -n | tail -1)"
}
detect "under load, one node: kill to error (spin)" 100 \
  timeout 60 "$ferryrun" --keep-going -n 3 "$build/tests/ferry_fault_test"
detect "under load, one node: kill to error (FERRY_WAIT_MODE=block)" 100 \
  env FERRY_WAIT_MODE=block timeout 60 "$ferryrun" --keep-going -n 3 "$build/tests/ferry_fault_test"
if [ -n "${place:-}" ]; then
  detect "under load, across the namespaces: kill to error (notice)" 0 \
    env FERRY_TEST_OFI_REMOTE=1 FERRY_KEEPALIVE=30 FERRY_TIMEOUT=20 timeout 60 "$ferryrun" \
    --keep-going -n 4 bash -c "$place" bash "$build/tests/ferry_resilience_test" death-notice
fi
