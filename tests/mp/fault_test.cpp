// Peer failure under `ferryrun --keep-going -n 3`: rank 2 is SIGKILLed while ranks 0 and 1 have
// operations pending with it; they must see kPeerFailed within a second on each of them, new
// operations with rank 2 must fail at once, and traffic between 0 and 1 must go on.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#if FERRY_HAVE_CUDA
#include "cuda/driver.hpp"
#endif

namespace {

int failures = 0;
void expect(bool ok, const char* what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "FAIL: %s\n", what);
  }
}

#if FERRY_HAVE_CUDA
// The driver with this rank's GPU (rank mod the GPU count) current, or null (and a SKIP line
// naming `what`) where there is none.
const ferry::cuda::Driver* bind_gpu(const ferry::Context& ctx, const char* what) {
  std::string why;
  const ferry::cuda::Driver* d = ferry::cuda::driver(&why);
  if (d == nullptr) {
    std::printf("rank %d: SKIP %s: %s\n", ctx.rank(), what, why.c_str());
    return nullptr;
  }
  CUdevice device;
  CUcontext context;
  d->cuDeviceGet(&device, ctx.rank() % d->device_count);
  d->cuDevicePrimaryCtxRetain(&context, device);
  d->cuCtxSetCurrent(context);
  return d;
}
#endif

}  // namespace

// Modes that end a rank around Context::init, or that need the Context to end before they check.
int around_init(const std::string& mode) {
  using Clock = std::chrono::steady_clock;
  const char* rank_text = std::getenv("FERRY_RANK");
  const int rank = rank_text != nullptr ? std::atoi(rank_text) : 0;
  if (mode == "exit-before-init" || mode == "late-before-init") {
    // Rank 1 exits (code 0) before it calls Context::init: the others' init fails at once,
    // naming it, instead of waiting FERRY_BOOTSTRAP_TIMEOUT for it. Late: it sleeps first, and
    // the others' FERRY_BOOTSTRAP_TIMEOUT ends their wait, naming whom they waited for.
    if (rank == 1 && mode == "late-before-init") ::sleep(3);
    if (rank == 1) return 0;
    const auto start = Clock::now();
    try {
      ferry::Context ctx = ferry::Context::init();
      std::printf("FAIL: rank %d: init succeeded without rank 1\n", rank);
      return 1;
    } catch (const ferry::Error& e) {
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      std::printf("rank %d: init failed after %.0f ms: %s\n", rank, ms, e.what());
      return 3;
    }
  }
  if (mode == "exit-unfinalized") {
    // Rank 1 joins, then exits with code 0 without ending its Context; the others see it gone,
    // and ferryrun must not call the job a success.
    ferry::Context ctx = ferry::Context::init();
    if (ctx.rank() == 1) std::exit(0);  // locals are not destroyed: ctx never finalizes
    int x = 0;
    const ferry::Status s = ctx.recv(&x, sizeof(x), 1, 5);
    std::printf("rank %d: saw rank 1 leave: %s\n", ctx.rank(), s.to_string().c_str());
    return s.code() == ferry::Code::kPeerFailed ? 0 : 1;
  }
  if (mode == "unreceived") {
    // Rank 0 sends rank 1 a rendezvous message and an eager one that rank 1 never receives; both
    // finalize. Finalize must not wait FERRY_FINALIZE_TIMEOUT for them: rank 1 tells rank 0 the
    // announced one will never be received, and that send ends with kCanceled.
    std::vector<char> big(1 << 20, 'u');
    ferry::Request large, small;
    const auto start = Clock::now();
    {
      ferry::Context ctx = ferry::Context::init();
      if (ctx.rank() == 0) {
        large = ctx.isend(big.data(), big.size(), 1, 7);
        small = ctx.isend(big.data(), 16, 1, 8);
      }
      (void)ctx.barrier();
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (rank != 0) {
      std::printf("rank %d: finalized after %.0f ms\n", rank, ms);
      return 0;
    }
    const ferry::Status s = large.wait();
    const bool told = s.code() == ferry::Code::kCanceled &&
                      s.message().find("finalized without a receive") != std::string::npos;
    std::printf("rank 0: %s after %.0f ms: %s\n", told ? "unreceived send ended" : "FAIL", ms,
                s.to_string().c_str());
    return told ? 0 : 1;
  }
  if (mode == "never-sent") {
    // Rank 1 sends rank 0 an eager and a rendezvous message, then ends its Context. Rank 0, which
    // waits until rank 1's notice is there, still receives both (they came before it), and a
    // receive of a message rank 1 never sent ends kCanceled instead of waiting while rank 1 waits
    // for it in finalize; so does a receive posted after, and a probe returns source -1.
    std::vector<char> big(1 << 20, 'n');  // outlives the Context, whose finalize still sends it
    ferry::Context ctx = ferry::Context::init();
    if (ctx.rank() == 1) {
      ferry::Request small = ctx.isend(big.data(), 8, 0, 1);
      ferry::Request large = ctx.isend(big.data(), big.size(), 0, 2);
      return 0;  // the Context ends here, the rendezvous send still waiting for rank 0
    }
    ::usleep(300000);
    std::vector<char> got(big.size(), 0);
    const ferry::Status a = ctx.recv(got.data(), 8, 1, 1);
    const ferry::Status b = ctx.recv(got.data(), got.size(), 1, 2);
    const bool data = a.is_ok() && b.is_ok() && got == big;
    const auto start = Clock::now();
    int x = 0;
    const ferry::Status c = ctx.recv(&x, sizeof(x), 1, 3);
    const ferry::Status d = ctx.irecv(&x, sizeof(x), 1, 4).wait();
    const ferry::MessageInfo probed = ctx.probe(1, 5);  // source -1: none can come
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    const bool ended = c.code() == ferry::Code::kCanceled && d.code() == ferry::Code::kCanceled &&
                       c.message().find("finalized") != std::string::npos && probed.source == -1;
    std::printf(
        "rank 0: what rank 1 sent before it finalized %s; a receive of what it never "
        "sent %s after %.0f ms: %s\n",
        data ? "received" : "LOST", ended ? "ended" : "FAIL", ms, c.to_string().c_str());
    return data && ended ? 0 : 1;
  }
  if (mode == "never-joins") {
    // After a barrier together, the last rank ends its Context while the others enter collectives
    // it never joins: a barrier and a small allreduce (through the node's shared area) and a
    // large one (by messages). Each ends with an error naming it instead of waiting while it
    // waits for them in finalize.
    ferry::Context ctx = ferry::Context::init();
    ferry::Communicator world = ctx.world();
    std::vector<std::int64_t> data(1 << 18, 1);
    if (!world.barrier().is_ok()) return 1;  // the area is set up
    const int leaver = ctx.size() - 1;
    if (ctx.rank() == leaver) return 0;
    ::usleep(300000);
    const auto start = Clock::now();
    auto ms = [&start] {
      return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    };
    const ferry::Status a = world.barrier();
    const double a_ms = ms();
    const ferry::Status b = world.allreduce(data.data(), data.data(), 1, ferry::DataType::kInt64,
                                            ferry::ReduceOp::kSum);
    const double b_ms = ms();
    const ferry::Status c = world.allreduce(data.data(), data.data(), data.size(),
                                            ferry::DataType::kInt64, ferry::ReduceOp::kSum);
    const std::string name = "rank " + std::to_string(leaver);
    bool named = true;
    for (auto [s, at] : {std::pair{&a, a_ms}, std::pair{&b, b_ms}, std::pair{&c, ms()}}) {
      std::printf("rank %d at %.0f ms: %s\n", ctx.rank(), at, s->to_string().c_str());
      named = named && !s->is_ok() && s->message().find(name) != std::string::npos &&
              s->message().find("finalized") != std::string::npos;
    }
    std::printf("rank %d: collectives rank %d never joined %s after %.0f ms\n", ctx.rank(), leaver,
                named ? "ended" : "FAIL", ms());
    return named ? 0 : 1;
  }
  return -1;
}

int main(int argc, char** argv) {
  using Clock = std::chrono::steady_clock;
  if (argc > 1) {
    if (const int rc = around_init(argv[1]); rc >= 0) return rc;
  }
  ferry::Context ctx = ferry::Context::init();
#if FERRY_HAVE_CUDA
  if (argc > 1 && std::string(argv[1]) == "device") {
    // On a GPU machine: rank 2 sends 256 MiB of device memory to rank 0 and is killed in the
    // middle (FERRY_TEST_CRASH_AT=mid-pipeline: after its first staged chunk, or with the
    // receiver's direct receive posted over ofi). Rank 0's receive into device memory must fail
    // with kPeerFailed, and its device buffer must be usable afterwards (no copy still writing).
    const ferry::cuda::Driver* d = bind_gpu(ctx, "device kill");
    if (d == nullptr) return 0;
    const std::size_t bytes = std::size_t{256} << 20;
    CUdeviceptr buffer = 0;
    expect(d->cuMemAlloc(&buffer, bytes) == CUDA_SUCCESS, "cuMemAlloc");
    d->cuMemsetD8(buffer, 0x11, bytes);
    d->cuCtxSynchronize();
    if (ctx.rank() == 2) ctx.send(reinterpret_cast<void*>(buffer), bytes, 0, 6);
    if (ctx.rank() == 0) {
      const auto start = Clock::now();
      ferry::Status s = ctx.recv(reinterpret_cast<void*>(buffer), bytes, 2, 6);
      const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
      expect(s.code() == ferry::Code::kPeerFailed, "a device receive cut mid-transfer fails");
      expect(d->cuMemsetD8(buffer, 0x22, bytes) == CUDA_SUCCESS &&
                 d->cuCtxSynchronize() == CUDA_SUCCESS,
             "the device buffer is usable afterwards");
      std::printf("rank 0: device receive failed after %.1f ms: %s\n", ms, s.to_string().c_str());
    }
    d->cuMemFree(buffer);
    std::printf("rank %d: device kill, %d failures\n", ctx.rank(), failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "device-comm-outlives") {
    // On a GPU machine: a world Communicator that ran small device allreduces (the one-shot
    // kernel, and the resident one for blocking calls, where FERRY_COLL_DEVICE_SHARED_GPU=1 lets
    // ranks share a GPU) is kept after its Context is destroyed. The destruction must end those
    // kernels and free their state without a hang; the Communicator then fails its calls with
    // kInvalidArgument, and dropping it touches nothing of the Context.
    const ferry::cuda::Driver* d = bind_gpu(ctx, "device communicator outliving its context");
    if (d == nullptr) return 0;
    const int rank = ctx.rank(), size = ctx.size();
    CUdeviceptr buffer = 0;
    expect(d->cuMemAlloc(&buffer, 4096) == CUDA_SUCCESS, "cuMemAlloc");
    auto* data = reinterpret_cast<void*>(buffer);
    ferry::Communicator world;
    const auto start = Clock::now();
    {
      ferry::Context owner = std::move(ctx);
      world = owner.world();
      for (int i = 0; i < 50; ++i) {
        float values[2] = {static_cast<float>(rank + 1), static_cast<float>(i)};
        d->cuMemcpy(buffer, reinterpret_cast<CUdeviceptr>(values), sizeof(values));
        d->cuCtxSynchronize();  // a copy from pageable memory may return before it lands
        ferry::Status s =
            world.allreduce(data, data, 2, ferry::DataType::kFloat32, ferry::ReduceOp::kSum);
        expect(s.is_ok(), "a device allreduce before the context goes");
        d->cuMemcpy(reinterpret_cast<CUdeviceptr>(values), buffer, sizeof(values));
        expect(values[0] == static_cast<float>(size * (size + 1) / 2) &&
                   values[1] == static_cast<float>(i * size),
               "the device allreduce's sums");
      }
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    ferry::Status after =
        world.allreduce(data, data, 2, ferry::DataType::kFloat32, ferry::ReduceOp::kSum);
    expect(after.code() == ferry::Code::kInvalidArgument,
           "an allreduce after the context went fails with kInvalidArgument");
    world = ferry::Communicator();
    expect(
        d->cuMemsetD8(buffer, 0x22, 4096) == CUDA_SUCCESS && d->cuCtxSynchronize() == CUDA_SUCCESS,
        "the GPU is free afterwards (no kernel left waiting)");
    d->cuMemFree(buffer);
    std::printf(
        "rank %d: device communicator outlived its context (%.0f ms with it): %s, "
        "%d failures\n",
        rank, ms, after.to_string().c_str(), failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "coll-death-device") {
    // On a GPU machine: the last rank dies while the others run device allreduces back to back,
    // of 2 floats (the one-shot kernel, which waits on the GPU for every member's flags), or of
    // argv[2] MiB (between two GPUs from 16 MiB the two-shot kernel, in rounds past 32 MiB, whose
    // blocks wait on the GPU for the other's flags twice a round): every survivor's allreduce
    // fails with kPeerFailed and its GPU is free again.
    const ferry::cuda::Driver* d = bind_gpu(ctx, "device collective kill");
    if (d == nullptr) return 0;
    const std::size_t mib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 0;
    const std::size_t bytes = mib == 0 ? 4096 : mib << 20;
    const std::size_t count = mib == 0 ? 2 : bytes / sizeof(float);
    CUdeviceptr buffer = 0;
    expect(d->cuMemAlloc(&buffer, bytes) == CUDA_SUCCESS, "cuMemAlloc");
    d->cuMemsetD8(buffer, 0, bytes);
    d->cuCtxSynchronize();
    ferry::Communicator world = ctx.world();
    const int victim = ctx.size() - 1;
    auto* data = reinterpret_cast<void*>(buffer);
    ferry::Status s;
    long calls = 0;
    const auto start = Clock::now();
    while (s.is_ok() && Clock::now() - start < std::chrono::seconds(20)) {
      if (ctx.rank() == victim && Clock::now() - start > std::chrono::milliseconds(300)) {
        ::kill(::getpid(), SIGKILL);
      }
      s = world.allreduce(data, data, count, ferry::DataType::kFloat32, ferry::ReduceOp::kSum);
      ++calls;
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    expect(s.code() == ferry::Code::kPeerFailed, "the device allreduce fails with kPeerFailed");
    expect(
        d->cuMemsetD8(buffer, 0x22, bytes) == CUDA_SUCCESS && d->cuCtxSynchronize() == CUDA_SUCCESS,
        "the GPU is free afterwards (no kernel left waiting)");
    d->cuMemFree(buffer);
    std::printf(
        "rank %d: device allreduces of %zu B without rank %d: %ld calls, then after %.0f ms: "
        "%s, %d failures\n",
        ctx.rank(), count * sizeof(float), victim, calls, ms, s.to_string().c_str(), failures);
    return failures == 0 ? 0 : 1;
  }
#endif
  if (argc > 1 && std::string(argv[1]) == "pipeline") {
    // Rank 2 dies after the first fragment of a 16 MiB pipelined message to rank 0
    // (FERRY_TEST_CRASH_AT=mid-pipeline, FERRY_SHM_CMA=0): rank 0's receive must fail.
    std::vector<char> big(16 << 20, 'p');
    if (ctx.rank() == 2) ctx.send(big.data(), big.size(), 0, 6);
    if (ctx.rank() == 0) {
      ferry::Status s = ctx.recv(big.data(), big.size(), 2, 6);
      expect(s.code() == ferry::Code::kPeerFailed, "a receive cut mid-pipeline fails");
    }
    std::printf("rank %d: mid-pipeline kill, %d failures\n", ctx.rank(), failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "hole") {
    // Rank 2 dies between claiming an element of rank 0's FIFO and publishing it
    // (FERRY_TEST_CRASH_AT=mid-claim). Rank 1's later message sits behind that hole: rank 0 must
    // step over it once rank 2 is known dead, not wait forever.
    int x = 0;
    if (ctx.rank() == 2) ctx.send(&x, sizeof(x), 0, 10);
    if (ctx.rank() == 1) {
      ::usleep(300000);  // after rank 2's claim
      x = 11;
      expect(ctx.send(&x, sizeof(x), 0, 11).is_ok(), "a send behind the hole is accepted");
    }
    if (ctx.rank() == 0) {
      ferry::Request r = ctx.irecv(&x, sizeof(x), 1, 11);
      expect(r.wait_for(10).is_ok() && x == 11, "the message behind the hole arrives");
    }
    std::printf("rank %d: hole left by a dead producer, %d failures\n", ctx.rank(), failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "bounce-to-dead") {
    // Rank 0 sends FERRY_SHM_BOUNCE_COUNT messages too large for a FIFO element to rank 1, which
    // never reads them and dies: each holds one of rank 0's bounce buffers. Once rank 1 is known
    // dead they must be rank 0's again, or its next such message, to rank 2, waits for ever.
    const char* count_text = std::getenv("FERRY_SHM_BOUNCE_COUNT");
    const int count = count_text != nullptr ? std::atoi(count_text) : 64;
    std::vector<char> out(1024, 'b'), in(1024, 0);
    if (ctx.rank() == 1) {
      ::usleep(300000);  // rank 0's messages are in our FIFO by now, unread
      ::kill(::getpid(), SIGKILL);
    }
    if (ctx.rank() == 0) {
      std::vector<ferry::Request> sends;
      for (int i = 0; i < count; ++i) sends.push_back(ctx.isend(out.data(), out.size(), 1, 20));
      ferry::Status gone = ctx.recv(in.data(), in.size(), 1, 21);
      expect(gone.code() == ferry::Code::kPeerFailed, "rank 1's death is seen");
      for (ferry::Request& r : sends) {
        ferry::Status s = r.wait_for(5);
        expect(s.is_ok() || s.code() == ferry::Code::kPeerFailed, "a send to rank 1 ends");
      }
      ferry::Status s = ctx.isend(out.data(), out.size(), 2, 22).wait_for(5);
      expect(s.is_ok(), "a message to rank 2 goes after rank 1's death");
      if (!s.is_ok()) std::fprintf(stderr, "send to rank 2: %s\n", s.to_string().c_str());
    }
    if (ctx.rank() == 2) {
      ferry::Status s = ctx.irecv(in.data(), in.size(), 0, 22).wait_for(10);
      expect(s.is_ok() && in == out, "rank 2 receives it");
    }
    std::printf("rank %d: bounce buffers back from a dead receiver, %d failures\n", ctx.rank(),
                failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "stagefail") {
    // FERRY_TEST_HOST_STAGING=1 FERRY_TEST_STAGE_OPEN_FAIL=1 FERRY_CUDA_STAGE_CHUNK=64k (more
    // chunks than slots, so the send waits on the receiver) FERRY_TIMEOUT=10: rank 1 cannot map
    // rank 0's staging ring. Its receive fails, and rank 0's send learns of it and fails too.
    std::vector<char> big(1 << 20, 's');
    if (ctx.rank() == 0) {
      ferry::Status s = ctx.send(big.data(), big.size(), 1, 13);
      expect(s.code() == ferry::Code::kIoError, "the send fails when its receiver cannot stage");
      if (s.code() != ferry::Code::kIoError)
        std::fprintf(stderr, "send: %s\n", s.to_string().c_str());
    }
    if (ctx.rank() == 1) {
      ferry::Status s = ctx.recv(big.data(), big.size(), 0, 13);
      expect(s.code() == ferry::Code::kIoError &&
                 s.message().find("STAGE_OPEN_FAIL") != std::string::npos,
             "the receive fails saying why");
      if (!s.is_ok()) std::fprintf(stderr, "recv: %s\n", s.to_string().c_str());
    }
    ctx.barrier();
    std::printf("rank %d: staging refused, %d failures\n", ctx.rank(), failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 2 && std::string(argv[1]) == "lossy") {
    // Ranks 0 and 1 ping-pong 300 messages (8 B, and every tenth 8 KiB, from a bounce buffer)
    // over ofi while the transport drops one message to each peer (FERRY_TEST_OFI_DROP=N),
    // as a provider loses one when a connection goes. `recover`: the copy sent again fills the
    // gap, every message arrives, in order. `fail` (FERRY_TEST_OFI_DROP_COPIES=1, the copies are
    // lost too): the loss fails the link on both sides, naming it.
    const bool recover = std::string(argv[2]) == "recover";
    ferry::Status status;
    int rounds = 0;
    if (ctx.rank() < 2) {
      const int other = 1 - ctx.rank();
      std::vector<unsigned char> out(8192), in(8192);
      for (; rounds < 300; ++rounds) {
        const std::size_t size = rounds % 10 == 9 ? out.size() : 8;
        std::fill(out.begin(), out.end(), static_cast<unsigned char>(rounds));
        status = ctx.rank() == 0 ? ctx.send(out.data(), size, other, rounds)
                                 : ctx.recv(in.data(), size, other, rounds);
        if (status.is_ok()) {
          status = ctx.rank() == 0 ? ctx.recv(in.data(), size, other, rounds)
                                   : ctx.send(in.data(), size, other, rounds);
        }
        if (!status.is_ok()) break;
        expect(
            std::all_of(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(size),
                        [&](unsigned char c) { return c == static_cast<unsigned char>(rounds); }),
            "every message arrives, in order, intact");
      }
      if (recover) {
        expect(status.is_ok() && rounds == 300, "the lost message was sent again");
      } else {
        expect(status.code() == ferry::Code::kPeerFailed, "the loss fails the link");
        expect(status.message().find("never arrived") != std::string::npos ||
                   status.message().find("gave up on the link") != std::string::npos,
               "and says that a message was lost");
      }
      if (!status.is_ok())
        std::fprintf(stderr, "rank %d: %s\n", ctx.rank(), status.to_string().c_str());
    }
    std::printf("rank %d: lossy link, %d round trips, %d failures\n", ctx.rank(), rounds, failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "withdraw") {
    // FERRY_TIMEOUT=0.5 FERRY_SHM_CMA_THRESHOLD=0 FERRY_TEST_GET_DELAY=1: rank 1 matches rank 0's
    // 4 MiB rendezvous at once but reads it (CMA) only after rank 0's send has timed out and its
    // buffer has been overwritten. Rank 1 must not accept what it read.
    std::vector<char> big(4 << 20, 'a');
    if (ctx.rank() == 0) {
      expect(ctx.send(big.data(), big.size(), 1, 12).code() == ferry::Code::kTimeout,
             "the send times out while the receiver is slow");
      std::fill(big.begin(), big.end(), 'z');  // the caller reuses its buffer at once
    }
    if (ctx.rank() == 1) {
      const auto start = std::chrono::steady_clock::now();
      ferry::Status s = ctx.recv(big.data(), big.size(), 0, 12);
      const double took =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      expect(s.code() == ferry::Code::kCanceled,
             "a receive that read a withdrawn send's buffer reports kCanceled, not the data");
      if (s.code() != ferry::Code::kCanceled)
        std::fprintf(stderr, "got: %s\n", s.to_string().c_str());
      // It ends when the sender's withdrawal arrives (the read starts after FERRY_TEST_GET_DELAY,
      // 1 s): not after a wait to see whether the sender died (over ofi 2.2 s more before).
      expect(took < 1.8, "the receive ends as soon as the withdrawal is known");
      if (took >= 1.8) std::fprintf(stderr, "rank 1: the receive took %.2f s\n", took);
    }
    ctx.barrier();
    std::printf("rank %d: withdrawn while read, %d failures\n", ctx.rank(), failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "unreachable") {
    // Run with FERRY_TRANSPORTS=self: no transport reaches the other ranks. A send to them and
    // a receive from them fail at once, saying why; nothing waits for a rank that cannot send.
    int x = 0;
    const int other = 1 - ctx.rank();
    const auto t0 = Clock::now();
    ferry::Status r = ctx.recv(&x, sizeof(x), other, 1);
    ferry::Status s = ctx.send(&x, sizeof(x), other, 1);
    expect(r.code() == ferry::Code::kUnsupported, "a receive from an unreachable rank fails");
    expect(s.code() == ferry::Code::kUnsupported, "a send to an unreachable rank fails");
    expect(!r.message().empty(), "and says why");
    ferry::Status any = ctx.recv(&x, sizeof(x), ferry::kAnySource, 1);
    expect(any.code() == ferry::Code::kUnsupported, "a receive from any source fails");
    expect(any.message().find("1 unreachable") != std::string::npos, "and says why");
    expect(ctx.probe(other, 1).source == -1, "a probe of the unreachable rank returns");
    expect(std::chrono::duration<double>(Clock::now() - t0).count() < 1, "at once");
    ctx.barrier();
    std::printf("rank %d: unreachable, %d failures\n", ctx.rank(), failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "polled-death") {
    // The application's own loop (arm, poll on event_fd with a 10 ms limit, progress): rank 1
    // dies; rank 0's receive from it must fail within a second. A death rings no descriptor, and
    // progress() alone looked for dead peers every 4096 calls: 41 s at 10 ms a call.
    int value = 0;
    ctx.barrier();
    if (ctx.rank() == 1) ::kill(::getpid(), SIGKILL);
    ferry::Request r = ctx.irecv(&value, sizeof(value), 1, 12);
    const auto start = Clock::now();
    while (!r.test() && Clock::now() - start < std::chrono::seconds(60)) {
      if (ctx.arm()) {
        pollfd fds[] = {{ctx.event_fd(), POLLIN, 0}};
        ::poll(fds, 1, 10);
      }
      ctx.progress();
    }
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    expect(r.status().code() == ferry::Code::kPeerFailed, "the polled receive fails");
    expect(ms < 1000, "within a second of the death");
    std::printf("rank %d: polled receive failed after %.0f ms: %s, %d failures\n", ctx.rank(), ms,
                r.status().to_string().c_str(), failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "any-source") {
    // Ranks 2 and then 1 die (SIGKILL) without sending. Rank 0's receive from any source, posted
    // before, stays posted while rank 1 lives (it could still match it) and fails once no other
    // rank is left; later ones fail at once, a probe returns, and a message rank 0 sends itself
    // is received by naming rank 0.
    std::vector<char> in(64);
    ferry::Request any = ctx.irecv(in.data(), in.size(), ferry::kAnySource, 9);
    ctx.barrier();
    if (ctx.rank() == 2) ::kill(::getpid(), SIGKILL);
    if (ctx.rank() == 1) {
      ::usleep(1000000);
      ::kill(::getpid(), SIGKILL);
    }
    const auto start = Clock::now();
    while (Clock::now() - start < std::chrono::milliseconds(300)) ctx.progress();
    expect(!any.test(), "the receive from any source stays posted while rank 1 lives");
    ferry::Status s = any.wait_for(10);
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    expect(s.code() == ferry::Code::kPeerFailed, "it fails with kPeerFailed once none is left");
    expect(s.message().find("2 failed") != std::string::npos, "naming how many failed");
    expect(ms < 5000, "within seconds of rank 1's death");
    const auto t0 = Clock::now();
    ferry::Status later = ctx.recv(in.data(), in.size(), ferry::kAnySource, 10);
    expect(later.code() == ferry::Code::kPeerFailed, "a later one fails");
    expect(ctx.probe(ferry::kAnySource, 10).source == -1, "a probe of any source returns");
    expect(ctx.probe(1, 10).source == -1, "a probe of a dead rank returns");
    expect(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() < 100, "at once");
    int value = 42, got = 0;
    ferry::Request self = ctx.isend(&value, sizeof(value), 0, 11);
    expect(ctx.recv(&got, sizeof(got), 0, 11).is_ok() && got == 42 && self.wait().is_ok(),
           "a message to itself, received by naming itself");
    std::printf("rank %d: any source without the others after %.0f ms: %s, %d failures\n",
                ctx.rank(), ms, s.to_string().c_str(), failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "rma-death") {
    // Rank 2 registers a window, hands out its key, and dies without ever applying what ranks 0
    // and 1 start on it: their atomic fails with kPeerFailed (not a hang), as do their put and
    // get where those need rank 2 (they do not on its node with CMA), flush says so, new
    // operations fail at once, and one-sided traffic between 0 and 1 goes on.
    std::vector<std::uint64_t> window(1 << 17, 0);  // 1 MiB
    ferry::MemoryRegion region;
    expect(ctx.register_memory(window.data(), window.size() * 8, &region).is_ok(), "register");
    const std::vector<std::byte> mine = region.remote_key();
    std::vector<std::byte> all(mine.size() * 3);
    expect(ctx.world()
               .allgather(mine.data(), all.data(), mine.size(), ferry::DataType::kUint8)
               .is_ok(),
           "keys exchanged");
    std::vector<ferry::RemoteKey> keys(3);
    for (int r = 0; r < 3; ++r) {
      expect(ferry::RemoteKey::unpack(
                 std::span<const std::byte>(all.data() + r * mine.size(), mine.size()),
                 &keys[static_cast<std::size_t>(r)])
                 .is_ok(),
             "key unpacked");
    }
    // While rank 2 lives, ranks 0 and 1 put to and get from its window twice: over ofi the
    // second time goes by the provider's own one-sided calls (rank 2 granted the key), which a
    // death then fails as the provider sees it (a canceled write), to be reported as kPeerFailed.
    {
      std::vector<std::uint64_t> warm(512, 3);
      for (int pass = 0; pass < 2 && ctx.rank() != 2; ++pass) {
        expect(ctx.iput(warm.data(), warm.size() * 8, keys[2], 0).wait().is_ok(), "warm-up put");
        expect(ctx.iget(warm.data(), warm.size() * 8, keys[2], 0).wait().is_ok(), "warm-up get");
      }
      expect(ctx.barrier().is_ok(), "barrier after the warm-up");
    }
    // Rank 2 says it has stopped calling ferry (a small send goes straight into the FIFO, no
    // progress made), so nothing the others start after hearing it is ever applied; any ferry
    // call of rank 2 would apply them (its allgather can still be running when the others
    // finish theirs).
    int token = 0;
    if (ctx.rank() == 2) {
      ferry::Request a = ctx.isend(&token, sizeof(token), 0, 20);
      ferry::Request b = ctx.isend(&token, sizeof(token), 1, 20);
      ::usleep(300000);
      ::kill(::getpid(), SIGKILL);
    }
    // (kPeerFailed instead where rank 2's note could not leave at once: then all fails early.)
    ferry::Status heard = ctx.recv(&token, sizeof(token), 2, 20);
    expect(heard.is_ok() || heard.code() == ferry::Code::kPeerFailed, "rank 2's note");
    std::vector<std::uint64_t> data(1 << 17, 7);
    std::uint64_t old = 0;
    const auto t0 = Clock::now();
    ferry::Request put = ctx.iput(data.data(), data.size() * 8, keys[2], 0);
    ferry::Request get = ctx.iget(data.data(), 4096, keys[2], 0);
    ferry::Request add = ctx.iatomic(ferry::AtomicOp::kAdd, 8, keys[2], 0, 1, &old);
    // A put or get on its registered memory is done without it where it shares this node and CMA
    // is allowed (it is still alive when they start); else it needs rank 2 and fails.
    const ferry::Code put_code = put.wait().code(), get_code = get.wait().code();
    expect(put_code == ferry::Code::kPeerFailed || put_code == ferry::Code::kOk,
           "a put to the dead rank fails, or was done before it died");
    expect(get_code == ferry::Code::kPeerFailed || get_code == ferry::Code::kOk,
           "a get from it fails, or was done before it died");
    expect(add.wait().code() == ferry::Code::kPeerFailed, "an atomic on it fails");
    expect(std::chrono::duration<double>(Clock::now() - t0).count() < 20, "within 20 s");
    expect(ctx.flush(2).code() == ferry::Code::kPeerFailed, "flush towards it says so");
    expect(ctx.iput(data.data(), 8, keys[2], 0).wait().code() == ferry::Code::kPeerFailed,
           "a new put fails at once");
    // Ranks 0 and 1 go on: each puts into the other's window and adds to its first word.
    const int other = 1 - ctx.rank();
    const auto& key = keys[static_cast<std::size_t>(other)];
    expect(ctx.iput(data.data() + 1, 8, key, 8).wait().is_ok(), "a put to a live rank");
    expect(ctx.iatomic(ferry::AtomicOp::kAdd, 8, key, 0, 5).wait().is_ok(), "and an atomic");
    expect(ctx.flush_all().is_ok(), "flush_all: nothing failed since the last flush");
    expect(ctx.send(&token, sizeof(token), other, 21).is_ok() &&
               ctx.recv(&token, sizeof(token), other, 21).is_ok(),
           "handshake");
    expect(window[0] == 5 && window[1] == 7, "the live rank's put and atomic arrived");
    std::printf("rank %d: one-sided without rank 2, %d failures\n", ctx.rank(), failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "timeout") {
    // Run with FERRY_TIMEOUT=0.5. Rank 0 sends a rendezvous message rank 1 never receives, and
    // waits for one rank 1 never sends: both give up in time, and the announcement is withdrawn.
    std::vector<char> big(4 << 20, 't');
    int x = 0;
    if (ctx.rank() == 0) {
      auto t0 = Clock::now();
      ferry::Status s = ctx.send(big.data(), big.size(), 1, 8);
      double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      expect(s.code() == ferry::Code::kTimeout, "an unmatched blocking send times out");
      expect(waited >= 0.45 && waited < 5, "after about FERRY_TIMEOUT");
      expect(ctx.recv(&x, sizeof(x), 1, 9).code() == ferry::Code::kTimeout,
             "a receive nobody sends to times out");
      expect(ctx.probe(1, 9).source == -1, "a probe with nothing to find times out");
    }
    ctx.barrier();
    if (ctx.rank() == 1) {
      expect(!ctx.iprobe(0, 8).has_value(), "the abandoned announcement was withdrawn");
    }
    std::printf("rank %d: timeouts, %d failures\n", ctx.rank(), failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "late-death") {
    // Rank 1 closes its connections (the store sees it leave) and is killed 0.5 s later; the
    // others' barrier fails at once and they exit 1 before rank 1's death is reaped. ferryrun
    // must still name rank 1's signal as the job's cause.
    if (ctx.rank() == 1) {
      ::close_range(3, ~0U, 0);
      ::usleep(500000);
      ::kill(::getpid(), SIGKILL);
    }
    ferry::Status s = ctx.barrier();
    std::printf("rank %d: barrier without rank 1: %s\n", ctx.rank(), s.to_string().c_str());
    return s.is_ok() ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "exit-after-send") {
    // Rank 2 dies at once, so the others' finalize barrier fails at once. Rank 1 sends rank 0 an
    // eager message, its first to it, and ends; rank 0 makes no call for 700 ms, by when rank 1
    // is usually gone. The message must still arrive: rank 1's finalize may not close a
    // transport that still holds it, and rank 0 may not drop what a peer sent before it exited.
    if (ctx.rank() == 2) ::kill(::getpid(), SIGKILL);
    int value = 0;
    ::usleep(200000);
    if (ctx.rank() == 1) {
      value = 42;
      expect(ctx.send(&value, sizeof(value), 0, 7).is_ok(), "the send");
    } else {
      ::usleep(500000);
      ferry::Status s = ctx.irecv(&value, sizeof(value), 1, 7).wait_for(20);
      expect(s.is_ok(), ("the message from the rank that ended: " + s.to_string()).c_str());
      expect(value == 42, "its content");
    }
    std::printf("rank %d: delivered before finalize, %d failures\n", ctx.rank(), failures);
    std::fflush(stdout);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "coll-death") {
    // The last rank dies while the others are in collectives with it (a ring allreduce, a
    // barrier): every survivor's collective fails with kPeerFailed, also on members whose own
    // neighbours are alive, and none waits for ever.
    ferry::Communicator world = ctx.world();
    const int victim = ctx.size() - 1;
    if (ctx.rank() == victim) {
      ::usleep(200000);
      ::kill(::getpid(), SIGKILL);
    }
    std::vector<float> in(1 << 20, 1.0f), out(in.size());
    const auto start = Clock::now();
    ferry::Status big = world.allreduce(in.data(), out.data(), in.size(), ferry::DataType::kFloat32,
                                        ferry::ReduceOp::kSum);
    ferry::Status barrier = world.barrier();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    expect(big.code() == ferry::Code::kPeerFailed, "the allreduce fails with kPeerFailed");
    expect(barrier.code() == ferry::Code::kPeerFailed, "the barrier fails with kPeerFailed");
    expect(ms < 20000, "within 20 s");
    std::printf("rank %d: collectives without rank %d after %.0f ms: %s / %s, %d failures\n",
                ctx.rank(), victim, ms, big.to_string().c_str(), barrier.to_string().c_str(),
                failures);
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && std::string(argv[1]) == "launcher-gone") {
    // The launcher is SIGKILLed while the ranks sleep; their next barrier must fail (or time out
    // under FERRY_BOOTSTRAP_TIMEOUT), not hang. Each rank writes its verdict to a file, since its
    // stdout went with the launcher.
    const char* out = std::getenv("FERRY_TEST_OUT");
    ::sleep(2);
    const auto start = Clock::now();
    ferry::Status s = ctx.barrier();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (out != nullptr) {
      std::string path = std::string(out) + "." + std::to_string(ctx.rank());
      if (FILE* f = std::fopen(path.c_str(), "w")) {
        std::fprintf(f, "rank %d: barrier after the launcher died: %s after %.0f ms\n", ctx.rank(),
                     s.is_ok() ? "ok" : s.to_string().c_str(), ms);
        std::fclose(f);
      }
    }
    ::_exit(s.is_ok() ? 0 : 3);  // finalize would try the launcher again
  }
  if (argc > 1 && std::string(argv[1]) == "segfault") {
    // Rank 1 crashes (SIGSEGV) once ferry is up, with libfabric loaded: it must die by its
    // signal, not by a provider's handler that writes a backtrace file and exits 1.
    if (ctx.rank() == 1) std::raise(SIGSEGV);
    int x = 0;
    ctx.recv(&x, sizeof(x), 1, 99);
    return 0;
  }
  if (argc > 1 && std::string(argv[1]) == "abort") {
    // Rank 1 ends the job while the others wait for a message that never comes.
    if (ctx.rank() == 1) ctx.abort(7, "fault_test asked for it");
    int x = 0;
    ctx.recv(&x, sizeof(x), 1, 99);
    return 1;
  }
  if (ctx.size() != 3) {
    std::fprintf(stderr, "fault_test needs 3 ranks\n");
    return 2;
  }
  const int victim = 2;
  if (ctx.rank() == victim) {
    // Announce a large message (rendezvous) to rank 0, then die before it can be read.
    std::vector<char> big(1 << 20, 'v');
    ferry::Request r = ctx.isend(big.data(), big.size(), 0, 5);
    ctx.barrier();
    ::usleep(100000);
    ::kill(::getpid(), SIGKILL);
  }
  // Pending with the victim: a receive naming it, a rendezvous send to it, an eager send to it
  // queued behind nothing, and the victim's rendezvous message to rank 0 (unexpected).
  std::vector<char> big(1 << 20, 'a'), in(1 << 20);
  int small = 0;
  ferry::Request from_victim = ctx.irecv(&small, sizeof(small), victim, 1);
  ferry::Request to_victim = ctx.isend(big.data(), big.size(), victim, 2);
  ferry::Request any = ctx.irecv(&small, sizeof(small), ferry::kAnySource, 3);
  ctx.barrier();
  const auto start = Clock::now();
  ferry::Status s1 = from_victim.wait();
  ferry::Status s2 = to_victim.wait();
  const double detect_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  expect(s1.code() == ferry::Code::kPeerFailed, "receive from the dead rank fails");
  expect(s2.code() == ferry::Code::kPeerFailed, "rendezvous send to the dead rank fails");
  expect(s1.message().find("rank 2") != std::string::npos, "the error names rank 2");
  expect(detect_ms < 1000, "detected within a second of the kill");
  if (ctx.rank() == 0) {
    ferry::Status s3 = ctx.recv(in.data(), in.size(), victim, 5);
    expect(s3.code() == ferry::Code::kPeerFailed, "its announced rendezvous message fails");
  }
  const auto t0 = Clock::now();
  ferry::Status s4 = ctx.send(&small, sizeof(small), victim, 4);
  expect(s4.code() == ferry::Code::kPeerFailed, "a new send to it fails");
  expect(std::chrono::duration<double, std::milli>(Clock::now() - t0).count() < 10,
         "a new send to it fails at once");
  // Rank 0 and 1 go on: an exchange on the wildcard receive posted before the failure.
  int value = 100 + ctx.rank();
  expect(ctx.send(&value, sizeof(value), 1 - ctx.rank(), 3).is_ok(), "send to a live rank");
  expect(any.wait().is_ok() && small == 100 + (1 - ctx.rank()), "wildcard receive still works");
  std::printf("rank %d: peer failure seen in %.1f ms, %d failures\n", ctx.rank(), detect_ms,
              failures);
  std::fflush(stdout);
  return failures == 0 ? 0 : 1;
}
