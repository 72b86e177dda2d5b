// The shared-memory backend beyond what every backend passes (comm_collectives_test.cc): long
// random runs, interleaved communicators, bit-identical results, 16-bit floats, aborts, and peers
// killed with SIGKILL or stopped with SIGSTOP before, during and after a collective, as forked
// processes over a FileStore; the single copy over heap buffers and over shared blocks
// (SharedHostAllocator), which the peers map.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kernels/half.h"
#include "worker/comm/communicator.h"
#include "worker/comm/cpu_communicator.h"
#include "worker/comm/file_store.h"
#include "worker/comm/shared_host_memory.h"
#include "worker/comm/shm_communicator.h"
#include "worker/comm/store.h"

namespace shardline::comm {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

ShmOptions Options(milliseconds timeout = milliseconds(20000)) {
  ShmOptions options;
  options.timeout = timeout;
  return options;
}

// Runs body(comm) on `n` threads over one store; `prefix` keeps several runs on one store apart.
void RunRanks(int n, const std::function<void(Communicator&)>& body,
              const ShmOptions& options = Options(), Store* shared = nullptr,
              const std::string& prefix = "run") {
  InMemoryStore own;
  Store& base = shared != nullptr ? *shared : own;
  std::vector<absl::Status> bootstrap(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      PrefixStore store(prefix, base);
      auto comm = CreateShmCommunicator(store, rank, n, options);
      if (!comm.ok()) {
        bootstrap[rank] = comm.status();
        return;
      }
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_TRUE(bootstrap[rank].ok()) << "rank " << rank << ": " << bootstrap[rank];
  }
}

// `count` floats on the heap, or from a SharedHostAllocator (memory the peers map) when `shared`.
class TestBuffer {
 public:
  TestBuffer(size_t count, bool shared) : count_(count) {
    if (!shared) {
      heap_.resize(count);
      data_ = heap_.data();
      return;
    }
    auto got = allocator_.Allocate(count * sizeof(float));
    if (got.ok()) data_ = static_cast<float*>(*got);
  }
  ~TestBuffer() {
    if (heap_.empty() && data_ != nullptr) allocator_.Deallocate(data_, count_ * sizeof(float));
  }
  TestBuffer(const TestBuffer&) = delete;
  TestBuffer& operator=(const TestBuffer&) = delete;
  float* data() { return data_; }  // nullptr if the shared allocation failed

 private:
  size_t count_;
  std::vector<float> heap_;
  SharedHostAllocator allocator_;
  float* data_ = nullptr;
};

// Mappings of shared blocks (SharedHostAllocator's memfds) in this process: its own and the
// peers' that its communicators mapped.
int SharedBlockMappings() {
  std::ifstream maps("/proc/self/maps");
  int found = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("shardline-comm-buffer") != std::string::npos) ++found;
  }
  return found;
}

std::set<std::string> DevShm() {
  std::set<std::string> names;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", error)) {
    const std::string name = entry.path().filename().string();
    // Not ours: LLVM's OpenMP runtime (clang builds, as scripts/sanitize.sh's) registers every
    // process that starts it in /dev/shm, and a rank killed with SIGKILL cannot remove its file.
    if (name.starts_with("__KMP_REGISTERED_LIB_")) continue;
    names.insert(name);
  }
  return names;
}

// Every rank runs the same seeded sequence of 10,000 operations of random kind and size (chunk and
// one-shot limits set small so that sizes cross them often), each rank sleeping at random between
// them, and checks every result.
TEST(ShmTest, TenThousandBackToBackCollectivesWithRandomDelays) {
  ShmOptions options = Options();
  options.slot_bytes = 4096;
  options.one_shot_bytes = 1024;
  constexpr int kRanks = 3;
  RunRanks(kRanks, [&](Communicator& comm) {
    std::mt19937 shared(1234);  // the same on every rank: the sequence of operations
    std::mt19937 own(99 + comm.rank());
    std::vector<int64_t> data, out;
    for (int step = 0; step < 10000; ++step) {
      const int kind = static_cast<int>(shared() % 5);
      const size_t count = shared() % 3000;
      if (own() % 8 == 0) std::this_thread::sleep_for(std::chrono::microseconds(own() % 200));
      const std::string what = "step " + std::to_string(step) + " kind " + std::to_string(kind) +
                               " count " + std::to_string(count);
      switch (kind) {
        case 0: {  // all-reduce sum: sum over ranks of (r + 1) * (i + step)
          data.assign(count, 0);
          for (size_t i = 0; i < count; ++i) data[i] = (comm.rank() + 1) * int64_t(i + step);
          ASSERT_TRUE(comm.AllReduce(data.data(), count, DType::kInt64, ReduceOp::kSum).ok())
              << what;
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(data[i], 6 * int64_t(i + step)) << what << " element " << i;
          }
          break;
        }
        case 1: {  // all-gather
          data.assign(count, comm.rank() * 1000 + step);
          out.assign(count * kRanks, -1);
          ASSERT_TRUE(comm.AllGather(data.data(), out.data(), count, DType::kInt64).ok()) << what;
          for (size_t i = 0; i < out.size(); ++i) {
            ASSERT_EQ(out[i], int64_t(i / std::max<size_t>(count, 1)) * 1000 + step) << what;
          }
          break;
        }
        case 2: {  // broadcast from a rotating root
          const int root = step % kRanks;
          data.assign(count, comm.rank() == root ? step : -7);
          ASSERT_TRUE(comm.Broadcast(data.data(), count, DType::kInt64, root).ok()) << what;
          for (int64_t v : data) ASSERT_EQ(v, step) << what;
          break;
        }
        case 3: {  // reduce-scatter max
          data.assign(count * kRanks, 0);
          for (size_t i = 0; i < data.size(); ++i) data[i] = comm.rank() + int64_t(i);
          out.assign(count, -1);
          ASSERT_TRUE(
              comm.ReduceScatter(data.data(), out.data(), count, DType::kInt64, ReduceOp::kMax)
                  .ok())
              << what;
          for (size_t j = 0; j < count; ++j) {
            ASSERT_EQ(out[j], kRanks - 1 + int64_t(comm.rank() * count + j)) << what;
          }
          break;
        }
        case 4: {  // every rank sends right, receives from the left
          const int right = (comm.rank() + 1) % kRanks, left = (comm.rank() + kRanks - 1) % kRanks;
          data.assign(count, comm.rank() + step);
          out.assign(count, -1);
          ASSERT_TRUE(comm.SendRecv(data.data(), count, right, out.data(), count, left,
                                    DType::kInt64)
                          .ok())
              << what;
          for (int64_t v : out) ASSERT_EQ(v, left + step) << what;
          break;
        }
      }
    }
  }, options);
}

TEST(ShmTest, TwoCommunicatorsInterleaved) {
  InMemoryStore store;
  constexpr int kRanks = 3;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int rank = 0; rank < kRanks; ++rank) {
    threads.emplace_back([&, rank] {
      PrefixStore a_store("a", store), b_store("b", store);
      auto a = CreateShmCommunicator(a_store, rank, kRanks, Options());
      auto b = CreateShmCommunicator(b_store, rank, kRanks, Options());
      if (!a.ok() || !b.ok()) {
        ++failures;
        return;
      }
      for (int i = 0; i < 200; ++i) {
        std::vector<float> x(1000 + i, 1.0f), y(300000, 2.0f);
        if (!(*a)->AllReduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).ok()) ++failures;
        if (!(*b)->AllReduce(y.data(), y.size(), DType::kFloat32, ReduceOp::kMax).ok()) ++failures;
        if (x.front() != 3.0f || x.back() != 3.0f || y.front() != 2.0f || y.back() != 2.0f) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// The sum over ranks of input(rank, i), taken in rank order 0, 1, ..., as the communicator must.
template <typename Input>
std::vector<float> RankOrderSum(const Input& input, int ranks, size_t count) {
  std::vector<float> sum(count);
  for (size_t i = 0; i < count; ++i) {
    float acc = input(0, i);
    for (int r = 1; r < ranks; ++r) acc += input(r, i);
    sum[i] = acc;
  }
  return sum;
}

// Non-integer floats, whose sum depends on the order: every rank must get the same bits, equal to
// the sum taken in rank order, by the one-phase and the chunked algorithm alike.
TEST(ShmTest, FloatSumsAreBitIdenticalAcrossRanksAndAlgorithms) {
  constexpr int kRanks = 4;
  constexpr size_t kCount = 700001;  // several chunks, not a multiple of the world size
  auto input = [](int rank, size_t i) {
    return std::sin(static_cast<float>(i) * 0.37f + rank) * std::pow(10.0f, (i + rank) % 7 - 3.0f);
  };
  const std::vector<float> want = RankOrderSum(input, kRanks, kCount);
  // One shot, chunked through the segment (both also with streamed stores), and single copy
  // (ranks as threads read each other's buffers directly; across processes: ShmSingleCopyTest
  // below).
  for (int a = 0; a < kShmAlgorithms; ++a) {
    const auto algorithm = static_cast<ShmAlgorithm>(a);
    ShmOptions options = Options();
    options.one_shot_bytes = 0;
    options.slot_bytes = 64 << 10;  // many chunks
    options.all_reduce = algorithm;
    std::vector<std::vector<float>> got(kRanks);
    RunRanks(kRanks, [&](Communicator& comm) {
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = input(comm.rank(), i);
      ASSERT_TRUE(comm.AllReduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum).ok());
      got[comm.rank()] = std::move(data);
    }, options);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(got[r].size(), kCount);
      EXPECT_EQ(std::memcmp(got[r].data(), want.data(), kCount * sizeof(float)), 0)
          << "rank " << r << " with algorithm " << ShmAlgorithmName(algorithm);
    }
  }
}

// Tuned (the default): rank 0 switches algorithms between calls as it times them (every
// candidate in its warm-up, the others again every AllReduceTuner::kRetryEvery calls), and tells
// the others through the segment. Every call on every rank must still give the rank-order bits.
TEST(ShmTest, TunedAllReducesSwitchAlgorithmsAndKeepTheBits) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 50001;
  auto input = [](int rank, size_t i) {
    return std::cos(static_cast<float>(i) * 0.11f + rank) * std::pow(10.0f, (i + rank) % 5 - 2.0f);
  };
  const std::vector<float> want = RankOrderSum(input, kRanks, kCount);
  ShmOptions options = Options();
  options.slot_bytes = 64 << 10;  // the chunked algorithm runs several chunks
  const int calls = AllReduceTuner::kWarmRuns * kShmAlgorithms + 3 * AllReduceTuner::kRetryEvery;
  std::atomic<int> wrong{0};
  RunRanks(kRanks, [&](Communicator& comm) {
    std::mt19937 delays(7 + comm.rank());
    std::vector<float> data(kCount);
    for (int call = 0; call < calls; ++call) {
      for (size_t i = 0; i < kCount; ++i) data[i] = input(comm.rank(), i);
      if (delays() % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(delays() % 300));
      ASSERT_TRUE(comm.AllReduce(data.data(), kCount, DType::kFloat32, ReduceOp::kSum).ok());
      if (std::memcmp(data.data(), want.data(), kCount * sizeof(float)) != 0) ++wrong;
    }
  }, options);
  EXPECT_EQ(wrong.load(), 0);
}

// bf16 and f16 are reduced in f32 and rounded once: the result is the rounding of the f32 sum.
// By every algorithm: two-byte elements over uneven slices put the copies' ends at every
// alignment (the streamed copies' heads and tails).
TEST(ShmTest, SixteenBitFloatsReduceInF32AndRoundOnce) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 100003;
  const auto check = [&](Communicator& comm) {
    std::vector<kernels::BFloat16> bf(kCount), bf_want(kCount);
    std::vector<kernels::Float16> hf(kCount), hf_want(kCount);
    auto value = [](int rank, size_t i) { return 0.01f * static_cast<float>((i * 7 + rank) % 301); };
    for (size_t i = 0; i < kCount; ++i) {
      bf[i] = kernels::FloatToBFloat16(value(comm.rank(), i));
      hf[i] = kernels::FloatToFloat16(value(comm.rank(), i));
      float bsum = 0, hsum = 0;
      for (int r = 0; r < kRanks; ++r) {
        bsum += kernels::BFloat16ToFloat(kernels::FloatToBFloat16(value(r, i)));
        hsum += kernels::Float16ToFloat(kernels::FloatToFloat16(value(r, i)));
      }
      bf_want[i] = kernels::FloatToBFloat16(bsum / kRanks);
      hf_want[i] = kernels::FloatToFloat16(hsum);
    }
    ASSERT_TRUE(comm.AllReduce(bf.data(), kCount, DType::kBFloat16, ReduceOp::kAvg).ok());
    ASSERT_TRUE(comm.AllReduce(hf.data(), kCount, DType::kFloat16, ReduceOp::kSum).ok());
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_EQ(bf[i].bits, bf_want[i].bits) << "bf16 element " << i;
      ASSERT_EQ(hf[i].bits, hf_want[i].bits) << "f16 element " << i;
    }
  };
  for (int a = 0; a < kShmAlgorithms; ++a) {
    SCOPED_TRACE(ShmAlgorithmName(static_cast<ShmAlgorithm>(a)));
    ShmOptions options = Options();
    options.one_shot_bytes = 0;
    options.slot_bytes = 64 << 10;  // several chunks
    options.all_reduce = static_cast<ShmAlgorithm>(a);
    RunRanks(kRanks, check, options);
  }
}

TEST(ShmTest, AbortFailsEveryRankFastAndANewCommunicatorWorks) {
  InMemoryStore store;
  RunRanks(3, [&](Communicator& comm) {
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), 100, DType::kFloat32, ReduceOp::kSum).ok());
    if (comm.rank() == 0) {
      comm.Abort();
      comm.Abort();  // idempotent
      EXPECT_EQ(comm.Barrier().code(), absl::StatusCode::kAborted);
      return;
    }
    // Rank 0 never joins this one; its Abort() must end the wait long before the 20 s timeout.
    const auto start = Clock::now();
    auto status = comm.AllReduce(data.data(), 100, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("aborted by rank 0"));
    EXPECT_LT(Clock::now() - start, milliseconds(5000));
    // Broken for good, as Gloo's communicators are.
    EXPECT_FALSE(comm.Barrier().ok());
  }, Options(), &store, "first");
  RunRanks(3, [&](Communicator& comm) {
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), 100, DType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(data[99], 3.0f);
  }, Options(), &store, "second");
}

TEST(ShmTest, AbortFromAnotherThreadWakesAPendingWait) {
  RunRanks(2, [&](Communicator& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(milliseconds(600));  // never joins; exits without aborting
      return;
    }
    std::thread aborter([&] {
      std::this_thread::sleep_for(milliseconds(200));
      comm.Abort();
    });
    const auto start = Clock::now();
    std::vector<float> data(10);
    auto status = comm.AllReduce(data.data(), 10, DType::kFloat32, ReduceOp::kSum);
    aborter.join();
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_LT(Clock::now() - start, milliseconds(3000));
  });
}

TEST(ShmTest, SilentPeerTimesOutNamingIt) {
  RunRanks(2, [&](Communicator& comm) {
    if (comm.rank() == 1) {
      std::this_thread::sleep_for(milliseconds(700));
      return;
    }
    const auto start = Clock::now();
    std::vector<float> data(16);
    auto status = comm.Recv(data.data(), 16, DType::kFloat32, 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("recv of 16 f32 on rank 0 of 2"));
    EXPECT_THAT(std::string(status.message()), HasSubstr("waiting for rank 1"));
    EXPECT_GE(Clock::now() - start, milliseconds(250));
  }, Options(milliseconds(300)));
}

TEST(ShmTest, PeerThatNeverJoinsIsDeadlineExceededNamingIt) {
  InMemoryStore store;
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {  // rank 2 of 3 never starts
    threads.emplace_back([&, rank] {
      results[rank] = CreateShmCommunicator(store, rank, 3, Options(milliseconds(400))).status();
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].code(), absl::StatusCode::kDeadlineExceeded) << results[rank];
    EXPECT_THAT(std::string(results[rank].message()), HasSubstr("rank 2")) << results[rank];
  }
  EXPECT_EQ(CreateShmCommunicator(store, 3, 3, Options()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CpuTransportTest, TheRuleEveryRankApplies) {
  EXPECT_EQ(ChooseCpuTransport({"a"}), CpuTransport::kShm);
  EXPECT_EQ(ChooseCpuTransport({"a", "a", "a"}), CpuTransport::kShm);
  EXPECT_EQ(ChooseCpuTransport({"a", "b", "a", "b"}), CpuTransport::kHierarchical);
  EXPECT_EQ(ChooseCpuTransport({"a", "a", "b", "b", "c", "c"}), CpuTransport::kHierarchical);
  EXPECT_EQ(ChooseCpuTransport({"a", "b"}), CpuTransport::kGloo);            // one rank per host
  EXPECT_EQ(ChooseCpuTransport({"a", "a", "b"}), CpuTransport::kGloo);       // uneven hosts
  EXPECT_EQ(ChooseCpuTransport({"a", "a", "b", "b", "b"}), CpuTransport::kGloo);
  EXPECT_EQ(CpuTransportName(CpuTransport::kHierarchical), "shm+gloo");
  // This process's identity names its kernel boot and namespaces.
  EXPECT_THAT(LocalHostIdentity(), HasSubstr("/net:"));
}

// Ranks as forked processes. How rank 2 (the victim) misbehaves, and when.
enum class Victim { kKilledBefore, kKilledDuring, kKilledAfter, kStopped };

constexpr int kForkRanks = 3;
constexpr size_t kBig = 4 << 20;  // floats: 16 MiB, many chunks, so a kill lands mid-way

// Exit codes of the surviving ranks: 0 when they got the error the scenario expects in time.
bool WaitForFile(const std::string& path) {
  for (int i = 0; i < 6000 && !std::filesystem::exists(path); ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  return std::filesystem::exists(path);
}

int RunSurvivor(Communicator& comm, Victim victim, milliseconds timeout, const std::string& dir,
                bool shared) {
  TestBuffer buffer(kBig, shared);
  float* data = buffer.data();
  if (data == nullptr) return 18;
  std::fill(data, data + kBig, 1.0f);
  if (victim == Victim::kKilledAfter) {
    // One collective with everyone, then the parent kills the victim between two collectives.
    if (!comm.AllReduce(data, kBig, DType::kFloat32, ReduceOp::kSum).ok()) return 10;
    std::ofstream(dir + "/first-done-" + std::to_string(comm.rank()));
    if (!WaitForFile(dir + "/killed")) return 17;
  }
  const auto start = Clock::now();
  absl::Status status;
  for (int i = 0; i < 1000 && status.ok(); ++i) {
    status = comm.AllReduce(data, kBig, DType::kFloat32, ReduceOp::kSum);
  }
  const auto took = Clock::now() - start;
  const std::string message(status.message());
  fprintf(stderr, "survivor %d: %s after %lld ms\n", comm.rank(), status.ToString().c_str(),
          static_cast<long long>(std::chrono::duration_cast<milliseconds>(took).count()));
  // Stay until the other survivor has seen the fault too: an exit now would be what it reports.
  std::this_thread::sleep_for(victim == Victim::kStopped ? timeout : milliseconds(500));
  if (victim == Victim::kStopped) {
    if (status.code() != absl::StatusCode::kDeadlineExceeded) return 11;
    // Both survivors wait on the victim alone, and name it with its state.
    if (message.find("rank 2 (pid") == std::string::npos ||
        message.find("stopped") == std::string::npos) {
      return 12;
    }
    return took < timeout * 3 ? 0 : 13;
  }
  if (status.code() != absl::StatusCode::kUnavailable) return 14;
  if (message.find("rank 2") == std::string::npos || message.find("exited") == std::string::npos) {
    return 15;
  }
  return took < milliseconds(3000) ? 0 : 16;  // far below the timeout: the pidfd says it at once
}

int RunForkedRank(const std::string& dir, int rank, Victim victim, milliseconds timeout,
                  std::optional<ShmAlgorithm> algorithm, bool shared) {
  auto files = FileStore::Open(dir);
  if (!files.ok()) return 2;
  ShmOptions options = Options(timeout);
  options.all_reduce = algorithm;
  auto comm = CreateShmCommunicator(**files, rank, kForkRanks, options);
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 3;
  }
  if (!(*comm)->Barrier().ok()) return 4;
  if (rank != 2) return RunSurvivor(**comm, victim, timeout, dir, shared);
  TestBuffer buffer(kBig, shared);
  float* data = buffer.data();
  if (data == nullptr) return 6;
  std::fill(data, data + kBig, 1.0f);
  switch (victim) {
    case Victim::kKilledBefore:
    case Victim::kStopped:
      pause();  // killed or stopped by the parent while the others wait
      return 0;
    case Victim::kKilledAfter:
      if (!(*comm)->AllReduce(data, kBig, DType::kFloat32, ReduceOp::kSum).ok()) return 5;
      pause();
      return 0;
    case Victim::kKilledDuring:
      for (;;) {
        if (!(*comm)->AllReduce(data, kBig, DType::kFloat32, ReduceOp::kSum).ok()) return 0;
      }
  }
  return 0;
}

struct Fault {
  Victim victim;
  ShmAlgorithm algorithm;  // kChunked: through the segment; kSingleCopy: peers' buffers
  bool shared = false;     // the buffers are shared blocks, which the peers map
};

class ShmProcessTest : public ::testing::TestWithParam<Fault> {};

TEST_P(ShmProcessTest, TheOthersFailFastAndNothingIsLeftInDevShm) {
  const Victim victim = GetParam().victim;
  const milliseconds timeout = victim == Victim::kStopped ? milliseconds(1500) : milliseconds(20000);
  char pattern[] = "/tmp/shardline_shm_fork_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  const std::set<std::string> shm_before = DevShm();
  std::vector<pid_t> children;
  for (int rank = 0; rank < kForkRanks; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // never back into gtest
      _exit(RunForkedRank(dir, rank, victim, timeout, GetParam().algorithm, GetParam().shared));
    }
    children.push_back(pid);
  }
  // Let the collectives start (after the bootstrap), then misbehave.
  if (victim == Victim::kKilledAfter) {
    EXPECT_TRUE(WaitForFile(dir + "/first-done-0") && WaitForFile(dir + "/first-done-1"));
  } else {
    std::this_thread::sleep_for(milliseconds(600));
  }
  kill(children[2], victim == Victim::kStopped ? SIGSTOP : SIGKILL);
  if (victim == Victim::kKilledAfter) {
    waitpid(children[2], nullptr, 0);  // dead for sure before the survivors go on
    std::ofstream(dir + "/killed");
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(children[rank], &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(10));
    }
    if (done == 0) {
      ADD_FAILURE() << "rank " << rank << " hung";
      kill(children[rank], SIGKILL);
      waitpid(children[rank], &status, 0);
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " exit code " << (WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  }
  if (victim != Victim::kKilledAfter) {
    kill(children[2], SIGKILL);
    waitpid(children[2], nullptr, 0);
  }
  EXPECT_EQ(DevShm(), shm_before);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Victims, ShmProcessTest,
    ::testing::Values(Fault{Victim::kKilledBefore, ShmAlgorithm::kChunked},
                      Fault{Victim::kKilledDuring, ShmAlgorithm::kChunked},
                      Fault{Victim::kKilledAfter, ShmAlgorithm::kChunked},
                      Fault{Victim::kStopped, ShmAlgorithm::kChunked},
                      Fault{Victim::kKilledBefore, ShmAlgorithm::kSingleCopy},
                      Fault{Victim::kKilledDuring, ShmAlgorithm::kSingleCopy},
                      Fault{Victim::kKilledAfter, ShmAlgorithm::kSingleCopy},
                      Fault{Victim::kStopped, ShmAlgorithm::kSingleCopy},
                      Fault{Victim::kKilledDuring, ShmAlgorithm::kSingleCopy, true},
                      Fault{Victim::kKilledAfter, ShmAlgorithm::kSingleCopy, true},
                      Fault{Victim::kStopped, ShmAlgorithm::kSingleCopy, true}),
    [](const auto& info) {
      std::string name = "?";
      switch (info.param.victim) {
        case Victim::kKilledBefore: name = "KilledBefore"; break;
        case Victim::kKilledDuring: name = "KilledDuring"; break;
        case Victim::kKilledAfter: name = "KilledAfter"; break;
        case Victim::kStopped: name = "Stopped"; break;
      }
      return name + (info.param.algorithm == ShmAlgorithm::kSingleCopy ? "SingleCopy" : "") +
             (info.param.shared ? "OfSharedBlocks" : "");
    });

// The single-copy all-reduce between processes, 3 forked ranks, a message of several blocks and
// an odd count, results bit-identical to the rank-order sum on every rank and every call. Whose
// buffer is a shared block decides how the others read it: mapped (all, or some of the ranks) or
// through the kernel (process_vm_readv, none). The mappings in each rank's /proc/self/maps
// say which path ran: its own block, and one per peer whose block it mapped.
struct SharedRanks {
  const char* name;
  bool shared[3];
};

class ShmSingleCopyTest : public ::testing::TestWithParam<SharedRanks> {};

TEST_P(ShmSingleCopyTest, AcrossProcessesTheResultsAreBitIdentical) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = (3 << 20) / 4 + 3;
  const SharedRanks ranks = GetParam();
  auto input = [](int rank, size_t i) {
    return std::sin(static_cast<float>(i) * 0.37f + rank) * std::pow(10.0f, (i + rank) % 7 - 3.0f);
  };
  char pattern[] = "/tmp/shardline_shm_copy_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  std::vector<pid_t> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {  // never back into gtest
      auto files = FileStore::Open(dir);
      if (!files.ok()) _exit(2);
      ShmOptions options = Options();
      options.all_reduce = ShmAlgorithm::kSingleCopy;
      auto comm = CreateShmCommunicator(**files, rank, kRanks, options);
      if (!comm.ok()) _exit(3);
      TestBuffer buffer(kCount, ranks.shared[rank]);
      float* data = buffer.data();
      if (data == nullptr) _exit(5);
      // Three calls: the first also finds out whether the ranks may read each other.
      for (int round = 0; round < 3; ++round) {
        for (size_t i = 0; i < kCount; ++i) data[i] = input(rank, i);
        const absl::Status status =
            (*comm)->AllReduce(data, kCount, DType::kFloat32, ReduceOp::kSum);
        if (!status.ok()) {
          fprintf(stderr, "rank %d: %s\n", rank, status.ToString().c_str());
          _exit(4);
        }
        std::ofstream(dir + "/result-" + std::to_string(rank) + "-" + std::to_string(round),
                      std::ios::binary)
            .write(reinterpret_cast<const char*>(data), kCount * sizeof(float));
      }
      std::ofstream(dir + "/mappings-" + std::to_string(rank)) << SharedBlockMappings();
      _exit(0);
    }
    children.push_back(pid);
  }
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "exit status " << status;
  }
  const std::vector<float> want = RankOrderSum(input, kRanks, kCount);
  for (int rank = 0; rank < kRanks; ++rank) {
    for (int round = 0; round < 3; ++round) {
      std::vector<float> got(kCount);
      std::ifstream(dir + "/result-" + std::to_string(rank) + "-" + std::to_string(round),
                    std::ios::binary)
          .read(reinterpret_cast<char*>(got.data()), kCount * sizeof(float));
      EXPECT_EQ(std::memcmp(got.data(), want.data(), kCount * sizeof(float)), 0)
          << "rank " << rank << " round " << round;
    }
    int want_mappings = ranks.shared[rank] ? 1 : 0;
    for (int peer = 0; peer < kRanks; ++peer) want_mappings += peer != rank && ranks.shared[peer];
    int mappings = -1;
    std::ifstream(dir + "/mappings-" + std::to_string(rank)) >> mappings;
    EXPECT_EQ(mappings, want_mappings) << "rank " << rank;
  }
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Buffers, ShmSingleCopyTest,
                         ::testing::Values(SharedRanks{"Heap", {false, false, false}},
                                           SharedRanks{"SharedBlocks", {true, true, true}},
                                           SharedRanks{"Mixed", {true, false, true}}),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace shardline::comm
