// Stream send and receive between two GPUs of one node (coll/stream_p2p.hpp), enqueued on an
// application's stream: part of kernels.cu's translation unit (after on_stream.cuh, whose LL
// lines it uses).
#pragma once

// ---- One launch: every send and receive of a stream group ----
//
// Each member keeps, for each peer it set a pair up with, an inbox in its own device memory
// (mapped by that peer): kP2pSlots slot-free words, then a ring of kP2pSlots LL slots. Message s
// (1, 2, ... per direction, numbered by the GPU) goes in slot s % kP2pSlots: line 0 its header
// (its size, and whether its data follows inline or comes by ferry's thread), lines 1.. its bytes
// when inline; every line carries s as its flag, so a reader knows a line of this message from a
// stale one. The sender waits until slot-free word s % kP2pSlots of its own inbox says message
// s - kP2pSlots was taken (the receiver writes it there when its blocks have read the slot).
// Every op of a launch runs at once (blocks of different ops never wait for each other to
// start), so a group's sends and receives between two members cannot wait for one another.
namespace {

constexpr int kP2pSlots = 4;
constexpr unsigned long long kP2pInlineMax = 262144;
constexpr unsigned long long kP2pSlotBytes = (kP2pInlineMax / 8 + 1) * 16;
constexpr int kP2pMaxOps = 32;
constexpr unsigned long long kP2pByThread = 1ull << 63;

struct P2pOp {
  unsigned char* slots;         // send: the peer's ring for us (mapped); receive: ours for the peer
  unsigned long long* free;     // send: our slot-free words; receive: the peer's (mapped)
  unsigned long long* counter;  // ours: messages of this direction and peer so far
  void* buffer;                 // send: the data; receive: where it goes (or a bounce)
  unsigned long long bytes;     // send: the size; receive: the most it takes
  unsigned* verdict;            // receive with a hand-off after it: {mode, size low, size high}
  unsigned* done;               // device memory: this op's blocks that ended (reset by the last)
  int kind;                     // 0 send inline, 1 send the header only, 2 receive
  int index;                    // among the launch's ops of the same peer and direction
  int total;                    // their number (on the op of index 0: it raises the counter)
  int first_block;              // this op's blocks: [first_block, next op's first_block)
};

// A launch's ops (kernel parameters are copied at every launch: a group of two, the common case,
// takes the small form).
template <int kCapacity>
struct P2pOps {
  P2pOp op[kCapacity];
};

// Waits until the 64 bits at `word` reach `want`; false where the call must stop (words[0]
// raised, or the deadline passed: then words[2] set).
__device__ __forceinline__ bool p2p_wait_at_least(const unsigned long long* word,
                                                  unsigned long long want,
                                                  volatile unsigned* words,
                                                  unsigned long long deadline) {
  for (unsigned spins = 1;; ++spins) {
    if (*reinterpret_cast<const volatile unsigned long long*>(word) >= want) return true;
    if ((spins & 4095) == 0) {
      if (words[0] != 0) return false;
      if (deadline != 0 && now_ns() > deadline) {
        words[2] = 1;
        return false;
      }
    }
  }
}


}  // namespace

// Block b runs op o where op[o].first_block <= b < op[o + 1].first_block (the last op's to the
// grid's end). words: the communicator's stop words (host memory; [0] raised by the host stops
// every wait, [1] set here where a message is larger than its receive, [2] where a wait passed
// timeout_ns). launches: device memory, [0] counts the blocks that ended (the last one raises the
// ops' counters and clears it).
template <int kCapacity>
__device__ __forceinline__ void p2p_launch(const P2pOps<kCapacity>& ops, int count,
                                           volatile unsigned* words, unsigned long long timeout_ns,
                                           unsigned* launches) {
  int o = 0;
  while (o + 1 < count && ops.op[o + 1].first_block <= static_cast<int>(blockIdx.x)) ++o;
  const P2pOp& op = ops.op[o];
  const int blocks = (o + 1 < count ? ops.op[o + 1].first_block : static_cast<int>(gridDim.x)) -
                     op.first_block;
  const int block = static_cast<int>(blockIdx.x) - op.first_block;
  __shared__ unsigned long long sequence;
  __shared__ unsigned long long header;
  __shared__ int stopped;
  if (threadIdx.x == 0) {
    sequence = *reinterpret_cast<volatile unsigned long long*>(op.counter) + op.index + 1;
    stopped = 0;
  }
  __syncthreads();
  const unsigned long long deadline = timeout_ns != 0 ? now_ns() + timeout_ns : 0;
  const unsigned flag = static_cast<unsigned>(sequence);
  unsigned char* slot = op.slots + (sequence % kP2pSlots) * kP2pSlotBytes;
  const unsigned long long first = static_cast<unsigned long long>(block) * blockDim.x + threadIdx.x;
  const unsigned long long stride = static_cast<unsigned long long>(blocks) * blockDim.x;
  if (op.kind != 2) {
    // The slot is ours once its last message was taken.
    if (threadIdx.x == 0 && sequence > kP2pSlots &&
        !p2p_wait_at_least(op.free + sequence % kP2pSlots, sequence - kP2pSlots, words,
                           deadline)) {
      stopped = 1;
    }
    __syncthreads();
    if (stopped == 0) {
      const bool inline_data = op.kind == 0;
      const unsigned long long lines = inline_data ? (op.bytes + 7) / 8 + 1 : 1;
      const auto* input = static_cast<const unsigned char*>(op.buffer);
      for (unsigned long long line = first; line < lines; line += stride) {
        const unsigned long long data =
            line == 0 ? (op.bytes | (inline_data ? 0 : kP2pByThread))
                      : ll_input(input, op.bytes, (line - 1) * 8);
        ll_store(slot + line * 16, data, flag);
      }
    }
  } else {
    if (threadIdx.x == 0) {
      unsigned long long got = 0;
      if (!ll_load(slot, flag, words, deadline, &got)) {
        stopped = 1;
      } else if ((got & ~kP2pByThread) > op.bytes ||
                 ((got & kP2pByThread) == 0 && got > kP2pInlineMax) ||
                 ((got & kP2pByThread) != 0 && op.verdict == nullptr)) {
        // The send is larger than the receive, or inline past what a slot holds, or comes by
        // ferry's thread where this receive expected it inline (the members' limits differ, or
        // a peer's header lies): every member's stream calls stop.
        words[1] = 1;
        words[0] = 1;
        stopped = 1;
      }
      header = got;
    }
    __syncthreads();
    const unsigned long long size = header & ~kP2pByThread;
    const bool inline_data = (header & kP2pByThread) == 0;
    if (stopped == 0 && inline_data) {
      const unsigned long long lines = (size + 7) / 8 + 1;
      auto* out = static_cast<unsigned char*>(op.buffer);
      for (unsigned long long line = first == 0 ? stride : first; line < lines; line += stride) {
        unsigned long long data = 0;
        if (!ll_load(slot + line * 16, flag, words, deadline, &data)) {
          stopped = 1;
          break;
        }
        ll_output(out, size, (line - 1) * 8, data);
      }
    }
    __syncthreads();
    // The op's last block to end hands the slot back and tells ferry's thread what came.
    // (Every line read was used before the barrier, so the slot may go without a fence; data for
    // the host, a bounce or the verdict, needs the system's.)
    if (threadIdx.x == 0 && stopped == 0) {
      if (op.verdict != nullptr) __threadfence_system();
      if (blocks == 1 || atomicAdd(op.done, 1u) == static_cast<unsigned>(blocks) - 1) {
        if (blocks > 1) *op.done = 0;
        if (op.verdict != nullptr) {
          auto* verdict = reinterpret_cast<volatile unsigned*>(op.verdict);
          verdict[1] = static_cast<unsigned>(size);
          verdict[2] = static_cast<unsigned>(size >> 32);
          __threadfence_system();
          verdict[0] = inline_data ? 1u : 2u;
        }
        *reinterpret_cast<volatile unsigned long long*>(op.free + sequence % kP2pSlots) = sequence;
      }
    }
  }
  // The launch's last block raises every op's counter: each block read its counter before.
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(launches, 1u) == gridDim.x - 1) {
      *launches = 0;
      for (int k = 0; k < count; ++k) {
        if (ops.op[k].index == 0) {
          auto* counter = reinterpret_cast<volatile unsigned long long*>(ops.op[k].counter);
          *counter = *counter + ops.op[k].total;
        }
      }
      __threadfence();
    }
  }
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_p2p_on_stream(P2pOps<kP2pMaxOps> ops, int count, volatile unsigned* words,
                        unsigned long long timeout_ns, unsigned* launches) {
  p2p_launch(ops, count, words, timeout_ns, launches);
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_p2p_on_stream_2(P2pOps<2> ops, int count, volatile unsigned* words,
                          unsigned long long timeout_ns, unsigned* launches) {
  p2p_launch(ops, count, words, timeout_ns, launches);
}
