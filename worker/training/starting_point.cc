#include "worker/training/starting_point.h"

#include "absl/strings/str_cat.h"
#include "checkpoint/checksum.h"
#include "checkpoint/gpt2_checkpoint.h"
#include "checkpoint/resume.h"
#include "common/status_macros.h"
#include "placement/checkpoint_state.h"

namespace shardline::training {

checkpoint::DataIdentity IdentifyData(const placement::TrainSpec& spec,
                                      const data::TextDataset& dataset) {
  checkpoint::DataIdentity data = placement::CheckpointTrainStateOf(spec).data;
  // Federated sites read different files: no one token stream identifies the run's data.
  if (!spec.data.per_site.empty()) return data;
  data.tokens = static_cast<int64_t>(dataset.size());
  data.xxh3 = checkpoint::Xxh3Of(std::as_bytes(std::span<const data::Token>(dataset.tokens())));
  return data;
}

absl::StatusOr<StartingPoint> OpenStartingPoint(const placement::TrainSpec& spec,
                                                const std::string& resume_manifest,
                                                const checkpoint::DataIdentity& data) {
  StartingPoint start;
  const model::ModelConfig config = spec.model;
  if (!resume_manifest.empty()) {
    const std::string where = "resuming from " + resume_manifest;
    absl::StatusOr<CheckpointSource> source = CheckpointSource::Open(resume_manifest);
    if (!source.ok()) return Annotate(source.status(), where);
    if (source->manifest() == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": a model file holds no optimizer state, so a run cannot resume from it; start "
                 "a new run from its parameters with init_from"));
    }
    checkpoint::TrainState wanted = placement::CheckpointTrainStateOf(spec);
    wanted.data = data;
    RETURN_IF_ERROR(checkpoint::CheckCanResume(*source->manifest(), config, wanted, where));
    start.kind = StartingPoint::Kind::kResume;
    start.step = source->manifest()->step;
    start.source = std::move(*source);
    return start;
  }
  if (!spec.init_from.empty()) {
    const std::string where = "init_from " + spec.init_from;
    // A Hugging Face file does not record its head count: the spec's is the one it must have.
    absl::StatusOr<CheckpointSource> source =
        CheckpointSource::Open(spec.init_from, static_cast<int>(spec.model.heads));
    if (!source.ok()) {
      return Annotate(source.status(), where + ": not a checkpoint Shardline can read");
    }
    RETURN_IF_ERROR(checkpoint::CheckSameModel(source->config(), config, where));
    start.kind = StartingPoint::Kind::kInitFrom;
    start.source = std::move(*source);
  }
  return start;
}

bool SavesAfter(const placement::TrainSpec& spec, int64_t step, bool last) {
  if (spec.checkpoint.dir.empty()) return false;
  return last || (spec.checkpoint.interval > 0 && step % spec.checkpoint.interval == 0);
}

}  // namespace shardline::training
