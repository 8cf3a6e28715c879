// The shared-memory area of a communicator on one node: creation (a full /dev/shm is an error
// now, not a SIGBUS later) and an attach that checks the file against what every member expects.
#include "coll/node_area.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "ferry/status.hpp"

namespace ferry::coll {
namespace {

constexpr std::uint64_t kMagic = 0x46455252595f434fULL;  // "FERRY_CO"
constexpr std::uint32_t kVersion = 1;

struct alignas(64) Header {
  std::atomic<std::uint64_t> magic;  // written last
  std::uint32_t version;
  std::uint32_t members;
  std::uint64_t slot_bytes;
  std::uint64_t total_bytes;
  std::atomic<std::uint64_t> left;  // NodeArea::left()
};

[[noreturn]] void fail(Code code, const std::string& name, const std::string& what, int err) {
  throw Error(code, "collective area /dev/shm" + name + ": " + what + ": " + std::strerror(err));
}

}  // namespace

std::size_t NodeArea::total_bytes(int members, std::size_t slot_bytes) {
  const auto n = static_cast<std::size_t>(members);
  return sizeof(Header) +
         n * (sizeof(Control) + kGenerations * sizeof(Generation) + kSlots * slot_bytes) +
         kStreamPieces * kStreamPiece;
}

NodeArea::NodeArea(std::string name, util::Mapping mapping, int members, std::size_t slot_bytes,
                   bool owner)
    : name_(std::move(name)),
      mapping_(std::move(mapping)),
      slot_bytes_(slot_bytes),
      owner_(owner),
      controls_(reinterpret_cast<Control*>(mapping_.bytes() + sizeof(Header))),
      generations_(reinterpret_cast<Generation*>(controls_ + members)),
      slots_(reinterpret_cast<std::byte*>(generations_ + members * kGenerations)),
      stream_(slots_ + static_cast<std::size_t>(members) * kSlots * slot_bytes) {}

std::unique_ptr<NodeArea> NodeArea::create(const std::string& name, int members,
                                           std::size_t slot_bytes) {
  slot_bytes = (slot_bytes + 63) / 64 * 64;
  const std::size_t total = total_bytes(members, slot_bytes);
  ::shm_unlink(name.c_str());  // an area left by an earlier process of this rank and job
  util::Fd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd.valid()) fail(Code::kIoError, name, "shm_open failed", errno);
  auto unlink_and_fail = [&](Code code, const std::string& what, int err) {
    ::shm_unlink(name.c_str());
    fail(code, name, what, err);
  };
  if (::ftruncate(fd.get(), static_cast<off_t>(total)) != 0) {
    unlink_and_fail(Code::kNoResources, "ftruncate to " + std::to_string(total) + " bytes failed",
                    errno);
  }
  if (int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(total)); err != 0) {
    unlink_and_fail(
        err == ENOSPC ? Code::kNoResources : Code::kIoError,
        "reserving " + std::to_string(total) + " bytes failed (is /dev/shm full? `df -h /dev/shm`)",
        err);
  }
  void* address = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) unlink_and_fail(Code::kNoResources, "mmap failed", errno);
  util::Mapping mapping(address, total);
  // The file is zeroed: every word starts at 0 (no call posted or done yet).
  auto* header = new (address) Header{};
  header->members = static_cast<std::uint32_t>(members);
  header->slot_bytes = slot_bytes;
  header->total_bytes = total;
  header->version = kVersion;
  header->magic.store(kMagic, std::memory_order_release);
  return std::unique_ptr<NodeArea>(
      new NodeArea(name, std::move(mapping), members, slot_bytes, true));
}

std::unique_ptr<NodeArea> NodeArea::attach(const std::string& name, int members,
                                           std::size_t slot_bytes) {
  slot_bytes = (slot_bytes + 63) / 64 * 64;
  const std::size_t total = total_bytes(members, slot_bytes);
  util::Fd fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (!fd.valid()) fail(Code::kIoError, name, "opening member 0's area failed", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(Code::kIoError, name, "fstat failed", errno);
  if (static_cast<std::size_t>(st.st_size) != total) {
    throw Error(Code::kProtocolError, "collective area /dev/shm" + name + " has " +
                                          std::to_string(st.st_size) + " bytes, expected " +
                                          std::to_string(total) +
                                          " (FERRY_COLL_NODE differs between members?)");
  }
  void* address = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) fail(Code::kNoResources, name, "mmap failed", errno);
  util::Mapping mapping(address, total);
  const auto* header = static_cast<const Header*>(address);
  if (header->magic.load(std::memory_order_acquire) != kMagic || header->version != kVersion ||
      header->members != static_cast<std::uint32_t>(members) || header->slot_bytes != slot_bytes ||
      header->total_bytes != total) {
    throw Error(Code::kProtocolError, "collective area /dev/shm" + name +
                                          " does not hold the header member 0 wrote (another "
                                          "ferry version, or a corrupt file)");
  }
  return std::unique_ptr<NodeArea>(
      new NodeArea(name, std::move(mapping), members, slot_bytes, false));
}

void NodeArea::unlink() {
  if (owner_) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

NodeArea::~NodeArea() { unlink(); }

std::atomic<std::uint64_t>& NodeArea::left() const {
  return reinterpret_cast<Header*>(mapping_.bytes())->left;
}

}  // namespace ferry::coll
