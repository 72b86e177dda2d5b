#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "placement/cost_model.h"
#include "placement/train_spec.h"
#include "tests/support/source_dir.h"
#include "worker/model/shard_layout.h"
#include "worker/model/sharded_gpt.h"

namespace shardline::placement {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

using test_support::SourceDir;

// The hand-computed case: 2 layers, C = 8, F = 32, V = 300, 16 positions, tied.
ModelSpec Tiny() {
  ModelSpec m;
  m.layers = 2;
  m.heads = 2;
  m.kv_heads = 2;
  m.d_model = 8;
  m.d_ff = 32;
  m.vocab = 300;
  m.max_seq_len = 16;
  m.tied_embeddings = true;
  return m;
}

TrainSetup TinySetup() {
  TrainSetup s;
  s.global_batch = 4;
  s.seq_len = 16;
  s.precision = Precision::kFp32;
  return s;
}

ParallelSpec Layout(int tp, int pp, int dp, int zero, int64_t micro_batch) {
  ParallelSpec p;
  p.tp = tp;
  p.pp = pp;
  p.dp = dp;
  p.zero = zero;
  p.micro_batch = micro_batch;
  return p;
}

// ---- model specs ----

TEST(ModelSpecTest, GptDefaults) {
  absl::StatusOr<ModelSpec> m =
      ParseModelSpec("layers: 2\nheads: 4\nd_model: 64\nmax_seq_len: 32\n", "m.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->arch, ModelArch::kGpt);
  EXPECT_EQ(m->d_ff, 256);
  EXPECT_EQ(m->kv_heads, 4);
  EXPECT_TRUE(m->tied_embeddings);
}

TEST(ModelSpecTest, LlamaDefaults) {
  absl::StatusOr<ModelSpec> m = LoadModelSpecFile(SourceDir() + "/examples/model-llama-7b.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->arch, ModelArch::kLlama);
  EXPECT_EQ(m->d_ff, 11008);  // Llama's 2/3·4·4096 rounded up to 256
  EXPECT_EQ(m->kv_heads, 32);
  EXPECT_FALSE(m->tied_embeddings);
  // Llama-2-7B's published count.
  EXPECT_EQ(DeriveModel(*m, 4096).params, 6'738'415'616);
}

TEST(ModelSpecTest, ExamplesLoad) {
  for (const char* name : {"model-gpt-tiny.yaml", "model-gpt-1b.yaml", "model-gpt-175b.yaml",
                           "model-gpt-1t.yaml", "model-llama-7b.yaml", "model-llama-70b.yaml"}) {
    absl::StatusOr<ModelSpec> m = LoadModelSpecFile(SourceDir() + "/examples/" + name);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
  }
  absl::StatusOr<ModelSpec> gpt3 = LoadModelSpecFile(SourceDir() + "/examples/model-gpt-175b.yaml");
  ASSERT_TRUE(gpt3.ok());
  EXPECT_NEAR(static_cast<double>(DeriveModel(*gpt3, 2048).params), 174.6e9, 0.1e9);
}

TEST(ModelSpecTest, Errors) {
  const auto error = [](const std::string& text) {
    return Message(ParseModelSpec(text, "m.yaml").status());
  };
  EXPECT_THAT(error("arch: lama\nlayers: 2\nheads: 4\nd_model: 64\nmax_seq_len: 8\n"),
              HasSubstr("m.yaml:1:7: arch: expected one of 'gpt', 'llama', got 'lama'"));
  EXPECT_THAT(error("arch: llama\nlayers: 2\nheads: 4\nkv_heads: 3\nd_model: 64\nmax_seq_len: 8\n"),
              HasSubstr("kv_heads: heads 4 is not divisible by kv_heads 3"));
  EXPECT_THAT(error("layers: 2\nheads: 4\nkv_heads: 2\nd_model: 64\nmax_seq_len: 8\n"),
              HasSubstr("kv_heads: arch gpt has one key/value head per head"));
  EXPECT_THAT(error("layers: 2\nheads: 4\nd_model: 64\nmax_seq_len: 8\nsteps: 3\n"),
              HasSubstr("unknown key 'steps'"));
}

TEST(ModelSpecTest, TrainerRefusesLlama) {
  absl::StatusOr<TrainSpec> spec = ParseTrainSpec(
      "name: t\nmodel: {arch: llama, layers: 2, heads: 4, d_model: 64, max_seq_len: 8}\n"
      "steps: 1\nbatch: 2\n",
      "t.yaml");
  EXPECT_THAT(Message(spec.status()), HasSubstr("model.arch: the trainer runs arch gpt only"));
  absl::StatusOr<TrainSpec> gpt = ParseTrainSpec(
      "name: t\nmodel: {arch: gpt, layers: 2, heads: 4, d_model: 64, max_seq_len: 8}\n"
      "steps: 1\nbatch: 2\n",
      "t.yaml");
  EXPECT_TRUE(gpt.ok()) << gpt.status();
}

// ---- model derivations ----

TEST(CostModelTest, Gpt2SmallParameters) {
  ModelSpec m;
  m.layers = 12;
  m.heads = 12;
  m.d_model = 768;
  m.d_ff = 3072;
  m.vocab = 50257;
  m.max_seq_len = 1024;
  EXPECT_EQ(DeriveModel(m, 1024).params, 124'439'808);  // GPT-2 small, as Hugging Face counts it
}

TEST(CostModelTest, TinyByHand) {
  const ModelStats s = DeriveModel(Tiny(), 16);
  // A layer: 4C² + 2CF + 9C + F = 256 + 512 + 72 + 32.
  EXPECT_EQ(s.layer_params, 872);
  EXPECT_EQ(s.embedding_params, 300 * 8 + 16 * 8);
  EXPECT_EQ(s.head_params, 16);
  EXPECT_EQ(s.params, 2 * 872 + 2528 + 16);
  // Forward per token: a layer 2·(4C² + 2CF) + 4·T·C = 1536 + 512; the head 2·C·V = 4800.
  EXPECT_DOUBLE_EQ(s.layer_forward_flops_per_token, 2048);
  EXPECT_DOUBLE_EQ(s.head_forward_flops_per_token, 4800);
  EXPECT_DOUBLE_EQ(s.flops_per_token, 3 * (2 * 2048 + 4800));
}

TEST(CostModelTest, LayerActivations) {
  // Per token: the residual input C, ln1 C + 2 stats, qkv 3C, atty C, lse heads, resid_mid C,
  // ln2 C + 2 stats, fch F, gelu F = 8+8+2+24+8+2+8+8+2+32+32 = 134 floats.
  EXPECT_EQ(LayerActivationBytes(Tiny(), 16, 2, 1, Precision::kFp32, false), 134 * 32 * 4);
  // Recomputing: the input only.
  EXPECT_EQ(LayerActivationBytes(Tiny(), 16, 2, 1, Precision::kFp32, true), 8 * 32 * 4);
}

// ---- memory ----

TEST(CostModelTest, MemoryByHand) {
  absl::StatusOr<MemoryBreakdown> m =
      PredictRankMemory(Tiny(), TinySetup(), Layout(1, 1, 1, 0, 2), false, 0);
  ASSERT_TRUE(m.ok()) << m.status();
  // fp32 parameters, gradients, AdamW m and v: 4 + 4 + 8 bytes per parameter.
  EXPECT_EQ(m->params, 4288 * 4);
  EXPECT_EQ(m->grads, 4288 * 4);
  EXPECT_EQ(m->optimizer, 4288 * 8);
  // One slot (min(pp − 0, 2 micro-batches) = 1) of 32 tokens: 2 layers × 134 floats, plus the
  // stage output 8, lnf 8 + 2, logits 300 and 6 loss numbers.
  EXPECT_EQ(m->activations, (2 * 134 + 8 + 10 + 300 + 6) * 32 * 4);
  // Backward: 3 residual gradients (8 each), dresid_mid + dln (16), dfch_gelu + dfch (64), datty 8,
  // dqkv 24; dlnf 8, dlogits 300, dlosses 1.
  EXPECT_EQ(m->backward, (24 + 16 + 64 + 8 + 24 + 8 + 300 + 1) * 32 * 4);
  EXPECT_EQ(m->comm_buffers, 0);
}

TEST(CostModelTest, ZeroStagesShardUnitByUnit) {
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  const auto at = [&](int zero) {
    return *PredictRankMemory(Tiny(), setup, Layout(1, 1, 4, zero, 1), false, 0);
  };
  // Units: wte 2400, wpe 128, two layers of 872, lnf 16; shards ceil(size/4).
  const int64_t whole = 4288;
  const int64_t shards = 600 + 32 + 2 * 218 + 4;
  EXPECT_EQ(at(0).params + at(0).grads + at(0).optimizer, 16 * whole);
  EXPECT_EQ(at(1).optimizer, 8 * shards);
  EXPECT_EQ(at(1).grads, 4 * whole);
  EXPECT_EQ(at(2).grads, 4 * shards);
  EXPECT_EQ(at(2).params, 4 * whole);
  EXPECT_EQ(at(3).params, 4 * shards);
  EXPECT_EQ(at(0).comm_buffers, 0);
  EXPECT_GT(at(3).comm_buffers, at(2).comm_buffers);
}

// The transient peak as ShardedGpt reaches it (placement_memory_validation_test measures it):
// ZeRO 2 on one stage of a tied model holds wte's gradient scratch through the backward, and the
// communication thread may fall a full queue behind: the layer being filled, three in flight
// (two queued, one running with its reduced shard).
TEST(CostModelTest, TransientBuffersOfZero2) {
  ModelSpec m = Tiny();
  m.layers = 4;
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  const MemoryBreakdown b = *PredictRankMemory(m, setup, Layout(1, 1, 2, 2, 2), false, 0);
  // wte 2400 floats, a layer 872 (shard 436).
  EXPECT_EQ(b.comm_buffers, (2400 + 4 * 872 + 436) * 4);
  // Fewer layers than the queue holds: fewer in flight.
  m.layers = 2;
  const MemoryBreakdown two = *PredictRankMemory(m, setup, Layout(1, 1, 2, 2, 2), false, 0);
  EXPECT_LT(two.comm_buffers, b.comm_buffers);
  // ZeRO 1: one unit's all-gather after the update, shard + gathered: wte 1200 + 2400.
  const MemoryBreakdown z1 = *PredictRankMemory(m, setup, Layout(1, 1, 2, 1, 2), false, 0);
  EXPECT_EQ(z1.comm_buffers, (1200 + 2400) * 4);
}

TEST(CostModelTest, PipelineSlots) {
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  ParallelSpec p = Layout(1, 2, 1, 0, 1);  // 8 micro-batches
  const MemoryBreakdown first = *PredictRankMemory(Tiny(), setup, p, false, 0);
  const MemoryBreakdown last = *PredictRankMemory(Tiny(), setup, p, false, 1);
  // Stage 0 keeps 2 slots (1 layer + its output each), stage 1 keeps 1 (with the head's).
  EXPECT_EQ(first.activations, 2 * (134 + 8) * 16 * 4);
  EXPECT_EQ(last.activations, (134 + 8 + 10 + 300 + 6) * 16 * 4);
  // The last stage holds its copy of the tied wte rows.
  EXPECT_EQ(last.params, (872 + 16 + 2400) * 4);
  EXPECT_EQ(first.params, (872 + 2400 + 128) * 4);
}

TEST(CostModelTest, BadLayoutIsAnError) {
  EXPECT_THAT(
      Message(PredictRankMemory(Tiny(), TinySetup(), Layout(3, 1, 1, 0, 0), false, 0).status()),
      HasSubstr("tp 3 is more than heads 2"));
  EXPECT_THAT(
      Message(PredictRankMemory(Tiny(), TinySetup(), Layout(1, 1, 1, 0, 0), false, 1).status()),
      HasSubstr("rank 1 is outside"));
}

// The parameter bytes are ShardLayout's, rank by rank (uneven vocabulary shards included).
TEST(CostModelTest, ParamsMatchShardLayout) {
  ModelSpec m = Tiny();
  m.vocab = 301;
  m.layers = 3;
  for (const bool tied : {true, false}) {
    m.tied_embeddings = tied;
    ParallelSpec p = Layout(2, 2, 1, 0, 1);
    absl::StatusOr<std::vector<MemoryBreakdown>> all =
        PredictMemoryPerRank(m, TinySetup(), p, false);
    ASSERT_TRUE(all.ok()) << all.status();
    const std::vector<StageRange> stages = *StagesOf(p, 3);
    model::GptConfig config;
    config.layers = 3;
    config.heads = 2;
    config.d_model = 8;
    config.d_ff = 32;
    config.vocab = 301;
    config.max_seq_len = 16;
    config.tied_embeddings = tied;
    for (int rank = 0; rank < 4; ++rank) {
      const RankCoords c = RankGrid::Create(2, 2, 1)->Coords(rank);
      model::ShardPlace place;
      place.tp_size = 2;
      place.tp_index = c.tp;
      place.chunks = {stages[c.pp]};
      place.first_stage = c.pp == 0;
      place.last_stage = c.pp == 1;
      absl::StatusOr<model::ShardLayout> layout = model::ShardLayout::Create(config, place);
      ASSERT_TRUE(layout.ok()) << layout.status();
      EXPECT_EQ((*all)[rank].params, layout->total() * 4) << "rank " << rank << " tied " << tied;
    }
  }
}

// One rank holds exactly what a single-rank ShardedGpt allocates.
TEST(CostModelTest, MatchesShardedGptAllocation) {
  for (const int64_t micro_batch : {1, 2, 4}) {
    kernels::CpuAllocator allocator;
    model::ShardedOptions options;
    options.config.layers = 2;
    options.config.heads = 2;
    options.config.d_model = 8;
    options.config.d_ff = 32;
    options.config.vocab = 300;
    options.config.max_seq_len = 16;
    options.parallel = Layout(1, 1, 1, 0, micro_batch);
    options.global_batch = 4;
    options.seq_len = 16;
    absl::StatusOr<std::unique_ptr<model::ShardedGpt>> gpt =
        model::ShardedGpt::Create(options, {}, allocator);
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    const MemoryBreakdown m = *PredictRankMemory(Tiny(), TinySetup(), options.parallel, false, 0);
    EXPECT_EQ(static_cast<int64_t>(allocator.stats().bytes_in_use), m.total())
        << "micro_batch " << micro_batch;
    const model::ShardedMemory held = (*gpt)->memory();
    EXPECT_EQ(held.param_bytes, m.params);
    EXPECT_EQ(held.grad_bytes, m.grads);
    EXPECT_EQ(held.optimizer_bytes, m.optimizer);
  }
}

// ---- time ----

StageHardware Hardware(double flops) {
  StageHardware hw;
  hw.flops = flops;
  hw.memory_bandwidth = 1e9;
  hw.tp_bandwidth = hw.dp_bandwidth = hw.p2p_bandwidth = hw.prev_p2p_bandwidth = 1e8;
  hw.tp_latency_s = hw.dp_latency_s = hw.p2p_latency_s = hw.prev_p2p_latency_s = 1e-5;
  return hw;
}

TEST(CostModelTest, StepTimeByHand) {
  const CostModelOptions o = CostModelOptions::Defaults();
  // 32 tokens per micro-batch; the thinnest GEMM dimension is Cs = 8, so the rate is
  // 1.36e9 · 8 / (8 + 128) = 8e7 FLOP/s.
  const ParallelSpec p = Layout(1, 1, 1, 0, 2);
  const StepTime t = PredictStepTime(Tiny(), TinySetup(), p, false, {Hardware(1.36e9)}, o);
  // Per micro-batch: 2 layers × 3 × 32 tokens × 2048 FLOPs, the head 3 × 32 × 4800.
  const double per_micro_batch = (2 * 3 * 32 * 2048.0 + 3 * 32 * 4800.0) / 8e7;
  EXPECT_NEAR(t.compute, 2 * per_micro_batch, 1e-12);
  EXPECT_EQ(t.tp, 0);
  EXPECT_EQ(t.pp, 0);
  EXPECT_EQ(t.bubble, 0);
  EXPECT_EQ(t.dp, 0);
  // AdamW: 4288 parameters × 32 bytes at 1 GB/s.
  EXPECT_NEAR(t.optimizer, 4288 * 32 / 1e9, 1e-15);
  EXPECT_NEAR(t.total, t.compute + t.optimizer, 1e-15);
}

TEST(CostModelTest, PipelineBubbleAndSends) {
  const CostModelOptions o = CostModelOptions::Defaults();
  ModelSpec m = Tiny();
  m.layers = 4;
  m.tied_embeddings = false;
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  const ParallelSpec p = Layout(1, 2, 1, 0, 1);  // 8 micro-batches of 16 tokens
  const std::vector<StageHardware> hw = {Hardware(1.36e9), Hardware(1.36e9)};
  const StepTime t = PredictStepTime(m, setup, p, false, hw, o);
  const double layer = 3 * 16 * 2048.0 / 8e7;
  const double head = 3 * 16 * 4800.0 / 8e7;
  // Each stage sends one (16, 8) fp32 activation per micro-batch: 512 bytes at 1e8 B/s + 10 µs.
  const double send = 1e-5 + 512 / 1e8;
  const double stage0 = 2 * layer + send, stage1 = 2 * layer + head + send;
  EXPECT_NEAR(t.compute, 8 * (2 * layer + head), 1e-12);
  EXPECT_NEAR(t.pp, 8 * send, 1e-12);
  // 1F1B: Σ t_s + (m − 1)·max t_s; the bubble is the other stages' share.
  EXPECT_NEAR(t.bubble, stage0, 1e-12);
  EXPECT_NEAR(t.compute + t.pp + t.bubble, stage0 + stage1 + 7 * stage1, 1e-12);
}

TEST(CostModelTest, TensorParallelAllReduces) {
  const CostModelOptions o = CostModelOptions::Defaults();
  TrainSetup setup = TinySetup();
  const ParallelSpec p = Layout(2, 1, 1, 0, 4);  // one micro-batch of 64 tokens
  const StepTime t = PredictStepTime(Tiny(), setup, p, false, {Hardware(1e9)}, o);
  // An all-reduce of (64, 8) fp32 over 2 ranks: 2·(1/2)·2048 B / 1e8 B/s + 2·1·10 µs.
  const double ar = 2048 / 1e8 + 2e-5;
  const double stats = 256 / 1e8 + 2e-5;  // the loss's per-token all-reduces
  // 4 per layer, the embedding's, the head input gradient's, 3 of per-token scalars.
  EXPECT_NEAR(t.tp, 2 * 4 * ar + ar + ar + 3 * stats, 1e-12);
}

TEST(CostModelTest, DataParallelReductionIsExposedPastTheOverlap) {
  CostModelOptions o = CostModelOptions::Defaults();
  o.dp_overlap = 0;  // nothing hidden: the whole all-reduce shows
  TrainSetup setup = TinySetup();
  const ParallelSpec p = Layout(1, 1, 2, 0, 2);  // dp 2, one micro-batch of 2 each
  StageHardware hw = Hardware(1.36e9);
  const StepTime t = PredictStepTime(Tiny(), setup, p, false, {hw}, o);
  // 4288 fp32 gradients all-reduced over 2: 2·(1/2)·17152 B at 1e8 B/s, 2 latencies, plus 2 per
  // further unit (6 units: wte, wpe, 2 layers, lnf, the head's count).
  const double expected = 17152 / 1e8 + 2e-5 + 5 * 2e-5;
  EXPECT_NEAR(t.dp, expected, 1e-12);
  // On CPU actors (fp32) the reduction's threads share the kernels' cores: nothing is hidden.
  o.dp_overlap = 1;
  EXPECT_NEAR(PredictStepTime(Tiny(), setup, p, false, {hw}, o).dp, expected, 1e-12);
  // On GPUs (bf16) the backward hides it.
  setup.precision = Precision::kBf16;
  o.dp_overlap = 0;
  const StepTime exposed = PredictStepTime(Tiny(), setup, p, false, {hw}, o);
  o.dp_overlap = 1;
  const StepTime hidden = PredictStepTime(Tiny(), setup, p, false, {hw}, o);
  EXPECT_GT(exposed.dp, 0);
  EXPECT_LT(hidden.dp, exposed.dp);
}

TEST(CostModelTest, RecomputeCostsAForwardAndSavesMemory) {
  const CostModelOptions o = CostModelOptions::Defaults();
  const ParallelSpec p = Layout(1, 1, 1, 0, 2);
  const StepTime plain = PredictStepTime(Tiny(), TinySetup(), p, false, {Hardware(1.36e9)}, o);
  const StepTime again = PredictStepTime(Tiny(), TinySetup(), p, true, {Hardware(1.36e9)}, o);
  const double layers_plain = 2 * (2 * 3 * 32 * 2048.0) / 8e7;
  EXPECT_NEAR(again.compute - plain.compute, layers_plain / 3, 1e-12);
  const MemoryBreakdown a = *PredictRankMemory(Tiny(), TinySetup(), p, false, 0);
  const MemoryBreakdown b = *PredictRankMemory(Tiny(), TinySetup(), p, true, 0);
  EXPECT_LT(b.activations, a.activations);
}

TEST(CostModelTest, CalibrationReplacesThePeak) {
  const CostModelOptions o = CostModelOptions::Defaults();
  NodeSpec n;
  n.peak_flops_bf16 = 312e12;
  EXPECT_DOUBLE_EQ(AchievableFlops(n, Precision::kBf16, o), 312e12 * o.default_flops_fraction);
  EXPECT_LT(MeasuredHalfDim(n, Precision::kBf16), 0);
  // A measured layer rate is used as it is; its fall-off only once it was measured too.
  n.measured_flops_bf16 = 250e12;
  EXPECT_DOUBLE_EQ(AchievableFlops(n, Precision::kBf16, o), 250e12);
  EXPECT_LT(MeasuredHalfDim(n, Precision::kBf16), 0);
  n.measured_half_dim = 40;
  EXPECT_EQ(MeasuredHalfDim(n, Precision::kBf16), 40);
  EXPECT_LT(MeasuredHalfDim(n, Precision::kFp32), 0);  // fp32 was not measured
}

TEST(CostModelTest, MeasuredFallOffScalesThinLayers) {
  // One stage, no parallelism: the layer compute is 3·N·(2·weights + 4·T·C) / (R·x/(x + h)).
  ModelSpec m;
  m.layers = 1;
  m.heads = 2;
  m.d_model = 64;
  m.max_seq_len = 32;
  TrainSetup setup;
  setup.global_batch = 2;
  setup.seq_len = 32;
  setup.precision = Precision::kFp32;
  ParallelSpec par;
  par.micro_batch = 2;
  StageHardware hw;
  hw.flops = 1e10;
  hw.memory_bandwidth = 1e10;
  const CostModelOptions o = CostModelOptions::Defaults();
  const double flops = 3.0 * 64 * (2.0 * 12 * 64 * 64 + 4.0 * 32 * 64);
  const double x = 64;  // min(tokens 64, width 64)
  hw.half_dim = 0;
  EXPECT_NEAR(StageCost(m, setup, par, false, 0, hw, o).layer_compute, flops / 1e10, 1e-12);
  hw.half_dim = 32;
  EXPECT_NEAR(StageCost(m, setup, par, false, 0, hw, o).layer_compute,
              flops / (1e10 * x / (x + 32)), 1e-12);
  hw.half_dim = -1;  // not measured: the options' fall-off
  EXPECT_NEAR(StageCost(m, setup, par, false, 0, hw, o).layer_compute,
              flops / (1e10 * x / (x + o.gemm_half_dim)), 1e-12);

  // tp = 2: each rank does half the FLOPs. A measured fall-off still sees the layer's width
  // (x = min(64 tokens, d_model 64)); the default one the rank's GEMM width (x = 32).
  par.tp = 2;
  const double half_flops = 3.0 * 64 * (2.0 * 6 * 64 * 64 + 4.0 * 32 * 32);
  hw.half_dim = 32;
  EXPECT_NEAR(StageCost(m, setup, par, false, 0, hw, o).layer_compute,
              half_flops / (1e10 * 64 / (64 + 32)), 1e-12);
  hw.half_dim = -1;
  EXPECT_NEAR(StageCost(m, setup, par, false, 0, hw, o).layer_compute,
              half_flops / (1e10 * 32 / (32 + o.gemm_half_dim)), 1e-12);
}

}  // namespace
}  // namespace shardline::placement
