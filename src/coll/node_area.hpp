// A communicator's area in shared memory, for communicators whose members all share a node: small
// blocking collectives go through it with no messages (NodeCollectives, node_collectives.cpp).
//
// Every member has a control line, kGenerations lines, one per generation (the call's number
// modulo kGenerations), and kSlots slots for data that does not fit in a line (the call's number
// modulo kSlots). A member writes its data for call s into its line of generation s (or its slot
// of call s), then raises the line's `call` word to s; readers wait for `call` >= s and read: for
// small data one cache line moves. Before writing a line or slot again (call s), a member waits
// until every member is done with the call that used it last (s - kGenerations, s - kSlots): its
// `done` word says so, or the `call` word of a generation it posted (a member posts call t only
// after it finished every call before t), so members that post in every call never write `done`,
// and a broadcast's root runs up to kGenerations - 1 calls ahead of its readers. A member that
// fails a call raises its `failed` word for good (what it posted stays), so the others stop
// waiting for it, and the area's `left` word, which every member reads before each call.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "util/fd.hpp"

namespace ferry::coll {

class NodeArea {
 public:
  static constexpr std::uint64_t kFailed = std::uint64_t{1} << 63;

  static constexpr int kGenerations = 64;
  static constexpr int kSlots = 4;
  static constexpr std::size_t kInlineBytes = 40;
  // Broadcasts larger than a slot stream through a ring of kStreamPieces pieces of
  // kStreamPiece bytes that every member can read (NodeCollectives::stream_broadcast).
  static constexpr std::size_t kStreamPiece = 256 << 10;
  static constexpr std::uint64_t kStreamPieces = 8;
  // Generation::progress is (call << kStageBits) + a stage below kReduced.
  static constexpr int kStageBits = 24;
  static constexpr std::uint64_t kReduced = (std::uint64_t{1} << kStageBits) - 1;
  static constexpr std::uint64_t progress(std::uint64_t call, std::uint64_t stage) {
    return (call << kStageBits) + stage;
  }
  struct alignas(64) Control {
    std::atomic<std::uint64_t> done;    // the last call finished without posting
    std::atomic<std::uint64_t> failed;  // 1: this member stopped using the area
    std::atomic<std::int64_t> pid;      // its process (a broadcast's readers read it by CMA)
  };
  struct alignas(64) Generation {
    std::atomic<std::uint64_t> call;  // the call whose data this generation holds
    // What the call was (Group's signature of it), written before `call`; readers compare it
    // with their own.
    std::atomic<std::uint64_t> signature;
    // How far this member is within a call, progress(call, stage), so a value left by an older
    // call is below every value of a newer one: in a streamed broadcast the pieces the root has
    // written or a reader has copied out; in an allreduce split among the members kReduced once
    // this member's block of the result is in its slot (NodeCollectives::stream_broadcast,
    // allreduce).
    std::atomic<std::uint64_t> progress;
    unsigned char data[kInlineBytes];  // the data when it fits
  };
  static_assert(sizeof(Control) == 64 && sizeof(Generation) == 64);

  // Member 0 creates the area under `name` (in /dev/shm), the others attach to it. Throws
  // ferry::Error naming the file and the reason (a full /dev/shm, a file of the wrong size or
  // header).
  static std::unique_ptr<NodeArea> create(const std::string& name, int members,
                                          std::size_t slot_bytes);
  static std::unique_ptr<NodeArea> attach(const std::string& name, int members,
                                          std::size_t slot_bytes);
  ~NodeArea();
  NodeArea(const NodeArea&) = delete;
  NodeArea& operator=(const NodeArea&) = delete;

  // Removes the name once every member has mapped the area (the mappings stay).
  void unlink();

  [[nodiscard]] Control& control(int member) const { return controls_[member]; }
  // Nonzero once a member has left the area.
  [[nodiscard]] std::atomic<std::uint64_t>& left() const;
  [[nodiscard]] Generation& generation(int member, std::uint64_t call) const {
    return generations_[static_cast<std::size_t>(member) * kGenerations + call % kGenerations];
  }
  // Where `member` puts `bytes` of data for `call`.
  [[nodiscard]] std::byte* data(int member, std::uint64_t call, std::size_t bytes) const {
    if (bytes <= kInlineBytes) return reinterpret_cast<std::byte*>(generation(member, call).data);
    return slots_ + (static_cast<std::size_t>(member) * kSlots + call % kSlots) * slot_bytes_;
  }
  [[nodiscard]] std::size_t slot_bytes() const { return slot_bytes_; }
  // Piece k of a streamed broadcast in pieces of `piece` bytes (at most kStreamPiece).
  [[nodiscard]] std::byte* stream_piece(std::uint64_t k, std::size_t piece) const {
    return stream_ + (k % kStreamPieces) * piece;
  }

 private:
  NodeArea(std::string name, util::Mapping mapping, int members, std::size_t slot_bytes,
           bool owner);
  static std::size_t total_bytes(int members, std::size_t slot_bytes);

  std::string name_;
  util::Mapping mapping_;
  std::size_t slot_bytes_;
  bool owner_;  // the name is ours to remove
  Control* controls_;
  Generation* generations_;
  std::byte* slots_;
  std::byte* stream_;
};

}  // namespace ferry::coll
