// Linear layers on the CPU: y = x·Wᵀ + b through OpenBLAS sgemm, and the separate bias add a
// row-parallel linear needs (its bias is added once, after the all-reduce).
//
// Conventions for every kernel in kernels/cpu/: f32, row-major, explicit sizes, pointers to
// contiguous arrays; sizes are trusted (validate with ExpectShape first); backward kernels
// ACCUMULATE (+=) into every gradient they write, and skip a gradient whose pointer is nullptr.
#pragma once

namespace shardline::kernels::cpu {

// out is (N,OC), inp is (N,C), weight is (OC,C) (PyTorch's nn.Linear layout), bias is (OC) or null.
// out = inp·weightᵀ + bias, overwriting out.
void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int C, int OC);

// dout is (N,OC). dinp (N,C) += dout·weight; dweight (OC,C) += doutᵀ·inp; dbias (OC) += Σ_n dout.
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int C, int OC);

// out is (N,C), bias is (C): out[n,:] += bias, in place.
void BiasAddForward(float* out, const float* bias, int N, int C);
// dbias (C) += Σ_n dout[n,:]. (The gradient of the input is dout itself.)
void BiasAddBackward(float* dbias, const float* dout, int N, int C);

}  // namespace shardline::kernels::cpu
