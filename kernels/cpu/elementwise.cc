#include "kernels/cpu/elementwise.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"

namespace shardline::kernels::cpu {
namespace {
constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;
// GELU runs in blocks: the tanh argument of a block, its tanh (vector_math.h), then the rest; the
// blocks are what the threads share out.
constexpr int64_t kGeluBlock = 1024;

// th[j] = tanh(√(2/π)·(x + 0.044715·x³)) for the block's x = inp[0 .. m).
void GeluTanh(float* th, const float* inp, int64_t m) {
  for (int64_t j = 0; j < m; ++j) {
    const float x = inp[j];
    th[j] = kGeluScale * (x + kGeluCubic * x * x * x);
  }
  TanhInto(th, th, m);
}
}  // namespace

void GeluForward(float* out, const float* inp, int64_t n) {
  const int64_t blocks = (n + kGeluBlock - 1) / kGeluBlock;
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kGeluBlock;
    const int64_t m = std::min(kGeluBlock, n - i0);
    float th[kGeluBlock];
    GeluTanh(th, inp + i0, m);
    for (int64_t j = 0; j < m; ++j) out[i0 + j] = 0.5f * inp[i0 + j] * (1.0f + th[j]);
  }
}

void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n) {
  const int64_t blocks = (n + kGeluBlock - 1) / kGeluBlock;
#pragma omp parallel for schedule(static) if (n >= kMinParallelWork)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t i0 = b * kGeluBlock;
    const int64_t m = std::min(kGeluBlock, n - i0);
    float th[kGeluBlock];
    GeluTanh(th, inp + i0, m);
    for (int64_t j = 0; j < m; ++j) {
      const float x = inp[i0 + j];
      const float sech2 = 1.0f - th[j] * th[j];
      const float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
      dinp[i0 + j] += (0.5f * (1.0f + th[j]) + 0.5f * x * sech2 * du) * dout[i0 + j];
    }
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
