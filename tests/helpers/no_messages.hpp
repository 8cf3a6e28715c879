// A transport's handler for tests that open a transport and send it nothing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "transport/transport.hpp"

namespace ferry::test {

class NoMessages final : public transport::AmHandler {
 public:
  void on_am(std::uint8_t /*id*/, int /*source*/, std::span<const std::byte> /*data*/) override {}
};

}  // namespace ferry::test
