// Llama's pieces on the CPU — RMSNorm, SwiGLU's gating, rotary positions (rotate_half layout, with
// Llama 3's frequency rescaling) — each against a double-precision reference written here, and
// their backward passes against central finite differences of the f32 forward (the gradient
// check of kernels_test_util.h). The CUDA twins are compared with these in kernels_backend_test.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/rmsnorm.h"
#include "kernels/cpu/rotary.h"
#include "tests/unit/kernels_test_util.h"

namespace shardline::kernels::cpu {
namespace {

using testing::ExpectClose;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::WeightedSum;

// Shapes that cross the vector widths (16 lanes) with a tail, and rows enough to thread.
constexpr int kN = 37, kC = 100;

TEST(RmsNormTest, ForwardMatchesTheDoubleReference) {
  for (const float eps : {1e-5f, 1e-2f}) {
    const std::vector<float> x = RandomVector(kN * kC, 1, -2.0f, 2.0f);
    const std::vector<float> w = RandomVector(kC, 2, 0.5f, 1.5f);
    std::vector<float> out(x.size()), rstd(kN);
    RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), kN, kC, eps);
    std::vector<double> want(x.size()), want_rstd(kN);
    for (int n = 0; n < kN; ++n) {
      double squares = 0;
      for (int c = 0; c < kC; ++c) squares += double(x[n * kC + c]) * x[n * kC + c];
      want_rstd[n] = 1.0 / std::sqrt(squares / kC + eps);
      for (int c = 0; c < kC; ++c) want[n * kC + c] = x[n * kC + c] * want_rstd[n] * w[c];
    }
    ExpectClose(out, want, 1e-6, 1e-5, "rmsnorm out");
    ExpectClose(rstd, want_rstd, 0, 1e-5, "rmsnorm rstd");
  }
}

TEST(RmsNormTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  constexpr int N = 5, C = 24;
  std::vector<float> x = RandomVector(N * C, 3, -2.0f, 2.0f);
  std::vector<float> w = RandomVector(C, 4, 0.5f, 1.5f);
  const std::vector<float> dout = RandomVector(N * C, 5);
  const float eps = 1e-5f;
  auto loss = [&] {
    std::vector<float> out(x.size()), rstd(N);
    RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
    return WeightedSum(out, dout);
  };
  std::vector<float> out(x.size()), rstd(N);
  RmsNormForward(out.data(), rstd.data(), x.data(), w.data(), N, C, eps);
  // Accumulates: start from 1 and subtract it after.
  std::vector<float> dx(x.size(), 1.0f), dw(C, 1.0f);
  RmsNormBackward(dx.data(), dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  for (float& v : dx) v -= 1.0f;
  for (float& v : dw) v -= 1.0f;
  ExpectGradientMatches(loss, x, dx, "rmsnorm dinp");
  ExpectGradientMatches(loss, w, dw, "rmsnorm dweight");
  // Either gradient alone.
  std::vector<float> only_dw(C, 0.0f);
  RmsNormBackward(nullptr, only_dw.data(), dout.data(), x.data(), w.data(), rstd.data(), N, C);
  ExpectClose(only_dw, dw, 1e-6, 1e-5, "dweight without dinp");
}

TEST(SwiGluTest, ForwardMatchesTheDoubleReferenceAcrossBlocks) {
  // Past one block of 1024 and with large |gate| (the sigmoid's saturated ends).
  const int64_t n = 2500;
  std::vector<float> gate = RandomVector(n, 6, -8.0f, 8.0f);
  gate[0] = -90.0f;  // exp(90) overflows f32: silu must still be −0, not NaN
  gate[1] = 90.0f;
  const std::vector<float> up = RandomVector(n, 7, -2.0f, 2.0f);
  std::vector<float> out(n);
  SwiGluForward(out.data(), gate.data(), up.data(), n);
  std::vector<double> want(n);
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    want[i] = g / (1.0 + std::exp(-g)) * up[i];
  }
  ExpectClose(out, want, 1e-6, 1e-5, "swiglu out");
}

TEST(SwiGluTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int64_t n = 300;
  std::vector<float> gate = RandomVector(n, 8, -4.0f, 4.0f);
  std::vector<float> up = RandomVector(n, 9, -2.0f, 2.0f);
  const std::vector<float> dout = RandomVector(n, 10);
  auto loss = [&] {
    std::vector<float> out(n);
    SwiGluForward(out.data(), gate.data(), up.data(), n);
    return WeightedSum(out, dout);
  };
  std::vector<float> dgate(n, 0.5f), dup(n, 0.5f);
  SwiGluBackward(dgate.data(), dup.data(), gate.data(), up.data(), dout.data(), n);
  for (float& v : dgate) v -= 0.5f;
  for (float& v : dup) v -= 0.5f;
  ExpectGradientMatches(loss, gate, dgate, "swiglu dgate");
  ExpectGradientMatches(loss, up, dup, "swiglu dup");
}

TEST(RotaryTest, InverseFrequenciesArePlainRopesAndLlama3sBands) {
  // Plain: 1 / theta^(2i/HS).
  const std::vector<float> plain = RotaryInverseFrequencies(8, 10000.0);
  ASSERT_EQ(plain.size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(plain[i], std::pow(10000.0, -2.0 * i / 8), 1e-7) << i;

  // Llama 3.1's scaling on its head size and theta: short wavelengths (< 8192 / 4) are kept, long
  // ones (> 8192 / 1) divided by the factor, the band between lies strictly between the two.
  const RotaryScaling llama3{.factor = 8.0,
                             .low_freq_factor = 1.0,
                             .high_freq_factor = 4.0,
                             .original_max_positions = 8192.0};
  const std::vector<float> base = RotaryInverseFrequencies(128, 500000.0);
  const std::vector<float> scaled = RotaryInverseFrequencies(128, 500000.0, llama3);
  ASSERT_EQ(scaled.size(), 64u);
  int kept = 0, divided = 0, between = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * std::numbers::pi / base[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_EQ(scaled[i], base[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_FLOAT_EQ(scaled[i], base[i] / 8.0f) << i;
      ++divided;
    } else {
      EXPECT_LT(scaled[i], base[i]) << i;
      EXPECT_GT(scaled[i], base[i] / 8.0f) << i;
      ++between;
    }
    if (i > 0) EXPECT_LE(scaled[i], scaled[i - 1]) << i;  // still decreasing
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(between, 0);
}

// x'[i] = x[i]·cos a − x[i + HS/2]·sin a, x'[i + HS/2] = x[i + HS/2]·cos a + x[i]·sin a with
// a = float(position·inv_freq[i]) (as transformers), in double from there.
std::vector<double> RotaryReference(const std::vector<float>& x, int64_t row_stride, int N, int T,
                                    int H, int HS, const int32_t* positions,
                                    const std::vector<float>& inv_freq) {
  std::vector<double> out(x.begin(), x.end());
  const int half = HS / 2;
  for (int n = 0; n < N; ++n) {
    const float position = static_cast<float>(positions != nullptr ? positions[n] : n % T);
    for (int h = 0; h < H; ++h) {
      const int64_t base = int64_t{n} * row_stride + int64_t{h} * HS;
      for (int i = 0; i < half; ++i) {
        const double a = static_cast<double>(position * inv_freq[i]);
        const double lo = x[base + i], hi = x[base + i + half];
        out[base + i] = lo * std::cos(a) - hi * std::sin(a);
        out[base + i + half] = hi * std::cos(a) + lo * std::sin(a);
      }
    }
  }
  return out;
}

TEST(RotaryTest, ForwardMatchesTheReferenceOnStridedHeadsAndLeavesTheRestAlone) {
  // q and k of a GQA row (4 query heads, 2 key/value heads of 64) inside a qkv row of 8 heads: the
  // six q/k heads turned by one call, the two value heads untouched.
  constexpr int N = 9, T = 3, HS = 64, kTurned = 6, kRow = 8 * HS;
  const std::vector<float> inv_freq = RotaryInverseFrequencies(HS, 10000.0);
  const std::vector<float> x = RandomVector(N * kRow, 11);
  for (const bool explicit_positions : {false, true}) {
    SCOPED_TRACE(explicit_positions ? "positions" : "n % T");
    const std::vector<int32_t> positions = {0, 5, 17, 1000, 3, 4095, 2, 1, 7};
    const int32_t* at = explicit_positions ? positions.data() : nullptr;
    std::vector<float> turned = x;
    RotaryForward(turned.data(), kRow, N, T, kTurned, HS, at, inv_freq.data());
    ExpectClose(turned, RotaryReference(x, kRow, N, T, kTurned, HS, at, inv_freq), 1e-5, 1e-5,
                "rotary");
    for (int n = 0; n < N; ++n) {
      for (int e = kTurned * HS; e < kRow; ++e) {
        ASSERT_EQ(turned[n * kRow + e], x[n * kRow + e]) << "value head element " << e;
      }
    }
  }
}

// The backward is the rotation's transpose: <R x, y> = <x, Rᵀ y> for any x, y, and Rᵀ R x = x.
TEST(RotaryTest, BackwardIsTheTransposeOfTheForward) {
  constexpr int N = 6, T = 6, H = 3, HS = 40;
  const std::vector<float> inv_freq = RotaryInverseFrequencies(
      HS, 500000.0, RotaryScaling{.factor = 8.0, .original_max_positions = 16.0});
  const std::vector<float> x = RandomVector(N * H * HS, 12), y = RandomVector(N * H * HS, 13);
  std::vector<float> rx = x, rty = y;
  const std::vector<int32_t> positions = {3, 0, 900, 12, 7, 31};
  RotaryForward(rx.data(), H * HS, N, T, H, HS, positions.data(), inv_freq.data());
  RotaryBackward(rty.data(), H * HS, N, T, H, HS, positions.data(), inv_freq.data());
  double left = 0, right = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    left += double(rx[i]) * y[i];
    right += double(x[i]) * rty[i];
  }
  EXPECT_NEAR(left, right, 1e-4 * std::fabs(left) + 1e-5);
  std::vector<float> back = rx;
  RotaryBackward(back.data(), H * HS, N, T, H, HS, positions.data(), inv_freq.data());
  ExpectClose(back, x, 1e-5, 1e-5, "the backward undoes the forward");
}

}  // namespace
}  // namespace shardline::kernels::cpu
