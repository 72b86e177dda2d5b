// Which vector width the CPU kernels' hand-vectorised loops run at. The binary targets baseline
// x86-64 (no -march: it runs on every node of a cluster), whose vectors are four floats wide;
// the hot elementwise loops (GELU, AdamW, exp and tanh) also have sixteen-lane AVX-512 bodies,
// each with its own target attribute, chosen here at run time.
#pragma once

namespace shardline::kernels::cpu {

// True where the CPU has AVX-512F, unless UseBaselineVectors(true).
bool WideVectors();

// true: the four-lane paths everywhere (tests cover the path of a CPU without AVX-512 with it,
// and compare the two).
void UseBaselineVectors(bool baseline);

}  // namespace shardline::kernels::cpu
