#include "kernels/half.h"

namespace shardline::kernels {

// Plain loops: conversions run once per checkpoint or per mixed-precision copy, and GCC vectorises
// the bit arithmetic well enough that threading would not pay at these sizes.
void FloatToBFloat16(const float* in, BFloat16* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(in[i]);
}
void BFloat16ToFloat(const BFloat16* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = BFloat16ToFloat(in[i]);
}
void FloatToFloat16(const float* in, Float16* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToFloat16(in[i]);
}
void Float16ToFloat(const Float16* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = Float16ToFloat(in[i]);
}

}  // namespace shardline::kernels
