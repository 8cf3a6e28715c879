// Communicator state, argument checks and split (see group.hpp); the algorithms are in
// algorithms.cpp.
#include "coll/group.hpp"

#include <algorithm>
#include <limits>
#include <tuple>

#include "coll/reduce.hpp"
#include "coll/schedule.hpp"
#include "proto/engine.hpp"

namespace ferry::coll {

struct Group::Ids {
  std::uint32_t next = 1;  // 0 is the world
};

Group::Group(proto::Engine* engine, std::vector<int> members, int rank, std::uint32_t id,
             std::shared_ptr<Ids> ids)
    : engine_(engine), members_(std::move(members)), rank_(rank), id_(id), ids_(std::move(ids)) {
  const util::Config& config = engine_->config();
  small_ = config.get_size(util::Var::kCollSmall);
  allreduce_ = static_cast<int>(config.get_int(util::Var::kCollAllreduce));
  broadcast_ = static_cast<int>(config.get_int(util::Var::kCollBroadcast));
  reduce_ = static_cast<int>(config.get_int(util::Var::kCollReduce));
  allgather_ = static_cast<int>(config.get_int(util::Var::kCollAllgather));
  chunk_ = config.get_size(util::Var::kCollChunk);
  timeout_ = engine_->timeout();
}

std::shared_ptr<Group> Group::world(proto::Engine* engine) {
  std::vector<int> members(static_cast<std::size_t>(engine->size()));
  for (std::size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  return std::shared_ptr<Group>(
      new Group(engine, std::move(members), engine->rank(), 0, std::make_shared<Ids>()));
}

Request Group::start_schedule(std::unique_ptr<Schedule> schedule) {
  return engine_->start(std::move(schedule));
}

Request Group::failed(Status status) { return engine_->failed(std::move(status)); }

Status Group::check(const char* name, std::initializer_list<const void*> buffers,
                    std::size_t elements, DataType type, int root) {
  auto bad = [&](Code code, const std::string& why) {
    return Status(code, std::string(name) + ": " + why);
  };
  const std::size_t element = size_of(type);
  if (element == 0) {
    return bad(Code::kInvalidArgument,
               "unknown data type " + std::to_string(static_cast<int>(type)));
  }
  if (elements > std::numeric_limits<std::size_t>::max() / element / 2) {
    return bad(Code::kInvalidArgument, std::to_string(elements) + " elements is too many");
  }
  if (root < 0 || root >= size()) {
    return bad(Code::kInvalidArgument,
               "root " + std::to_string(root) + " is not in [0, " + std::to_string(size()) + ")");
  }
  if (elements == 0) return Status();
  for (const void* buffer : buffers) {
    if (buffer == nullptr) {
      return bad(Code::kInvalidArgument,
                 "a null buffer with " + std::to_string(elements) + " elements");
    }
    if (engine_->device_memory(buffer)) {
      return bad(Code::kUnsupported,
                 "collectives take host buffers only for now; this one is CUDA device memory "
                 "(copy it to host memory, or use point-to-point, which moves device buffers)");
    }
  }
  return Status();
}

std::shared_ptr<Group> Group::split(int color, int key) {
  // Every member learns every (color, key, next free id); a new communicator takes the largest
  // next free id of its members, which none of them uses yet.
  std::vector<std::int64_t> mine = {color, key, ids_->next};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(size()));
  Status status =
      run([&](Plan& p) { return allgather(p, mine.data(), all.data(), 3, DataType::kInt64); });
  if (!status.is_ok()) {
    throw Error(status.code(), "split: exchanging colors and keys: " + status.message());
  }
  if (color == Communicator::kUndefined) return nullptr;
  std::vector<std::tuple<std::int64_t, int>> order;  // (key, member) for members of our color
  std::int64_t id = 0;
  for (int m = 0; m < size(); ++m) {
    const std::int64_t* entry = &all[3 * static_cast<std::size_t>(m)];
    if (entry[0] != color) continue;
    order.emplace_back(entry[1], m);
    id = std::max(id, entry[2]);
  }
  if (id >= (std::int64_t{1} << kIdBits)) {
    throw Error(Code::kNoResources, "split: this process has made " + std::to_string(id) +
                                        " communicators, the most a job may have");
  }
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  int rank = -1;
  for (const auto& [k, m] : order) {
    if (m == rank_) rank = static_cast<int>(members.size());
    members.push_back(member(m));
  }
  ids_->next = static_cast<std::uint32_t>(id) + 1;
  return std::shared_ptr<Group>(
      new Group(engine_, std::move(members), rank, static_cast<std::uint32_t>(id), ids_));
}

}  // namespace ferry::coll
