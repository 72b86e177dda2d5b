// Which vector width the CPU kernels' hand-vectorised loops run at. The binary targets baseline
// x86-64 (no -march: it runs on every node of a cluster), whose vectors are four floats wide;
// the hot elementwise loops (GELU, LayerNorm, AdamW, exp and tanh) also have sixteen-lane AVX-512
// bodies, each with its own target attribute, chosen here at run time.
#pragma once

namespace shardline::kernels::cpu {

// True where the CPU has AVX-512F, unless UseBaselineVectors(true) or UseAvx2AtMost(true).
bool WideVectors();

// True where the CPU has AVX2 and FMA, unless UseBaselineVectors(true). Kernels with an
// eight-lane body (skinny_matmul.h, vector_math.h, AdamW) take it where WideVectors() is false.
bool Avx2Vectors();

// true: the four-lane paths everywhere (tests cover the path of a CPU without AVX-512 with it,
// and compare the two).
void UseBaselineVectors(bool baseline);

// true: no sixteen-lane paths (tests cover the eight-lane bodies on an AVX-512 CPU with it).
void UseAvx2AtMost(bool at_most);

}  // namespace shardline::kernels::cpu
