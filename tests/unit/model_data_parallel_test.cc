// DataParallelStrategy without a communicator: rank 1 of a data-parallel group of 2, whose peer's
// contributions are what a reduction would add (the collectives themselves are covered by the
// sharded equivalence tests, model_sharded_test, with real processes).
#include <numeric>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "worker/model/data_parallel.h"

namespace shardline::model {
namespace {

using ::testing::HasSubstr;
using Kind = checkpoint::StateKind;

ShardLayout Layout() {
  const ModelConfig config{
      .layers = 2, .heads = 2, .d_model = 8, .d_ff = 16, .vocab = 11, .max_seq_len = 4};
  return *ShardLayout::Create(config, ShardPlace{.chunks = {{0, 2}}});
}

std::unique_ptr<DataParallelStrategy> Strategy(int zero, const ShardLayout& layout,
                                               kernels::Backend& backend) {
  DataParallelOptions options;
  options.layout = &layout;
  options.dp_size = 2;
  options.dp_index = 1;
  options.backend = &backend;
  auto strategy = DataParallelStrategy::Create(zero, options);
  EXPECT_TRUE(strategy.ok()) << strategy.status();
  return std::move(*strategy);
}

// The bytes each stage keeps: ZeRO's table (Rajbhandari et al. 2020), shards of ceil(unit / dp).
TEST(DataParallelStrategyTest, EachStageShardsWhatItSays) {
  const ShardLayout layout = Layout();
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  int64_t shards = 0;
  for (const ShardUnit& unit : layout.units()) shards += (unit.size + 1) / 2;
  const int64_t whole = layout.total() * 4, sharded = shards * 4;
  struct Expected {
    int zero;
    int64_t params, grads, optimizer;
  } cases[] = {{0, whole, whole, 2 * whole},
               {1, whole, whole, 2 * sharded},
               {2, whole, sharded, 2 * sharded},
               {3, sharded, sharded, 2 * sharded}};
  for (const Expected& e : cases) {
    auto dp = Strategy(e.zero, layout, backend);
    EXPECT_EQ(dp->param_bytes(), e.params) << e.zero;
    EXPECT_EQ(dp->grad_bytes(), e.grads) << e.zero;
    EXPECT_EQ(dp->optimizer_bytes(), e.optimizer) << e.zero;
    EXPECT_EQ(dp->KeepsOwnedOnly(Kind::kParam), e.zero >= 3);
    EXPECT_EQ(dp->KeepsOwnedOnly(Kind::kExpAvg), e.zero >= 1);
  }
}

// Rank 1 owns the second half of every unit, and a parameter stored there reads back through the
// unit's view under every stage (stage 3 gathers it: without a group, from its own shard).
TEST(DataParallelStrategyTest, OwnedElementsAreWhereTheUnitViewFindsThem) {
  const ShardLayout layout = Layout();
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  for (int zero = 0; zero <= 3; ++zero) {
    auto dp = Strategy(zero, layout, backend);
    const ShardTensor& t = layout.tensors().front();  // wte, the whole of unit 0
    const int64_t size = layout.units()[t.unit].size;
    EXPECT_EQ(dp->OwnedBegin(t.unit), (size + 1) / 2);
    EXPECT_EQ(dp->OwnedEnd(t.unit), size);
    const int64_t x = dp->OwnedBegin(t.unit) + 3;
    *dp->StateAt(Kind::kParam, t, x) = 42.0f;
    absl::StatusOr<float*> unit = dp->UnitParams(t.unit);
    ASSERT_TRUE(unit.ok()) << unit.status();
    EXPECT_EQ((*unit)[t.offset + x], 42.0f) << "zero " << zero;
    dp->ReleaseParams(t.unit);
  }
}

// A micro-batch's gradient reaches the owned part of the reduced gradient: stages 0 and 1
// accumulate whole units, stages 2 and 3 move each micro-batch's unit into the shard.
TEST(DataParallelStrategyTest, GradientsAccumulateIntoWhatTheRankOwns) {
  const ShardLayout layout = Layout();
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  for (int zero = 0; zero <= 3; ++zero) {
    auto dp = Strategy(zero, layout, backend);
    ASSERT_TRUE(dp->ZeroGrads().ok());
    const ShardTensor& t = layout.tensors().front();
    const int64_t size = layout.units()[t.unit].size;
    for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
      absl::StatusOr<float*> g = dp->UnitGrads(t.unit);
      ASSERT_TRUE(g.ok());
      for (int64_t i = 0; i < size; ++i) (*g)[i] += static_cast<float>(i);
      ASSERT_TRUE(dp->GradsReady(t.unit, micro_batch == 1).ok());
    }
    ASSERT_TRUE(dp->FinishReductions().ok());
    const int64_t x = dp->OwnedBegin(t.unit);
    EXPECT_EQ(*dp->ReducedGradAt(t, x), 2.0f * static_cast<float>(x)) << "zero " << zero;
    EXPECT_EQ(dp->ReducedUnitGrads(t.unit).size(),
              static_cast<size_t>(zero >= 2 ? (size + 1) / 2 : size));
  }
}

TEST(DataParallelStrategyTest, UnknownStageIsRefused) {
  const ShardLayout layout = Layout();
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  DataParallelOptions options;
  options.layout = &layout;
  options.backend = &backend;
  EXPECT_THAT(std::string(DataParallelStrategy::Create(4, options).status().message()),
              HasSubstr("ZeRO stage 4 is not 0..3"));
}

}  // namespace
}  // namespace shardline::model
