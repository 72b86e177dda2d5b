// CudaGptModel (worker/model/cuda/gpt_model.h) against the CPU GptModel, its reference: the same
// parameters and tokens must give the same loss, logits, gradients and training trajectory, within
// tolerances stated below; and `shardline train`'s loop (training::Train) on a CUDA device.
//
// Tests that need a GPU skip, naming the reason (cudaGetDeviceCount's error), when none is usable;
// the *NoGpu* ones need none. scripts/gpu-check.sh runs them on a GPU (`ctest -L gpu`).
//
// Tolerances:
//   fp32 GEMMs (cuBLAS Sgemm, no TF32) vs the CPU: every kernel differs from its twin by summation
//     order only (kernels_cuda_test.cc), so through two blocks the loss agrees to rel 1e-5, the
//     logits to 1e-4 of their largest magnitude, and each gradient tensor to 1e-3 of its largest
//     magnitude (the attention and LayerNorm backwards cancel large terms).
//   bf16 GEMMs vs the fp32 CPU: each product's operands keep 8 bits of mantissa. Measured on the
//     CPU model with every GEMM operand rounded to bf16 as kernels/cuda/blas.h does (a throwaway
//     patch of kernels/cpu/matmul.cc, 2026-11-30), on these configs and batches: loss rel 7e-6 to
//     1.3e-5, gradient cosine similarity 0.999992, largest gradient difference 5-6e-3 of the
//     largest gradient; 60 training steps ended rel 6e-4 to 7e-3 apart. Held here to: loss rel
//     1e-3, cosine > 0.999, and a difference from the CPU over 10x that of fp32 on the same GPU
//     (bf16 must be in use).
//   Training (60 steps, AdamW): the trajectories part slowly where a gradient is near zero (AdamW's
//     first steps move by ±lr whatever its size); the final losses agree to rel 2e-2 in fp32 and
//     5e-2 in bf16.
#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/allocator.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_allocator.h"
#include "placement/train_spec.h"
#include "tests/support/tiny_train_spec.h"
#include "tests/unit/kernels_test_util.h"
#include "worker/model/cuda/gpt_model.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/gpt.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/trainer.h"

namespace shardline::model {
namespace {

using kernels::cuda::GemmPrecision;
using kernels::testing::ExpectScaled;
using ::testing::HasSubstr;

#define SKIP_WITHOUT_GPU()                                              \
  do {                                                                  \
    const std::string reason = kernels::cuda::CudaUnavailableReason(0); \
    if (!reason.empty()) GTEST_SKIP() << reason;                        \
  } while (false)

ModelConfig TinyConfig(bool tied) {
  ModelConfig c;
  c.layers = 2;
  c.heads = 4;
  c.d_model = 64;
  c.vocab = 97;
  c.max_seq_len = 32;
  c.tied_embeddings = tied;
  return c;
}

// A batch with repeated tokens (the embedding's scatter-add) and two ignored targets.
struct Batch {
  int B = 3, T = 16;
  std::vector<int32_t> tokens, targets;
};
Batch MakeBatch(int vocab) {
  Batch b;
  const int N = b.B * b.T;
  for (int n = 0; n < N; ++n) {
    b.tokens.push_back(static_cast<int32_t>((n * 7 + 3) % 11 + (n % 5) * 13) % vocab);
    b.targets.push_back(static_cast<int32_t>((n * 5 + 1) % vocab));
  }
  b.targets[4] = -1;
  b.targets[N - 1] = -1;
  return b;
}

std::unique_ptr<CudaGptModel> CudaModel(const ModelConfig& config, GemmPrecision precision) {
  auto model = CudaGptModel::Create(config, 0, precision);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? std::move(*model) : nullptr;
}

double MaxDiff(std::span<const float> a, std::span<const float> b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double{a[i]} - double{b[i]}));
  return m;
}

double Cosine(std::span<const float> a, std::span<const float> b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += double{a[i]} * b[i];
    aa += double{a[i]} * a[i];
    bb += double{b[i]} * b[i];
  }
  return ab / std::sqrt(aa * bb);
}

TEST(CudaGptNoGpuTest, HeadSizesPastTheAttentionKernelAreRefusedBeforeTouchingTheDevice) {
  ModelConfig c = TinyConfig(true);
  c.heads = 1;
  c.d_model = 256;  // one head of 256 channels
  auto model = CudaGptModel::Create(c, 0, GemmPrecision::kBFloat16);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("head size 256"));
}

TEST(CudaGptNoGpuTest, NoDeviceIsFailedPreconditionWithCudasReason) {
  const std::string reason = kernels::cuda::CudaUnavailableReason(0);
  if (reason.empty()) GTEST_SKIP() << "a GPU is visible: the other tests create models on it";
  auto model = CudaGptModel::Create(TinyConfig(true), 0, GemmPrecision::kBFloat16);
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kFailedPrecondition) << model.status();
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("cudaGetDeviceCount"));
}

// The parameter: tied embeddings.
class CudaGptVsCpuTest : public ::testing::TestWithParam<bool> {
 protected:
  // cpu and gpu: TinyConfig(tied), initialised from the same seed.
  void CreateModels(GemmPrecision precision) {
    config = TinyConfig(GetParam());
    cpu = GptModel::Create(config, allocator).value();
    cpu->InitGpt2(5);
    gpu = CudaModel(config, precision);
    ASSERT_NE(gpu, nullptr);
    gpu->InitGpt2(5);
  }

  kernels::CpuAllocator allocator;
  ModelConfig config;
  std::unique_ptr<GptModel> cpu;
  std::unique_ptr<CudaGptModel> gpu;
};

TEST_P(CudaGptVsCpuTest, Fp32MatchesTheCpuModelForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  ASSERT_NO_FATAL_FAILURE(CreateModels(GemmPrecision::kFloat32));
  auto params = gpu->HostParams();
  ASSERT_TRUE(params.ok()) << params.status();
  ASSERT_EQ(0, std::memcmp(params->data(), cpu->params().data(), params->size_bytes()))
      << "the same seed must give the same initial bits";

  const Batch b = MakeBatch(config.vocab);
  auto cpu_loss = cpu->Forward(b.tokens, b.targets, b.B, b.T);
  auto gpu_loss = gpu->Forward(b.tokens, b.targets, b.B, b.T);
  ASSERT_TRUE(cpu_loss.ok() && gpu_loss.ok()) << gpu_loss.status();
  EXPECT_NEAR(*gpu_loss, *cpu_loss, 1e-5 * *cpu_loss);
  auto logits = gpu->HostLogits();
  ASSERT_TRUE(logits.ok()) << logits.status();
  ExpectScaled(*logits, cpu->Logits(), 1e-4, 0.0, "logits");

  cpu->ZeroGrad();
  gpu->ZeroGrad();
  ASSERT_TRUE(cpu->Forward(b.tokens, b.targets, b.B, b.T).ok());
  ASSERT_TRUE(gpu->Forward(b.tokens, b.targets, b.B, b.T).ok());
  ASSERT_TRUE(cpu->Backward().ok());
  ASSERT_TRUE(gpu->Backward().ok());
  auto grads = gpu->HostGrads();
  ASSERT_TRUE(grads.ok()) << grads.status();
  for (const ParamTensorInfo& t : cpu->NamedTensors()) {
    ExpectScaled(std::span<const float>(*grads).subspan(t.offset, t.numel),
                 cpu->grads().subspan(t.offset, t.numel), 1e-3, 0.0, "grad " + t.name);
  }
}

TEST_P(CudaGptVsCpuTest, Bf16GradientsPointTheSameWayAsTheCpus) {
  SKIP_WITHOUT_GPU();
  ASSERT_NO_FATAL_FAILURE(CreateModels(GemmPrecision::kBFloat16));
  const Batch b = MakeBatch(config.vocab);
  cpu->ZeroGrad();
  gpu->ZeroGrad();
  auto cpu_loss = cpu->Forward(b.tokens, b.targets, b.B, b.T);
  auto gpu_loss = gpu->Forward(b.tokens, b.targets, b.B, b.T);
  ASSERT_TRUE(cpu_loss.ok() && gpu_loss.ok()) << gpu_loss.status();
  EXPECT_NEAR(*gpu_loss, *cpu_loss, 1e-3 * *cpu_loss);
  ASSERT_TRUE(cpu->Backward().ok());
  ASSERT_TRUE(gpu->Backward().ok());
  auto grads = gpu->HostGrads();
  ASSERT_TRUE(grads.ok()) << grads.status();
  EXPECT_GT(Cosine(*grads, cpu->grads()), 0.999);

  // And bf16 is really in use: its gradients are further from the CPU's than the same device's
  // fp32 ones are (summation order only), by more than 10x (the emulation measured 5-6e-3 of the
  // largest gradient for bf16; fp32 differs in the last bits).
  auto fp32 = CudaModel(config, GemmPrecision::kFloat32);
  ASSERT_NE(fp32, nullptr);
  fp32->InitGpt2(5);
  fp32->ZeroGrad();
  ASSERT_TRUE(fp32->Forward(b.tokens, b.targets, b.B, b.T).ok());
  ASSERT_TRUE(fp32->Backward().ok());
  auto fp32_grads = fp32->HostGrads();
  ASSERT_TRUE(fp32_grads.ok()) << fp32_grads.status();
  EXPECT_GT(MaxDiff(*grads, cpu->grads()), 10 * MaxDiff(*fp32_grads, cpu->grads()));
}

INSTANTIATE_TEST_SUITE_P(TiedAndUntied, CudaGptVsCpuTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Tied" : "Untied"; });

// 60 steps of the synthetic corpus (byte tokens: vocab 257) on both devices from the same initial
// weights.
std::vector<float> TrainLosses(TrainableGpt& model, int steps) {
  const data::TextDataset dataset = data::SyntheticCorpus(3, 64 << 10).ToDataset();
  auto sampler = data::Sampler::Create(dataset, 32, 4, 11);
  EXPECT_TRUE(sampler.ok());
  AdamWOptions adamw;
  adamw.adamw.learning_rate = 3e-3f;
  adamw.adamw.weight_decay = 0.1f;
  std::vector<float> losses;
  model.InitGpt2(9);
  for (int step = 1; step <= steps; ++step) {
    const data::Batch batch = sampler->GlobalBatch(static_cast<uint64_t>(step - 1));
    model.ZeroGrad();
    auto loss = model.Forward(batch.inputs, batch.targets, 4, 32);
    EXPECT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(model.Backward().ok());
    auto norm = model.AdamWStep(adamw, step);
    EXPECT_TRUE(norm.ok()) << norm.status();
    losses.push_back(loss.ok() ? *loss : NAN);
  }
  return losses;
}

TEST(CudaGptTrainingTest, Fp32AndBf16TrainAsTheCpuDoes) {
  SKIP_WITHOUT_GPU();
  ModelConfig config = TinyConfig(true);
  config.vocab = 257;
  kernels::CpuAllocator allocator;
  auto cpu = GptModel::Create(config, allocator).value();
  const std::vector<float> cpu_losses = TrainLosses(*cpu, 60);
  ASSERT_LT(cpu_losses.back(), cpu_losses.front() - 1.0f) << "the reference itself must learn";
  for (GemmPrecision precision : {GemmPrecision::kFloat32, GemmPrecision::kBFloat16}) {
    const bool bf16 = precision == GemmPrecision::kBFloat16;
    auto gpu = CudaModel(config, precision);
    ASSERT_NE(gpu, nullptr);
    const std::vector<float> gpu_losses = TrainLosses(*gpu, 60);
    EXPECT_NEAR(gpu_losses.front(), cpu_losses.front(), (bf16 ? 1e-3 : 1e-5) * cpu_losses.front());
    EXPECT_NEAR(gpu_losses.back(), cpu_losses.back(), (bf16 ? 5e-2 : 2e-2) * cpu_losses.back())
        << (bf16 ? "bf16" : "fp32");
  }
}

TEST(CudaGptTrainingTest, StateRoundTripsAndBadInputIsRefusedBeforeAnyWork) {
  SKIP_WITHOUT_GPU();
  const ModelConfig config = TinyConfig(false);
  auto gpu = CudaModel(config, GemmPrecision::kBFloat16);
  ASSERT_NE(gpu, nullptr);
  std::vector<float> values(static_cast<size_t>(gpu->num_params()));
  for (size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i % 1000) * 1e-3f - 0.5f;
  ASSERT_TRUE(gpu->LoadState(values, {}, {}).ok());
  auto back = gpu->HostParams();
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(0, std::memcmp(back->data(), values.data(), values.size() * sizeof(float)));
  EXPECT_EQ(gpu->LoadState(std::span<const float>(values).first(10), {}, {}).code(),
            absl::StatusCode::kInvalidArgument);

  // The whole training state: after AdamW steps on the GPU, CopyState and LoadState carry the
  // parameters and both moments bit for bit, in either direction between the GPU and the CPU
  // (a checkpoint written on one resumes on the other).
  Batch batch = MakeBatch(config.vocab);
  AdamWOptions adam;
  adam.adamw.learning_rate = 1e-3f;
  for (int step = 1; step <= 2; ++step) {
    gpu->ZeroGrad();
    ASSERT_TRUE(gpu->Forward(batch.tokens, batch.targets, batch.B, batch.T).ok());
    ASSERT_TRUE(gpu->Backward().ok());
    ASSERT_TRUE(gpu->AdamWStep(adam, step).ok());
  }
  const size_t n = values.size();
  std::vector<float> state(3 * n);
  ASSERT_TRUE(gpu->CopyState(state).ok());
  EXPECT_TRUE(std::any_of(state.begin() + 2 * n, state.end(), [](float v) { return v != 0; }))
      << "the second moments after two steps are not all zero";
  kernels::CpuAllocator allocator;
  auto cpu = GptModel::Create(config, allocator).value();
  const std::span<const float> all(state);
  ASSERT_TRUE(cpu->LoadState(all.first(n), all.subspan(n, n), all.subspan(2 * n, n)).ok());
  std::vector<float> on_cpu(3 * n);
  ASSERT_TRUE(cpu->CopyState(on_cpu).ok());
  EXPECT_EQ(0, std::memcmp(on_cpu.data(), state.data(), state.size() * sizeof(float)));
  auto again = CudaModel(config, GemmPrecision::kBFloat16);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(again->LoadState(all.first(n), all.subspan(n, n), all.subspan(2 * n, n)).ok());
  std::vector<float> on_gpu(3 * n);
  ASSERT_TRUE(again->CopyState(on_gpu).ok());
  EXPECT_EQ(0, std::memcmp(on_gpu.data(), state.data(), state.size() * sizeof(float)));

  Batch b = MakeBatch(config.vocab);
  b.tokens[7] = config.vocab;  // outside the vocabulary
  auto loss = gpu->Forward(b.tokens, b.targets, b.B, b.T);
  ASSERT_FALSE(loss.ok());
  EXPECT_THAT(std::string(loss.status().message()), HasSubstr("tokens"));
  b = MakeBatch(config.vocab);
  b.targets[3] = config.vocab + 5;
  EXPECT_FALSE(gpu->Forward(b.tokens, b.targets, b.B, b.T).ok());
  EXPECT_EQ(gpu->Forward(b.tokens, b.targets, b.B, 64).status().code(),
            absl::StatusCode::kInvalidArgument);  // T past max_seq_len
  EXPECT_EQ(gpu->Backward().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(CudaGptTrainingTest, ShardlineTrainOnCudaLearnsAndItsCheckpointLoadsOnTheCpu) {
  SKIP_WITHOUT_GPU();
  // The spec training_test.cc trains on the CPU, on the GPU.
  auto spec = placement::ParseTrainSpec(std::string(testing::kTinyTrainSpec) + "device: cuda\n",
                                        "tiny-cuda.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->precision, placement::TrainPrecision::kBFloat16);
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("shardline-cuda-train-" + std::to_string(::getpid())))
                              .string();
  std::filesystem::remove_all(dir);
  spec->checkpoint.dir = dir;
  auto result = training::Train(*spec, {});
  ASSERT_TRUE(result.ok()) << result.status();
  // The CPU run of this spec (training_test.cc, LossFallsAndRerunsAreBitIdentical) ends at 2.16
  // and is held below 2.6; bf16 GEMMs are held to the same bound.
  EXPECT_GT(result->losses.front(), 5.0f);
  EXPECT_LT(result->losses.back(), 2.6f);
  EXPECT_GT(result->peak_bytes, 0);

  kernels::CpuAllocator allocator;
  auto loaded = training::LoadModel(result->checkpoint, allocator);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  // The checkpoint's model, evaluated on the CPU, has about the loss the GPU last reported.
  auto dataset = training::LoadTrainingData(spec->data);
  ASSERT_TRUE(dataset.ok());
  auto sampler = data::Sampler::Create(*dataset, spec->seq_len, spec->batch, spec->seed);
  ASSERT_TRUE(sampler.ok());
  const data::Batch batch = sampler->GlobalBatch(199);
  auto loss = (*loaded)->Forward(batch.inputs, batch.targets, 4, 32);
  ASSERT_TRUE(loss.ok()) << loss.status();
  EXPECT_NEAR(*loss, result->losses.back(), 0.3);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace shardline::model
