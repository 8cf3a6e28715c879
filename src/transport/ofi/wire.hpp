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

// Before every active message: who sent it, how long it is, its place in the sender's stream
// to us, and the sender's acknowledgement of our stream to it. Providers keep matching order
// (FI_ORDER_SAS) but neither completion order nor, while they connect, every message (order.hpp).
struct Wire {
  std::uint8_t id;
  std::uint8_t flags;  // kWire* below
  std::uint16_t magic;
  std::int32_t source;
  std::uint32_t length;  // of what follows (the engine's header and payload)
  std::uint32_t seq;
  std::uint32_t ack;    // the next seq the sender expects from the receiver
  std::uint32_t until;  // kWireResend: the end of the gap (the first message it holds)
};
static_assert(sizeof(Wire) == 24);
// The sender asks for an acknowledgement soon (it keeps copies of what is not acknowledged).
constexpr std::uint8_t kWireAckMe = 1;
// Not part of the stream (its seq means nothing): a request to send the kept messages from
// `ack` up to `until` again.
constexpr std::uint8_t kWireResend = 2;
// Not part of the stream: the sender gave up on the link (it lost one of our messages), so this
// rank fails it too rather than wait for answers that will not come.
constexpr std::uint8_t kWireBroken = 4;
constexpr std::uint8_t kWireKeepaliveId = 0xff;  // in the stream, never delivered to the engine
constexpr std::uint8_t kWireAckId = 0xfc;        // the same, sent when an ack was asked for
constexpr std::uint8_t kWireResendId = 0xfe;     // with kWireResend
constexpr std::uint8_t kWireBrokenId = 0xfd;     // with kWireBroken
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
