// Hugging Face Llama folders (checkpoint/hf_llama.h) through training::CheckpointSource, the one
// reader every user of a checkpoint goes through: folders that tests/unit/
// checkpoint_hf_llama_reference.py writes with PyTorch (one file and a sharded index; F32, BF16
// and F16; config.json in transformers 4's and 5's forms; grouped-query and fused attention) read
// back box by box exactly as PyTorch converts them, with the logits of a PyTorch Llama; the export
// (checkpoint/hf_llama_export.h) read back bit-exact; every kind of bad folder refused with the
// file and the key or tensor named, before any rank would load; a tensor-parallel rank reading
// only its boxes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/hf_llama.h"
#include "checkpoint/hf_llama_export.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "model/tensor_table.h"
#include "nlohmann/json.hpp"
#include "placement/train_spec.h"
#include "tests/support/box_reference.h"
#include "tests/support/whole_forward.h"
#include "worker/model/model_params.h"
#include "worker/model/paged_inference.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/trainer.h"

namespace shardline::training {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::json;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr char kPython[] = "/usr/bin/python3";
// The engine computes in f32, the reference in f64: |ours − torch| <= this × max |torch|.
constexpr double kLogitRtol = 2e-5;
const std::vector<int32_t> kTokens = {1, 5, 7, 3, 39, 0, 12, 21, 8, 30};

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}
std::string Script() { return SourceDir() + "/tests/unit/checkpoint_hf_llama_reference.py"; }

fs::path TempRoot() {
  return fs::temp_directory_path() / ("shardline-hf-llama-" + std::to_string(getpid()));
}
class RemoveTempRoot : public ::testing::Environment {
 public:
  void TearDown() override { fs::remove_all(TempRoot()); }
};
::testing::Environment* const kRemoveTempRoot =
    ::testing::AddGlobalTestEnvironment(new RemoveTempRoot);

std::string TempDir(const std::string& name) {
  const fs::path dir = TempRoot() / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir.string();
}

std::string Message(const absl::Status& status) { return std::string(status.message()); }

Json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in);
}
void WriteJson(const std::string& path, const Json& json) { std::ofstream(path) << json.dump(2); }

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  const auto bytes = static_cast<size_t>(in.tellg());
  std::vector<float> values(bytes / sizeof(float));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
  return values;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// config.json of LlamaForCausalLM with 2 layers, hidden 32, MLP 48, vocab 40, transformers 4's
// rope keys (rope_theta 10000, no scaling); each case changes what it tests.
Json BaseConfig() {
  return Json{{"architectures", {"LlamaForCausalLM"}},
              {"model_type", "llama"},
              {"hidden_size", 32},
              {"intermediate_size", 48},
              {"num_hidden_layers", 2},
              {"num_attention_heads", 4},
              {"num_key_value_heads", 2},
              {"vocab_size", 40},
              {"max_position_embeddings", 64},
              {"rms_norm_eps", 1e-5},
              {"hidden_act", "silu"},
              {"attention_bias", false},
              {"mlp_bias", false},
              {"rope_theta", 10000.0},
              {"rope_scaling", nullptr},
              {"tie_word_embeddings", false},
              {"torch_dtype", "float32"},
              {"transformers_version", "4.44.2"}};
}

// Llama 3's rescaling, under transformers' names (a short original context so that it matters
// within the 64 positions).
Json Llama3Scaling() {
  return Json{{"rope_type", "llama3"},
              {"factor", 8.0},
              {"low_freq_factor", 1.0},
              {"high_freq_factor", 4.0},
              {"original_max_position_embeddings", 16}};
}

// The same config in transformers 5's form: rope_parameters instead of rope_theta/rope_scaling.
Json Transformers5(Json config, Json rope_parameters) {
  config.erase("rope_theta");
  config.erase("rope_scaling");
  config.erase("torch_dtype");
  config["dtype"] = "bfloat16";
  config["transformers_version"] = "5.0.0";
  config["rope_parameters"] = std::move(rope_parameters);
  return config;
}

struct Case {
  std::string name;
  Json spec;                  // the script's SPEC
  model::ModelConfig config;  // what it must read as, written out independently
  bool index = false;         // several files and model.safetensors.index.json
};

// gtest names a failing case by this, not by its bytes.
void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

model::ModelConfig LlamaSizes(int64_t kv_heads, bool tied) {
  model::ModelConfig c = model::ModelConfig::Llama({.layers = 2,
                                                    .heads = 4,
                                                    .kv_heads = kv_heads,
                                                    .d_model = 32,
                                                    .d_ff = 48,
                                                    .vocab = 40,
                                                    .max_seq_len = 64});
  c.tied_embeddings = tied;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {  // F32, one file, transformers 4 with Llama 3 scaling, grouped-query attention, untied.
    Json config = BaseConfig();
    config["rope_theta"] = 500000.0;
    config["rope_scaling"] = Llama3Scaling();
    model::ModelConfig c = LlamaSizes(2, false);
    c.rope_theta = 500000.0;
    c.rope_scaling = {.factor = 8.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_positions = 16};
    cases.push_back({"F32_OneFile_Transformers4_Llama3Rope_GroupedQuery",
                     Json{{"config", config}, {"dtype", "F32"}, {"files", 0}, {"seed", 1}}, c});
  }
  {  // BF16, one file, transformers 5 default rope, fused q/k/v (kv_heads absent), tied with the
     // head's copy still stored.
    Json config = Transformers5(BaseConfig(), {{"rope_type", "default"}, {"rope_theta", 20000.0}});
    config.erase("num_key_value_heads");
    config["tie_word_embeddings"] = true;
    model::ModelConfig c = LlamaSizes(4, true);
    c.rope_theta = 20000.0;
    cases.push_back(
        {"BF16_OneFile_Transformers5_FusedQkv_TiedWithHeadStored",
         Json{{"config", config}, {"dtype", "BF16"}, {"files", 0}, {"seed", 2}, {"lm_head", true}},
         c});
  }
  {  // F16 in three files, transformers 4 without scaling, fused q/k/v, untied.
    Json config = BaseConfig();
    config["num_key_value_heads"] = 4;
    config["rms_norm_eps"] = 1e-6;
    model::ModelConfig c = LlamaSizes(4, false);
    c.norm_eps = 1e-6;
    cases.push_back({"F16_ThreeFiles_Transformers4_FusedQkv",
                     Json{{"config", config}, {"dtype", "F16"}, {"files", 3}, {"seed", 3}}, c,
                     true});
  }
  {  // BF16 in two files, transformers 5 with Llama 3 scaling, one key/value head of head_dim 12
     // (not hidden / heads), tied without a stored head.
    Json rope = Llama3Scaling();
    rope["rope_theta"] = 500000.0;
    Json config = Transformers5(BaseConfig(), rope);
    config["num_key_value_heads"] = 1;
    config["head_dim"] = 12;
    config["tie_word_embeddings"] = true;
    model::ModelConfig c = LlamaSizes(1, true);
    c.head_dim = 12;
    c.rope_theta = 500000.0;
    c.rope_scaling = {.factor = 8.0,
                      .low_freq_factor = 1.0,
                      .high_freq_factor = 4.0,
                      .original_max_positions = 16};
    cases.push_back({"BF16_TwoFiles_Transformers5_Llama3Rope_OneKvHead_HeadDim12",
                     Json{{"config", config}, {"dtype", "BF16"}, {"files", 2}, {"seed", 4}}, c,
                     true});
  }
  return cases;
}

// A folder the script wrote, and what PyTorch says of it.
struct Folder {
  std::string dir;
  std::string expected;
  // Every stored tensor as torch converts it to f32, by its Hugging Face name.
  std::map<std::string, checkpoint::HostTensor> tensors;
  std::vector<float> logits;  // (T, V) of kTokens
};

bool TorchAvailable(std::string* why) {
  if (access(kPython, X_OK) != 0) {
    *why = std::string(kPython) + " is not installed";
    return false;
  }
  if (std::system((std::string(kPython) + " -c 'import torch, numpy' >/dev/null 2>&1").c_str())) {
    *why = std::string(kPython) + " cannot import torch and numpy (Debian: python3-torch)";
    return false;
  }
  return true;
}

// Writes `spec` (with kTokens) as a folder named `name`; nullopt (the test skips) without torch.
std::optional<Folder> WriteFolder(const std::string& name, Json spec) {
  std::string why;
  if (!TorchAvailable(&why)) return std::nullopt;
  Folder folder;
  const std::string root = TempDir(name);
  fs::create_directories(root);
  folder.dir = root + "/model";
  folder.expected = root + "/expected";
  spec["tokens"] = kTokens;
  WriteJson(root + "/spec.json", spec);
  const std::string command = absl::StrCat(kPython, " ", Script(), " write ", root, "/spec.json ",
                                           folder.dir, " ", folder.expected);
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  const Json layout = ReadJson(folder.expected + "/tensors.json");
  const std::vector<float> values = ReadFloats(folder.expected + "/values.bin");
  for (const auto& [hf_name, entry] : layout.items()) {
    checkpoint::HostTensor tensor;
    tensor.shape = entry["shape"].get<std::vector<int64_t>>();
    const int64_t offset = entry["offset"].get<int64_t>();
    tensor.values.assign(values.begin() + offset,
                         values.begin() + offset + *checkpoint::NumElements(tensor.shape));
    folder.tensors.emplace(hf_name, std::move(tensor));
  }
  folder.logits = ReadFloats(folder.expected + "/logits.bin");
  return folder;
}

// Our tensor `name` (whole, in its box view) assembled from the stored ones, by the mapping of
// hf_llama.h written out here again: a fused qkv.w is q_proj, k_proj, v_proj back to back.
std::vector<float> ExpectedTensor(const Folder& folder, const std::string& name) {
  std::string hf;
  const auto layer = [&](const std::string& suffix) {
    const size_t dot = name.find('.', 2);
    return absl::StrCat("model.layers.", name.substr(2, dot - 2), ".", suffix);
  };
  const std::string_view tail = std::string_view(name).substr(name.rfind('.', name.size() - 3) + 1);
  if (name == "wte") {
    hf = "model.embed_tokens.weight";
  } else if (name == "lnf.w") {
    hf = "model.norm.weight";
  } else if (name == "lm_head.w") {
    hf = "lm_head.weight";
  } else if (tail == "qkv.w") {
    std::vector<float> out;
    for (const char* part : {"q", "k", "v"}) {
      const auto& t = folder.tensors.at(layer(absl::StrCat("self_attn.", part, "_proj.weight")));
      out.insert(out.end(), t.values.begin(), t.values.end());
    }
    return out;
  } else {
    const std::map<std::string, std::string> block = {
        {"ln1.w", "input_layernorm.weight"},        {"q.w", "self_attn.q_proj.weight"},
        {"k.w", "self_attn.k_proj.weight"},         {"v.w", "self_attn.v_proj.weight"},
        {"attn_proj.w", "self_attn.o_proj.weight"}, {"ln2.w", "post_attention_layernorm.weight"},
        {"gate.w", "mlp.gate_proj.weight"},         {"up.w", "mlp.up_proj.weight"},
        {"down.w", "mlp.down_proj.weight"}};
    hf = layer(block.at(std::string(tail)));
  }
  return folder.tensors.at(hf).values;
}

std::vector<float> EngineLogits(const model::ModelParams& params) {
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  absl::StatusOr<std::vector<float>> logits = shardline::testing::WholeForwardLogits(
      params, backend, kTokens, 1, static_cast<int>(kTokens.size()));
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>();
}

// max |a − b| over max |b|.
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0, scale = 1e-30;
  for (size_t i = 0; i < b.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
  }
  return worst / scale;
}

std::string WeightsPath(const Case& c, const std::string& dir) {
  return dir + (c.index ? "/model.safetensors.index.json" : "/model.safetensors");
}

class HfLlamaFolders : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    folder_ = WriteFolder(GetParam().name, GetParam().spec);
    if (!folder_) GTEST_SKIP() << "PyTorch is not installed for " << kPython;
  }
  std::optional<Folder> folder_;
};

TEST_P(HfLlamaFolders, EveryPathFormOpensTheFolderWithItsConfig) {
  const Case& c = GetParam();
  for (const std::string& path : {folder_->dir, folder_->dir + "/", folder_->dir + "/config.json",
                                  WeightsPath(c, folder_->dir)}) {
    SCOPED_TRACE(path);
    absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(path);
    ASSERT_TRUE(source.ok()) << source.status();
    EXPECT_EQ(source->kind(), CheckpointKind::kHuggingFaceLlama);
    EXPECT_EQ(source->config(), c.config)
        << source->config().DebugString() << " vs " << c.config.DebugString();
    EXPECT_EQ(source->config().rope_scaling, c.config.rope_scaling);
    EXPECT_EQ(source->config().norm_eps, c.config.norm_eps);
    EXPECT_EQ(source->path(), WeightsPath(c, folder_->dir));
    absl::StatusOr<model::ModelConfig> header_config = checkpoint::ReadCheckpointConfig(path);
    ASSERT_TRUE(header_config.ok()) << header_config.status();
    EXPECT_EQ(*header_config, c.config);
  }
  EXPECT_EQ(TokenizerSpecFor("", WeightsPath(c, folder_->dir)), "bytes");  // no tokenizer files
}

TEST_P(HfLlamaFolders, EveryBoxIsWhatPyTorchStoredConvertedExactly) {
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(folder_->dir);
  ASSERT_TRUE(source.ok()) << source.status();
  const model::ModelConfig& config = source->config();
  for (const model::TensorRow& row : model::ModelRows(config)) {
    SCOPED_TRACE(row.name);
    absl::StatusOr<std::vector<int64_t>> shape = source->BoxShape(row.name);
    ASSERT_TRUE(shape.ok()) << shape.status();
    EXPECT_EQ(*shape, row.sharded_shape);
    const std::vector<float> expected = ExpectedTensor(*folder_, row.name);
    absl::StatusOr<std::vector<float>> whole =
        ReadCheckpointBox(*source, row.name, std::vector<int64_t>(shape->size(), 0), *shape);
    ASSERT_TRUE(whole.ok()) << whole.status();
    EXPECT_TRUE(BitEqual(*whole, expected));
    // Every tensor-parallel rank's box at tp 2 and 4, and a box cut in every dimension.
    std::vector<model::TensorBox> boxes;
    for (int tp : {2, 4}) {
      for (int r = 0; r < tp; ++r) boxes.push_back(model::TpBox(row, config, tp, r));
    }
    model::TensorBox inner{std::vector<int64_t>(shape->size()), *shape};
    for (size_t d = 0; d < shape->size(); ++d) {
      inner.offsets[d] = (*shape)[d] / 3;
      inner.shape[d] = std::max<int64_t>(1, (*shape)[d] / 2);
    }
    boxes.push_back(inner);
    for (const model::TensorBox& box : boxes) {
      absl::StatusOr<std::vector<float>> part =
          ReadCheckpointBox(*source, row.name, box.offsets, box.shape);
      ASSERT_TRUE(part.ok()) << part.status();
      EXPECT_TRUE(BitEqual(
          *part, shardline::testing::ReferenceBox(expected, *shape, box.offsets, box.shape)))
          << "box at " << checkpoint::ShapeString(box.offsets) << " of shape "
          << checkpoint::ShapeString(box.shape);
    }
  }
  // A box outside the tensor is refused, naming it.
  const std::vector<int64_t> offsets = {0}, too_long = {33};
  absl::StatusOr<std::vector<float>> outside =
      ReadCheckpointBox(*source, "lnf.w", offsets, too_long);
  EXPECT_THAT(Message(outside.status()), AllOf(HasSubstr("lnf.w"), HasSubstr(folder_->dir)));
  // So is a tensor the model does not have.
  EXPECT_THAT(Message(source->BoxShape("wpe").status()), HasSubstr("'wpe'"));
}

TEST_P(HfLlamaFolders, EngineLogitsAreAPyTorchLlamas) {
  absl::StatusOr<model::ModelParams> params = LoadModel(folder_->dir);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_LE(RelativeError(EngineLogits(*params), folder_->logits), kLogitRtol);
}

TEST_P(HfLlamaFolders, ExportedFolderLoadsBackBitExactWithTheSameLogits) {
  const Case& c = GetParam();
  absl::StatusOr<model::ModelParams> params = LoadModel(folder_->dir);
  ASSERT_TRUE(params.ok()) << params.status();
  checkpoint::Gpt2Weights weights;
  weights.config = params->config();
  const std::span<const float> values = std::as_const(*params).values();
  for (const auto& info : params->layout().tensors()) {
    weights.tensors[info.name] = checkpoint::HostTensor{
        info.shape, std::vector<float>(values.begin() + info.offset,
                                       values.begin() + info.offset + info.numel)};
  }
  const std::string out = TempDir(c.name + "_export");
  ASSERT_TRUE(checkpoint::ExportHfLlama(weights, out).ok());

  // Read back through every loader: the same config, the same bits, the same logits.
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(out);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->kind(), CheckpointKind::kHuggingFaceLlama);
  EXPECT_EQ(source->config(), c.config);
  absl::StatusOr<model::ModelParams> back = LoadModel(out);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(std::equal(back->values().begin(), back->values().end(),
                         std::as_const(*params).values().begin(),
                         [](float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }));
  const std::vector<float> logits = EngineLogits(*params);
  EXPECT_TRUE(BitEqual(EngineLogits(*back), logits));

  // What transformers reads: save_pretrained's names, F32, {"format": "pt"}, and a config.json
  // that states every setting.
  absl::StatusOr<checkpoint::SafetensorsReader> file =
      checkpoint::SafetensorsReader::Open(out + "/model.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ(file->metadata().at("format"), "pt");
  std::set<std::string> names;
  for (const auto& [name, info] : file->tensors()) {
    names.insert(name);
    EXPECT_EQ(info.dtype, checkpoint::SafetensorsDType::kF32) << name;
    EXPECT_EQ(info.shape, folder_->tensors.at(name).shape) << name;
  }
  std::set<std::string> stored;
  for (const auto& [name, tensor] : folder_->tensors) stored.insert(name);
  if (c.config.tied_embeddings) stored.erase("lm_head.weight");  // a tied head is not stored
  EXPECT_EQ(names, stored);
  const Json config = ReadJson(out + "/config.json");
  EXPECT_EQ(config["architectures"], Json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["model_type"], "llama");
  EXPECT_EQ(config["torch_dtype"], "float32");
  EXPECT_EQ(config["hidden_act"], "silu");
  EXPECT_EQ(config["num_key_value_heads"], c.config.kv());
  EXPECT_EQ(config["head_dim"], c.config.head_size());
  EXPECT_EQ(config["tie_word_embeddings"], c.config.tied_embeddings);
  EXPECT_EQ(config["rope_theta"], c.config.rope_theta);
  EXPECT_EQ(config["rms_norm_eps"], c.config.norm_eps);
  if (c.config.rope_scaling.enabled()) {
    EXPECT_EQ(config["rope_scaling"]["rope_type"], "llama3");
    EXPECT_EQ(config["rope_scaling"]["original_max_position_embeddings"], 16);
  } else {
    EXPECT_TRUE(config["rope_scaling"].is_null());
  }

  // And this script's own reader of the exported folder computes the same logits.
  const std::string tokens = out + "_tokens.json";
  WriteJson(tokens, Json(kTokens));
  const std::string torch_logits = out + "_logits.bin";
  const std::string command =
      absl::StrCat(kPython, " ", Script(), " logits ", out, " ", tokens, " ", torch_logits);
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  EXPECT_LE(RelativeError(logits, ReadFloats(torch_logits)), kLogitRtol);
}

// A tensor-parallel rank loads its shard (ShardWeights::Load, what serving and the trainer use)
// reading only its boxes: the bytes converted are exactly those of TpBox's boxes, and each box is
// that part of the tensor.
TEST_P(HfLlamaFolders, ATensorParallelRankReadsOnlyItsBoxes) {
  const Case& c = GetParam();
  const size_t element = c.spec["dtype"] == "F32" ? 4 : 2;
  uint64_t stored_bytes = 0;
  for (const auto& [name, tensor] : folder_->tensors)
    stored_bytes += tensor.values.size() * element;
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  for (int rank = 0; rank < 2; ++rank) {
    SCOPED_TRACE(absl::StrCat("tp rank ", rank, " of 2"));
    absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(folder_->dir);
    ASSERT_TRUE(source.ok()) << source.status();
    ASSERT_NE(source->hf_llama(), nullptr);
    EXPECT_EQ(source->hf_llama()->bytes_read(), 0u);  // opening reads headers only
    std::map<std::string, model::TensorBox> read;
    absl::StatusOr<std::unique_ptr<model::ShardWeights>> shard = model::ShardWeights::Load(
        source->config(), 2, rank,
        [&](const std::string& name, const std::vector<int64_t>& offsets,
            const std::vector<int64_t>& shape) -> absl::StatusOr<std::vector<float>> {
          read[name] = model::TensorBox{offsets, shape};
          ASSIGN_OR_RETURN(std::vector<float> values,
                           ReadCheckpointBox(*source, name, offsets, shape));
          const std::vector<float> whole = ExpectedTensor(*folder_, name);
          EXPECT_TRUE(BitEqual(values, shardline::testing::ReferenceBox(
                                           whole, *source->BoxShape(name), offsets, shape)))
              << name;
          return values;
        },
        backend);
    ASSERT_TRUE(shard.ok()) << shard.status();
    uint64_t expected_bytes = 0;
    for (const model::TensorRow& row : model::ModelRows(source->config())) {
      const model::TensorBox box = model::TpBox(row, source->config(), 2, rank);
      ASSERT_TRUE(read.contains(row.name)) << row.name;
      EXPECT_EQ(read[row.name].offsets, box.offsets) << row.name;
      EXPECT_EQ(read[row.name].shape, box.shape) << row.name;
      expected_bytes += static_cast<uint64_t>(box.numel()) * element;
    }
    EXPECT_EQ(read.size(), model::ModelRows(source->config()).size());
    EXPECT_EQ(source->hf_llama()->bytes_read(), expected_bytes);
    EXPECT_LT(expected_bytes, stored_bytes * 3 / 4);  // well short of the whole folder
  }
}

INSTANTIATE_TEST_SUITE_P(Forms, HfLlamaFolders, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// ---------------------------------------------------------------------------------------------
// Bad folders: each refused by CheckpointSource::Open (generate, serve, init_from) and by
// ReadCheckpointConfig (the coordinator sizing a serve job) with the file and what is wrong.

class BadHfLlamaFolders : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    Json spec{{"config", BaseConfig()}, {"dtype", "F32"}, {"files", 0}, {"seed", 5}};
    good_ = new std::optional<Folder>(WriteFolder("bad_base", spec));
  }
  static void TearDownTestSuite() { delete good_; }
  void SetUp() override {
    if (!*good_) GTEST_SKIP() << "PyTorch is not installed for " << kPython;
  }

  // A copy of the good folder, named for the test.
  std::string Copy() {
    const std::string dir =
        TempDir(::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::copy((*good_)->dir, dir, fs::copy_options::recursive);
    return dir;
  }
  std::string WithConfig(const Json& config) {
    const std::string dir = Copy();
    WriteJson(dir + "/config.json", config);
    return dir;
  }
  // The good folder's model.safetensors rewritten by `edit`, which may drop, add or replace
  // tensors (kept alive in `keep`).
  std::string WithTensors(const std::function<void(std::map<std::string, checkpoint::TensorView>&,
                                                   std::vector<std::vector<float>>& keep)>& edit) {
    const std::string dir = Copy();
    absl::StatusOr<checkpoint::SafetensorsReader> reader =
        checkpoint::SafetensorsReader::Open((*good_)->dir + "/model.safetensors");
    EXPECT_TRUE(reader.ok()) << reader.status();
    std::map<std::string, checkpoint::TensorView> views;
    for (const auto& [name, info] : reader->tensors()) {
      views[name] = checkpoint::TensorView{name, info.dtype, info.shape, reader->Data(info)};
    }
    std::vector<std::vector<float>> keep;
    keep.reserve(8);
    edit(views, keep);
    checkpoint::SafetensorsWriter writer(dir + "/model.safetensors");
    writer.SetMetadata("format", "pt");
    for (auto& [name, view] : views) EXPECT_TRUE(writer.Add(view).ok()) << name;
    EXPECT_TRUE(writer.Finish().ok());
    return dir;
  }

  // The error both readers give (the same one).
  static std::string Error(const std::string& dir) {
    absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(dir);
    EXPECT_FALSE(source.ok()) << dir;
    absl::StatusOr<model::ModelConfig> config = checkpoint::ReadCheckpointConfig(dir);
    EXPECT_FALSE(config.ok()) << dir;
    if (source.ok() || config.ok()) return "";
    EXPECT_EQ(source.status().message(), config.status().message());
    return Message(source.status());
  }

  static std::optional<Folder>* good_;
};
std::optional<Folder>* BadHfLlamaFolders::good_ = nullptr;

TEST_F(BadHfLlamaFolders, TheGoodFolderOpens) {
  EXPECT_TRUE(CheckpointSource::Open((*good_)->dir).ok());
}

TEST_F(BadHfLlamaFolders, AnotherArchitectureIsNamed) {
  Json config = BaseConfig();
  config["architectures"] = {"Qwen2ForCausalLM"};
  const std::string dir = WithConfig(config);
  EXPECT_THAT(Error(dir), AllOf(HasSubstr(dir + "/config.json"), HasSubstr("'architectures'"),
                                HasSubstr("Qwen2ForCausalLM")));
  config["architectures"] = {"GPT2LMHeadModel"};  // GPT-2 in a Llama-named folder
  EXPECT_THAT(Error(WithConfig(config)),
              AllOf(HasSubstr("'architectures'"), HasSubstr("GPT2LMHeadModel")));
}

TEST_F(BadHfLlamaFolders, MistralOnlyWithoutASlidingWindow) {
  Json config = BaseConfig();
  config["architectures"] = {"MistralForCausalLM"};
  config["model_type"] = "mistral";
  config["sliding_window"] = 4096;
  EXPECT_THAT(Error(WithConfig(config)),
              AllOf(HasSubstr("config.json"), HasSubstr("'sliding_window'"), HasSubstr("4096")));
  config.erase("sliding_window");  // MistralConfig's default is 4096
  EXPECT_THAT(Error(WithConfig(config)), HasSubstr("'sliding_window' is absent"));
  config["sliding_window"] = nullptr;
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(WithConfig(config));
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->config(), CheckpointSource::Open((*good_)->dir)->config());
}

TEST_F(BadHfLlamaFolders, HeadsNotDivisibleByKeyValueHeadsIsNamed) {
  Json config = BaseConfig();
  config["num_key_value_heads"] = 3;
  EXPECT_THAT(Error(WithConfig(config)),
              AllOf(HasSubstr("config.json"), HasSubstr("'num_key_value_heads'"),
                    HasSubstr("num_attention_heads 4")));
}

TEST_F(BadHfLlamaFolders, RopeTypesWeDoNotComputeAreNamedInEitherForm) {
  Json config = BaseConfig();
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  EXPECT_THAT(
      Error(WithConfig(config)),
      AllOf(HasSubstr("config.json"), HasSubstr("'rope_scaling.rope_type'"), HasSubstr("yarn")));
  config["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};  // before transformers 4.43
  EXPECT_THAT(Error(WithConfig(config)),
              AllOf(HasSubstr("'rope_scaling.type'"), HasSubstr("linear")));
  config =
      Transformers5(BaseConfig(), {{"rope_type", "dynamic"}, {"rope_theta", 1e4}, {"factor", 2.0}});
  EXPECT_THAT(Error(WithConfig(config)),
              AllOf(HasSubstr("'rope_parameters.rope_type'"), HasSubstr("dynamic")));
  config = BaseConfig();
  config["rope_scaling"] = Llama3Scaling();
  config["rope_scaling"].erase("low_freq_factor");
  EXPECT_THAT(Error(WithConfig(config)), HasSubstr("'rope_scaling.low_freq_factor' is missing"));
}

TEST_F(BadHfLlamaFolders, SettingsWeDoNotComputeAreNamed) {
  for (const auto& [key, value] : {std::pair<std::string, Json>{"hidden_act", "gelu"},
                                   {"attention_bias", true},
                                   {"mlp_bias", true},
                                   {"hidden_size", "32"},
                                   {"num_hidden_layers", 0}}) {
    Json config = BaseConfig();
    config[key] = value;
    EXPECT_THAT(Error(WithConfig(config)),
                AllOf(HasSubstr("config.json"), HasSubstr("'" + key + "'")))
        << key;
  }
  Json config = BaseConfig();
  config.erase("vocab_size");
  EXPECT_THAT(Error(WithConfig(config)), HasSubstr("'vocab_size' is missing"));
  const std::string dir = Copy();
  std::ofstream(dir + "/config.json") << "{ not json";
  EXPECT_THAT(Error(dir), AllOf(HasSubstr(dir + "/config.json"), HasSubstr("not JSON")));
  fs::remove(dir + "/config.json");
  EXPECT_THAT(Error(dir), HasSubstr("config.json"));
}

TEST_F(BadHfLlamaFolders, AMissingTensorIsNamed) {
  const std::string dir =
      WithTensors([](auto& views, auto&) { views.erase("model.layers.1.mlp.up_proj.weight"); });
  EXPECT_THAT(Error(dir),
              AllOf(HasSubstr(dir), HasSubstr("'model.layers.1.mlp.up_proj.weight' is missing")));
  // An untied config needs lm_head.weight.
  const std::string no_head =
      WithTensors([](auto& views, auto&) { views.erase("lm_head.weight"); });
  EXPECT_THAT(Error(no_head), AllOf(HasSubstr("'lm_head.weight' is missing"),
                                    HasSubstr("tie_word_embeddings false")));
}

TEST_F(BadHfLlamaFolders, ATensorOfTheWrongShapeIsNamedWithItsFile) {
  const std::string dir = WithTensors([](auto& views, auto&) {
    checkpoint::TensorView& k = views.at("model.layers.0.self_attn.k_proj.weight");
    k.shape = {k.shape[1], k.shape[0]};  // (C, kv·hd): stored transposed
  });
  EXPECT_THAT(Error(dir),
              AllOf(HasSubstr(dir + "/model.safetensors"),
                    HasSubstr("'model.layers.0.self_attn.k_proj.weight' has shape [32, 16]"),
                    HasSubstr("expected [16, 32]")));
}

TEST_F(BadHfLlamaFolders, ATensorOfAnIntegerDtypeIsNamed) {
  const std::string dir = WithTensors([](auto& views, auto&) {
    views.at("model.norm.weight").dtype = checkpoint::SafetensorsDType::kI32;
  });
  EXPECT_THAT(Error(dir), AllOf(HasSubstr("'model.norm.weight'"), HasSubstr("I32")));
}

TEST_F(BadHfLlamaFolders, ATensorOfAnotherModelIsNamed) {
  const std::string dir = WithTensors([](auto& views, auto& keep) {
    keep.emplace_back(32, 1.0f);
    views["model.layers.2.input_layernorm.weight"] =
        checkpoint::TensorView{"model.layers.2.input_layernorm.weight",
                               checkpoint::SafetensorsDType::kF32,
                               {32},
                               std::as_bytes(std::span<const float>(keep.back()))};
    // A buffer older exports saved is not a weight, and is let pass.
    keep.emplace_back(4, 1.0f);
    views["model.layers.0.self_attn.rotary_emb.inv_freq"] =
        checkpoint::TensorView{"model.layers.0.self_attn.rotary_emb.inv_freq",
                               checkpoint::SafetensorsDType::kF32,
                               {4},
                               std::as_bytes(std::span<const float>(keep.back()))};
  });
  EXPECT_THAT(Error(dir), AllOf(HasSubstr("'model.layers.2.input_layernorm.weight'"),
                                HasSubstr("is not part of the model")));
}

TEST_F(BadHfLlamaFolders, AnIndexThatDisagreesWithItsFilesIsNamed) {
  const std::string dir = Copy();
  fs::rename(dir + "/model.safetensors", dir + "/model-00001-of-00001.safetensors");
  Json map;
  for (const auto& [name, tensor] : (*good_)->tensors)
    map[name] = "model-00001-of-00001.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", map}});
  ASSERT_TRUE(CheckpointSource::Open(dir).ok());  // the index of one file

  Json wrong = map;
  wrong["model.norm.weight"] = "model-00002-of-00002.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", wrong}});
  EXPECT_THAT(Error(dir),
              AllOf(HasSubstr("model.safetensors.index.json"), HasSubstr("'model.norm.weight'"),
                    HasSubstr("model-00002-of-00002.safetensors")));
  wrong = map;
  wrong["model.layers.7.mlp.up_proj.weight"] = "model-00001-of-00001.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", wrong}});
  EXPECT_THAT(Error(dir), AllOf(HasSubstr("'model.layers.7.mlp.up_proj.weight'"),
                                HasSubstr("does not hold it")));
  wrong = map;
  wrong["model.norm.weight"] = "../elsewhere.safetensors";
  WriteJson(dir + "/model.safetensors.index.json", {{"weight_map", wrong}});
  EXPECT_THAT(Error(dir), HasSubstr("expected the name of a file in the folder"));
  WriteJson(dir + "/model.safetensors.index.json", {{"metadata", Json::object()}});
  EXPECT_THAT(Error(dir), HasSubstr("'weight_map' is missing"));
}

TEST_F(BadHfLlamaFolders, ATensorParallelCutThatDoesNotFitIsRefusedBeforeLoading) {
  absl::StatusOr<model::ModelConfig> config = checkpoint::ReadCheckpointConfig((*good_)->dir);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_THAT(Message(model::CheckTensorParallel(*config, 3)),
              AllOf(HasSubstr("tp 3"), HasSubstr("heads 4")));
  EXPECT_THAT(Message(model::CheckTensorParallel(*config, 8)), HasSubstr("heads 4"));
  EXPECT_TRUE(model::CheckTensorParallel(*config, 4).ok());  // 2 kv heads, each on two ranks
}

// Fine-tuning starts from a Hugging Face folder: init_from takes it directly when the spec
// describes its model, and names the difference when it does not.
TEST(HfLlamaInitFrom, TrainingStartsFromTheFoldersParameters) {
  Json config = BaseConfig();
  config["vocab_size"] = 260;  // the byte corpus's tokens
  std::optional<Folder> folder = WriteFolder(
      "init_from", Json{{"config", config}, {"dtype", "F32"}, {"files", 2}, {"seed", 6}});
  if (!folder) GTEST_SKIP() << "PyTorch is not installed for " << kPython;
  const std::string run = TempDir("init_from_run");
  const std::string yaml = absl::StrCat(R"(name: finetune
model:
  arch: llama
  layers: 2
  heads: 4
  kv_heads: 2
  d_model: 32
  d_ff: 48
  vocab: 260
  max_seq_len: 64
  norm_eps: 1.0e-5
data:
  synthetic:
    seed: 7
    bytes: 16KiB
optimizer:
  lr: 1.0e-12
  weight_decay: 0
steps: 1
batch: 2
seq_len: 16
init_from: )",
                                        folder->dir, R"(
checkpoint:
  dir: )",
                                        run, "\n");
  absl::StatusOr<placement::TrainSpec> spec = placement::ParseTrainSpec(yaml, "finetune.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<TrainResult> result = Train(*spec, {});
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->start.initialized_from, folder->dir);
  ASSERT_EQ(result->losses.size(), 1u);
  // A learning rate of 1e-12 moves no f32 weight of this size: what was saved is what was read.
  absl::StatusOr<model::ModelParams> saved = LoadModel(result->checkpoint);
  ASSERT_TRUE(saved.ok()) << saved.status();
  absl::StatusOr<model::ModelParams> hf = LoadModel(folder->dir);
  ASSERT_TRUE(hf.ok()) << hf.status();
  ASSERT_EQ(saved->config(), hf->config());
  double worst = 0;
  for (size_t i = 0; i < hf->values().size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(saved->values()[i]) - hf->values()[i]));
  }
  EXPECT_LE(worst, 1e-7);

  // A spec that describes another model is refused, naming init_from.
  placement::TrainSpec other = *spec;
  other.model.norm_eps = 1e-6;
  other.checkpoint.dir = TempDir("init_from_other");
  absl::StatusOr<TrainResult> refused = Train(other, {});
  ASSERT_FALSE(refused.ok());
  EXPECT_THAT(Message(refused.status()), AllOf(HasSubstr("init_from"), HasSubstr(folder->dir)));
}

// GPT-2 files keep loading as they did, and are not taken for Llama folders.
TEST(HfLlamaDetection, Gpt2AndOurOwnFilesAreNotLlamaFolders) {
  model::ModelConfig gpt{
      .layers = 1, .heads = 2, .d_model = 8, .d_ff = 16, .vocab = 11, .max_seq_len = 8};
  absl::StatusOr<model::ModelParams> params = model::ModelParams::Gpt2Init(gpt, 3);
  ASSERT_TRUE(params.ok());
  const std::string dir = TempDir("ours");
  fs::create_directories(dir);
  // Ours, with a config.json beside it (as a folder a user made might have).
  ASSERT_TRUE(SaveModel(*params, dir + "/model.safetensors").ok());
  WriteJson(dir + "/config.json", BaseConfig());
  absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(dir);
  ASSERT_TRUE(source.ok()) << source.status();
  EXPECT_EQ(source->kind(), CheckpointKind::kSingleFile);
  EXPECT_EQ(source->config(), gpt);
}

}  // namespace
}  // namespace shardline::training
