// The resident one-shot kernel: part of kernels.cu's translation unit (after oneshot.cuh).
#pragma once

// ---- The resident one-shot kernel ----
//
// One block that stays on the GPU between one communicator's small calls (one block's worth of
// data, so the grid is the one ferry_allreduce_oneshot would have and members may mix the two),
// so a call costs no launch. The host writes the call into `box` (host memory), each field with
// the call's number (mod 256) in its top byte; lanes of the first warp read the fields side by
// side and take the call when every field carries the next number, so seeing the call and its
// arguments costs one round trip over the bus. The block runs it as block 0 of 1, then stores
// `done`. It leaves when no call came for `idle_ns` (so a cudaDeviceSynchronize of the
// application waits at most that long) or when words[0] is raised, and stores `exited` = `epoch`
// as its last act. The host launches it again for a call posted after that (impl/resident.cpp).
namespace {

constexpr int kMailboxFields = 5;  // out, in, count, shape (type | op << 8 | ring << 16), sequence
constexpr unsigned long long kFieldMask = (1ull << 56) - 1;

struct Mailbox {
  unsigned long long field[8];  // written by the host
  unsigned long long done;      // calls finished so far
  unsigned long long exited;    // the epoch of the last launch that has left
  unsigned long long spare[6];
};

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ferry_allreduce_resident(Mailbox* box, unsigned long long taken, unsigned long long epoch,
                             unsigned long long idle_ns, int members, int me,
                             unsigned long long slot_bytes, Areas areas, volatile unsigned* words) {
  __shared__ unsigned long long call[kMailboxFields];
  __shared__ int leave;
  const unsigned lane = threadIdx.x;
  for (;;) {
    if (lane < 32) {
      const unsigned long long want = (taken + 1) & 0xff;
      const unsigned long long since = now_ns();
      for (unsigned spins = 1;; ++spins) {
        const unsigned long long v = lane < kMailboxFields ? load_acquire(&box->field[lane]) : 0;
        if (__all_sync(0xffffffffu, lane >= kMailboxFields || v >> 56 == want)) {
          if (lane < kMailboxFields) call[lane] = v & kFieldMask;
          if (lane == 0) leave = 0;
          break;
        }
        if ((spins & 15) == 0) {
          int out = 0;
          if (lane == 0) out = words[0] != 0 || now_ns() - since > idle_ns;
          if (__shfl_sync(0xffffffffu, out, 0) != 0) {
            if (lane == 0) leave = 1;
            break;
          }
        }
      }
    }
    __syncthreads();
    if (leave != 0) break;
    const unsigned long long shape = call[3];
    oneshot_block<false>(
        reinterpret_cast<void*>(call[0]), reinterpret_cast<const void*>(call[1]), call[2],
        static_cast<int>(shape & 0xff), static_cast<int>(shape >> 8 & 0xff), members, me,
        static_cast<int>(shape >> 16 & 1), call[4], slot_bytes, areas, words, 0, 1);
    ++taken;
    // The block's results, then `done` (a release after the barrier covers every thread's).
    __syncthreads();
    if (lane == 0) store_release(&box->done, taken);
  }
  if (lane == 0) {
    __threadfence_system();
    store_release(&box->exited, epoch);
  }
}
