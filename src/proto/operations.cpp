// The operations in flight behind requests (see operation.hpp).
#include "proto/engine.hpp"
#include "proto/operation.hpp"

namespace ferry::proto {

Request Operations::failed(Status status) {
  std::uint32_t index = engine_.requests().allocate(RequestKind::kOperation);
  engine_.complete(index, std::move(status));
  return engine_.request(index);
}

Request Operations::start(std::unique_ptr<Operation> operation) {
  std::uint32_t index = engine_.requests().allocate(RequestKind::kOperation);
  Request request = engine_.request(index);
  Status status;
  advancing_ = true;
  const bool finished = operation->advance(&status);
  advancing_ = false;
  if (finished) {
    engine_.complete(index, std::move(status));
  } else {
    operations_.emplace_back(index, std::move(operation));
  }
  return request;
}

void Operations::abandon(std::uint32_t index) {
  for (auto& [at, operation] : operations_) {
    if (at == index) operation->abandon();
  }
}

int Operations::advance() {
  if (advancing_) return 0;
  advancing_ = true;
  int events = 0;
  for (std::size_t i = 0; i < operations_.size();) {
    Status status;
    if (operations_[i].second->advance(&status)) {
      const std::uint32_t index = operations_[i].first;
      operations_[i] = std::move(operations_.back());
      operations_.pop_back();
      engine_.complete(index, std::move(status));
      ++events;
    } else {
      ++i;
    }
  }
  advancing_ = false;
  return events;
}

}  // namespace ferry::proto
