#include "kernels/cpu/elementwise.h"

#include <cmath>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {
namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
}  // namespace

void GeluForward(float* out, const float* inp, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    out[i] = 0.5f * x * (1.0f + std::tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const float x = inp[i];
    const float u = kGeluScale * (x + kGeluCubic * x * x * x);
    const float th = std::tanh(u);
    const float sech2 = 1.0f - th * th;
    const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    dinp[i] += (0.5f * (1.0f + th) + 0.5f * x * sech2 * du) * dout[i];
  }
}

void ResidualForward(float* out, const float* inp1, const float* inp2, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
  for (int64_t i = 0; i < n; ++i) out[i] = inp1[i] + inp2[i];
}

void ResidualBackward(float* dinp1, float* dinp2, const float* dout, int64_t n) {
  if (dinp1 != nullptr) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) dinp1[i] += dout[i];
  }
  if (dinp2 != nullptr) {
#pragma omp parallel for simd schedule(static) if (n >= kMinParallelWork)
    for (int64_t i = 0; i < n; ++i) dinp2[i] += dout[i];
  }
}

}  // namespace shardline::kernels::cpu
