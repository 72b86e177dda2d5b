#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/vector_math.h"

namespace shardline::kernels::cpu {
namespace {

// 64 queries × 64 keys: a tile's scores (16 KiB) and a K and a V tile at HS = 64 (16 KiB each) stay
// in L1/L2 while the tile's products run.
constexpr int kQueryTile = 64;
constexpr int kKeyTile = 64;

// The heads of one token's row of qkv: NH queries, then KVH keys, then KVH values.
struct QkvHeads {
  int NH, KVH, HS;
  int64_t RowWidth() const { return int64_t{NH + 2 * KVH} * HS; }
  // Query head h's vector of token (b, t).
  int64_t Query(int b, int t, int h, int T) const {
    return (int64_t{b} * T + t) * RowWidth() + int64_t{h} * HS;
  }
  // Key / value head kv's vector of token (b, t).
  int64_t Key(int b, int t, int kv, int T) const {
    return (int64_t{b} * T + t) * RowWidth() + int64_t{NH + kv} * HS;
  }
  int64_t Value(int b, int t, int kv, int T) const {
    return (int64_t{b} * T + t) * RowWidth() + int64_t{NH + KVH + kv} * HS;
  }
  // The key/value head query head h reads: each of the KVH serves NH / KVH consecutive queries.
  int KvOf(int h) const { return h / (NH / KVH); }
};

inline int64_t OutOffset(int b, int t, int h, int T, int NH, int HS) {
  return (int64_t{b} * T + t) * int64_t{NH} * HS + int64_t{h} * HS;
}

// A tile product through the BLAS, row-major: c (m×n) = a·b (+ c when accumulate). The tiles are
// small (64×64×HS); the BLAS's small-matrix kernels run them at 5-10× a hand loop of this file's
// vector width (baseline x86-64, no -march), which the row-at-a-time kernel before this was: 16
// GFLOP/s at GPT-2-small's HS. Called inside the pairs' parallel region, MKL (GNU OpenMP layer)
// runs each call on the calling thread, so a head's result does not depend on the thread count.
void TileGemm(bool trans_a, bool trans_b, int m, int n, int k, const float* a, int lda,
              const float* b, int ldb, float* c, int ldc, bool accumulate) {
  Sgemm()(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans,
          m, n, k, 1.0f, a, lda, b, ldb, accumulate ? 1.0f : 0.0f, c, ldc);
}

// Per-thread copies of one head's vectors, made contiguous: in qkv consecutive tokens of one head
// are a whole row of qkv apart, which would touch a new cache line (and page, at large C) per
// token.
struct HeadScratch {
  std::vector<float> q;       // (T,HS), pre-scaled by 1/√HS
  std::vector<float> k;       // (T,HS)
  std::vector<float> v;       // (T,HS)
  std::vector<float> scores;  // (kQueryTile, kKeyTile): a tile's scores, then probabilities
  std::vector<float> acc;     // forward: (kQueryTile, HS), the tile's unnormalised output

  void Pack(const float* qkv, int b, int h, int T, const QkvHeads& heads, float scale) {
    const int HS = heads.HS;
    const int kv = heads.KvOf(h);
    q.resize(static_cast<size_t>(T) * HS);
    k.resize(static_cast<size_t>(T) * HS);
    v.resize(static_cast<size_t>(T) * HS);
    scores.resize(static_cast<size_t>(kQueryTile) * kKeyTile);
    acc.resize(static_cast<size_t>(kQueryTile) * HS);
    for (int t = 0; t < T; ++t) {
      const float* qs = qkv + heads.Query(b, t, h, T);
      const float* ks = qkv + heads.Key(b, t, kv, T);
      const float* vs = qkv + heads.Value(b, t, kv, T);
      float* qd = q.data() + int64_t{t} * HS;
      float* kd = k.data() + int64_t{t} * HS;
      float* vd = v.data() + int64_t{t} * HS;
      for (int d = 0; d < HS; ++d) {
        qd[d] = qs[d] * scale;
        kd[d] = ks[d];
        vd[d] = vs[d];
      }
    }
  }
};

// The keys of tile j0 (n of them) that query i sees: 0 when the whole tile is after it.
inline int VisibleKeys(int i, int j0, int n) { return std::clamp(i + 1 - j0, 0, n); }

void ForwardHead(HeadScratch& scratch, float* out, float* lse, int b, int h, int T, int NH, int HS) {
  float row_max[kQueryTile];
  float row_sum[kQueryTile];
  float* acc = scratch.acc.data();
  for (int i0 = 0; i0 < T; i0 += kQueryTile) {
    const int rows = std::min(kQueryTile, T - i0);
    std::fill(acc, acc + int64_t{rows} * HS, 0.0f);
    std::fill(row_max, row_max + rows, -INFINITY);
    std::fill(row_sum, row_sum + rows, 0.0f);
    const int last_key = i0 + rows - 1;  // causal: no query of this tile sees past it
    for (int j0 = 0; j0 <= last_key; j0 += kKeyTile) {
      const int n = std::min(kKeyTile, last_key + 1 - j0);
      float* s = scratch.scores.data();  // (rows, n)
      TileGemm(false, true, rows, n, HS, scratch.q.data() + int64_t{i0} * HS, HS,
               scratch.k.data() + int64_t{j0} * HS, HS, s, n, false);
      for (int r = 0; r < rows; ++r) {
        float* sr = s + int64_t{r} * n;
        const int visible = VisibleKeys(i0 + r, j0, n);
        if (visible > 0) {
          // Not std::fmax: its NaN rule keeps the loop scalar; a NaN score poisons the row
          // through the exponentials all the same.
          float tile_max = -INFINITY;
#pragma omp simd reduction(max : tile_max)
          for (int j = 0; j < visible; ++j) tile_max = sr[j] > tile_max ? sr[j] : tile_max;
          const float new_max = std::fmax(row_max[r], tile_max);
          // Online softmax: rescale what was accumulated under the old max.
          const float correction = std::exp(row_max[r] - new_max);
          float* a = acc + int64_t{r} * HS;
          for (int d = 0; d < HS; ++d) a[d] *= correction;
          ExpShiftedInto(sr, sr, new_max, visible);  // the tile's probabilities (unnormalised)
          float tile_sum = 0.0f;
#pragma omp simd reduction(+ : tile_sum)
          for (int j = 0; j < visible; ++j) tile_sum += sr[j];
          const float sum = row_sum[r] * correction + tile_sum;
          row_max[r] = new_max;
          row_sum[r] = sum;
        }
        std::fill(sr + visible, sr + n, 0.0f);  // the causal mask
      }
      TileGemm(false, false, rows, HS, n, s, n, scratch.v.data() + int64_t{j0} * HS, HS, acc, HS,
               true);
    }
    for (int r = 0; r < rows; ++r) {
      const int i = i0 + r;
      const float inv = 1.0f / row_sum[r];
      float* o = out + OutOffset(b, i, h, T, NH, HS);
      const float* a = acc + int64_t{r} * HS;
      for (int d = 0; d < HS; ++d) o[d] = a[d] * inv;
      lse[(int64_t{b} * NH + h) * T + i] = row_max[r] + std::log(row_sum[r]);
    }
  }
}

// Gradients of one head, tile by tile. With s = q̂·k (q̂ = q/√HS), p = exp(s − lse):
//   dv_j += Σ_i p_ij·do_i;  dp_ij = do_i·v_j;  ds_ij = p_ij·(dp_ij − D_i), D_i = do_i·o_i;
//   dq̂_i += Σ_j ds_ij·k_j;  dk_j += Σ_i ds_ij·q̂_i;  and dq = dq̂/√HS.
//
// dk and dv (T,HS each) accumulate: the caller sums a key/value head's gradient over the query
// heads that read it before adding it to dqkv. dq goes straight into dqkv.
void BackwardHead(HeadScratch& scratch, float* dqkv, std::vector<float>& dk, std::vector<float>& dv,
                  const float* dout, const float* out, const float* lse, int b, int h, int T,
                  int NH, int HS, float scale, const QkvHeads& heads) {
  const size_t head_size = static_cast<size_t>(T) * HS;
  std::vector<float> dq(head_size, 0.0f);
  std::vector<float> dout_rows(head_size), delta(T);
  // do made contiguous, as in Pack(), and D_i = do_i·o_i.
  for (int t = 0; t < T; ++t) {
    const float* dor = dout + OutOffset(b, t, h, T, NH, HS);
    const float* orow = out + OutOffset(b, t, h, T, NH, HS);
    float dot = 0.0f;
    for (int d = 0; d < HS; ++d) {
      dout_rows[int64_t{t} * HS + d] = dor[d];
      dot += dor[d] * orow[d];
    }
    delta[t] = dot;
  }
  std::vector<float> dp(static_cast<size_t>(kQueryTile) * kKeyTile);
  const float* head_lse = lse + (int64_t{b} * NH + h) * T;
  for (int i0 = 0; i0 < T; i0 += kQueryTile) {
    const int rows = std::min(kQueryTile, T - i0);
    const int last_key = i0 + rows - 1;
    const float* qi = scratch.q.data() + int64_t{i0} * HS;
    const float* doi = dout_rows.data() + int64_t{i0} * HS;
    for (int j0 = 0; j0 <= last_key; j0 += kKeyTile) {
      const int n = std::min(kKeyTile, last_key + 1 - j0);
      const float* kj = scratch.k.data() + int64_t{j0} * HS;
      const float* vj = scratch.v.data() + int64_t{j0} * HS;
      float* p = scratch.scores.data();  // (rows, n): scores, then probabilities
      TileGemm(false, true, rows, n, HS, qi, HS, kj, HS, p, n, false);
      TileGemm(false, true, rows, n, HS, doi, HS, vj, HS, dp.data(), n, false);  // do_i·v_j
      for (int r = 0; r < rows; ++r) {
        float* pr = p + int64_t{r} * n;
        float* dsr = dp.data() + int64_t{r} * n;  // dp, then ds in place
        const int visible = VisibleKeys(i0 + r, j0, n);
        ExpShiftedInto(pr, pr, head_lse[i0 + r], visible);
        const float di = delta[i0 + r];
        for (int j = 0; j < visible; ++j) dsr[j] = pr[j] * (dsr[j] - di);
        std::fill(pr + visible, pr + n, 0.0f);  // the causal mask
        std::fill(dsr + visible, dsr + n, 0.0f);
      }
      TileGemm(true, false, n, HS, rows, p, n, doi, HS, dv.data() + int64_t{j0} * HS, HS, true);
      TileGemm(true, false, n, HS, rows, dp.data(), n, qi, HS, dk.data() + int64_t{j0} * HS, HS,
               true);
      TileGemm(false, false, rows, HS, n, dp.data(), n, kj, HS, dq.data() + int64_t{i0} * HS, HS,
               true);
    }
  }
  for (int t = 0; t < T; ++t) {
    float* gq = dqkv + heads.Query(b, t, h, T);
    for (int d = 0; d < HS; ++d) gq[d] += dq[int64_t{t} * HS + d] * scale;
  }
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int NH, int KVH,
                      int HS) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const QkvHeads heads{NH, KVH, HS};
  const int pairs = B * NH;
#pragma omp parallel if (pairs > 1 && int64_t{T} * T * HS >= (1 << 14))
  {
    HeadScratch scratch;
#pragma omp for schedule(static)
    for (int pair = 0; pair < pairs; ++pair) {
      const int b = pair / NH;
      const int h = pair % NH;
      scratch.Pack(qkv, b, h, T, heads, scale);
      ForwardHead(scratch, out, lse, b, h, T, NH, HS);
    }
  }
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* out,
                       const float* lse, int B, int T, int NH, int KVH, int HS) {
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const QkvHeads heads{NH, KVH, HS};
  const int group = NH / KVH;
  // Threads take whole (b, key/value head) pairs with all the query heads that read the head, so
  // no two threads add to the same key or value gradient and the sums' order is fixed.
  const int pairs = B * KVH;
#pragma omp parallel if (pairs > 1 && int64_t{T} * T * HS >= (1 << 14))
  {
    HeadScratch scratch;
    std::vector<float> dk, dv;
#pragma omp for schedule(static)
    for (int pair = 0; pair < pairs; ++pair) {
      const int b = pair / KVH;
      const int kv = pair % KVH;
      dk.assign(static_cast<size_t>(T) * HS, 0.0f);
      dv.assign(static_cast<size_t>(T) * HS, 0.0f);
      for (int h = kv * group; h < (kv + 1) * group; ++h) {
        scratch.Pack(qkv, b, h, T, heads, scale);
        BackwardHead(scratch, dqkv, dk, dv, dout, out, lse, b, h, T, NH, HS, scale, heads);
      }
      for (int t = 0; t < T; ++t) {
        float* gk = dqkv + heads.Key(b, t, kv, T);
        float* gv = dqkv + heads.Value(b, t, kv, T);
        for (int d = 0; d < HS; ++d) {
          gk[d] += dk[int64_t{t} * HS + d];
          gv[d] += dv[int64_t{t} * HS + d];
        }
      }
    }
  }
}

}  // namespace shardline::kernels::cpu
