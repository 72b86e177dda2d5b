#include "worker/model/trainable_gpt.h"

#include "absl/strings/str_cat.h"
#include "worker/model/counter_rng.h"

namespace shardline::model {

void FillGpt2Init(const ParamLayout& layout, int layers, uint64_t seed, std::span<float> params) {
  for (const ParamTensorInfo& t : layout.tensors()) {
    const TensorInit init = TensorInit::Of(t.name, t.init, layers);
    float* p = params.data() + t.offset;
    const int64_t n = t.numel;
#pragma omp parallel for schedule(static) if (n >= (int64_t{1} << 15))
    for (int64_t i = 0; i < n; ++i) p[i] = init.Value(seed, static_cast<uint64_t>(i));
  }
}

absl::Status CheckStateSizes(int64_t num_params, std::span<const float> params,
                             std::span<const float> exp_avg, std::span<const float> exp_avg_sq,
                             const char* where) {
  const auto n = static_cast<size_t>(num_params);
  const bool moments_ok = (exp_avg.empty() && exp_avg_sq.empty()) ||
                          (exp_avg.size() == n && exp_avg_sq.size() == n);
  if (params.size() == n && moments_ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where, ": ", params.size(), " parameters, ",
                                                 exp_avg.size(), " and ", exp_avg_sq.size(),
                                                 " moments for a model of ", num_params,
                                                 " parameters"));
}

float MeanLoss(std::span<const float> losses, std::span<const int32_t> targets,
               std::span<float> dlosses) {
  double sum = 0.0;
  int64_t counted = 0;
  for (size_t n = 0; n < losses.size(); ++n) {
    if (targets[n] < 0) continue;
    sum += losses[n];
    ++counted;
  }
  const float scale = counted > 0 ? 1.0f / static_cast<float>(counted) : 0.0f;
  for (size_t n = 0; n < losses.size(); ++n) dlosses[n] = targets[n] < 0 ? 0.0f : scale;
  return counted > 0 ? static_cast<float>(sum / static_cast<double>(counted)) : 0.0f;
}

}  // namespace shardline::model
