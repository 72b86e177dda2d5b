// AdamW and global-norm gradient clipping over flat f32 arrays (conventions: see matmul.h).
//
// Both take plain spans, so ZeRO can run them on the shard of the parameters a rank owns. The
// global norm is split in two for the sharded case: each rank computes GradSumOfSquares of what it
// holds, the ranks all-reduce (sum) it, and ClipGradients scales with the global norm.
#pragma once

#include <cstdint>
#include <span>

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

// One AdamW step on params (n), with grads, and moments m, v (n, zero before the first step).
// `step` is the 1-based number of this update, used for bias correction:
//   m = β1·m + (1−β1)·g;  v = β2·v + (1−β2)·g²;  m̂ = m/(1−β1^step);  v̂ = v/(1−β2^step);
//   params -= lr·(m̂/(√v̂ + eps) + weight_decay·params).
// InvalidArgument when step < 1 or a hyper-parameter is out of range (betas in [0,1), eps > 0,
// lr and weight_decay >= 0).
absl::Status AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                         const AdamWConfig& config, int64_t step);

// Σ g² over every array, accumulated in double (a GPT-2-small gradient has 124M terms).
double GradSumOfSquares(std::span<const std::span<const float>> grads);

// Scales every gradient by min(1, max_norm/(norm + 1e-6)) (PyTorch's clip_grad_norm_). A norm
// that is not finite leaves the gradients untouched: the caller should skip the step.
void ClipGradients(std::span<const std::span<float>> grads, double norm, double max_norm);

// Single device: the global L2 norm of all gradients before clipping, after clipping them in place
// to max_norm. InvalidArgument when max_norm <= 0.
absl::StatusOr<double> GlobalNormClip(std::span<const std::span<float>> grads, double max_norm);

}  // namespace shardline::kernels::cpu
