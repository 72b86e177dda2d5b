#include "kernels/cpu/matmul.h"


#include <algorithm>
#include <cstdint>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC) {
  if (N == 0 || OC == 0) return;
  // Seeding out with the bias and letting sgemm accumulate (beta = 1) costs one write pass over
  // out instead of a write pass plus a read-modify-write pass afterwards. The seeding stays on this
  // thread: it is memory-bound, and OpenMP workers still spinning after a parallel region would
  // compete with OpenBLAS's threads for the cores just when sgemm starts.
  float beta = 0.0f;
  if (bias != nullptr) {
    for (int n = 0; n < N; ++n) std::copy(bias, bias + OC, out + int64_t{n} * OC);
    beta = 1.0f;
  }
  Sgemm()(CblasRowMajor, CblasNoTrans, CblasTrans, N, OC, C, 1.0f, inp, C, weight, C, beta,
              out, OC);
}

void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC) {
  if (dinp != nullptr && N > 0 && C > 0) {
    Sgemm()(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, C, OC, 1.0f, dout, OC, weight, C,
                1.0f, dinp, C);
  }
  if (dweight != nullptr && OC > 0 && C > 0) {
    Sgemm()(CblasRowMajor, CblasTrans, CblasNoTrans, OC, C, N, 1.0f, dout, OC, inp, C,
                1.0f, dweight, C);
  }
  if (dbias != nullptr) BiasAddBackward(dbias, dout, N, OC);
}

void BiasAddForward(float* out, const float* bias, int N, int C) {
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    float* row = out + int64_t{n} * C;
    for (int c = 0; c < C; ++c) row[c] += bias[c];
  }
}

void BiasAddBackward(float* dbias, const float* dout, int N, int C) {
  // Threads own disjoint column blocks and walk every row: no reduction buffers, no races, and the
  // sum order per column is fixed (deterministic whatever the thread count). 256 columns = 1 KiB
  // of accumulators per row step, which stays in L1.
  constexpr int kBlock = 256;
  const int blocks = (C + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (int64_t{N} * C >= kMinParallelWork)
  for (int blk = 0; blk < blocks; ++blk) {
    const int c0 = blk * kBlock;
    const int c1 = std::min(C, c0 + kBlock);
    float acc[kBlock] = {};
    for (int n = 0; n < N; ++n) {
      const float* row = dout + int64_t{n} * C;
      for (int c = c0; c < c1; ++c) acc[c - c0] += row[c];
    }
    for (int c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
  }
}

}  // namespace shardline::kernels::cpu
