// Pointwise ops: GELU (tanh form, as GPT-2), SwiGLU's gating (Llama's MLP) and the residual add
// (conventions: see matmul.h).
#pragma once

#include <cstdint>

namespace shardline::kernels::cpu {

// out, inp are (n): out = 0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))). Sixteen lanes at a time
// where the CPU has AVX-512, else four (vector_width.h).
void GeluForward(float* out, const float* inp, int64_t n);
// dinp (n) += gelu'(inp)·dout.
void GeluBackward(float* dinp, const float* inp, const float* dout, int64_t n);

// out (n) = silu(gate)·up with silu(x) = x·sigmoid(x): Llama's MLP between its gate/up and down
// projections (gate and up are the two column-parallel products, (n) each).
void SwiGluForward(float* out, const float* gate, const float* up, int64_t n);
// dgate (n) += dout·up·silu'(gate); dup (n) += dout·silu(gate) (either may be null).
void SwiGluBackward(float* dgate, float* dup, const float* gate, const float* up, const float* dout,
                    int64_t n);

// out = inp1 + inp2, all (n). out may alias either input (x = x + f(x) in place).
void ResidualForward(float* out, const float* inp1, const float* inp2, int64_t n);
// dinp1 += dout; dinp2 += dout (either may be null).
void ResidualBackward(float* dinp1, float* dinp2, const float* dout, int64_t n);

}  // namespace shardline::kernels::cpu
