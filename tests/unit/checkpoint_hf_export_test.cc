// ExportHfGpt2: a model written as a Hugging Face GPT-2 folder reads back through ImportHfGpt2 and
// LoadModel bit-exact (tied and untied heads), with the file layout and config.json that
// transformers' GPT2LMHeadModel.from_pretrained expects; and ImportHfGpt2's use of that
// config.json. (The check against the real transformers is bench/hf_export_check.py: transformers
// is a benchmark-only peer, not a test dependency.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "checkpoint/gpt2_hf_export.h"
#include "checkpoint/gpt2_hf_import.h"
#include "checkpoint/safetensors_reader.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/layernorm.h"
#include "nlohmann/json.hpp"
#include "tests/support/whole_forward.h"
#include "worker/model/model_params.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::checkpoint {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

fs::path TempRoot() {
  return fs::temp_directory_path() / ("shardline-hf-export-" + std::to_string(getpid()));
}

// This process's folders go when its tests are done.
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

model::ModelConfig SmallConfig(bool tied) {
  model::ModelConfig config;
  config.layers = 2;
  config.heads = 4;
  config.d_model = 32;
  config.d_ff = tied ? 0 : 48;  // the untied case also covers n_inner other than 4·n_embd
  config.vocab = 257;
  config.max_seq_len = 16;
  config.tied_embeddings = tied;
  return config;
}

// A GPT-2-initialised model and its parameters as Gpt2Weights.
struct Model {
  std::optional<model::ModelParams> gpt;
  Gpt2Weights weights;
};

std::unique_ptr<Model> MakeModel(bool tied, uint64_t seed = 11) {
  auto m = std::make_unique<Model>();
  absl::StatusOr<model::ModelParams> gpt = model::ModelParams::Gpt2Init(SmallConfig(tied), seed);
  EXPECT_TRUE(gpt.ok()) << gpt.status();
  m->gpt.emplace(std::move(*gpt));
  m->weights.config = m->gpt->config();
  const std::span<const float> params = std::as_const(*m->gpt).values();
  for (const auto& info : m->gpt->layout().tensors()) {
    m->weights.tensors[info.name] =
        HostTensor{info.shape, std::vector<float>(params.begin() + info.offset,
                                                  params.begin() + info.offset + info.numel)};
  }
  return m;
}

// The logits of the engine's layers (tests/support/whole_forward.h) for a fixed sequence.
std::vector<float> Logits(const model::ModelParams& gpt) {
  const std::vector<int32_t> tokens = {104, 101, 108, 108, 111, 32, 119, 111, 114, 108, 100, 256};
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  absl::StatusOr<std::vector<float>> logits = shardline::testing::WholeForwardLogits(
      gpt, backend, tokens, 1, static_cast<int>(tokens.size()));
  EXPECT_TRUE(logits.ok()) << logits.status();
  return logits.ok() ? *logits : std::vector<float>();
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

nlohmann::json ReadJson(const std::string& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

void WriteJson(const std::string& path, const nlohmann::json& json) {
  std::ofstream(path) << json.dump(2);
}

std::string ModelFile(const std::string& dir) { return dir + "/model.safetensors"; }
std::string ConfigFile(const std::string& dir) { return dir + "/config.json"; }

class HfExportRoundTrip : public ::testing::TestWithParam<bool> {};

TEST_P(HfExportRoundTrip, ImportAndLoadModelGiveTheSameTensorsAndLogits) {
  const bool tied = GetParam();
  const std::unique_ptr<Model> m = MakeModel(tied);
  const std::string dir = TempDir(tied ? "tied" : "untied");
  ASSERT_TRUE(ExportHfGpt2(m->weights, dir).ok());

  // Exactly the two files: no temporaries left behind by the atomic writes.
  std::set<std::string> files;
  for (const auto& entry : fs::directory_iterator(dir)) files.insert(entry.path().filename());
  EXPECT_EQ(files, (std::set<std::string>{"config.json", "model.safetensors"}));

  // The head count comes from config.json, not the fallback argument.
  absl::StatusOr<Gpt2Weights> imported = ImportHfGpt2(ModelFile(dir), /*n_head=*/1);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->config, m->weights.config);
  ASSERT_EQ(imported->tensors.size(), m->weights.tensors.size());
  for (const auto& [name, tensor] : m->weights.tensors) {
    ASSERT_TRUE(imported->tensors.contains(name)) << name;
    EXPECT_EQ(imported->tensors.at(name).shape, tensor.shape) << name;
    EXPECT_TRUE(BitEqual(imported->tensors.at(name).values, tensor.values)) << name;
  }

  // LoadModel takes the folder as `generate --checkpoint DIR` does.
  absl::StatusOr<model::ModelParams> loaded = training::LoadModel(dir, /*hf_heads=*/1);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->config().heads, m->gpt->config().heads);
  EXPECT_EQ(loaded->config().tied_embeddings, tied);
  const std::span<const float> a = std::as_const(*loaded).values();
  const std::span<const float> b = std::as_const(*m->gpt).values();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  const std::vector<float> expected = Logits(*m->gpt);
  const std::vector<float> got = Logits(*loaded);
  ASSERT_FALSE(expected.empty());
  EXPECT_TRUE(BitEqual(got, expected));
}

TEST_P(HfExportRoundTrip, FileHasTransformersNamesLayoutAndMetadata) {
  const bool tied = GetParam();
  const std::unique_ptr<Model> m = MakeModel(tied);
  const std::string dir = TempDir(tied ? "layout-tied" : "layout-untied");
  ASSERT_TRUE(ExportHfGpt2(m->weights, dir).ok());
  absl::StatusOr<SafetensorsReader> reader = SafetensorsReader::Open(ModelFile(dir));
  ASSERT_TRUE(reader.ok()) << reader.status();
  // transformers refuses a safetensors file without {"format": "pt"}.
  EXPECT_EQ(reader->metadata(), (std::map<std::string, std::string>{{"format", "pt"}}));
  const int64_t l = 2, c = 32, f = tied ? 128 : 48;
  // save_pretrained's names: the transformer's tensors prefixed, lm_head.weight only if untied.
  EXPECT_EQ(reader->tensors().size(), 4 + 12 * l + (tied ? 0 : 1));
  for (const auto& [name, info] : reader->tensors()) {
    EXPECT_TRUE(name.starts_with("transformer.") || (!tied && name == "lm_head.weight")) << name;
    EXPECT_EQ(info.dtype, SafetensorsDType::kF32) << name;
  }
  EXPECT_EQ(reader->Find("transformer.h.1.attn.c_attn.weight")->shape,
            (std::vector<int64_t>{c, 3 * c}));
  EXPECT_EQ(reader->Find("transformer.h.1.mlp.c_fc.weight")->shape, (std::vector<int64_t>{c, f}));
  EXPECT_EQ(reader->Find("transformer.h.1.mlp.c_proj.weight")->shape, (std::vector<int64_t>{f, c}));
  EXPECT_EQ(reader->Find("lm_head.weight") != nullptr, !tied);
  // Conv1D's (in, out): element [i][o] is our (out, in) [o][i].
  absl::StatusOr<HostTensor> conv = reader->ReadFloat("transformer.h.1.attn.c_attn.weight");
  ASSERT_TRUE(conv.ok());
  const std::vector<float>& ours = m->weights.tensors.at("h.1.qkv.w").values;
  const std::pair<int64_t, int64_t> picks[] = {{0, 0}, {3, 70}, {31, 95}, {17, 2}};
  for (const auto& [i, o] : picks) {
    EXPECT_EQ(conv->values[i * 3 * c + o], ours[o * c + i]) << i << "," << o;
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, HfExportRoundTrip, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tied" : "Untied";
                         });

TEST(HfExportTest, ConfigJsonStatesWhatOurModelComputes) {
  for (const bool tied : {true, false}) {
    const std::unique_ptr<Model> m = MakeModel(tied);
    const std::string dir = TempDir(tied ? "config-tied" : "config-untied");
    ASSERT_TRUE(ExportHfGpt2(m->weights, dir).ok());
    const nlohmann::json config = ReadJson(ConfigFile(dir));
    EXPECT_EQ(config.at("model_type"), "gpt2");
    EXPECT_EQ(config.at("architectures"), nlohmann::json::array({"GPT2LMHeadModel"}));
    EXPECT_EQ(config.at("vocab_size"), 257);
    EXPECT_EQ(config.at("n_positions"), 16);
    EXPECT_EQ(config.at("n_ctx"), 16);
    EXPECT_EQ(config.at("n_embd"), 32);
    EXPECT_EQ(config.at("n_layer"), 2);
    EXPECT_EQ(config.at("n_head"), 4);
    EXPECT_EQ(config.at("n_inner"), tied ? 128 : 48);
    // kernels/cpu/elementwise.cc's GELU is the tanh approximation: transformers' gelu_new.
    EXPECT_EQ(config.at("activation_function"), "gelu_new");
    EXPECT_EQ(static_cast<float>(config.at("layer_norm_epsilon").get<double>()),
              kernels::cpu::kLayerNormEps);
    EXPECT_EQ(config.at("tie_word_embeddings"), tied);
    EXPECT_EQ(config.at("scale_attn_weights"), true);
    EXPECT_EQ(config.at("scale_attn_by_inverse_layer_idx"), false);
    EXPECT_EQ(config.at("resid_pdrop"), 0.0);
    EXPECT_EQ(config.at("embd_pdrop"), 0.0);
    EXPECT_EQ(config.at("attn_pdrop"), 0.0);
    EXPECT_EQ(config.at("eos_token_id"), 256);  // the byte tokenizer's end of text
  }
}

TEST(HfExportTest, BadWeightsAreNamed) {
  const std::string dir = TempDir("bad");
  {
    std::unique_ptr<Model> m = MakeModel(true);
    m->weights.tensors.erase("h.1.fc.b");
    EXPECT_THAT(Message(ExportHfGpt2(m->weights, dir)),
                AllOf(HasSubstr(dir), HasSubstr("'h.1.fc.b'"), HasSubstr("missing")));
  }
  {
    std::unique_ptr<Model> m = MakeModel(true);
    m->weights.tensors.at("h.0.qkv.w").shape = {3, 32, 32};
    EXPECT_THAT(Message(ExportHfGpt2(m->weights, dir)),
                AllOf(HasSubstr("'h.0.qkv.w'"), HasSubstr("[3, 32, 32]"), HasSubstr("[96, 32]")));
  }
  {
    // An untied head in weights whose config says tied must not be dropped silently.
    std::unique_ptr<Model> m = MakeModel(true);
    m->weights.tensors["lm_head.w"] = m->weights.tensors.at("wte");
    EXPECT_THAT(Message(ExportHfGpt2(m->weights, dir)),
                AllOf(HasSubstr("'lm_head.w'"), HasSubstr("not part of")));
  }
  {
    std::unique_ptr<Model> m = MakeModel(true);
    m->weights.config.heads = 3;
    EXPECT_THAT(Message(ExportHfGpt2(m->weights, dir)),
                AllOf(HasSubstr(dir), HasSubstr("n_head 3 does not divide n_embd 32")));
  }
  EXPECT_FALSE(fs::exists(ModelFile(dir)));
}

// An export to edit: its folder, model file and parsed config.json.
struct Export {
  std::string dir;
  nlohmann::json config;
};
Export MakeExport(const std::string& name, bool tied) {
  const std::unique_ptr<Model> m = MakeModel(tied);
  Export e{TempDir(name), {}};
  EXPECT_TRUE(ExportHfGpt2(m->weights, e.dir).ok());
  e.config = ReadJson(ConfigFile(e.dir));
  return e;
}

TEST(HfImportConfigTest, WithoutConfigJsonTheHeadCountIsTheArgumentAndAnUntiedHeadIsKept) {
  const Export e = MakeExport("no-config", /*tied=*/false);
  fs::remove(ConfigFile(e.dir));
  absl::StatusOr<Gpt2Weights> imported = ImportHfGpt2(ModelFile(e.dir), /*n_head=*/2);
  ASSERT_TRUE(imported.ok()) << imported.status();
  EXPECT_EQ(imported->config.heads, 2);
  EXPECT_FALSE(imported->config.tied_embeddings);
  EXPECT_TRUE(imported->tensors.contains("lm_head.w"));
}

TEST(HfImportConfigTest, AHeadEqualToWteIsTiedUnlessConfigJsonUntiesIt) {
  std::unique_ptr<Model> m = MakeModel(/*tied=*/false);
  m->weights.tensors.at("lm_head.w").values = m->weights.tensors.at("wte").values;
  const std::string dir = TempDir("equal-head");
  ASSERT_TRUE(ExportHfGpt2(m->weights, dir).ok());
  absl::StatusOr<Gpt2Weights> untied = ImportHfGpt2(ModelFile(dir));
  ASSERT_TRUE(untied.ok()) << untied.status();
  EXPECT_FALSE(untied->config.tied_embeddings);
  EXPECT_TRUE(untied->tensors.contains("lm_head.w"));

  fs::remove(ConfigFile(dir));
  absl::StatusOr<Gpt2Weights> tied = ImportHfGpt2(ModelFile(dir), 4);
  ASSERT_TRUE(tied.ok()) << tied.status();
  EXPECT_TRUE(tied->config.tied_embeddings);
  EXPECT_FALSE(tied->tensors.contains("lm_head.w"));
}

TEST(HfImportConfigTest, ConfigJsonThatDisagreesWithTheTensorsIsNamed) {
  struct Case {
    const char* key;
    nlohmann::json value;
    bool tied;
    const char* says;
  };
  const Case cases[] = {
      {"n_layer", 3, true, "n_layer is 3, but"},
      {"n_embd", 64, true, "n_embd is 64, but"},
      {"vocab_size", 50257, true, "vocab_size is 50257, but"},
      {"n_positions", 1024, true, "n_positions is 1024, but"},
      {"n_inner", 128, false, "n_inner is 128, but"},
      {"n_inner", nullptr, false, "n_inner is 128, but"},  // null means 4·n_embd
      {"n_head", 5, true, "n_head 5 does not divide n_embd 32"},
      {"n_head", "four", true, "'n_head' is \"four\", expected an integer"},
      {"model_type", "gpt_neo", true, "model_type is \"gpt_neo\""},
      {"activation_function", "gelu", true, "activation_function \"gelu\" is not supported"},
      {"layer_norm_epsilon", -1e-6, true, "layer_norm_epsilon -1e-06 is not a positive number"},
      {"scale_attn_by_inverse_layer_idx", true, true, "scale_attn_by_inverse_layer_idx"},
      {"tie_word_embeddings", "yes", true, "'tie_word_embeddings' is \"yes\""},
      // A tied export whose config unties it: no head to untie.
      {"tie_word_embeddings", false, true, "tie_word_embeddings false, but"},
      // An untied export whose config ties it: the head would be dropped.
      {"tie_word_embeddings", true, false, "tie_word_embeddings true, but the lm_head.weight"},
  };
  for (const Case& c : cases) {
    Export e = MakeExport(absl::StrCat("disagree-", c.key), c.tied);
    e.config[c.key] = c.value;
    WriteJson(ConfigFile(e.dir), e.config);
    const absl::Status status = ImportHfGpt2(ModelFile(e.dir)).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.key;
    EXPECT_THAT(Message(status), AllOf(HasSubstr(ConfigFile(e.dir)), HasSubstr(c.says))) << c.key;
  }
  // Another epsilon is the model's: the import keeps it (and the engine runs it).
  {
    Export eps = MakeExport("eps", true);
    eps.config["layer_norm_epsilon"] = 1e-6;
    WriteJson(ConfigFile(eps.dir), eps.config);
    auto imported = ImportHfGpt2(ModelFile(eps.dir));
    ASSERT_TRUE(imported.ok()) << imported.status();
    EXPECT_EQ(imported->config.norm_eps, 1e-6);
  }
  // A tied export with no tie_word_embeddings key: transformers' default, true.
  Export e = MakeExport("tie-default", true);
  e.config.erase("tie_word_embeddings");
  WriteJson(ConfigFile(e.dir), e.config);
  EXPECT_TRUE(ImportHfGpt2(ModelFile(e.dir)).ok());
}

TEST(HfImportConfigTest, MalformedConfigJsonIsNamed) {
  const Export e = MakeExport("malformed", true);
  std::ofstream(ConfigFile(e.dir)) << "{\"n_head\": 4,";
  const absl::Status status = ImportHfGpt2(ModelFile(e.dir)).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Message(status), AllOf(HasSubstr(ConfigFile(e.dir)), HasSubstr("not JSON")));
  std::ofstream(ConfigFile(e.dir)) << "[4]";
  EXPECT_THAT(Message(ImportHfGpt2(ModelFile(e.dir)).status()), HasSubstr("not a JSON object"));
}

}  // namespace
}  // namespace shardline::checkpoint
