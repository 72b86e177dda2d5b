// exp and tanh over arrays, and the index of an array's largest element, four lanes at a time
// through SLEEF (the SIMD Library for Evaluating Elementary Functions; max error 1.0 ulp, the same
// bits for a value wherever it sits in the array, so results depend on neither alignment nor thread
// count).
//
// Why a library: glibc's scalar expf/tanhf do not vectorise, and its vector variants (libmvec) are
// only declared under -ffast-math, which would loosen every other kernel's arithmetic. With the
// scalar calls GELU's tanh was 25-35% of a CPU transformer layer, and cross-entropy's exp 13% of a
// step of a 2-layer model with GPT-2's 50K vocabulary. PyTorch's CPU kernels use SLEEF for the same
// functions. Sixteen lanes (SLEEF's AVX-512 functions) where the CPU has AVX-512, eight (its AVX2
// ones) where it has AVX2 and FMA, else four (SSE: the binaries target baseline x86-64, no
// -march, as they run on every node), chosen at run time (vector_width.h); SLEEF picks the best
// 128-bit implementation for the CPU it runs on.
//
// Single-threaded: callers parallelise over rows or blocks. y may alias x.
#pragma once

#include <cstdint>

namespace shardline::kernels::cpu {

// y[i] = exp(x[i] − shift): softmax's and cross-entropy's exponentials, shifted by a row's max or
// log-sum-exp (the subtraction rounds as the scalar x[i] − shift does).
void ExpShiftedInto(float* y, const float* x, float shift, int64_t n);
void TanhInto(float* y, const float* x, int64_t n);  // y[i] = tanh(x[i])

// The index of the first largest of x[0..n), exactly as std::max_element (NaNs are never larger;
// a NaN at 0 is the answer when nothing compares larger than it): greedy sampling of a step's
// rows, 50 K logits each, which max_element's compare and branch per element made 4% of a
// decode step of GPT-2 small at 8 sequences. 0 for n <= 0.
int64_t ArgMax(const float* x, int64_t n);

}  // namespace shardline::kernels::cpu
