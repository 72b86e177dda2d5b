#include "kernels/cpu/skinny_matmul.h"

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/avx2.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_width.h"

namespace shardline::kernels::cpu {
namespace {

// Weight rows a thread takes at a time: 32 rows of 3072 floats are 384 KiB, which stay in L2 while
// the row blocks of 8 go over them.
constexpr int kColumnBlock = 32;
constexpr int kRowBlock = 8;

// Rows [0, M) of out for the weight rows [n0, n1): each pair of weight rows is loaded once per 16
// k and multiplied into every row's two accumulators.
template <int M>
__attribute__((target("avx512f"))) void Columns(float* out, const float* inp, const float* weight,
                                                const float* bias, int C, int OC, int n0,
                                                int n1) {
  for (int n = n0; n < n1; n += 2) {
    const bool pair = n + 1 < n1;
    const float* w0 = weight + int64_t{n} * C;
    const float* w1 = pair ? w0 + C : w0;
    __m512 acc0[M], acc1[M];
    for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm512_setzero_ps();
    int k = 0;
    // The next pair's rows, a cache line per 16 k: four weight streams in flight, not two.
    const float* next = n + 2 < n1 ? w0 + 2 * int64_t{C} : w0;
    for (; k + 16 <= C; k += 16) {
      _mm_prefetch(reinterpret_cast<const char*>(next + k), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(next + C + k), _MM_HINT_T0);
      const __m512 x0 = _mm512_loadu_ps(w0 + k);
      const __m512 x1 = _mm512_loadu_ps(w1 + k);
      for (int m = 0; m < M; ++m) {
        const __m512 a = _mm512_loadu_ps(inp + int64_t{m} * C + k);
        acc0[m] = _mm512_fmadd_ps(a, x0, acc0[m]);
        acc1[m] = _mm512_fmadd_ps(a, x1, acc1[m]);
      }
    }
    if (k < C) {
      const __mmask16 lanes = TailMask16(C - k);
      const __m512 x0 = _mm512_maskz_loadu_ps(lanes, w0 + k);
      const __m512 x1 = _mm512_maskz_loadu_ps(lanes, w1 + k);
      for (int m = 0; m < M; ++m) {
        const __m512 a = _mm512_maskz_loadu_ps(lanes, inp + int64_t{m} * C + k);
        acc0[m] = _mm512_fmadd_ps(a, x0, acc0[m]);
        acc1[m] = _mm512_fmadd_ps(a, x1, acc1[m]);
      }
    }
    const float b0 = bias != nullptr ? bias[n] : 0.0f;
    const float b1 = bias != nullptr && pair ? bias[n + 1] : 0.0f;
    for (int m = 0; m < M; ++m) {
      float* row = out + int64_t{m} * OC;
      row[n] = _mm512_reduce_add_ps(acc0[m]) + b0;
      if (pair) row[n + 1] = _mm512_reduce_add_ps(acc1[m]) + b1;
    }
  }
}

// The eight-lane twin of Columns, for AVX2 CPUs (Zen 2 and 3, Xeons before Skylake-SP): 16 ymm
// registers hold 4 rows' two accumulators and the loads, so it takes rows 4 at a time
// (kRowBlock8); a block's 32 weight rows stay in L2 while the row blocks go over them.
constexpr int kRowBlock8 = 4;

// The lanes' sum in a fixed order (halves, then pairs, then the last two).
__attribute__((target("avx2"))) inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <int M>
__attribute__((target("avx2,fma"))) void Columns8(float* out, const float* inp, const float* weight,
                                                  const float* bias, int C, int OC, int n0,
                                                  int n1) {
  for (int n = n0; n < n1; n += 2) {
    const bool pair = n + 1 < n1;
    const float* w0 = weight + int64_t{n} * C;
    const float* w1 = pair ? w0 + C : w0;
    __m256 acc0[M], acc1[M];
    for (int m = 0; m < M; ++m) acc0[m] = acc1[m] = _mm256_setzero_ps();
    int k = 0;
    const float* next = n + 2 < n1 ? w0 + 2 * int64_t{C} : w0;
    for (; k + 8 <= C; k += 8) {
      if ((k & 15) == 0) {  // a cache line per 16 k
        _mm_prefetch(reinterpret_cast<const char*>(next + k), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(next + C + k), _MM_HINT_T0);
      }
      const __m256 x0 = _mm256_loadu_ps(w0 + k);
      const __m256 x1 = _mm256_loadu_ps(w1 + k);
      for (int m = 0; m < M; ++m) {
        const __m256 a = _mm256_loadu_ps(inp + int64_t{m} * C + k);
        acc0[m] = _mm256_fmadd_ps(a, x0, acc0[m]);
        acc1[m] = _mm256_fmadd_ps(a, x1, acc1[m]);
      }
    }
    if (k < C) {
      const __m256i lanes = TailMask8(C - k);
      const __m256 x0 = _mm256_maskload_ps(w0 + k, lanes);
      const __m256 x1 = _mm256_maskload_ps(w1 + k, lanes);
      for (int m = 0; m < M; ++m) {
        const __m256 a = _mm256_maskload_ps(inp + int64_t{m} * C + k, lanes);
        acc0[m] = _mm256_fmadd_ps(a, x0, acc0[m]);
        acc1[m] = _mm256_fmadd_ps(a, x1, acc1[m]);
      }
    }
    const float b0 = bias != nullptr ? bias[n] : 0.0f;
    const float b1 = bias != nullptr && pair ? bias[n + 1] : 0.0f;
    for (int m = 0; m < M; ++m) {
      float* row = out + int64_t{m} * OC;
      row[n] = Sum8(acc0[m]) + b0;
      if (pair) row[n + 1] = Sum8(acc1[m]) + b1;
    }
  }
}

using ColumnsFn = void (*)(float*, const float*, const float*, const float*, int, int, int, int);
constexpr ColumnsFn kColumns[kRowBlock + 1] = {nullptr,    Columns<1>, Columns<2>,
                                               Columns<3>, Columns<4>, Columns<5>,
                                               Columns<6>, Columns<7>, Columns<8>};
constexpr ColumnsFn kColumns8[kRowBlock8 + 1] = {nullptr, Columns8<1>, Columns8<2>, Columns8<3>,
                                                 Columns8<4>};

}  // namespace

bool SkinnyMatmulAvailable() { return WideVectors() || Avx2Vectors(); }

void SkinnyMatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC) {
  if (N < 1 || N > kSkinnyMaxRows || C < 1 || !SkinnyMatmulAvailable()) {
    MatmulForward(out, inp, weight, bias, N, C, OC);
    return;
  }
  const bool wide = WideVectors();
  const ColumnsFn* columns = wide ? kColumns : kColumns8;
  const int row_block = wide ? kRowBlock : kRowBlock8;
  const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
  // Threads own disjoint blocks of output columns: no reduction, and the same bits for any count.
#pragma omp parallel for schedule(static) if (int64_t{N} * C * OC >= 8 * kMinParallelWork)
  for (int block = 0; block < blocks; ++block) {
    const int n0 = block * kColumnBlock;
    const int n1 = std::min(OC, n0 + kColumnBlock);
    for (int m0 = 0; m0 < N; m0 += row_block) {
      const int rows = std::min(row_block, N - m0);
      columns[rows](out + int64_t{m0} * OC, inp + int64_t{m0} * C, weight, bias, C, OC, n0, n1);
    }
  }
}

void LinearForward(float* out, const float* inp, const float* weight, const PackedWeight* packed,
                   const float* bias, int N, int C, int OC) {
  if (N <= kSkinnyMaxRows && SkinnyMatmulAvailable()) {
    SkinnyMatmulForward(out, inp, weight, bias, N, C, OC);
    return;
  }
  if (packed == nullptr || N < 2 || N > packed->max_rows()) {
    MatmulForward(out, inp, weight, bias, N, C, OC);
    return;
  }
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + int64_t{n} * OC);
    beta = 1.0f;
  }
  packed->Multiply(out, inp, N, beta);
}

}  // namespace shardline::kernels::cpu
