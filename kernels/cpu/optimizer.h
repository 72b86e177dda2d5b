// AdamW and global-norm gradient clipping over flat f32 arrays (conventions: see matmul.h).
//
// Both take plain spans, so ZeRO can run them on the shard of the parameters a rank owns. The
// global norm is split in two for the sharded case: each rank computes GradSumOfSquares of what it
// holds, the ranks all-reduce (sum) it, and ClipGradients scales with the global norm.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardline::kernels::cpu {

struct AdamWConfig {
  float learning_rate = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: params -= lr·weight_decay·params, independent of grads
};

// The bias corrections of update `step`: 1−β1^step and 1−β2^step, computed in double (1 − 0.999^step
// is tiny for early steps and loses digits in float). Every backend's AdamW uses these.
struct AdamWCorrections {
  float first = 1.0f;
  float second = 1.0f;
};
// InvalidArgument when step < 1 or a hyper-parameter is out of range (betas in [0,1), eps > 0,
// lr and weight_decay >= 0); otherwise the corrections of `step`.
// Inline so that the CUDA twin (another library) shares it without depending on this one.
inline absl::StatusOr<AdamWCorrections> AdamWPrepare(const AdamWConfig& config, int64_t step) {
  if (step < 1) {
    return absl::InvalidArgumentError("AdamW step must be >= 1, got " + std::to_string(step));
  }
  if (!(config.beta1 >= 0.0f && config.beta1 < 1.0f && config.beta2 >= 0.0f &&
        config.beta2 < 1.0f && config.eps > 0.0f && config.learning_rate >= 0.0f &&
        config.weight_decay >= 0.0f)) {
    return absl::InvalidArgumentError(
        "AdamW hyper-parameters out of range: lr=" + std::to_string(config.learning_rate) +
        " beta1=" + std::to_string(config.beta1) + " beta2=" + std::to_string(config.beta2) +
        " eps=" + std::to_string(config.eps) + " weight_decay=" + std::to_string(config.weight_decay));
  }
  AdamWCorrections corrections;
  corrections.first = static_cast<float>(
      1.0 - std::pow(static_cast<double>(config.beta1), static_cast<double>(step)));
  corrections.second = static_cast<float>(
      1.0 - std::pow(static_cast<double>(config.beta2), static_cast<double>(step)));
  return corrections;
}

// One AdamW step on params (n), with grads, and moments m, v (n, zero before the first step).
// `step` is the 1-based number of this update, used for bias correction:
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  m̂ = m/(1−β1^step);  v̂ = v/(1−β2^step);
//   params -= lr·(m̂/(√v̂ + eps) + weight_decay·params).
// InvalidArgument when step < 1 or a hyper-parameter is out of range (betas in [0,1), eps > 0,
// lr and weight_decay >= 0).
absl::Status AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                         const AdamWConfig& config, int64_t step);
// Sixteen lanes at a time where the CPU has AVX-512 (vector_width.h), with the scalar path's bits.

// Σ g² over every array, accumulated in double (a GPT-2-small gradient has 124M terms).
double GradSumOfSquares(std::span<const std::span<const float>> grads);

// Scales every gradient by min(1, max_norm/(norm + 1e-6)) (PyTorch's clip_grad_norm_). A norm
// that is not finite leaves the gradients untouched: the caller should skip the step.
void ClipGradients(std::span<const std::span<float>> grads, double norm, double max_norm);

// Single device: the global L2 norm of all gradients before clipping, after clipping them in place
// to max_norm. InvalidArgument when max_norm <= 0.
absl::StatusOr<double> GlobalNormClip(std::span<const std::span<float>> grads, double max_norm);

}  // namespace shardline::kernels::cpu
