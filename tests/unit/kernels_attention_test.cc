// Causal self-attention: the blocked online-softmax kernels against a naive double-precision
// attention that materialises the (T,T) probabilities, across tile boundaries (T > 64), backward by
// finite differences on a small shape, and a head subset against the same heads of the full run.
//
// Tolerances: forward |Δ| <= 1e-5 + 1e-4·|ref|; backward vs the double reference
// |Δ| <= 1e-5 + 1e-3·|ref|; finite differences as in kernels_test_util.h.
#include <algorithm>
#include <cmath>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/vector_width.h"
#include "tests/unit/kernels_test_util.h"

namespace shardline::kernels::cpu {
namespace {

using testing::ExpectClose;
using testing::ExpectGradientMatches;
using testing::RandomVector;
using testing::WeightedSum;

struct Shape {
  int B, T, NH, HS;
  int KVH = 0;  // key/value heads; 0: NH
  int kv() const { return KVH > 0 ? KVH : NH; }
  size_t qkv() const { return static_cast<size_t>(B) * T * (NH + 2 * kv()) * HS; }
  size_t out() const { return static_cast<size_t>(B) * T * NH * HS; }
  size_t lse() const { return static_cast<size_t>(B) * NH * T; }
  // Query head h's query (part 0), or the key (1) or value (2) it reads.
  size_t Q(int b, int t, int part, int h) const {
    const int head = part == 0 ? h : NH + (part - 1) * kv() + h / (NH / kv());
    return (static_cast<size_t>(b) * T + t) * (NH + 2 * kv()) * HS + static_cast<size_t>(head) * HS;
  }
  size_t O(int b, int t, int h) const {
    return (static_cast<size_t>(b) * T + t) * NH * HS + static_cast<size_t>(h) * HS;
  }
};

struct Reference {
  std::vector<double> out, lse, dqkv;
};

// Naive causal attention and its backward in double, through the full probability matrix.
Reference NaiveAttention(const std::vector<float>& qkv, const std::vector<float>& dout, Shape s) {
  Reference r;
  r.out.assign(s.out(), 0.0);
  r.lse.assign(s.lse(), 0.0);
  r.dqkv.assign(s.qkv(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(s.HS));
  std::vector<double> p(s.T);
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      for (int i = 0; i < s.T; ++i) {
        double max = -INFINITY;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < s.HS; ++d) dot += static_cast<double>(qkv[s.Q(b, i, 0, h) + d]) * qkv[s.Q(b, j, 1, h) + d];
          p[j] = dot * scale;
          max = std::max(max, p[j]);
        }
        double sum = 0;
        for (int j = 0; j <= i; ++j) sum += std::exp(p[j] - max);
        r.lse[(static_cast<size_t>(b) * s.NH + h) * s.T + i] = max + std::log(sum);
        for (int j = 0; j <= i; ++j) p[j] = std::exp(p[j] - max) / sum;
        for (int j = 0; j <= i; ++j)
          for (int d = 0; d < s.HS; ++d) r.out[s.O(b, i, h) + d] += p[j] * qkv[s.Q(b, j, 2, h) + d];
        // Backward of row i: dp_j = do·v_j; ds_j = p_j(dp_j − Σ p·dp); dq += ds_j·k_j·scale, ...
        std::vector<double> dp(i + 1);
        double pdp = 0;
        for (int j = 0; j <= i; ++j) {
          double dot = 0;
          for (int d = 0; d < s.HS; ++d) dot += static_cast<double>(dout[s.O(b, i, h) + d]) * qkv[s.Q(b, j, 2, h) + d];
          dp[j] = dot;
          pdp += p[j] * dot;
        }
        for (int j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - pdp) * scale;
          for (int d = 0; d < s.HS; ++d) {
            r.dqkv[s.Q(b, i, 0, h) + d] += ds * qkv[s.Q(b, j, 1, h) + d];
            r.dqkv[s.Q(b, j, 1, h) + d] += ds * qkv[s.Q(b, i, 0, h) + d];
            r.dqkv[s.Q(b, j, 2, h) + d] += p[j] * dout[s.O(b, i, h) + d];
          }
        }
      }
    }
  }
  return r;
}

void ExpectMatchesNaive(Shape s, uint32_t seed) {
  const auto qkv = RandomVector(s.qkv(), seed, -2.0f, 2.0f);
  const auto dout = RandomVector(s.out(), seed + 1);
  std::vector<float> out(s.out()), lse(s.lse());
  AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.HS);
  const Reference ref = NaiveAttention(qkv, dout, s);
  ExpectClose(out, ref.out, 1e-5, 1e-4, "attention out");
  ExpectClose(lse, ref.lse, 1e-5, 1e-4, "attention lse");
  std::vector<float> dqkv(s.qkv(), 0.5f);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH,
                    s.kv(), s.HS);
  for (float& g : dqkv) g -= 0.5f;  // backward accumulates
  ExpectClose(dqkv, ref.dqkv, 1e-4, 1e-3, "attention dqkv");
}

TEST(AttentionTest, SmallMatchesNaive) { ExpectMatchesNaive({.B = 2, .T = 5, .NH = 3, .HS = 4}, 60); }

TEST(AttentionTest, SeveralTilesMatchNaive) {
  // T = 150 spans three 64-query tiles, the last one partial; B·NH = 4 pairs across threads.
  ExpectMatchesNaive({.B = 2, .T = 150, .NH = 2, .HS = 16}, 62);
}

TEST(AttentionTest, GroupedQueryMatchesNaive) {
  // Three query heads per key/value head (Llama's GQA), across tiles; the key and value gradients
  // sum over their queries. And one key/value head for all (multi-query attention).
  ExpectMatchesNaive({.B = 2, .T = 70, .NH = 6, .HS = 8, .KVH = 2}, 68);
  ExpectMatchesNaive({.B = 1, .T = 9, .NH = 4, .HS = 4, .KVH = 1}, 69);
}

TEST(AttentionTest, FourLaneExpMatchesNaive) {
  // The exponentials at four lanes, as on a CPU without AVX-512 (vector_width.h).
  UseBaselineVectors(true);
  ExpectMatchesNaive({.B = 2, .T = 150, .NH = 2, .HS = 16}, 63);
  UseBaselineVectors(false);
}

TEST(AttentionTest, BackwardMatchesFiniteDifferences) {
  const Shape s{.B = 1, .T = 4, .NH = 4, .HS = 3, .KVH = 2};
  auto qkv = RandomVector(s.qkv(), 64, -1.5f, 1.5f);
  const auto w = RandomVector(s.out(), 65);
  auto loss = [&] {
    std::vector<float> out(s.out()), lse(s.lse());
    AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.HS);
    return WeightedSum(out, w);
  };
  std::vector<float> out(s.out()), lse(s.lse()), dqkv(s.qkv(), 0.0f);
  AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.kv(), s.HS);
  AttentionBackward(dqkv.data(), w.data(), qkv.data(), out.data(), lse.data(), s.B, s.T, s.NH,
                    s.kv(), s.HS);
  ExpectGradientMatches(loss, qkv, dqkv, "attention dqkv");
}

TEST(AttentionTest, HeadSubsetEqualsTheSameHeadsOfTheFullAttention) {
  // What a tensor-parallel rank does: run the kernel on the qkv of its own heads only.
  const Shape full{.B = 2, .T = 70, .NH = 4, .HS = 8};
  const int h0 = 1, nh = 2;  // heads {1, 2}
  const Shape part{.B = full.B, .T = full.T, .NH = nh, .HS = full.HS};
  const auto qkv = RandomVector(full.qkv(), 66);
  const auto dout = RandomVector(full.out(), 67);
  std::vector<float> out(full.out()), lse(full.lse()), dqkv(full.qkv(), 0.0f);
  AttentionForward(out.data(), lse.data(), qkv.data(), full.B, full.T, full.NH, full.NH, full.HS);
  AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), full.B, full.T,
                    full.NH, full.NH, full.HS);

  std::vector<float> sub_qkv(part.qkv()), sub_dout(part.out());
  for (int b = 0; b < full.B; ++b) {
    for (int t = 0; t < full.T; ++t) {
      for (int h = 0; h < nh; ++h) {
        for (int p = 0; p < 3; ++p)
          std::copy_n(&qkv[full.Q(b, t, p, h0 + h)], full.HS, &sub_qkv[part.Q(b, t, p, h)]);
        std::copy_n(&dout[full.O(b, t, h0 + h)], full.HS, &sub_dout[part.O(b, t, h)]);
      }
    }
  }
  std::vector<float> sub_out(part.out()), sub_lse(part.lse()), sub_dqkv(part.qkv(), 0.0f);
  AttentionForward(sub_out.data(), sub_lse.data(), sub_qkv.data(), part.B, part.T, part.NH, part.NH,
                   part.HS);
  AttentionBackward(sub_dqkv.data(), sub_dout.data(), sub_qkv.data(), sub_out.data(),
                    sub_lse.data(), part.B, part.T, part.NH, part.NH, part.HS);
  // Heads are computed independently, in the same order: the results are identical, not just close.
  for (int b = 0; b < full.B; ++b) {
    for (int t = 0; t < full.T; ++t) {
      for (int h = 0; h < nh; ++h) {
        for (int d = 0; d < full.HS; ++d) {
          ASSERT_EQ(sub_out[part.O(b, t, h) + d], out[full.O(b, t, h0 + h) + d]);
          for (int p = 0; p < 3; ++p)
            ASSERT_EQ(sub_dqkv[part.Q(b, t, p, h) + d], dqkv[full.Q(b, t, p, h0 + h) + d]);
        }
        ASSERT_EQ(sub_lse[(b * nh + h) * full.T + t], lse[(b * full.NH + h0 + h) * full.T + t]);
      }
    }
  }
}

}  // namespace
}  // namespace shardline::kernels::cpu
