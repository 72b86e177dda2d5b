#include "kernels/cpu/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"

namespace shardline::kernels::cpu {
namespace {
constexpr int kExpBlock = 1024;  // logits per ExpShiftedInto call
}  // namespace

void CrossEntropyLocalStats(float* local_max, float* local_sumexp, float* target_logit,
                            const float* logits, const int32_t* targets, int N, int Vs, int v0) {
#pragma omp parallel for schedule(static) if (int64_t{N} * Vs >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float* row = logits + int64_t{n} * Vs;
    // Not std::fmax: its NaN rule keeps the loop scalar, a libm call per logit (2% of the default
    // job's step); a NaN logit poisons the row through the exponentials all the same.
    float max = -INFINITY;
#pragma omp simd reduction(max : max)
    for (int j = 0; j < Vs; ++j) max = row[j] > max ? row[j] : max;
    // exp of a block at a time (vector_math.h), summed in order.
    float sum = 0.0f;
    float e[kExpBlock];
    for (int j0 = 0; j0 < Vs; j0 += kExpBlock) {
      const int m = std::min(kExpBlock, Vs - j0);
      ExpShiftedInto(e, row + j0, max, m);
      for (int j = 0; j < m; ++j) sum += e[j];
    }
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
    float e[kExpBlock];
    for (int j0 = 0; j0 < Vs; j0 += kExpBlock) {
      const int m = std::min(kExpBlock, Vs - j0);
      ExpShiftedInto(e, row + j0, z, m);
      for (int j = 0; j < m; ++j) drow[j0 + j] += g * e[j];
    }
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
