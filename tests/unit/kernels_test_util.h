// Helpers shared by the kernel tests: random data, element-wise comparison, and gradient checks by
// central finite differences.
//
// A gradient check takes the f32 kernel's forward, reduces its output to a scalar loss in double
// (loss = Σ out·w with fixed random w, so that dout = w), nudges one input element by ±h in f32,
// and compares (loss(+h) − loss(−h)) / 2h with what the backward kernel accumulated. With h = 1e-2
// the truncation error is O(h²) ≈ 1e-4 and the f32 rounding of the forward, divided by 2h, is
// about 1e-5 on these small shapes; hence the default tolerance |num − ana| <= 2e-3 + 2e-2·|ana|.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace shardline::kernels::testing {

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

// |actual − expected| <= atol + rtol·|expected| for every element; reports the first few misses.
template <typename A, typename E>
void ExpectClose(const A& actual, const E& expected, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  int misses = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double a = actual[i];
    const double e = expected[i];
    if (!(std::fabs(a - e) <= atol + rtol * std::fabs(e))) {
      ADD_FAILURE() << what << "[" << i << "]: got " << a << ", expected " << e;
      if (++misses >= 5) return;
    }
  }
}

// For sums whose rounding error scales with the largest terms, not with each result (an element
// near zero after cancellation): ExpectClose with atol = atol_of_max·max|expected|.
template <typename A, typename E>
void ExpectScaled(const A& actual, const E& expected, double atol_of_max, double rtol,
                  const std::string& what) {
  double max_abs = 0.0;
  for (size_t i = 0; i < expected.size(); ++i) {
    max_abs = std::max(max_abs, std::fabs(static_cast<double>(expected[i])));
  }
  ExpectClose(actual, expected, atol_of_max * max_abs, rtol, what);
}

// Σ out·w in double: the scalar whose gradient w.r.t. out is w.
inline double WeightedSum(const std::vector<float>& out, const std::vector<float>& w) {
  double s = 0.0;
  for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
  return s;
}

struct GradTolerance {
  double atol = 2e-3;
  double rtol = 2e-2;
  float h = 1e-2f;
};

// Compares `analytic` (the backward's result for `x`) with central differences of `loss`, which
// must read `x`'s current contents.
inline void ExpectGradientMatches(const std::function<double()>& loss, std::vector<float>& x,
                                  const std::vector<float>& analytic, const std::string& what,
                                  GradTolerance tol = {}) {
  ASSERT_EQ(x.size(), analytic.size()) << what;
  std::vector<double> numeric(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float saved = x[i];
    x[i] = saved + tol.h;
    const double plus = loss();
    x[i] = saved - tol.h;
    const double minus = loss();
    x[i] = saved;
    // The step actually taken in f32, which differs from 2h by rounding.
    const double step = static_cast<double>(saved + tol.h) - static_cast<double>(saved - tol.h);
    numeric[i] = (plus - minus) / step;
  }
  ExpectClose(analytic, numeric, tol.atol, tol.rtol, what + " (backward vs finite differences)");
}

}  // namespace shardline::kernels::testing
