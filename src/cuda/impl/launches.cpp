#include "cuda/impl/launches.hpp"

#include <algorithm>
#include <array>
#include <span>

#ifdef FERRY_HAVE_KERNELS
// kernels.cu as a fatbin, embedded by the build (cmake/embed.cmake).
extern const unsigned char ferry_kernels_fatbin[];
#endif

namespace ferry::cuda {

Launches::Launches(Devices& devices, const util::Config& config)
    : devices_(devices),
      d_(devices.driver()),
      kernel_copy_from_(config.get_size(util::Var::kCudaIpcKernelCopy)),
      kernel_copy_max_(config.get_size(util::Var::kCudaIpcKernelCopyMax)) {}

std::string Launches::missing(int ordinal) {
#ifdef FERRY_HAVE_KERNELS
  Device& dev = devices_.get(ordinal);
  if (dev.reduce != nullptr || !dev.kernels_error.empty()) return dev.kernels_error;
  ScopedContext scope(d_, dev.context);
  CUresult result = d_->cuModuleLoadData(&dev.module, ferry_kernels_fatbin);
  if (result != CUDA_SUCCESS) {
    dev.module = nullptr;
    dev.kernels_error =
        "loading ferry's device kernels (sm_90 code and PTX) on cuda:" + std::to_string(ordinal) +
        ": " + driver_error("cuModuleLoadData", result).message();
  } else if ((result = d_->cuModuleGetFunction(&dev.reduce, dev.module, "ferry_reduce")) !=
                 CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.oneshot, dev.module,
                                               "ferry_allreduce_oneshot")) != CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.twoshot, dev.module,
                                               "ferry_allreduce_twoshot")) != CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.twoshot_mesh, dev.module,
                                               "ferry_allreduce_twoshot_mesh")) != CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.allgather_mesh, dev.module,
                                               "ferry_allgather_mesh")) != CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.reduce_scatter_mesh, dev.module,
                                               "ferry_reduce_scatter_mesh")) != CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.broadcast_mesh, dev.module,
                                               "ferry_broadcast_mesh")) != CUDA_SUCCESS ||
             (result = d_->cuModuleGetFunction(&dev.reduce_mesh, dev.module,
                                               "ferry_reduce_mesh")) != CUDA_SUCCESS) {
    dev.reduce = nullptr;
    dev.oneshot = nullptr;
    dev.twoshot = nullptr;
    dev.twoshot_mesh = nullptr;
    dev.allgather_mesh = nullptr;
    dev.reduce_scatter_mesh = nullptr;
    dev.broadcast_mesh = nullptr;
    dev.reduce_mesh = nullptr;
    dev.kernels_error = driver_error("cuModuleGetFunction", result).message();
  } else {
    if (d_->cuModuleGetFunction(&dev.copy, dev.module, "ferry_copy") != CUDA_SUCCESS) {
      dev.copy = nullptr;  // copies stay with the copy engine
    }
    if (d_->cuModuleGetFunction(&dev.resident, dev.module, "ferry_allreduce_resident") !=
        CUDA_SUCCESS) {
      dev.resident = nullptr;  // small one-shot calls are launched
    }
    if (d_->cuModuleGetFunction(&dev.on_stream, dev.module, "ferry_allreduce_on_stream") !=
        CUDA_SUCCESS) {
      dev.on_stream = nullptr;  // stream allreduces go through the proxy
    }
    if (d_->cuModuleGetFunction(&dev.mesh_on_stream, dev.module, "ferry_mesh_on_stream") !=
        CUDA_SUCCESS) {
      dev.mesh_on_stream = nullptr;  // so do the other stream collectives
    }
    if (d_->cuModuleGetFunction(&dev.p2p, dev.module, "ferry_p2p_on_stream") != CUDA_SUCCESS ||
        d_->cuModuleGetFunction(&dev.p2p_2, dev.module, "ferry_p2p_on_stream_2") != CUDA_SUCCESS) {
      dev.p2p = nullptr;  // stream sends and receives go through the proxy
      dev.p2p_2 = nullptr;
    }
    if (d_->cuModuleGetFunction(&dev.scale, dev.module, "ferry_scale") != CUDA_SUCCESS) {
      dev.scale = nullptr;  // ncclAvg and pre-multiplied sums are refused
    }
    d_->cuDeviceGetAttribute(&dev.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                             dev.handle);
  }
  return dev.kernels_error;
#else
  (void)ordinal;
  return "ferry was built without nvcc, so it has no device kernels (rebuild with the CUDA "
         "toolkit's nvcc on the PATH or under CUDA_HOME)";
#endif
}

Status Launches::copy_device(int ordinal, int lane_index, void* dst, const void* src,
                             std::size_t bytes, bool streaming, Ticket* ticket) {
  const auto lane_number = static_cast<std::size_t>(lane_index) % kLanesPerDevice;
  // A lone copy goes faster by the engine (no launch); a stream of mid-sized ones by the SMs
  // (the engine's start-up per copy shows: 4 MiB 283 against 316-334 GB/s on H200 NVLink).
  if (!streaming || kernel_copy_from_ == 0 || bytes < kernel_copy_from_ ||
      bytes > kernel_copy_max_ || !missing(ordinal).empty() ||
      devices_.get(ordinal).copy == nullptr) {
    return devices_.copy_on_lane(ordinal, lane_number, dst, src, bytes, ticket);
  }
  Device& dev = devices_.get(ordinal);
  Lane& lane = dev.lanes[lane_number];
  ScopedContext scope(d_, dev.context);
  // One thread per 64 bytes (four 16-byte units), at most 2 blocks per multiprocessor.
  constexpr unsigned kThreads = 512;
  const std::size_t most = static_cast<std::size_t>(std::max(dev.multiprocessors, 1)) * 2;
  const auto blocks = static_cast<unsigned>(
      std::clamp<std::size_t>((bytes / 64 + kThreads - 1) / kThreads, 1, most));
  unsigned long long length = bytes;
  void* params[] = {&dst, &src, &length};
  CUresult result =
      d_->cuLaunchKernel(dev.copy, blocks, 1, 1, kThreads, 1, 1, 0, lane.stream, params, nullptr);
  if (result != CUDA_SUCCESS) return driver_error("cuLaunchKernel(ferry_copy)", result);
  return devices_.mark(ordinal, lane_number, ticket);
}

namespace {

// The element-wise kernels (ferry_reduce, ferry_scale): one thread per 16 bytes of `bytes`, at
// most 4 blocks per multiprocessor (their loops stride over more).
constexpr unsigned kElementwiseThreads = 512;
unsigned elementwise_blocks(const Device& dev, std::size_t bytes) {
  const std::size_t work = (bytes + 15) / 16;
  const std::size_t most = static_cast<std::size_t>(std::max(dev.multiprocessors, 1)) * 4;
  return static_cast<unsigned>(
      std::clamp<std::size_t>((work + kElementwiseThreads - 1) / kElementwiseThreads, 1, most));
}

}  // namespace

Status Launches::reduce(int ordinal, int lane_index, void* out, const void* a, const void* b,
                        std::size_t count, DataType type, ReduceOp op, Ticket* ticket) {
  static_assert(
      static_cast<int>(DataType::kFloat64) == 11 && static_cast<int>(ReduceOp::kBitXor) == 6,
      "kernels.cu numbers the types and ops as ferry.hpp does");
  Device& dev = devices_.get(ordinal);
  if (dev.reduce == nullptr) return Status(Code::kUnsupported, missing(ordinal));
  const auto lane_number = static_cast<std::size_t>(lane_index) % kLanesPerDevice;
  Lane& lane = dev.lanes[lane_number];
  ScopedContext scope(d_, dev.context);
  const unsigned blocks = elementwise_blocks(dev, count * size_of(type));
  unsigned long long elements = count;
  int type_number = static_cast<int>(type);
  int op_number = static_cast<int>(op);
  void* params[] = {&out, &a, &b, &elements, &type_number, &op_number};
  CUresult result = d_->cuLaunchKernel(dev.reduce, blocks, 1, 1, kElementwiseThreads, 1, 1, 0,
                                       lane.stream, params, nullptr);
  if (result != CUDA_SUCCESS) return driver_error("cuLaunchKernel(ferry_reduce)", result);
  return devices_.mark(ordinal, lane_number, ticket);
}

namespace {

// A block per `per_block` of the call's `units` (0: as many as allowed), between 1 and the call's
// limit (kOneShotBlocks at most). Block b waits for block b of each peer, so every member
// computes the same grid.
unsigned grid(const Cuda::OneShot& call, std::size_t units, std::size_t per_block) {
  const std::size_t most = std::clamp<std::size_t>(call.max_blocks, 1, Cuda::kOneShotBlocks);
  return static_cast<unsigned>(
      per_block == 0 ? most
                     : std::clamp<std::size_t>((units + per_block - 1) / per_block, 1, most));
}

// A block per call.block_bytes: a small call is one block with one flag per peer.
unsigned oneshot_blocks(const Cuda::OneShot& call) {
  return grid(call, call.count * size_of(call.type), call.block_bytes);
}

// A one-shot call's arguments as the kernels take them (cuLaunchKernel wants their addresses).
struct OneShotArgs {
  explicit OneShotArgs(const Cuda::OneShot& call)
      : out(call.out),
        in(call.in),
        count(call.count),
        type(static_cast<int>(call.type)),
        op(static_cast<int>(call.op)),
        members(call.members),
        me(call.me),
        ring(call.ring ? 1 : 0),
        root(call.root),
        sequence(call.sequence),
        slot_bytes(call.slot_bytes),
        areas(call.areas),
        words(call.words) {}
  void* out;
  const void* in;
  unsigned long long count;
  int type, op, members, me, ring, root;
  unsigned long long sequence, slot_bytes;
  std::array<void*, Cuda::kOneShotMembers> areas;
  void* words;
};

}  // namespace

Status Launches::allreduce_oneshot(int ordinal, int lane_index, const Cuda::OneShot& call,
                                   Ticket* ticket) {
  Device& dev = devices_.get(ordinal);
  if (dev.oneshot == nullptr) return Status(Code::kUnsupported, missing(ordinal));
  const auto lane_number = static_cast<std::size_t>(lane_index) % kLanesPerDevice;
  Lane& lane = dev.lanes[lane_number];
  ScopedContext scope(d_, dev.context);
  const unsigned blocks = oneshot_blocks(call);
  OneShotArgs a(call);
  // The kernel reports its own completion where it can (one GPU command and one driver call
  // fewer than a stream write after it).
  void* blocks_done = nullptr;
  void* lane_flag = nullptr;
  unsigned done = 0;
  if (dev.flags_device != nullptr && dev.counters != 0) {
    blocks_done = reinterpret_cast<unsigned*>(dev.counters) + 16 * lane_number;
    lane_flag = static_cast<std::uint32_t*>(dev.flags_device) + 16 * lane_number;
    done = lane.issued + 1;
  }
  void* params[] = {&a.out,         &a.in,    &a.count,     &a.type,     &a.op,
                    &a.members,     &a.me,    &a.ring,      &a.sequence, &a.slot_bytes,
                    a.areas.data(), &a.words, &blocks_done, &lane_flag,  &done,
                    &a.root};  // the broadcast and reduce kernels' last argument
  CUfunction kernel = dev.oneshot;
  const char* name = "cuLaunchKernel(ferry_allreduce_oneshot)";
  if (call.kind == Cuda::OneShot::Kind::kAllgather) {
    kernel = dev.allgather_mesh;
    name = "cuLaunchKernel(ferry_allgather_mesh)";
  } else if (call.kind == Cuda::OneShot::Kind::kReduce) {
    kernel = dev.reduce_mesh;
    name = "cuLaunchKernel(ferry_reduce_mesh)";
  } else if (call.kind == Cuda::OneShot::Kind::kBroadcast) {
    kernel = dev.broadcast_mesh;
    name = "cuLaunchKernel(ferry_broadcast_mesh)";
  } else if (call.kind == Cuda::OneShot::Kind::kReduceScatter) {
    kernel = dev.reduce_scatter_mesh;
    name = "cuLaunchKernel(ferry_reduce_scatter_mesh)";
  } else if (call.two_shot) {
    kernel = call.members == 2 ? dev.twoshot : dev.twoshot_mesh;
    name = call.members == 2 ? "cuLaunchKernel(ferry_allreduce_twoshot)"
                             : "cuLaunchKernel(ferry_allreduce_twoshot_mesh)";
  }
  CUresult result =
      d_->cuLaunchKernel(kernel, blocks, 1, 1, 512, 1, 1, 0, lane.stream, params, nullptr);
  if (result != CUDA_SUCCESS) return driver_error(name, result);
  if (lane_flag == nullptr) return devices_.mark(ordinal, lane_number, ticket);
  ticket->stream =
      static_cast<std::uint32_t>(ordinal * kLaneSlots) + static_cast<std::uint32_t>(lane_number);
  ticket->sequence = ++lane.issued;
  return Status::ok();
}

Status Launches::scale_on_stream(void* stream, int ordinal, void* out, const void* in,
                                 std::size_t count, DataType type, const Cuda::Scale& scale) {
  Device& dev = devices_.get(ordinal);
  const std::string why = missing(ordinal);  // loads the module on first use
  if (dev.scale == nullptr) {
    return Status(Code::kUnsupported, why.empty() ? "the module has no ferry_scale" : why);
  }
  if (count == 0) return Status();
  ScopedContext scope(d_, dev.context);
  const unsigned blocks = elementwise_blocks(dev, count * size_of(type));
  unsigned long long elements = count;
  int type_number = static_cast<int>(type);
  const void* device_factor = scale.device_factor;
  unsigned long long factor_bits = scale.factor_bits;
  unsigned long long divisor = scale.divisor;
  void* params[] = {&out, &in, &elements, &type_number, &device_factor, &factor_bits, &divisor};
  const CUresult result = d_->cuLaunchKernel(dev.scale, blocks, 1, 1, kElementwiseThreads, 1, 1, 0,
                                             static_cast<CUstream>(stream), params, nullptr);
  if (result != CUDA_SUCCESS) return driver_error("cuLaunchKernel(ferry_scale)", result);
  return Status();
}

Status Launches::collective_on_stream(void* stream, int ordinal, const Cuda::OneShot& call) {
  Device& dev = devices_.get(ordinal);
  const std::string why = missing(ordinal);  // loads the module on first use
  const bool mesh = call.kind != Cuda::OneShot::Kind::kAllreduce || call.two_shot;
  const char* name = mesh ? "ferry_mesh_on_stream" : "ferry_allreduce_on_stream";
  CUfunction kernel = mesh ? dev.mesh_on_stream : dev.on_stream;
  if (kernel == nullptr) {
    return Status(Code::kUnsupported, why.empty() ? std::string("the module has no ") + name : why);
  }
  ScopedContext scope(d_, dev.context);
  OneShotArgs a(call);
  void* counters = call.counters;
  unsigned long long timeout_ns = call.timeout_ns;
  unsigned long long ll_bytes = std::min(call.ll_bytes, Cuda::kLLMaxBytes);
  int kind = static_cast<int>(call.kind);
  // By LL lines (kernels/on_stream.cuh, mesh_by_ll): an allreduce, and an allgather, broadcast,
  // reduce-scatter or reduce among two or more members, of at most ll_bytes of data (the part); a
  // thread per line: a thread's second line waits a whole round trip (its input read, the store
  // to the peer, the peer's line) behind its first (two H200s: 16 KiB in 8.3 us replayed from a
  // graph with two lines a thread, 8 B in 4.5 with one).
  // Rounds of a larger call (stride past count) come with ll_bytes 0: the blocks keep the stride.
  unsigned long long stride = call.stride != 0 ? call.stride : call.count;
  const std::size_t data = call.count * size_of(call.type);
  const bool by_lines = data <= ll_bytes && !(mesh && call.kind == Cuda::OneShot::Kind::kAllreduce);
  const unsigned blocks = by_lines ? grid(call, (data + 7) / 8 + 1, 512) : oneshot_blocks(call);
  void* allreduce_params[] = {&a.out,     &a.in,     &a.count,    &a.type,       &a.op,
                              &a.members, &a.me,     &a.ring,     &a.slot_bytes, a.areas.data(),
                              &a.words,   &counters, &timeout_ns, &ll_bytes};
  void* mesh_params[] = {&a.out,      &a.in,   &a.count,      &a.type,        &a.op,    &a.members,
                         &a.me,       &a.ring, &a.slot_bytes, a.areas.data(), &a.words, &counters,
                         &timeout_ns, &kind,   &a.root,       &ll_bytes,      &stride};
  const CUresult result =
      d_->cuLaunchKernel(kernel, blocks, 1, 1, 512, 1, 1, 0, static_cast<CUstream>(stream),
                         mesh ? mesh_params : allreduce_params, nullptr);
  if (result != CUDA_SUCCESS) {
    return driver_error(std::string("cuLaunchKernel(") + name + ")", result);
  }
  return Status::ok();
}

namespace {

// kernels/p2p.cuh's P2pOp and P2pOps, field for field.
struct P2pArgs {
  void* slots;
  void* free;
  void* counter;
  void* buffer;
  unsigned long long bytes;
  void* verdict;
  void* done;
  void* chunks;
  int kind;
  int index;
  int total;
  int first_block;
  int direct;
  int after;
  int peer;
};
static_assert(sizeof(P2pArgs) == 96);
// kernels/p2p.cuh's P2pRelease.
struct P2pReleaseArgs {
  void* ready;
  void* done;
  unsigned value;
  int reset;
};
static_assert(sizeof(P2pReleaseArgs) == 24);

}  // namespace

Status Launches::p2p_on_stream(void* stream, int ordinal, std::span<const Cuda::P2pOp> ops,
                               const Cuda::P2pRing& ring, void* words, std::uint64_t timeout_ns,
                               void* scratch, const Cuda::P2pRelease* release) {
  Device& dev = devices_.get(ordinal);
  const std::string why = missing(ordinal);  // loads the module on first use
  if (dev.p2p == nullptr) {
    return Status(Code::kUnsupported, why.empty() ? "the module has no ferry_p2p_on_stream" : why);
  }
  if (ops.empty() || ops.size() > static_cast<std::size_t>(Cuda::kP2pMaxOps)) {
    return Status(Code::kInvalidArgument,
                  "a stream send/receive launch of " + std::to_string(ops.size()) + " ops");
  }
  // A thread per LL line (a thread's second line waits a round trip behind its first); through
  // the bulk ring, a block per place each side fills, up to ring.blocks (a receive that may take
  // the ring as many as that or its lines need); at most 256 blocks in all. A sendrecv through
  // the ring (129 blocks) is on an H200 at once; 256 of 512 threads were not all resident (two
  // H200s: the ring at 128 blocks a side ran at a third of the speed), so ops of a large group
  // may start only as earlier ones end.
  std::array<P2pArgs, Cuda::kP2pMaxOps> args{};
  const std::size_t share = std::max<std::size_t>(1, 256 / ops.size());
  int blocks = 0;
  auto* done = static_cast<unsigned*>(scratch) + 1;  // [0] counts the launch's ended blocks
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Cuda::P2pOp& op = ops[i];
    using Kind = Cuda::P2pOp::Kind;
    const std::size_t ring_blocks = std::min<std::size_t>({(op.bytes + ring.chunk - 1) / ring.chunk,
                                                           static_cast<std::size_t>(ring.places),
                                                           static_cast<std::size_t>(ring.blocks)});
    std::size_t want = 1;
    if (op.kind == Kind::kSendBulk) {
      want = ring_blocks;
    } else if (op.kind != Kind::kSendHeader) {
      want = ((std::min(op.bytes, Cuda::kP2pInlineMax) + 7) / 8 + 1 + 511) / 512;
      if (op.kind == Kind::kReceive && op.bytes > Cuda::kP2pInlineMax) {
        want = std::max(want, ring_blocks);
      }
    }
    args[i] = P2pArgs{op.slots,          op.free,   op.counter,
                      op.buffer,         op.bytes,  op.verdict,
                      done + i,          op.chunks, static_cast<int>(op.kind),
                      op.index,          op.total,  blocks,
                      op.direct ? 1 : 0, op.after,  op.peer};
    blocks += static_cast<int>(std::clamp<std::size_t>(want, 1, share));
  }
  ScopedContext scope(d_, dev.context);
  int count = static_cast<int>(ops.size());
  unsigned long long timeout = timeout_ns;
  void* launches = scratch;
  unsigned long long chunk = ring.chunk;
  int places = ring.places;
  P2pReleaseArgs hand_off{nullptr, nullptr, 0, 0};
  if (release != nullptr) {
    hand_off =
        P2pReleaseArgs{release->ready, release->done, release->value, release->reset ? 1 : 0};
  }
  void* params[] = {args.data(), &count, &words, &timeout, &launches, &chunk, &places, &hand_off};
  // Parameters are copied at every launch: up to two ops (a send and a receive) by the small form.
  CUfunction function = ops.size() <= 2 ? dev.p2p_2 : dev.p2p;
  const CUresult result = d_->cuLaunchKernel(function, static_cast<unsigned>(blocks), 1, 1, 512, 1,
                                             1, 0, static_cast<CUstream>(stream), params, nullptr);
  if (result != CUDA_SUCCESS) return driver_error("cuLaunchKernel(ferry_p2p_on_stream)", result);
  return Status::ok();
}

}  // namespace ferry::cuda
