#include "kernels/cpu/cross_entropy.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

void CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                            const float* logits, const int32_t* targets, int N, int Vs, int v0) {
#pragma omp parallel for schedule(static) if (int64_t{N} * Vs >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + int64_t{n} * Vs;
    float max = -INFINITY;
    for (int j = 0; j < Vs; ++j) max = std::fmax(max, row[j]);
    float sum = 0.0f;
    for (int j = 0; j < Vs; ++j) sum += std::exp(row[j] - max);
    local_max[n] = max;
    local_sumexp[n] = sum;
    const int32_t local = targets[n] - v0;
    target_logit[n] = targets[n] >= 0 && local >= 0 && local < Vs ? row[local] : 0.0f;
  }
}

void CrossEntropyRescaleSumExp(float* sumexp, const float* local_max, const float* global_max,
                               int N) {
  for (int n = 0; n < N; ++n) {
    // An empty shard (Vs = 0) has max −inf and sum 0: it contributes nothing, not NaN.
    if (sumexp[n] != 0.0f) sumexp[n] *= std::exp(local_max[n] - global_max[n]);
  }
}

void CrossEntropyLossFromStats(float* losses, float* lse, const float* global_max,
                               const float* global_sumexp, const float* target_logit,
                               const int32_t* targets, int N) {
  for (int n = 0; n < N; ++n) {
    lse[n] = global_max[n] + std::log(global_sumexp[n]);
    losses[n] = targets[n] < 0 ? 0.0f : lse[n] - target_logit[n];
  }
}

void CrossEntropyBackwardShard(float* dlogits, const float* logits, const float* lse,
                               const int32_t* targets, const float* dlosses, int N, int Vs, int v0) {
#pragma omp parallel for schedule(static) if (int64_t{N} * Vs >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    if (targets[n] < 0) continue;
    const float* row = logits + int64_t{n} * Vs;
    float* drow = dlogits + int64_t{n} * Vs;
    const float g = dlosses[n];
    const float z = lse[n];
    for (int j = 0; j < Vs; ++j) drow[j] += g * std::exp(row[j] - z);
    const int32_t local = targets[n] - v0;
    if (local >= 0 && local < Vs) drow[local] -= g;
  }
}

void CrossEntropyForward(float* losses, float* lse, const float* logits, const int32_t* targets,
                         int N, int V) {
  // One shard covering the vocabulary: its local max is the global max, so no rescale is needed.
  std::vector<float> max(N), sumexp(N), target(N);
  CrossEntropyLocalStats(max.data(), sumexp.data(), target.data(), logits, targets, N, V, 0);
  CrossEntropyLossFromStats(losses, lse, max.data(), sumexp.data(), target.data(), targets, N);
}

void CrossEntropyBackward(float* dlogits, const float* logits, const float* lse,
                          const int32_t* targets, const float* dlosses, int N, int V) {
  CrossEntropyBackwardShard(dlogits, logits, lse, targets, dlosses, N, V, 0);
}

}  // namespace shardline::kernels::cpu
