// The planner's memory model against what ShardedGpt really allocates: for local CPU layouts
// (fp32, every ZeRO stage, pipelines and tensor parallelism), each rank's bytes by its allocator's
// own accounting — after Create (parameters, gradients, optimizer state, activation slots, the
// backward buffer) and at the peak of two training steps (adding ZeRO's transient gathers and
// reduce-scatter buffers) — are within 10% of placement::PredictRankMemory.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/cost_model.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/sharded_gpt.h"

namespace shardline {
namespace {

constexpr int kSeqLen = 32;
constexpr int kGlobalBatch = 8;

struct Layout {
  int tp, pp, dp, zero;
  int virtual_stages = 1;  // > 1: the interleaved schedule
  placement::RecomputeMode recompute = placement::RecomputeMode::kNone;
  int llama_kv_heads = 0;  // > 0: a Llama with this many key/value heads
  std::string Name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) +
           "_zero" + std::to_string(zero) +
           (virtual_stages > 1 ? "_interleaved" + std::to_string(virtual_stages) : "") +
           (recompute != placement::RecomputeMode::kNone
                ? "_recompute_" + std::string(placement::RecomputeModeName(recompute))
                : "") +
           (llama_kv_heads > 0 ? "_llama_kv" + std::to_string(llama_kv_heads) : "");
  }
};

Layout Llama(int tp, int pp, int dp, int zero, int kv_heads) {
  Layout l{tp, pp, dp, zero};
  l.llama_kv_heads = kv_heads;
  return l;
}

void PrintTo(const Layout& l, std::ostream* os) { *os << l.Name(); }

model::ModelConfig Model(const Layout& layout = {1, 1, 1, 0}) {
  model::ModelConfig m;
  m.layers = 4;
  m.heads = 4;
  m.d_model = 64;
  m.d_ff = 256;
  m.vocab = 257;
  m.max_seq_len = kSeqLen;
  if (layout.llama_kv_heads > 0) {
    m = model::ModelConfig::Llama(m);
    m.kv_heads = layout.llama_kv_heads;
    m.d_ff = 176;  // SwiGLU's two thirds of 4·d_model, three matrices
  }
  return m;
}

placement::ParallelSpec Parallel(const Layout& l) {
  placement::ParallelSpec p;
  p.tp = l.tp;
  p.pp = l.pp;
  p.dp = l.dp;
  p.zero = l.zero;
  p.micro_batch = 2;
  if (l.virtual_stages > 1) {
    p.schedule = placement::PipelineScheduleKind::kInterleaved;
    p.virtual_stages = l.virtual_stages;
  }
  p.recompute = l.recompute;
  return p;
}

// In a rank: bytes in use after Create, and the peak over two steps.
int MeasureRank(const std::string& dir, const Layout& layout, int rank,
                const placement::RankCoords& coords, const model::ShardedGroups& groups) {
  model::ShardedOptions options;
  options.config = Model(layout);
  options.parallel = Parallel(layout);
  options.coords = coords;
  options.global_batch = kGlobalBatch;
  options.seq_len = kSeqLen;
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  auto gpt = model::ShardedGpt::Create(options, groups, backend);
  if (!gpt.ok()) return 2;
  // What the model holds in memory its shared-memory peers map is allocated apart, once, in
  // Create (shared_bytes): it counts in the bytes held and in the peak alike.
  const size_t shared = static_cast<size_t>((*gpt)->shared_bytes());
  const size_t after_create = allocator.stats().bytes_in_use + shared;
  if (!(*gpt)->InitGpt2(1).ok()) return 5;
  const data::TextDataset dataset = data::SyntheticCorpus(1, 20'000).ToDataset();
  auto sampler = data::Sampler::Create(dataset, kSeqLen, kGlobalBatch, 1);
  if (!sampler.ok()) return 3;
  for (int step = 1; step <= 2; ++step) {
    auto source = [&](int64_t first, int64_t count, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) -> absl::Status {
      auto batch = sampler->MicroBatch(step - 1, first, count);
      if (!batch.ok()) return batch.status();
      inputs.assign(batch->inputs.begin(), batch->inputs.end());
      targets.assign(batch->targets.begin(), batch->targets.end());
      return absl::OkStatus();
    };
    if (!(*gpt)->TrainStep(source, step, 1e-3f).ok()) return 4;
  }
  std::ofstream(dir + "/rank-" + std::to_string(rank) + ".txt")
      << after_create << " " << allocator.stats().peak_bytes + shared << " "
      << (*gpt)->memory().activation_bytes << "\n";
  return 0;
}

class MemoryValidationTest : public ::testing::TestWithParam<Layout> {};

struct Measured {
  int64_t after_create = 0, peak = 0, activations = 0;
};

// Every rank of `layout`, measured in processes of their own; empty after a failure (reported).
std::vector<Measured> MeasureLayout(const Layout& layout) {
  auto grid = placement::RankGrid::Create(layout.tp, layout.pp, layout.dp);
  EXPECT_TRUE(grid.ok());
  if (!grid.ok()) return {};
  const std::string dir = testing::MakeTempDir("shardline_memory");
  EXPECT_FALSE(dir.empty());
  std::filesystem::create_directories(dir + "/store");
  const auto result = testing::RunForkedWorld(
      *grid, dir + "/store",
      [&](int rank, const placement::RankCoords& coords, const model::ShardedGroups& groups) {
        return MeasureRank(dir, layout, rank, coords, groups);
      });
  EXPECT_TRUE(result.ok()) << result.Describe();
  std::vector<Measured> out;
  if (result.ok()) {
    for (int rank = 0; rank < grid->world(); ++rank) {
      Measured m;
      std::ifstream(dir + "/rank-" + std::to_string(rank) + ".txt") >> m.after_create >> m.peak >>
          m.activations;
      out.push_back(m);
    }
  }
  std::filesystem::remove_all(dir);
  return out;
}

placement::TrainSetup TrainSetup() {
  placement::TrainSetup setup;
  setup.global_batch = kGlobalBatch;
  setup.seq_len = kSeqLen;
  setup.precision = placement::Precision::kFp32;
  return setup;
}

TEST_P(MemoryValidationTest, PredictedBytesPerRankAreWithinTenPercentOfTheAllocators) {
  const Layout layout = GetParam();
  const std::vector<Measured> measured = MeasureLayout(layout);
  ASSERT_FALSE(measured.empty());
  auto grid = placement::RankGrid::Create(layout.tp, layout.pp, layout.dp);
  ASSERT_TRUE(grid.ok());

  auto predicted = placement::PredictMemoryPerRank(Model(layout), TrainSetup(), Parallel(layout));
  ASSERT_TRUE(predicted.ok()) << predicted.status();
  ASSERT_EQ(predicted->size(), size_t(grid->world()));
  for (int rank = 0; rank < grid->world(); ++rank) {
    const int64_t after_create = measured[rank].after_create, peak = measured[rank].peak;
    ASSERT_GT(after_create, 0) << "rank " << rank;
    const placement::MemoryBreakdown& p = (*predicted)[rank];
    // What Create allocates: everything but the transient communication buffers.
    const double held = static_cast<double>(p.total() - p.comm_buffers);
    EXPECT_NEAR(static_cast<double>(after_create) / held, 1.0, 0.10)
        << "rank " << rank << ": allocated " << after_create << " bytes, predicted " << held;
    EXPECT_NEAR(static_cast<double>(peak) / static_cast<double>(p.total()), 1.0, 0.10)
        << "rank " << rank << ": peak " << peak << " bytes, predicted " << p.total();
    // The activations alone: the slots, their inputs, the backward's buffer, the recomputation
    // scratch and the held gradients.
    EXPECT_NEAR(static_cast<double>(measured[rank].activations) /
                    static_cast<double>(p.activations + p.backward),
                1.0, 0.10)
        << "rank " << rank << ": activations " << measured[rank].activations << " bytes, predicted "
        << p.activations + p.backward;
  }
}

// What each recomputation mode saves: the fall of every rank's activation bytes from no
// recomputation, measured, within 10% of the fall the planner's cost model predicts.
TEST(RecomputationMemoryTest, ActivationBytesFallAsThePlannerPredicts) {
  const Layout none{2, 2, 1, 0};
  const std::vector<Measured> base = MeasureLayout(none);
  auto base_predicted = placement::PredictMemoryPerRank(Model(), TrainSetup(), Parallel(none));
  ASSERT_TRUE(base_predicted.ok()) << base_predicted.status();
  ASSERT_EQ(base.size(), base_predicted->size());
  for (const placement::RecomputeMode mode :
       {placement::RecomputeMode::kSelective, placement::RecomputeMode::kFull}) {
    Layout layout = none;
    layout.recompute = mode;
    const std::vector<Measured> measured = MeasureLayout(layout);
    auto predicted = placement::PredictMemoryPerRank(Model(), TrainSetup(), Parallel(layout));
    ASSERT_TRUE(predicted.ok()) << predicted.status();
    ASSERT_EQ(measured.size(), base.size());
    for (size_t rank = 0; rank < base.size(); ++rank) {
      const auto activations = [](const placement::MemoryBreakdown& p) {
        return static_cast<double>(p.activations + p.backward);
      };
      const double fell = static_cast<double>(base[rank].activations - measured[rank].activations);
      const double predicted_fall = activations((*base_predicted)[rank]) -
                                    activations((*predicted)[rank]);
      ASSERT_GT(predicted_fall, 0) << layout.Name() << " rank " << rank;
      EXPECT_NEAR(fell / predicted_fall, 1.0, 0.10)
          << layout.Name() << " rank " << rank << ": fell " << fell << " bytes, predicted "
          << predicted_fall;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    LocalCpuLayouts, MemoryValidationTest,
    ::testing::Values(Layout{1, 1, 1, 0}, Layout{2, 2, 1, 0}, Layout{1, 2, 2, 1},
                      Layout{1, 1, 2, 2}, Layout{2, 1, 2, 3}, Layout{1, 2, 2, 3},
                      // The interleaved schedule and recomputation.
                      Layout{1, 2, 1, 0, 2}, Layout{2, 2, 1, 0, 2},
                      Layout{1, 2, 2, 1, 2, placement::RecomputeMode::kSelective},
                      Layout{1, 1, 1, 0, 1, placement::RecomputeMode::kSelective},
                      Layout{2, 2, 1, 0, 1, placement::RecomputeMode::kFull},
                      Layout{1, 2, 2, 3, 1, placement::RecomputeMode::kFull},
                      // Llama: SwiGLU's three matrices, RMSNorm's one statistic, no wpe, an
                      // untied head, grouped-query attention cut and (kv 1) replicated.
                      Llama(1, 1, 1, 0, 2), Llama(2, 2, 1, 0, 2), Llama(2, 1, 2, 3, 1),
                      Llama(1, 2, 2, 1, 1)),
    [](const auto& info) { return info.param.Name(); });

}  // namespace
}  // namespace shardline
