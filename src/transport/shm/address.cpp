// Encoding of the shm address (see address.hpp).
#include "transport/shm/address.hpp"

#include "util/wire.hpp"

namespace ferry::transport::shm {

std::vector<std::byte> Address::encode() const {
  util::Writer w;
  w.put_string(name);
  w.put(pid);
  w.put(fifo_size);
  w.put(bounce_count);
  w.put(bounce_size);
  w.put(cookie_address);
  w.put(cookie);
  return w.take();
}

Status Address::decode(std::span<const std::byte> bytes, Address* out) {
  util::Reader r(bytes);
  Address a;
  bool ok = r.get_string(&a.name, 255) && r.get(&a.pid) && r.get(&a.fifo_size) &&
            r.get(&a.bounce_count) && r.get(&a.bounce_size) && r.get(&a.cookie_address) &&
            r.get(&a.cookie);
  if (!ok || r.remaining() != 0 || a.name.empty() || a.name[0] != '/' ||
      a.name.find('/', 1) != std::string::npos || a.pid <= 0) {
    return Status(Code::kProtocolError,
                  "malformed shm address (" + std::to_string(bytes.size()) + " bytes)");
  }
  *out = std::move(a);
  return Status::ok();
}

}  // namespace ferry::transport::shm
