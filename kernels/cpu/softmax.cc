#include "kernels/cpu/softmax.h"

#include <cmath>
#include <cstdint>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

void SoftmaxForward(float* out, const float* inp, int N, int C) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float* x = inp + int64_t{n} * C;
    float* y = out + int64_t{n} * C;
    float max = -INFINITY;
    for (int c = 0; c < C; ++c) max = std::fmax(max, x[c]);
    float sum = 0.0f;
    for (int c = 0; c < C; ++c) {
      y[c] = std::exp(x[c] - max);
      sum += y[c];
    }
    const float inv = 1.0f / sum;
    for (int c = 0; c < C; ++c) y[c] *= inv;
  }
}

void SoftmaxBackward(float* dinp, const float* dout, const float* out, int N, int C) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float* dy = dout + int64_t{n} * C;
    const float* y = out + int64_t{n} * C;
    float* dx = dinp + int64_t{n} * C;
    float dot = 0.0f;
    for (int c = 0; c < C; ++c) dot += dy[c] * y[c];
    for (int c = 0; c < C; ++c) dx[c] += y[c] * (dy[c] - dot);
  }
}

}  // namespace shardline::kernels::cpu
