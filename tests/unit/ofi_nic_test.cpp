// NIC choice by NUMA node (src/transport/ofi/nic.hpp), against a fake sysfs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "transport/ofi/nic.hpp"

namespace ferry::transport::ofi {
namespace {

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
 protected:
  FakeSysfs() : root_(fs::temp_directory_path() / ("ferry-sysfs-" + std::to_string(getpid()))) {
    write("bus/pci/devices/0000:41:00.0/numa_node", "1\n");
    write("bus/pci/devices/0000:01:00.0/numa_node", "-1\n");
    write("class/net/eth1/device/numa_node", "0\n");
    write("class/infiniband/mlx5_3/device/numa_node", "3\n");
  }
  ~FakeSysfs() override { fs::remove_all(root_); }
  void write(const std::string& path, const std::string& text) {
    fs::create_directories((root_ / path).parent_path());
    std::ofstream(root_ / path) << text;
  }
  fs::path root_;
};

TEST_F(FakeSysfs, NodesComeFromThePciAddressThenFromTheDeviceName) {
  const std::string sysfs = root_.string();
  EXPECT_EQ(nic_numa_node("mlx5_0", PciAddress{0, 0x41, 0, 0}, sysfs), 1);
  EXPECT_EQ(nic_numa_node("mlx5_3", PciAddress{0, 0x01, 0, 0}, sysfs), 3);  // PCI says -1
  EXPECT_EQ(nic_numa_node("eth1", std::nullopt, sysfs), 0);
  EXPECT_EQ(nic_numa_node("lo", std::nullopt, sysfs), -1);
  EXPECT_EQ(nic_numa_node("../../etc", std::nullopt, sysfs), -1);
}

TEST(OfiNic, TheFirstCandidateOnTheNodeWinsElseTheFirst) {
  const std::vector<int> nodes = {-1, 1, 0, 1};
  EXPECT_EQ(nearest_candidate(nodes, 1), 1u);
  EXPECT_EQ(nearest_candidate(nodes, 0), 2u);
  EXPECT_EQ(nearest_candidate(nodes, 2), 0u);
  EXPECT_EQ(nearest_candidate(nodes, -1), 0u);
  EXPECT_EQ(nearest_candidate({}, 0), 0u);
}

TEST(OfiNic, ThisThreadHasANode) { EXPECT_GE(current_numa_node(), 0); }

}  // namespace
}  // namespace ferry::transport::ofi
