#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/vector_math.h"

namespace shardline::kernels::cpu {
namespace {

// 64 queries × 64 keys: a K tile and a V tile at HS = 64 are 16 KiB each, which with the score row
// and the accumulators fits the 32-48 KiB L1 of current x86 cores.
constexpr int kQueryTile = 64;
constexpr int kKeyTile = 64;

// Where head h's query, key (part 1) or value (part 2) vector of token (b, t) starts in qkv.
inline int64_t QkvOffset(int b, int t, int part, int h, int T, int NH, int HS) {
  return ((int64_t{b} * T + t) * 3 + part) * int64_t{NH} * HS + int64_t{h} * HS;
}

inline int64_t OutOffset(int b, int t, int h, int T, int NH, int HS) {
  return (int64_t{b} * T + t) * int64_t{NH} * HS + int64_t{h} * HS;
}

// Per-thread copies of one head's vectors, made contiguous: in qkv consecutive tokens of one head
// are 3·C floats apart, which would touch a new cache line (and page, at large C) per token.
struct HeadScratch {
  std::vector<float> q;   // (T,HS), pre-scaled by 1/√HS
  std::vector<float> kt;  // (HS,T): keys transposed, so a query·key row is a unit-stride loop over keys
  std::vector<float> v;   // (T,HS)
  std::vector<float> k;   // (T,HS): row-major keys too, for the backward's dq̂ += ds·k (empty in forward)
  std::vector<float> scores;  // (kKeyTile)

  void Pack(const float* qkv, int b, int h, int T, int NH, int HS, float scale, bool row_keys) {
    q.resize(static_cast<size_t>(T) * HS);
    if (row_keys) k.resize(static_cast<size_t>(T) * HS);
    kt.resize(static_cast<size_t>(T) * HS);
    v.resize(static_cast<size_t>(T) * HS);
    scores.resize(kKeyTile);
    for (int t = 0; t < T; ++t) {
      const float* qs = qkv + QkvOffset(b, t, 0, h, T, NH, HS);
      const float* ks = qkv + QkvOffset(b, t, 1, h, T, NH, HS);
      const float* vs = qkv + QkvOffset(b, t, 2, h, T, NH, HS);
      for (int d = 0; d < HS; ++d) {
        q[int64_t{t} * HS + d] = qs[d] * scale;
        kt[int64_t{d} * T + t] = ks[d];
        if (row_keys) k[int64_t{t} * HS + d] = ks[d];
        v[int64_t{t} * HS + d] = vs[d];
      }
    }
  }

  // scores[0..n) = q_i · k_{j0..j0+n).
  void Scores(int i, int j0, int n, int T, int HS) {
    float* s = scores.data();
    std::fill(s, s + n, 0.0f);
    const float* qi = q.data() + int64_t{i} * HS;
    for (int d = 0; d < HS; ++d) {
      const float qd = qi[d];
      const float* kd = kt.data() + int64_t{d} * T + j0;
      for (int j = 0; j < n; ++j) s[j] += qd * kd[j];
    }
  }
};

void ForwardHead(HeadScratch& scratch, float* out, float* lse, int b, int h, int T, int NH, int HS) {
  std::vector<float> acc(static_cast<size_t>(kQueryTile) * HS);
  float row_max[kQueryTile];
  float row_sum[kQueryTile];
  for (int i0 = 0; i0 < T; i0 += kQueryTile) {
    const int rows = std::min(kQueryTile, T - i0);
    std::fill(acc.begin(), acc.end(), 0.0f);
    std::fill(row_max, row_max + rows, -INFINITY);
    std::fill(row_sum, row_sum + rows, 0.0f);
    const int last_key = i0 + rows - 1;  // causal: no query of this tile sees past it
    for (int j0 = 0; j0 <= last_key; j0 += kKeyTile) {
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        const int n = std::min(kKeyTile, i + 1 - j0);
        if (n <= 0) continue;
        scratch.Scores(i, j0, n, T, HS);
        float* s = scratch.scores.data();
        float tile_max = -INFINITY;
        for (int j = 0; j < n; ++j) tile_max = std::fmax(tile_max, s[j]);
        const float new_max = std::fmax(row_max[r], tile_max);
        // Online softmax: rescale what was accumulated under the old max.
        const float correction = std::exp(row_max[r] - new_max);
        float* a = acc.data() + int64_t{r} * HS;
        float sum = row_sum[r] * correction;
        for (int d = 0; d < HS; ++d) a[d] *= correction;
        ExpShiftedInto(s, s, new_max, n);  // the tile's probabilities (unnormalised)
        for (int j = 0; j < n; ++j) {
          const float p = s[j];
          sum += p;
          const float* vj = scratch.v.data() + int64_t{j0 + j} * HS;
          for (int d = 0; d < HS; ++d) a[d] += p * vj[d];
        }
        row_max[r] = new_max;
        row_sum[r] = sum;
      }
    }
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const float inv = 1.0f / row_sum[r];
      float* o = out + OutOffset(b, i, h, T, NH, HS);
      const float* a = acc.data() + int64_t{r} * HS;
      for (int d = 0; d < HS; ++d) o[d] = a[d] * inv;
      lse[(int64_t{b} * NH + h) * T + i] = row_max[r] + std::log(row_sum[r]);
    }
  }
}

// Gradients of one head. With s = q̂·k (q̂ = q/√HS), p = exp(s − lse):
//   dv_j += Σ_i p_ij·do_i;  dp_ij = do_i·v_j;  ds_ij = p_ij·(dp_ij − D_i), D_i = do_i·o_i;
//   dq̂_i += Σ_j ds_ij·k_j;  dk_j += Σ_i ds_ij·q̂_i;  and dq = dq̂/√HS.
void BackwardHead(HeadScratch& scratch, float* dqkv, const float* dout, const float* out,
                  const float* lse, int b, int h, int T, int NH, int HS, float scale) {
  const size_t head_size = static_cast<size_t>(T) * HS;
  std::vector<float> dq(head_size, 0.0f), dk(head_size, 0.0f), dv(head_size, 0.0f);
  std::vector<float> vt(head_size), dout_rows(head_size), delta(T);
  // V transposed for the do·v rows, and do made contiguous, as in Pack().
  for (int t = 0; t < T; ++t) {
    const float* dor = dout + OutOffset(b, t, h, T, NH, HS);
    const float* orow = out + OutOffset(b, t, h, T, NH, HS);
    float dot = 0.0f;
    for (int d = 0; d < HS; ++d) {
      vt[int64_t{d} * T + t] = scratch.v[int64_t{t} * HS + d];
      dout_rows[int64_t{t} * HS + d] = dor[d];
      dot += dor[d] * orow[d];
    }
    delta[t] = dot;
  }
  std::vector<float> dp(kKeyTile);
  const float* head_lse = lse + (int64_t{b} * NH + h) * T;
  for (int i0 = 0; i0 < T; i0 += kQueryTile) {
    const int rows = std::min(kQueryTile, T - i0);
    const int last_key = i0 + rows - 1;
    for (int j0 = 0; j0 <= last_key; j0 += kKeyTile) {
      for (int r = 0; r < rows; ++r) {
        const int i = i0 + r;
        const int n = std::min(kKeyTile, i + 1 - j0);
        if (n <= 0) continue;
        scratch.Scores(i, j0, n, T, HS);
        float* p = scratch.scores.data();
        ExpShiftedInto(p, p, head_lse[i], n);
        const float* doi = dout_rows.data() + int64_t{i} * HS;
        std::fill(dp.begin(), dp.begin() + n, 0.0f);
        for (int d = 0; d < HS; ++d) {
          const float g = doi[d];
          const float* vd = vt.data() + int64_t{d} * T + j0;
          for (int j = 0; j < n; ++j) dp[j] += g * vd[j];
        }
        const float* qi = scratch.q.data() + int64_t{i} * HS;
        float* dqi = dq.data() + int64_t{i} * HS;
        for (int j = 0; j < n; ++j) {
          const float ds = p[j] * (dp[j] - delta[i]);
          const float pj = p[j];
          const float* kj = scratch.k.data() + int64_t{j0 + j} * HS;
          float* dvj = dv.data() + int64_t{j0 + j} * HS;
          float* dkj = dk.data() + int64_t{j0 + j} * HS;
          for (int d = 0; d < HS; ++d) {
            dvj[d] += pj * doi[d];
            dkj[d] += ds * qi[d];
            dqi[d] += ds * kj[d];
          }
        }
      }
    }
  }
  for (int t = 0; t < T; ++t) {
    float* gq = dqkv + QkvOffset(b, t, 0, h, T, NH, HS);
    float* gk = dqkv + QkvOffset(b, t, 1, h, T, NH, HS);
    float* gv = dqkv + QkvOffset(b, t, 2, h, T, NH, HS);
    for (int d = 0; d < HS; ++d) {
      gq[d] += dq[int64_t{t} * HS + d] * scale;
      gk[d] += dk[int64_t{t} * HS + d];
      gv[d] += dv[int64_t{t} * HS + d];
    }
  }
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH, int HS) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int pairs = B * NH;
#pragma omp parallel if (pairs > 1 && int64_t{T} * T * HS >= (1 << 14))
  {
    HeadScratch scratch;
#pragma omp for schedule(static)
    for (int pair = 0; pair < pairs; ++pair) {
      const int b = pair / NH;
      const int h = pair % NH;
      scratch.Pack(qkv, b, h, T, NH, HS, scale, /*row_keys=*/false);
      ForwardHead(scratch, out, lse, b, h, T, NH, HS);
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int B, int T, int NH, int HS) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int pairs = B * NH;
#pragma omp parallel if (pairs > 1 && int64_t{T} * T * HS >= (1 << 14))
  {
    HeadScratch scratch;
#pragma omp for schedule(static)
    for (int pair = 0; pair < pairs; ++pair) {
      const int b = pair / NH;
      const int h = pair % NH;
      scratch.Pack(qkv, b, h, T, NH, HS, scale, /*row_keys=*/true);
      BackwardHead(scratch, dqkv, dout, out, lse, b, h, T, NH, HS, scale);
    }
  }
}

}  // namespace shardline::kernels::cpu
