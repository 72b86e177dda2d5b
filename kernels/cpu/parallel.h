// Internal to kernels/cpu: when an OpenMP parallel region pays for itself.
//
// Kernels thread with OpenMP (`#pragma omp parallel for ... if(...)`): the loops are regular, the
// runtime's pool is already warm, and `if` lets small problems run inline. GEMM is left to the
// BLAS's own threads, except inside a region (the attention tiles), where MKL runs on the calling
// thread alone (blas.cc says why).
#pragma once

#include <cstdint>

namespace shardline::kernels::cpu {

// Below this many elements of work, waking the pool (a few microseconds) costs more than it saves.
inline constexpr int64_t kMinParallelWork = int64_t{1} << 15;

}  // namespace shardline::kernels::cpu
