// Saving and loading a single-device GptModel as a safetensors checkpoint (our format, and
// Hugging Face GPT-2 files), and finding the newest checkpoint in a training run's folder.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/allocator.h"
#include "worker/model/gpt.h"

namespace shardline::training {

// Writes every parameter of `model` to `path` (atomically). Untied output heads are not part of
// the format yet: FailedPrecondition.
absl::Status SaveModel(const model::GptModel& model, const std::string& path);

// Loads a checkpoint written by SaveModel, or a Hugging Face GPT-2 safetensors file (recognised
// by its tensor names; its head count is not stored, so `hf_heads` gives it). Errors name the
// file and the tensor.
absl::StatusOr<std::unique_ptr<model::GptModel>> LoadModel(const std::string& path,
                                                           kernels::Allocator& allocator,
                                                           int hf_heads = 12);

// The checkpoint file that `path` names: the file itself; or, for a training run's folder,
// the step its `latest` file points at, or its `model.safetensors`. NotFound saying what was
// looked for.
absl::StatusOr<std::string> ResolveCheckpoint(const std::string& path);

}  // namespace shardline::training
