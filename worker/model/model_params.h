// ModelParams: a whole model's parameters on the host, in ParamLayout order — what a single-file
// checkpoint holds (training::SaveModel/LoadModel), what GPT-2's initialisation fills, and what
// inference on one rank can read in place (InferenceWeights::Of). It computes nothing: training
// runs the engine (sharded_gpt.h, one_rank_gpt.h on one rank), inference the paged forward
// (paged_inference.h), both over the same block and ends.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/model_config.h"
#include "worker/model/param_layout.h"

namespace shardline::model {

class ModelParams {
 public:
  // A model of `config` with every parameter 0. InvalidArgument when the config is invalid or the
  // engine cannot run it (ModelConfig::EngineSupports), naming the key.
  static absl::StatusOr<ModelParams> Zeros(const ModelConfig& config);
  // GPT-2's initialisation of `config` (FillGpt2Init): the values ShardedGpt::InitGpt2(seed)
  // gives, element for element.
  static absl::StatusOr<ModelParams> Gpt2Init(const ModelConfig& config, uint64_t seed);

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  std::span<float> values() { return values_; }
  std::span<const float> values() const { return values_; }

  // One named tensor, flattened row-major; NotFound names the tensor.
  absl::StatusOr<std::span<float>> Tensor(const std::string& name);
  absl::StatusOr<std::span<const float>> Tensor(const std::string& name) const;

  // Pointers to layer l's parameters and to the outer tensors (wte and lm_head the same when
  // tied), valid while this object lives (a move keeps them: the buffer moves with it).
  BlockParams Block(int layer) const;
  OuterParams Outer() const;

 private:
  explicit ModelParams(const ModelConfig& config);
  ModelConfig config_;
  ParamLayout layout_;
  std::vector<float> values_;
};

}  // namespace shardline::model
