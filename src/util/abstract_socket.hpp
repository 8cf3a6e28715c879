// The address of an abstract UNIX socket (Linux): no file to leave behind, and it lives in the
// network namespace, so only processes of that namespace reach it.
#pragma once

#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <string>

namespace ferry::util {

inline sockaddr_un abstract_socket_address(const std::string& name, socklen_t* length) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::size_t n = std::min(name.size(), sizeof(address.sun_path) - 1);
  std::memcpy(address.sun_path + 1, name.data(), n);  // sun_path[0] == 0: abstract
  *length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return address;
}

}  // namespace ferry::util
