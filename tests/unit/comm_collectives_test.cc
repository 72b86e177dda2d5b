// Every CPU backend through the same checks: Gloo, shared memory and the hierarchical shm+gloo
// path (ranks as threads over one InMemoryStore, world sizes 2, 3, 4), every collective, reduce op
// and dtype against a locally computed reference. Then Gloo's failures (missing peer, timeout,
// Abort) and one Gloo run with ranks as forked processes over a FileStore. The shared-memory
// backend's own failure tests are in comm_shm_test.cc.
#include <arpa/inet.h>
#include <gloo/transport/tcp/address.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/cpu_communicator.h"
#include "worker/comm/file_store.h"
#include "worker/comm/gloo_communicator.h"
#include "worker/comm/shm_communicator.h"
#include "worker/comm/store.h"

namespace shardline::comm {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;
using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};

GlooOptions TestOptions(milliseconds timeout = milliseconds(20000)) {
  GlooOptions options;
  options.hostname = "127.0.0.1";
  options.timeout = timeout;
  return options;
}

// The backends under test: "gloo", "shm", and "shm+gloo" (the hierarchical path, ranks split
// between two host identities by parity, so that each host's ranks are not contiguous).
absl::StatusOr<std::unique_ptr<Communicator>> Create(const std::string& backend, Store& store,
                                                     int rank, int n, const GlooOptions& options) {
  if (backend == "shm") {
    ShmOptions shm;
    shm.timeout = options.timeout;
    return CreateShmCommunicator(store, rank, n, shm);
  }
  if (backend == "shm+gloo") {
    CpuCommOptions cpu;
    cpu.gloo = options;
    cpu.shm.timeout = options.timeout;
    cpu.host_id = "host-" + std::to_string(rank % 2);
    return CreateCpuCommunicator(store, rank, n, cpu);
  }
  return CreateGlooCommunicator(store, rank, n, options);
}

// Runs body(comm) on `n` threads, one communicator per rank, all bootstrapped over one store.
void RunRanks(int n, const std::function<void(Communicator&)>& body,
              const GlooOptions& options = TestOptions(), const std::string& backend = "gloo") {
  InMemoryStore store;
  std::vector<absl::Status> bootstrap(n);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      auto comm = Create(backend, store, rank, n, options);
      if (!comm.ok()) {
        bootstrap[rank] = comm.status();
        return;
      }
      EXPECT_EQ((*comm)->rank(), rank);
      EXPECT_EQ((*comm)->size(), n);
      EXPECT_EQ((*comm)->backend(), backend);
      body(**comm);
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < n; ++rank) {
    ASSERT_TRUE(bootstrap[rank].ok()) << "rank " << rank << ": " << bootstrap[rank];
  }
}

template <typename T>
struct TypeOf;
template <>
struct TypeOf<float> {
  static constexpr DType kDType = DType::kFloat32;
};
template <>
struct TypeOf<double> {
  static constexpr DType kDType = DType::kFloat64;
};
template <>
struct TypeOf<int32_t> {
  static constexpr DType kDType = DType::kInt32;
};
template <>
struct TypeOf<int64_t> {
  static constexpr DType kDType = DType::kInt64;
};

// Small integers (negative too, for min/max): every sum, and every average's single rounding,
// is the same whatever the order of reduction, so results must match exactly.
template <typename T>
T Value(int rank, size_t i, int salt = 0) {
  return static_cast<T>(static_cast<int64_t>((rank * 7 + i * 3 + salt * 5) % 17) - 8);
}

template <typename T>
T Reduce(ReduceOp op, int n, size_t i, int salt = 0) {
  T acc = Value<T>(0, i, salt);
  for (int r = 1; r < n; ++r) {
    const T v = Value<T>(r, i, salt);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc = static_cast<T>(acc + v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
    }
  }
  if (op == ReduceOp::kAvg) acc = static_cast<T>(acc / static_cast<T>(n));
  return acc;
}

// Element counts: none, tiny, odd, not a multiple of the world size, past Gloo's 512 KiB
// segment, exactly one shared-memory chunk (1 MiB), one chunk + 1, and many chunks.
template <typename T>
std::vector<size_t> Counts() {
  return {0, 1, 3, 1000, 65537, (1u << 20) / sizeof(T), (1u << 20) / sizeof(T) + 1,
          (3u << 20) / sizeof(T) + 7};
}

// Compares without gtest's per-element output (millions of elements); reports the first mismatch.
template <typename T>
void ExpectEqualVectors(const std::vector<T>& got, const std::vector<T>& want,
                        const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i] != want[i]) {
      ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", want " << want[i];
      return;
    }
  }
}

struct World {
  std::string backend;
  int n;
};
// So that ctest's listing names the parameter ("shm n=3") instead of dumping its bytes.
void PrintTo(const World& world, std::ostream* os) { *os << world.backend << " n=" << world.n; }

class WorldTest : public ::testing::TestWithParam<World> {
 protected:
  int n() const { return GetParam().n; }
  void Run(const std::function<void(Communicator&)>& body) {
    RunRanks(n(), body, TestOptions(), GetParam().backend);
  }
};

template <typename T>
void CheckAllReduce(Communicator& comm) {
  const int n = comm.size();
  for (size_t count : Counts<T>()) {
    for (ReduceOp op : kAllOps) {
      std::vector<T> data(count), want(count);
      for (size_t i = 0; i < count; ++i) {
        data[i] = Value<T>(comm.rank(), i);
        want[i] = Reduce<T>(op, n, i);
      }
      const std::string what = "all_reduce " + std::string(ReduceOpName(op)) + " " +
                               std::string(DTypeName(TypeOf<T>::kDType)) + " x" +
                               std::to_string(count) + " rank " + std::to_string(comm.rank());
      ASSERT_TRUE(comm.AllReduce(data.data(), count, TypeOf<T>::kDType, op).ok()) << what;
      ExpectEqualVectors(data, want, what);
    }
  }
}

TEST_P(WorldTest, AllReduceEveryOpDTypeAndSize) {
  Run([](Communicator& comm) {
    CheckAllReduce<float>(comm);
    CheckAllReduce<double>(comm);
    CheckAllReduce<int32_t>(comm);
    CheckAllReduce<int64_t>(comm);
  });
}

template <typename T>
void CheckAllGather(Communicator& comm) {
  const int n = comm.size();
  for (size_t count : Counts<T>()) {
    std::vector<T> send(count), recv(count * n), want(count * n);
    for (size_t i = 0; i < count; ++i) send[i] = Value<T>(comm.rank(), i);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) want[r * count + i] = Value<T>(r, i);
    }
    const std::string what = "all_gather " + std::string(DTypeName(TypeOf<T>::kDType)) + " x" +
                             std::to_string(count);
    ASSERT_TRUE(comm.AllGather(send.data(), recv.data(), count, TypeOf<T>::kDType).ok()) << what;
    ExpectEqualVectors(recv, want, what);
  }
}

TEST_P(WorldTest, AllGatherEveryDTypeAndSize) {
  Run([](Communicator& comm) {
    CheckAllGather<float>(comm);
    CheckAllGather<double>(comm);
    CheckAllGather<int32_t>(comm);
    CheckAllGather<int64_t>(comm);
  });
}

template <typename T>
void CheckReduceScatter(Communicator& comm) {
  const int n = comm.size();
  for (size_t count : Counts<T>()) {
    for (ReduceOp op : kAllOps) {
      // Element j of block b is element b*count+j of the full vector.
      std::vector<T> send(count * n), recv(count, T(99)), want(count);
      for (size_t i = 0; i < send.size(); ++i) send[i] = Value<T>(comm.rank(), i);
      for (size_t j = 0; j < count; ++j) want[j] = Reduce<T>(op, n, comm.rank() * count + j);
      const std::string what = "reduce_scatter " + std::string(ReduceOpName(op)) + " " +
                               std::string(DTypeName(TypeOf<T>::kDType)) + " x" +
                               std::to_string(count) + " rank " + std::to_string(comm.rank());
      ASSERT_TRUE(comm.ReduceScatter(send.data(), recv.data(), count, TypeOf<T>::kDType, op).ok())
          << what;
      ExpectEqualVectors(recv, want, what);
    }
  }
}

TEST_P(WorldTest, ReduceScatterEveryOpDTypeAndSize) {
  Run([](Communicator& comm) {
    CheckReduceScatter<float>(comm);
    CheckReduceScatter<double>(comm);
    CheckReduceScatter<int32_t>(comm);
    CheckReduceScatter<int64_t>(comm);
  });
}

template <typename T>
void CheckBroadcast(Communicator& comm) {
  for (int root = 0; root < comm.size(); ++root) {
    for (size_t count : Counts<T>()) {
      std::vector<T> data(count), want(count);
      for (size_t i = 0; i < count; ++i) {
        data[i] = Value<T>(comm.rank(), i, /*salt=*/root);
        want[i] = Value<T>(root, i, root);
      }
      const std::string what = "broadcast from " + std::to_string(root) + " " +
                               std::string(DTypeName(TypeOf<T>::kDType)) + " x" +
                               std::to_string(count);
      ASSERT_TRUE(comm.Broadcast(data.data(), count, TypeOf<T>::kDType, root).ok()) << what;
      ExpectEqualVectors(data, want, what);
    }
  }
}

TEST_P(WorldTest, BroadcastFromEveryRoot) {
  Run([](Communicator& comm) {
    CheckBroadcast<float>(comm);
    CheckBroadcast<int64_t>(comm);
  });
  Run([](Communicator& comm) {
    CheckBroadcast<double>(comm);
    CheckBroadcast<int32_t>(comm);
  });
}

TEST_P(WorldTest, SendRecvRing) {
  Run([](Communicator& comm) {
    const int n = comm.size();
    const int right = (comm.rank() + 1) % n;
    const int left = (comm.rank() + n - 1) % n;
    // Several messages in a row, small and large, must arrive in order.
    for (size_t count : {size_t{1}, size_t{1000}, size_t{(2u << 20) + 3}, size_t{5}}) {
      std::vector<int32_t> send(count), recv(count, -1), want(count);
      for (size_t i = 0; i < count; ++i) {
        send[i] = Value<int32_t>(comm.rank(), i, static_cast<int>(count % 13));
        want[i] = Value<int32_t>(left, i, static_cast<int>(count % 13));
      }
      // Send completes only once the peer has posted its Recv: alternate to avoid a cycle.
      if (comm.rank() % 2 == 0) {
        ASSERT_TRUE(comm.Send(send.data(), count, DType::kInt32, right).ok());
        ASSERT_TRUE(comm.Recv(recv.data(), count, DType::kInt32, left).ok());
      } else {
        ASSERT_TRUE(comm.Recv(recv.data(), count, DType::kInt32, left).ok());
        ASSERT_TRUE(comm.Send(send.data(), count, DType::kInt32, right).ok());
      }
      ExpectEqualVectors(recv, want, "ring x" + std::to_string(count));
    }
  });
}

TEST_P(WorldTest, SendRecvEveryRankAtOnce) {
  Run([](Communicator& comm) {
    const int n = comm.size();
    const int right = (comm.rank() + 1) % n;
    const int left = (comm.rank() + n - 1) % n;
    // Every rank sends right and receives from the left in the same call: with blocking Send/Recv
    // this is the cycle the alternation above avoids; SendRecv must complete it as it stands.
    for (size_t count : {size_t{1}, size_t{(2u << 20) + 3}, size_t{7}}) {
      std::vector<float> send(count), recv(count, -1.0f), want(count);
      for (size_t i = 0; i < count; ++i) {
        send[i] = Value<float>(comm.rank(), i, 3);
        want[i] = Value<float>(left, i, 3);
      }
      ASSERT_TRUE(comm.SendRecv(send.data(), count, right, recv.data(), count, left,
                                DType::kFloat32)
                      .ok());
      ExpectEqualVectors(recv, want, "send_recv x" + std::to_string(count));
    }
    // One half may be empty: rank 0 only sends, the last rank only receives.
    std::vector<float> one = {static_cast<float>(comm.rank())}, got = {-1.0f};
    const bool sends = comm.rank() < n - 1;
    const bool receives = comm.rank() > 0;
    ASSERT_TRUE(comm.SendRecv(one.data(), sends ? 1 : 0, right, got.data(), receives ? 1 : 0, left,
                              DType::kFloat32)
                    .ok());
    EXPECT_EQ(got[0], receives ? static_cast<float>(left) : -1.0f);
  });
}

TEST_P(WorldTest, BarrierWaitsForTheLastRank) {
  std::mutex mu;
  std::vector<Clock::duration> waited;
  Run([&](Communicator& comm) {
    ASSERT_TRUE(comm.Barrier().ok());  // line everyone up first
    if (comm.rank() == comm.size() - 1) std::this_thread::sleep_for(milliseconds(200));
    const auto start = Clock::now();
    ASSERT_TRUE(comm.Barrier().ok());
    if (comm.rank() != comm.size() - 1) {
      std::lock_guard<std::mutex> lock(mu);
      waited.push_back(Clock::now() - start);
    }
  });
  ASSERT_EQ(waited.size(), static_cast<size_t>(n() - 1));
  for (auto w : waited) EXPECT_GE(w, milliseconds(150));
}

TEST_P(WorldTest, ObserverSeesEveryOperation) {
  struct Call {
    std::string op;
    size_t bytes;
    bool ok;
  };
  class Recorder : public CommObserver {
   public:
    void OnOperation(std::string_view op, size_t bytes, double seconds, bool ok) override {
      EXPECT_GE(seconds, 0.0);
      calls.push_back({std::string(op), bytes, ok});
    }
    std::vector<Call> calls;
  };
  const int n = this->n();
  Run([&](Communicator& comm) {
    Recorder recorder;
    comm.set_observer(&recorder);
    std::vector<float> data(1000, 1.0f), gathered(1000 * n), block(1000);
    std::vector<float> full(1000 * n, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), 1000, DType::kFloat32, ReduceOp::kSum).ok());
    ASSERT_TRUE(comm.AllGather(data.data(), gathered.data(), 1000, DType::kFloat32).ok());
    ASSERT_TRUE(
        comm.ReduceScatter(full.data(), block.data(), 1000, DType::kFloat32, ReduceOp::kSum).ok());
    ASSERT_TRUE(comm.Broadcast(data.data(), 10, DType::kFloat64, 0).ok());
    if (comm.rank() == 0) {
      ASSERT_TRUE(comm.Send(data.data(), 7, DType::kFloat32, 1).ok());
    }
    if (comm.rank() == 1) {
      ASSERT_TRUE(comm.Recv(data.data(), 7, DType::kFloat32, 0).ok());
    }
    ASSERT_TRUE(comm.Barrier().ok());
    EXPECT_FALSE(comm.Broadcast(data.data(), 8, DType::kFloat32, /*root=*/n).ok());

    std::vector<std::string> ops;
    for (const Call& c : recorder.calls) ops.push_back(c.op);
    std::vector<std::string> want_ops = {"all_reduce", "all_gather", "reduce_scatter", "broadcast"};
    if (comm.rank() == 0) want_ops.push_back("send");
    if (comm.rank() == 1) want_ops.push_back("recv");
    want_ops.push_back("barrier");
    want_ops.push_back("broadcast");
    ASSERT_EQ(ops, want_ops);
    EXPECT_EQ(recorder.calls[0].bytes, 4000u);
    EXPECT_EQ(recorder.calls[1].bytes, 4000u);
    EXPECT_EQ(recorder.calls[2].bytes, 4000u * n);  // reduce_scatter: the whole input
    EXPECT_EQ(recorder.calls[3].bytes, 80u);
    if (comm.rank() <= 1) {
      EXPECT_EQ(recorder.calls[4].bytes, 28u);
    }
    EXPECT_EQ(recorder.calls[ops.size() - 2].bytes, 0u);
    for (size_t i = 0; i + 1 < recorder.calls.size(); ++i) EXPECT_TRUE(recorder.calls[i].ok);
    EXPECT_FALSE(recorder.calls.back().ok);
  });
}

// The network bytes each backend reports: Gloo's are the formulas of GlooWireBytes, shared
// memory's none, and shm+gloo's those of its cross-host Gloo group alone (an all-reduce of this
// rank's 1/L shard between the hosts), reported to the outer communicator's observer; every one
// comes before its operation's OnOperation.
TEST_P(WorldTest, NetworkBytesAreWhatTheAlgorithmMovesOverTcpOnly) {
  class Recorder : public CommObserver {
   public:
    void OnOperation(std::string_view, size_t, double, bool) override { operations++; }
    void OnNetworkBytes(uint64_t s, uint64_t r) override {
      EXPECT_EQ(operations, last_counted_at) << "at most one report per operation, before it";
      last_counted_at = operations + 1;
      sent += s;
      received += r;
    }
    int operations = 0;
    int last_counted_at = 0;
    uint64_t sent = 0, received = 0;
  };
  const int n = this->n();
  const std::string backend = GetParam().backend;
  Run([&](Communicator& comm) {
    Recorder recorder;
    comm.set_observer(&recorder);
    std::vector<float> data(1000, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), 1000, DType::kFloat32, ReduceOp::kSum).ok());
    WireBytes want;
    if (backend == "gloo") want = GlooWireBytes::AllReduce(4000, 4, n, comm.rank());
    // Two hosts by parity: the cross group's rank is the host's index, its shard 1000/2 floats.
    if (backend == "shm+gloo") want = GlooWireBytes::AllReduce(2000, 4, 2, comm.rank() % 2);
    EXPECT_EQ(recorder.sent, want.sent) << backend << " rank " << comm.rank();
    EXPECT_EQ(recorder.received, want.received) << backend << " rank " << comm.rank();
    if (backend != "shm") EXPECT_GT(recorder.sent, 0u);
    // The other operations run on Gloo for shm+gloo: a ring all-gather moves (n-1) blocks.
    recorder.sent = recorder.received = 0;
    std::vector<float> gathered(1000 * n);
    ASSERT_TRUE(comm.AllGather(data.data(), gathered.data(), 1000, DType::kFloat32).ok());
    const uint64_t gather = backend == "shm" ? 0 : 4000u * static_cast<uint64_t>(n - 1);
    EXPECT_EQ(recorder.sent, gather);
    EXPECT_EQ(recorder.received, gather);
  });
}

// The formulas, against what any correct schedule must satisfy: what the ranks send is what they
// receive, a ring all-reduce of equal chunks moves 2(n-1)/n of the buffer each way, and a
// broadcast delivers the buffer once to every rank but the root.
TEST(GlooWireBytesTest, EveryByteSentIsReceivedAndEqualChunksGiveTheRingFigure) {
  EXPECT_EQ(GlooWireBytes::AllReduce(4 << 20, 4, 2, 0).sent, uint64_t{4} << 20);
  EXPECT_EQ(GlooWireBytes::AllReduce(4 << 20, 4, 2, 1).received, uint64_t{4} << 20);
  EXPECT_EQ(GlooWireBytes::AllReduce(4 << 20, 4, 4, 3).sent, uint64_t{6} << 20);  // 1.5 B
  EXPECT_EQ(GlooWireBytes::AllReduce(4000, 4, 1, 0).sent, 0u);
  for (int n : {2, 3, 4, 5, 8}) {
    for (size_t elements :
         {size_t{1}, size_t{3}, size_t{1000}, size_t{65537}, size_t{(3u << 20) / 4 + 7}}) {
      const size_t bytes = elements * 4;
      uint64_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        const WireBytes w = GlooWireBytes::AllReduce(bytes, 4, n, r);
        EXPECT_LE(w.sent, 2 * bytes);
        sent += w.sent;
        received += w.received;
      }
      EXPECT_EQ(sent, received) << "all_reduce of " << bytes << " bytes over " << n;
      // Every element is reduced once and gathered once across the ring: 2(n-1) B in all.
      EXPECT_EQ(sent, 2 * static_cast<uint64_t>(n - 1) * bytes)
          << "all_reduce of " << bytes << " bytes over " << n;
    }
    for (int root = 0; root < n; ++root) {
      uint64_t sent = 0, received = 0;
      for (int r = 0; r < n; ++r) {
        const WireBytes w = GlooWireBytes::Broadcast(100, n, r, root);
        EXPECT_EQ(w.received, r == root ? 0u : 100u) << "rank " << r << " root " << root;
        sent += w.sent;
        received += w.received;
      }
      EXPECT_EQ(sent, received);
    }
    EXPECT_EQ(GlooWireBytes::AllGather(10, n).sent, 10u * static_cast<uint64_t>(n - 1));
    EXPECT_EQ(GlooWireBytes::ReduceScatter(10, n).received, 10u * static_cast<uint64_t>(n - 1));
  }
}

// shm+gloo needs hosts of equal size: two hosts of two ranks (2 or 3 ranks would be plain Gloo).
INSTANTIATE_TEST_SUITE_P(Backends, WorldTest,
                         ::testing::Values(World{"gloo", 2}, World{"gloo", 3}, World{"gloo", 4},
                                           World{"shm", 2}, World{"shm", 3}, World{"shm", 4},
                                           World{"shm+gloo", 4}),
                         [](const auto& info) {
                           std::string name = info.param.backend;
                           std::replace(name.begin(), name.end(), '+', '_');
                           return name + "_n" + std::to_string(info.param.n);
                         });

TEST(GlooTest, WorldOfOne) {
  RunRanks(1, [](Communicator& comm) {
    std::vector<double> data = {1, 2, 3}, out(3);
    ASSERT_TRUE(comm.AllReduce(data.data(), 3, DType::kFloat64, ReduceOp::kAvg).ok());
    EXPECT_EQ(data, (std::vector<double>{1, 2, 3}));
    ASSERT_TRUE(comm.AllGather(data.data(), out.data(), 3, DType::kFloat64).ok());
    EXPECT_EQ(out, data);
    ASSERT_TRUE(comm.ReduceScatter(data.data(), out.data(), 3, DType::kFloat64, ReduceOp::kSum).ok());
    EXPECT_EQ(out, data);
    ASSERT_TRUE(comm.Broadcast(data.data(), 3, DType::kFloat64, 0).ok());
    ASSERT_TRUE(comm.Barrier().ok());
  });
}

TEST(GlooTest, UnsupportedDTypeAndBadArgumentsAreInvalidArgument) {
  RunRanks(2, [](Communicator& comm) {
    std::vector<uint16_t> half(8);
    auto status = comm.AllReduce(half.data(), 8, DType::kBFloat16, ReduceOp::kSum);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("bf16"));
    status = comm.ReduceScatter(half.data(), half.data(), 4, DType::kFloat16, ReduceOp::kSum);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("f16"));
    std::vector<float> data(4);
    status = comm.Broadcast(data.data(), 4, DType::kFloat32, 2);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(status.message()), HasSubstr("root"));
    status = comm.Send(data.data(), 4, DType::kFloat32, comm.rank());
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
    // The communicator still works after rejected calls.
    EXPECT_TRUE(comm.AllReduce(data.data(), 4, DType::kFloat32, ReduceOp::kSum).ok());
  });
}

TEST(GlooTest, PeerThatNeverJoinsIsDeadlineExceededNamingIt) {
  InMemoryStore store;
  const GlooOptions options = TestOptions(milliseconds(500));
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int rank = 0; rank < 2; ++rank) {  // rank 2 of 3 never starts
    threads.emplace_back([&, rank] {
      results[rank] = CreateGlooCommunicator(store, rank, 3, options).status();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(Clock::now() - start, milliseconds(5000));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].code(), absl::StatusCode::kDeadlineExceeded) << results[rank];
    const std::string message(results[rank].message());
    EXPECT_THAT(message, HasSubstr("rank 2")) << message;
    EXPECT_THAT(message, HasSubstr("500 ms")) << message;
    EXPECT_THAT(message, HasSubstr("gloo bootstrap of rank " + std::to_string(rank))) << message;
  }
}

// A rank's view of the group's store in which the membership key is another group's: a process
// that speaks Gloo and knows the pairs' addresses, but is not a member.
class OtherGroupsKeyStore final : public Store {
 public:
  explicit OtherGroupsKeyStore(Store& inner) : inner_(inner) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, milliseconds timeout) override {
    if (key == "gloo/membership_key") return std::string(64, 'a');
    return inner_.Get(key, timeout);
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_.Add(key, delta);
  }

 private:
  Store& inner_;
};

TEST(GlooTest, APeerWithoutTheGroupsKeyIsRefusedOnBothSides) {
  InMemoryStore store;
  OtherGroupsKeyStore outsider_view(store);
  const GlooOptions options = TestOptions(milliseconds(5000));
  std::vector<absl::Status> results(2);
  std::thread member([&] { results[0] = CreateGlooCommunicator(store, 0, 2, options).status(); });
  std::thread outsider(
      [&] { results[1] = CreateGlooCommunicator(outsider_view, 1, 2, options).status(); });
  member.join();
  outsider.join();
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(results[rank].code(), absl::StatusCode::kPermissionDenied) << results[rank];
    EXPECT_THAT(std::string(results[rank].message()),
                HasSubstr("the connection to rank " + std::to_string(1 - rank) +
                          " failed its proof of membership"))
        << results[rank];
  }
}

// Holds every rank's reads of the pairs' addresses ("gloo/0", "gloo/1") until Open(), so that a
// test can reach a listening pair before the real peer does.
class GatedStore final : public Store {
 public:
  explicit GatedStore(Store& inner) : inner_(inner) {}
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    opened_.notify_all();
  }
  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_.Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key, milliseconds timeout) override {
    const auto deadline = Clock::now() + timeout;
    if (key == "gloo/0" || key == "gloo/1") {
      std::unique_lock<std::mutex> lock(mu_);
      if (!opened_.wait_until(lock, deadline, [&] { return open_; })) {
        return absl::DeadlineExceededError("gate on " + key + " never opened");
      }
    }
    return inner_.Get(key, std::chrono::duration_cast<milliseconds>(deadline - Clock::now()));
  }
  absl::StatusOr<int64_t> Add(const std::string& key, int64_t delta) override {
    return inner_.Add(key, delta);
  }

 private:
  Store& inner_;
  std::mutex mu_;
  std::condition_variable opened_;
  bool open_ = false;
};

TEST(GlooTest, AnOutsiderHoldingAListeningPairNeverJoinsAndTheBootstrapFailsInTime) {
  InMemoryStore store;
  GatedStore gated(store);
  const GlooOptions options = TestOptions(milliseconds(1500));
  std::vector<absl::Status> results(2);
  std::vector<std::thread> ranks;
  const auto start = Clock::now();
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back(
        [&, rank] { results[rank] = CreateGlooCommunicator(gated, rank, 2, options).status(); });
  }
  // Each rank publishes one address, its pair with the other. Gloo's pair with the smaller
  // address listens (tcp/pair.cc compares the IPs, then the raw ports) and takes the first
  // connection that arrives.
  sockaddr_in address[2];
  for (int rank = 0; rank < 2; ++rank) {
    auto blob = store.Get("gloo/" + std::to_string(rank), milliseconds(5000));
    ASSERT_TRUE(blob.ok()) << blob.status();
    const gloo::transport::tcp::Address parsed(std::vector<char>(blob->begin(), blob->end()));
    std::memcpy(&address[rank], &parsed.getSockaddr(), sizeof(sockaddr_in));
  }
  const int listener =
      static_cast<int>(address[0].sin_port) < static_cast<int>(address[1].sin_port) ? 0 : 1;
  const int outsider = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(outsider, 0);
  ASSERT_EQ(connect(outsider, reinterpret_cast<const sockaddr*>(&address[listener]),
                    sizeof(sockaddr_in)),
            0)
      << strerror(errno);
  gated.Open();  // the real peer connects now, second in the listener's queue
  for (auto& t : ranks) t.join();
  close(outsider);

  EXPECT_LT(Clock::now() - start, milliseconds(10000));  // bounded by the timeout, not a hang
  EXPECT_EQ(results[listener].code(), absl::StatusCode::kDeadlineExceeded) << results[listener];
  EXPECT_THAT(std::string(results[listener].message()),
              HasSubstr("the connection to rank " + std::to_string(1 - listener) +
                        " sent no proof of membership within 1500 ms"))
      << results[listener];
  // The real peer found the listener taken: its connect was refused or reset.
  EXPECT_FALSE(results[1 - listener].ok());
  EXPECT_THAT(std::string(results[1 - listener].message()),
              HasSubstr("gloo bootstrap of rank " + std::to_string(1 - listener)));
}

TEST(GlooTest, BadRankIsInvalidArgument) {
  InMemoryStore store;
  auto comm = CreateGlooCommunicator(store, 3, 3, TestOptions());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlooTest, RecvWithoutSendTimesOut) {
  std::atomic<bool> done{false};
  RunRanks(2, [&](Communicator& comm) {
    if (comm.rank() != 0) {
      // Stay connected but silent: a closed connection would be Unavailable, not a timeout.
      while (!done) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    std::vector<float> data(16);
    const auto start = Clock::now();
    auto status = comm.Recv(data.data(), 16, DType::kFloat32, 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("recv of 16 f32 on rank 0 of 2"));
    EXPECT_GE(Clock::now() - start, milliseconds(250));
    done = true;
  }, TestOptions(milliseconds(300)));
}

TEST(GlooTest, AbortFailsLaterCallsAtOnce) {
  RunRanks(2, [](Communicator& comm) {
    std::vector<float> data(100, 1.0f);
    ASSERT_TRUE(comm.AllReduce(data.data(), 100, DType::kFloat32, ReduceOp::kSum).ok());
    comm.Abort();
    comm.Abort();  // idempotent
    const auto start = Clock::now();
    auto status = comm.AllReduce(data.data(), 100, DType::kFloat32, ReduceOp::kSum);
    EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("all_reduce of 100 f32 on rank"));
    EXPECT_EQ(comm.Barrier().code(), absl::StatusCode::kAborted);
    EXPECT_EQ(comm.Send(data.data(), 1, DType::kFloat32, 1 - comm.rank()).code(),
              absl::StatusCode::kAborted);
    EXPECT_LT(Clock::now() - start, milliseconds(1000));
  });
}

TEST(GlooTest, AbortWakesAPendingRecvAndThePeerFailsFast) {
  std::atomic<Communicator*> rank0{nullptr};
  RunRanks(2, [&](Communicator& comm) {
    std::vector<float> data(1000, 1.0f);
    ASSERT_TRUE(comm.Barrier().ok());
    if (comm.rank() == 0) {
      rank0 = &comm;
      std::thread aborter([&] {
        std::this_thread::sleep_for(milliseconds(200));
        comm.Abort();
      });
      const auto start = Clock::now();
      auto status = comm.Recv(data.data(), 1000, DType::kFloat32, 1);  // rank 1 never sends
      aborter.join();
      EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
      EXPECT_LT(Clock::now() - start, milliseconds(5000));
    } else {
      // The aborted rank closes its connections, so this fails well before the 20 s timeout.
      std::this_thread::sleep_for(milliseconds(400));
      const auto start = Clock::now();
      auto status = comm.AllReduce(data.data(), 1000, DType::kFloat32, ReduceOp::kSum);
      EXPECT_FALSE(status.ok());
      EXPECT_THAT(status.code(),
                  AnyOf(absl::StatusCode::kUnavailable, absl::StatusCode::kAborted))
          << status;
      EXPECT_LT(Clock::now() - start, milliseconds(5000)) << status;
    }
  });
}

// Ranks as processes: forked before this process has any Gloo thread, bootstrapped through a
// FileStore directory, as they would be on one host without a coordinator.
int RunForkedRank(const std::string& dir, int rank, int n) {
  auto files = FileStore::Open(dir);
  if (!files.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, files.status().ToString().c_str());
    return 2;
  }
  PrefixStore store("forked", **files);
  auto comm = CreateGlooCommunicator(store, rank, n, TestOptions());
  if (!comm.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, comm.status().ToString().c_str());
    return 3;
  }
  const size_t count = 100003;
  std::vector<float> data(count), block(count), full(count * n);
  for (size_t i = 0; i < count; ++i) data[i] = Value<float>(rank, i);
  for (size_t i = 0; i < full.size(); ++i) full[i] = Value<float>(rank, i);
  if (!(*comm)->AllReduce(data.data(), count, DType::kFloat32, ReduceOp::kSum).ok()) return 4;
  if (!(*comm)->ReduceScatter(full.data(), block.data(), count, DType::kFloat32, ReduceOp::kMax)
           .ok()) {
    return 5;
  }
  for (size_t i = 0; i < count; ++i) {
    if (data[i] != Reduce<float>(ReduceOp::kSum, n, i)) return 6;
    if (block[i] != Reduce<float>(ReduceOp::kMax, n, rank * count + i)) return 7;
  }
  return (*comm)->Barrier().ok() ? 0 : 8;
}

TEST(GlooProcessTest, ThreeForkedProcesses) {
  char pattern[] = "/tmp/shardline_gloo_fork_XXXXXX";
  ASSERT_NE(mkdtemp(pattern), nullptr);
  const std::string dir = pattern;
  constexpr int kRanks = 3;
  std::vector<pid_t> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) _exit(RunForkedRank(dir, rank, kRanks));  // never back into gtest
    children.push_back(pid);
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (int rank = 0; rank < kRanks; ++rank) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(children[rank], &status, WNOHANG)) == 0 && Clock::now() < deadline) {
      std::this_thread::sleep_for(milliseconds(20));
    }
    if (done == 0) {
      for (pid_t pid : children) kill(pid, SIGKILL);
      ADD_FAILURE() << "rank " << rank << " did not finish within 60 s";
      waitpid(children[rank], &status, 0);
      continue;
    }
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " exited with status " << status << " (exit code "
        << (WIFEXITED(status) ? WEXITSTATUS(status) : -1) << ")";
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardline::comm
