// NCCL backend (built only with CUDA). The unique-id exchange and the failure paths need no GPU;
// the real communicator test runs where a GPU is visible and is skipped, saying why, elsewhere.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <string>
#include <thread>
#include <vector>

#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace shardline::comm {
namespace {

using ::testing::HasSubstr;
using std::chrono::milliseconds;

// Empty when a GPU is usable, else why not (cudaGetDeviceCount's error string).
std::string NoGpuReason() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return std::string("no usable GPU: cudaGetDeviceCount: ") + cudaGetErrorString(error);
  }
  if (count == 0) return "no usable GPU: cudaGetDeviceCount found none";
  return "";
}

TEST(NcclTest, Built) { EXPECT_TRUE(NcclBuilt()); }

TEST(NcclTest, UniqueIdExchangeAcrossThreadsNeedsNoGpu) {
  InMemoryStore store;
  PrefixStore group("job/gen0/tp0", store);
  std::vector<absl::StatusOr<std::string>> ids(3, absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  // Rank 0 starts last, so that the others really wait for its id.
  for (int rank : {2, 1, 0}) {
    threads.emplace_back([&, rank] {
      if (rank == 0) std::this_thread::sleep_for(milliseconds(50));
      ids[rank] = ExchangeNcclUniqueId(group, rank, milliseconds(10000));
    });
  }
  for (auto& t : threads) t.join();
  for (int rank = 0; rank < 3; ++rank) {
    ASSERT_TRUE(ids[rank].ok()) << "rank " << rank << ": " << ids[rank].status();
    EXPECT_EQ(ids[rank]->size(), sizeof(ncclUniqueId));
    EXPECT_EQ(*ids[rank], *ids[0]);
  }
  EXPECT_TRUE(std::any_of(ids[0]->begin(), ids[0]->end(), [](char c) { return c != 0; }));
  EXPECT_EQ(*store.Get("job/gen0/tp0/nccl_id", milliseconds(0)), *ids[0]);
}

TEST(NcclTest, UniqueIdOfTheWrongSizeIsAnError) {
  InMemoryStore store;
  ASSERT_TRUE(store.Set("nccl_id", std::string(100, 'x')).ok());
  auto id = ExchangeNcclUniqueId(store, 1, milliseconds(1000));
  ASSERT_FALSE(id.ok());
  EXPECT_EQ(id.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("100 bytes"));
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("128"));
}

TEST(NcclTest, UniqueIdNeverPublishedTimesOut) {
  InMemoryStore store;
  auto id = ExchangeNcclUniqueId(store, 2, milliseconds(100));
  EXPECT_EQ(id.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(id.status().message()), HasSubstr("nccl_id"));
}

TEST(NcclTest, CreateWithoutAGpuIsFailedPrecondition) {
  if (NoGpuReason().empty()) GTEST_SKIP() << "a GPU is visible; RealCommunicator covers this";
  InMemoryStore store;
  auto comm = CreateNcclCommunicator(store, 0, 1, NcclOptions{});
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
  EXPECT_THAT(std::string(comm.status().message()), HasSubstr("no usable CUDA device"));
  // And again: the failure leaves nothing behind that breaks a second attempt.
  auto again = CreateNcclCommunicator(store, 0, 1, NcclOptions{});
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(NcclTest, BadDeviceIndexIsFailedPrecondition) {
  InMemoryStore store;
  NcclOptions options;
  options.device = 1000;
  auto comm = CreateNcclCommunicator(store, 0, 1, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kFailedPrecondition) << comm.status();
}

TEST(NcclTest, RealCommunicatorOfOne) {
  if (const std::string reason = NoGpuReason(); !reason.empty()) GTEST_SKIP() << reason;
  InMemoryStore store;
  NcclOptions options;
  options.timeout = milliseconds(30000);
  auto comm = CreateNcclCommunicator(store, 0, 1, options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  EXPECT_EQ((*comm)->backend(), "nccl");

  constexpr size_t kCount = 1 << 20;
  std::vector<float> host(kCount);
  for (size_t i = 0; i < kCount; ++i) host[i] = static_cast<float>(i % 100);
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, kCount * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(device, host.data(), kCount * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
    ASSERT_TRUE((*comm)->AllReduce(device, kCount, DType::kFloat32, op).ok());
  }
  ASSERT_TRUE((*comm)->Broadcast(device, kCount, DType::kFloat32, 0).ok());
  ASSERT_TRUE((*comm)->Barrier().ok());
  std::vector<float> back(kCount);
  ASSERT_EQ(cudaMemcpy(back.data(), device, kCount * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  EXPECT_EQ(back, host);  // a world of one reduces to itself

  (*comm)->Abort();
  auto status = (*comm)->AllReduce(device, kCount, DType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  cudaFree(device);
}

}  // namespace
}  // namespace shardline::comm
