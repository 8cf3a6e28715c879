// MPI on ferry: handles, predefined types and errors (see runtime.hpp).
#include "mpi/runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry::mpi {
namespace {

constexpr std::size_t kMessageSlots = 1024;

Type basic(const char* name, std::size_t size, std::optional<DataType> element) {
  Type t;
  t.name = name;
  t.size = size;
  t.extent = static_cast<std::ptrdiff_t>(size);
  t.blocks = {{0, size}};
  t.element = element;
  t.element_count = element ? size / size_of(*element) : 0;
  t.predefined = t.committed = t.live = true;
  return t;
}

// A pair type of MINLOC/MAXLOC: a value and an int, laid out as the C struct.
template <typename Value>
Type pair(const char* name) {
  struct Layout {
    Value value;
    int index;
  };
  Type t;
  t.name = name;
  t.size = sizeof(Value) + sizeof(int);
  t.extent = sizeof(Layout);
  t.blocks = {{0, sizeof(Value)}, {offsetof(Layout, index), sizeof(int)}};
  if (offsetof(Layout, index) == sizeof(Value)) t.blocks = {{0, t.size}};
  t.predefined = t.committed = t.live = true;
  return t;
}

int error_class_of(Code code) {
  switch (code) {
    case Code::kOk:
      return MPI_SUCCESS;
    case Code::kTruncated:
      return MPI_ERR_TRUNCATE;
    case Code::kInvalidArgument:
      return MPI_ERR_ARG;
    case Code::kPeerFailed:
      return MPIX_ERR_PROC_FAILED;
    case Code::kRevoked:
      return MPIX_ERR_REVOKED;
    case Code::kNoResources:
      return MPI_ERR_NO_MEM;
    case Code::kUnsupported:
      return MPI_ERR_UNSUPPORTED_OPERATION;
    case Code::kInternal:
      return MPI_ERR_INTERN;
    default:
      return MPI_ERR_OTHER;
  }
}

}  // namespace

Runtime::Runtime() : messages_(kMessageSlots) {
  static_assert(sizeof(long) == 8, "MPI_LONG is taken as 64 bits");
  types.resize(1);  // MPI_DATATYPE_NULL
  types.push_back(basic("MPI_CHAR", 1, DataType::kInt8));
  types.push_back(basic("MPI_SIGNED_CHAR", 1, DataType::kInt8));
  types.push_back(basic("MPI_UNSIGNED_CHAR", 1, DataType::kUint8));
  types.push_back(basic("MPI_BYTE", 1, DataType::kUint8));
  types.push_back(basic("MPI_SHORT", 2, DataType::kInt16));
  types.push_back(basic("MPI_UNSIGNED_SHORT", 2, DataType::kUint16));
  types.push_back(basic("MPI_INT", 4, DataType::kInt32));
  types.push_back(basic("MPI_UNSIGNED", 4, DataType::kUint32));
  types.push_back(basic("MPI_LONG", 8, DataType::kInt64));
  types.push_back(basic("MPI_UNSIGNED_LONG", 8, DataType::kUint64));
  types.push_back(basic("MPI_LONG_LONG_INT", 8, DataType::kInt64));
  types.push_back(basic("MPI_UNSIGNED_LONG_LONG", 8, DataType::kUint64));
  types.push_back(basic("MPI_FLOAT", 4, DataType::kFloat32));
  types.push_back(basic("MPI_DOUBLE", 8, DataType::kFloat64));
  types.push_back(basic("MPI_LONG_DOUBLE", sizeof(long double), std::nullopt));
  types.push_back(basic("MPI_INT8_T", 1, DataType::kInt8));
  types.push_back(basic("MPI_INT16_T", 2, DataType::kInt16));
  types.push_back(basic("MPI_INT32_T", 4, DataType::kInt32));
  types.push_back(basic("MPI_INT64_T", 8, DataType::kInt64));
  types.push_back(basic("MPI_UINT8_T", 1, DataType::kUint8));
  types.push_back(basic("MPI_UINT16_T", 2, DataType::kUint16));
  types.push_back(basic("MPI_UINT32_T", 4, DataType::kUint32));
  types.push_back(basic("MPI_UINT64_T", 8, DataType::kUint64));
  types.push_back(basic("MPI_C_BOOL", 1, std::nullopt));
  types.push_back(basic("MPI_WCHAR", sizeof(wchar_t), std::nullopt));
  types.push_back(basic("MPI_AINT", sizeof(MPI_Aint), DataType::kInt64));
  types.push_back(basic("MPI_OFFSET", sizeof(MPI_Offset), DataType::kInt64));
  types.push_back(basic("MPI_COUNT", sizeof(MPI_Count), DataType::kInt64));
  types.push_back(basic("MPI_PACKED", 1, std::nullopt));
  types.push_back(pair<float>("MPI_FLOAT_INT"));
  types.push_back(pair<double>("MPI_DOUBLE_INT"));
  types.push_back(pair<long>("MPI_LONG_INT"));
  types.push_back(pair<int>("MPI_2INT"));
  types.push_back(pair<short>("MPI_SHORT_INT"));
  types.push_back(pair<long double>("MPI_LONG_DOUBLE_INT"));
  types.push_back(basic("MPI_C_FLOAT_COMPLEX", 8, std::nullopt));
  types.push_back(basic("MPI_C_DOUBLE_COMPLEX", 16, std::nullopt));
  comms.resize(3);     // MPI_COMM_NULL, MPI_COMM_WORLD, MPI_COMM_SELF: made by MPI_Init
  requests.resize(1);  // MPI_REQUEST_NULL
}

int Runtime::fail(MPI_Comm handle, int error_class, const std::string& why) {
  const std::size_t slot = next_message_++ % kMessageSlots;
  messages_[slot] = why;
  const int code = error_class + static_cast<int>(slot << 8);
  const Comm* c = handle > 0 && static_cast<std::size_t>(handle) < comms.size() &&
                          comms[static_cast<std::size_t>(handle)].live
                      ? &comms[static_cast<std::size_t>(handle)]
                      : (comms.size() > 1 && comms[1].live ? &comms[1] : nullptr);
  const MPI_Errhandler handler = c != nullptr ? c->errhandler : MPI_ERRORS_ARE_FATAL;
  if (handler != MPI_ERRORS_RETURN) {
    const int rank = context ? context->rank() : -1;
    std::fprintf(stderr, "ferry-mpi[%d]: %s (MPI_ERRORS_ARE_FATAL: aborting the job)\n", rank,
                 why.c_str());
    abort(error_class);
  }
  return code;
}

int Runtime::fail_with(MPI_Comm handle, const char* what, const Status& status) {
  return fail(handle, error_class_of(status.code()), std::string(what) + ": " + status.to_string());
}

std::string Runtime::message(int code) const {
  const int error_class = code & 0xff;
  const auto slot = static_cast<std::size_t>(code >> 8);
  if (code > 0 && slot < kMessageSlots && !messages_[slot].empty()) return messages_[slot];
  switch (error_class) {
    case MPI_SUCCESS:
      return "MPI_SUCCESS: no error";
    case MPI_ERR_TRUNCATE:
      return "MPI_ERR_TRUNCATE: message truncated";
    case MPI_ERR_UNSUPPORTED_OPERATION:
      return "MPI_ERR_UNSUPPORTED_OPERATION: not built in ferry's MPI";
    default:
      return "MPI error class " + std::to_string(error_class);
  }
}

void Runtime::abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  // The launcher sees a rank end with a failure and ends the job (ferryrun: the other ranks
  // are killed); nothing of ferry's waits for the peers.
  ::_exit(code != 0 ? (code & 0xff) | 1 : 1);
}

MPI_Comm Runtime::add_comm(Comm c) {
  c.live = true;
  for (std::size_t i = 3; i < comms.size(); ++i) {
    if (!comms[i].live) {
      comms[i] = std::move(c);
      return static_cast<MPI_Comm>(i);
    }
  }
  comms.push_back(std::move(c));
  return static_cast<MPI_Comm>(comms.size() - 1);
}

MPI_Datatype Runtime::add_type(Type t) {
  t.live = true;
  types.push_back(std::move(t));
  return static_cast<MPI_Datatype>(types.size() - 1);
}

MPI_Request Runtime::add_request(PendingRequest r) {
  r.live = true;
  if (!free_requests.empty()) {
    const MPI_Request handle = free_requests.back();
    free_requests.pop_back();
    requests[static_cast<std::size_t>(handle)] = std::move(r);
    return handle;
  }
  requests.push_back(std::move(r));
  return static_cast<MPI_Request>(requests.size() - 1);
}

void Runtime::release_request(MPI_Request handle) {
  requests[static_cast<std::size_t>(handle)] = PendingRequest{};
  free_requests.push_back(handle);
}

Type derive(const Type& old, const std::vector<std::ptrdiff_t>& displacements) {
  Type t;
  t.size = displacements.size() * old.size;
  t.element = old.element;
  t.element_count = displacements.size() * old.element_count;
  std::ptrdiff_t low = 0;
  std::ptrdiff_t high = 0;
  for (std::size_t i = 0; i < displacements.size(); ++i) {
    const std::ptrdiff_t d = displacements[i];
    low = i == 0 ? d + old.lb : std::min(low, d + old.lb);
    high = i == 0 ? d + old.lb + old.extent : std::max(high, d + old.lb + old.extent);
    for (const Type::Block& b : old.blocks) {
      if (!t.blocks.empty() &&
          t.blocks.back().offset + static_cast<std::ptrdiff_t>(t.blocks.back().bytes) ==
              d + b.offset) {
        t.blocks.back().bytes += b.bytes;  // adjacent: one block
      } else {
        t.blocks.push_back({d + b.offset, b.bytes});
      }
    }
  }
  t.lb = low;
  t.extent = high - low;
  return t;
}

void pack(const Type& type, const void* from, int count, std::byte* to) {
  const auto* base = static_cast<const std::byte*>(from);
  for (int i = 0; i < count; ++i) {
    const std::byte* element = base + static_cast<std::ptrdiff_t>(i) * type.extent;
    for (const Type::Block& b : type.blocks) {
      std::memcpy(to, element + b.offset, b.bytes);
      to += b.bytes;
    }
  }
}

void unpack(const Type& type, const std::byte* from, std::size_t bytes, void* to) {
  auto* base = static_cast<std::byte*>(to);
  for (std::ptrdiff_t i = 0; bytes > 0; ++i) {
    std::byte* element = base + i * type.extent;
    for (const Type::Block& b : type.blocks) {
      const std::size_t n = std::min(b.bytes, bytes);
      std::memcpy(element + b.offset, from, n);
      from += n;
      bytes -= n;
      if (bytes == 0) return;
    }
  }
}

}  // namespace ferry::mpi
