#!/usr/bin/env bash
# The kill campaign: KILLS jobs of RANKS ranks under `ferryrun --keep-going`, each running random
# traffic (tests/mp/campaign_test.cpp, a new seed per job) in a random transport variant, and one
# random rank SIGKILLed at a random moment after every rank started its traffic. A kill passes when
# the job ends within 60 s (no hang), ferryrun reports the death (exit 137), every survivor prints
# "survived" with the agreed failed set equal to the victim alone, no rank saw a wrong byte or an
# unexpected error, and nothing of ferry's is left in /dev/shm. With `two-nodes`, the first half
# of the ranks and the second run in two network namespaces joined by a veth pair (ofi tcp between
# them, shm inside each; skipped with exit 77 where namespaces cannot be made).
#   campaign.sh FERRYRUN WORKER KILLS [RANKS] [one-node|two-nodes] [RESULTS_FILE]
# Prints a line per kill and, at the end, the kill-to-error times (ms, from just before the
# SIGKILL to each survivor's first error) per variant: median, 99th percentile, max. A kill whose
# slowest survivor took more than CAMPAIGN_BOUND_MS (default 2000) fails as slow. RESULTS_FILE
# gets one line per survivor: variant, kill number, milliseconds; the whole output of each failed
# kill goes beside it (kill-N.txt). A failed kill prints its replay: CAMPAIGN_REPLAY="SEED VICTIM
# DELAY_MS [VAR=VALUE]" runs every kill with those.
set -u
ferryrun=$1 worker=$2 kills=$3 ranks=${4:-8} layout=${5:-one-node} results=${6:-}
bound_ms=${CAMPAIGN_BOUND_MS:-2000}
id=$$
ns_a=ferry-ca-$id ns_b=ferry-cb-$id if_a=fca$id if_b=fcb$id
work=$(mktemp -d)
cleanup() {
  rm -rf "$work"
  if [ "$layout" = two-nodes ]; then ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; fi
}
trap cleanup EXIT
# What a job left in /dev/shm: only its own files (its ranks print the job's id), so that other
# jobs running beside the campaign (ctest -j) are not taken for its leftovers.
leftovers() { ls /dev/shm 2>/dev/null | grep "^ferry-$1-" | sort; }

wrapper=()
variants=("" "FERRY_SHM_CMA=0" "FERRY_SHM_CMA_THRESHOLD=0" "FERRY_WAIT_MODE=block")
if [ "$layout" = two-nodes ]; then
  # shellcheck source=two_namespaces.sh
  . "$(dirname "${BASH_SOURCE[0]}")/two_namespaces.sh"
  if ! two_namespaces "$ns_a" "$ns_b" "$if_a" "$if_b" 10.231.9; then
    echo "SKIP: cannot create network namespaces here (needs iproute2, root and CAP_SYS_ADMIN)"
    exit 77
  fi
  half=$((ranks / 2))
  place='if [ "$FERRY_RANK" -lt '$half' ]; then
    ns='$ns_a' nic='$if_a' local=$FERRY_RANK count='$half'
  else
    ns='$ns_b' nic='$if_b' local=$((FERRY_RANK - '$half')) count=$((FERRY_SIZE - '$half'))
  fi
  exec ip netns exec "$ns" env FERRY_LOCAL_RANK=$local FERRY_LOCAL_SIZE=$count \
    FERRY_OFI_PROVIDER=tcp FI_TCP_IFACE="$nic" "$@"'
  wrapper=(bash -c "$place" bash)
fi

passed=0 failed=0
: > "$work/times"
for kill_number in $(seq 1 "$kills"); do
  seed=$(( (RANDOM << 15 | RANDOM) + 1 ))
  victim=$((RANDOM % ranks))
  delay_ms=$((20 + RANDOM % 800))
  variant=${variants[$((RANDOM % ${#variants[@]}))]}
  # shellcheck disable=SC2086
  [ -z "${CAMPAIGN_REPLAY:-}" ] || read -r seed victim delay_ms variant <<<"$CAMPAIGN_REPLAY"
  out=$work/out
  # Emptied here, not only by the job's redirection, which runs in the background: the wait for
  # the ranks below could otherwise read the previous job's lines (and its victim's pid).
  : > "$out"
  # ferryrun's own limit first: it prints where each rank waits before it ends the job.
  # shellcheck disable=SC2086
  env $variant CAMPAIGN_SEED=$seed timeout 60 "$ferryrun" --timeout 50 --keep-going \
    -n "$ranks" "${wrapper[@]}" "$worker" > "$out" 2>&1 &
  job=$!
  # Every rank has started its traffic (or the job ended early).
  for _ in $(seq 1 3000); do
    [ "$(grep -c ' ready$' "$out")" -ge "$ranks" ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  pid=$(grep "^campaign: rank $victim pid " "$out" | awk '{print $5}')
  why=""
  kill_ns=0
  if [ -z "$pid" ]; then
    why+="rank $victim never started its traffic; "
  else
    sleep "$(printf '0.%03d' "$delay_ms")"
    kill_ns=$(date +%s%N)
    kill -9 "$pid" 2>/dev/null || why+="rank $victim (pid $pid) was gone before the kill; "
  fi
  wait "$job"
  rc=$?
  if grep -q "^ferryrun: job timed out" "$out"; then
    why+="HANG: the job did not end within 50 s; "
  elif [ "$rc" -eq 124 ]; then
    why+="HANG: ferryrun did not end within 60 s; "
  elif [ "$rc" -ne 137 ]; then
    why+="ferryrun exited $rc, not 137; "
  fi
  survivors=$(grep -c "survived: failed \[$victim\] " "$out")
  [ "$survivors" -eq $((ranks - 1)) ] || why+="$survivors of $((ranks - 1)) survivors agreed on rank $victim alone; "
  grep -q "WRONG" "$out" && why+="a wrong result; "
  grep -q "UNEXPECTED\|DIFFER" "$out" && why+="an unexpected error; "
  job_id=$(grep -m1 "^campaign: rank .* job " "$out" | awk '{print $7}' | tr -c 'A-Za-z0-9\n' '_')
  if [ -z "$job_id" ] || [ "$job_id" = - ]; then
    why+="no rank named its job; "
  elif [ -n "$(leftovers "$job_id")" ]; then
    why+="files left in /dev/shm: $(leftovers "$job_id" | tr '\n' ' '); "
  fi
  times=""
  if [ "$kill_ns" -gt 0 ]; then
    times=$(grep -o "survived: .* at [0-9]* ns" "$out" | awk -v k="$kill_ns" '{printf "%.1f\n", ($(NF-1) - k) / 1e6}' | sort -n)
    for t in $times; do echo "${variant:-default} $kill_number $t" >> "$work/times"; done
    slowest=$(echo "$times" | tail -1)
    if [ -n "$slowest" ] && awk -v t="$slowest" -v b="$bound_ms" 'BEGIN { exit !(t > b) }'; then
      why+="slow: a survivor's error came $slowest ms after the kill (bound $bound_ms ms); "
    fi
  fi
  label="kill $kill_number: rank $victim of $ranks after ${delay_ms} ms (${variant:-default}, seed $seed)"
  if [ -z "$why" ]; then
    passed=$((passed + 1))
    echo "ok   $label: errors $(echo "$times" | head -1)-$(echo "$times" | tail -1) ms after it"
  else
    failed=$((failed + 1))
    echo "FAIL $label: $why"
    echo "     replay: CAMPAIGN_REPLAY=\"$seed $victim $delay_ms $variant\""
    grep -v " ready$" "$out" | tail -12
    [ -z "$results" ] || cp "$out" "$(dirname "$results")/kill-$kill_number.txt"
  fi
done

# Per variant and overall: median, 99th percentile, max of the kill-to-error times.
summary() {
  sort -n | awk -v what="$1" '{ v[NR] = $1 } END {
    if (NR == 0) { print what ": no times"; exit }
    p99 = v[int((NR - 1) * 0.99) + 1]
    printf "%-30s %5d errors  median %7.1f ms  p99 %7.1f ms  max %7.1f ms\n", what, NR, v[int((NR + 1) / 2)], p99, v[NR] }'
}
echo "kill to error, per variant (every survivor of every kill):"
for v in $(awk '{print $1}' "$work/times" | sort -u); do
  awk -v v="$v" '$1 == v {print $3}' "$work/times" | summary "$v"
done
awk '{print $3}' "$work/times" | summary "all"
[ -z "$results" ] || cp "$work/times" "$results"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
