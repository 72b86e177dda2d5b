// The serving memory model (placement/serve_memory.h): the fullest rank of a layout counted by
// hand for a small GPT, the engine's split of layers and vocabulary, the cache rules, and the
// layout `parallel: auto` picks for a device size.
#include "placement/serve_memory.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace shardline::placement {
namespace {

using ::testing::HasSubstr;

// The tiny GPT of the serving tests: 2 layers, 2 heads, d 16, MLP 32, the byte vocabulary, 64
// positions, tied head.
model::ModelConfig Tiny() {
  model::ModelConfig model;
  model.layers = 2;
  model.heads = 2;
  model.d_model = 16;
  model.d_ff = 32;
  model.vocab = 257;
  model.max_seq_len = 64;
  model.tied_embeddings = true;
  return model;
}

ServeLimits Limits() {
  ServeLimits limits;
  limits.max_running = 4;
  limits.max_tokens_per_step = 64;
  limits.block_size = 8;
  return limits;
}

TEST(ServeMemoryTest, OneRankHoldsTheWholeModelItsPackedMatricesACacheAndAStep) {
  const absl::StatusOr<ServeMemory> memory = EstimateServeMemory(Tiny(), 1, 1, Limits());
  ASSERT_TRUE(memory.ok()) << memory.status();
  // 9,616 parameters (wte 257·16, wpe 64·16, 2 layers of 2,224, lnf 32) and the packed copies of
  // the 2 layers' 2,048 matrix entries, 4 bytes each.
  EXPECT_EQ(memory->weights_bytes, 4 * (9616 + 2 * 2048));
  // A block: keys and values of 2 layers, 8 positions, 16 wide; 8 blocks a context, 4 contexts.
  EXPECT_EQ(memory->min_kv_cache_bytes, 8 * 2048);
  EXPECT_EQ(memory->kv_cache_bytes, 4 * 8 * 2048);
  // 64 rows through a layer (residuals, norms, q/k/v, attention, MLP) and 4 sampled rows' logits.
  EXPECT_EQ(memory->workspace_bytes,
            4 * (64 * (5 * 16 + 4 + 48 + 16 + 2 * 32) + 4 * (2 * 16 + 2 + 257)));
  EXPECT_EQ(memory->total(),
            memory->weights_bytes + memory->kv_cache_bytes + memory->workspace_bytes);
  EXPECT_THAT(memory->Describe(), HasSubstr("weights "));
}

TEST(ServeMemoryTest, TensorParallelismSplitsLayersVocabularyAndCache) {
  const ServeMemory one = *EstimateServeMemory(Tiny(), 1, 1, Limits());
  const absl::StatusOr<ServeMemory> two = EstimateServeMemory(Tiny(), 2, 1, Limits());
  ASSERT_TRUE(two.ok()) << two.status();
  // Per layer: the matrices (and their copies) and the column-parallel biases halve, the
  // LayerNorms and row-parallel biases stay; 129 of the 257 vocabulary rows; wpe whole.
  const int64_t layer = 4 * (2 * 1024 + (64 + 24 + 16 + 16 + 16));
  EXPECT_EQ(two->weights_bytes, 2 * layer + 4 * (129 * 16 + 64 * 16) + 4 * 32);
  EXPECT_EQ(two->kv_cache_bytes, one.kv_cache_bytes / 2);
}

TEST(ServeMemoryTest, PipelineStagesHoldTheirLayersTheFirstTheEmbeddingsTheLastTheHead) {
  const absl::StatusOr<ServeMemory> stages = EstimateServeMemory(Tiny(), 1, 2, Limits());
  ASSERT_TRUE(stages.ok()) << stages.status();
  const int64_t layer = 4 * (2 * 2048 + 176);
  // The first stage (a layer and wte + wpe) is fuller than the last (a layer, lnf, and the tied
  // head's rows, which it holds itself).
  EXPECT_EQ(stages->weights_bytes, layer + 4 * (257 * 16 + 64 * 16));
  EXPECT_EQ(stages->min_kv_cache_bytes, 8 * 1024);  // one layer per stage
}

TEST(ServeMemoryTest, LlamaPricesItsOwnRowsAndGroupedQueryAttentionsSmallerCache) {
  model::ModelConfig llama = model::ModelConfig::Llama(Tiny());
  llama.heads = 4;
  llama.kv_heads = 1;  // heads of 4 channels; one key/value head
  const absl::StatusOr<ServeMemory> memory = EstimateServeMemory(llama, 1, 1, Limits());
  ASSERT_TRUE(memory.ok()) << memory.status();
  // A layer: q (16,16), k and v (4,16), o (16,16), gate, up (32,16) and down (16,32) — 2,176
  // matrix entries, twice with their packed copies — and two RMSNorm gains; wte and the untied
  // head 257·16 each, lnf 16, no wpe.
  EXPECT_EQ(memory->weights_bytes, 4 * (2 * (2 * 2176 + 32) + 2 * 257 * 16 + 16));
  // A block caches one key/value head of 4 channels: a quarter of the multi-head cache.
  EXPECT_EQ(memory->min_kv_cache_bytes, 8 * 2 * 2 * 8 * 4 * 4);
  const ServeMemory mha = *EstimateServeMemory(Tiny(), 1, 1, Limits());
  EXPECT_EQ(memory->min_kv_cache_bytes * 4, mha.min_kv_cache_bytes);
  // At tp 2 each rank still holds (a replica of) the one head: the cache does not halve.
  const absl::StatusOr<ServeMemory> two = EstimateServeMemory(llama, 2, 1, Limits());
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->min_kv_cache_bytes, memory->min_kv_cache_bytes);
}

TEST(ServeMemoryTest, BadLayoutsAndCachesAreRefusedWithTheNumbers) {
  EXPECT_THAT(EstimateServeMemory(Tiny(), 4, 1, Limits()).status().message(),
              HasSubstr("tp 4 must divide the 2 heads and the MLP width of 32"));
  EXPECT_THAT(EstimateServeMemory(Tiny(), 1, 3, Limits()).status().message(),
              HasSubstr("pp 3: a model of 2 layers has 1 to 2 pipeline stages"));
  ServeLimits small = Limits();
  small.kv_cache_bytes = 4096;  // 2 blocks; a context needs 8
  EXPECT_THAT(EstimateServeMemory(Tiny(), 1, 1, small).status().message(),
              HasSubstr("limits.kv_cache 4KiB holds 2 blocks of 2048 bytes"));
  ServeLimits given = Limits();
  given.kv_cache_bytes = 100000;  // whole blocks of it
  EXPECT_EQ(EstimateServeMemory(Tiny(), 1, 1, given)->kv_cache_bytes, 100000 / 2048 * 2048);
}

TEST(ServeMemoryTest, AutoTakesTheFewestDevicesThatHoldARankTensorParallelWithinANode) {
  const int64_t one = EstimateServeMemory(Tiny(), 1, 1, Limits())->total();
  const int64_t tp2 = EstimateServeMemory(Tiny(), 2, 1, Limits())->total();
  const int64_t pp2 = EstimateServeMemory(Tiny(), 1, 2, Limits())->total();
  auto layout = PlanServeLayout(Tiny(), Limits(), one, 4, 4);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->world(), 1);
  layout = PlanServeLayout(Tiny(), Limits(), one - 1, 4, 4);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tp, 2);
  EXPECT_EQ(layout->pp, 1);
  ASSERT_LT(tp2, one);
  // One device per node: tensor parallelism would cross nodes, so stages.
  layout = PlanServeLayout(Tiny(), Limits(), std::max(tp2, pp2), 4, 1);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->tp, 1);
  EXPECT_EQ(layout->pp, 2);
  const absl::Status none = PlanServeLayout(Tiny(), Limits(), 1000, 2, 2).status();
  EXPECT_EQ(none.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(none.message(), HasSubstr("no layout of at most 2 devices fits: the closest, tp 2"));
  EXPECT_THAT(none.message(), HasSubstr("more than the"));
}

}  // namespace
}  // namespace shardline::placement
