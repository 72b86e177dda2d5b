#include "worker/training/trainer.h"

#include <chrono>
#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "checkpoint/commit.h"
#include "checkpoint/layout.h"
#include "common/status_macros.h"
#include "kernels/allocator.h"
#include "kernels/backend.h"
#include "placement/checkpoint_state.h"
#include "worker/checkpoint/shard_writer.h"
#include "worker/model/data/sampler.h"
#include "worker/model/data/synthetic_corpus.h"
#include "worker/model/data/text_dataset.h"
#include "worker/model/sharded_gpt.h"
#include "worker/training/model_checkpoint.h"
#include "worker/training/sharded_trainer.h"
#include "worker/training/starting_point.h"

namespace shardline::training {
namespace {

using Clock = std::chrono::steady_clock;

// What the loop needs of the engine the spec's device runs: a step, and the state a save copies.
class RunEngine {
 public:
  virtual ~RunEngine() = default;
  virtual absl::StatusOr<model::StepStats> Step(const data::Sampler& sampler, int64_t step,
                                                float learning_rate) = 0;
  // The pieces CopyState writes, in its order (what the checkpoint writer lays out).
  virtual std::vector<model::StatePiece> StatePieces() const = 0;
  virtual absl::Status CopyState(std::span<float> out) const = 0;
  virtual int64_t PeakBytes() const = 0;
};

// The one engine, ShardedGpt, at tp = pp = dp = 1 with the whole batch as one micro-batch — what a
// cluster job of one rank runs — on the backend of the spec's device: the CPU's, or CUDA's (bf16
// or fp32 GEMMs over fp32 weights, as the spec's precision says).
class OneRankEngine final : public RunEngine {
 public:
  static absl::StatusOr<std::unique_ptr<RunEngine>> Create(const placement::TrainSpec& spec,
                                                           const StartingPoint& start) {
    auto engine = std::unique_ptr<OneRankEngine>(new OneRankEngine());
    const bool cuda = spec.device == placement::TrainDevice::kCuda;
    ASSIGN_OR_RETURN(engine->backend_,
                     kernels::CreateBackend(kernels::BackendOptions{
                         .device = cuda ? kernels::Device::kCuda : kernels::Device::kCpu,
                         .device_index = spec.device_index,
                         .bf16_gemms = spec.precision == placement::TrainPrecision::kBFloat16,
                         .cpu_allocator = &engine->cpu_allocator_}));
    const model::ShardedOptions options =
        ShardedOptionsOf(spec, placement::ParallelSpec{}, placement::RankCoords{});
    ASSIGN_OR_RETURN(engine->gpt_,
                     model::ShardedGpt::Create(options, model::ShardedGroups{}, *engine->backend_));
    RETURN_IF_ERROR(LoadStartingPoint(start, spec.seed, *engine->gpt_));
    return std::unique_ptr<RunEngine>(std::move(engine));
  }

  absl::StatusOr<model::StepStats> Step(const data::Sampler& sampler, int64_t step,
                                        float learning_rate) override {
    return gpt_->TrainStep(StepSamples(sampler, step), step, learning_rate);
  }
  std::vector<model::StatePiece> StatePieces() const override { return gpt_->StatePieces(); }
  absl::Status CopyState(std::span<float> out) const override { return gpt_->CopyState(out); }
  int64_t PeakBytes() const override {
    return static_cast<int64_t>(backend_->allocator().stats().peak_bytes) + gpt_->shared_bytes();
  }

 private:
  OneRankEngine() = default;
  kernels::CpuAllocator cpu_allocator_;        // the CPU backend's, before it
  std::unique_ptr<kernels::Backend> backend_;  // before the model, which allocates from it
  std::unique_ptr<model::ShardedGpt> gpt_;
};

}  // namespace

absl::StatusOr<data::TextDataset> LoadTrainingData(const placement::DataSpec& spec, int site) {
  if (!spec.per_site.empty()) {
    if (site < 0 || site >= static_cast<int>(spec.per_site.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("data.per_site has ", spec.per_site.size(), " files, none for site ", site));
    }
    return data::TextDataset::FromFile(spec.per_site[site]);
  }
  if (!spec.path.empty()) return data::TextDataset::FromFile(spec.path);
  return data::SyntheticCorpus(spec.synthetic_seed, static_cast<size_t>(spec.synthetic_bytes))
      .ToDataset();
}

model::AdamWOptions AdamWOptionsOf(const placement::OptimizerSpec& spec) {
  model::AdamWOptions adamw;
  adamw.adamw.beta1 = static_cast<float>(spec.beta1);
  adamw.adamw.beta2 = static_cast<float>(spec.beta2);
  adamw.adamw.eps = static_cast<float>(spec.eps);
  adamw.adamw.weight_decay = static_cast<float>(spec.weight_decay);
  adamw.max_grad_norm = spec.grad_clip;
  return adamw;
}

double LearningRateAt(const placement::OptimizerSpec& spec, int64_t step) {
  const double warmup =
      spec.warmup_steps > 0
          ? std::min(1.0, static_cast<double>(step) / static_cast<double>(spec.warmup_steps))
          : 1.0;
  return spec.lr * warmup;
}

absl::StatusOr<TrainResult> Train(const placement::TrainSpec& spec,
                                  const TrainCallbacks& callbacks,
                                  const std::atomic<bool>* stop, checkpoint::FileSystem& fs) {
  ASSIGN_OR_RETURN(data::TextDataset dataset, LoadTrainingData(spec.data));
  ASSIGN_OR_RETURN(data::Sampler sampler,
                   data::Sampler::Create(dataset, spec.seq_len, spec.batch, spec.seed));
  const checkpoint::DataIdentity data = IdentifyData(spec, dataset);

  // Where to start: every check of the spec against the checkpoint comes before any step.
  const std::string& dir = spec.checkpoint.dir;
  ASSIGN_OR_RETURN(const checkpoint::ResumePlan plan,
                   checkpoint::PlanResume(fs, placement::ResumeRequestOf(spec.checkpoint),
                                          spec.model, placement::CheckpointTrainStateOf(spec)));
  ASSIGN_OR_RETURN(const StartingPoint start,
                   OpenStartingPoint(spec, plan.decision.manifest, data));
  TrainResult result;
  result.start.first_step = start.step + 1;
  result.start.resumed_from = plan.decision.manifest;
  result.start.skipped = plan.decision.skipped;
  result.start.prepared = plan.prepared;
  if (start.kind == StartingPoint::Kind::kInitFrom) result.start.initialized_from = spec.init_from;

  // One engine for every plan and device: the sharded engine at 1×1×1.
  ASSIGN_OR_RETURN(std::unique_ptr<RunEngine> engine, OneRankEngine::Create(spec, start));
  if (callbacks.on_start) callbacks.on_start(result.start);

  // Saves: the writer's thread writes the file, then commits it as a one-rank step (what the
  // coordinator does for a sharded job) and prunes old steps.
  std::unique_ptr<worker::AsyncShardWriter> writer;
  std::mutex committed_mutex;
  std::string committed;
  if (!dir.empty()) {
    checkpoint::StepHeader header =
        placement::CheckpointStepHeader(spec, placement::ParallelSpec{}, 0, 1, data);
    const int64_t resumed_step = start.step;
    auto on_written = [&, header, resumed_step](int64_t step,
                                               const checkpoint::SavedShard& saved) mutable {
      checkpoint::StepAssembly assembly;
      RETURN_IF_ERROR(assembly.Add(saved));
      header.step = step;
      ASSIGN_OR_RETURN(const checkpoint::Manifest manifest, assembly.Build(header));
      RETURN_IF_ERROR(checkpoint::CommitStep(fs, dir, manifest));
      const int64_t protect[] = {resumed_step};
      RETURN_IF_ERROR(checkpoint::ApplyRetention(fs, dir, spec.checkpoint.keep, protect).status());
      const std::string path = checkpoint::ManifestPath(dir, step);
      {
        std::lock_guard<std::mutex> lock(committed_mutex);
        committed = path;
      }
      if (callbacks.on_committed) callbacks.on_committed(step, path);
      return absl::OkStatus();
    };
    writer = std::make_unique<worker::AsyncShardWriter>(
        worker::MakeShardPlan(engine->StatePieces()), 0, fs, on_written);
  }

  const auto run_start = Clock::now();
  auto last_report = run_start;
  int64_t tokens_since_report = 0;
  const int B = static_cast<int>(spec.batch);
  const int T = static_cast<int>(spec.seq_len);
  for (int64_t step = start.step + 1; step <= spec.steps; ++step) {
    const float learning_rate = static_cast<float>(LearningRateAt(spec.optimizer, step));
    ASSIGN_OR_RETURN(const model::StepStats stats, engine->Step(sampler, step, learning_rate));
    const float loss = stats.loss;
    const double grad_norm = stats.grad_norm;
    if (!std::isfinite(loss)) {
      return absl::InternalError("the loss became " + std::to_string(loss) + " at step " +
                                 std::to_string(step) + " (try a lower optimizer.lr)");
    }
    result.losses.push_back(loss);
    tokens_since_report += static_cast<int64_t>(B) * T;
    if (writer) RETURN_IF_ERROR(writer->PollError());

    const bool last = step == spec.steps || (stop && stop->load());
    const bool save = SavesAfter(spec, step, last);
    if (save) {
      // The only stall of a save: waiting for the previous one, and the copy.
      const auto stall = Clock::now();
      RETURN_IF_ERROR(writer->WaitIdle());
      RETURN_IF_ERROR(engine->CopyState(writer->staging()));
      RETURN_IF_ERROR(writer->Start(step, checkpoint::StepDir(dir, step)));
      result.save_stall_seconds.push_back(
          std::chrono::duration<double>(Clock::now() - stall).count());
    }
    if (callbacks.on_progress && (last || step % spec.log_interval == 0 || save)) {
      const auto now = Clock::now();
      TrainProgress progress;
      progress.step = step;
      progress.steps = spec.steps;
      progress.loss = loss;
      progress.grad_norm = grad_norm;
      progress.elapsed_seconds = std::chrono::duration<double>(now - run_start).count();
      const double window = std::chrono::duration<double>(now - last_report).count();
      progress.tokens_per_second = window > 0 ? tokens_since_report / window : 0;
      const double done = static_cast<double>(step - start.step);
      progress.eta_seconds =
          progress.elapsed_seconds / done * static_cast<double>(spec.steps - step);
      progress.saving = save;
      callbacks.on_progress(progress);
      last_report = now;
      tokens_since_report = 0;
    }
    if (last) break;
  }
  if (writer) RETURN_IF_ERROR(writer->WaitIdle());
  {
    std::lock_guard<std::mutex> lock(committed_mutex);
    result.checkpoint = committed;
  }
  result.peak_bytes = engine->PeakBytes();
  return result;
}

}  // namespace shardline::training
