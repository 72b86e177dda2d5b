// Where a training run's state comes from, the same for `shardline train` and every rank of a
// sharded job, checked against the spec before any step: a checkpoint step to resume (parameters,
// both AdamW moments and the step count), a checkpoint to take only the parameters from
// (`init_from`, a fresh optimizer), or nothing (GPT-2 initialisation from the seed).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/train_state.h"
#include "placement/train_spec.h"
#include "worker/model/data/text_dataset.h"
#include "worker/training/model_checkpoint.h"

namespace shardline::training {

// The loaded data's identity: the spec's source, the number of tokens and their checksum.
checkpoint::DataIdentity IdentifyData(const placement::TrainSpec& spec,
                                      const data::TextDataset& dataset);

struct StartingPoint {
  enum class Kind { kFresh, kResume, kInitFrom };
  Kind kind = Kind::kFresh;
  std::optional<CheckpointSource> source;  // kResume, kInitFrom
  int64_t step = 0;                        // kResume: the step resumed after; else 0
};

// `resume_manifest`: the manifest of the step to resume from, as checkpoint::DecideResume chose it
// (here or in the coordinator); empty: none, and then `spec.init_from` if given. Errors, before any
// work, each naming the checkpoint: a resumed step without optimizer state; a model config, seed,
// batch, sequence length or data that differs from the spec (checkpoint::CheckResumable, and the
// tokens of `data`); an init_from that is not a checkpoint or whose model is not the spec's.
absl::StatusOr<StartingPoint> OpenStartingPoint(const placement::TrainSpec& spec,
                                                const std::string& resume_manifest,
                                                const checkpoint::DataIdentity& data);

// Whether a run of `spec` saves after `step`: every checkpoint.interval steps, and after the last
// step it runs (`last`: the final one, or a stop was asked for). Never without checkpoint.dir.
bool SavesAfter(const placement::TrainSpec& spec, int64_t step, bool last);

}  // namespace shardline::training
