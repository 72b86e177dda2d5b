#include "kernels/cpu/optimizer.h"

#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

absl::Status AdamWUpdate(float* params, const float* grads, float* m, float* v, int64_t n,
                         const AdamWConfig& config, int64_t step) {
  auto prepared = AdamWPrepare(config, step);
  if (!prepared.ok()) return prepared.status();
  const float correction1 = prepared->first;
  const float correction2 = prepared->second;
  const float b1 = config.beta1;
  const float b2 = config.beta2;
  const float lr = config.learning_rate;
  const float wd = config.weight_decay;
  const float eps = config.eps;
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i];
    const float mi = b1 * m[i] + (1.0f - b1) * g;
    const float vi = b2 * v[i] + (1.0f - b2) * g * g;
    m[i] = mi;
    v[i] = vi;
    const float m_hat = mi / correction1;
    const float v_hat = vi / correction2;
    params[i] -= lr * (m_hat / (std::sqrt(v_hat) + eps) + wd * params[i]);
  }
  return absl::OkStatus();
}

double GradSumOfSquares(std::span<const std::span<const float>> grads) {
  double total = 0.0;
  for (std::span<const float> g : grads) {
    const float* data = g.data();
    const int64_t n = static_cast<int64_t>(g.size());
    double sum = 0.0;
#pragma omp parallel for simd schedule(static) reduction(+ : sum) if (n >= kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(data[i]) * data[i];
    total += sum;
  }
  return total;
}

void ClipGradients(std::span<const std::span<float>> grads, double norm, double max_norm) {
  if (!std::isfinite(norm)) return;
  const double coefficient = max_norm / (norm + 1e-6);
  if (coefficient >= 1.0) return;
  const float scale = static_cast<float>(coefficient);
  for (std::span<float> g : grads) {
    float* data = g.data();
    const int64_t n = static_cast<int64_t>(g.size());
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) data[i] *= scale;
  }
}

absl::StatusOr<double> GlobalNormClip(std::span<const std::span<float>> grads, double max_norm) {
  if (!(max_norm > 0.0)) {
    return absl::InvalidArgumentError("max_norm must be > 0, got " + std::to_string(max_norm));
  }
  std::vector<std::span<const float>> views(grads.begin(), grads.end());
  const double norm = std::sqrt(GradSumOfSquares(views));
  ClipGradients(grads, norm, max_norm);
  return norm;
}

}  // namespace shardline::kernels::cpu
