// Stream send and receive between two GPUs of one node (coll/stream_p2p.hpp), enqueued on an
// application's stream: part of kernels.cu's translation unit (after on_stream.cuh, whose LL
// lines it uses).
#pragma once

// ---- One launch: every send and receive of a stream group ----
//
// Each member keeps, for each peer it set a pair up with, an inbox in its own device memory
// (mapped by that peer): kP2pSlots slot-free words and kP2pSlots reply words, then a ring of
// kP2pSlots LL slots, then a bulk ring of `places` chunks of `chunk` bytes with a ready word
// each (and the taken words of the chunks this member sends the peer). Message s (1, 2, ... per
// direction, numbered by the GPU) goes in slot s % kP2pSlots: line 0 its header (its size, and
// whether its data follows inline, comes through the bulk ring, or by ferry's thread), lines 1..
// its bytes when inline; every line carries s as its flag, so a reader knows a line of this
// message from a stale one. The sender waits until slot-free word s % kP2pSlots of its own inbox
// says message s - kP2pSlots was taken (the receiver writes it there when its blocks have read
// the slot). Every op of a launch runs at once (blocks of different ops never wait for each
// other to start), so a group's sends and receives between two members cannot wait for one
// another.
//
// A message past the inline limit from memory the sender's GPU reads goes through the bulk ring:
// its header says so, and the receiver answers in reply word s % kP2pSlots whether it takes the
// data there (its buffer is memory its GPU writes) or by ferry's thread (host memory). Through
// the ring, chunk j of the message (`chunk` bytes each) goes in ring place j % places: one
// block of each side handles a place, in order, and each side counts, in its own device memory,
// the times it filled (emptied) each place, so a place is written once its last chunk was taken
// and read once its next one is ready, whatever the sizes before. Ops of one launch that may
// take the ring between the same two members in the same direction take it in turn: each waits
// until the one before (`after`) ended, as the last of its blocks tells.
namespace {

constexpr int kP2pSlots = 4;
constexpr unsigned long long kP2pInlineMax = 262144;
constexpr unsigned long long kP2pSlotBytes = (kP2pInlineMax / 8 + 1) * 16;
constexpr int kP2pMaxOps = 32;
constexpr unsigned long long kP2pByThread = 1ull << 63;
constexpr unsigned long long kP2pBulk = 1ull << 62;
constexpr unsigned long long kP2pFlags = kP2pByThread | kP2pBulk;
constexpr unsigned long long kP2pReplyOffset = 64;
// words[1] where a reply word held what no receiver writes (cuda.hpp, Cuda::kP2pBadReply).
constexpr unsigned kP2pBadReply = 2;
constexpr unsigned long long kP2pBulkOffset =
    (128 + kP2pSlots * kP2pSlotBytes + 4095) / 4096 * 4096;  // the ready words
constexpr int kP2pMaxPlaces = 256;
constexpr unsigned long long kP2pTakenOffset = kP2pBulkOffset + 8 * kP2pMaxPlaces;
constexpr unsigned long long kP2pRingOffset = kP2pTakenOffset + 8 * kP2pMaxPlaces;

struct P2pOp {
  unsigned char* slots;         // send: the peer's ring for us (mapped); receive: ours for the peer
  unsigned long long* free;     // send: our slot-free words; receive: the peer's (mapped)
  unsigned long long* counter;  // ours: messages of this direction and peer so far
  void* buffer;                 // send: the data; receive: where it goes (or a bounce)
  unsigned long long bytes;     // send: the size; receive: the most it takes
  unsigned* verdict;            // receive with a hand-off after it: {mode, size low, size high}
  unsigned* done;               // device memory: this op's blocks that ended (reset by the last)
  unsigned long long* chunks;   // ours: the times we filled (send) or emptied each ring place
  int kind;                     // 0 send inline, 1 send the header only, 2 receive, 3 send bulk
  int index;                    // among the launch's ops of the same peer and direction
  int total;                    // their number (on the op of index 0: it raises the counter)
  int first_block;              // this op's blocks: [first_block, next op's first_block)
  int direct;                   // receive: `buffer` is the caller's (not a bounce)
  int after;                    // the launch's op that takes the ring before this one, or -1
  int peer;                     // the member at the other end (words[3] while waiting for it)
};
static_assert(sizeof(P2pOp) == 96, "launches.cpp's P2pArgs, field for field");

// The hand-off a launch may write itself (proto::Release): where ferry's thread has work after it
// (an op's verdict says its data comes by the thread, or sits in a host bounce), the launch's last
// block writes `value` to *ready, which starts the thread; else to *done, which lets the stream go
// on with no host in the loop. `reset` (a graph's): block 0 first clears *done, which the last
// replay's completion set. No hand-off where done is null.
struct P2pRelease {
  unsigned* ready;
  unsigned* done;
  unsigned value;
  int reset;
};
// launches[kP2pThreadWord]: set, in a launch with a Release, by an op whose verdict leaves
// ferry's thread work.
constexpr int kP2pThreadWord = 96;

// A launch's ops (kernel parameters are copied at every launch: a group of two, the common case,
// takes the small form).
template <int kCapacity>
struct P2pOps {
  P2pOp op[kCapacity];
};

// Waits until the 64 bits at `word` (which member `peer` raises) reach `want`; false where the
// call must stop (words[0] raised, or the deadline passed: then words[2] set).
__device__ __forceinline__ bool p2p_wait_at_least(const unsigned long long* word,
                                                  unsigned long long want,
                                                  volatile unsigned* words,
                                                  unsigned long long deadline, int peer) {
  for (unsigned spins = 1;; ++spins) {
    if (*reinterpret_cast<const volatile unsigned long long*>(word) >= want) return true;
    if (spin_must_stop(spins, words, deadline, peer)) return false;
  }
}


// Run by thread 0: waits until the launch's op `after` (-1: none) ended; false where the call
// must stop.
__device__ __forceinline__ bool p2p_wait_turn(const unsigned* ended, int after,
                                              volatile unsigned* words,
                                              unsigned long long deadline) {
  if (after < 0) return true;
  for (unsigned spins = 1; reinterpret_cast<const volatile unsigned*>(ended)[after] == 0; ++spins) {
    if (spin_must_stop(spins, words, deadline, -1)) return false;
  }
  return true;
}

// One side of op's message of `bytes` through the bulk ring (`places` places of `chunk` bytes), by
// block `block` of `blocks`: a send copies from its buffer into the peer's ring, a receive from
// its ring into its buffer. Either way op.slots is in the receiver's inbox (its ring and ready
// words) and op.free is the sender's inbox (its taken words); op.chunks the side's own counts of
// each place. Block b owns places b, b + blocks, ... and takes their chunks round by round (chunk
// j in place j % places), so that with more places than blocks it fills one place while the
// other side drains the one before. False where the call must stop.
__device__ bool p2p_bulk(const P2pOp& op, unsigned long long bytes, int block, int blocks,
                         unsigned long long chunk, int places, volatile unsigned* words,
                         unsigned long long deadline) {
  const bool sending = op.kind == 3;
  auto* data = static_cast<unsigned char*>(op.buffer);
  unsigned char* to_inbox = op.slots - 128;
  unsigned char* ring = to_inbox + kP2pRingOffset;
  auto* ready = reinterpret_cast<unsigned long long*>(to_inbox + kP2pBulkOffset);
  auto* taken = reinterpret_cast<unsigned long long*>(reinterpret_cast<unsigned char*>(op.free) +
                                                      kP2pTakenOffset);
  unsigned long long* counts = op.chunks;
  __shared__ int stop;
  const unsigned long long chunks = (bytes + chunk - 1) / chunk;
  const auto ring_places = static_cast<unsigned long long>(places);
  for (unsigned long long first = 0; first < chunks; first += ring_places) {
    for (unsigned long long place = block; place < ring_places && first + place < chunks;
         place += blocks) {
      const unsigned long long j = first + place;
      // Thread 0's alone: the times this side filled (emptied) the place so far.
      auto* count = reinterpret_cast<volatile unsigned long long*>(counts + place);
      const unsigned long long round = threadIdx.x == 0 ? *count : 0;
      unsigned char* at = ring + place * chunk;
      if (threadIdx.x == 0) {
        // The sender writes a place once its last chunk was taken; the receiver reads it once
        // the next is ready. The fence makes the peer's side visible (its data, or that it read
        // the place out).
        stop = !(sending ? p2p_wait_at_least(taken + place, round, words, deadline, op.peer)
                         : p2p_wait_at_least(ready + place, round + 1, words, deadline, op.peer));
        asm volatile("fence.acq_rel.sys;" ::: "memory");
      }
      __syncthreads();
      if (stop != 0) return false;
      const unsigned long long size = min(chunk, bytes - j * chunk);
      if (sending) {
        strided_copy(at, data + j * chunk, size, threadIdx.x, blockDim.x);
      } else {
        strided_copy(data + j * chunk, at, size, threadIdx.x, blockDim.x);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        // The block's copies (its barrier makes the fence cumulative over them), then the word.
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        store_relaxed(sending ? ready + place : taken + place, round + 1);
        *count = round + 1;
      }
    }
  }
  return true;
}

}  // namespace

// Block b runs op o where op[o].first_block <= b < op[o + 1].first_block (the last op's to the
// grid's end). words: the communicator's stop words (host memory; [0] raised by the host stops
// every wait, [1] set here where a message is larger than its receive, [2] where a wait passed
// timeout_ns). launches: device memory, [0] counts the blocks that ended (the last one raises the
// ops' counters and clears it), [1 + o] op o's blocks that ended, [64 + o] whether op o ended (for
// the op after it on the ring; cleared by the launch's last block).
template <int kCapacity>
__device__ __forceinline__ void p2p_launch(const P2pOps<kCapacity>& ops, int count,
                                           volatile unsigned* words, unsigned long long timeout_ns,
                                           unsigned* launches, unsigned long long chunk,
                                           int places, const P2pRelease& release) {
  int o = 0;
  while (o + 1 < count && ops.op[o + 1].first_block <= static_cast<int>(blockIdx.x)) ++o;
  const P2pOp& op = ops.op[o];
  const int blocks = (o + 1 < count ? ops.op[o + 1].first_block : static_cast<int>(gridDim.x)) -
                     op.first_block;
  const int block = static_cast<int>(blockIdx.x) - op.first_block;
  unsigned* ended = launches + 64;
  __shared__ unsigned long long sequence;
  __shared__ unsigned long long header;
  __shared__ int stopped;
  if (threadIdx.x == 0) {
    sequence = *reinterpret_cast<volatile unsigned long long*>(op.counter) + op.index + 1;
    stopped = 0;
    if (blockIdx.x == 0 && release.reset != 0) {
      *reinterpret_cast<volatile unsigned*>(release.done) = 0;
    }
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
                           deadline, op.peer)) {
      stopped = 1;
    }
    __syncthreads();
    if (stopped == 0) {
      const bool inline_data = op.kind == 0;
      const unsigned long long lines = inline_data ? (op.bytes + 7) / 8 + 1 : 1;
      const auto* input = static_cast<const unsigned char*>(op.buffer);
      for (unsigned long long line = first; line < lines; line += stride) {
        const unsigned long long data =
            line == 0 ? (op.bytes | (inline_data ? 0 : op.kind == 3 ? kP2pBulk : kP2pByThread))
                      : ll_input(input, op.bytes, (line - 1) * 8);
        ll_store(slot + line * 16, data, flag);
      }
    }
    if (op.kind == 3 && stopped == 0) {
      // The receiver's answer: through the ring (1) or by ferry's thread (2), for ferry's thread
      // in the verdict (read after the launch).
      __shared__ unsigned long long answer;
      if (threadIdx.x == 0) {
        auto* reply = reinterpret_cast<unsigned long long*>(
                          reinterpret_cast<unsigned char*>(op.free) + kP2pReplyOffset) +
                      sequence % kP2pSlots;
        answer = p2p_wait_at_least(reply, sequence << 2, words, deadline, op.peer) ? load_relaxed(reply) & 3
                                                                          : 0;
        if (answer == 0 || answer == 3) {
          // Stopped, or an answer no receiver gives (a peer's bytes in our inbox): every
          // member's stream calls stop.
          if (answer == 3) {
            words[1] = kP2pBadReply;
            words[0] = 1;
            answer = 0;
          }
          stopped = 1;
        }
        if (block == 0 && answer != 0) {
          reinterpret_cast<volatile unsigned*>(op.verdict)[0] = static_cast<unsigned>(answer);
          if (answer == 2 && release.done != nullptr) {
            reinterpret_cast<volatile unsigned*>(launches)[kP2pThreadWord] = 1;
          }
        }
      }
      __syncthreads();
      if (answer == 1 && threadIdx.x == 0 && !p2p_wait_turn(ended, op.after, words, deadline)) {
        stopped = 1;
      }
      __syncthreads();
      if (answer == 1 && stopped == 0 &&
          !p2p_bulk(op, op.bytes, block, blocks, chunk, places, words, deadline) && threadIdx.x == 0) {
        stopped = 1;
      }
      // The op's last block to end lets the op after it on the ring go.
      __syncthreads();
      if (threadIdx.x == 0 && stopped == 0) {
        __threadfence();
        if (blocks == 1 || atomicAdd(op.done, 1u) == static_cast<unsigned>(blocks) - 1) {
          if (blocks > 1) *op.done = 0;
          reinterpret_cast<volatile unsigned*>(ended)[o] = 1;
        }
      }
    }
  } else {
    if (threadIdx.x == 0) {
      unsigned long long got = 0;
      if (!ll_load(slot, flag, words, deadline, op.peer, &got)) {
        stopped = 1;
      } else if ((got & kP2pFlags) == kP2pFlags || (got & ~kP2pFlags) > op.bytes ||
                 ((got & kP2pFlags) == 0 && got > kP2pInlineMax) ||
                 ((got & kP2pFlags) != 0 && op.verdict == nullptr)) {
        // The send is larger than the receive, or inline past what a slot holds, or not inline
        // where this receive expected it inline (the members' limits differ, or a peer's header
        // lies): every member's stream calls stop.
        words[1] = 1;
        words[0] = 1;
        stopped = 1;
      }
      header = got;
    }
    __syncthreads();
    const unsigned long long size = header & ~kP2pFlags;
    const bool inline_data = (header & kP2pFlags) == 0;
    // Through the bulk ring where this receive's buffer is the caller's (device memory), else
    // by ferry's thread: the sender waits for the answer.
    const unsigned bulk = (header & kP2pBulk) == 0 ? 0u : op.direct != 0 ? 1u : 2u;
    if (stopped == 0 && bulk != 0) {
      if (block == 0 && threadIdx.x == 0) {
        store_relaxed(reinterpret_cast<unsigned long long*>(
                          reinterpret_cast<unsigned char*>(op.free) + kP2pReplyOffset) +
                          sequence % kP2pSlots,
                      sequence << 2 | bulk);
      }
      if (bulk == 1) {
        if (threadIdx.x == 0 && !p2p_wait_turn(ended, op.after, words, deadline)) stopped = 1;
        __syncthreads();
        if (stopped == 0 && !p2p_bulk(op, size, block, blocks, chunk, places, words, deadline) &&
            threadIdx.x == 0) {
          stopped = 1;
        }
      }
    }
    if (stopped == 0 && inline_data) {
      const unsigned long long lines = (size + 7) / 8 + 1;
      auto* out = static_cast<unsigned char*>(op.buffer);
      for (unsigned long long line = first == 0 ? stride : first; line < lines; line += stride) {
        unsigned long long data = 0;
        if (!ll_load(slot + line * 16, flag, words, deadline, op.peer, &data)) {
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
          const unsigned mode = inline_data ? 1u : bulk != 0 ? bulk : 2u;
          verdict[0] = mode;
          if (release.done != nullptr && (mode != 1 || op.direct == 0)) {
            reinterpret_cast<volatile unsigned*>(launches)[kP2pThreadWord] = 1;
          }
        }
        *reinterpret_cast<volatile unsigned long long*>(op.free + sequence % kP2pSlots) = sequence;
        reinterpret_cast<volatile unsigned*>(ended)[o] = 1;
      }
    }
  }
  // The launch's last block raises every op's counter: each block read its counter before.
  // Then the hand-off, where the launch has one (P2pRelease).
  __syncthreads();
  if (threadIdx.x == 0) {
    if (release.done != nullptr) {
      __threadfence_system();
    } else {
      __threadfence();
    }
    if (atomicAdd(launches, 1u) == gridDim.x - 1) {
      *launches = 0;
      for (int k = 0; k < count; ++k) {
        ended[k] = 0;
        if (ops.op[k].index == 0) {
          auto* counter = reinterpret_cast<volatile unsigned long long*>(ops.op[k].counter);
          *counter = *counter + ops.op[k].total;
        }
      }
      if (release.done != nullptr) {
        auto* thread = reinterpret_cast<volatile unsigned*>(launches) + kP2pThreadWord;
        const bool by_thread = *thread != 0;
        *thread = 0;
        if (!by_thread) {
          // Nobody reads this launch's verdicts: none stays for a later launch's thread.
          for (int k = 0; k < count; ++k) {
            if (ops.op[k].verdict != nullptr) {
              reinterpret_cast<volatile unsigned*>(ops.op[k].verdict)[0] = 0;
            }
          }
        }
        __threadfence_system();
        *reinterpret_cast<volatile unsigned*>(by_thread ? release.ready : release.done) =
            release.value;
      }
      __threadfence();
    }
  }
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_p2p_on_stream(P2pOps<kP2pMaxOps> ops, int count, volatile unsigned* words,
                        unsigned long long timeout_ns, unsigned* launches,
                        unsigned long long chunk, int places, P2pRelease release) {
  p2p_launch(ops, count, words, timeout_ns, launches, chunk, places, release);
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_p2p_on_stream_2(P2pOps<2> ops, int count, volatile unsigned* words,
                          unsigned long long timeout_ns, unsigned* launches,
                          unsigned long long chunk, int places, P2pRelease release) {
  p2p_launch(ops, count, words, timeout_ns, launches, chunk, places, release);
}
