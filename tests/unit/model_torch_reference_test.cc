// The engine against PyTorch: same weights, same tokens → same logits and greedy tokens (the
// training forward's layers, tests/support/whole_forward.h), loss and gradients of every parameter
// tensor (a step of the engine on one rank, OneRankGpt, which tests/unit/model_sharded_test.cc
// compares every sharded plan with), for GPT-2 and for Llama (grouped-query and multi-head
// attention, tied and untied, Llama 3's rope scaling, a head_dim other than d_model / heads)
// against a Llama the script writes in Hugging Face's layout. The test writes the model to a temp
// dir, runs tests/unit/model_torch_reference.py with /usr/bin/python3 (Debian's python3-torch), and
// compares with what it writes back. The reference runs in float64, so the differences are our f32
// error.
//
// Tolerances (measured worst in brackets, on the configs below):
//   logits: |ours − torch| <= 1e-4                                          [7e-7]
//   loss:   |ours − torch| <= 1e-5·|torch|                                  [4e-8 relative]
//   grads:  |ours − torch| <= 1e-3·max|torch| over that tensor, per element [6e-7 relative]
// A real modelling difference is far above them: GELU without the tanh approximation fails all
// three, and so does rotary in the interleaved (GPT-J) layout instead of rotate_half.
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "nlohmann/json.hpp"
#include "tests/support/whole_forward.h"
#include "worker/model/model_params.h"
#include "worker/model/one_rank_gpt.h"

namespace shardline::model {
namespace {

constexpr char kPython[] = "/usr/bin/python3";
constexpr double kLogitAtol = 1e-4;
constexpr double kLossRtol = 1e-5;
constexpr double kGradRtol = 1e-3;

std::string Sci(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

std::string SourceDir() {
  if (const char* dir = std::getenv("SHARDLINE_SOURCE_DIR"); dir != nullptr && *dir != '\0') {
    return dir;
  }
  return SHARDLINE_SOURCE_PATH;
}

template <typename T>
void WriteRaw(const std::string& path, std::span<const T> values) {
  std::ofstream out(path, std::ios::binary);
  // Raw little-endian: this machine's order (x86-64, aarch64).
  out.write(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  ASSERT_TRUE(out.good()) << "writing " << path;
}

std::vector<float> ReadFloats(const std::string& path, size_t count) {
  std::ifstream in(path, std::ios::binary);
  std::vector<float> values(count);
  in.read(reinterpret_cast<char*>(values.data()), count * sizeof(float));
  EXPECT_TRUE(in.good()) << "reading " << count << " floats from " << path;
  return values;
}

// A fresh directory under the test's temp dir.
std::string MakeTempDir() {
  std::string pattern = ::testing::TempDir() + "/model_torch_XXXXXX";
  const char* dir = mkdtemp(pattern.data());
  return dir == nullptr ? std::string() : std::string(dir);
}

bool TorchAvailable(std::string* why) {
  if (access(kPython, X_OK) != 0) {
    *why = std::string(kPython) + " is not installed";
    return false;
  }
  const std::string cmd = std::string(kPython) + " -c 'import torch, numpy' >/dev/null 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    *why = std::string(kPython) + " cannot import torch and numpy (Debian: python3-torch)";
    return false;
  }
  return true;
}

struct Case {
  std::string name;
  ModelConfig config;
};

ModelConfig Sizes(bool tied) {
  ModelConfig config;
  config.layers = 2;
  config.heads = 4;
  config.d_model = 32;
  config.d_ff = tied ? 0 : 48;  // the untied case also covers a d_ff other than 4·d_model
  config.vocab = 64;
  config.max_seq_len = 20;
  config.tied_embeddings = tied;
  return config;
}

ModelConfig Llama(int kv_heads, bool tied) {
  ModelConfig config = ModelConfig::Llama(Sizes(false));
  config.kv_heads = kv_heads;
  config.tied_embeddings = tied;
  config.rope_theta = 500000.0;
  config.norm_eps = 1e-6;
  return config;
}

std::vector<Case> Cases() {
  std::vector<Case> cases{{"Gpt2Tied", Sizes(true)}, {"Gpt2Untied", Sizes(false)}};
  cases.push_back({"LlamaGqaUntied", Llama(2, false)});
  cases.push_back({"LlamaMhaTied", Llama(4, true)});
  ModelConfig scaled = Llama(1, false);
  // Llama 3.1's rescaling, its original context short enough that the test's positions reach the
  // blended and the divided frequencies.
  scaled.rope_scaling = {
      .factor = 8.0, .low_freq_factor = 1.0, .high_freq_factor = 4.0, .original_max_positions = 16};
  scaled.rope_theta = 10000.0;
  cases.push_back({"LlamaMqaRopeScaling", scaled});
  ModelConfig wide_heads = Llama(2, false);
  wide_heads.head_dim = 12;  // 4 heads of 12: q is 48 wide on a residual of 32
  cases.push_back({"LlamaHeadDim", wide_heads});
  return cases;
}

class TorchReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(TorchReferenceTest, LogitsLossAndGradientsMatch) {
  std::string why;
  if (!TorchAvailable(&why)) GTEST_SKIP() << why;

  const ModelConfig config = GetParam().config;
  ASSERT_TRUE(config.Validate().ok()) << config.Validate();
  constexpr int B = 3, T = 16;

  ModelParams model = ModelParams::Gpt2Init(config, 21).value();
  // GPT-2's init on top of noise: larger activations and gradients, so a mismatch shows.
  std::mt19937 rng(22);
  std::normal_distribution<float> noise(0.0f, 0.1f);
  for (float& p : model.values()) p += noise(rng);
  std::uniform_int_distribution<int32_t> token(0, config.vocab - 1);
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int32_t& t : tokens) t = token(rng);
  for (int32_t& t : targets) t = token(rng);
  targets[7] = -1;  // ignored by both (torch: ignore_index=-1)

  // One step at learning rate 0: its loss is the forward's at these weights, and with β₁ = 0 and
  // no clipping AdamW's first moment is the step's gradient.
  kernels::CpuAllocator allocator;
  kernels::cpu::CpuBackend backend(allocator);
  OneRankOptions options{.config = config, .batch = B, .seq_len = T};
  options.adamw.adamw.beta1 = 0.0f;
  options.adamw.max_grad_norm = 0.0;
  auto engine = OneRankGpt::Create(options, backend);
  ASSERT_TRUE(engine.ok()) << engine.status();
  ASSERT_TRUE((*engine)->Load(model).ok());
  auto stats = (*engine)->Step(tokens, targets, 1, 0.0f);
  ASSERT_TRUE(stats.ok()) << stats.status();
  const float loss = stats->loss;
  auto state = (*engine)->TrainingState();
  ASSERT_TRUE(state.ok()) << state.status();
  const std::span<const float> grads = state->exp_avg.values();
  auto forward = testing::WholeForwardLogits(model, backend, tokens, B, T);
  ASSERT_TRUE(forward.ok()) << forward.status();

  const std::string dir = MakeTempDir();
  ASSERT_FALSE(dir.empty()) << "mkdtemp under " << ::testing::TempDir();
  nlohmann::json spec;
  spec["config"] = {{"arch", config.FamilyName()},
                    {"layers", config.layers},
                    {"heads", config.heads},
                    {"kv_heads", config.kv()},
                    {"head_dim", config.head_size()},
                    {"d_model", config.d_model},
                    {"d_ff", config.ff()},
                    {"vocab", config.vocab},
                    {"max_seq_len", config.max_seq_len},
                    {"tied_embeddings", config.tied_embeddings},
                    {"norm_eps", config.norm_eps},
                    {"rope_theta", config.rope_theta}};
  if (config.rope_scaling.enabled()) {
    spec["config"]["rope_scaling"] = {
        {"factor", config.rope_scaling.factor},
        {"low_freq_factor", config.rope_scaling.low_freq_factor},
        {"high_freq_factor", config.rope_scaling.high_freq_factor},
        {"original_max_position_embeddings", config.rope_scaling.original_max_positions}};
  }
  spec["batch"] = B;
  spec["seq_len"] = T;
  for (const ParamTensorInfo& t : model.layout().tensors()) {
    spec["tensors"].push_back({{"name", t.name}, {"offset", t.offset}, {"shape", t.shape}});
  }
  std::ofstream(dir + "/model.json") << spec.dump(1);
  WriteRaw<float>(dir + "/params.bin", model.values());
  WriteRaw<int32_t>(dir + "/tokens.bin", tokens);
  WriteRaw<int32_t>(dir + "/targets.bin", targets);

  const std::string script = SourceDir() + "/tests/unit/model_torch_reference.py";
  const std::string cmd =
      std::string(kPython) + " " + script + " " + dir + " >" + dir + "/reference.log 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir + "/reference.log");
    FAIL() << "`" << cmd << "` failed:\n" << std::string(std::istreambuf_iterator<char>(log), {});
  }

  // Loss.
  nlohmann::json result;
  std::ifstream(dir + "/loss.json") >> result;
  const double torch_loss = result["loss"].get<double>();
  EXPECT_NEAR(loss, torch_loss, kLossRtol * std::fabs(torch_loss));
  RecordProperty("loss_rel_error", Sci(std::fabs(loss - torch_loss) / torch_loss));

  // Logits.
  const std::span<const float> logits = *forward;
  const std::vector<float> torch_logits = ReadFloats(dir + "/logits.bin", logits.size());
  double worst_logit = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    worst_logit = std::max(worst_logit, std::fabs(double(logits[i]) - torch_logits[i]));
  }
  EXPECT_LE(worst_logit, kLogitAtol);
  RecordProperty("logits_abs_error", Sci(worst_logit));
  // Greedy tokens: the same argmax at every position where torch's best two are not within the
  // logits' tolerance of each other.
  const int V = static_cast<int>(config.vocab);
  int compared = 0;
  for (int row = 0; row < B * T; ++row) {
    const auto ours = logits.begin() + int64_t{row} * V;
    const auto theirs = torch_logits.begin() + int64_t{row} * V;
    std::vector<float> sorted(theirs, theirs + V);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] <= 4 * kLogitAtol) continue;
    ++compared;
    EXPECT_EQ(std::max_element(ours, ours + V) - ours,
              std::max_element(theirs, theirs + V) - theirs)
        << "greedy token at row " << row;
  }
  EXPECT_GT(compared, B * T / 2);

  // Gradients of every tensor, each against its own scale.
  const std::vector<float> torch_grads = ReadFloats(dir + "/grads.bin", grads.size());
  double worst_grad = 0;
  for (const ParamTensorInfo& t : model.layout().tensors()) {
    double scale = 0;
    for (int64_t i = 0; i < t.numel; ++i) {
      scale = std::max(scale, std::fabs(double(torch_grads[t.offset + i])));
    }
    ASSERT_GT(scale, 0.0) << t.name << " has an all-zero reference gradient";
    double worst = 0;
    for (int64_t i = 0; i < t.numel; ++i) {
      worst = std::max(worst, std::fabs(double(grads[t.offset + i]) - torch_grads[t.offset + i]));
    }
    EXPECT_LE(worst, kGradRtol * scale) << t.name << ": max |grad| " << scale;
    worst_grad = std::max(worst_grad, worst / scale);
  }
  RecordProperty("grads_rel_error", Sci(worst_grad));
}

INSTANTIATE_TEST_SUITE_P(Families, TorchReferenceTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

}  // namespace
}  // namespace shardline::model
