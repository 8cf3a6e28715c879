// One call of a node-area collective (node_collectives.cpp): what it is, in one word every
// member compares, and its waits. Included by node_collectives.cpp only.
#pragma once

#include <algorithm>
#include <string>

#include "coll/group.hpp"
#include "coll/node_area.hpp"
#include "coll/node_collectives.hpp"
#include "proto/engine.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace ferry::coll {
namespace node_call {

inline constexpr const char* kKindNames[] = {
    "?", "barrier", "broadcast", "allreduce", "allgather", "reduce_scatter", "reduce"};

// What a call is, in one word every member can compare: kind, type, op, root and the bytes per
// member (below 2^24: FERRY_COLL_NODE is at most 1 MiB; a streamed broadcast, which may be
// larger, gives its exact size beside the word).
inline constexpr std::size_t kStreamed = (std::size_t{1} << 24) - 1;
inline std::uint64_t signature(Kind kind, std::size_t bytes, DataType type, ReduceOp op, int root) {
  bytes = std::min<std::size_t>(bytes, kStreamed);  // a streamed broadcast's size goes apart
  return std::uint64_t{static_cast<std::uint8_t>(kind)} |
         (std::uint64_t{static_cast<std::uint8_t>(type)} << 8) |
         (std::uint64_t{static_cast<std::uint8_t>(op)} << 16) |
         (std::uint64_t{static_cast<std::uint16_t>(root)} << 24) | (std::uint64_t{bytes} << 40);
}

inline std::string describe(std::uint64_t s) {
  const auto kind = static_cast<Kind>(s & 0xff);
  const auto type = static_cast<DataType>((s >> 8) & 0xff);
  const auto op = static_cast<ReduceOp>((s >> 16) & 0xff);
  std::string text = (s & 0xff) < std::size(kKindNames) ? kKindNames[s & 0xff] : "?";
  text += (s >> 40) == kStreamed ? std::string(" of 16 MiB or more")
                                 : " of " + std::to_string(s >> 40) + " bytes";
  if (kind == Kind::kBroadcast) text += " from member " + std::to_string((s >> 24) & 0xffff);
  if (kind != Kind::kBarrier) text += std::string(" of ") + to_string(type);
  if (kind == Kind::kAllreduce) text += std::string(" (") + to_string(op) + ")";
  return text;
}

}  // namespace node_call

// One call through the area: its number, its deadline, and the waits.
class NodeCollectives::Call {
 public:
  static constexpr std::uint64_t kGenerations = NodeArea::kGenerations;

  Call(NodeCollectives& nodes, std::uint64_t signature)
      : nodes_(nodes),
        g_(nodes.g_),
        area_(*nodes.area_),
        signature_(signature),
        call_(++nodes.calls_),
        note_(g_.engine()->waiting().note(
            [](const void* call, std::uintptr_t) {
              const auto* c = static_cast<const Call*>(call);
              return c->what() + "; waiting for " + c->g_.peer_label(c->waiting_for_);
            },
            this)) {
    if (g_.timeout() > 0) deadline_ = util::deadline_after(g_.timeout());
  }

  // Waits until every member is done with the call that last used the line or slot that `bytes`
  // of data for this call go to.
  Status room(std::size_t bytes) {
    const std::uint64_t reuse = bytes <= NodeArea::kInlineBytes ? kGenerations : NodeArea::kSlots;
    if (call_ <= reuse) return Status();
    for (int m = 0; m < g_.size(); ++m) {
      std::uint64_t& seen = nodes_.done_seen_[static_cast<std::size_t>(m)];
      if (seen + reuse >= call_) continue;
      const NodeArea::Control& c = area_.control(m);
      for (;;) {
        // The newest call m posted is in the generation before ours, if m posted it.
        const std::uint64_t last =
            area_.generation(m, call_ - 1).call.load(std::memory_order_acquire);
        if (last > 0) seen = std::max(seen, last - 1);
        seen = std::max(seen, c.done.load(std::memory_order_acquire));
        if (seen + reuse >= call_) break;
        if (Status s = wait(m); !s.is_ok()) return s;
      }
    }
    return Status();
  }

  // Our data for this call, then the word that announces it (which also says we are done with
  // the calls before).
  void post(const void* data, std::size_t bytes) {
    NodeArea::Generation& generation = area_.generation(g_.rank(), call_);
    if (bytes > 0) std::memcpy(area_.data(g_.rank(), call_, bytes), data, bytes);
    generation.signature.store(signature_, std::memory_order_relaxed);
    generation.call.store(call_, std::memory_order_release);
    posted_ = true;
  }

  // Waits for member m's data of this call and checks that m made the same call.
  Status await(int m, const std::byte** data) {
    const NodeArea::Generation& generation = area_.generation(m, call_);
    std::uint64_t posted = 0;
    while ((posted = generation.call.load(std::memory_order_acquire)) < call_) {
      if (Status s = wait(m); !s.is_ok()) return s;
    }
    // What room() will need, for free.
    auto& seen = nodes_.done_seen_[static_cast<std::size_t>(m)];
    seen = std::max(seen, posted - 1);
    const std::uint64_t theirs = generation.signature.load(std::memory_order_relaxed);
    if (Status s = check_signature(m, theirs); !s.is_ok()) return s;
    *data = area_.data(m, call_, theirs >> 40);
    return Status();
  }

  // A call posted in pieces (NodeCollectives::pieces), so that the others copy or reduce one
  // piece while the next is written: the signature first, then each piece into our slot,
  // counted in our line's progress word; post(nullptr, 0) ends it.
  void begin_pieces() {
    area_.generation(g_.rank(), call_).signature.store(signature_, std::memory_order_relaxed);
  }
  void post_piece(const void* data, std::size_t bytes, std::size_t at, std::size_t length,
                  std::uint64_t k) {
    std::memcpy(area_.data(g_.rank(), call_, bytes) + at, static_cast<const std::byte*>(data) + at,
                length);
    set_stage(k + 1);
  }
  // Waits until member m has written piece k of its `bytes` (or has posted: a member that made
  // another call posts it, and the wait for the first piece reports the mismatch); *data: m's
  // slot.
  Status await_piece(int m, std::uint64_t k, std::size_t bytes, const std::byte** data) {
    const NodeArea::Generation& generation = area_.generation(m, call_);
    while (generation.progress.load(std::memory_order_acquire) < NodeArea::progress(call_, k + 1) &&
           generation.call.load(std::memory_order_acquire) < call_) {
      if (Status s = wait(m); !s.is_ok()) return s;
    }
    if (k == 0) {
      if (Status s = check_signature(m, generation.signature.load(std::memory_order_relaxed));
          !s.is_ok()) {
        return s;
      }
    }
    *data = area_.data(m, call_, bytes);
    return Status();
  }

  // room(), post() and, where `all`, await() of every member into `inputs` (ours too): the
  // reductions read everyone's data from the area.
  Status exchange(const void* data, std::size_t bytes, std::vector<const std::byte*>& inputs,
                  bool all = true) {
    Status s = room(bytes);
    if (s.is_ok()) post(data, bytes);
    for (int m = 0; all && m < g_.size() && s.is_ok(); ++m) {
      s = await(m, &inputs[static_cast<std::size_t>(m)]);
    }
    return s;
  }

  [[nodiscard]] Status check_signature(int m, std::uint64_t theirs) const {
    if (theirs == signature_) return Status();
    return Status(Code::kInvalidArgument,
                  what() + ": " + g_.peer_label(m) + " called " + node_call::describe(theirs) +
                      "; every member must make the same call (same counts, types, ops and "
                      "root)");
  }

  [[nodiscard]] std::uint64_t number() const { return call_; }

  // Our data's slot for this call (after post()).
  [[nodiscard]] std::byte* slot(std::size_t bytes) const {
    return area_.data(g_.rank(), call_, bytes);
  }

  // A split allreduce: our block of the result is in our slot; then wait for member m's.
  void announce_reduced() { set_stage(NodeArea::kReduced); }
  Status await_reduced(int m) { return await_stage(m, NodeArea::kReduced); }

  // Our progress within this call, and a wait for member m's (whose line for this call holds
  // nothing older: a stage of an earlier call is below every stage of this one).
  void set_stage(std::uint64_t stage) {
    area_.generation(g_.rank(), call_)
        .progress.store(NodeArea::progress(call_, stage), std::memory_order_release);
  }
  Status await_stage(int m, std::uint64_t stage) { return await_stage_of(m, call_, stage); }
  // await_stage, where member m posts this call too: one that posted another call (a different
  // signature: members that disagree on the root would otherwise wait for each other's stage)
  // ends the wait with the mismatch.
  Status await_stage_of_poster(int m, std::uint64_t stage) {
    const NodeArea::Generation& generation = area_.generation(m, call_);
    while (generation.progress.load(std::memory_order_acquire) < NodeArea::progress(call_, stage)) {
      if (generation.call.load(std::memory_order_acquire) >= call_) {
        if (Status s = check_signature(m, generation.signature.load(std::memory_order_relaxed));
            !s.is_ok()) {
          return s;
        }
      }
      if (Status s = wait(m); !s.is_ok()) return s;
    }
    return Status();
  }
  // Member m's stage in this call, where await_stage saw it reached.
  [[nodiscard]] std::uint64_t stage(int m) const {
    return area_.generation(m, call_).progress.load(std::memory_order_acquire) -
           NodeArea::progress(call_, 0);
  }

  // The same in member m's line of this call or of an earlier one (less than kGenerations calls
  // ago, so the line still holds it).
  Status await_stage_of(int m, std::uint64_t call, std::uint64_t stage) {
    const NodeArea::Generation& generation = area_.generation(m, call);
    while (generation.progress.load(std::memory_order_acquire) < NodeArea::progress(call, stage)) {
      if (Status s = wait(m); !s.is_ok()) return s;
    }
    return Status();
  }

  // A streamed broadcast's reader: waits until the root has written `stage` pieces, or posted
  // (await_piece's wait); the first also checks the root's exact size.
  Status await_root_stage(int root, std::uint64_t stage, std::size_t bytes) {
    const std::byte* data = nullptr;
    if (Status s = await_piece(root, stage - 1, bytes, &data); !s.is_ok()) return s;
    if (stage > 1) return Status();
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, area_.generation(root, call_).data, sizeof(theirs));
    if (theirs == bytes) return Status();
    return Status(Code::kInvalidArgument, what() + ": " + g_.peer_label(root) + " broadcasts " +
                                              std::to_string(theirs) +
                                              " bytes; every member must make the same call");
  }

  // A streamed broadcast's root: the signature and the exact size, before the first piece.
  void announce_stream(std::size_t bytes) {
    NodeArea::Generation& generation = area_.generation(g_.rank(), call_);
    const std::uint64_t exact = bytes;
    std::memcpy(generation.data, &exact, sizeof(exact));
    generation.signature.store(signature_, std::memory_order_relaxed);
  }

  // Done with this call: or, on a failure, our mark that we use the area no more.
  Status finish(Status status) {
    NodeArea::Control& c = area_.control(g_.rank());
    if (status.is_ok()) {
      if (!posted_) c.done.store(call_, std::memory_order_release);
      return status;
    }
    c.failed.store(1, std::memory_order_release);
    area_.left().store(1, std::memory_order_release);
    FERRY_LOG(kInfo, "collectives: the shared area is off for this communicator after: %s",
              status.message().c_str());
    nodes_.area_.reset();
    return status;
  }

 private:
  // One poll's wait for member m.
  Status wait(int m) {
    waiting_for_ = m;
    ++polls_;
    // The rest every 8 polls, so the word is seen sooner, unless waits yield at once: then
    // every poll, since the CPU may be the writer's (3 members on 2 CPUs: a small reduce's
    // iteration of OSU's loop 3.0 us instead of 5.1).
    if ((polls_ & step_mask_) != 0) return Status();
    if (g_.revoked()) return g_.revoked_status(what());
    if (area_.control(m).failed.load(std::memory_order_acquire) != 0) {
      // A member that stopped because our calls differ posted its call first: say that, as it
      // does, not that it stopped (a pair whose counts differ reports the mismatch on both).
      const NodeArea::Generation& theirs = area_.generation(m, call_);
      if (theirs.call.load(std::memory_order_acquire) == call_) {
        if (Status s = check_signature(m, theirs.signature.load(std::memory_order_relaxed));
            !s.is_ok()) {
          return s;
        }
      }
      const std::string stopped =
          g_.peer_label(m) + " failed a collective of this communicator and stopped using the area";
      if (const int gone = g_.first_departed(); gone >= 0 && gone != g_.rank()) {
        return Status(Code::kCanceled,
                      what() + ": " + g_.departed_label(gone) + " (" + stopped + ")");
      }
      return Status(Code::kPeerFailed, what() + ": " + stopped);
    }
    g_.engine()->waiting().spin_step(&idle_);
    if ((polls_ & 1023) != 0) return Status();
    if (const std::string* why = g_.engine()->liveness().failure(g_.member(m))) {
      return Status(Code::kPeerFailed, what() + ": " + g_.peer_label(m) + " is gone: " + *why);
    }
    if (g_.engine()->liveness().departed(g_.member(m))) {
      // What it wrote before it finalized is in the area before its notice came: the caller
      // looks at the word once more after the notice was seen, and only then is it missing.
      if (departed_ == m) {
        return Status(Code::kCanceled, what() + ": " + g_.departed_label(m));
      }
      departed_ = m;
      polls_ |= 1023;  // the next wait for it looks again
    }
    if (g_.timeout() > 0 && util::Clock::now() >= deadline_) {
      // Not arrived: the members that have not posted this call (else the one waited for,
      // which posted but has not gone on to the stage we wait for).
      std::string missing;
      for (int k = 0; k < g_.size(); ++k) {
        if (k != g_.rank() &&
            area_.generation(k, call_).call.load(std::memory_order_acquire) < call_) {
          missing += (missing.empty() ? "" : ", ") + g_.peer_label(k);
        }
      }
      return Status(Code::kTimeout,
                    what() + ": not complete after FERRY_TIMEOUT (" + std::to_string(g_.timeout()) +
                        " s); not arrived: " + (missing.empty() ? g_.peer_label(m) : missing));
    }
    return Status();
  }

  [[nodiscard]] std::string what() const {
    return node_call::describe(signature_) + " " + g_.call_label(g_.last_sequence()) + " (" +
           std::to_string(g_.size()) + " members, through the node's shared area)";
  }

  NodeCollectives& nodes_;
  Group& g_;
  NodeArea& area_;
  std::uint64_t signature_;
  std::uint64_t call_;
  std::chrono::steady_clock::time_point deadline_;
  int idle_ = 0;
  std::uint32_t polls_ = 0;
  std::uint32_t step_mask_ = g_.engine()->waiting().yields_at_once() ? 0 : 7;
  bool posted_ = false;
  int waiting_for_ = 0;  // the member the last wait was for
  int departed_ = -1;    // a member whose finalize notice a wait saw (then one more look)
  proto::Waiting::Note note_;
};

}  // namespace ferry::coll
