// The stream-ordered forms in a job of one process, as far as a machine without a GPU can take
// them: arguments refused where the call is made, groups, and the reasons a stream call cannot
// run here (no CUDA, FERRY_THREADS=single), each with nothing enqueued and no asynchronous error
// left behind. tests/mp/gpu_stream_test.cpp runs them on GPUs.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry {
namespace {

bool mentions(const Status& s, const std::string& text) {
  return s.message().find(text) != std::string::npos;
}

TEST(StreamApi, ArgumentsAreRefusedAtTheCall) {
  Context ctx = Context::init();
  Communicator world = ctx.world();
  std::vector<float> buffer(16);
  const CudaStream stream = kLegacyStream;
  Status s = world.broadcast(buffer.data(), 4, DataType::kFloat32, 1, stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(mentions(s, "root 1")) << s.to_string();
  s = world.reduce(buffer.data(), buffer.data(), 4, DataType::kFloat32, ReduceOp::kSum, -1, stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = world.allreduce(buffer.data(), buffer.data(), 4, DataType::kFloat32, ReduceOp::kBitXor,
                      stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  s = world.allgather(nullptr, buffer.data(), 4, DataType::kFloat32, stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(mentions(s, "null buffer")) << s.to_string();
  s = world.allreduce(buffer.data(), buffer.data(), std::size_t{1} << 62, DataType::kFloat64,
                      ReduceOp::kSum, stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(mentions(s, "too many")) << s.to_string();
  s = world.send(buffer.data(), 8, 1, stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(mentions(s, "member 1 is not in [0, 1)")) << s.to_string();
  s = world.recv(nullptr, 8, 0, stream);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(
      Communicator()
          .allreduce(buffer.data(), buffer.data(), 4, DataType::kFloat32, ReduceOp::kSum, stream)
          .code(),
      Code::kInvalidArgument);
  EXPECT_TRUE(ctx.async_error().is_ok());
}

// A call that could run on a GPU machine says here why it cannot (this process has no CUDA, or
// no current CUDA context for the default stream), and leaves no asynchronous error.
TEST(StreamApi, WithoutAGpuACallSaysWhy) {
  Context ctx = Context::init();
  Communicator world = ctx.world();
  std::vector<float> buffer(16, 1.0f);
  for (CudaStream stream : {CudaStream{nullptr}, kLegacyStream, kPerThreadStream}) {
    Status s = world.allreduce(buffer.data(), buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum,
                               stream);
    EXPECT_FALSE(s.is_ok());
    EXPECT_TRUE(mentions(s, "CUDA")) << s.to_string();
    EXPECT_TRUE(mentions(s, "allreduce")) << s.to_string();
  }
  EXPECT_TRUE(ctx.async_error().is_ok());
  // The host-synchronous form is untouched.
  std::vector<float> out(16);
  ASSERT_TRUE(
      world.allreduce(buffer.data(), out.data(), 16, DataType::kFloat32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(out[15], 1.0f);
}

TEST(StreamApi, SingleThreadedContextsRefuseStreamCalls) {
  Options options;
  options.config["THREADS"] = "single";
  Context ctx = Context::init(options);
  std::vector<float> buffer(4);
  Status s = ctx.world().send(buffer.data(), 16, 0, kLegacyStream);
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_TRUE(mentions(s, "FERRY_THREADS=single")) << s.to_string();
}

// Calls inside a group are kept until the outermost group_end, which checks the group as a
// whole and reports what stops it; nothing stays queued after a refusal.
TEST(StreamApi, GroupsCollectUntilTheOutermostEnd) {
  Context ctx = Context::init();
  Communicator world = ctx.world();
  std::vector<float> a(4), b(4);
  Status s = ctx.group_end();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(mentions(s, "without a group_start")) << s.to_string();

  ctx.group_start();
  ctx.group_start();
  EXPECT_TRUE(world.send(a.data(), 16, 0, kLegacyStream).is_ok());
  EXPECT_TRUE(world.recv(b.data(), 16, 0, kPerThreadStream).is_ok());
  EXPECT_TRUE(ctx.group_end().is_ok());  // inner: nothing happens yet
  s = ctx.group_end();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_TRUE(mentions(s, "different streams")) << s.to_string();

  // The refused group is gone: a new one holds only its own calls.
  ctx.group_start();
  EXPECT_TRUE(world.send(a.data(), 16, 0, kLegacyStream).is_ok());
  EXPECT_TRUE(world.recv(b.data(), 16, 0, kLegacyStream).is_ok());
  s = ctx.group_end();
  EXPECT_FALSE(s.is_ok());
  EXPECT_TRUE(mentions(s, "CUDA")) << s.to_string();
  EXPECT_EQ(ctx.group_end().code(), Code::kInvalidArgument);
  EXPECT_TRUE(ctx.async_error().is_ok());
}

}  // namespace
}  // namespace ferry
