# Sourced by netns_test.sh and bench/resilience.sh: two network namespaces joined by a veth pair,
# as two "nodes" on one machine. two_namespaces NS_A NS_B IF_A IF_B SUBNET (e.g. 10.231.7) makes
# them (SUBNET.1 in the first, SUBNET.2 in the second) and returns non-zero where this machine
# does not allow it (needs iproute2, root and CAP_SYS_ADMIN); the caller removes them
# (ip netns del) when done.
two_namespaces() {
  local ns_a=$1 ns_b=$2 if_a=$3 if_b=$4 subnet=$5 ns
  command -v ip >/dev/null && ip netns add "$ns_a" 2>/dev/null || return 1
  ip netns add "$ns_b" &&
    ip link add "$if_a" type veth peer name "$if_b" &&
    ip link set "$if_a" netns "$ns_a" &&
    ip link set "$if_b" netns "$ns_b" &&
    ip -n "$ns_a" addr add "$subnet.1/24" dev "$if_a" &&
    ip -n "$ns_b" addr add "$subnet.2/24" dev "$if_b" || return 1
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up || return 1; done
  ip -n "$ns_a" link set "$if_a" up && ip -n "$ns_b" link set "$if_b" up
}
