#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
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
model::ModelConfig Tiny() {
  model::ModelConfig m;
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

TEST(ModelYamlTest, GptDefaults) {
  absl::StatusOr<model::ModelConfig> m =
      ParseModelConfig("layers: 2\nheads: 4\nd_model: 64\nmax_seq_len: 32\n", "m.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->FamilyName(), "gpt");
  EXPECT_EQ(m->norm, model::NormKind::kLayerNorm);
  EXPECT_EQ(m->mlp, model::MlpKind::kGelu);
  EXPECT_EQ(m->positions, model::PositionKind::kLearned);
  EXPECT_TRUE(m->bias);
  EXPECT_EQ(m->d_ff, 256);
  EXPECT_EQ(m->kv_heads, 4);
  EXPECT_TRUE(m->tied_embeddings);
}

TEST(ModelYamlTest, LlamaDefaults) {
  absl::StatusOr<model::ModelConfig> m =
      LoadModelConfigFile(SourceDir() + "/examples/model-llama-7b.yaml");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->FamilyName(), "llama");
  EXPECT_EQ(m->norm, model::NormKind::kRmsNorm);
  EXPECT_EQ(m->mlp, model::MlpKind::kSwiGlu);
  EXPECT_EQ(m->positions, model::PositionKind::kRotary);
  EXPECT_FALSE(m->bias);
  EXPECT_EQ(m->d_ff, 11008);  // Llama's 2/3·4·4096 rounded up to 256
  EXPECT_EQ(m->kv_heads, 32);
  EXPECT_FALSE(m->tied_embeddings);
  // Llama-2-7B's published count.
  EXPECT_EQ(DeriveModel(*m, 4096).params, 6'738'415'616);
}

TEST(ModelYamlTest, ExamplesLoad) {
  for (const char* name : {"model-gpt-tiny.yaml", "model-gpt-1b.yaml", "model-gpt-175b.yaml",
                           "model-gpt-1t.yaml", "model-llama-7b.yaml", "model-llama-70b.yaml"}) {
    absl::StatusOr<model::ModelConfig> m = LoadModelConfigFile(SourceDir() + "/examples/" + name);
    EXPECT_TRUE(m.ok()) << name << ": " << m.status();
  }
  absl::StatusOr<model::ModelConfig> gpt3 =
      LoadModelConfigFile(SourceDir() + "/examples/model-gpt-175b.yaml");
  ASSERT_TRUE(gpt3.ok());
  EXPECT_NEAR(static_cast<double>(DeriveModel(*gpt3, 2048).params), 174.6e9, 0.1e9);
}

TEST(ModelYamlTest, Errors) {
  const auto error = [](const std::string& text) {
    return Message(ParseModelConfig(text, "m.yaml").status());
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

TEST(ModelYamlTest, TrainerTakesLlamaWithItsKeys) {
  absl::StatusOr<TrainSpec> spec = ParseTrainSpec(
      "name: t\nmodel: {arch: llama, layers: 2, heads: 4, kv_heads: 2, head_dim: 24, d_model: 64,\n"
      "  max_seq_len: 8, rope_theta: 500000, norm_eps: 1e-6, tied_embeddings: true,\n"
      "  rope_scaling: {rope_type: llama3, factor: 8, low_freq_factor: 1, high_freq_factor: 4,\n"
      "                 original_max_position_embeddings: 8192}}\n"
      "steps: 1\nbatch: 2\n",
      "t.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model.FamilyName(), "llama");
  EXPECT_EQ(spec->model.kv(), 2);
  EXPECT_EQ(spec->model.head_size(), 24);
  EXPECT_EQ(spec->model.rope_theta, 500000.0);
  EXPECT_EQ(spec->model.rope_scaling.factor, 8.0);
  EXPECT_EQ(spec->model.rope_scaling.original_max_positions, 8192);
  EXPECT_TRUE(spec->model.tied_embeddings);
  const auto error = [](const std::string& model) {
    return Message(
        ParseTrainSpec("name: t\nmodel: " + model + "\nsteps: 1\nbatch: 2\n", "t.yaml").status());
  };
  EXPECT_THAT(error("{arch: llama, layers: 2, heads: 4, d_model: 64, max_seq_len: 8, "
                    "rope_scaling: {rope_type: yarn, factor: 4}}"),
              HasSubstr("rope_type 'yarn' is not supported (llama3 is)"));
  EXPECT_THAT(error("{arch: llama, layers: 2, heads: 4, d_model: 64, max_seq_len: 8, "
                    "rope_scaling: {factor: 4, low_freq_factor: 4, high_freq_factor: 1}}"),
              HasSubstr("high_freq_factor 1 must exceed low_freq_factor 4"));
  EXPECT_THAT(error("{arch: gpt, layers: 2, heads: 4, d_model: 64, max_seq_len: 8, "
                    "rope_scaling: {factor: 4}}"),
              HasSubstr("rope_scaling needs arch: llama"));
  EXPECT_THAT(error("{arch: llama, layers: 2, heads: 3, d_model: 64, max_seq_len: 8}"),
              HasSubstr("give head_dim to size the heads otherwise"));
}

// ---- model derivations ----

TEST(CostModelTest, Gpt2SmallParameters) {
  model::ModelConfig m;
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
  EXPECT_EQ(LayerActivationBytes(Tiny(), 16, 2, 1, Precision::kFp32, RecomputeMode::kNone),
            134 * 32 * 4);
  // Selective: without ln1 (8), atty (8), ln2 (8) and fch_gelu (32): 134 − 56 = 78 floats.
  EXPECT_EQ(LayerActivationBytes(Tiny(), 16, 2, 1, Precision::kFp32, RecomputeMode::kSelective),
            78 * 32 * 4);
  // Full: the input only.
  EXPECT_EQ(LayerActivationBytes(Tiny(), 16, 2, 1, Precision::kFp32, RecomputeMode::kFull),
            8 * 32 * 4);
}

// ---- memory ----

TEST(CostModelTest, MemoryByHand) {
  absl::StatusOr<MemoryBreakdown> m =
      PredictRankMemory(Tiny(), TinySetup(), Layout(1, 1, 1, 0, 2), 0);
  ASSERT_TRUE(m.ok()) << m.status();
  // fp32 parameters, gradients, AdamW m and v: 4 + 4 + 8 bytes per parameter.
  EXPECT_EQ(m->params, 4288 * 4);
  EXPECT_EQ(m->grads, 4288 * 4);
  EXPECT_EQ(m->optimizer, 4288 * 8);
  // One slot (min(pp − 0, 2 micro-batches) = 1) of 32 tokens: 2 layers × 134 floats, plus the
  // stage output 8, lnf 8 + 2, logits 300, 6 loss numbers and the token and target ids (int32).
  EXPECT_EQ(m->activations, (2 * 134 + 8 + 10 + 300 + 6 + 2) * 32 * 4);
  // Backward: 3 residual gradients (8 each), dresid_mid + dln (16), dfch_gelu + dfch (64), datty 8,
  // dqkv 24; dlnf 8, dlogits 300, dlosses 1; and the world's two sums (16 bytes).
  EXPECT_EQ(m->backward, (24 + 16 + 64 + 8 + 24 + 8 + 300 + 1) * 32 * 4 + 16);
  EXPECT_EQ(m->comm_buffers, 0);
}

// MemoryByHand's layout under each recomputation mode: the slot drops what the mode does not
// keep, per layer; the backward buffer gains the scratch one layer is rebuilt into.
TEST(CostModelTest, RecomputationModesByHand) {
  const auto at = [](RecomputeMode mode) {
    ParallelSpec p = Layout(1, 1, 1, 0, 2);
    p.recompute = mode;
    return *PredictRankMemory(Tiny(), TinySetup(), p, 0);
  };
  const MemoryBreakdown none = at(RecomputeMode::kNone);
  const MemoryBreakdown selective = at(RecomputeMode::kSelective);
  const MemoryBreakdown full = at(RecomputeMode::kFull);
  // One slot of 32 tokens, 2 layers; selective drops 56 floats per layer and token, full all 126
  // besides the residual input.
  EXPECT_EQ(none.activations - selective.activations, 2 * 56 * 32 * 4);
  EXPECT_EQ(none.activations - full.activations, 2 * 126 * 32 * 4);
  EXPECT_EQ(selective.backward - none.backward, 56 * 32 * 4);
  EXPECT_EQ(full.backward - none.backward, 126 * 32 * 4);
  EXPECT_EQ(selective.params, none.params);
  EXPECT_EQ(full.optimizer, none.optimizer);
}

// The interleaved schedule's memory, priced through PipelineSchedule as ShardedGpt pools it:
// MaxInFlightWithoutHead slots shared by the chunks without the head and, on the last stage,
// MaxInFlight of the head's chunk, each slot a chunk's layers, the head in the head's slots; the
// inputs (MaxInputsWithoutHead, MaxInputs of the head's chunk) and MaxEarlyGradients, (N, C)
// each; one backward buffer for a chunk.
TEST(CostModelTest, InterleavedSlotsComeFromTheSchedule) {
  model::ModelConfig m = Tiny();
  m.layers = 8;
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;  // 8 micro-batches of 1 sequence: N = 16 tokens
  ParallelSpec p = Layout(1, 2, 1, 0, 1);
  p.schedule = PipelineScheduleKind::kInterleaved;
  p.virtual_stages = 2;
  absl::StatusOr<PipelineSchedule> schedule = PipelineSchedule::Of(p, 8);
  ASSERT_TRUE(schedule.ok()) << schedule.status();
  absl::StatusOr<std::vector<StageSlots>> slots = ScheduleSlots(p, 8);
  ASSERT_TRUE(slots.ok()) << slots.status();
  ParallelSpec plain = Layout(1, 2, 1, 0, 1);
  const int64_t e = 4, N = 16;
  for (int s = 0; s < 2; ++s) {
    SCOPED_TRACE(s);
    const int64_t head_slots = s == 1 ? schedule->MaxInFlight(s, 1) : 0;
    EXPECT_EQ((*slots)[s].chunks, 2);
    EXPECT_EQ((*slots)[s].body_slots, schedule->MaxInFlightWithoutHead(s));
    EXPECT_EQ((*slots)[s].head_slots, head_slots);
    const int64_t inputs =
        schedule->MaxInputsWithoutHead(s) + (s == 1 ? schedule->MaxInputs(s, 1) : 0);
    EXPECT_EQ((*slots)[s].inputs, inputs);
    EXPECT_EQ((*slots)[s].early_gradients, schedule->MaxEarlyGradients(s));
    const int64_t slot_count = schedule->MaxInFlightWithoutHead(s) + head_slots;
    EXPECT_GT(slot_count, 2 - s);  // more in flight than 1F1B's
    const MemoryBreakdown inter = *PredictRankMemory(m, setup, p, s);
    const MemoryBreakdown one = *PredictRankMemory(m, setup, plain, s);
    // 1F1B holds min(pp − s, 8) slots of 4 layers; interleaved its slots of 2-layer chunks.
    const int64_t one_slots = 2 - s;
    // The head's: lnf 8 + 2 statistics, logits 300, 6 loss numbers. Every slot: its token and
    // target ids (int32).
    const int64_t head = s == 1 ? N * (10 + 300 + 6) * e : 0;
    const int64_t ids = 2 * N * 4;
    EXPECT_EQ(one.activations,
              one_slots * (4 * 134 * N * e + 8 * N * e) + one_slots * head + one_slots * ids);
    EXPECT_EQ(inter.activations, slot_count * 2 * 134 * N * e + inputs * 8 * N * e +
                                     head_slots * head + slot_count * ids);
    // The backward buffer holds a chunk's 3 residual gradients, not the stage's 5.
    EXPECT_EQ(one.backward - inter.backward,
              2 * 8 * N * e - schedule->MaxEarlyGradients(s) * 8 * N * e);
    EXPECT_EQ(inter.params, one.params);
  }
}

TEST(CostModelTest, OneFOneBSlotsAreTheSchedules) {
  // ScheduleSlots' closed form for 1F1B is PipelineSchedule's own count.
  for (const int pp : {1, 2, 3, 4}) {
    for (const int m : {1, 2, 3, 5, 8}) {
      ParallelSpec p = Layout(1, pp, 1, 0, 1);
      absl::StatusOr<PipelineSchedule> schedule = PipelineSchedule::Of(p, m);
      ASSERT_TRUE(schedule.ok()) << schedule.status();
      absl::StatusOr<std::vector<StageSlots>> slots = ScheduleSlots(p, m);
      ASSERT_TRUE(slots.ok()) << slots.status();
      for (int s = 0; s < pp; ++s) {
        const bool last = s + 1 == pp;
        EXPECT_EQ((*slots)[s].chunks, 1);
        EXPECT_EQ((*slots)[s].body_slots, schedule->MaxInFlightWithoutHead(s)) << pp << " " << m;
        EXPECT_EQ((*slots)[s].head_slots, last ? schedule->MaxInFlight(s, 0) : 0);
        EXPECT_EQ((*slots)[s].body_slots + (*slots)[s].head_slots, schedule->MaxInFlight(s, 0));
        EXPECT_EQ((*slots)[s].inputs, schedule->MaxInputs(s, 0));
        EXPECT_EQ((*slots)[s].early_gradients, schedule->MaxEarlyGradients(s));
      }
    }
  }
}

TEST(CostModelTest, ZeroStagesShardUnitByUnit) {
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  const auto at = [&](int zero) {
    return *PredictRankMemory(Tiny(), setup, Layout(1, 1, 4, zero, 1), 0);
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
  model::ModelConfig m = Tiny();
  m.layers = 4;
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  const MemoryBreakdown b = *PredictRankMemory(m, setup, Layout(1, 1, 2, 2, 2), 0);
  // wte 2400 floats, a layer 872 (shard 436).
  EXPECT_EQ(b.comm_buffers, (2400 + 4 * 872 + 436) * 4);
  // Fewer layers than the queue holds: fewer in flight.
  m.layers = 2;
  const MemoryBreakdown two = *PredictRankMemory(m, setup, Layout(1, 1, 2, 2, 2), 0);
  EXPECT_LT(two.comm_buffers, b.comm_buffers);
  // ZeRO 1: one unit's all-gather after the update, shard + gathered: wte 1200 + 2400.
  const MemoryBreakdown z1 = *PredictRankMemory(m, setup, Layout(1, 1, 2, 1, 2), 0);
  EXPECT_EQ(z1.comm_buffers, (1200 + 2400) * 4);
}

TEST(CostModelTest, PipelineSlots) {
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  ParallelSpec p = Layout(1, 2, 1, 0, 1);  // 8 micro-batches
  const MemoryBreakdown first = *PredictRankMemory(Tiny(), setup, p, 0);
  const MemoryBreakdown last = *PredictRankMemory(Tiny(), setup, p, 1);
  // Stage 0 keeps 2 slots (1 layer + its output each), stage 1 keeps 1 (with the head's).
  EXPECT_EQ(first.activations, 2 * (134 + 8 + 2) * 16 * 4);  // + 2: each slot's token ids
  EXPECT_EQ(last.activations, (134 + 8 + 10 + 300 + 6 + 2) * 16 * 4);
  // The last stage holds its copy of the tied wte rows.
  EXPECT_EQ(last.params, (872 + 16 + 2400) * 4);
  EXPECT_EQ(first.params, (872 + 2400 + 128) * 4);
}

TEST(CostModelTest, BadLayoutIsAnError) {
  EXPECT_THAT(Message(PredictRankMemory(Tiny(), TinySetup(), Layout(3, 1, 1, 0, 0), 0).status()),
              HasSubstr("tp 3 is more than heads 2"));
  EXPECT_THAT(Message(PredictRankMemory(Tiny(), TinySetup(), Layout(1, 1, 1, 0, 0), 1).status()),
              HasSubstr("rank 1 is outside"));
}

// The parameter bytes are ShardLayout's, rank by rank (uneven vocabulary shards included).
TEST(CostModelTest, ParamsMatchShardLayout) {
  model::ModelConfig m = Tiny();
  m.vocab = 301;
  m.layers = 3;
  for (const bool tied : {true, false}) {
    m.tied_embeddings = tied;
    ParallelSpec p = Layout(2, 2, 1, 0, 1);
    absl::StatusOr<std::vector<MemoryBreakdown>> all = PredictMemoryPerRank(m, TinySetup(), p);
    ASSERT_TRUE(all.ok()) << all.status();
    const std::vector<StageRange> stages = *StagesOf(p, 3);
    model::ModelConfig config;
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
    kernels::cpu::CpuBackend backend(allocator);
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
        model::ShardedGpt::Create(options, {}, backend);
    ASSERT_TRUE(gpt.ok()) << gpt.status();
    const MemoryBreakdown m = *PredictRankMemory(Tiny(), TinySetup(), options.parallel, 0);
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
  const StepTime t = PredictStepTime(Tiny(), TinySetup(), p, {Hardware(1.36e9)}, o);
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
  model::ModelConfig m = Tiny();
  m.layers = 4;
  m.tied_embeddings = false;
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  const ParallelSpec p = Layout(1, 2, 1, 0, 1);  // 8 micro-batches of 16 tokens
  const std::vector<StageHardware> hw = {Hardware(1.36e9), Hardware(1.36e9)};
  const StepTime t = PredictStepTime(m, setup, p, hw, o);
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
  const StepTime t = PredictStepTime(Tiny(), setup, p, {Hardware(1e9)}, o);
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
  const StepTime t = PredictStepTime(Tiny(), setup, p, {hw}, o);
  // 4288 fp32 gradients all-reduced over 2: 2·(1/2)·17152 B at 1e8 B/s, 2 latencies, plus 2 per
  // further unit (6 units: wte, wpe, 2 layers, lnf, the head's count).
  const double expected = 17152 / 1e8 + 2e-5 + 5 * 2e-5;
  EXPECT_NEAR(t.dp, expected, 1e-12);
  // On CPU actors (fp32) the reduction's threads share the kernels' cores: nothing is hidden.
  o.dp_overlap = 1;
  EXPECT_NEAR(PredictStepTime(Tiny(), setup, p, {hw}, o).dp, expected, 1e-12);
  // On GPUs (bf16) the backward hides it.
  setup.precision = Precision::kBf16;
  o.dp_overlap = 0;
  const StepTime exposed = PredictStepTime(Tiny(), setup, p, {hw}, o);
  o.dp_overlap = 1;
  const StepTime hidden = PredictStepTime(Tiny(), setup, p, {hw}, o);
  EXPECT_GT(exposed.dp, 0);
  EXPECT_LT(hidden.dp, exposed.dp);
}

TEST(CostModelTest, RecomputeCostsAForwardAndSavesMemory) {
  const CostModelOptions o = CostModelOptions::Defaults();
  const ParallelSpec p = Layout(1, 1, 1, 0, 2);
  ParallelSpec full = p;
  full.recompute = RecomputeMode::kFull;
  const StepTime plain = PredictStepTime(Tiny(), TinySetup(), p, {Hardware(1.36e9)}, o);
  const StepTime again = PredictStepTime(Tiny(), TinySetup(), full, {Hardware(1.36e9)}, o);
  const double layers_plain = 2 * (2 * 3 * 32 * 2048.0) / 8e7;
  EXPECT_NEAR(again.compute - plain.compute, layers_plain / 3, 1e-12);
  const MemoryBreakdown a = *PredictRankMemory(Tiny(), TinySetup(), p, 0);
  const MemoryBreakdown b = *PredictRankMemory(Tiny(), TinySetup(), full, 0);
  EXPECT_LT(b.activations, a.activations);
}

// Selective recomputation prices the attention's forward again plus the memory traffic of what it
// rebuilds; it all-reduces nothing more, where full recomputation reruns the whole forward.
TEST(CostModelTest, SelectiveRecomputationCostsTheAttentionAndSomeMemoryTraffic) {
  const CostModelOptions o = CostModelOptions::Defaults();
  model::ModelConfig m = Tiny();
  ParallelSpec p = Layout(2, 1, 1, 0, 2);
  const StageHardware hw = Hardware(1.36e9);
  const StageCostTerms none = StageCost(m, TinySetup(), p, 0, hw, o);
  p.recompute = RecomputeMode::kSelective;
  const StageCostTerms selective = StageCost(m, TinySetup(), p, 0, hw, o);
  p.recompute = RecomputeMode::kFull;
  const StageCostTerms full = StageCost(m, TinySetup(), p, 0, hw, o);
  // tp 2: Cs = 4, the rate 1.36e9 · 4 / 132. Attention: 32 tokens × 4 · 16 · 4 FLOPs. Memory:
  // 32 tokens × (4C + 2Fs + qkv + Cs = 32 + 32 + 12 + 4 = 80) floats at 1e9 bytes/s.
  const double rate = 1.36e9 * 4 / 132;
  EXPECT_NEAR(selective.layer_compute - none.layer_compute,
              32 * 4.0 * 16 * 4 / rate + 32 * 80 * 4 / 1e9, 1e-15);
  EXPECT_DOUBLE_EQ(selective.layer_tp, none.layer_tp);
  EXPECT_NEAR(full.layer_compute, none.layer_compute * 4 / 3, 1e-15);
  EXPECT_DOUBLE_EQ(full.layer_tp, none.layer_tp * 6 / 4);
  EXPECT_LT(selective.layer_compute, full.layer_compute);
}

// The interleaved schedule's bubble is 1F1B's over v (Narayanan et al. 2021 §2.2), as its
// simulation says, and it pays for it with v times the sends.
TEST(CostModelTest, InterleavedBubbleIsBelowOneFOneBs) {
  const CostModelOptions o = CostModelOptions::Defaults();
  model::ModelConfig m = Tiny();
  m.layers = 16;
  m.vocab = 8;  // a head that costs little, so the stages are nearly equal
  TrainSetup setup = TinySetup();
  setup.global_batch = 8;
  ParallelSpec plain = Layout(1, 4, 1, 0, 1);
  ParallelSpec inter = plain;
  inter.schedule = PipelineScheduleKind::kInterleaved;
  inter.virtual_stages = 2;
  std::vector<StageHardware> hw(4, Hardware(1.36e9));
  // Free sends first: the same stage times, half the fill and drain.
  std::vector<StageHardware> free_sends = hw;
  for (StageHardware& h : free_sends) h.p2p_bandwidth = h.prev_p2p_bandwidth = 0;
  StepTime a = PredictStepTime(m, setup, plain, free_sends, o);
  StepTime b = PredictStepTime(m, setup, inter, free_sends, o);
  EXPECT_GT(a.bubble, 0);
  EXPECT_NEAR(b.bubble, a.bubble / 2, 1e-12);
  EXPECT_DOUBLE_EQ(b.compute, a.compute);
  EXPECT_LT(b.total, a.total);
  // Sends cost: each chunk's, twice as many (but the wrap's, once fewer), in the step and in the
  // stages the bubble is made of.
  a = PredictStepTime(m, setup, plain, hw, o);
  b = PredictStepTime(m, setup, inter, hw, o);
  EXPECT_GT(b.pp, a.pp);
  EXPECT_LT(b.bubble, 0.55 * a.bubble);
  EXPECT_LT(b.total, a.total);
  // The bubble's share of compute and bubble against the schedule's simulation of unit passes.
  for (const ParallelSpec& p : {plain, inter}) {
    const StepTime t = PredictStepTime(m, setup, p, hw, o);
    absl::StatusOr<PipelineSchedule> schedule = PipelineSchedule::Of(p, 8);
    ASSERT_TRUE(schedule.ok()) << schedule.status();
    const double share = t.bubble / (t.bubble + t.compute + t.pp);
    EXPECT_NEAR(share, schedule->SimulatedBubble(), 0.03) << PipelineScheduleName(p.schedule);
  }
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
  model::ModelConfig m;
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
  EXPECT_NEAR(StageCost(m, setup, par, 0, hw, o).layer_compute, flops / 1e10, 1e-12);
  hw.half_dim = 32;
  EXPECT_NEAR(StageCost(m, setup, par, 0, hw, o).layer_compute, flops / (1e10 * x / (x + 32)),
              1e-12);
  hw.half_dim = -1;  // not measured: the options' fall-off
  EXPECT_NEAR(StageCost(m, setup, par, 0, hw, o).layer_compute,
              flops / (1e10 * x / (x + o.gemm_half_dim)), 1e-12);

  // tp = 2: each rank does half the FLOPs. A measured fall-off still sees the layer's width
  // (x = min(64 tokens, d_model 64)); the default one the rank's GEMM width (x = 32).
  par.tp = 2;
  const double half_flops = 3.0 * 64 * (2.0 * 6 * 64 * 64 + 4.0 * 32 * 32);
  hw.half_dim = 32;
  EXPECT_NEAR(StageCost(m, setup, par, 0, hw, o).layer_compute,
              half_flops / (1e10 * 64 / (64 + 32)), 1e-12);
  hw.half_dim = -1;
  EXPECT_NEAR(StageCost(m, setup, par, 0, hw, o).layer_compute,
              half_flops / (1e10 * 32 / (32 + o.gemm_half_dim)), 1e-12);
}

}  // namespace
}  // namespace shardline::placement
