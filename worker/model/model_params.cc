#include "worker/model/model_params.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/model/training_recipe.h"

namespace shardline::model {

ModelParams::ModelParams(const ModelConfig& config)
    : config_(config), layout_(config), values_(static_cast<size_t>(layout_.total()), 0.0f) {}

absl::StatusOr<ModelParams> ModelParams::Zeros(const ModelConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(config.EngineSupports());
  return ModelParams(config);
}

absl::StatusOr<ModelParams> ModelParams::Gpt2Init(const ModelConfig& config, uint64_t seed) {
  ASSIGN_OR_RETURN(ModelParams params, Zeros(config));
  FillGpt2Init(params.layout_, config.layers, seed, params.values_);
  return params;
}

absl::StatusOr<std::span<float>> ModelParams::Tensor(const std::string& name) {
  ASSIGN_OR_RETURN(std::span<const float> values, std::as_const(*this).Tensor(name));
  return std::span<float>(const_cast<float*>(values.data()), values.size());
}

absl::StatusOr<std::span<const float>> ModelParams::Tensor(const std::string& name) const {
  const ParamTensorInfo* info = layout_.Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("the model (", config_.DebugString(),
                                            ") has no parameter tensor '", name, "'"));
  }
  return std::span<const float>(values_).subspan(static_cast<size_t>(info->offset),
                                                 static_cast<size_t>(info->numel));
}

BlockParams ModelParams::Block(int layer) const {
  return layout_.Block(const_cast<float*>(values_.data()), layer);
}

OuterParams ModelParams::Outer() const { return layout_.Outer(const_cast<float*>(values_.data())); }

}  // namespace shardline::model
