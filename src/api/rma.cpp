// ferry::MemoryRegion, ferry::RemoteKey and the Context's one-sided calls over the engine.
#include <cstring>
#include <utility>

#include "proto/engine.hpp"
#include "util/copy.hpp"

namespace ferry {
namespace {

// The packed key: fixed size, little-endian fields as laid out here.
struct PackedKey {
  std::uint32_t magic;
  std::uint32_t version;
  std::int32_t rank;
  std::uint32_t fd_plus_one;  // allocated regions: the owner's descriptor + 1; 0: none
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t size;
  std::uint32_t guard_fd_plus_one;  // registered regions: the owner's guard table + 1; 0: none
  std::uint32_t slot_plus_one;      // and the region's slot in it + 1
  // kNative: the network transport may reach it by itself once the owner grants the key (the
  // grant says where and under which provider key).
  std::uint32_t flags;
  std::uint32_t reserved;
};
constexpr std::uint32_t kKeyMagic = 0x4b524546;  // "FERK"
constexpr std::uint32_t kKeyVersion = 4;
constexpr std::uint32_t kNative = 1;
constexpr std::uint32_t kReadOnly = 2;  // registered from memory the owner cannot write

}  // namespace

// The target of one access through `key`, as the engine takes it.
struct KeyAccess {
  static proto::RmaTarget target(const RemoteKey& key, std::uint64_t offset) {
    return proto::RmaTarget{key.rank_, key.id_,       key.secret_, key.size_,   offset,
                            key.fd_,   key.guard_fd_, key.slot_,   key.native_, key.read_only_};
  }
  // What the engine says of a region it registered, kept for its key.
  static void set(const proto::RegionAccess& access, MemoryRegion* region) {
    region->guard_fd_ = access.guard_fd;
    region->slot_ = access.slot;
    region->native_ = access.native;
    region->read_only_ = access.read_only;
  }
};

const char* to_string(AtomicOp op) noexcept {
  switch (op) {
    case AtomicOp::kAdd:
      return "add";
    case AtomicOp::kSwap:
      return "swap";
    case AtomicOp::kCompareSwap:
      return "compare-swap";
    case AtomicOp::kAnd:
      return "and";
    case AtomicOp::kOr:
      return "or";
    case AtomicOp::kXor:
      return "xor";
  }
  return "unknown";
}

// ---- MemoryRegion ----

MemoryRegion::MemoryRegion(MemoryRegion&& other) noexcept
    : engine_(std::move(other.engine_)),
      id_(std::exchange(other.id_, 0)),
      secret_(other.secret_),
      address_(other.address_),
      size_(other.size_),
      rank_(other.rank_),
      fd_(other.fd_),
      guard_fd_(other.guard_fd_),
      slot_(other.slot_),
      native_(other.native_),
      read_only_(other.read_only_) {}

MemoryRegion& MemoryRegion::operator=(MemoryRegion&& other) noexcept {
  if (this != &other) {
    (void)deregister();
    engine_ = std::move(other.engine_);
    id_ = std::exchange(other.id_, 0);
    secret_ = other.secret_;
    address_ = other.address_;
    size_ = other.size_;
    rank_ = other.rank_;
    fd_ = other.fd_;
    guard_fd_ = other.guard_fd_;
    slot_ = other.slot_;
    native_ = other.native_;
    read_only_ = other.read_only_;
  }
  return *this;
}

MemoryRegion::~MemoryRegion() { (void)deregister(); }

std::vector<std::byte> MemoryRegion::remote_key() const {
  const PackedKey key{kKeyMagic,
                      kKeyVersion,
                      rank_,
                      static_cast<std::uint32_t>(fd_ + 1),
                      id_,
                      secret_,
                      size_,
                      static_cast<std::uint32_t>(guard_fd_ + 1),
                      static_cast<std::uint32_t>(slot_ + 1),
                      (native_ ? kNative : 0u) | (read_only_ ? kReadOnly : 0u),
                      0};
  std::vector<std::byte> out(sizeof(key));
  std::memcpy(out.data(), &key, sizeof(key));
  return out;
}

Status MemoryRegion::deregister() {
  if (id_ == 0) return Status::ok();
  const std::uint64_t id = std::exchange(id_, 0);
  if (engine_ == nullptr || *engine_ == nullptr) return Status::ok();  // the Context is gone
  proto::Engine* engine = *engine_;
  auto entry = engine->enter();
  return engine->rma().deregister(id);
}

// ---- RemoteKey ----

Status RemoteKey::unpack(std::span<const std::byte> packed, RemoteKey* out) {
  if (out == nullptr) return Status(Code::kInvalidArgument, "RemoteKey::unpack: null key to fill");
  PackedKey key;
  if (packed.size() != sizeof(key)) {
    return Status(Code::kInvalidArgument, "remote key of " + std::to_string(packed.size()) +
                                              " bytes; a packed key has " +
                                              std::to_string(sizeof(key)));
  }
  std::memcpy(&key, packed.data(), sizeof(key));
  if (key.magic != kKeyMagic || key.version != kKeyVersion) {
    return Status(Code::kInvalidArgument, "not a ferry remote key (or one of another version)");
  }
  if (key.rank < 0 || key.region == 0 || key.size == 0 || key.fd_plus_one > INT32_MAX ||
      key.guard_fd_plus_one > INT32_MAX || key.slot_plus_one > INT32_MAX ||
      (key.flags & ~(kNative | kReadOnly)) != 0) {
    return Status(Code::kInvalidArgument, "corrupt remote key (rank, region, size or slot)");
  }
  out->rank_ = key.rank;
  out->id_ = key.region;
  out->secret_ = key.secret;
  out->size_ = key.size;
  out->fd_ = static_cast<int>(key.fd_plus_one) - 1;
  out->guard_fd_ = static_cast<int>(key.guard_fd_plus_one) - 1;
  out->slot_ = static_cast<int>(key.slot_plus_one) - 1;
  out->native_ = (key.flags & kNative) != 0;
  out->read_only_ = (key.flags & kReadOnly) != 0;
  return Status::ok();
}

// ---- Context ----

Status Context::register_memory(void* address, std::size_t bytes, MemoryRegion* region) {
  if (region == nullptr) return Status(Code::kInvalidArgument, "register_memory: null region");
  auto entry = engine_->enter();
  std::uint64_t id = 0;
  std::uint64_t secret = 0;
  proto::RegionAccess access;
  Status status = engine_->rma().register_memory(address, bytes, &id, &secret, &access);
  if (status) {
    *region = MemoryRegion(engine_->handle(), id, secret, address, bytes, rank(), -1);
    KeyAccess::set(access, region);
  }
  return status;
}

Status Context::allocate_memory(std::size_t bytes, MemoryRegion* region) {
  if (region == nullptr) return Status(Code::kInvalidArgument, "allocate_memory: null region");
  auto entry = engine_->enter();
  std::uint64_t id = 0;
  std::uint64_t secret = 0;
  void* address = nullptr;
  int fd = -1;
  proto::RegionAccess access;
  Status status = engine_->rma().allocate(bytes, &address, &id, &secret, &fd, &access);
  if (status) {
    *region = MemoryRegion(engine_->handle(), id, secret, address, bytes, rank(), fd);
    KeyAccess::set(access, region);
  }
  return status;
}

Request Context::iput(const void* local, std::size_t bytes, const RemoteKey& key,
                      std::uint64_t offset) {
  auto entry = engine_->enter();
  proto::Engine* engine = engine_.get();
  auto is_device = [engine](const void* p) {
    return cuda::Cuda::device_of(engine->cuda(), p) >= 0;
  };
  if (std::byte* destination = engine->rma().direct_again(
          key.rank_, key.id_, key.secret_, key.size_, offset, local, bytes, is_device)) {
    util::copy_large(destination, local, bytes);
    return Request(engine, Request::kDone);
  }
  return engine->rma().iput(local, bytes, KeyAccess::target(key, offset));
}

Request Context::iget(void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset) {
  auto entry = engine_->enter();
  proto::Engine* engine = engine_.get();
  auto is_device = [engine](const void* p) {
    return cuda::Cuda::device_of(engine->cuda(), p) >= 0;
  };
  if (const std::byte* source = engine->rma().direct_again(
          key.rank_, key.id_, key.secret_, key.size_, offset, local, bytes, is_device)) {
    util::copy(local, source, bytes);
    return Request(engine, Request::kDone);
  }
  return engine->rma().iget(local, bytes, KeyAccess::target(key, offset));
}

Request Context::iatomic(AtomicOp op, std::size_t width, const RemoteKey& key, std::uint64_t offset,
                         std::uint64_t operand, void* result, std::uint64_t compare) {
  auto entry = engine_->enter();
  if (engine_->rma().atomic_again(op, width, key.rank_, key.id_, key.secret_, key.size_, offset,
                                  operand, result, compare)) {
    return Request(engine_.get(), Request::kDone);
  }
  return engine_->rma().iatomic(op, width, KeyAccess::target(key, offset), operand, result,
                                compare);
}

Status Context::flush(int rank) {
  auto entry = engine_->enter();
  if (rank < 0) {
    return Status(Code::kInvalidArgument, "flush: rank " + std::to_string(rank) +
                                              " is not in the job (flush_all for every rank)");
  }
  return engine_->rma().flush(rank);
}

Status Context::flush_all() {
  auto entry = engine_->enter();
  return engine_->rma().flush(-1);
}

}  // namespace ferry
