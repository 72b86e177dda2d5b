// ShardedGpt against the engine on one rank (OneRankGpt, one micro-batch of the whole global batch:
// itself checked against PyTorch in model_torch_reference_test): for every (tp, pp, dp) in {1,2}³
// and for ZeRO 1, 2 and 3 (with dp = 2, alone and with pp = 2), the losses of the first steps and
// the final parameters match the unsharded run's. Every rank is a forked process; the groups are
// the real communicators CPU actors train over (shared memory; a tp 2 x pp 2 x dp 2 and a ZeRO 3
// case also over Gloo on loopback), bootstrapped through a FileStore directory
// (tests/support/forked_world.h). Also: the ZeRO
// stages' memory saving by the allocator's own accounting, and the layout's bad input.
//
// The parent process never computes: OpenMP and OpenBLAS thread pools do not survive fork(), so
// the one-rank reference runs in a forked child too, and the parent only compares files.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "placement/parallel_layout.h"
#include "tests/support/forked_world.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/one_rank_gpt.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::model {
namespace {

using ::testing::HasSubstr;

constexpr int kSteps = 5;
constexpr int kGlobalBatch = 8;
constexpr int kSeqLen = 16;
constexpr uint64_t kSeed = 7;
constexpr float kLearningRate = 1e-3f;

// Tolerances, fp32: tensor parallelism splits the inner sums of the row-parallel GEMMs and the
// cross-entropy's, pipeline and data parallelism the batch's, so results differ from the
// one-rank run by rounding only. Losses: relative 1e-5. Parameters after 5 AdamW steps: an
// element whose gradient is at rounding-noise level can move by up to the learning rate either
// way (Adam normalises the step), so parameters are compared with an absolute tolerance of
// 1e-5 = lr/100, which at most one element in 10^4 may pass (seen: one element of a SwiGLU gate
// at 1.1e-5 under tp 2) but none by more than Adam can move an element in all the steps; and
// almost all (99.9%) must agree to 1e-6. A wrong head, shard or reduction moves whole rows.
constexpr double kLossRelTol = 1e-5;
constexpr double kParamAbsTol = 1e-5;

struct Case {
  int tp = 1, pp = 1, dp = 1, zero = 0;
  bool tied = true;
  // The backend CPU actors get (shared memory), or Gloo, which `backend: gloo` forces.
  testing::ForkedBackend backend = testing::ForkedBackend::kCpu;
  // The interleaved schedule with this many chunks per stage when > 1.
  int virtual_stages = 1;
  placement::RecomputeMode recompute = placement::RecomputeMode::kNone;
  int layers = 4;
  int micro_batch = 2;  // 4 micro-batches per step at dp = 1, 2 at dp = 2
  int llama_kv_heads = 0;  // > 0: a Llama (4 query heads) with this many key/value heads
  std::string Name() const {
    return "tp" + std::to_string(tp) + "_pp" + std::to_string(pp) + "_dp" + std::to_string(dp) +
           "_zero" + std::to_string(zero) + (tied ? "" : "_untied") +
           (backend == testing::ForkedBackend::kGloo ? "_gloo" : "") +
           (virtual_stages > 1 ? "_interleaved" + std::to_string(virtual_stages) : "") +
           (recompute != placement::RecomputeMode::kNone
                ? "_recompute_" + std::string(placement::RecomputeModeName(recompute))
                : "") +
           (layers != 4 ? "_layers" + std::to_string(layers) : "") +
           (micro_batch != 2 ? "_mb" + std::to_string(micro_batch) : "") +
           (llama_kv_heads > 0 ? "_llama_kv" + std::to_string(llama_kv_heads) : "");
  }
};

Case Llama(int tp, int pp, int dp, int zero, int kv_heads, bool tied = false) {
  Case c{tp, pp, dp, zero, tied};
  c.llama_kv_heads = kv_heads;
  return c;
}

Case Interleaved(int tp, int pp, int dp, int zero, int layers, bool tied = true) {
  Case c{tp, pp, dp, zero, tied};
  c.virtual_stages = 2;
  c.layers = layers;
  return c;
}

Case Recomputing(int tp, int pp, int dp, int zero, placement::RecomputeMode mode) {
  Case c{tp, pp, dp, zero};
  c.recompute = mode;
  return c;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.Name(); }

ModelConfig Config(bool tied, int layers = 4, int llama_kv_heads = 0) {
  ModelConfig c;
  c.layers = layers;
  c.heads = 4;
  c.d_model = 32;
  c.vocab = 257;  // the byte vocabulary: prime, so tp = 2 splits it unevenly (128 + 129)
  c.max_seq_len = kSeqLen;
  c.tied_embeddings = tied;
  if (llama_kv_heads > 0) {
    c = ModelConfig::Llama(c);
    c.tied_embeddings = tied;
    c.kv_heads = llama_kv_heads;
    c.d_ff = 48;
  }
  return c;
}

ModelConfig Config(const Case& c) { return Config(c.tied, c.layers, c.llama_kv_heads); }

placement::ParallelSpec Parallel(const Case& c) {
  placement::ParallelSpec p;
  p.tp = c.tp;
  p.pp = c.pp;
  p.dp = c.dp;
  p.zero = c.zero;
  p.micro_batch = c.micro_batch;
  if (c.virtual_stages > 1) {
    p.schedule = placement::PipelineScheduleKind::kInterleaved;
    p.virtual_stages = c.virtual_stages;
  }
  p.recompute = c.recompute;
  return p;
}

data::Sampler MakeSampler() {
  static const data::TextDataset dataset = data::SyntheticCorpus(3, 50'000).ToDataset();
  return *data::Sampler::Create(dataset, kSeqLen, kGlobalBatch, kSeed);
}

AdamWOptions Adam() {
  AdamWOptions o;
  o.adamw.beta1 = 0.9f;
  o.adamw.beta2 = 0.95f;
  o.adamw.weight_decay = 0.1f;
  o.max_grad_norm = 1.0;
  return o;
}

void WriteFloats(const std::string& path, const std::vector<float>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()),
            static_cast<std::streamsize>(values.size() * sizeof(float)));
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const auto size = in.tellg();
  if (size <= 0) return {};
  std::vector<float> values(static_cast<size_t>(size) / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(values.data()), size);
  return values;
}

// Child: the one-rank run, the whole global batch in one micro-batch. Writes the losses, then
// every parameter in ParamLayout order.
int RunReference(const std::string& dir, const Case& c) {
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  auto gpt = OneRankGpt::Create(
      {.config = Config(c), .batch = kGlobalBatch, .seq_len = kSeqLen, .adamw = Adam()}, backend);
  if (!gpt.ok() || !(*gpt)->InitGpt2(kSeed).ok()) return 2;
  data::Sampler sampler = MakeSampler();
  std::vector<float> out;
  for (int step = 1; step <= kSteps; ++step) {
    const data::Batch batch = sampler.GlobalBatch(step - 1);
    auto stats = (*gpt)->Step(batch.inputs, batch.targets, step, kLearningRate);
    if (!stats.ok()) return 3;
    out.push_back(stats->loss);
  }
  auto params = (*gpt)->Params();
  if (!params.ok()) return 4;
  out.insert(out.end(), params->values().begin(), params->values().end());
  WriteFloats(dir + "/reference.bin", out);
  return 0;
}

// One rank (in a child): writes the losses, then its tensors' values in layout order; and the
// allocator's bytes in use after Create with the model's own memory breakdown.
int RunRank(const std::string& dir, const Case& c, int rank, const placement::RankCoords& coords,
            const ShardedGroups& groups) {
  ShardedOptions options;
  options.config = Config(c);
  options.parallel = Parallel(c);
  options.coords = coords;
  options.global_batch = kGlobalBatch;
  options.seq_len = kSeqLen;
  options.adamw = Adam();
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  auto model = ShardedGpt::Create(options, groups, backend);
  if (!model.ok()) {
    fprintf(stderr, "rank %d: %s\n", rank, std::string(model.status().message()).c_str());
    return 5;
  }
  // What the model holds in memory its shared-memory peers map is allocated apart (shared_bytes).
  const size_t bytes_after_create =
      allocator.stats().bytes_in_use + static_cast<size_t>((*model)->shared_bytes());
  if (!(*model)->InitGpt2(kSeed).ok()) return 12;
  data::Sampler sampler = MakeSampler();
  std::vector<float> out;
  for (int step = 1; step <= kSteps; ++step) {
    auto source = [&](int64_t first, int64_t count, std::vector<int32_t>& inputs,
                      std::vector<int32_t>& targets) -> absl::Status {
      auto batch = sampler.MicroBatch(step - 1, first, count);
      if (!batch.ok()) return batch.status();
      inputs.assign(batch->inputs.begin(), batch->inputs.end());
      targets.assign(batch->targets.begin(), batch->targets.end());
      return absl::OkStatus();
    };
    auto stats = (*model)->TrainStep(source, step, kLearningRate);
    if (!stats.ok()) {
      fprintf(stderr, "rank %d step %d: %s\n", rank, step,
              std::string(stats.status().message()).c_str());
      return 6;
    }
    out.push_back(stats->loss);
  }
  auto values = (*model)->TensorValues();
  if (!values.ok()) return 7;
  for (const auto& v : *values) out.insert(out.end(), v.begin(), v.end());
  WriteFloats(dir + "/rank-" + std::to_string(rank) + ".bin", out);
  const ShardedMemory memory = (*model)->memory();
  std::ofstream(dir + "/memory-" + std::to_string(rank) + ".txt")
      << bytes_after_create << " " << memory.param_bytes << " " << memory.grad_bytes << " "
      << memory.optimizer_bytes << " " << memory.activation_bytes << "\n";
  return 0;
}

// Runs every rank of `c` as a process; a failure names the ranks.
void RunWorld(const std::string& dir, const Case& c) {
  auto grid = placement::RankGrid::Create(c.tp, c.pp, c.dp);
  ASSERT_TRUE(grid.ok());
  const std::string store = dir + "/store";
  std::filesystem::create_directories(store);
  const testing::ForkedWorldResult result = testing::RunForkedWorld(
      *grid, store,
      [&](int rank, const placement::RankCoords& coords, const ShardedGroups& groups) {
        return RunRank(dir, c, rank, coords, groups);
      },
      std::chrono::seconds(120), c.backend);
  ASSERT_TRUE(result.ok()) << c.Name() << ": " << result.Describe();
}

// The one-rank reference, in a child of its own.
void RunReferenceChild(const std::string& dir, const Case& c) {
  auto grid = placement::RankGrid::Create(1, 1, 1);
  ASSERT_TRUE(grid.ok());
  const testing::ForkedWorldResult result = testing::RunForkedWorld(
      *grid, dir, [&](int, const placement::RankCoords&, const ShardedGroups&) {
        return RunReference(dir, c);
      });
  ASSERT_TRUE(result.ok()) << "reference run: " << result.Describe();
}

// The global flat index of every element of a box, row-major in the box.
std::vector<int64_t> BoxIndices(const ShardTensor& t) {
  std::vector<int64_t> stride(t.global_shape.size(), 1);
  for (size_t d = stride.size(); d-- > 1;) stride[d - 1] = stride[d] * t.global_shape[d];
  std::vector<int64_t> out;
  std::vector<int64_t> index(t.box_shape.size(), 0);
  for (int64_t n = 0; n < t.numel; ++n) {
    int64_t flat = 0;
    for (size_t d = 0; d < index.size(); ++d) flat += (t.box_offsets[d] + index[d]) * stride[d];
    out.push_back(flat);
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.box_shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

class ShardedEquivalenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ShardedEquivalenceTest, LossesAndFinalParametersMatchTheSingleDeviceRun) {
  const Case c = GetParam();
  const std::string dir = testing::MakeTempDir("shardline_sharded");
  ASSERT_FALSE(dir.empty());
  const int world = c.tp * c.pp * c.dp;
  RunReferenceChild(dir, c);
  RunWorld(dir, c);
  if (HasFailure()) return;

  const std::vector<float> reference = ReadFloats(dir + "/reference.bin");
  const ModelConfig config = Config(c);
  const ParamLayout single(config);
  ASSERT_EQ(reference.size(), size_t(kSteps + single.total()));
  auto grid = placement::RankGrid::Create(c.tp, c.pp, c.dp);
  ASSERT_TRUE(grid.ok());
  auto chunks = placement::ChunksOf(Parallel(c), config.layers);
  ASSERT_TRUE(chunks.ok()) << chunks.status();
  int64_t compared = 0, loose = 0, past_tolerance = 0;
  double worst = 0;
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<float> got = ReadFloats(dir + "/rank-" + std::to_string(rank) + ".bin");
    for (int step = 0; step < kSteps; ++step) {
      ASSERT_GT(got.size(), size_t(kSteps));
      EXPECT_NEAR(got[step], reference[step], kLossRelTol * std::abs(reference[step]))
          << "rank " << rank << " step " << step + 1;
    }
    const placement::RankCoords coords = grid->Coords(rank);
    ShardPlace place{c.tp, coords.tp, (*chunks)[coords.pp], coords.pp == 0, coords.pp == c.pp - 1};
    auto layout = ShardLayout::Create(config, place);
    ASSERT_TRUE(layout.ok());
    size_t at = kSteps;
    for (const ShardTensor& t : layout->tensors()) {
      const ParamTensorInfo* info = single.Find(t.name);
      ASSERT_NE(info, nullptr) << t.name;
      const std::vector<int64_t> flat = BoxIndices(t);
      ASSERT_LE(at + flat.size(), got.size()) << "rank " << rank << " " << t.name;
      for (size_t i = 0; i < flat.size(); ++i, ++at) {
        const double want = reference[kSteps + info->offset + flat[i]];
        const double diff = std::abs(got[at] - want);
        worst = std::max(worst, diff);
        ++compared;
        if (diff > 1e-6) ++loose;
        if (diff > kParamAbsTol) ++past_tolerance;
        if (diff > kSteps * kLearningRate) {
          ADD_FAILURE() << "rank " << rank << " " << t.name << " element " << flat[i] << ": "
                        << got[at] << " vs " << want;
          return;
        }
      }
    }
    EXPECT_EQ(at, got.size()) << "rank " << rank << " wrote more values than its layout has";
  }
  EXPECT_LE(loose, compared / 1000) << loose << " of " << compared << " differ by more than 1e-6";
  EXPECT_LE(past_tolerance, compared / 10000)
      << past_tolerance << " of " << compared << " differ by more than " << kParamAbsTol;
  RecordProperty("worst_param_diff", std::to_string(worst));
  std::filesystem::remove_all(dir);
}

std::vector<Case> EquivalenceCases() {
  std::vector<Case> cases;
  for (int tp : {1, 2}) {
    for (int pp : {1, 2}) {
      for (int dp : {1, 2}) cases.push_back(Case{tp, pp, dp, 0});
    }
  }
  for (int zero : {1, 2, 3}) {
    cases.push_back(Case{1, 1, 2, zero});
    cases.push_back(Case{1, 2, 2, zero});
  }
  cases.push_back(Case{2, 2, 2, 3});
  cases.push_back(Case{2, 2, 2, 0, /*tied=*/false});
  cases.push_back(Case{2, 2, 1, 2, /*tied=*/false});
  // The interleaved schedule (two chunks per stage) at pp 2 and 4, with data and tensor
  // parallelism, ZeRO, and an untied head on the last stage's last chunk.
  cases.push_back(Interleaved(1, 2, 1, 0, 4));
  cases.push_back(Interleaved(1, 4, 1, 0, 8));
  // 8 micro-batches: stages 0 and 1 receive a gradient with another backward before its own, so
  // it waits in a buffer of its own (PipeAction::held).
  Case held = Interleaved(1, 4, 1, 0, 8);
  held.micro_batch = 1;
  cases.push_back(held);
  cases.push_back(Interleaved(2, 2, 1, 0, 4, /*tied=*/false));
  cases.push_back(Interleaved(1, 2, 2, 3, 4));
  // Recomputation: selective and full, alone, with tensor parallelism (full reruns the
  // all-reduces), with the pipeline and with ZeRO 3 (the units gathered again).
  for (const placement::RecomputeMode mode :
       {placement::RecomputeMode::kSelective, placement::RecomputeMode::kFull}) {
    cases.push_back(Recomputing(1, 1, 1, 0, mode));
    cases.push_back(Recomputing(2, 2, 1, 0, mode));
  }
  cases.push_back(Recomputing(1, 2, 2, 3, placement::RecomputeMode::kFull));
  // Every kind of group and a sharded optimizer over Gloo too.
  cases.push_back(Case{2, 2, 2, 0, true, testing::ForkedBackend::kGloo});
  cases.push_back(Case{1, 2, 2, 3, true, testing::ForkedBackend::kGloo});
  // Llama (RMSNorm, SwiGLU, rotary, untied): grouped-query attention cut by key/value heads (two
  // heads, one a rank) and replicated (one head, on both ranks: its gradient summed over them),
  // under tensor, pipeline and data parallelism, ZeRO and recomputation.
  cases.push_back(Llama(2, 1, 1, 0, 2));
  cases.push_back(Llama(2, 1, 1, 0, 1));
  cases.push_back(Llama(1, 2, 1, 0, 2));
  cases.push_back(Llama(2, 2, 1, 0, 1));
  cases.push_back(Llama(1, 1, 2, 1, 2));
  cases.push_back(Llama(1, 1, 2, 3, 2));
  cases.push_back(Llama(2, 2, 2, 3, 1, /*tied=*/true));
  Case recompute = Llama(2, 1, 1, 0, 1);
  recompute.recompute = placement::RecomputeMode::kSelective;
  cases.push_back(recompute);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Layouts, ShardedEquivalenceTest, ::testing::ValuesIn(EquivalenceCases()),
                         [](const auto& info) { return info.param.Name(); });

// Per rank, by the allocator's own accounting: ZeRO 1 shards the optimizer state, 2 also the
// gradients, 3 also the parameters, each to about 1/dp.
TEST(ShardedMemoryTest, EachZeroStageShardsWhatItShould) {
  struct Reading {
    int64_t in_use = 0, params = 0, grads = 0, optimizer = 0;
  };
  std::vector<Reading> readings;
  for (int zero = 0; zero <= 3; ++zero) {
    const Case c{1, 1, 2, zero};
    const std::string dir = testing::MakeTempDir("shardline_sharded");
    RunWorld(dir, c);
    ASSERT_FALSE(HasFailure());
    Reading r;
    std::ifstream(dir + "/memory-0.txt") >> r.in_use >> r.params >> r.grads >> r.optimizer;
    readings.push_back(r);
    std::filesystem::remove_all(dir);
  }
  const Reading& z0 = readings[0];
  auto half = [](int64_t full, int64_t sharded) {
    // 1/dp plus at most one float of padding per unit (a layout has a handful of units).
    return sharded >= full / 2 && sharded <= full / 2 + 64 * 4;
  };
  EXPECT_TRUE(half(z0.optimizer, readings[1].optimizer)) << readings[1].optimizer;
  EXPECT_EQ(readings[1].params, z0.params);
  EXPECT_EQ(readings[1].grads, z0.grads);
  EXPECT_TRUE(half(z0.grads, readings[2].grads)) << readings[2].grads;
  EXPECT_EQ(readings[2].params, z0.params);
  EXPECT_TRUE(half(z0.params, readings[3].params)) << readings[3].params;
  EXPECT_TRUE(half(z0.grads, readings[3].grads));
  EXPECT_TRUE(half(z0.optimizer, readings[3].optimizer));
  // The allocator saw exactly those savings: activations are the same in every stage.
  for (int zero = 1; zero <= 3; ++zero) {
    const Reading& r = readings[zero];
    EXPECT_EQ(z0.in_use - r.in_use,
              (z0.params - r.params) + (z0.grads - r.grads) + (z0.optimizer - r.optimizer))
        << "zero " << zero;
  }
  // ZeRO 3 at dp = 2: half of ZeRO 0's parameters, gradients and optimizer state together.
  const int64_t state0 = z0.params + z0.grads + z0.optimizer;
  const int64_t state3 = readings[3].params + readings[3].grads + readings[3].optimizer;
  EXPECT_NEAR(static_cast<double>(state3) / static_cast<double>(state0), 0.5, 0.01);
}

// What recomputation saves, by the allocator's accounting and the model's, exactly: at 1×1×1 the
// one slot keeps 4 layers' activations; selective drops both LayerNorms' outputs, the attention
// output and the GELU (3·C + F floats per token) from each and keeps one layer's worth to
// recompute into, full keeps nothing but the residual inputs and one whole layer to rerun into.
TEST(ShardedMemoryTest, RecomputationKeepsLessActivationMemoryByExactlyWhatItDrops) {
  struct Reading {
    int64_t in_use = 0, params = 0, grads = 0, optimizer = 0, activations = 0;
  };
  std::map<placement::RecomputeMode, Reading> readings;
  for (const placement::RecomputeMode mode :
       {placement::RecomputeMode::kNone, placement::RecomputeMode::kSelective,
        placement::RecomputeMode::kFull}) {
    const std::string dir = testing::MakeTempDir("shardline_sharded");
    RunWorld(dir, Recomputing(1, 1, 1, 0, mode));
    ASSERT_FALSE(HasFailure());
    Reading& r = readings[mode];
    std::ifstream(dir + "/memory-0.txt") >> r.in_use >> r.params >> r.grads >> r.optimizer >>
        r.activations;
    std::filesystem::remove_all(dir);
  }
  const ModelConfig config = Config(true);
  const int64_t N = 2 * kSeqLen;  // micro_batch 2
  const int64_t C = config.d_model, F = config.ff(), NH = config.heads;
  const int64_t layers = config.layers;
  const int64_t dropped = N * (3 * C + F);             // selective, per layer
  const int64_t block = N * (7 * C + 4 + NH + 2 * F);  // BlockActivations, per layer
  const Reading& none = readings[placement::RecomputeMode::kNone];
  const Reading& selective = readings[placement::RecomputeMode::kSelective];
  const Reading& full = readings[placement::RecomputeMode::kFull];
  EXPECT_EQ(none.activations - selective.activations, 4 * (layers - 1) * dropped);
  EXPECT_EQ(none.activations - full.activations, 4 * (layers - 1) * block);
  for (const Reading* r : {&selective, &full}) {
    EXPECT_EQ(none.in_use - r->in_use, none.activations - r->activations);
    EXPECT_EQ(r->params, none.params);
  }
}

TEST(ShardLayoutTest, RefusesLayoutsThatDoNotDivideTheModel) {
  ModelConfig config = Config(true);
  ShardPlace place{3, 0, {{0, 4}}, true, true};
  auto layout = ShardLayout::Create(config, place);
  EXPECT_EQ(layout.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(layout.status().message()), HasSubstr("tp 3 must divide heads 4"));
  place = ShardPlace{1, 0, {{2, 2}}, true, true};
  EXPECT_THAT(std::string(ShardLayout::Create(config, place).status().message()),
              HasSubstr("stage layers [2, 2)"));
  // An interleaved stage's chunks must ascend without overlapping.
  place = ShardPlace{1, 0, {{2, 4}, {1, 3}}, true, true};
  EXPECT_THAT(std::string(ShardLayout::Create(config, place).status().message()),
              HasSubstr("stage layers [1, 3) are not a non-empty range inside [4, 4)"));
  place = ShardPlace{1, 0, {}, true, true};
  EXPECT_THAT(std::string(ShardLayout::Create(config, place).status().message()),
              HasSubstr("at least one chunk"));
}

TEST(ShardLayoutTest, TensorParallelBoxesCoverEachTensorOnce) {
  // Over the tp ranks of one stage the boxes of a split tensor tile it, and replicas repeat it.
  const ModelConfig config = Config(true);
  std::map<std::string, int64_t> covered;
  for (int r = 0; r < 2; ++r) {
    auto layout = ShardLayout::Create(config, ShardPlace{2, r, {{0, 4}}, true, true});
    ASSERT_TRUE(layout.ok());
    EXPECT_EQ(layout->vocab_begin(), r == 0 ? 0 : 128);
    EXPECT_EQ(layout->vocab_end(), r == 0 ? 128 : 257);
    for (const ShardTensor& t : layout->tensors()) {
      if (!t.tp_replica) covered[t.name] += t.numel;
    }
  }
  const ParamLayout single(config);
  for (const auto& [name, numel] : covered) {
    EXPECT_EQ(numel, single.Find(name)->numel) << name;
  }
  EXPECT_EQ(covered.count("h.0.qkv.w"), 1u);
}

TEST(ShardLayoutTest, KeyValueHeadsAreSplitOrReplicatedByVllmsRule) {
  // 8 query heads over 2 key/value heads at tp 4: each head on two consecutive ranks, the second
  // of which holds a replica; together the owners cover k.w and v.w once.
  ModelConfig config = Config(false, 2, /*llama_kv_heads=*/2);
  config.heads = 8;
  std::map<std::string, int64_t> covered;
  for (int r = 0; r < 4; ++r) {
    auto layout = ShardLayout::Create(config, ShardPlace{4, r, {{0, 2}}, true, true});
    ASSERT_TRUE(layout.ok()) << layout.status();
    EXPECT_EQ(layout->heads(), 2);
    EXPECT_EQ(layout->kv_heads(), 1);
    EXPECT_EQ(layout->kv_replicas(), 2);
    for (const ShardTensor& t : layout->tensors()) {
      if (t.name != "h.0.k.w") continue;
      EXPECT_EQ(t.box_offsets[0], (r / 2) * config.head_size()) << "rank " << r;
      EXPECT_EQ(t.box_shape[0], config.head_size());
      EXPECT_EQ(t.tp_replica, r % 2 == 1) << "rank " << r;
    }
    for (const ShardTensor& t : layout->tensors()) {
      if (!t.tp_replica) covered[t.name] += t.numel;
    }
  }
  const ParamLayout single(config);
  for (const auto& [name, numel] : covered) EXPECT_EQ(numel, single.Find(name)->numel) << name;
  EXPECT_EQ(covered.count("h.1.v.w"), 1u);
  // tp 4 over 3 key/value heads divides neither way: refused naming both numbers.
  config.heads = 12;
  config.kv_heads = 3;
  config.d_model = 48;
  auto refused = ShardLayout::Create(config, ShardPlace{4, 0, {{0, 2}}, true, true});
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("tp 4 and kv_heads 3"));
}

}  // namespace
}  // namespace shardline::model
