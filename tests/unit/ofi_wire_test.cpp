// The ofi transport's decoders and provider filter (src/transport/ofi/wire.hpp).
#include <gtest/gtest.h>

#include <cstring>

#include "transport/ofi/wire.hpp"

namespace ferry::transport::ofi {
namespace {

std::vector<std::byte> message(const Wire& wire, std::size_t body) {
  std::vector<std::byte> out(sizeof wire + body, std::byte{7});
  std::memcpy(out.data(), &wire, sizeof wire);
  return out;
}

TEST(OfiWire, AWellFormedMessageParses) {
  Wire in{3, 0, kWireMagic, 2, 10, 41, 0, 0};
  Wire out{};
  ASSERT_TRUE(parse_message(message(in, 10), 4, 0, &out));
  EXPECT_EQ(out.id, 3);
  EXPECT_EQ(out.source, 2);
  EXPECT_EQ(out.length, 10u);
  EXPECT_EQ(out.seq, 41u);
}

TEST(OfiWire, MalformedMessagesAreRefused) {
  Wire out{};
  EXPECT_FALSE(parse_message(std::vector<std::byte>(15), 4, 0, &out));                 // no header
  EXPECT_FALSE(parse_message(message({3, 0, 0x1234, 2, 10, 0}, 10), 4, 0, &out));      // magic
  EXPECT_FALSE(parse_message(message({3, 0, kWireMagic, 2, 11, 0}, 10), 4, 0, &out));  // length
  EXPECT_FALSE(parse_message(message({3, 0, kWireMagic, 2, 9, 0}, 10), 4, 0, &out));
  EXPECT_FALSE(parse_message(message({3, 0, kWireMagic, 4, 10, 0}, 10), 4, 0, &out));  // rank
  EXPECT_FALSE(parse_message(message({3, 0, kWireMagic, -1, 10, 0}, 10), 4, 0, &out));
  EXPECT_FALSE(parse_message(message({3, 0, kWireMagic, 0, 10, 0}, 10), 4, 0, &out));  // self
}

TEST(OfiWire, AddressesRoundTripAndBadOnesAreRefused) {
  AddressHeader header{kAddressMagic, 1234, node_identity()};
  const std::vector<std::byte> name(24, std::byte{0x5a});
  std::vector<std::byte> address = encode_address(header, name);
  AddressHeader got{};
  std::span<const std::byte> got_name;
  ASSERT_TRUE(parse_address(address, &got, &got_name));
  EXPECT_EQ(got.pid, 1234);
  EXPECT_EQ(got.node, header.node);
  EXPECT_EQ(std::vector<std::byte>(got_name.begin(), got_name.end()), name);

  EXPECT_FALSE(parse_address(encode_address(header, {}), &got, &got_name));  // no name
  EXPECT_FALSE(
      parse_address(encode_address(header, std::vector<std::byte>(kMaxAddress)), &got, &got_name));
  AddressHeader bad = header;
  bad.magic = 0;
  EXPECT_FALSE(parse_address(encode_address(bad, name), &got, &got_name));
  bad = header;
  bad.node.fill('x');  // not terminated
  EXPECT_FALSE(parse_address(encode_address(bad, name), &got, &got_name));
}

TEST(OfiWire, NodeIdentityNamesBootAndPidNamespace) {
  const std::array<char, 64> node = node_identity();
  const std::string text(node.data());
  EXPECT_NE(text.find('/'), std::string::npos) << text;
  EXPECT_GT(text.size(), 10u) << text;
}

TEST(OfiWire, ProviderListsIncludeAndExclude) {
  EXPECT_TRUE(provider_allowed("", "tcp;ofi_rxm"));
  EXPECT_TRUE(provider_allowed("tcp", "tcp;ofi_rxm"));
  EXPECT_TRUE(provider_allowed("ofi_rxm", "tcp;ofi_rxm"));
  EXPECT_FALSE(provider_allowed("verbs", "tcp;ofi_rxm"));
  EXPECT_FALSE(provider_allowed("^tcp", "tcp;ofi_rxm"));
  EXPECT_TRUE(provider_allowed("^shm", "tcp;ofi_rxm"));
  EXPECT_FALSE(provider_allowed("^shm", "shm"));
  EXPECT_TRUE(provider_allowed("shm,tcp", "shm"));
  EXPECT_FALSE(provider_allowed("tcp,^ofi_rxm", "tcp;ofi_rxm"));
  EXPECT_FALSE(provider_allowed("tc", "tcp;ofi_rxm"));  // whole names only
  EXPECT_TRUE(provider_allowed("^", "tcp"));
  EXPECT_FALSE(provider_allowed("tcp", nullptr));
}

}  // namespace
}  // namespace ferry::transport::ofi
