// One transformer block on a CUDA device: the twin of worker/model/gpt_block.h, with the same
// buffers and the same order of operations, calling the kernels of kernels/cuda/ops.h instead of
// kernels/cpu/. Every pointer is a device pointer; the work is queued on `stream` and the calls
// return once it is queued. Single device only: there is no tensor-parallel all-reduce here yet.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "kernels/cuda/blas.h"
#include "worker/model/gpt_block.h"

namespace shardline::model::cuda {

// y (B,T,C) = block(x (B,T,C)), filling `acts` (see BlockForward).
absl::Status BlockForward(kernels::cuda::Blas& blas, const BlockDims& dims,
                          const BlockParams& params, const float* x, float* y,
                          const BlockActivations& acts, cudaStream_t stream);

// Accumulates into dx (B,T,C) and every tensor of `grads` (see BlockBackward); zeroes `scratch`
// first.
absl::Status BlockBackward(kernels::cuda::Blas& blas, const BlockDims& dims,
                           const BlockParams& params, const BlockParams& grads, const float* x,
                           const float* dy, float* dx, const BlockActivations& acts,
                           const BlockGradScratch& scratch, cudaStream_t stream);

}  // namespace shardline::model::cuda
