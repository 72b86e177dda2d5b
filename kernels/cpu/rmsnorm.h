// RMSNorm over the last dimension, as Llama's (conventions: see matmul.h): no mean subtracted, no
// bias. The CUDA twin is kernels/cuda/ops.h's RmsNormForward/RmsNormBackward.
#pragma once

namespace shardline::kernels::cpu {

// inp and out are (N,C), weight (C): out = inp · rstd · weight with rstd = 1/sqrt(mean(inp²) + eps)
// per row, written to rstd (N) for the backward pass.
void RmsNormForward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                    float eps);

// dout is (N,C); dinp (N,C) and dweight (C) accumulate (either may be null). With norm = x·rstd
// and g = weight·dout: dinp = rstd·(g − norm·mean(g·norm)), dweight = Σ_rows norm·dout. dweight
// is reduced through per-thread partial sums added in thread order: deterministic for a given
// OMP_NUM_THREADS.
void RmsNormBackward(float* dinp, float* dweight, const float* dout, const float* inp,
                     const float* weight, const float* rstd, int N, int C);

}  // namespace shardline::kernels::cpu
