#include "kernels/cpu/rmsnorm.h"

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                    float eps) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t{n} * C;
    float* y = out + int64_t{n} * C;
    // The sum of squares in vector lanes (omp simd: a fixed order, the same on every call).
    float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
    for (int c = 0; c < C; ++c) squares += x[c] * x[c];
    const float s = 1.0f / std::sqrt(squares / static_cast<float>(C) + eps);
#pragma omp simd
    for (int c = 0; c < C; ++c) y[c] = x[c] * s * weight[c];
    rstd[n] = s;
  }
}

void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int N, int C) {
  const bool parallel = int64_t{N} * C >= kMinParallelWork;
  const int max_threads = parallel ? omp_get_max_threads() : 1;
  std::vector<float> partial(static_cast<size_t>(max_threads) * C, 0.0f);  // [thread][c]
#pragma omp parallel num_threads(max_threads) if (parallel)
  {
    const int tid = omp_get_thread_num();
    const int threads = omp_get_num_threads();
    float* pw = partial.data() + static_cast<size_t>(tid) * C;
#pragma omp for schedule(static)
    for (int n = 0; n < N; ++n) {
      const int64_t row = int64_t{n} * C;
      const float* x = inp + row;
      const float* dy = dout + row;
      const float s = rstd[n];
      float g_norm = 0.0f;
#pragma omp simd reduction(+ : g_norm)
      for (int c = 0; c < C; ++c) g_norm += weight[c] * dy[c] * (x[c] * s);
      const float g_norm_mean = g_norm / static_cast<float>(C);
      float* dx = dinp != nullptr ? dinp + row : nullptr;
#pragma omp simd
      for (int c = 0; c < C; ++c) {
        const float norm = x[c] * s;
        pw[c] += norm * dy[c];
        if (dx != nullptr) dx[c] += (weight[c] * dy[c] - norm * g_norm_mean) * s;
      }
    }
    // The loop's implicit barrier completes every partial; columns are summed in thread order.
    if (dweight != nullptr) {
#pragma omp for schedule(static)
      for (int c = 0; c < C; ++c) {
        float w = 0.0f;
        for (int t = 0; t < threads; ++t) w += partial[static_cast<size_t>(t) * C + c];
        dweight[c] += w;
      }
    }
  }
}

}  // namespace shardline::kernels::cpu
