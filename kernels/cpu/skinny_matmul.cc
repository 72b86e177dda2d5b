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
// the row blocks go over them.
constexpr int kColumnBlock = 32;

// The sixteen-lane body takes weight rows four at a time (kWeightRows) and, while those four
// rows sit in L1, every block of up to four input rows (kRowBlock): 16 accumulators, and per 16 k
// 4 weight loads and 4 input loads for 16 FMAs. Past four input rows, the first pass over a weight
// row, the one that waits for memory, takes up to eight input rows (kStreamRowBlock) by two
// weight rows (16 accumulators, 10 loads per 16 FMAs): the FMAs of eight rows then hide the
// memory's latency, where four rows' passes were one memory-bound pass and one compute-bound
// after it (perf: the stalls sat on the weights' loads). On the Zen 4 EPYC, 2 threads, paired
// runs: a GPT-2-small decode step of 8 sequences 19.6-19.9 ms against 23.7-24.2
// (bench/decode_step_bench), its products at 6 rows 15.6-16.8 ms against 18.7-19.1
// (bench/skinny_matmul_bench), and 12 to 128 rows within the noise of before. With the weights
// already in cache the two-by-eight body alone ran at half the FMA peak, hence four by four after
// the first pass.
constexpr int kWeightRows = 4;
constexpr int kRowBlock = 4;
constexpr int kStreamRowBlock = 8;
// The weights are streamed from memory once per product, and the FMAs keep the core too busy for
// the hardware prefetcher alone to keep enough of them in flight: the rows kPrefetchRows ahead are
// asked into L2, a cache line per 16 k. On a 2-core AMD EPYC (Zen 4) a decode step of GPT-2 small
// at 8 rows took 25.6 ms with the first body, 25.2 ms with this one without prefetching, 21.8 ms
// prefetching 8 rows ahead into L1 and 18.1 ms 32 rows ahead into L2 (27 GB/s of weights, where a
// plain read of memory gives 29-30 GB/s) (bench/skinny_matmul_bench); 64 rows ahead were no
// better.
constexpr int kPrefetchRows = 32;

// Input rows [0, M) of out for the weight rows w[0..W-1] (the same row repeated past the block's
// end), their outputs at columns n..n+W-1 (`rows` of them real), asking for the W rows at
// `prefetch` (null: none) into L2. Each output is one dot product: 16 lanes over k, then the
// lanes' sum, whatever W, M and the grouping, so a row's bits do not depend on its batch.
template <int W, int M>
__attribute__((target("avx512f"))) void Rows(float* out, const float* inp, const float* const* w,
                                             const float* prefetch, const float* bias, int C,
                                             int OC, int n, int rows) {
  constexpr int kWeightRows = W;
  __m512 acc[kWeightRows][M];
  for (int r = 0; r < kWeightRows; ++r) {
    for (int m = 0; m < M; ++m) acc[r][m] = _mm512_setzero_ps();
  }
  int k = 0;
  for (; k + 16 <= C; k += 16) {
    if (prefetch != nullptr) {
      for (int r = 0; r < kWeightRows; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + int64_t{r} * C + k), _MM_HINT_T1);
      }
    }
    __m512 x[kWeightRows];
    for (int r = 0; r < kWeightRows; ++r) x[r] = _mm512_loadu_ps(w[r] + k);
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_loadu_ps(inp + int64_t{m} * C + k);
      for (int r = 0; r < kWeightRows; ++r) acc[r][m] = _mm512_fmadd_ps(a, x[r], acc[r][m]);
    }
  }
  if (k < C) {
    const __mmask16 lanes = TailMask16(C - k);
    __m512 x[kWeightRows];
    for (int r = 0; r < kWeightRows; ++r) x[r] = _mm512_maskz_loadu_ps(lanes, w[r] + k);
    for (int m = 0; m < M; ++m) {
      const __m512 a = _mm512_maskz_loadu_ps(lanes, inp + int64_t{m} * C + k);
      for (int r = 0; r < kWeightRows; ++r) acc[r][m] = _mm512_fmadd_ps(a, x[r], acc[r][m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    float* row = out + int64_t{m} * OC + n;
    for (int r = 0; r < rows; ++r) {
      row[r] = _mm512_reduce_add_ps(acc[r][m]) + (bias != nullptr ? bias[n + r] : 0.0f);
    }
  }
}

using RowsFn = void (*)(float*, const float*, const float* const*, const float*, const float*, int,
                        int, int, int);
constexpr RowsFn kRows[kRowBlock + 1] = {nullptr, Rows<4, 1>, Rows<4, 2>, Rows<4, 3>, Rows<4, 4>};
constexpr int kStreamWeightRows = 2;
constexpr RowsFn kStreamRows[kStreamRowBlock + 1] = {nullptr,    Rows<2, 1>, Rows<2, 2>,
                                                     Rows<2, 3>, Rows<2, 4>, Rows<2, 5>,
                                                     Rows<2, 6>, Rows<2, 7>, Rows<2, 8>};

// The eight-lane twin, for AVX2 CPUs (Zen 2 and 3, Xeons before Skylake-SP): 16 ymm registers
// hold two weight rows, the accumulators of 4 input rows for each and an input load, so it takes
// weight rows two at a time and, while they sit in L1, every block of up to 4 input rows, asking
// for the rows kPrefetchRows ahead into L2 as the sixteen-lane body does (on the Zen 4 with
// --avx2: a GPT-2-small decode step of 8 rows in 22.5 ms, of one row in 12.9 ms, against 32.1 and
// 23.7 ms with the input rows' blocks outside and the next pair prefetched into L1).
constexpr int kWeightRows8 = 2;

// The lanes' sum in a fixed order (halves, then pairs, then the last two).
__attribute__((target("avx2"))) inline float Sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}

template <int M>
__attribute__((target("avx2,fma"))) void Rows8(float* out, const float* inp, const float* const* w,
                                               const float* prefetch, const float* bias, int C,
                                               int OC, int n, int rows) {
  __m256 acc[kWeightRows8][M];
  for (int r = 0; r < kWeightRows8; ++r) {
    for (int m = 0; m < M; ++m) acc[r][m] = _mm256_setzero_ps();
  }
  int k = 0;
  for (; k + 8 <= C; k += 8) {
    if (prefetch != nullptr && (k & 15) == 0) {  // a cache line per 16 k
      for (int r = 0; r < kWeightRows8; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + int64_t{r} * C + k), _MM_HINT_T1);
      }
    }
    __m256 x[kWeightRows8];
    for (int r = 0; r < kWeightRows8; ++r) x[r] = _mm256_loadu_ps(w[r] + k);
    for (int m = 0; m < M; ++m) {
      const __m256 a = _mm256_loadu_ps(inp + int64_t{m} * C + k);
      for (int r = 0; r < kWeightRows8; ++r) acc[r][m] = _mm256_fmadd_ps(a, x[r], acc[r][m]);
    }
  }
  if (k < C) {
    const __m256i lanes = TailMask8(C - k);
    __m256 x[kWeightRows8];
    for (int r = 0; r < kWeightRows8; ++r) x[r] = _mm256_maskload_ps(w[r] + k, lanes);
    for (int m = 0; m < M; ++m) {
      const __m256 a = _mm256_maskload_ps(inp + int64_t{m} * C + k, lanes);
      for (int r = 0; r < kWeightRows8; ++r) acc[r][m] = _mm256_fmadd_ps(a, x[r], acc[r][m]);
    }
  }
  for (int m = 0; m < M; ++m) {
    float* row = out + int64_t{m} * OC + n;
    for (int r = 0; r < rows; ++r) {
      row[r] = Sum8(acc[r][m]) + (bias != nullptr ? bias[n + r] : 0.0f);
    }
  }
}

constexpr RowsFn kRows8[kRowBlock + 1] = {nullptr, Rows8<1>, Rows8<2>, Rows8<3>, Rows8<4>};

// Rows [0, N) of out for the weight rows [n0, n1), `group` weight rows at a time by `rows_fn`;
// `stream_rows` (null: none) takes the first pass over each group when N > kRowBlock, two weight
// rows at a time.
void Columns(const RowsFn* rows_fn, const RowsFn* stream_rows, int group, float* out,
             const float* inp, const float* weight, const float* bias, int N, int C, int OC, int n0,
             int n1) {
  const bool stream_pass = stream_rows != nullptr && N > kRowBlock;
  for (int n = n0; n < n1; n += group) {
    const int rows = std::min(group, n1 - n);
    const float* w[kWeightRows];
    for (int r = 0; r < group; ++r) w[r] = weight + int64_t{n + std::min(r, rows - 1)} * C;
    // Only the first pass over these rows reads memory; the prefetch stops at the matrix's end.
    const float* prefetch =
        n + kPrefetchRows + group <= OC ? weight + int64_t{n + kPrefetchRows} * C : nullptr;
    int m0 = 0;
    if (stream_pass) {
      const int M = std::min(kStreamRowBlock, N);
      for (int pair = 0; pair < rows; pair += kStreamWeightRows) {
        stream_rows[M](out, inp, w + pair,
                       prefetch == nullptr ? nullptr : prefetch + int64_t{pair} * C, bias, C, OC,
                       n + pair, std::min(kStreamWeightRows, rows - pair));
      }
      m0 = M;
    }
    for (; m0 < N; m0 += kRowBlock) {
      rows_fn[std::min(kRowBlock, N - m0)](out + int64_t{m0} * OC, inp + int64_t{m0} * C, w,
                                           m0 == 0 ? prefetch : nullptr, bias, C, OC, n, rows);
    }
  }
}

}  // namespace

bool SkinnyMatmulAvailable() { return WideVectors() || Avx2Vectors(); }

int SkinnyMatmulMaxRows(int64_t weight_bytes) {
  if (WideVectors()) return weight_bytes >= kSkinnyStreamedBytes ? kSkinnyMaxRows : 16;
  return Avx2Vectors() ? 16 : 0;
}

void SkinnyMatmulForward(float* out, const float* inp, const float* weight, const float* bias,
                         int N, int C, int OC) {
  if (N < 1 || N > kSkinnyMaxRows || C < 1 || !SkinnyMatmulAvailable()) {
    MatmulForward(out, inp, weight, bias, N, C, OC);
    return;
  }
  const bool wide = WideVectors();
  const int blocks = (OC + kColumnBlock - 1) / kColumnBlock;
  // Threads own disjoint blocks of output columns: no reduction, and the same bits for any count.
#pragma omp parallel for schedule(static) if (int64_t{N} * C * OC >= 8 * kMinParallelWork)
  for (int block = 0; block < blocks; ++block) {
    const int n0 = block * kColumnBlock;
    const int n1 = std::min(OC, n0 + kColumnBlock);
    if (wide) {
      Columns(kRows, kStreamRows, kWeightRows, out, inp, weight, bias, N, C, OC, n0, n1);
    } else {
      Columns(kRows8, nullptr, kWeightRows8, out, inp, weight, bias, N, C, OC, n0, n1);
    }
  }
}

void LinearForward(float* out, const float* inp, const float* weight, const PackedWeight* packed,
                   const float* bias, int N, int C, int OC) {
  // MKL's packed GEMM keeps the products past 16 rows it was measured on (the Xeon).
  const bool use_packed = packed != nullptr && N > 16 && N <= packed->max_rows();
  if (!use_packed &&
      N <= SkinnyMatmulMaxRows(int64_t{C} * OC * static_cast<int64_t>(sizeof(float)))) {
    SkinnyMatmulForward(out, inp, weight, bias, N, C, OC);
    return;
  }
  if (!use_packed) {
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
