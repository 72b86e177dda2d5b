// Internal to kernels/cpu: what the kernels' eight-lane bodies share (vector_width.h says when
// they run: AVX2 and FMA without AVX-512). Each such body carries its own target attribute, as the
// sixteen-lane ones do (avx512.h); this file is compiled into baseline x86-64 translation units,
// so it holds only functions with the same attribute and declarations.
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

// SLEEF's 256-bit AVX2 functions (1.0 ulp, as the 128-bit ones), which sleef.h declares only
// under __AVX2__, which these files are not compiled with. The target attribute is for clang, which
// refuses a call passing a __m256 to a function not declared with AVX ("changes the ABI") even
// from a body that has it; gcc needs none.
extern "C" __attribute__((target("avx2"))) __m256 Sleef_expf8_u10avx2(__m256);
extern "C" __attribute__((target("avx2"))) __m256 Sleef_tanhf8_u10avx2(__m256);

namespace shardline::kernels::cpu {

// The lanes of a group of `left` elements or more (8 at most), for _mm256_maskload_ps and
// _mm256_maskstore_ps: a tail goes through masked lanes of the same function, so its values get
// the same bits as they would in a full group.
__attribute__((target("avx2"))) inline __m256i TailMask8(int64_t left) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(std::min<int64_t>(left, 8))),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

}  // namespace shardline::kernels::cpu
