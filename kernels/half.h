// 16-bit floating-point storage types and their conversions to and from f32.
//
// BFloat16 and Float16 are storage only: kernels widen to f32, compute, and narrow back. Narrowing
// rounds to nearest, ties to even (what CUDA's __float2bfloat16_rn / __float2half_rn and PyTorch
// do), so a tensor converted here matches one converted on the GPU bit for bit.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace shardline::kernels {

struct BFloat16 {
  uint16_t bits = 0;
};

struct Float16 {
  uint16_t bits = 0;
};

// f32 -> bf16: keep the top 16 bits, rounding the dropped 16 to nearest even. NaN stays NaN (quiet).
inline BFloat16 FloatToBFloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    // Rounding a NaN could carry it into infinity; force the quiet bit instead.
    return BFloat16{static_cast<uint16_t>((bits >> 16) | 0x0040u)};
  }
  const uint32_t lsb = (bits >> 16) & 1u;
  bits += 0x7fffu + lsb;
  return BFloat16{static_cast<uint16_t>(bits >> 16)};
}

inline float BFloat16ToFloat(BFloat16 value) {
  return std::bit_cast<float>(static_cast<uint32_t>(value.bits) << 16);
}

// f32 -> IEEE binary16 with subnormals; values of magnitude >= 65520 become infinity.
inline Float16 FloatToFloat16(float value) {
  uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  uint32_t abs = bits & 0x7fffffffu;
  uint16_t out;
  if (abs >= 0x47800000u) {  // >= 65536 (or inf/NaN): no finite half is that large
    out = abs > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (abs < 0x38800000u) {  // below 2^-14: the result is subnormal or zero
    // Adding 0.5f lines the 10 half mantissa bits up at the bottom of the float's mantissa; the
    // FPU's own round-to-nearest-even does the rounding.
    const float aligned = std::bit_cast<float>(abs) + 0.5f;
    out = static_cast<uint16_t>(std::bit_cast<uint32_t>(aligned) - 0x3f000000u);
  } else {
    const uint32_t mantissa_odd = (abs >> 13) & 1u;
    abs += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mantissa_odd;  // rebias and round
    out = static_cast<uint16_t>(abs >> 13);  // a carry out of the mantissa correctly bumps the exponent
  }
  return Float16{static_cast<uint16_t>(out | sign)};
}

inline float Float16ToFloat(Float16 value) {
  const uint32_t h = value.bits;
  uint32_t out = (h & 0x7fffu) << 13;
  const uint32_t exponent = out & (0x7c00u << 13);
  out += static_cast<uint32_t>(127 - 15) << 23;
  if (exponent == (0x7c00u << 13)) {  // inf or NaN: push the exponent to all ones
    out += static_cast<uint32_t>(128 - 16) << 23;
  } else if (exponent == 0) {  // zero or subnormal: renormalise through the FPU
    out += 1u << 23;
    out = std::bit_cast<uint32_t>(std::bit_cast<float>(out) - std::bit_cast<float>(113u << 23));
  }
  return std::bit_cast<float>(out | ((h & 0x8000u) << 16));
}

// Array conversions (n elements; the ranges must not overlap).
void FloatToBFloat16(const float* in, BFloat16* out, size_t n);
void BFloat16ToFloat(const BFloat16* in, float* out, size_t n);
void FloatToFloat16(const float* in, Float16* out, size_t n);
void Float16ToFloat(const Float16* in, float* out, size_t n);

}  // namespace shardline::kernels
