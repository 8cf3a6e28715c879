// GPU memory over ofi: whether the NIC registers a GPU's memory is decided by a real registration,
// not by the provider's word, and a refusal (any error, as a NIC that cannot map GPU memory
// answers) stages device data instead. Runs against the machine's libfabric over tcp; no GPU is
// needed, since a provider without GPU support refuses the registration before it touches memory.
#if FERRY_HAVE_OFI
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "../helpers/no_messages.hpp"
#include "transport/ofi/transport.hpp"
#include "util/config.hpp"

namespace ferry::transport::ofi {
namespace {

using test::NoMessages;

class OfiHmem : public ::testing::Test {
 protected:
  std::unique_ptr<OfiTransport> open(std::map<std::string, std::string> settings) {
    settings["FERRY_OFI_PROVIDER"] = "tcp";
    try {
      return std::make_unique<OfiTransport>(util::Config::load(settings), 0, 1, &handler_);
    } catch (const Error& e) {
      ADD_FAILURE() << "no tcp endpoint: " << e.what();
      return nullptr;
    }
  }
  NoMessages handler_;
  std::vector<std::byte> buffer_ = std::vector<std::byte>(1 << 16);
};

TEST_F(OfiHmem, WithoutFiHmemDeviceDataIsStagedWithoutTrying) {
  auto transport = open({});
  ASSERT_TRUE(transport);
  // Debian's libfabric has no GPU support: tcp offers no FI_HMEM.
  if (transport->hmem().find("FI_HMEM offered") != std::string::npos) {
    GTEST_SKIP() << "this libfabric's tcp offers FI_HMEM";
  }
  EXPECT_FALSE(transport->directs().device_direct(0, buffer_.data(), buffer_.size()));
  EXPECT_NE(transport->directs().device_route().find("no FI_HMEM"), std::string::npos)
      << transport->directs().device_route();
}

TEST_F(OfiHmem, TheProvidersRefusalIsTheVerdictAndItIsKept) {
  // Told that FI_HMEM is there, ferry registers for real and the provider refuses.
  auto transport = open({{"FERRY_TEST_OFI_HMEM", "assume"}});
  ASSERT_TRUE(transport);
  EXPECT_NE(transport->directs().device_route().find("not tried yet"), std::string::npos)
      << transport->directs().device_route();
  EXPECT_FALSE(transport->directs().device_direct(0, buffer_.data(), buffer_.size()));
  const std::string route = transport->directs().device_route();
  EXPECT_NE(route.find("registering cuda:0 memory with the NIC failed ("), std::string::npos)
      << route;
  EXPECT_NE(route.find("staged through pinned host memory"), std::string::npos) << route;
  // Kept: asked again, the same answer; another GPU is tried on its own.
  EXPECT_FALSE(transport->directs().device_direct(0, buffer_.data(), buffer_.size()));
  EXPECT_FALSE(transport->directs().device_direct(1, buffer_.data(), buffer_.size()));
  EXPECT_NE(transport->directs().device_route().find("cuda:1"), std::string::npos);
}

TEST_F(OfiHmem, InjectedRefusalLooksLikeANicThatCannotMapGpuMemory) {
  auto transport = open({{"FERRY_TEST_OFI_HMEM", "fail"}});
  ASSERT_TRUE(transport);
  EXPECT_FALSE(transport->directs().device_direct(0, buffer_.data(), buffer_.size()));
  EXPECT_NE(transport->directs().device_route().find("(-22)"), std::string::npos)
      << transport->directs().device_route();
}

TEST_F(OfiHmem, OffMeansStagedWhateverTheProviderOffers) {
  auto transport = open({{"FERRY_OFI_HMEM", "off"}, {"FERRY_TEST_OFI_HMEM", "assume"}});
  ASSERT_TRUE(transport);
  EXPECT_FALSE(transport->directs().device_direct(0, buffer_.data(), buffer_.size()));
  EXPECT_NE(transport->directs().device_route().find("FERRY_OFI_HMEM=off"), std::string::npos)
      << transport->directs().device_route();
  EXPECT_EQ(transport->directs().device_route().find("cuda:0"), std::string::npos);
}

}  // namespace
}  // namespace ferry::transport::ofi
#endif
