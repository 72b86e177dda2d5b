// Rotary position embedding (RoPE), in the "rotate_half" layout Hugging Face's Llama files use:
// within a head of HS channels, channel i pairs with channel i + HS/2 and the pair turns by
// angle position·inv_freq[i] (conventions: see matmul.h). The CUDA twin is kernels/cuda/ops.h's
// RotaryForward/RotaryBackward.
#pragma once

#include <cstdint>
#include <vector>

namespace shardline::kernels::cpu {

// The largest head the kernels take (even sizes only): Llama's are 64 or 128.
inline constexpr int kMaxRotaryHeadSize = 512;

// Llama 3's `rope_type: llama3` rescaling of the frequencies (Hugging Face's
// _compute_llama3_parameters): wavelengths longer than original_max_positions / low_freq_factor are
// divided by `factor`, shorter than original_max_positions / high_freq_factor kept, and the band
// between interpolated. factor <= 0: no rescaling (plain RoPE).
struct RotaryScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_max_positions = 8192.0;
};

// inv_freq (HS/2): 1 / theta^(2i / HS), rescaled by `scaling`, in float as transformers computes
// it (the angles are then position·inv_freq in float). HS must be even.
std::vector<float> RotaryInverseFrequencies(int head_size, double theta,
                                            const RotaryScaling& scaling = {});

// Turns, in place, H heads of HS channels of each of N rows of x: row n's heads start at
// x + n·row_stride, head h at + h·HS (so q and k inside a fused qkv row are two calls, or one over
// their adjacent heads). Row n sits at positions[n], or at n % T when positions is null (a batch of
// N / T sequences of T). For i < HS/2 and a = position·inv_freq[i]:
//   x'[i] = x[i]·cos a − x[i + HS/2]·sin a,   x'[i + HS/2] = x[i + HS/2]·cos a + x[i]·sin a
// (x·cos + rotate_half(x)·sin). HS even and at most kMaxRotaryHeadSize (the caller checks).
void RotaryForward(float* x, int64_t row_stride, int N, int T, int H, int HS,
                   const int32_t* positions, const float* inv_freq);
// The gradient through RotaryForward, in place: dx = the inverse turn of dy (the rotation is
// orthogonal), on the same layout.
void RotaryBackward(float* dx, int64_t row_stride, int N, int T, int H, int HS,
                    const int32_t* positions, const float* inv_freq);

}  // namespace shardline::kernels::cpu
