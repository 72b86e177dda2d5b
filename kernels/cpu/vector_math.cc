#include "kernels/cpu/vector_math.h"

#include <immintrin.h>
#include <sleef.h>

#include <algorithm>

namespace shardline::kernels::cpu {
namespace {

template <typename Fn>  // __m128 → __m128
void Apply(Fn fn, float* y, const float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(y + i, fn(_mm_loadu_ps(x + i)));
  if (i == n) return;
  // The tail through the same function, padded with zeros, so its values get the same bits as
  // they would in a full group.
  alignas(16) float lanes[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  std::copy(x + i, x + n, lanes);
  _mm_store_ps(lanes, fn(_mm_load_ps(lanes)));
  std::copy(lanes, lanes + (n - i), y + i);
}

}  // namespace

void ExpShiftedInto(float* y, const float* x, float shift, int64_t n) {
  const __m128 s = _mm_set1_ps(shift);
  Apply([s](__m128 v) { return Sleef_expf4_u10(_mm_sub_ps(v, s)); }, y, x, n);
}
void TanhInto(float* y, const float* x, int64_t n) {
  Apply([](__m128 v) { return Sleef_tanhf4_u10(v); }, y, x, n);
}

}  // namespace shardline::kernels::cpu
