// LayerNorm over the last dimension (conventions: see matmul.h).
#pragma once

namespace shardline::kernels::cpu {

inline constexpr float kLayerNormEps = 1e-5f;  // GPT-2's and PyTorch's default

// inp and out are (N,C) (N = B·T), weight and bias are (C). mean and rstd (N) are written for the
// backward pass (rstd = 1/sqrt(var + eps), var the biased variance).
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, float eps = kLayerNormEps);

// dout is (N,C); dinp (N,C), dweight (C), dbias (C) accumulate. Threads reduce dweight/dbias
// through per-thread partial sums added in thread order, so results are deterministic for a
// given OMP_NUM_THREADS.
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C);

}  // namespace shardline::kernels::cpu
