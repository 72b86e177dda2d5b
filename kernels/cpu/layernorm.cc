#include "kernels/cpu/layernorm.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, float eps) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t{n} * C;
    // Two passes (mean, then squared deviations) rather than E[x²]-E[x]², which cancels badly when
    // activations have a large mean. The sums run in vector lanes (omp simd: a fixed order of the
    // compiler's choosing, the same on every call): a serial sum waits out an add's latency per
    // element.
    float m = 0.0f;
#pragma omp simd reduction(+ : m)
    for (int c = 0; c < C; ++c) m += x[c];
    m /= static_cast<float>(C);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int c = 0; c < C; ++c) {
      const float d = x[c] - m;
      v += d * d;
    }
    v /= static_cast<float>(C);
    const float s = 1.0f / std::sqrt(v + eps);
    float* y = out + int64_t{n} * C;
    for (int c = 0; c < C; ++c) y[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C) {
  const bool parallel = int64_t{N} * C >= kMinParallelWork;
  const int max_threads = parallel ? omp_get_max_threads() : 1;
  // Per-thread partial sums: [thread][0..C) for dweight, [thread][C..2C) for dbias.
  std::vector<float> partial(static_cast<size_t>(max_threads) * 2 * C, 0.0f);
#pragma omp parallel num_threads(max_threads) if (parallel)
  {
    const int tid = omp_get_thread_num();
    const int threads = omp_get_num_threads();
    float* pw = partial.data() + static_cast<size_t>(tid) * 2 * C;
    float* pb = pw + C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const float* x = inp + int64_t{n} * C;
      const float* dy = dout + int64_t{n} * C;
      const float m = mean[n];
      const float s = rstd[n];
      // With norm = (x - m)·s and g = weight·dy: dx = s·(g - mean(g) - norm·mean(g·norm)).
      float g_mean = 0.0f;
      float g_norm_mean = 0.0f;
#pragma omp simd reduction(+ : g_mean, g_norm_mean)
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        const float g = weight[c] * dy[c];
        g_mean += g;
        g_norm_mean += g * norm;
      }
      g_mean /= static_cast<float>(C);
      g_norm_mean /= static_cast<float>(C);
      float* dx = dinp != nullptr ? dinp + int64_t{n} * C : nullptr;
      for (int c = 0; c < C; ++c) {
        const float norm = (x[c] - m) * s;
        pw[c] += norm * dy[c];
        pb[c] += dy[c];
        if (dx != nullptr) dx[c] += (weight[c] * dy[c] - g_mean - norm * g_norm_mean) * s;
      }
    }
    // The implicit barrier of the loop above makes every partial complete; columns are then summed
    // over threads in thread order.
#pragma omp for schedule(static)
    for (int c = 0; c < C; ++c) {
      float w = 0.0f;
      float b = 0.0f;
      for (int t = 0; t < threads; ++t) {
        w += partial[static_cast<size_t>(t) * 2 * C + c];
        b += partial[static_cast<size_t>(t) * 2 * C + C + c];
      }
      if (dweight != nullptr) dweight[c] += w;
      if (dbias != nullptr) dbias[c] += b;
    }
  }
}

}  // namespace shardline::kernels::cpu
