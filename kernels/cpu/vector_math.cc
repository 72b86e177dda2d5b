#include "kernels/cpu/vector_math.h"

#include <immintrin.h>
#include <sleef.h>

#include <algorithm>
#include <atomic>
#include <cmath>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/vector_width.h"

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

__attribute__((target("avx512f"))) void ExpShifted16(float* y, const float* x, float shift,
                                                     int64_t n) {
  const __m512 s = _mm512_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = TailMask16(n - i);
    const __m512 v = _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), s);
    _mm512_mask_storeu_ps(y + i, lanes, Sleef_expf16_u10avx512f(v));
  }
}

__attribute__((target("avx512f"))) void Tanh16(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = TailMask16(n - i);
    _mm512_mask_storeu_ps(y + i, lanes, Sleef_tanhf16_u10avx512f(_mm512_maskz_loadu_ps(lanes, x + i)));
  }
}

// The eight-lane bodies, for AVX2 CPUs (avx2.h).
__attribute__((target("avx2,fma"))) void ExpShifted8(float* y, const float* x, float shift,
                                                     int64_t n) {
  const __m256 s = _mm256_set1_ps(shift);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i lanes = TailMask8(n - i);
    const __m256 v = _mm256_sub_ps(_mm256_maskload_ps(x + i, lanes), s);
    _mm256_maskstore_ps(y + i, lanes, Sleef_expf8_u10avx2(v));
  }
}

__attribute__((target("avx2,fma"))) void Tanh8(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i lanes = TailMask8(n - i);
    _mm256_maskstore_ps(y + i, lanes, Sleef_tanhf8_u10avx2(_mm256_maskload_ps(x + i, lanes)));
  }
}

// ArgMax in two passes: the largest value (NaN lanes never win: max_ps returns its second
// operand, the running maximum, when the first is NaN), then the first element equal to it. The
// first equal one is what max_element returns: its `<` keeps the first of equals (±0 too).
__attribute__((target("avx512f"))) int64_t ArgMax16(const float* x, int64_t n) {
  const __m512 lowest = _mm512_set1_ps(-INFINITY);
  __m512 best = lowest;
  for (int64_t i = 0; i < n; i += 16) {
    best = _mm512_max_ps(_mm512_mask_loadu_ps(lowest, TailMask16(n - i), x + i), best);
  }
  const __m512 target = _mm512_set1_ps(_mm512_reduce_max_ps(best));
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 equal =
        _mm512_mask_cmp_ps_mask(TailMask16(n - i), _mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
    if (equal != 0) return i + __builtin_ctz(equal);
  }
  return 0;  // every element NaN
}

__attribute__((target("avx2,fma"))) int64_t ArgMax8(const float* x, int64_t n) {
  const __m256 lowest = _mm256_set1_ps(-INFINITY);
  __m256 best = lowest;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) best = _mm256_max_ps(_mm256_loadu_ps(x + i), best);
  __m128 half = _mm_max_ps(_mm256_castps256_ps128(best), _mm256_extractf128_ps(best, 1));
  half = _mm_max_ps(half, _mm_movehl_ps(half, half));
  half = _mm_max_ss(half, _mm_shuffle_ps(half, half, 1));
  float largest = _mm_cvtss_f32(half);
  for (int64_t j = i; j < n; ++j) largest = x[j] > largest ? x[j] : largest;
  const __m256 target = _mm256_set1_ps(largest);
  for (i = 0; i + 8 <= n; i += 8) {
    const int equal =
        _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), target, _CMP_EQ_OQ));
    if (equal != 0) return i + __builtin_ctz(equal);
  }
  for (; i < n; ++i) {
    if (x[i] == largest) return i;
  }
  return 0;
}

std::atomic<bool> baseline_only{false};
std::atomic<bool> avx2_at_most{false};

}  // namespace

bool WideVectors() {
  static const bool has = __builtin_cpu_supports("avx512f");
  return has && !baseline_only.load(std::memory_order_relaxed) &&
         !avx2_at_most.load(std::memory_order_relaxed);
}

bool Avx2Vectors() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has && !baseline_only.load(std::memory_order_relaxed);
}

void UseBaselineVectors(bool baseline) { baseline_only.store(baseline); }

void UseAvx2AtMost(bool at_most) { avx2_at_most.store(at_most); }

void ExpShiftedInto(float* y, const float* x, float shift, int64_t n) {
  if (WideVectors()) return ExpShifted16(y, x, shift, n);
  if (Avx2Vectors()) return ExpShifted8(y, x, shift, n);
  const __m128 s = _mm_set1_ps(shift);
  Apply([s](__m128 v) { return Sleef_expf4_u10(_mm_sub_ps(v, s)); }, y, x, n);
}
void TanhInto(float* y, const float* x, int64_t n) {
  if (WideVectors()) return Tanh16(y, x, n);
  if (Avx2Vectors()) return Tanh8(y, x, n);
  Apply([](__m128 v) { return Sleef_tanhf4_u10(v); }, y, x, n);
}

int64_t ArgMax(const float* x, int64_t n) {
  // A NaN first is max_element's answer whatever follows; the vector bodies skip NaNs.
  if (n <= 0 || std::isnan(x[0])) return 0;
  if (WideVectors()) return ArgMax16(x, n);
  if (Avx2Vectors()) return ArgMax8(x, n);
  return std::max_element(x, x + n) - x;
}

}  // namespace shardline::kernels::cpu
