// Which NIC is nearest: libfabric may offer several domains (NICs) of one provider; ferry takes
// the first on the calling thread's NUMA node. Read from sysfs (the PCI device's numa_node), so
// it needs nothing beyond the kernel; free of libfabric for tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

namespace ferry::transport::ofi {

struct PciAddress {
  std::uint16_t domain = 0;
  std::uint8_t bus = 0;
  std::uint8_t device = 0;
  std::uint8_t function = 0;
};

// The NUMA node of a NIC: by its PCI address when libfabric gives one, else by the domain's name
// as a network interface or RDMA device (/sys/class/{net,infiniband}/NAME/device); -1 when
// unknown (virtual devices, one-node machines whose devices report -1). `sysfs` is for tests.
int nic_numa_node(const std::string& domain_name, const std::optional<PciAddress>& pci,
                  const std::string& sysfs = "/sys");

// The NUMA node of the CPU this thread runs on, or -1.
int current_numa_node();

// The index of the first candidate on `node`; 0 when none is (or the node is unknown).
std::size_t nearest_candidate(std::span<const int> candidate_nodes, int node);

}  // namespace ferry::transport::ofi
