// Row softmax over the last dimension (conventions: see matmul.h). Attention does its own softmax
// online (attention.h); this one is for heads and tests that want probabilities.
#pragma once

namespace shardline::kernels::cpu {

// out, inp are (N,C): out[n,:] = softmax(inp[n,:]), computed relative to the row max.
void SoftmaxForward(float* out, const float* inp, int N, int C);
// dinp (N,C) += out ⊙ (dout − Σ_c dout·out), with out the forward result.
void SoftmaxBackward(float* dinp, const float* dout, const float* out, int N, int C);

}  // namespace shardline::kernels::cpu
