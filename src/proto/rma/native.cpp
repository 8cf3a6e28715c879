// Native one-sided access by grant (see native.hpp).
#include "proto/rma/native.hpp"

#include <algorithm>

#include "mem/host_access.hpp"
#include "proto/engine.hpp"
#include "proto/rma/regions.hpp"
#include "util/log.hpp"

namespace ferry::proto::rma {

bool NativeAccess::start(std::uint32_t index, const RmaTarget& target, void* local,
                         std::size_t bytes, bool put, bool local_device) {
  if (!target.native || local_device) return false;
  const Link& link = engine_.links().link(target.rank);
  std::string& refused = refused_[static_cast<std::size_t>(target.rank)];
  if (link.writes == nullptr || !refused.empty()) return false;
  auto [entry, first] = grants_.try_emplace({target.rank, target.region});
  Grant& grant = entry->second;
  if (!first && grant.state == Grant::State::kRefused && grant.secret != target.secret) {
    grant = Grant{};  // another key after a refused one (forged first, then the real one)
    first = true;
  }
  if (first) {
    // This access goes by messages; the owner's answer decides the next ones.
    grant.secret = target.secret;
    engine_.links().send_control(target.rank, kAmNativeAsk,
                                 as_bytes(NativeAskHeader{target.region, target.secret}));
    return false;
  }
  // Another key for the region (forged, or the region's slot came back) goes by messages, as
  // does an access outside what the owner granted.
  if (grant.state != Grant::State::kGranted || grant.secret != target.secret ||
      target.offset > grant.size || bytes > grant.size - target.offset) {
    return false;
  }
  const transport::Endpoint::RemoteRegion remote{grant.region.address + target.offset,
                                                 grant.region.key};
  const std::uint64_t cookie = engine_.requests().wire_id(index);
  Status started = put ? link.writes->write_direct(local, bytes, remote, cookie)
                       : link.reads->read_direct(local, bytes, remote, cookie);
  if (!started) {
    if (started.code() == Code::kPeerFailed) {
      engine_.complete(index, std::move(started));
      return true;
    }
    refused = started.message();
    FERRY_LOG(kWarn, "%s: a one-sided %s to rank %d failed to start (%s); by messages from now on",
              link.transport.c_str(), put ? "write" : "read", target.rank,
              started.to_string().c_str());
    return false;
  }
  ++grant.in_flight;
  RequestSlot& slot = engine_.requests()[index];
  slot.transfer.direct = true;
  slot.rma.native = true;
  slot.rma.region = target.region;
  slot.message_size = bytes;
  if (!put) slot.info = {target.rank, 0, bytes};  // (a peer's failure finds gets by their source)
  ++slot.transfer.device_ops;                     // the buffer is the transport's until on_direct
  return true;
}

void NativeAccess::ended(int rank, std::uint64_t region) {
  auto entry = grants_.find({rank, region});
  if (entry == grants_.end() || entry->second.in_flight == 0) return;
  if (--entry->second.in_flight > 0 || entry->second.state != Grant::State::kRevoked) return;
  grants_.erase(entry);
  engine_.links().send_control(rank, kAmNativeRevoked, as_bytes(NativeRevokeHeader{region}));
}

NativeAccess::Registration* NativeAccess::register_region(std::uint64_t id) {
  const Region* region = regions_.find(id);
  if (transport_ == nullptr || region == nullptr || region->device >= 0) return nullptr;
  Registration& registration = registrations_[id];
  if (registration.handle != nullptr) return &registration;
  if (registration.failed) return nullptr;
  // The secret is the key asked for where the provider takes one: a key forged or gone stale is
  // then also the provider's to refuse.
  Status status =
      transport_->register_region(region->base, region->size, region->secret, !region->read_only,
                                  &registration.remote, &registration.handle);
  if (!status) {
    registration.failed = true;
    FERRY_LOG(kInfo, "region %llu is reached by other nodes through its owner: %s",
              static_cast<unsigned long long>(id), status.message().c_str());
    return nullptr;
  }
  return &registration;
}

Status NativeAccess::revoke(std::uint64_t id) {
  auto registration = registrations_.find(id);
  if (registration == registrations_.end()) return Status::ok();
  std::vector<int> ranks = std::move(registration->second.ranks);
  std::erase_if(ranks, [&](int rank) { return engine_.links().link(rank).failed; });
  Status status;
  if (!ranks.empty()) {
    for (int rank : ranks) {
      engine_.links().send_control(rank, kAmNativeRevoke, as_bytes(NativeRevokeHeader{id}));
    }
    revoking_[id] = std::move(ranks);
    const bool answered = engine_.waiting().wait_until([&] {
      // Waiting lets other threads in: look the entry up again.
      std::vector<int>& waiting = revoking_[id];
      std::erase_if(waiting, [&](int rank) { return engine_.links().link(rank).failed; });
      return waiting.empty();
    });
    if (!answered) {
      status = Status(Code::kTimeout,
                      "deregister: rank " + std::to_string(revoking_[id].front()) +
                          " has not confirmed after FERRY_TIMEOUT that its network accesses to "
                          "the region ended (it has not called ferry since); the registration is "
                          "closed anyway, and an access still arriving is refused by the provider");
    }
    revoking_.erase(id);
  }
  // Waiting lets other threads in: look the registration up again.
  registration = registrations_.find(id);
  if (registration != registrations_.end()) {
    if (registration->second.handle != nullptr) {
      transport_->release_region(registration->second.handle);
    }
    registrations_.erase(registration);
  }
  return status;
}

void NativeAccess::on_ask(int source, std::span<const std::byte> data) {
  NativeAskHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_ASK header");
  NativeGrantHeader grant{header.region, header.secret, 0, 0, 0, kRmaOk, 0};
  const Region* region = regions_.find(header.region);
  Registration* registration = nullptr;
  // A region whose grants are being revoked (deregister) gives no more.
  if (region == nullptr || revoking_.contains(header.region)) {
    grant.code = kRmaNoRegion;
  } else if (region->secret != header.secret) {
    grant.code = kRmaBadKey;
  } else if (region->user_host && !mem::still_mapped(region->base, region->size)) {
    grant.code = kRmaUnmapped;  // the provider would write into whatever comes there next
  } else if ((registration = register_region(header.region)) == nullptr) {
    grant.code = kRmaNotNative;
  } else {
    grant.address = registration->remote.address;
    grant.key = registration->remote.key;
    grant.size = region->size;
    if (std::find(registration->ranks.begin(), registration->ranks.end(), source) ==
        registration->ranks.end()) {
      registration->ranks.push_back(source);
    }
  }
  engine_.links().send_control(source, kAmNativeGrant, as_bytes(grant));
}

void NativeAccess::on_grant(int source, std::span<const std::byte> data) {
  NativeGrantHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_GRANT header");
  auto entry = grants_.find({source, header.region});
  if (entry == grants_.end() || entry->second.state != Grant::State::kAsked ||
      entry->second.secret != header.secret) {
    return protocol_error(source, "NATIVE_GRANT for no region asked about");
  }
  Grant& grant = entry->second;
  if (header.code != kRmaOk) {
    // Accesses through this key keep going by messages, which report what is wrong.
    grant.state = Grant::State::kRefused;
    FERRY_LOG(kDebug, "native access to region %llu of rank %d refused: %s",
              static_cast<unsigned long long>(header.region), source,
              refusal_text(header.code, source).c_str());
    return;
  }
  grant.state = Grant::State::kGranted;
  grant.region = {header.address, header.key};
  grant.size = header.size;
}

void NativeAccess::on_revoke(int source, std::span<const std::byte> data) {
  NativeRevokeHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_REVOKE header");
  auto entry = grants_.find({source, header.region});
  if (entry != grants_.end()) {
    entry->second.state = Grant::State::kRevoked;
    if (entry->second.in_flight > 0) return;  // answered by ended()
    grants_.erase(entry);
  }
  engine_.links().send_control(source, kAmNativeRevoked, as_bytes(header));
}

void NativeAccess::on_revoked(int source, std::span<const std::byte> data) {
  NativeRevokeHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_REVOKED header");
  auto waiting = revoking_.find(header.region);
  if (waiting == revoking_.end()) {
    return protocol_error(source, "NATIVE_REVOKED for no region being deregistered");
  }
  std::erase(waiting->second, source);
}

void NativeAccess::region_gone(int owner, std::uint64_t region) {
  auto entry = grants_.find({owner, region});
  if (entry != grants_.end() && entry->second.state == Grant::State::kRefused) grants_.erase(entry);
}

void NativeAccess::peer_failed(int rank) {
  std::erase_if(grants_, [rank](const auto& entry) { return entry.first.first == rank; });
}

std::string NativeAccess::describe(int rank) const {
  if (!refused_[static_cast<std::size_t>(rank)].empty()) {
    return "its regions by messages (a native access failed to start: " +
           refused_[static_cast<std::size_t>(rank)] + ")";
  }
  auto count = [&](Grant::State state) {
    return std::count_if(grants_.begin(), grants_.end(), [&](const auto& entry) {
      return entry.first.first == rank && entry.second.state == state;
    });
  };
  const auto open = std::count_if(registrations_.begin(), registrations_.end(),
                                  [](const auto& entry) { return entry.second.handle != nullptr; });
  return "native access granted to " + std::to_string(count(Grant::State::kGranted)) +
         " of its regions and refused for " + std::to_string(count(Grant::State::kRefused)) +
         "; this rank's regions registered for it: " + std::to_string(open);
}

void NativeAccess::clear() {
  for (auto& [id, registration] : registrations_) {
    if (registration.handle != nullptr) transport_->release_region(registration.handle);
  }
  registrations_.clear();
  grants_.clear();
}

}  // namespace ferry::proto::rma
