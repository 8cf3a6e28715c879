// The communicators revoked in this job, as far as this rank knows (Communicator::revoke).
//
// A revocation must reach every member even when the member that revoked dies while it tells
// them: each member that learns of one passes it on, once, to every other member it knows to be
// alive (a reliable broadcast; n^2 small messages, only when something already went wrong). The
// collective layer enrolls each communicator's members under its id, so that the revocation
// reaches exactly them; a notice for an id not enrolled yet (the member has not made that
// communicator yet) is kept and passed on when it is. Ids are never reused within a process,
// and members of one communicator share its id, so an id names one communicator here.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace ferry::proto {

class Engine;

class Revocations {
 public:
  explicit Revocations(Engine& engine) : engine_(engine) {}

  // Communicator `id` of this process has these members (job ranks, this one included).
  void enroll(std::uint32_t id, const std::vector<int>& members);
  // That communicator is gone here (a late notice for it is kept as for one not made yet).
  void leave(std::uint32_t id) { entries_.erase(id); }
  // Revokes `id` here (`by`: the job rank that revoked it) and tells its members.
  void revoke(std::uint32_t id, int by);
  // A kAmRevoke from `source`.
  void on_am(int source, std::span<const std::byte> data);

  // Changes whenever a revocation is learned, so that a communicator asks why() only then.
  [[nodiscard]] std::uint64_t epoch() const { return epoch_; }
  // Why `id` is revoked ("revoked by rank 3"), or null.
  [[nodiscard]] const std::string* why(std::uint32_t id) const;

 private:
  struct Entry {
    std::vector<int> members;  // empty until enrolled
    bool revoked = false;
    bool told = false;  // passed on to the members
    int by = -1;        // the rank that revoked it
    int source = -1;    // the rank that told us (before enrollment: checked against it)
    std::string why;
  };
  // Passes the revocation on to the members (once; only once they are known).
  void tell(std::uint32_t id, Entry& entry);

  Engine& engine_;
  std::map<std::uint32_t, Entry> entries_;
  std::uint64_t epoch_ = 0;
};

}  // namespace ferry::proto
