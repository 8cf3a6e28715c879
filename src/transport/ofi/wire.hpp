// What the ofi transport puts on the wire and in its published address, and the checks that every
// received byte passes before use. Free of libfabric, so that tests and fuzzers need none.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::transport::ofi {

// Before every active message: who sent it, how long it is and its place in the sender's stream
// to us. Providers keep matching order (FI_ORDER_SAS) but not completion order: under tcp;ofi_rxm
// a large message that goes by the provider's own rendezvous completes after smaller ones sent
// behind it, so the receiver restores order by `seq`.
struct Wire {
  std::uint8_t id;
  std::uint8_t reserved;
  std::uint16_t magic;
  std::int32_t source;
  std::uint32_t length;  // of what follows (the engine's header and payload)
  std::uint32_t seq;
};
static_assert(sizeof(Wire) == 16);
constexpr std::uint16_t kWireMagic = 0xfe71;

// The header of a received message of `size` bytes, if it is well formed for a job of `ranks`
// ranks received by `self`: magic, a length that matches, a source that is another rank.
bool parse_message(std::span<const std::byte> message, int ranks, int self, Wire* wire);

// What a rank publishes: its pid, node identity and wire protocol, then its endpoint's name. Two
// ranks with the same node identity (boot id and pid namespace) can watch each other's process.
struct AddressHeader {
  std::uint32_t magic;
  std::int32_t pid;
  std::array<char, 64> node;  // NUL-terminated
  // The endpoint's wire protocol (fi_ep_attr::protocol): endpoints of one provider that speak
  // different ones (tcp;ofi_rxm with and without pass-through) cannot talk to each other.
  std::uint32_t protocol;
};
constexpr std::uint32_t kAddressMagic = 0x0f1ad0e5;
constexpr std::size_t kMaxAddress = 1024;

std::vector<std::byte> encode_address(const AddressHeader& header, std::span<const std::byte> name);
// False for anything but a header with the magic, a terminated node identity and a name of
// 1 to kMaxAddress - sizeof(header) bytes (*name then points into `address`).
bool parse_address(std::span<const std::byte> address, AddressHeader* header,
                   std::span<const std::byte>* name);

// This process's node identity: "<boot id>/<pid namespace inode>".
std::array<char, 64> node_identity();

// FERRY_OFI_PROVIDER: "tcp;ofi_rxm" is allowed by "tcp", "ofi_rxm" or an empty list, refused by
// "^tcp"; with any name listed, only listed providers are allowed.
bool provider_allowed(const std::string& list, const char* name);

}  // namespace ferry::transport::ofi
