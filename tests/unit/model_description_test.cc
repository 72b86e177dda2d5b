// model/: one ModelConfig for every family, and the table of its tensors that layouts,
// checkpoints and the planner read.
#include <map>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/model_config.h"
#include "model/tensor_table.h"

namespace shardline::model {
namespace {

using ::testing::HasSubstr;

std::string Message(const absl::Status& status) { return std::string(status.message()); }

ModelConfig Gpt2Small() {
  return ModelConfig{
      .layers = 12, .heads = 12, .d_model = 768, .vocab = 50257, .max_seq_len = 1024};
}

// Llama-2-7B's shape: 32 layers, 32 heads of 128, SwiGLU 11008, vocab 32000, untied.
ModelConfig Llama7B(int64_t kv_heads = 0) {
  return ModelConfig::Llama(ModelConfig{.layers = 32,
                                        .heads = 32,
                                        .kv_heads = kv_heads,
                                        .d_model = 4096,
                                        .d_ff = 11008,
                                        .vocab = 32000,
                                        .max_seq_len = 4096});
}

std::vector<std::string> Names(const std::vector<TensorRow>& rows) {
  std::vector<std::string> names;
  for (const TensorRow& row : rows) names.push_back(row.name);
  return names;
}

TEST(ModelConfigTest, Gpt2IsTheDefaultSetting) {
  const ModelConfig c = Gpt2Small();
  EXPECT_EQ(c.FamilyName(), "gpt");
  EXPECT_EQ(c, ModelConfig::Gpt(c));
  EXPECT_EQ(c.ff(), 3072);
  EXPECT_EQ(c.kv(), 12);
  EXPECT_EQ(c.head_size(), 64);
  EXPECT_TRUE(c.Validate().ok());
  EXPECT_TRUE(c.EngineSupports().ok());
  EXPECT_EQ(Llama7B().FamilyName(), "llama");
  ModelConfig custom = c;
  custom.mlp = MlpKind::kSwiGlu;
  EXPECT_EQ(custom.FamilyName(), "custom");
  // Resolved widths compare equal: d_ff 0 is 4·d_model.
  ModelConfig explicit_ff = c;
  explicit_ff.d_ff = 3072;
  explicit_ff.kv_heads = 12;
  EXPECT_EQ(c, explicit_ff);
  explicit_ff.d_ff = 3000;
  EXPECT_NE(c, explicit_ff);
}

TEST(ModelConfigTest, ValidateNamesTheField) {
  ModelConfig c = Gpt2Small();
  c.d_model = 100;
  c.heads = 3;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("d_model 100 is not divisible by heads 3"));
  c = Llama7B(/*kv_heads=*/5);
  EXPECT_THAT(Message(c.Validate()), HasSubstr("heads 32 is not divisible by kv_heads 5"));
  c = Gpt2Small();
  c.norm_eps = 0;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("norm_eps must be positive"));
  c = Gpt2Small();
  c.layers = 0;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("layers must be >= 1, got 0"));
  c = Gpt2Small();
  c.max_seq_len = int64_t{1} << 40;
  EXPECT_THAT(Message(c.Validate()), HasSubstr("max_seq_len 1099511627776 is too large"));
}

TEST(ModelConfigTest, EngineRunsBothFamiliesAndRefusesWhatItCannotNamingTheKey) {
  // Every norm, MLP and position choice runs: Llama's and GPT-2's, and grouped-query attention.
  EXPECT_TRUE(Llama7B().EngineSupports().ok()) << Llama7B().EngineSupports();
  ModelConfig gqa = Llama7B();
  gqa.kv_heads = 8;
  EXPECT_TRUE(gqa.EngineSupports().ok());
  const auto refused = [](ModelConfig c, auto edit) {
    edit(c);
    EXPECT_TRUE(c.Validate().ok()) << c.DebugString();
    return Message(c.EngineSupports());
  };
  // What the tensor table has no rows for is refused rather than dropped.
  EXPECT_THAT(refused(Gpt2Small(), [](ModelConfig& c) { c.kv_heads = 4; }),
              HasSubstr("bias true with kv_heads 4 < heads 12"));
  EXPECT_THAT(refused(Gpt2Small(), [](ModelConfig& c) { c.mlp = MlpKind::kSwiGlu; }),
              HasSubstr("bias true with mlp swiglu"));
  EXPECT_THAT(refused(Gpt2Small(), [](ModelConfig& c) { c.bias = false; }),
              HasSubstr("bias false with norm layernorm"));
  EXPECT_THAT(refused(Llama7B(), [](ModelConfig& c) { c.head_dim = 1024; }),
              HasSubstr("head size 1024: the rotary kernels take heads of at most 512"));
  // Any positive epsilon runs: the norms take it.
  ModelConfig eps = Gpt2Small();
  eps.norm_eps = 1e-6;
  EXPECT_TRUE(eps.EngineSupports().ok());
}

// The table gives GPT-2 exactly the tensors, order and shapes of our checkpoints (and of the
// lists it replaced: ParamLayout, ShardLayout and Gpt2TensorSpecs).
TEST(TensorTableTest, Gpt2Rows) {
  ModelConfig c{.layers = 2, .heads = 2, .d_model = 8, .d_ff = 24, .vocab = 11, .max_seq_len = 5};
  const std::vector<TensorRow> rows = ModelRows(c);
  EXPECT_EQ(Names(rows), (std::vector<std::string>{
                             "wte",           "wpe",           "h.0.ln1.w",       "h.0.ln1.b",
                             "h.0.qkv.w",     "h.0.qkv.b",     "h.0.attn_proj.w", "h.0.attn_proj.b",
                             "h.0.ln2.w",     "h.0.ln2.b",     "h.0.fc.w",        "h.0.fc.b",
                             "h.0.fc_proj.w", "h.0.fc_proj.b", "h.1.ln1.w",       "h.1.ln1.b",
                             "h.1.qkv.w",     "h.1.qkv.b",     "h.1.attn_proj.w", "h.1.attn_proj.b",
                             "h.1.ln2.w",     "h.1.ln2.b",     "h.1.fc.w",        "h.1.fc.b",
                             "h.1.fc_proj.w", "h.1.fc_proj.b", "lnf.w",           "lnf.b"}));
  std::map<std::string, TensorRow> by_name;
  for (const TensorRow& row : rows) by_name[row.name] = row;
  EXPECT_EQ(by_name["wte"].shape, (std::vector<int64_t>{11, 8}));
  EXPECT_EQ(by_name["wpe"].shape, (std::vector<int64_t>{5, 8}));
  EXPECT_EQ(by_name["h.0.qkv.w"].shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(by_name["h.0.qkv.w"].sharded_shape, (std::vector<int64_t>{3, 8, 8}));
  EXPECT_EQ(by_name["h.0.qkv.b"].sharded_shape, (std::vector<int64_t>{3, 8}));
  EXPECT_EQ(by_name["h.1.fc.w"].shape, (std::vector<int64_t>{24, 8}));
  EXPECT_EQ(by_name["h.1.fc_proj.w"].shape, (std::vector<int64_t>{8, 24}));
  EXPECT_EQ(by_name["h.1.fc_proj.w"].init, InitKind::kResidualNormal);
  EXPECT_EQ(by_name["h.1.attn_proj.w"].init, InitKind::kResidualNormal);
  EXPECT_EQ(by_name["lnf.w"].init, InitKind::kOnes);
  EXPECT_EQ(by_name["lnf.b"].init, InitKind::kZeros);
  EXPECT_TRUE(by_name["wpe"].decay);
  EXPECT_FALSE(by_name["h.0.ln1.w"].decay);
  EXPECT_FALSE(by_name["h.0.fc.b"].decay);
  c.tied_embeddings = false;
  EXPECT_EQ(ModelRows(c).back().name, "lm_head.w");
  EXPECT_EQ(ModelRows(c).back().cut, TpCut::kVocab);
}

// Llama's choices are rows, not branches: no biases, RMSNorm gains only, SwiGLU's three matrices,
// no position table, q/k/v apart under grouped-query attention.
TEST(TensorTableTest, LlamaRows) {
  EXPECT_EQ(Names(BlockRows(Llama7B())),
            (std::vector<std::string>{"ln1.w", "qkv.w", "attn_proj.w", "ln2.w", "gate.w", "up.w",
                                      "down.w"}));
  EXPECT_EQ(Names(BlockRows(Llama7B(/*kv_heads=*/8))),
            (std::vector<std::string>{"ln1.w", "q.w", "k.w", "v.w", "attn_proj.w", "ln2.w",
                                      "gate.w", "up.w", "down.w"}));
  EXPECT_EQ(Names(EmbeddingRows(Llama7B())), (std::vector<std::string>{"wte"}));
  EXPECT_EQ(Names(HeadRows(Llama7B())), (std::vector<std::string>{"lnf.w", "lm_head.w"}));
  // Llama-2-7B's published parameter count, from the table alone.
  int64_t params = 0;
  for (const TensorRow& row : ModelRows(Llama7B())) params += row.numel();
  EXPECT_EQ(params, 6'738'415'616);
}

TEST(TensorTableTest, TensorParallelBoxes) {
  const ModelConfig c{
      .layers = 1, .heads = 4, .d_model = 16, .d_ff = 32, .vocab = 10, .max_seq_len = 4};
  std::map<std::string, TensorRow> rows;
  for (const TensorRow& row : ModelRows(c)) rows[row.name] = row;
  // Column-parallel by heads: rank 1 of 2 holds heads 2..3 of each of q, k, v.
  TensorBox qkv = TpBox(rows["h.0.qkv.w"], c, 2, 1);
  EXPECT_EQ(qkv.offsets, (std::vector<int64_t>{0, 8, 0}));
  EXPECT_EQ(qkv.shape, (std::vector<int64_t>{3, 8, 16}));
  // Row-parallel: the matching input columns.
  TensorBox proj = TpBox(rows["h.0.fc_proj.w"], c, 4, 3);
  EXPECT_EQ(proj.offsets, (std::vector<int64_t>{0, 24}));
  EXPECT_EQ(proj.shape, (std::vector<int64_t>{16, 8}));
  // Vocabulary rows, uneven: 10 over 3 ranks is 3, 3, 4.
  EXPECT_EQ(TpBox(rows["wte"], c, 3, 2).offsets, (std::vector<int64_t>{6, 0}));
  EXPECT_EQ(TpBox(rows["wte"], c, 3, 2).shape, (std::vector<int64_t>{4, 16}));
  // Replicated.
  EXPECT_EQ(TpBox(rows["h.0.attn_proj.b"], c, 4, 2).shape, (std::vector<int64_t>{16}));
}

// vLLM's rule: tp beyond the key/value heads replicates each head tp / kv_heads times.
TEST(TensorTableTest, KeyValueHeadsReplicateWhenTpExceedsThem) {
  const ModelConfig c = Llama7B(/*kv_heads=*/2);
  TensorRow k;
  for (const TensorRow& row : BlockRows(c)) {
    if (row.role == TensorRole::kKey) k = row;
  }
  ASSERT_EQ(k.name, "k.w");
  for (int64_t rank = 0; rank < 8; ++rank) {
    const TensorBox box = TpBox(k, c, 8, rank);
    EXPECT_EQ(box.shape, (std::vector<int64_t>{128, 4096}));
    EXPECT_EQ(box.offsets[0], rank < 4 ? 0 : 128) << rank;
  }
  EXPECT_EQ(TpBox(k, c, 2, 1).offsets[0], 128);
  EXPECT_TRUE(CheckTensorParallel(c, 8).ok());
  EXPECT_TRUE(CheckTensorParallel(Llama7B(/*kv_heads=*/8), 16).ok());
  const ModelConfig odd = ModelConfig::Llama(ModelConfig{.layers = 1,
                                                         .heads = 12,
                                                         .kv_heads = 4,
                                                         .d_model = 96,
                                                         .d_ff = 48,
                                                         .vocab = 300,
                                                         .max_seq_len = 8});
  EXPECT_THAT(Message(CheckTensorParallel(odd, 6)),
              HasSubstr("tp 6 and kv_heads 4: one must divide the other"));
  EXPECT_THAT(Message(CheckTensorParallel(Gpt2Small(), 5)),
              HasSubstr("tp 5 must divide heads 12 and d_ff 3072"));
}

TEST(TensorTableTest, PerRankCountsAndFlops) {
  const ModelConfig c = Gpt2Small();
  // ln1, ln2 (2C each), qkv (3C² + 3C), attn_proj (C² + C), fc (4C² + 4C), fc_proj (4C² + C).
  const int64_t C = 768;
  EXPECT_EQ(BlockParamsPerRank(c, 1), 12 * C * C + 13 * C);
  // tp 2: every matrix and the column biases halve; norms and row-parallel biases stay whole.
  EXPECT_EQ(BlockParamsPerRank(c, 2), 6 * C * C + 6 * C + (3 * C + 4 * C) / 2);
  // 2 FLOPs per weight of the matrices, plus 4·T·C for attention.
  EXPECT_DOUBLE_EQ(BlockForwardFlopsPerToken(c, 1024), 2.0 * 12 * C * C + 4.0 * 1024 * C);
}

// The metadata form carries every choice, and reads the files written before the choices existed
// as GPT-2.
TEST(ModelMetadataTest, RoundTripsEveryChoice) {
  ModelConfig llama = Llama7B(/*kv_heads=*/8);
  llama.rope_theta = 500000;
  llama.norm_eps = 1e-6;
  const std::map<std::string, std::string> metadata = checkpoint::ModelMetadata(llama);
  EXPECT_EQ(metadata.at("model"), "llama");
  EXPECT_EQ(metadata.at("rope_theta"), "500000");
  EXPECT_EQ(metadata.at("norm_eps"), "1e-06");
  absl::StatusOr<ModelConfig> back = checkpoint::ModelConfigFromMetadata(metadata, "m.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, llama);
  EXPECT_EQ(back->kv_heads, 8);

  const ModelConfig gpt = Gpt2Small();
  std::map<std::string, std::string> old = checkpoint::ModelMetadata(gpt);
  EXPECT_EQ(old.at("model"), "gpt2");
  for (const char* key : {"kv_heads", "norm", "norm_eps", "mlp", "positions", "rope_theta", "bias",
                          "tied_embeddings"}) {
    old.erase(key);
  }
  back = checkpoint::ModelConfigFromMetadata(old, "old.json");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, gpt);
}

TEST(ModelMetadataTest, BadValuesNameTheKey) {
  std::map<std::string, std::string> metadata = checkpoint::ModelMetadata(Gpt2Small());
  metadata["norm"] = "batchnorm";
  EXPECT_THAT(Message(checkpoint::ModelConfigFromMetadata(metadata, "m.json").status()),
              HasSubstr("m.json: metadata key 'norm' is 'batchnorm', expected layernorm or "
                        "rmsnorm"));
  metadata = checkpoint::ModelMetadata(Gpt2Small());
  metadata["mlp"] = "swiglu";  // the model key still says gpt2
  EXPECT_THAT(Message(checkpoint::ModelConfigFromMetadata(metadata, "m.json").status()),
              HasSubstr("metadata says model 'gpt2' but its choices are those of 'custom'"));
  metadata = checkpoint::ModelMetadata(Gpt2Small());
  metadata["rope_theta"] = "fast";
  EXPECT_THAT(Message(checkpoint::ModelConfigFromMetadata(metadata, "m.json").status()),
              HasSubstr("metadata key 'rope_theta' is 'fast', expected a number"));
  metadata = checkpoint::ModelMetadata(Gpt2Small());
  metadata.erase("n_layer");
  EXPECT_THAT(Message(checkpoint::ModelConfigFromMetadata(metadata, "m.json").status()),
              HasSubstr("metadata key 'n_layer' is missing"));
}

}  // namespace
}  // namespace shardline::model
