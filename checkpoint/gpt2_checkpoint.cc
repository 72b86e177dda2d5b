#include "checkpoint/gpt2_checkpoint.h"

#include <set>

#include "absl/strings/str_cat.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_reader.h"
#include "checkpoint/safetensors_writer.h"
#include "common/status_macros.h"
#include "model/tensor_table.h"

namespace shardline::checkpoint {

absl::Status CheckHoldsExactlyItsTensors(const Gpt2Weights& weights, const std::string& where,
                                         const std::string& family) {
  std::set<std::string> expected;
  for (const model::TensorRow& row : model::ModelRows(weights.config)) {
    expected.insert(row.name);
    const auto it = weights.tensors.find(row.name);
    if (it == weights.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", row.name, "' is missing"));
    }
    if (it->second.shape != row.shape || it->second.values.size() != *NumElements(row.shape)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": tensor '", row.name, "' has shape ",
                                                     ShapeString(it->second.shape), ", expected ",
                                                     ShapeString(row.shape)));
    }
  }
  for (const auto& [name, tensor] : weights.tensors) {
    if (!expected.contains(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", name, "' is not part of a ", family,
                       " of this config (", weights.config.DebugString(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteGpt2Checkpoint(const std::string& path, const Gpt2Weights& weights) {
  RETURN_IF_ERROR(Annotate(weights.config.Validate(), absl::StrCat("writing checkpoint ", path)));
  SafetensorsWriter writer(path);
  for (auto& [key, value] : ModelMetadata(weights.config)) {
    writer.SetMetadata(key, std::move(value));
  }
  for (const model::TensorRow& spec : model::ModelRows(weights.config)) {
    const auto it = weights.tensors.find(spec.name);
    if (it == weights.tensors.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("writing checkpoint ", path, ": tensor '", spec.name, "' is missing"));
    }
    if (it->second.shape != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat("writing checkpoint ", path, ": tensor '", spec.name, "' has shape ",
                       ShapeString(it->second.shape), ", expected ", ShapeString(spec.shape)));
    }
    RETURN_IF_ERROR(writer.Add(it->second.View(spec.name)));
  }
  return writer.Finish().status();
}

absl::StatusOr<Gpt2Weights> ReadGpt2Checkpoint(const std::string& path) {
  ASSIGN_OR_RETURN(SafetensorsReader reader, SafetensorsReader::Open(path));
  const std::string where = absl::StrCat("checkpoint ", path);
  Gpt2Weights weights;
  ASSIGN_OR_RETURN(weights.config, ModelConfigFromMetadata(reader.metadata(), where));
  const std::vector<model::TensorRow> specs = model::ModelRows(weights.config);
  for (const model::TensorRow& spec : specs) {
    ASSIGN_OR_RETURN(HostTensor tensor, reader.ReadFloat(spec.name));
    if (tensor.shape != spec.shape) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": tensor '", spec.name, "' has shape ", ShapeString(tensor.shape),
                       ", expected ", ShapeString(spec.shape), " for the config in its metadata"));
    }
    weights.tensors.emplace(spec.name, std::move(tensor));
  }
  if (reader.tensors().size() != specs.size()) {
    for (const auto& [name, info] : reader.tensors()) {
      if (!weights.tensors.contains(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": unexpected tensor '", name, "' for a GPT-2 of this config"));
      }
    }
  }
  return weights;
}

}  // namespace shardline::checkpoint
