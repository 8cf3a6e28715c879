// Shared-memory segments: creation with clear errors for a full /dev/shm, validated attach.
#include "transport/shm/segment.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <new>

#include "ferry/status.hpp"

namespace ferry::transport::shm {
namespace {

std::size_t align_up(std::size_t value, std::size_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}

[[noreturn]] void fail(Code code, const std::string& name, const std::string& what, int err) {
  throw Error(code, "shm segment /dev/shm" + name + ": " + what + ": " + std::strerror(err));
}

}  // namespace

std::string Layout::compute(std::uint32_t fifo_size, std::uint32_t bounce_count,
                            std::uint32_t bounce_size, Layout* out) {
  if (fifo_size < 2 || fifo_size > kMaxFifoSize || (fifo_size & (fifo_size - 1)) != 0) {
    return "FIFO size " + std::to_string(fifo_size) + " is not a power of two in [2, 65536]";
  }
  if (bounce_count == 0 || bounce_count > kMaxBounceCount) {
    return "bounce count " + std::to_string(bounce_count) + " is not in [1, 65536]";
  }
  if (bounce_size < 64 || bounce_size > kMaxBounceSize || bounce_size % 64 != 0) {
    return "bounce size " + std::to_string(bounce_size) +
           " is not a multiple of 64 in [64, 16 MiB]";
  }
  Layout layout;
  layout.fifo_size = fifo_size;
  layout.bounce_count = bounce_count;
  layout.bounce_size = bounce_size;
  layout.fifo_offset = align_up(sizeof(SegmentHeader), 4096);
  layout.bounce_offset =
      align_up(layout.fifo_offset + std::size_t{fifo_size} * kFifoElemSize, 4096);
  layout.bounce_stride = kBounceHeaderSize + bounce_size;
  layout.total_size =
      align_up(layout.bounce_offset + std::size_t{bounce_count} * layout.bounce_stride, 4096);
  *out = layout;
  return {};
}

Segment Segment::create(const std::string& name, const Layout& layout) {
  util::Fd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd.valid()) fail(Code::kIoError, name, "shm_open failed", errno);
  Segment segment;
  segment.name_ = name;
  segment.owner_ = true;  // from here on, the destructor unlinks the name
  segment.layout_ = layout;
  if (::ftruncate(fd.get(), static_cast<off_t>(layout.total_size)) != 0) {
    fail(Code::kNoResources, name,
         "ftruncate to " + std::to_string(layout.total_size) + " bytes failed", errno);
  }
  int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(layout.total_size));
  if (err != 0) {
    fail(err == ENOSPC ? Code::kNoResources : Code::kIoError, name,
         "reserving " + std::to_string(layout.total_size) +
             " bytes failed (is /dev/shm full or too small? `df -h /dev/shm`)",
         err);
  }
  void* address =
      ::mmap(nullptr, layout.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) fail(Code::kNoResources, name, "mmap failed", errno);
  segment.mapping_ = util::Mapping(address, layout.total_size);

  auto* header = new (address) SegmentHeader{};
  header->magic = kSegmentMagic;
  header->version = kSegmentVersion;
  header->fifo_size = layout.fifo_size;
  header->bounce_count = layout.bounce_count;
  header->bounce_size = layout.bounce_size;
  header->total_size = layout.total_size;
  header->fifo.head.store(0, std::memory_order_relaxed);
  header->fifo.tail.store(0, std::memory_order_relaxed);
  header->claim.store(0, std::memory_order_relaxed);
  header->withdrawn_next.store(0, std::memory_order_relaxed);
  for (auto& id : header->withdrawn) id.store(0, std::memory_order_relaxed);
  for (std::uint32_t i = 0; i < layout.fifo_size; ++i) {
    new (&segment.fifo()[i]) FifoElem{};
  }
  for (std::uint32_t i = 0; i < layout.bounce_count; ++i) {
    new (segment.bounce(i)) BounceHeader{};
  }
  return segment;
}

Segment Segment::attach(const std::string& name, const Layout& expected) {
  util::Fd fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (!fd.valid()) fail(Code::kIoError, name, "opening a peer's segment failed", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(Code::kIoError, name, "fstat failed", errno);
  if (static_cast<std::size_t>(st.st_size) != expected.total_size) {
    throw Error(Code::kProtocolError,
                "shm segment /dev/shm" + name + " has " + std::to_string(st.st_size) +
                    " bytes, the peer announced " + std::to_string(expected.total_size));
  }
  void* address =
      ::mmap(nullptr, expected.total_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) fail(Code::kNoResources, name, "mmap failed", errno);
  Segment segment;
  segment.name_ = name;
  segment.layout_ = expected;
  segment.mapping_ = util::Mapping(address, expected.total_size);
  const SegmentHeader* header = segment.header();
  if (header->magic != kSegmentMagic || header->version != kSegmentVersion ||
      header->fifo_size != expected.fifo_size || header->bounce_count != expected.bounce_count ||
      header->bounce_size != expected.bounce_size || header->total_size != expected.total_size) {
    throw Error(Code::kProtocolError, "shm segment /dev/shm" + name +
                                          " does not hold the header its owner announced "
                                          "(another ferry version, or a corrupt segment)");
  }
  return segment;
}

void Segment::unlink() {
  if (owner_) {
    ::shm_unlink(name_.c_str());
    owner_ = false;
  }
}

Segment::~Segment() { unlink(); }

}  // namespace ferry::transport::shm
