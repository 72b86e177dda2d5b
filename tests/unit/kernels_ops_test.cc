// Every CPU kernel but attention (kernels_attention_test.cc): forward against a naive double
// reference, backward against central finite differences (see kernels_test_util.h for the method
// and the default tolerance), and the accumulate (+=) contract of every backward.
//
// Forward tolerances: |f32 kernel − double reference| <= 1e-5 + 1e-4·|ref| for single-pass ops;
// GEMM-based ones use 1e-4 + 1e-4·|ref| (sums of up to a few hundred f32 products).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/vector_width.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/skinny_matmul.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/softmax.h"
#include "tests/unit/kernels_test_util.h"

namespace shardline::kernels::cpu {
namespace {

using testing::ExpectClose;
using testing::ExpectGradientMatches;
using testing::GradTolerance;
using testing::RandomVector;
using testing::WeightedSum;

constexpr float kPrefill = 0.25f;  // gradients start here to check that backward adds

std::vector<float> Prefilled(size_t n) { return std::vector<float>(n, kPrefill); }
std::vector<float> MinusPrefill(std::vector<float> g) {
  for (float& x : g) x -= kPrefill;
  return g;
}

// ---------------------------------------------------------------------------------------------
// Matmul and bias add

std::vector<double> MatmulReference(const std::vector<float>& inp, const std::vector<float>& weight,
                                    const float* bias, int N, int C, int OC) {
  std::vector<double> out(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n) {
    for (int o = 0; o < OC; ++o) {
      double s = bias != nullptr ? bias[o] : 0.0;
      for (int c = 0; c < C; ++c) s += static_cast<double>(inp[n * C + c]) * weight[o * C + c];
      out[n * OC + o] = s;
    }
  }
  return out;
}

TEST(MatmulTest, ForwardMatchesReference) {
  for (auto [N, C, OC] : {std::tuple{7, 5, 3}, std::tuple{1, 1, 1}, std::tuple{130, 96, 200}}) {
    const auto inp = RandomVector(N * C, 1);
    const auto weight = RandomVector(OC * C, 2);
    const auto bias = RandomVector(OC, 3);
    std::vector<float> out(N * OC, 123.0f);  // garbage: forward overwrites
    MatmulForward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    ExpectClose(out, MatmulReference(inp, weight, bias.data(), N, C, OC), 1e-4, 1e-4, "matmul+bias");
    std::fill(out.begin(), out.end(), 123.0f);
    MatmulForward(out.data(), inp.data(), weight.data(), nullptr, N, C, OC);
    ExpectClose(out, MatmulReference(inp, weight, nullptr, N, C, OC), 1e-4, 1e-4, "matmul");
  }
}

// Every row count of a decode step, over shapes with and without a 16- or 8-float tail, an odd
// number of columns, one column, and more columns than one thread's block (the threaded path):
// with the CPU's widest body, and with the eight-lane one (UseAvx2AtMost) where the CPU has both.
void CheckSkinnyMatmul(const std::string& body) {
  for (auto [C, OC] : {std::pair{5, 3}, std::pair{16, 1}, std::pair{33, 17}, std::pair{768, 2305},
                       std::pair{1024, 64}, std::pair{12, 9}}) {
    const auto inp = RandomVector(kSkinnyMaxRows * C, 11);
    const auto weight = RandomVector(OC * C, 12);
    const auto bias = RandomVector(OC, 13);
    std::vector<float> alone(OC);
    // Every row count of the four-row blocks' remainders and of the AVX2 range, then around the
    // multiples of 16 up to 64, and the most rows.
    std::vector<int> counts;
    for (int N = 1; N <= kSkinnyMaxRows; ++N) {
      if (N <= 17 || (N <= 65 && (N % 16 <= 1 || N % 16 == 15)) || N >= kSkinnyMaxRows - 1) {
        counts.push_back(N);
      }
    }
    for (const int N : counts) {
      const std::vector<float> rows(inp.begin(), inp.begin() + N * C);
      const std::string what = body + " skinny N " + std::to_string(N) + " C " +
                               std::to_string(C) + " OC " + std::to_string(OC);
      std::vector<float> out(N * OC, 123.0f);  // garbage: forward overwrites
      SkinnyMatmulForward(out.data(), rows.data(), weight.data(), bias.data(), N, C, OC);
      ExpectClose(out, MatmulReference(rows, weight, bias.data(), N, C, OC), 1e-4, 1e-4, what);
      std::fill(out.begin(), out.end(), 123.0f);
      SkinnyMatmulForward(out.data(), rows.data(), weight.data(), nullptr, N, C, OC);
      ExpectClose(out, MatmulReference(rows, weight, nullptr, N, C, OC), 1e-4, 1e-4, what);
      // With its own kernel, the last row's bits are those of the same row multiplied alone
      // (batch invariance; the BLAS it falls back to does not promise that).
      if (SkinnyMatmulAvailable()) {
        SkinnyMatmulForward(alone.data(), rows.data() + (N - 1) * C, weight.data(), nullptr, 1,
                            C, OC);
        EXPECT_TRUE(std::equal(alone.begin(), alone.end(), out.begin() + (N - 1) * OC)) << what;
      }
    }
  }
}

TEST(SkinnyMatmulTest, MatchesTheReferenceAndEachRowIsItsOwn) {
  CheckSkinnyMatmul(WideVectors() ? "avx512" : Avx2Vectors() ? "avx2" : "baseline");
  EXPECT_EQ(SkinnyMatmulMaxRows(kSkinnyStreamedBytes),
            WideVectors() ? kSkinnyMaxRows : Avx2Vectors() ? 16 : 0);
  EXPECT_EQ(SkinnyMatmulMaxRows(kSkinnyStreamedBytes - 1), SkinnyMatmulAvailable() ? 16 : 0);
  if (WideVectors() && Avx2Vectors()) {
    UseAvx2AtMost(true);
    ASSERT_TRUE(SkinnyMatmulAvailable());
    EXPECT_EQ(SkinnyMatmulMaxRows(kSkinnyStreamedBytes), 16);
    CheckSkinnyMatmul("avx2");
    UseAvx2AtMost(false);
  }
}

// Without packed weights, LinearForward is the skinny kernel up to SkinnyMatmulMaxRows() rows
// (the same bits) and MatmulForward past it, for a weight that a cache holds and one it does not.
TEST(SkinnyMatmulTest, LinearForwardTakesTheSkinnyKernelUpToItsRows) {
  for (const auto [C, OC] : {std::pair{40, 33}, std::pair{1024, 1025}}) {
    const int most = SkinnyMatmulMaxRows(int64_t{C} * OC * 4);
    for (const int N : {1, most, most + 1}) {
      if (N < 1) continue;
      const auto inp = RandomVector(N * C, 17);
      const auto weight = RandomVector(OC * C, 18);
      const auto bias = RandomVector(OC, 19);
      std::vector<float> out(N * OC), expected(N * OC);
      LinearForward(out.data(), inp.data(), weight.data(), nullptr, bias.data(), N, C, OC);
      if (N <= most) {
        SkinnyMatmulForward(expected.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
      } else {
        MatmulForward(expected.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
      }
      EXPECT_EQ(out, expected) << "N " << N << " C " << C << " OC " << OC;
    }
  }
}

// Without AVX-512 or AVX2 it is MatmulForward (the CPU's own kernels are above).
TEST(SkinnyMatmulTest, WithoutAvx2ItIsMatmulForward) {
  EXPECT_EQ(SkinnyMatmulAvailable(), WideVectors() || Avx2Vectors());
  UseBaselineVectors(true);
  EXPECT_FALSE(SkinnyMatmulAvailable());
  EXPECT_EQ(SkinnyMatmulMaxRows(kSkinnyStreamedBytes), 0);
  const int N = 5, C = 33, OC = 17;
  const auto inp = RandomVector(N * C, 14);
  const auto weight = RandomVector(OC * C, 15);
  const auto bias = RandomVector(OC, 16);
  std::vector<float> out(N * OC, 123.0f), expected(N * OC);
  SkinnyMatmulForward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  MatmulForward(expected.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
  UseBaselineVectors(false);
  EXPECT_EQ(out, expected);
}

TEST(MatmulTest, BackwardMatchesFiniteDifferencesAndAccumulates) {
  const int N = 4, C = 5, OC = 3;
  auto inp = RandomVector(N * C, 4);
  auto weight = RandomVector(OC * C, 5);
  auto bias = RandomVector(OC, 6);
  const auto w = RandomVector(N * OC, 7);
  auto loss = [&] {
    std::vector<float> out(N * OC);
    MatmulForward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    return WeightedSum(out, w);
  };
  auto dinp = Prefilled(N * C), dweight = Prefilled(OC * C), dbias = Prefilled(OC);
  MatmulBackward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(), N, C,
                 OC);
  ExpectGradientMatches(loss, inp, MinusPrefill(dinp), "matmul dinp");
  ExpectGradientMatches(loss, weight, MinusPrefill(dweight), "matmul dweight");
  ExpectGradientMatches(loss, bias, MinusPrefill(dbias), "matmul dbias");

  // Null gradients are skipped; the others are still computed.
  auto dweight2 = Prefilled(OC * C);
  MatmulBackward(nullptr, dweight2.data(), nullptr, w.data(), inp.data(), weight.data(), N, C, OC);
  EXPECT_EQ(dweight2, dweight);
}

TEST(BiasAddTest, ForwardAndBackward) {
  const int N = 300, C = 300;  // above the threading threshold: column blocks across threads
  const auto bias = RandomVector(C, 8);
  auto out = RandomVector(N * C, 9);
  std::vector<double> expected(out.begin(), out.end());
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) expected[n * C + c] += bias[c];
  BiasAddForward(out.data(), bias.data(), N, C);
  ExpectClose(out, expected, 1e-6, 1e-6, "bias add");

  const auto dout = RandomVector(N * C, 10);
  auto dbias = Prefilled(C);
  BiasAddBackward(dbias.data(), dout.data(), N, C);
  std::vector<double> ref(C, kPrefill);
  for (int n = 0; n < N; ++n)
    for (int c = 0; c < C; ++c) ref[c] += dout[n * C + c];
  ExpectClose(dbias, ref, 1e-4, 1e-4, "bias add dbias");
}

// ---------------------------------------------------------------------------------------------
// LayerNorm

struct LayerNormRef {
  std::vector<double> out, mean, rstd, dinp, dweight, dbias;
};

LayerNormRef LayerNormReference(const std::vector<float>& inp, const std::vector<float>& weight,
                                const std::vector<float>& bias, const std::vector<float>& dout,
                                int N, int C) {
  LayerNormRef r;
  r.out.resize(N * C);
  r.dinp.resize(N * C);
  r.dweight.assign(C, 0.0);
  r.dbias.assign(C, 0.0);
  for (int n = 0; n < N; ++n) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += inp[n * C + c];
    m /= C;
    for (int c = 0; c < C; ++c) v += (inp[n * C + c] - m) * (inp[n * C + c] - m);
    v /= C;
    const double s = 1.0 / std::sqrt(v + 1e-5);
    r.mean.push_back(m);
    r.rstd.push_back(s);
    double gm = 0, gnm = 0;
    for (int c = 0; c < C; ++c) {
      const double norm = (inp[n * C + c] - m) * s;
      r.out[n * C + c] = norm * weight[c] + bias[c];
      const double g = weight[c] * static_cast<double>(dout[n * C + c]);
      gm += g;
      gnm += g * norm;
      r.dweight[c] += norm * dout[n * C + c];
      r.dbias[c] += dout[n * C + c];
    }
    gm /= C;
    gnm /= C;
    for (int c = 0; c < C; ++c) {
      const double norm = (inp[n * C + c] - m) * s;
      r.dinp[n * C + c] = s * (weight[c] * static_cast<double>(dout[n * C + c]) - gm - norm * gnm);
    }
  }
  return r;
}

// Both implementations: the AVX-512 one (where this CPU has it) and the four-lane one.
class LayerNormTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { UseBaselineVectors(GetParam()); }
  void TearDown() override { UseBaselineVectors(false); }
};

TEST_P(LayerNormTest, ForwardMatchesReference) {
  // Rows shorter than a vector, of whole vectors, and with a tail; the last one runs threaded.
  for (auto [N, C] : {std::pair{3, 8}, std::pair{5, 37}, std::pair{128, 64}, std::pair{96, 512}}) {
    auto inp = RandomVector(N * C, 11, -2.0f, 3.0f);
    const auto weight = RandomVector(C, 12), bias = RandomVector(C, 13);
    const auto dout = RandomVector(N * C, 14);
    std::vector<float> out(N * C), mean(N), rstd(N);
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    const LayerNormRef ref = LayerNormReference(inp, weight, bias, dout, N, C);
    ExpectClose(out, ref.out, 1e-5, 1e-4, "layernorm out");
    ExpectClose(mean, ref.mean, 1e-5, 1e-4, "layernorm mean");
    ExpectClose(rstd, ref.rstd, 1e-5, 1e-4, "layernorm rstd");
    // Backward against the analytic double reference too, since finite differences at this size
    // would take minutes.
    auto dinp = Prefilled(N * C), dweight = Prefilled(C), dbias = Prefilled(C);
    LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(), weight.data(),
                      mean.data(), rstd.data(), N, C);
    ExpectClose(MinusPrefill(dinp), ref.dinp, 1e-4, 1e-3, "layernorm dinp");
    ExpectClose(MinusPrefill(dweight), ref.dweight, 1e-4, 1e-3, "layernorm dweight");
    ExpectClose(MinusPrefill(dbias), ref.dbias, 1e-4, 1e-3, "layernorm dbias");
  }
}

TEST_P(LayerNormTest, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 6;
  auto inp = RandomVector(N * C, 15, -2.0f, 2.0f);
  auto weight = RandomVector(C, 16), bias = RandomVector(C, 17);
  const auto w = RandomVector(N * C, 18);
  auto loss = [&] {
    std::vector<float> out(N * C), mean(N), rstd(N);
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
    return WeightedSum(out, w);
  };
  std::vector<float> out(N * C), mean(N), rstd(N);
  LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(), bias.data(), N, C);
  auto dinp = Prefilled(N * C), dweight = Prefilled(C), dbias = Prefilled(C);
  LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), w.data(), inp.data(), weight.data(),
                    mean.data(), rstd.data(), N, C);
  // h = 1e-3: layernorm is strongly curved for inputs near the row mean.
  const GradTolerance tol{.atol = 3e-3, .rtol = 2e-2, .h = 1e-3f};
  ExpectGradientMatches(loss, inp, MinusPrefill(dinp), "layernorm dinp", tol);
  ExpectGradientMatches(loss, weight, MinusPrefill(dweight), "layernorm dweight", tol);
  ExpectGradientMatches(loss, bias, MinusPrefill(dbias), "layernorm dbias", tol);
}

INSTANTIATE_TEST_SUITE_P(Widths, LayerNormTest, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "FourLanes" : "Widest");
});

// ---------------------------------------------------------------------------------------------
// exp and tanh over arrays (vector_math.h), at every width this CPU has: 0 the widest, 1 AVX2
// at most, 2 four lanes.

class VectorMathTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    UseAvx2AtMost(GetParam() == 1);
    UseBaselineVectors(GetParam() == 2);
  }
  void TearDown() override {
    UseAvx2AtMost(false);
    UseBaselineVectors(false);
  }
};

TEST_P(VectorMathTest, ExpAndTanhWithinTwoUlpOfDouble) {
  const auto x = RandomVector(1000 + 5, 26, -20.0f, 20.0f);
  std::vector<float> e(x.size()), t(x.size());
  ExpShiftedInto(e.data(), x.data(), 1.5f, static_cast<int64_t>(x.size()));
  TanhInto(t.data(), x.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    const double want_e = std::exp(static_cast<double>(x[i] - 1.5f));
    const double want_t = std::tanh(static_cast<double>(x[i]));
    ASSERT_LE(std::abs(e[i] - want_e), 2 * std::abs(std::nextafter(static_cast<float>(want_e),
                                                                     INFINITY) -
                                                    static_cast<float>(want_e)))
        << "exp at " << x[i];
    ASSERT_LE(std::abs(t[i] - want_t), 2 * std::abs(std::nextafter(static_cast<float>(want_t),
                                                                     INFINITY) -
                                                    static_cast<float>(want_t)) +
                                           1e-30)
        << "tanh at " << x[i];
  }
  // A value's bits do not depend on where it sits (a full group of lanes or the tail).
  std::vector<float> shifted(x.size() - 3);
  ExpShiftedInto(shifted.data(), x.data() + 3, 1.5f, static_cast<int64_t>(shifted.size()));
  for (size_t i = 0; i < shifted.size(); ++i) ASSERT_EQ(shifted[i], e[i + 3]) << i;
}

TEST_P(VectorMathTest, ArgMaxIsMaxElementsIndex) {
  const auto expect_as_max_element = [](const std::vector<float>& x, const std::string& what) {
    const int64_t want = std::max_element(x.begin(), x.end()) - x.begin();
    EXPECT_EQ(ArgMax(x.data(), static_cast<int64_t>(x.size())), want) << what;
  };
  // Every length up to a few groups of lanes, the largest at every position, and ties.
  for (int n = 1; n <= 40; ++n) {
    for (int at = 0; at < n; ++at) {
      std::vector<float> x = RandomVector(n, 100 + n, -5.0f, 5.0f);
      x[at] = 7.0f;
      expect_as_max_element(x, "n " + std::to_string(n) + " largest at " + std::to_string(at));
      x[n - 1] = 7.0f;  // a tie: the first one
      expect_as_max_element(x, "n " + std::to_string(n) + " tie at " + std::to_string(at));
    }
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x = RandomVector(50257, 27, -10.0f, 10.0f);  // GPT-2's vocabulary
  expect_as_max_element(x, "a row of logits");
  x[123] = nan;
  x[50256] = nan;
  expect_as_max_element(x, "NaNs inside are never the largest");
  x[0] = nan;
  expect_as_max_element(x, "a NaN first is the answer");
  expect_as_max_element({-inf, nan, -inf}, "-inf first, then a NaN");
  expect_as_max_element({1.0f, nan, 3.0f, inf, 2.0f, inf}, "the first +inf");
  expect_as_max_element({0.0f, -0.0f}, "+0 then -0: the first");
  expect_as_max_element({-1.0f, -0.0f, 0.0f}, "-0 then +0: the first");
  EXPECT_EQ(ArgMax(x.data(), 0), 0);
}

INSTANTIATE_TEST_SUITE_P(Widths, VectorMathTest, ::testing::Values(0, 1, 2), [](const auto& info) {
  return std::string(info.param == 0 ? "Widest" : info.param == 1 ? "Avx2AtMost" : "FourLanes");
});

// ---------------------------------------------------------------------------------------------
// GELU, residual, softmax

double GeluReference(double x) {
  return 0.5 * x * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

// Both implementations: the AVX-512 one (where this CPU has it) and the four-lane one.
class GeluTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { UseBaselineVectors(GetParam()); }
  void TearDown() override { UseBaselineVectors(false); }
};

TEST_P(GeluTest, ForwardMatchesReference) {
  const int64_t n = 50000 + 7;  // threaded; a tail of 7 lanes
  const auto inp = RandomVector(n, 19, -6.0f, 6.0f);
  std::vector<float> out(n);
  GeluForward(out.data(), inp.data(), n);
  std::vector<double> ref(n);
  for (int64_t i = 0; i < n; ++i) ref[i] = GeluReference(inp[i]);
  ExpectClose(out, ref, 1e-6, 1e-5, "gelu");
}

TEST_P(GeluTest, BackwardMatchesFiniteDifferences) {
  const int64_t n = 40;
  auto inp = RandomVector(n, 20, -4.0f, 4.0f);
  const auto w = RandomVector(n, 21);
  auto loss = [&] {
    std::vector<float> out(n);
    GeluForward(out.data(), inp.data(), n);
    return WeightedSum(out, w);
  };
  auto dinp = Prefilled(n);
  GeluBackward(dinp.data(), inp.data(), w.data(), n);
  ExpectGradientMatches(loss, inp, MinusPrefill(dinp), "gelu dinp");
}

// A value's result does not depend on where it sits: in a full group of lanes or in a tail.
TEST_P(GeluTest, TailGetsTheSameBitsAsAFullGroup) {
  const auto inp = RandomVector(37, 25, -5.0f, 5.0f);
  std::vector<float> whole(inp.size()), shifted(inp.size() - 3);
  GeluForward(whole.data(), inp.data(), static_cast<int64_t>(inp.size()));
  GeluForward(shifted.data(), inp.data() + 3, static_cast<int64_t>(shifted.size()));
  for (size_t i = 0; i < shifted.size(); ++i) ASSERT_EQ(shifted[i], whole[i + 3]) << i;
}

INSTANTIATE_TEST_SUITE_P(Widths, GeluTest, ::testing::Bool(), [](const auto& info) {
  return std::string(info.param ? "FourLanes" : "Widest");
});

TEST(ResidualTest, ForwardAndBackward) {
  const int64_t n = 40000;
  const auto a = RandomVector(n, 22), b = RandomVector(n, 23), dout = RandomVector(n, 24);
  std::vector<float> out(n);
  ResidualForward(out.data(), a.data(), b.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(out[i], a[i] + b[i]);
  auto da = Prefilled(n), db = Prefilled(n);
  ResidualBackward(da.data(), db.data(), dout.data(), n);
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(da[i], kPrefill + dout[i]);
    ASSERT_EQ(db[i], kPrefill + dout[i]);
  }
  ResidualBackward(nullptr, da.data(), dout.data(), n);
  EXPECT_EQ(da[0], kPrefill + dout[0] + dout[0]);
}

TEST(SoftmaxTest, ForwardMatchesReference) {
  const int N = 5, C = 17;
  const auto inp = RandomVector(N * C, 25, -20.0f, 20.0f);
  std::vector<float> out(N * C);
  SoftmaxForward(out.data(), inp.data(), N, C);
  std::vector<double> ref(N * C);
  for (int n = 0; n < N; ++n) {
    double max = -INFINITY, sum = 0;
    for (int c = 0; c < C; ++c) max = std::max(max, static_cast<double>(inp[n * C + c]));
    for (int c = 0; c < C; ++c) sum += std::exp(inp[n * C + c] - max);
    for (int c = 0; c < C; ++c) ref[n * C + c] = std::exp(inp[n * C + c] - max) / sum;
  }
  ExpectClose(out, ref, 1e-6, 1e-4, "softmax");
}

TEST(SoftmaxTest, BackwardMatchesFiniteDifferences) {
  const int N = 3, C = 7;
  auto inp = RandomVector(N * C, 26, -2.0f, 2.0f);
  const auto w = RandomVector(N * C, 27);
  auto loss = [&] {
    std::vector<float> out(N * C);
    SoftmaxForward(out.data(), inp.data(), N, C);
    return WeightedSum(out, w);
  };
  std::vector<float> out(N * C);
  SoftmaxForward(out.data(), inp.data(), N, C);
  auto dinp = Prefilled(N * C);
  SoftmaxBackward(dinp.data(), w.data(), out.data(), N, C);
  ExpectGradientMatches(loss, inp, MinusPrefill(dinp), "softmax dinp");
}

// ---------------------------------------------------------------------------------------------
// Embeddings

TEST(EmbeddingTest, EncoderForwardMatchesReference) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {0, 4, 4, 2, 1, 0};
  const auto wte = RandomVector(V * C, 28), wpe = RandomVector(T * C, 29);
  std::vector<float> out(B * T * C);
  EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
  std::vector<double> ref(B * T * C);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t)
      for (int c = 0; c < C; ++c)
        ref[(b * T + t) * C + c] =
            static_cast<double>(wte[tokens[b * T + t] * C + c]) + wpe[t * C + c];
  ExpectClose(out, ref, 1e-6, 1e-6, "encoder");
}

TEST(EmbeddingTest, EncoderBackwardMatchesFiniteDifferences) {
  const int B = 2, T = 3, C = 4, V = 5;
  const std::vector<int32_t> tokens = {0, 4, 4, 2, 4, 0};  // repeats: the scatter must add them
  auto wte = RandomVector(V * C, 30), wpe = RandomVector(T * C, 31);
  const auto w = RandomVector(B * T * C, 32);
  auto loss = [&] {
    std::vector<float> out(B * T * C);
    EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
    return WeightedSum(out, w);
  };
  auto dwte = Prefilled(V * C), dwpe = Prefilled(T * C);
  EncoderBackward(dwte.data(), dwpe.data(), w.data(), tokens.data(), B, T, C, V);
  ExpectGradientMatches(loss, wte, MinusPrefill(dwte), "encoder dwte");
  ExpectGradientMatches(loss, wpe, MinusPrefill(dwpe), "encoder dwpe");
}

TEST(EmbeddingTest, VocabShardsSumToTheFullEmbedding) {
  const int N = 64, C = 600, V = 11;  // N·C above the threading threshold
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 7) % V;
  const auto wte = RandomVector(V * C, 33), dout = RandomVector(N * C, 34);
  std::vector<float> full(N * C);
  TokenEmbeddingForward(full.data(), tokens.data(), wte.data(), N, C, 0, V);
  std::vector<float> dfull(V * C, 0.0f);
  TokenEmbeddingBackward(dfull.data(), dout.data(), tokens.data(), N, C, 0, V);

  const int bounds[] = {0, 4, 8, V};  // three uneven shards
  std::vector<float> sum(N * C, 0.0f);
  for (int s = 0; s < 3; ++s) {
    const int v0 = bounds[s], v1 = bounds[s + 1];
    std::vector<float> part(N * C, 99.0f);
    TokenEmbeddingForward(part.data(), tokens.data(), wte.data() + v0 * C, N, C, v0, v1);
    for (int i = 0; i < N * C; ++i) sum[i] += part[i];
    std::vector<float> dshard((v1 - v0) * C, 0.0f);
    TokenEmbeddingBackward(dshard.data(), dout.data(), tokens.data(), N, C, v0, v1);
    EXPECT_TRUE(std::equal(dshard.begin(), dshard.end(), dfull.begin() + v0 * C))
        << "shard [" << v0 << "," << v1 << ") gradient differs from the full one's rows";
  }
  EXPECT_EQ(sum, full);
}

TEST(EmbeddingTest, ValidateTokensNamesTheBadOne) {
  const std::vector<int32_t> tokens = {1, 2, 50257, 0};
  EXPECT_TRUE(ValidateTokens(tokens.data(), 2, 50257).ok());
  absl::Status s = ValidateTokens(tokens.data(), 4, 50257);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(std::string(s.message()), "token 50257 at position 2 is outside the vocabulary [0, 50257)");
}

// ---------------------------------------------------------------------------------------------
// Cross-entropy

TEST(CrossEntropyTest, ForwardMatchesReference) {
  const int N = 6, V = 50;
  const auto logits = RandomVector(N * V, 35, -8.0f, 8.0f);
  const std::vector<int32_t> targets = {0, 49, 7, 7, -1, 23};
  std::vector<float> losses(N), lse(N);
  CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  std::vector<double> ref_loss(N), ref_lse(N);
  for (int n = 0; n < N; ++n) {
    double max = -INFINITY, sum = 0;
    for (int v = 0; v < V; ++v) max = std::max(max, static_cast<double>(logits[n * V + v]));
    for (int v = 0; v < V; ++v) sum += std::exp(logits[n * V + v] - max);
    ref_lse[n] = max + std::log(sum);
    ref_loss[n] = targets[n] < 0 ? 0.0 : ref_lse[n] - logits[n * V + targets[n]];
  }
  ExpectClose(losses, ref_loss, 1e-5, 1e-5, "cross-entropy loss");
  ExpectClose(lse, ref_lse, 1e-5, 1e-5, "cross-entropy lse");
  EXPECT_EQ(losses[4], 0.0f) << "a negative target is ignored";
}

TEST(CrossEntropyTest, BackwardMatchesFiniteDifferences) {
  const int N = 3, V = 9;
  auto logits = RandomVector(N * V, 36, -3.0f, 3.0f);
  const std::vector<int32_t> targets = {2, 8, -1};
  const std::vector<float> dlosses = {0.5f, -1.5f, 2.0f};
  auto loss = [&] {
    std::vector<float> losses(N), lse(N);
    CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
    return WeightedSum(losses, dlosses);
  };
  std::vector<float> losses(N), lse(N);
  CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  auto dlogits = Prefilled(N * V);
  CrossEntropyBackward(dlogits.data(), logits.data(), lse.data(), targets.data(), dlosses.data(), N, V);
  ExpectGradientMatches(loss, logits, MinusPrefill(dlogits), "cross-entropy dlogits");
  for (int v = 0; v < V; ++v) EXPECT_EQ(dlogits[2 * V + v], kPrefill) << "ignored row";
}

// The vocab-parallel recipe from cross_entropy.h with the all-reduces done by hand over shards.
void ExpectShardedMatchesUnsharded(std::vector<int> bounds) {
  const int N = 40, V = 1000;  // N·V above the threading threshold
  const auto logits = RandomVector(N * V, 37, -10.0f, 10.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = n == 3 ? -1 : (n * 97) % V;
  const auto dlosses = RandomVector(N, 38);
  std::vector<float> losses(N), lse(N);
  CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  std::vector<float> dlogits(N * V, 0.0f);
  CrossEntropyBackward(dlogits.data(), logits.data(), lse.data(), targets.data(), dlosses.data(), N, V);

  const int shards = static_cast<int>(bounds.size()) - 1;
  // Each rank's logits shard is a column slice, i.e. a copy in the row-major layout.
  std::vector<std::vector<float>> shard_logits(shards);
  std::vector<std::vector<float>> max(shards, std::vector<float>(N)), sumexp = max, target = max;
  for (int s = 0; s < shards; ++s) {
    const int v0 = bounds[s], vs = bounds[s + 1] - bounds[s];
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < vs; ++j) shard_logits[s].push_back(logits[n * V + v0 + j]);
    CrossEntropyLocalStats(max[s].data(), sumexp[s].data(), target[s].data(), shard_logits[s].data(),
                           targets.data(), N, vs, v0);
  }
  std::vector<float> global_max(N, -INFINITY), global_sum(N, 0.0f), global_target(N, 0.0f);
  for (int s = 0; s < shards; ++s)  // all-reduce MAX
    for (int n = 0; n < N; ++n) global_max[n] = std::max(global_max[n], max[s][n]);
  for (int s = 0; s < shards; ++s) {
    CrossEntropyRescaleSumExp(sumexp[s].data(), max[s].data(), global_max.data(), N);
    for (int n = 0; n < N; ++n) {  // all-reduce SUM
      global_sum[n] += sumexp[s][n];
      global_target[n] += target[s][n];
    }
  }
  std::vector<float> sharded_losses(N), sharded_lse(N);
  CrossEntropyLossFromStats(sharded_losses.data(), sharded_lse.data(), global_max.data(),
                            global_sum.data(), global_target.data(), targets.data(), N);
  ExpectClose(sharded_losses, std::vector<double>(losses.begin(), losses.end()), 1e-5, 1e-5,
              "sharded loss");
  ExpectClose(sharded_lse, std::vector<double>(lse.begin(), lse.end()), 1e-5, 1e-6, "sharded lse");
  for (int s = 0; s < shards; ++s) {
    const int v0 = bounds[s], vs = bounds[s + 1] - bounds[s];
    std::vector<float> dshard(N * vs, 0.0f);
    CrossEntropyBackwardShard(dshard.data(), shard_logits[s].data(), sharded_lse.data(),
                              targets.data(), dlosses.data(), N, vs, v0);
    std::vector<double> expected;
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < vs; ++j) expected.push_back(dlogits[n * V + v0 + j]);
    ExpectClose(dshard, expected, 1e-7, 1e-4, "sharded dlogits, shard " + std::to_string(s));
  }
}

TEST(CrossEntropyTest, TwoVocabShardsCombineToTheUnshardedResult) {
  ExpectShardedMatchesUnsharded({0, 500, 1000});
}

TEST(CrossEntropyTest, ThreeUnevenVocabShardsCombineToTheUnshardedResult) {
  ExpectShardedMatchesUnsharded({0, 1, 334, 1000});
}

// ---------------------------------------------------------------------------------------------
// AdamW and clipping

TEST(AdamWTest, MatchesReferenceOverSeveralSteps) {
  const int64_t n = 40000;  // threaded
  const AdamWConfig config{.learning_rate = 1e-2f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f};
  auto params = RandomVector(n, 39);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  std::vector<double> rp(params.begin(), params.end()), rm(n, 0.0), rv(n, 0.0);
  for (int step = 1; step <= 3; ++step) {
    const auto grads = RandomVector(n, 40 + step);
    ASSERT_TRUE(AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), n, config, step).ok());
    for (int64_t i = 0; i < n; ++i) {
      const double g = grads[i];
      rm[i] = 0.9 * rm[i] + 0.1 * g;
      rv[i] = 0.95 * rv[i] + 0.05 * g * g;
      const double mh = rm[i] / (1 - std::pow(0.9, step));
      const double vh = rv[i] / (1 - std::pow(0.95, step));
      rp[i] -= 1e-2 * (mh / (std::sqrt(vh) + 1e-8) + 0.1 * rp[i]);
    }
  }
  ExpectClose(params, rp, 1e-5, 1e-5, "adamw params");
  ExpectClose(m, rm, 1e-6, 1e-5, "adamw m");
  ExpectClose(v, rv, 1e-6, 1e-5, "adamw v");
}

// The AVX-512 and AVX2 paths (where this CPU has them) give the scalar path's bits, a tail of 7
// included.
TEST(AdamWTest, VectorPathsGiveTheScalarBits) {
  const int64_t n = 40000 + 7;
  const AdamWConfig config{.learning_rate = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f};
  auto run = [&](bool baseline, bool avx2_at_most) {
    UseBaselineVectors(baseline);
    UseAvx2AtMost(avx2_at_most);
    auto params = RandomVector(n, 45);
    std::vector<float> m(n, 0.0f), v(n, 0.0f);
    for (int step = 1; step <= 3; ++step) {
      const auto grads = RandomVector(n, 46 + step);
      EXPECT_TRUE(
          AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), n, config, step).ok());
    }
    UseBaselineVectors(false);
    UseAvx2AtMost(false);
    params.insert(params.end(), m.begin(), m.end());
    params.insert(params.end(), v.begin(), v.end());
    return params;
  };
  const std::vector<float> scalar = run(true, false), widest = run(false, false),
                           avx2 = run(false, true);
  ASSERT_EQ(scalar.size(), widest.size());
  for (size_t i = 0; i < scalar.size(); ++i) ASSERT_EQ(scalar[i], widest[i]) << "widest " << i;
  for (size_t i = 0; i < scalar.size(); ++i) ASSERT_EQ(scalar[i], avx2[i]) << "avx2 " << i;
}

TEST(AdamWTest, WeightDecayIsDecoupledFromTheGradient) {
  // A zero gradient leaves the moments at zero; only the decay moves the weight.
  float param = 2.0f, grad = 0.0f, m = 0.0f, v = 0.0f;
  const AdamWConfig config{.learning_rate = 0.1f, .weight_decay = 0.5f};
  ASSERT_TRUE(AdamWUpdate(&param, &grad, &m, &v, 1, config, 1).ok());
  EXPECT_FLOAT_EQ(param, 2.0f - 0.1f * 0.5f * 2.0f);
}

TEST(AdamWTest, RejectsBadStepAndHyperParameters) {
  float p = 0, g = 0, m = 0, v = 0;
  EXPECT_EQ(AdamWUpdate(&p, &g, &m, &v, 1, AdamWConfig{}, 0).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamWUpdate(&p, &g, &m, &v, 1, AdamWConfig{.beta2 = 1.0f}, 1).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AdamWUpdate(&p, &g, &m, &v, 1, AdamWConfig{.eps = 0.0f}, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(GlobalNormClipTest, ClipsAllGradientsByTheirJointNorm) {
  auto a = RandomVector(50000, 50), b = RandomVector(7, 51);
  double ref = 0;
  for (float x : a) ref += static_cast<double>(x) * x;
  for (float x : b) ref += static_cast<double>(x) * x;
  ref = std::sqrt(ref);
  const auto a0 = a, b0 = b;
  std::vector<std::span<float>> grads = {a, b};
  const double norm = GlobalNormClip(grads, 1.0).value();
  EXPECT_NEAR(norm, ref, 1e-9 * ref);
  const double scale = 1.0 / (ref + 1e-6);
  std::vector<double> ea(a0.begin(), a0.end()), eb(b0.begin(), b0.end());
  for (double& x : ea) x *= scale;
  for (double& x : eb) x *= scale;
  ExpectClose(a, ea, 1e-7, 1e-6, "clipped a");
  ExpectClose(b, eb, 1e-7, 1e-6, "clipped b");
  // Already under the limit: untouched.
  const auto before = a;
  EXPECT_NEAR(GlobalNormClip(grads, 10.0).value(), 1.0, 1e-5);
  EXPECT_EQ(a, before);
  EXPECT_EQ(GlobalNormClip(grads, 0.0).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(GlobalNormClipTest, NonFiniteNormLeavesGradientsForTheCallerToSkip) {
  std::vector<float> a = {1.0f, INFINITY, 2.0f};
  std::vector<std::span<float>> grads = {a};
  EXPECT_FALSE(std::isfinite(GlobalNormClip(grads, 1.0).value()));
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[2], 2.0f);
}

}  // namespace
}  // namespace shardline::kernels::cpu
