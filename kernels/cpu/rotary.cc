#include "kernels/cpu/rotary.h"

#include <cmath>
#include <numbers>

#include "kernels/cpu/parallel.h"

namespace shardline::kernels::cpu {

std::vector<float> RotaryInverseFrequencies(int head_size, double theta,
                                            const RotaryScaling& scaling) {
  const int half = head_size / 2;
  std::vector<float> inv_freq(static_cast<size_t>(half));
  for (int i = 0; i < half; ++i) {
    // transformers: 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim)), in float.
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_size);
    inv_freq[i] = 1.0f / std::pow(static_cast<float>(theta), exponent);
  }
  if (scaling.factor <= 0.0) return inv_freq;
  const double low_wavelen = scaling.original_max_positions / scaling.low_freq_factor;
  const double high_wavelen = scaling.original_max_positions / scaling.high_freq_factor;
  for (float& f : inv_freq) {
    const double wavelen = 2.0 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / scaling.factor);
    } else if (wavelen >= high_wavelen) {  // the band between: interpolated
      const double smooth = (scaling.original_max_positions / wavelen - scaling.low_freq_factor) /
                            (scaling.high_freq_factor - scaling.low_freq_factor);
      f = static_cast<float>((1.0 - smooth) * f / scaling.factor + smooth * f);
    }
  }
  return inv_freq;
}

namespace {

// `sign` +1 turns forward, −1 back.
void Turn(float* x, int64_t row_stride, int N, int T, int H, int HS, const int32_t* positions,
          const float* inv_freq, float sign) {
  const int half = HS / 2;
#pragma omp parallel for schedule(static) if (int64_t{N} * H * HS >= kMinParallelWork)
  for (int n = 0; n < N; ++n) {
    const float position = static_cast<float>(positions != nullptr ? positions[n] : n % T);
    // The row's angles once for all its heads: angle in float as transformers computes it
    // (position·inv_freq), its cos and sin in double then rounded.
    float cos_a[kMaxRotaryHeadSize / 2], sin_a[kMaxRotaryHeadSize / 2];
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position * inv_freq[i]);
      cos_a[i] = static_cast<float>(std::cos(angle));
      sin_a[i] = sign * static_cast<float>(std::sin(angle));
    }
    float* row = x + int64_t{n} * row_stride;
    for (int h = 0; h < H; ++h) {
      float* lo = row + int64_t{h} * HS;
      float* hi = lo + half;
#pragma omp simd
      for (int i = 0; i < half; ++i) {
        const float a = lo[i], b = hi[i];
        lo[i] = a * cos_a[i] - b * sin_a[i];
        hi[i] = b * cos_a[i] + a * sin_a[i];
      }
    }
  }
}

}  // namespace

void RotaryForward(float* x, int64_t row_stride, int N, int T, int H, int HS,
                   const int32_t* positions, const float* inv_freq) {
  Turn(x, row_stride, N, T, H, HS, positions, inv_freq, 1.0f);
}

void RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                    const int32_t* positions, const float* inv_freq) {
  Turn(dx, row_stride, N, T, H, HS, positions, inv_freq, -1.0f);
}

}  // namespace shardline::kernels::cpu
