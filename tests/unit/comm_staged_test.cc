// comm::StagedCommunicator: a host communicator carrying a backend's buffers through host memory.
// Real processes over the host communicators CPU actors get (shared memory), every operation
// through the staged wrapper, each result checked against the values worked out here. The backend
// is the CPU's, so its "device" copies are plain copies: what is tested is the staging (which
// buffer, how many bytes, which direction), which is the same on a GPU; the GPU case itself is
// model_engine_cuda_test's two ranks on one GPU.
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/support/forked_world.h"
#include "worker/comm/staged_communicator.h"

namespace shardline::comm {
namespace {

// Every operation on a group of `size` ranks; returns the number of the first check that failed.
int RunRank(Communicator& host) {
  kernels::cpu::CpuBackend backend;
  StagedCommunicator staged(host, backend);
  if (!staged.device_buffers() || staged.size() != host.size()) return 2;
  const int rank = staged.rank(), size = staged.size();
  const float r = static_cast<float>(rank);

  std::vector<float> x = {r + 1, 10 * (r + 1), -r};
  if (!staged.AllReduce(x.data(), x.size(), DType::kFloat32, ReduceOp::kSum).ok()) return 3;
  const float n = static_cast<float>(size);
  if (x != std::vector<float>{n * (n + 1) / 2, 5 * n * (n + 1), -n * (n - 1) / 2}) return 4;

  std::vector<float> mine = {r, r + 0.5f}, all(2 * size);
  if (!staged.AllGather(mine.data(), all.data(), 2, DType::kFloat32).ok()) return 5;
  for (int i = 0; i < size; ++i) {
    if (all[2 * i] != i || all[2 * i + 1] != i + 0.5f) return 6;
  }

  // Each rank gives i + rank to block i of size 2; block `rank` comes back summed.
  std::vector<float> blocks(2 * size), reduced(2);
  for (int i = 0; i < 2 * size; ++i) blocks[i] = static_cast<float>(i / 2) + r;
  if (!staged.ReduceScatter(blocks.data(), reduced.data(), 2, DType::kFloat32, ReduceOp::kSum)
           .ok()) {
    return 7;
  }
  const float expected = n * r + n * (n - 1) / 2;
  if (reduced[0] != expected || reduced[1] != expected) return 8;

  std::vector<float> b = {r, r};
  if (!staged.Broadcast(b.data(), 2, DType::kFloat32, size - 1).ok()) return 9;
  if (b[0] != n - 1 || b[1] != n - 1) return 10;

  // A ring: each sends its rank to the next and receives the previous's, both ways of doing it.
  const int next = (rank + 1) % size, prev = (rank + size - 1) % size;
  std::vector<float> out = {r, r, r}, in(3, -1.0f);
  if (!staged.SendRecv(out.data(), 3, next, in.data(), 3, prev, DType::kFloat32).ok()) return 11;
  if (in != std::vector<float>(3, static_cast<float>(prev))) return 12;
  std::vector<double> d = {static_cast<double>(rank)}, got = {-1.0};
  if (rank == 0) {
    if (!staged.Send(d.data(), 1, DType::kFloat64, 1).ok()) return 13;
  } else if (rank == 1) {
    if (!staged.Recv(got.data(), 1, DType::kFloat64, 0).ok()) return 14;
    if (got[0] != 0.0) return 15;
  }
  return staged.Barrier().ok() ? 0 : 16;
}

TEST(StagedCommunicatorTest, EveryOperationCarriesTheBackendsBuffersThroughTheHost) {
  for (const int size : {2, 3}) {
    SCOPED_TRACE(size);
    const std::string dir = testing::MakeTempDir("shardline_staged");
    ASSERT_FALSE(dir.empty());
    auto grid = placement::RankGrid::Create(size, 1, 1);
    ASSERT_TRUE(grid.ok());
    const testing::ForkedWorldResult result = testing::RunForkedWorld(
        *grid, dir, [](int, const placement::RankCoords&, const model::ShardedGroups& groups) {
          return groups.tp == nullptr ? 1 : RunRank(*groups.tp);
        });
    EXPECT_TRUE(result.ok()) << result.Describe();
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace shardline::comm
