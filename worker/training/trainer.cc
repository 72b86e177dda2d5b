#include "worker/training/trainer.h"

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/data/text_dataset.h"
#include "worker/model/gpt.h"
#include "worker/training/model_checkpoint.h"

#if SHARDLINE_WITH_CUDA
#include "worker/model/cuda/gpt_model.h"
#endif

namespace shardline::training {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

// Writes DIR/step-NNNNNNNN/model.safetensors, then points DIR/latest at it (atomically), so a
// reader never sees a half-written checkpoint as the latest.
absl::StatusOr<std::string> WriteCheckpoint(model::TrainableGpt& gpt, const std::string& dir,
                                            int64_t step) {
  char name[32];
  std::snprintf(name, sizeof(name), "step-%08lld", static_cast<long long>(step));
  const fs::path file = fs::path(dir) / name / "model.safetensors";
  ASSIGN_OR_RETURN(const std::span<const float> params, gpt.HostParams());
  RETURN_IF_ERROR(SaveModel(gpt.config(), params, file.string()));
  const fs::path tmp = fs::path(dir) / "latest.tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << name << "\n";
    if (!out) return absl::InternalError("cannot write " + tmp.string());
  }
  std::error_code ec;
  fs::rename(tmp, fs::path(dir) / "latest", ec);
  if (ec) return absl::InternalError("cannot update " + dir + "/latest: " + ec.message());
  return file.string();
}

}  // namespace

absl::StatusOr<data::TextDataset> LoadTrainingData(const placement::DataSpec& spec) {
  if (!spec.path.empty()) return data::TextDataset::FromFile(spec.path);
  return data::SyntheticCorpus(spec.synthetic_seed, static_cast<size_t>(spec.synthetic_bytes))
      .ToDataset();
}

model::GptConfig ModelConfigOf(const placement::ModelSpec& spec) {
  model::GptConfig config;
  config.layers = static_cast<int>(spec.layers);
  config.heads = static_cast<int>(spec.heads);
  config.d_model = static_cast<int>(spec.d_model);
  config.d_ff = static_cast<int>(spec.d_ff);
  config.vocab = static_cast<int>(spec.vocab);
  config.max_seq_len = static_cast<int>(spec.max_seq_len);
  config.tied_embeddings = spec.tied_embeddings;
  return config;
}

absl::StatusOr<std::unique_ptr<model::TrainableGpt>> CreateModel(
    const placement::TrainSpec& spec, kernels::Allocator& cpu_allocator) {
  const model::GptConfig config = ModelConfigOf(spec.model);
  if (spec.device == placement::TrainDevice::kCpu) {
    ASSIGN_OR_RETURN(auto gpt, model::GptModel::Create(config, cpu_allocator));
    return std::unique_ptr<model::TrainableGpt>(std::move(gpt));
  }
  const std::string device = "device cuda:" + std::to_string(spec.device_index);
#if SHARDLINE_WITH_CUDA
  const auto precision = spec.precision == placement::TrainPrecision::kBFloat16
                             ? kernels::cuda::GemmPrecision::kBFloat16
                             : kernels::cuda::GemmPrecision::kFloat32;
  auto gpt = model::CudaGptModel::Create(config, spec.device_index, precision);
  if (!gpt.ok()) return Annotate(gpt.status(), device);
  return std::unique_ptr<model::TrainableGpt>(std::move(*gpt));
#else
  return absl::FailedPreconditionError(
      device + ": this shardline was built without CUDA (nvcc was not found under "
               "/usr/local/cuda when it was configured, or -DSHARDLINE_CUDA=OFF)");
#endif
}

double LearningRateAt(const placement::OptimizerSpec& spec, int64_t step) {
  const double warmup =
      spec.warmup_steps > 0
          ? std::min(1.0, static_cast<double>(step) / static_cast<double>(spec.warmup_steps))
          : 1.0;
  return spec.lr * warmup;
}

absl::StatusOr<TrainResult> Train(const placement::TrainSpec& spec,
                                  const std::function<void(const TrainProgress&)>& on_progress,
                                  const std::atomic<bool>* stop) {
  ASSIGN_OR_RETURN(data::TextDataset dataset, LoadTrainingData(spec.data));
  ASSIGN_OR_RETURN(data::Sampler sampler,
                   data::Sampler::Create(dataset, spec.seq_len, spec.batch, spec.seed));
  kernels::CpuAllocator cpu_allocator;
  ASSIGN_OR_RETURN(std::unique_ptr<model::TrainableGpt> gpt, CreateModel(spec, cpu_allocator));
  gpt->InitGpt2(spec.seed);

  model::AdamWOptions adamw;
  adamw.adamw.beta1 = static_cast<float>(spec.optimizer.beta1);
  adamw.adamw.beta2 = static_cast<float>(spec.optimizer.beta2);
  adamw.adamw.eps = static_cast<float>(spec.optimizer.eps);
  adamw.adamw.weight_decay = static_cast<float>(spec.optimizer.weight_decay);
  adamw.max_grad_norm = spec.optimizer.grad_clip;

  TrainResult result;
  const auto start = Clock::now();
  auto last_report = start;
  int64_t tokens_since_report = 0;
  const int B = static_cast<int>(spec.batch);
  const int T = static_cast<int>(spec.seq_len);
  for (int64_t step = 1; step <= spec.steps; ++step) {
    // The samples of step s are a function of (seed, s) alone (data::Sampler).
    const data::Batch batch = sampler.GlobalBatch(static_cast<uint64_t>(step - 1));
    gpt->ZeroGrad();
    ASSIGN_OR_RETURN(const float loss, gpt->Forward(batch.inputs, batch.targets, B, T));
    RETURN_IF_ERROR(gpt->Backward());
    adamw.adamw.learning_rate = static_cast<float>(LearningRateAt(spec.optimizer, step));
    ASSIGN_OR_RETURN(const double grad_norm, gpt->AdamWStep(adamw, step));
    if (!std::isfinite(loss)) {
      return absl::InternalError("the loss became " + std::to_string(loss) + " at step " +
                                 std::to_string(step) + " (try a lower optimizer.lr)");
    }
    result.losses.push_back(loss);
    tokens_since_report += static_cast<int64_t>(B) * T;

    const bool last = step == spec.steps || (stop && stop->load());
    std::string checkpoint;
    if (!spec.checkpoint_dir.empty() &&
        (last || (spec.checkpoint_interval > 0 && step % spec.checkpoint_interval == 0))) {
      ASSIGN_OR_RETURN(checkpoint, WriteCheckpoint(*gpt, spec.checkpoint_dir, step));
      result.checkpoint = checkpoint;
    }
    if (on_progress && (last || step % spec.log_interval == 0 || !checkpoint.empty())) {
      const auto now = Clock::now();
      TrainProgress progress;
      progress.step = step;
      progress.steps = spec.steps;
      progress.loss = loss;
      progress.grad_norm = grad_norm;
      progress.elapsed_seconds = std::chrono::duration<double>(now - start).count();
      const double window = std::chrono::duration<double>(now - last_report).count();
      progress.tokens_per_second = window > 0 ? tokens_since_report / window : 0;
      progress.eta_seconds = progress.elapsed_seconds / step * (spec.steps - step);
      progress.checkpoint = checkpoint;
      on_progress(progress);
      last_report = now;
      tokens_since_report = 0;
    }
    if (last) break;
  }
  result.peak_bytes = gpt->PeakBytes();
  return result;
}

}  // namespace shardline::training
