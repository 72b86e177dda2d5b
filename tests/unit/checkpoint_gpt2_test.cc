#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/gpt2_hf_import.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"

namespace shardline::checkpoint {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The model of the tests: 2 layers, C = 8, V = 16, T = 8, d_ff = 4C.
constexpr int64_t kLayers = 2;
constexpr int64_t kC = 8;
constexpr int64_t kV = 16;
constexpr int64_t kT = 8;
constexpr int64_t kF = 32;
constexpr int64_t kHeads = 2;

std::string Message(const absl::Status& status) { return ToString(status.message()); }

std::string TempDir() {
  std::string pattern = ::testing::TempDir() + "/gpt2_test_XXXXXX";
  EXPECT_NE(::mkdtemp(pattern.data()), nullptr);
  return pattern;
}

// A value that identifies (tensor, element): a transposed or misplaced element cannot match.
float Value(const std::string& name, int64_t index) {
  return static_cast<float>(std::hash<std::string>()(name) % 1000) +
         0.001f * static_cast<float>(index);
}

HostTensor Filled(const std::string& name, std::vector<int64_t> shape) {
  HostTensor tensor;
  tensor.shape = std::move(shape);
  tensor.values.resize(*NumElements(tensor.shape));
  for (size_t i = 0; i < tensor.values.size(); ++i) tensor.values[i] = Value(name, i);
  return tensor;
}

// The tensors of a Hugging Face GPT2Model/GPT2LMHeadModel of our test size, by HF name, in HF
// layout: Conv1D weights are (in, out).
std::map<std::string, HostTensor> HfTensors() {
  std::map<std::string, HostTensor> t;
  t["wte.weight"] = Filled("wte.weight", {kV, kC});
  t["wpe.weight"] = Filled("wpe.weight", {kT, kC});
  for (int64_t l = 0; l < kLayers; ++l) {
    const std::string h = "h." + std::to_string(l) + ".";
    const std::vector<std::pair<std::string, std::vector<int64_t>>> layer = {
        {"ln_1.weight", {kC}},
        {"ln_1.bias", {kC}},
        {"attn.c_attn.weight", {kC, 3 * kC}},
        {"attn.c_attn.bias", {3 * kC}},
        {"attn.c_proj.weight", {kC, kC}},
        {"attn.c_proj.bias", {kC}},
        {"ln_2.weight", {kC}},
        {"ln_2.bias", {kC}},
        {"mlp.c_fc.weight", {kC, kF}},
        {"mlp.c_fc.bias", {kF}},
        {"mlp.c_proj.weight", {kF, kC}},
        {"mlp.c_proj.bias", {kC}},
    };
    for (const auto& [suffix, shape] : layer) t[h + suffix] = Filled(h + suffix, shape);
  }
  t["ln_f.weight"] = Filled("ln_f.weight", {kC});
  t["ln_f.bias"] = Filled("ln_f.bias", {kC});
  return t;
}

// Writes `tensors` as fp32 under `prefix` + name, plus any raw extra tensors.
std::string WriteHf(const std::map<std::string, HostTensor>& tensors,
                    const std::string& prefix = "",
                    SafetensorsDType dtype = SafetensorsDType::kF32) {
  const std::string path = TempDir() + "/model.safetensors";
  SafetensorsWriter writer(path);
  writer.SetMetadata("format", "pt");
  std::vector<std::vector<uint16_t>> halves;  // keeps F16 bytes alive until Finish
  halves.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    TensorView view = tensor.View(prefix + name);
    if (dtype == SafetensorsDType::kBF16) {
      // Truncating fp32 to bf16 keeps the test values' high bits: enough to tell elements apart.
      std::vector<uint16_t>& bits = halves.emplace_back();
      for (float value : tensor.values)
        bits.push_back(static_cast<uint16_t>(std::bit_cast<uint32_t>(value) >> 16));
      view.dtype = dtype;
      view.data = std::as_bytes(std::span<const uint16_t>(bits));
    }
    EXPECT_TRUE(writer.Add(std::move(view)).ok());
  }
  EXPECT_TRUE(writer.Finish().ok());
  return path;
}

void ExpectImportedCorrectly(const Gpt2Weights& weights,
                             const std::map<std::string, HostTensor>& hf) {
  EXPECT_EQ(weights.config, (model::ModelConfig{.layers = kLayers,
                                                .heads = kHeads,
                                                .d_model = kC,
                                                .d_ff = kF,
                                                .vocab = kV,
                                                .max_seq_len = kT}));
  const std::vector<model::TensorRow> specs = model::ModelRows(weights.config);
  ASSERT_EQ(weights.tensors.size(), specs.size());
  for (const model::TensorRow& spec : specs) {
    ASSERT_TRUE(weights.tensors.contains(spec.name)) << spec.name;
    EXPECT_EQ(weights.tensors.at(spec.name).shape, spec.shape) << spec.name;
  }
  EXPECT_EQ(weights.tensors.at("wte").values, hf.at("wte.weight").values);
  EXPECT_EQ(weights.tensors.at("wpe").values, hf.at("wpe.weight").values);
  EXPECT_EQ(weights.tensors.at("h.1.ln2.b").values, hf.at("h.1.ln_2.bias").values);
  EXPECT_EQ(weights.tensors.at("lnf.w").values, hf.at("ln_f.weight").values);
  // Conv1D (in, out) becomes (out, in): ours[o][i] == hf[i][o].
  const std::vector<std::tuple<std::string, std::string, int64_t, int64_t>> transposed = {
      {"h.0.qkv.w", "h.0.attn.c_attn.weight", 3 * kC, kC},
      {"h.1.attn_proj.w", "h.1.attn.c_proj.weight", kC, kC},
      {"h.0.fc.w", "h.0.mlp.c_fc.weight", kF, kC},
      {"h.1.fc_proj.w", "h.1.mlp.c_proj.weight", kC, kF},
  };
  for (const auto& [ours, theirs, out, in] : transposed) {
    const std::vector<float>& got = weights.tensors.at(ours).values;
    const std::vector<float>& conv = hf.at(theirs).values;
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        ASSERT_EQ(got[o * in + i], conv[i * out + o]) << ours << "[" << o << "][" << i << "]";
      }
    }
  }
  EXPECT_EQ(weights.tensors.at("h.0.qkv.b").values, hf.at("h.0.attn.c_attn.bias").values);
}

TEST(Gpt2HfImportTest, ImportsTheHuggingFaceLayout) {
  const std::map<std::string, HostTensor> hf = HfTensors();
  absl::StatusOr<Gpt2Weights> weights = ImportHfGpt2(WriteHf(hf), kHeads);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectImportedCorrectly(*weights, hf);
}

TEST(Gpt2HfImportTest, AcceptsTheTransformerPrefixTiedHeadAndMaskBuffers) {
  // What GPT2LMHeadModel.save_pretrained writes: "transformer." names, the head, and (in older
  // versions) the attention-mask buffers.
  std::map<std::string, HostTensor> hf = HfTensors();
  std::map<std::string, HostTensor> file = hf;
  file["h.0.attn.bias"] = Filled("mask", {1, 1, kT, kT});
  file["h.1.attn.masked_bias"] = Filled("masked", {});
  const std::string path = TempDir() + "/lm.safetensors";
  SafetensorsWriter writer(path);
  for (const auto& [name, tensor] : file)
    ASSERT_TRUE(writer.Add(tensor.View("transformer." + name)).ok());
  HostTensor head = hf.at("wte.weight");
  ASSERT_TRUE(writer.Add(head.View("lm_head.weight")).ok());
  ASSERT_TRUE(writer.Finish().ok());
  absl::StatusOr<Gpt2Weights> weights = ImportHfGpt2(path, kHeads);
  ASSERT_TRUE(weights.ok()) << weights.status();
  ExpectImportedCorrectly(*weights, hf);
}

TEST(Gpt2HfImportTest, WidensBFloat16) {
  std::map<std::string, HostTensor> hf = HfTensors();
  absl::StatusOr<Gpt2Weights> weights =
      ImportHfGpt2(WriteHf(hf, "", SafetensorsDType::kBF16), kHeads);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const float truncated =
      std::bit_cast<float>(std::bit_cast<uint32_t>(hf.at("wte.weight").values[5]) & 0xffff0000u);
  EXPECT_EQ(weights->tensors.at("wte").values[5], truncated);
}

TEST(Gpt2HfImportTest, AnUntiedHeadBecomesOurs) {
  std::map<std::string, HostTensor> hf = HfTensors();
  hf["lm_head.weight"] = Filled("other head", {kV, kC});
  absl::StatusOr<Gpt2Weights> weights = ImportHfGpt2(WriteHf(hf), kHeads);
  ASSERT_TRUE(weights.ok()) << weights.status();
  EXPECT_FALSE(weights->config.tied_embeddings);
  EXPECT_EQ(weights->tensors.at("lm_head.w").values, hf.at("lm_head.weight").values);
  // A head equal to wte is the tied one a GPT2LMHeadModel saves: no tensor of its own.
  hf["lm_head.weight"] = hf.at("wte.weight");
  absl::StatusOr<Gpt2Weights> tied = ImportHfGpt2(WriteHf(hf), kHeads);
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_TRUE(tied->config.tied_embeddings);
  EXPECT_FALSE(tied->tensors.contains("lm_head.w"));
}

TEST(Gpt2HfImportTest, MissingTensorIsNamed) {
  for (const std::string missing :
       {"h.1.mlp.c_proj.bias", "wpe.weight", "ln_f.weight", "h.0.ln_1.weight"}) {
    std::map<std::string, HostTensor> hf = HfTensors();
    hf.erase(missing);
    const std::string path = WriteHf(hf, "transformer.");
    const absl::Status status = ImportHfGpt2(path, kHeads).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << missing;
    EXPECT_THAT(Message(status),
                AllOf(HasSubstr(path), HasSubstr("'" + missing), HasSubstr("missing")))
        << missing;
  }
}

TEST(Gpt2HfImportTest, MismatchedShapeIsNamed) {
  // c_attn stored like nn.Linear (3C, C) instead of Conv1D (C, 3C): not a GPT-2 file.
  std::map<std::string, HostTensor> hf = HfTensors();
  hf["h.1.attn.c_attn.weight"] = Filled("x", {3 * kC, kC});
  const absl::Status status = ImportHfGpt2(WriteHf(hf), kHeads).status();
  EXPECT_THAT(Message(status), AllOf(HasSubstr("'h.1.attn.c_attn.weight'"), HasSubstr("[24, 8]"),
                                     HasSubstr("expected [8, 24]")));
  hf = HfTensors();
  hf["wpe.weight"] = Filled("x", {kT, kC + 1});
  EXPECT_THAT(Message(ImportHfGpt2(WriteHf(hf), kHeads).status()), HasSubstr("'wpe.weight'"));
}

TEST(Gpt2HfImportTest, WronglyTypedTensorIsNamed) {
  const std::map<std::string, HostTensor> hf = HfTensors();
  const std::string path = TempDir() + "/typed.safetensors";
  SafetensorsWriter writer(path);
  std::vector<int32_t> ints(kC);
  for (const auto& [name, tensor] : hf) {
    if (name == "h.0.ln_2.bias") {
      ASSERT_TRUE(writer
                      .Add({name,
                            SafetensorsDType::kI32,
                            {kC},
                            std::as_bytes(std::span<const int32_t>(ints))})
                      .ok());
    } else {
      ASSERT_TRUE(writer.Add(tensor.View(name)).ok());
    }
  }
  ASSERT_TRUE(writer.Finish().ok());
  EXPECT_THAT(Message(ImportHfGpt2(path, kHeads).status()),
              AllOf(HasSubstr(path), HasSubstr("'h.0.ln_2.bias' has dtype I32")));
}

TEST(Gpt2HfImportTest, UnexpectedTensorAndBadHeadCountAreErrors) {
  std::map<std::string, HostTensor> hf = HfTensors();
  hf["h.0.attn.rotary.inv_freq"] = Filled("x", {4});
  EXPECT_THAT(Message(ImportHfGpt2(WriteHf(hf), kHeads).status()),
              AllOf(HasSubstr("'h.0.attn.rotary.inv_freq'"), HasSubstr("not part of GPT-2")));
  EXPECT_THAT(Message(ImportHfGpt2(WriteHf(HfTensors()), 3).status()),
              HasSubstr("n_head 3 does not divide n_embd 8"));
}

TEST(Gpt2CheckpointTest, OurFormatRoundTrips) {
  const std::map<std::string, HostTensor> hf = HfTensors();
  absl::StatusOr<Gpt2Weights> imported = ImportHfGpt2(WriteHf(hf), kHeads);
  ASSERT_TRUE(imported.ok()) << imported.status();
  const std::string path = TempDir() + "/ours.safetensors";
  ASSERT_TRUE(WriteGpt2Checkpoint(path, *imported).ok());
  absl::StatusOr<Gpt2Weights> read = ReadGpt2Checkpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->config, imported->config);
  ASSERT_EQ(read->tensors.size(), imported->tensors.size());
  for (const auto& [name, tensor] : imported->tensors) {
    EXPECT_EQ(read->tensors.at(name).shape, tensor.shape) << name;
    EXPECT_EQ(read->tensors.at(name).values, tensor.values) << name;
  }
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok());
  EXPECT_EQ(reader->metadata().at("format"), "shardline");
  EXPECT_EQ(reader->metadata().at("n_head"), "2");
}

TEST(Gpt2CheckpointTest, ErrorsNameTheTensorOrKey) {
  Gpt2Weights weights;
  weights.config = {
      .layers = 1, .heads = 2, .d_model = 4, .d_ff = 16, .vocab = 5, .max_seq_len = 3};
  for (const model::TensorRow& spec : model::ModelRows(weights.config)) {
    weights.tensors[spec.name] = Filled(spec.name, spec.shape);
  }
  const std::string dir = TempDir();
  Gpt2Weights missing = weights;
  missing.tensors.erase("h.0.fc_proj.b");
  EXPECT_THAT(Message(WriteGpt2Checkpoint(dir + "/a.safetensors", missing)),
              HasSubstr("'h.0.fc_proj.b' is missing"));
  Gpt2Weights wrong = weights;
  wrong.tensors["h.0.qkv.w"] = Filled("x", {4, 12});
  EXPECT_THAT(Message(WriteGpt2Checkpoint(dir + "/a.safetensors", wrong)),
              AllOf(HasSubstr("'h.0.qkv.w' has shape [4, 12]"), HasSubstr("expected [12, 4]")));
  // A Hugging Face file is not our format, and the error says where to go.
  const std::string hf_path = WriteHf(HfTensors());
  EXPECT_THAT(Message(ReadGpt2Checkpoint(hf_path).status()),
              AllOf(HasSubstr(hf_path), HasSubstr("ImportHfGpt2")));
}

TEST(Gpt2CheckpointTest, UntiedHeadsRoundTripAndMetadataSaysSo) {
  Gpt2Weights weights;
  weights.config = {.layers = 1,
                    .heads = 2,
                    .d_model = 4,
                    .d_ff = 16,
                    .vocab = 5,
                    .max_seq_len = 3,
                    .tied_embeddings = false};
  const std::vector<model::TensorRow> specs = model::ModelRows(weights.config);
  ASSERT_EQ(specs.back().name, "lm_head.w");
  EXPECT_EQ(specs.back().shape, (std::vector<int64_t>{5, 4}));
  for (const model::TensorRow& spec : specs) {
    weights.tensors[spec.name] = Filled(spec.name, spec.shape);
    // Only the fused QKV is viewed differently in sharded checkpoints.
    if (spec.name == "h.0.qkv.w") {
      EXPECT_EQ(spec.sharded_shape, (std::vector<int64_t>{3, 4, 4}));
    } else if (spec.name == "h.0.qkv.b") {
      EXPECT_EQ(spec.sharded_shape, (std::vector<int64_t>{3, 4}));
    } else {
      EXPECT_EQ(spec.sharded_shape, spec.shape) << spec.name;
    }
  }
  const std::string path = TempDir() + "/untied.safetensors";
  ASSERT_TRUE(WriteGpt2Checkpoint(path, weights).ok());
  absl::StatusOr<Gpt2Weights> read = ReadGpt2Checkpoint(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->config, weights.config);
  EXPECT_EQ(read->tensors.at("lm_head.w").values, weights.tensors.at("lm_head.w").values);
  EXPECT_EQ(ModelMetadata(weights.config).at("tied_embeddings"), "false");
}

TEST(Gpt2CheckpointTest, ConfigFromMetadata) {
  const model::ModelConfig config = {
      .layers = 2, .heads = 2, .d_model = 8, .d_ff = 32, .vocab = 7, .max_seq_len = 4};
  std::map<std::string, std::string> metadata = ModelMetadata(config);
  absl::StatusOr<model::ModelConfig> parsed = ModelConfigFromMetadata(metadata, "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(*parsed, config);
  // Files from before untied heads have no key, and were tied.
  metadata.erase("tied_embeddings");
  parsed = ModelConfigFromMetadata(metadata, "m.json");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_TRUE(parsed->tied_embeddings);
  metadata["tied_embeddings"] = "yes";
  EXPECT_THAT(Message(ModelConfigFromMetadata(metadata, "m.json").status()),
              AllOf(HasSubstr("m.json"), HasSubstr("'tied_embeddings' is 'yes'")));
  metadata = ModelMetadata(config);
  metadata.erase("n_head");
  EXPECT_THAT(Message(ModelConfigFromMetadata(metadata, "m.json").status()),
              AllOf(HasSubstr("m.json"), HasSubstr("'n_head' is missing")));
}

}  // namespace
}  // namespace shardline::checkpoint
