// Internal to kernels/cpu: what the kernels' sixteen-lane bodies share (vector_width.h says when
// they run). Each such body carries `__attribute__((target("avx512f")))`; this file is compiled
// into baseline x86-64 translation units, so it holds only a function with the same attribute
// and declarations.
#pragma once

#include <immintrin.h>

#include <cstdint>

// SLEEF's 512-bit functions (1.0 ulp, as the 128-bit ones), which sleef.h declares only under
// __AVX512F__, which these files are not compiled with. The target attribute is for clang, which
// refuses a call passing a __m512 to a function not declared with AVX-512 ("changes the ABI")
// even from a body that has it; gcc needs none.
extern "C" __attribute__((target("avx512f"))) __m512 Sleef_expf16_u10avx512f(__m512);
extern "C" __attribute__((target("avx512f"))) __m512 Sleef_tanhf16_u10avx512f(__m512);

namespace shardline::kernels::cpu {

// The lanes of a group of `left` elements or more (16 at most): a tail goes through masked lanes
// of the same function, so its values get the same bits as they would in a full group.
__attribute__((target("avx512f"))) inline __mmask16 TailMask16(int64_t left) {
  return static_cast<__mmask16>(left >= 16 ? 0xFFFF : (1u << left) - 1);
}

}  // namespace shardline::kernels::cpu
