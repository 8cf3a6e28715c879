// The config registry: every FERRY_* variable is declared once in FERRY_CONFIG_VARS with its type,
// default, allowed values and a one-line doc. Config::load validates all of them at init.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace ferry::util {

enum class VarType { kBool, kInt, kSize, kSeconds, kEnum, kList, kString };

// X(id, name, type, default, min, max, allowed, doc)
//   min/max bound kInt, kSize and kSeconds; allowed lists the words of kEnum and kList ("a|b").
#define FERRY_CONFIG_VARS(X)                                                                       \
  X(kLogLevel, "FERRY_LOG_LEVEL", kEnum, "warn", 0, 0, "error|warn|info|debug",                    \
    "what ferry prints to stderr")                                                                 \
  X(kTransports, "FERRY_TRANSPORTS", kList, "self,shm,ofi", 0, 0, "self|shm|ofi",                  \
    "transports ferry may use (comma-separated); ofi is opened only when a rank is on another "    \
    "node or shm is excluded")                                                                     \
  X(kOfiProvider, "FERRY_OFI_PROVIDER", kString, "^shm", 0, 0, "",                                 \
    "libfabric providers ofi may use: names to allow, ^names to refuse (e.g. tcp, ^sockets)")      \
  X(kKeepalive, "FERRY_KEEPALIVE", kSeconds, "1", 0, 3600, "",                                     \
    "interval of the keepalive ofi sends to every peer (a failed send marks it dead; 0: off)")     \
  X(kOfiChunk, "FERRY_OFI_CHUNK", kSize, "4m", 65536, 1 << 30, "",                                 \
    "device data over ofi moves in direct transfers of this many bytes, through pinned bounces")   \
  X(kOfiHmem, "FERRY_OFI_HMEM", kEnum, "auto", 0, 0, "auto|off",                                   \
    "GPU memory over ofi: auto (registered with the NIC where the provider offers FI_HMEM and "    \
    "a trial registration of each GPU's memory succeeds, else staged) or off (always staged "      \
    "through pinned host memory)")                                                                 \
  X(kOfiRma, "FERRY_OFI_RMA", kEnum, "auto", 0, 0, "auto|native|messages|off",                     \
    "one-sided transfers over ofi: auto (where the provider offers FI_RMA and checks keys: "       \
    "rendezvous of host buffers by fi_read, and puts and gets of registered host memory by "       \
    "fi_write and fi_read once the owner has granted the key; else what it offers), native (the "  \
    "same, warning where it is refused), messages (fi_read rendezvous; puts and gets by messages " \
    "the owner checks), off (rendezvous by a tagged transfer after the receiver's "                \
    "clear-to-send)")                                                                              \
  X(kOfiPassthru, "FERRY_OFI_PASSTHRU", kEnum, "auto", 0, 0, "auto|on|off",                        \
    "tcp;ofi_rxm passing every call to the tcp provider's connected endpoints, without rxm's "     \
    "protocol on each message: auto (where rxm offers it), on (the same, warning where it does "   \
    "not), off (rxm's protocol); ranks that differ cannot reach each other over ofi")              \
  X(kOfiReadFrom, "FERRY_OFI_READ_FROM", kSize, "-1", -1, 1LL << 40, "",                           \
    "rendezvous messages over ofi from this size up are read from the sender's buffer (fi_read); " \
    "smaller ones go by a tagged transfer after the receiver's clear-to-send (-1: 512k over "      \
    "tcp's "                                                                                       \
    "own sockets, passed through or the net provider, whose tagged transfers are faster below "    \
    "that, else 0: every size)")                                                                   \
  X(kOfiMrCache, "FERRY_OFI_MR_CACHE", kInt, "1024", 0, 1 << 20, "",                               \
    "ofi memory registrations kept for reuse (least recently used dropped first; unmapped or "     \
    "freed memory dropped as the kernel reports it; 0: register for every transfer)")              \
  X(kOfiMrCacheSize, "FERRY_OFI_MR_CACHE_SIZE", kSize, "16g", 1 << 20, 1LL << 50, "",              \
    "bytes of ofi memory registrations kept for reuse")                                            \
  X(kKeepaliveTimeout, "FERRY_KEEPALIVE_TIMEOUT", kSeconds, "0", 0, 86400, "",                     \
    "an ofi peer that sent nothing (keepalives included) for this long is failed (0: never; "      \
    "set it to 3 keepalive intervals where nodes can vanish without closing their sockets and "    \
    "every rank calls ferry at least that often)")                                                 \
  X(kThreads, "FERRY_THREADS", kEnum, "multi", 0, 0, "multi|single",                               \
    "multi: the Context may be called from several threads at once (one lock around each call; "   \
    "blocking calls let go of it while they wait); single: one thread at a time, no locking")      \
  X(kProgressThread, "FERRY_PROGRESS_THREAD", kBool, "0", 0, 0, "",                                \
    "a thread of ferry's own moves non-blocking operations forward while the application "         \
    "computes (implies FERRY_THREADS=multi)")                                                      \
  X(kWaitMode, "FERRY_WAIT_MODE", kEnum, "spin", 0, 0, "spin|block|adaptive",                      \
    "how a blocking call waits: spin (poll, yielding after FERRY_SPIN_COUNT empty polls), block "  \
    "(sleep until a peer on this node rings, or 1-32 ms), adaptive (spin FERRY_SPIN_COUNT polls, " \
    "then sleep)")                                                                                 \
  X(kRndvThreshold, "FERRY_RNDV_THRESHOLD", kSize, "32k", 0, 1 << 30, "",                          \
    "messages larger than this go by rendezvous (capped by the transport's eager limit)")          \
  X(kSpinCount, "FERRY_SPIN_COUNT", kInt, "-1", -1, 100000000, "",                                 \
    "empty progress polls in a blocking wait before it starts yielding the CPU (-1: 2000, or 0 "   \
    "where more ranks of this node may run on the CPUs this process may use than there are of "    \
    "them, as waiting ranks would otherwise spin on the CPUs the others need)")                    \
  X(kBootstrapTimeout, "FERRY_BOOTSTRAP_TIMEOUT", kSeconds, "300", 0.01, 86400, "",                \
    "how long a bootstrap exchange (init, barrier) may wait for the other ranks")                  \
  X(kTimeout, "FERRY_TIMEOUT", kSeconds, "0", 0, 1e7, "",                                          \
    "how long a blocking wait, send, recv or probe may wait (0: no limit); then kTimeout")         \
  X(kFinalizeTimeout, "FERRY_FINALIZE_TIMEOUT", kSeconds, "30", 0.01, 86400, "",                   \
    "how long finalize waits to drain queued sends and for the other ranks")                       \
  X(kShmFifoSize, "FERRY_SHM_FIFO_SIZE", kInt, "1024", 16, 65536, "",                              \
    "elements in each process's receive FIFO (a power of two)")                                    \
  X(kShmReleaseBatch, "FERRY_SHM_RELEASE_BATCH", kInt, "16", 1, 512, "",                           \
    "FIFO elements the receiver consumes before it publishes the tail (a power of two, at most "   \
    "half of FERRY_SHM_FIFO_SIZE; by default 16, or half of a smaller FIFO)")                      \
  X(kShmBounceSize, "FERRY_SHM_BOUNCE_SIZE", kSize, "32768", 1024, 1 << 24, "",                    \
    "bytes in each bounce buffer of a sender's pool (eager messages, pipelined chunks)")           \
  X(kShmBounceCount, "FERRY_SHM_BOUNCE_COUNT", kInt, "64", 2, 65536, "",                           \
    "bounce buffers in each sender's pool")                                                        \
  X(kShmCma, "FERRY_SHM_CMA", kBool, "1", 0, 0, "",                                                \
    "single-copy rendezvous with process_vm_readv when the connect-time probe works, and "         \
    "broadcasts through the node area read from the root's buffer the same way")                   \
  X(kShmCmaThreshold, "FERRY_SHM_CMA_THRESHOLD", kSize, "-1", -1, 1LL << 40, "",                   \
    "rendezvous messages from this size up use CMA; smaller ones are pipelined through bounce "    \
    "buffers (-1: every rendezvous message where the CPU's rep movsb is fast, 128m where it is "   \
    "slow, as the kernel's copy then is: docs/PERFORMANCE.md)")                                    \
  X(kShmCmaSplit, "FERRY_SHM_CMA_SPLIT", kSize, "128k", -1, 1LL << 40, "",                         \
    "CMA rendezvous messages from this size up are copied from both ends: the receiver reads the " \
    "first half while the sender writes the second, or the receiver copies both when the sender "  \
    "does not call in first (-1: never)")                                                          \
  X(kCuda, "FERRY_CUDA", kEnum, "auto", 0, 0, "auto|off|require",                                  \
    "GPU buffers: auto (when a CUDA driver and device exist), off, or require (init fails "        \
    "without them)")                                                                               \
  X(kCudaIpc, "FERRY_CUDA_IPC", kBool, "1", 0, 0, "",                                              \
    "move device buffers between processes of a node by CUDA IPC (0: host-staged only)")           \
  X(kCudaIpcCacheEntries, "FERRY_CUDA_IPC_CACHE_ENTRIES", kInt, "1024", 1, 1 << 20, "",            \
    "peer allocations kept mapped (least recently used closed first)")                             \
  X(kCudaIpcCacheSize, "FERRY_CUDA_IPC_CACHE_SIZE", kSize, "64g", 1 << 20, 1LL << 50, "",          \
    "bytes of peer allocations kept mapped (least recently used closed first)")                    \
  X(kCudaIpcSplit, "FERRY_CUDA_IPC_SPLIT", kSize, "0", 0, 1LL << 40, "",                           \
    "IPC copies from this size up are split into up to 4 pieces on separate streams (0: "          \
    "never; splitting was slower on H200 NVLink: docs/PERFORMANCE.md)")                            \
  X(kCudaIpcKernelCopy, "FERRY_CUDA_IPC_KERNEL_COPY", kSize, "4m", 0, 1LL << 40, "",               \
    "CUDA IPC copies from this size up to FERRY_CUDA_IPC_KERNEL_COPY_MAX, queued behind other "    \
    "copies, are made by a copy kernel on the receiver's GPU instead of the copy engine (0: "      \
    "never; faster for a stream of such messages on H200 NVLink: docs/PERFORMANCE.md)")            \
  X(kCudaIpcKernelCopyMax, "FERRY_CUDA_IPC_KERNEL_COPY_MAX", kSize, "16m", 0, 1LL << 40, "",       \
    "the largest CUDA IPC copy a copy kernel makes (see FERRY_CUDA_IPC_KERNEL_COPY)")              \
  X(kCudaScratchCache, "FERRY_CUDA_SCRATCH_CACHE", kSize, "1g", 0, 1LL << 50, "",                  \
    "bytes of freed collective scratch buffers kept per GPU for the next collective (their "       \
    "peers' IPC mappings stay valid)")                                                             \
  X(kCudaStageChunk, "FERRY_CUDA_STAGE_CHUNK", kSize, "4m", 4096, 1 << 30, "",                     \
    "bytes per slot of a host-staging ring (device data that cannot go by IPC)")                   \
  X(kCudaStageSlots, "FERRY_CUDA_STAGE_SLOTS", kInt, "4", 2, 64, "",                               \
    "slots per host-staging ring (one ring per sender and receiver, made on first use)")           \
  X(kCudaStageCpuPart, "FERRY_CUDA_STAGE_CPU_PART", kInt, "12", 0, 50, "",                         \
    "percent of each ring slot that the CPU copies to or from page-locked host memory while its "  \
    "GPU copies the rest (through the GPU the data crosses its link both ways at once)")           \
  X(kTestHostStaging, "FERRY_TEST_HOST_STAGING", kBool, "0", 0, 0, "",                             \
    "test: host rendezvous messages also go through the staging ring of device buffers, so "       \
    "its protocol runs on machines without a GPU")                                                 \
  X(kTestStageOpenFail, "FERRY_TEST_STAGE_OPEN_FAIL", kBool, "0", 0, 0, "",                        \
    "test fault: a receiver cannot map its peer's staging ring (both sides must fail, not wait)")  \
  X(kTestOfiRemote, "FERRY_TEST_OFI_REMOTE", kBool, "0", 0, 0, "",                                 \
    "test: ofi treats every peer as on another node (no pidfd: keepalives must find deaths)")      \
  X(kTestOfiChunked, "FERRY_TEST_OFI_CHUNKED", kBool, "0", 0, 0, "",                               \
    "test: host rendezvous messages over ofi move in chunks, as device data does")                 \
  X(kTestOfiHmem, "FERRY_TEST_OFI_HMEM", kEnum, "none", 0, 0, "none|assume|fail",                  \
    "test: ofi acts as if the provider offered FI_HMEM (assume: the trial registration of GPU "    \
    "memory runs against the real provider; fail: it fails with -FI_EINVAL, as a NIC that "        \
    "cannot map GPU memory answers)")                                                              \
  X(kTestOfiFailAt, "FERRY_TEST_OFI_FAIL_AT", kString, "", 0, 0, "",                               \
    "test fault: opening the ofi transport fails at the named step (fi_fabric, fi_domain, "        \
    "fi_cq_open, fi_av_open, fi_endpoint, fi_ep_bind(cq), fi_ep_bind(av), fi_enable, fi_mr_reg "   \
    "(bounce buffers), fi_mr_bind, fi_mr_enable, fi_getname)")                                     \
  X(kTestOfiDrop, "FERRY_TEST_OFI_DROP", kInt, "-1", -1, 1 << 30, "",                              \
    "test fault: ofi never posts its message of this sequence number to each peer (as a provider " \
    "that loses it while connecting); -1: none")                                                   \
  X(kTestOfiDropCopies, "FERRY_TEST_OFI_DROP_COPIES", kBool, "0", 0, 0, "",                        \
    "test fault: the copies of FERRY_TEST_OFI_DROP's message, sent again, are lost too")           \
  X(kTestOfiReadFail, "FERRY_TEST_OFI_READ_FAIL", kBool, "0", 0, 0, "",                            \
    "test fault: ofi's one-sided reads fail (with an error completion, never reaching the "        \
    "provider); the receiver must fall back to clear-to-send")                                     \
  X(kTestGetDelay, "FERRY_TEST_GET_DELAY", kSeconds, "0", 0, 60, "",                               \
    "test: a receiver waits this long between matching a rendezvous and its zero-copy get "        \
    "(after offering the sender the second half, where it splits the copy)")                       \
  X(kTestSplitRefused, "FERRY_TEST_SPLIT_REFUSED", kBool, "0", 0, 0, "",                           \
    "test fault: a sender's CMA write of a message's second half is refused; the receiver must "   \
    "copy it and split no more")                                                                   \
  X(kTestCudaEvents, "FERRY_TEST_CUDA_EVENTS", kBool, "0", 0, 0, "",                               \
    "test only: GPU copies report completion by events, not by a flag the GPU writes")             \
  X(kTestCudaIpcFail, "FERRY_TEST_CUDA_IPC_FAIL", kBool, "0", 0, 0, "",                            \
    "test fault: opening a peer's CUDA IPC handle fails, as a refusing driver would")              \
  X(kTestCollAreaFail, "FERRY_TEST_COLL_AREA_FAIL", kBool, "0", 0, 0, "",                          \
    "test fault: member 0 cannot create a communicator's shared area, as with a full /dev/shm")    \
  X(kTestStreamThreadIdle, "FERRY_TEST_STREAM_THREAD_IDLE", kBool, "0", 0, 0, "",                  \
    "test fault: ferry's stream thread starts no hand-off, so a stream that needs it waits until " \
    "the Context's end")                                                                           \
  X(kRank, "FERRY_RANK", kInt, "-1", -1, 1 << 24, "", "this process's rank (set by ferryrun)")     \
  X(kSize, "FERRY_SIZE", kInt, "0", 0, 1 << 24, "", "ranks in the job (set by ferryrun)")          \
  X(kLocalRank, "FERRY_LOCAL_RANK", kInt, "-1", -1, 1 << 24, "",                                   \
    "rank among the processes of this node (set by ferryrun)")                                     \
  X(kLocalSize, "FERRY_LOCAL_SIZE", kInt, "0", 0, 1 << 24, "",                                     \
    "processes of the job on this node (set by ferryrun)")                                         \
  X(kStore, "FERRY_STORE", kString, "", 0, 0, "",                                                  \
    "the ranks' key-value store: unix:PATH (set by ferryrun), or HOST:PORT for the TCP store "     \
    "that rank 0 serves (set it with FERRY_RANK and FERRY_SIZE in a custom launcher)")             \
  X(kCollSmall, "FERRY_COLL_SMALL", kSize, "64k", 0, 1LL << 40, "",                                \
    "collectives on fewer bytes than this use the latency algorithms (recursive doubling, "        \
    "Bruck, binomial trees); from it up the bandwidth ones (rings, a pipelined chain)")            \
  X(kCollAllreduce, "FERRY_COLL_ALLREDUCE", kEnum, "auto", 0, 0, "auto|recursive-doubling|ring",   \
    "allreduce algorithm (auto: by FERRY_COLL_SMALL)")                                             \
  X(kCollBroadcast, "FERRY_COLL_BROADCAST", kEnum, "auto", 0, 0, "auto|binomial|chain",            \
    "broadcast algorithm (auto: by FERRY_COLL_SMALL)")                                             \
  X(kCollReduce, "FERRY_COLL_REDUCE", kEnum, "auto", 0, 0, "auto|binomial|ring",                   \
    "reduce algorithm (ring: reduce-scatter, then the blocks to the root)")                        \
  X(kCollAllgather, "FERRY_COLL_ALLGATHER", kEnum, "auto", 0, 0, "auto|bruck|ring",                \
    "allgather algorithm (auto: by FERRY_COLL_SMALL)")                                             \
  X(kCollNode, "FERRY_COLL_NODE", kSize, "1m", 0, 1 << 20, "",                                     \
    "blocking barriers, broadcasts, reduces, allreduces, allgathers and reduce_scatters of host "  \
    "buffers up to this many bytes per member (and at most 2 MiB / members), where every member "  \
    "is on this node, go through a shared-memory area with no messages (0: never; must be the "    \
    "same on every member)")                                                                       \
  X(kCollChunk, "FERRY_COLL_CHUNK", kSize, "512k", 4096, 1 << 30, "",                              \
    "a chain broadcast forwards pieces of at least this many bytes (an eighth of the message, "    \
    "up to 4 MiB, where larger; the chain is taken from two pieces up); on the host, a ring "      \
    "reduce-scatter (allreduce, reduce, reduce_scatter) moves its blocks in pieces of this size")  \
  X(kCollDeviceOneshotSlice, "FERRY_COLL_DEVICE_ONESHOT_SLICE", kSize, "8k", 0, 1 << 30, "",       \
    "bytes per thread block of the one-shot device allreduce, up to 128 blocks (0: always 128; "   \
    "must be the same on every member)")                                                           \
  X(kCollDeviceResident, "FERRY_COLL_DEVICE_RESIDENT", kInt, "1000", 0, 10000000, "",              \
    "microseconds a one-block kernel stays on the GPU after a blocking one-shot allreduce of up "  \
    "to FERRY_COLL_DEVICE_ONESHOT_SLICE bytes, taking the next such call without a launch, where " \
    "every member has a GPU of its own (0: launch every call)")                                    \
  X(kCollDeviceSharedGpu, "FERRY_COLL_DEVICE_SHARED_GPU", kBool, "0", 0, 0, "",                    \
    "use the device kernels whose blocks wait for each other (the one-shot allreduce and its "     \
    "resident kernel, stream send/recv) also where members share a GPU: worth it under MPS, "      \
    "where their kernels run side by side; without MPS they take turns by time slices and a call " \
    "costs milliseconds")                                                                          \
  X(kCollDeviceOneshot, "FERRY_COLL_DEVICE_ONESHOT", kSize, "16m", 0, 1 << 30, "",                 \
    "device allreduces up to this size divided by (members - 1), where every member is on this "   \
    "node and has a GPU of its own and no algorithm is forced, run as one kernel per GPU that "    \
    "pushes its data to every member through CUDA IPC (0: never)")                                 \
  X(kCollDeviceTwoshot, "FERRY_COLL_DEVICE_TWOSHOT", kSize, "16m", 0, 1 << 30, "",                 \
    "device allreduces from this size divided by (members - 1) up, where the one-shot path is "    \
    "set up, run as the two-shot kernel: each member reduces its part (1 / members) and the "      \
    "others take it; two members any size, more up to members times the one-shot limit (0: "       \
    "never; must be the same on every member)")                                                    \
  X(kStreamKernel, "FERRY_STREAM_KERNEL", kSize, "16m", 0, 1 << 30, "",                            \
    "stream-ordered allreduces of device memory up to this size divided by (members - 1), where "  \
    "every member is on this node with a GPU of its own, run as one kernel on the application's "  \
    "stream, which a graph captures as it is (0: every stream call through ferry's thread)")       \
  X(kStreamLl, "FERRY_STREAM_LL", kSize, "256k", 0, 262144, "",                                    \
    "such kernels move calls of up to this many bytes as LL lines (8 bytes of data and the "       \
    "call's number in one 16-byte store, no flag), larger ones by the one-shot blocks and flags "  \
    "(must be the same on every member)")                                                          \
  X(kStreamP2p, "FERRY_STREAM_P2P", kSize, "256k", 0, 262144, "",                                  \
    "stream sends and receives between GPUs of one node go through a kernel on the stream: "       \
    "messages up to this size as LL lines, larger ones through the kernels' bulk ring (the "       \
    "smaller of two members' values; 0: every stream send and receive by ferry's thread)")         \
  X(kStreamRingPlaces, "FERRY_STREAM_RING_PLACES", kInt, "128", 1, 256, "",                        \
    "places in the bulk ring of such kernels, one per peer and direction in the receiver's "       \
    "device memory (must be the same on every member)")                                            \
  X(kStreamRingChunk, "FERRY_STREAM_RING_CHUNK", kSize, "128k", 4096, 4194304, "",                 \
    "bytes of each place of that ring, rounded down to a multiple of 4 KiB (must be the same "     \
    "on every member)")                                                                            \
  X(kStreamRingBlocks, "FERRY_STREAM_RING_BLOCKS", kInt, "64", 1, 256, "",                         \
    "thread blocks each side of a message through that ring takes at most (a block takes the "     \
    "places b, b + blocks, ... in turn)")                                                          \
  X(kBootstrap, "FERRY_BOOTSTRAP", kEnum, "auto", 0, 0, "auto|pmix|pmi|store|single",              \
    "how ranks find each other: auto picks PMIx (PMIX_RANK set), PMI (PMI_FD set), the store "     \
    "(FERRY_STORE set), else a single process")                                                    \
  X(kJobId, "FERRY_JOB_ID", kString, "", 0, 0, "",                                                 \
    "job identity, part of shared-memory names (set by ferryrun)")                                 \
  X(kBoardFd, "FERRY_BOARD_FD", kInt, "-1", -1, 1 << 30, "",                                       \
    "the job's wait board, a descriptor ferryrun passes (set by ferryrun)")                        \
  X(kTestCrashAt, "FERRY_TEST_CRASH_AT", kEnum, "none", 0, 0,                                      \
    "none|segment-created|initialized|first-send|finalize|mid-pipeline|mid-claim|mid-revoke|"      \
    "mid-agree|mid-decide",                                                                        \
    "test fault: the rank named by FERRY_TEST_CRASH_RANK kills itself (SIGKILL) there")            \
  X(kTestCrashRank, "FERRY_TEST_CRASH_RANK", kInt, "-1", -1, 1 << 24, "",                          \
    "test fault: which rank FERRY_TEST_CRASH_AT kills")

enum class Var : int {
#define FERRY_VAR_ENUM(id, ...) id,
  FERRY_CONFIG_VARS(FERRY_VAR_ENUM)
#undef FERRY_VAR_ENUM
      kCount
};

struct VarSpec {
  Var id;
  const char* name;
  VarType type;
  const char* default_value;
  double min;
  double max;
  const char* allowed;
  const char* doc;
};

std::span<const VarSpec> registry() noexcept;
const char* type_name(VarType type) noexcept;

// Variables every rank of a job must set alike: the collectives' algorithms and sizes (each
// member decides alone how a call is split into messages, and members that decide differently
// wait for each other forever) and the chunks of device data over ofi (the receiver asks for
// chunks of its size, the sender refuses larger ones than its own). Context::init compares them
// across the ranks and fails on every rank, naming each variable that differs and where.
inline constexpr Var kJobWide[] = {
    Var::kCollSmall,          Var::kCollAllreduce,
    Var::kCollBroadcast,      Var::kCollReduce,
    Var::kCollAllgather,      Var::kCollNode,
    Var::kCollChunk,          Var::kCollDeviceOneshotSlice,
    Var::kCollDeviceResident, Var::kCollDeviceSharedGpu,
    Var::kCollDeviceOneshot,  Var::kCollDeviceTwoshot,
    Var::kStreamKernel,       Var::kStreamLl,
    Var::kStreamRingPlaces,   Var::kStreamRingChunk,
    Var::kOfiChunk,
};
[[nodiscard]] bool job_wide(Var var) noexcept;

// A validated snapshot of every variable: environment, then Options overrides on top.
class Config {
 public:
  // Throws ferry::Error(kInvalidArgument) naming the variable, the value and what is allowed.
  static Config load(const std::map<std::string, std::string>& overrides = {});

  [[nodiscard]] bool get_bool(Var var) const;
  [[nodiscard]] std::int64_t get_int(Var var) const;
  [[nodiscard]] std::size_t get_size(Var var) const {
    return static_cast<std::size_t>(get_int(var));
  }
  [[nodiscard]] double get_seconds(Var var) const;
  [[nodiscard]] const std::string& get_string(Var var) const;
  [[nodiscard]] std::vector<std::string> get_list(Var var) const;
  [[nodiscard]] bool list_contains(Var var, const std::string& word) const;
  // The value as parsed, in one spelling ("1m" and "1048576" alike), for comparing ranks.
  [[nodiscard]] std::string canonical(Var var) const;

  struct Entry {
    const VarSpec* spec;
    std::string value;   // as given, or the default
    std::string source;  // "default", "environment" or "options"
  };
  [[nodiscard]] std::vector<Entry> entries() const;
  // FERRY_* names in the environment that the registry does not know (likely typos).
  [[nodiscard]] const std::vector<std::string>& unknown() const { return unknown_; }

 private:
  struct Value {
    std::string text;
    std::string source;
    std::int64_t integer = 0;
    double real = 0;
  };
  std::vector<Value> values_;
  std::vector<std::string> unknown_;
};

// Parses one value against its spec; exposed for tests. Throws like Config::load.
void parse_value(const VarSpec& spec, const std::string& text, std::int64_t* integer, double* real);

}  // namespace ferry::util
