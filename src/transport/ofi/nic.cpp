#include "transport/ofi/nic.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

namespace ferry::transport::ofi {
namespace {

int read_node(const std::string& path) {
  std::ifstream in(path);
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

}  // namespace

int nic_numa_node(const std::string& domain_name, const std::optional<PciAddress>& pci,
                  const std::string& sysfs) {
  if (pci) {
    char address[32];
    std::snprintf(address, sizeof address, "%04x:%02x:%02x.%x", pci->domain, pci->bus, pci->device,
                  pci->function);
    const int node = read_node(sysfs + "/bus/pci/devices/" + address + "/numa_node");
    if (node >= 0) return node;
  }
  if (domain_name.empty() || domain_name.find('/') != std::string::npos ||
      domain_name.find("..") != std::string::npos) {
    return -1;
  }
  for (const char* kind : {"net", "infiniband"}) {
    const int node = read_node(sysfs + "/class/" + kind + "/" + domain_name + "/device/numa_node");
    if (node >= 0) return node;
  }
  return -1;
}

int current_numa_node() {
  unsigned cpu = 0, node = 0;
  if (::syscall(SYS_getcpu, &cpu, &node, nullptr) != 0) return -1;
  return static_cast<int>(node);
}

std::size_t nearest_candidate(std::span<const int> candidate_nodes, int node) {
  if (node < 0) return 0;
  for (std::size_t i = 0; i < candidate_nodes.size(); ++i) {
    if (candidate_nodes[i] == node) return i;
  }
  return 0;
}

}  // namespace ferry::transport::ofi
