#include "kernels/cpu/paged_attention.h"

#include <omp.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/avx512.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/vector_math.h"
#include "kernels/cpu/vector_width.h"

namespace shardline::kernels::cpu {
namespace {

// Positions per online-softmax update: one max, one rescale of the accumulator and one call of the
// vectorised exp per 64 scores (the training kernel's key tile). Counted from position 0, not from
// a block or from the step's first token, so where the rescales fall depends on the position alone
// (the batch and block-size invariance of the header).
constexpr int kChunk = 64;

// A dot product's accumulators: two four-float vectors on baseline x86-64, so that consecutive
// adds do not wait on each other's latency.
constexpr int kLanes = 8;

// Σ a·b in an order written out here (lane l sums elements l, l + 8, ...; then the lanes pairwise)
// rather than left to an `omp simd` reduction, so its bits depend neither on how the compiler
// vectorises nor on alignment: the same key gives the same score in every call.
inline float Dot(const float* a, const float* b, int n) {
  float lanes[kLanes] = {};
  int d = 0;
  for (; d + kLanes <= n; d += kLanes) {
#pragma omp simd
    for (int l = 0; l < kLanes; ++l) lanes[l] += a[d + l] * b[d + l];
  }
  for (int l = 0; d < n; ++l, ++d) lanes[l] += a[d] * b[d];
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

const int32_t* TableRow(const PagedAttentionBatch& batch, int seq) {
  return batch.block_tables + int64_t{seq} * batch.max_blocks_per_seq;
}

// Where the cache slot (block, offset) starts: its KVH·HS floats, head by head.
inline int64_t SlotOffset(int32_t block, int offset, int block_size, int KVH, int HS) {
  return (int64_t{block} * block_size + offset) * KVH * HS;
}

void CheckToken([[maybe_unused]] const PagedAttentionBatch& batch, [[maybe_unused]] int i) {
  assert(batch.token_seq[i] >= 0 && batch.token_seq[i] < batch.num_seqs);
  assert(batch.positions[i] >= 0 &&
         batch.positions[i] / batch.block_size < batch.max_blocks_per_seq);
}

// Where key/value head kv's rows of positions c0 .. c0 + n − 1 start, through the block table:
// one lookup per block, not a division per position.
void FindRows(const float** k_rows, const float** v_rows, const float* k_cache,
              const float* v_cache, const int32_t* table, int c0, int n, int kv,
              const PagedAttentionBatch& batch, int KVH, int HS) {
  const int block_size = batch.block_size;
  const int64_t stride = int64_t{KVH} * HS;  // from one position of a head to the next in a block
  for (int j = 0; j < n;) {
    const int p = c0 + j;
    const int32_t block = table[p / block_size];
    assert(block >= 0 && block < batch.num_blocks);
    const int offset = p % block_size;
    const int run = std::min(block_size - offset, n - j);
    const int64_t first = SlotOffset(block, offset, block_size, KVH, HS) + int64_t{kv} * HS;
    for (int r = 0; r < run; ++r, ++j) {
      k_rows[j] = k_cache + first + r * stride;
      v_rows[j] = v_cache + first + r * stride;
    }
  }
}

// Asks for a row of HS floats in cache ahead of its use. A head's rows are KVH·HS floats apart
// (a few KiB at real sizes), too far apart for the hardware's stride prefetcher: without this a
// decode over a cache in DRAM waits out a miss per row (on the 2-core dev VM, a step of 32
// sequences × 1024 positions, NH = 12, HS = 64, one thread: 45 ms without, 21 ms with; 8
// positions ahead was faster than 4 or 16).
inline void Prefetch(const float* row, int HS) {
  for (int d = 0; d < HS; d += 16) __builtin_prefetch(row + d);  // 16 floats: a cache line
  __builtin_prefetch(row + HS - 1);                              // a row not aligned to lines
}

// The most query heads one unit of ForwardHeads16 takes (its offsets live on the stack).
constexpr int kMaxHeadsPerUnit = 256;

// How many positions ahead the scores loop prefetches keys.
constexpr int kAhead = 8;

// One (token, query head) pair: out_row (HS) = softmax(q·kᵀ/√HS)·v over positions 0..pos of the
// sequence whose block table is `table`, keys and values of head kv. q_scaled and acc are the
// thread's scratch (HS each).
void ForwardPair(float* out_row, const float* q, const float* k_cache, const float* v_cache,
                 const int32_t* table, int pos, int kv, const PagedAttentionBatch& batch, int KVH,
                 int HS, float scale, float* q_scaled, float* acc) {
  for (int d = 0; d < HS; ++d) {
    q_scaled[d] = q[d] * scale;  // as the training kernel: scaled once, before the products
    acc[d] = 0.0f;
  }
  float row_max = -INFINITY;
  float row_sum = 0.0f;
  float s[kChunk];  // a chunk's scores, then its probabilities (unnormalised)
  // The chunk's rows, and the next chunk's first kAhead ones to prefetch.
  const float* k_rows[kChunk + kAhead];
  const float* v_rows[kChunk + kAhead];
  for (int c0 = 0; c0 <= pos; c0 += kChunk) {
    const int n = std::min(kChunk, pos + 1 - c0);
    const int found = std::min(kChunk + kAhead, pos + 1 - c0);
    FindRows(k_rows, v_rows, k_cache, v_cache, table, c0, found, kv, batch, KVH, HS);
    if (c0 == 0) {
      for (int j = 0; j < std::min(kAhead, n); ++j) Prefetch(k_rows[j], HS);
    }
    for (int j = 0; j < n; ++j) {
      if (j + kAhead < found) Prefetch(k_rows[j + kAhead], HS);
      Prefetch(v_rows[j], HS);  // for the values' loop below
      s[j] = Dot(q_scaled, k_rows[j], HS);
    }
    // Not std::fmax: its NaN rule keeps the loop scalar (as in attention.cc); a max is exact, so
    // the lanes' order does not matter.
    float chunk_max = -INFINITY;
#pragma omp simd reduction(max : chunk_max)
    for (int j = 0; j < n; ++j) chunk_max = s[j] > chunk_max ? s[j] : chunk_max;
    const float new_max = std::fmax(row_max, chunk_max);
    // Online softmax: rescale what was accumulated under the old max (0 on the first chunk).
    const float correction = std::exp(row_max - new_max);
    ExpShiftedInto(s, s, new_max, n);
    float chunk_sum = 0.0f;
    for (int j = 0; j < n; ++j) chunk_sum += s[j];  // in position order
    row_sum = row_sum * correction + chunk_sum;
    row_max = new_max;
    for (int d = 0; d < HS; ++d) acc[d] *= correction;
    for (int j = 0; j < n; ++j) {
      const float p = s[j];
      const float* v = v_rows[j];
#pragma omp simd
      for (int d = 0; d < HS; ++d) acc[d] += p * v[d];  // each element in position order
    }
  }
  const float inv = 1.0f / row_sum;
  for (int d = 0; d < HS; ++d) out_row[d] = acc[d] * inv;
}

// The sixteen-lane twin of ForwardPair, for head sizes of NV·16 (NV <= 8) on AVX-512 CPUs, over
// the query heads [h0, h1) of one token at once: a cache slot holds a position's key/value heads
// side by side, so reading them together streams each key and value row segment from memory in one
// run, where a pair alone reads 64 floats every KVH·HS (a strided walk the hardware prefetcher does
// not follow); under grouped-query attention the queries of one key/value head reuse its rows from
// L1. Each head's arithmetic is one pair's, in the same order (its scores summed over 16
// lanes with FMAs, then the lanes; the softmax rescaled at the same positions as ForwardPair's;
// the values accumulated in position order with FMAs), so a token's bits do not depend on how its
// heads are grouped, nor on the batch; they differ from ForwardPair's, as the exp's do between
// widths. In a GPT-2-small decode step of 8 sequences at 32-128 positions the four-lane pairs were
// 14% of the step (bench/decode_step_bench, perf).
template <int NV>
__attribute__((target("avx512f"))) inline float Dot16(const float* q, const float* k) {
  __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(q), _mm512_loadu_ps(k));
  for (int i = 1; i < NV; ++i) {
    sum = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * i), _mm512_loadu_ps(k + 16 * i), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

// The lines of `floats` floats from `row`.
inline void PrefetchSpan(const float* row, int floats) {
  for (int d = 0; d < floats; d += 16) {
    _mm_prefetch(reinterpret_cast<const char*>(row + d), _MM_HINT_T0);
  }
}

// A thread's scratch for ForwardHeads16: per head its scaled query and accumulator (HS each), its
// chunk's scores, its running max and sum.
struct HeadsScratch {
  explicit HeadsScratch(int NH, int HS)
      : q(static_cast<size_t>(NH) * HS),
        acc(q.size()),
        s(static_cast<size_t>(NH) * kChunk),
        max(NH),
        sum(NH) {}
  std::vector<float> q, acc, s, max, sum;
};

template <int NV>
__attribute__((target("avx512f"))) void ForwardHeads16(float* out, const float* q,
                                                       const float* k_cache, const float* v_cache,
                                                       const int32_t* table, int pos, int h0,
                                                       int h1, const PagedAttentionBatch& batch,
                                                       int group, int KVH, float scale,
                                                       HeadsScratch& scratch) {
  constexpr int HS = NV * 16;
  const int H = h1 - h0;
  // Query head h0 + g reads key/value head (h0 + g) / group: kv_offset[g]·HS past head kv0's row.
  const int kv0 = h0 / group;
  const int kv1 = (h1 - 1) / group + 1;
  int kv_offset[kMaxHeadsPerUnit];
  for (int g = 0; g < H; ++g) kv_offset[g] = ((h0 + g) / group - kv0) * HS;
  const int kv_span = (kv1 - kv0) * HS;  // the floats of a slot this unit reads
  float* qs = scratch.q.data();
  float* acc = scratch.acc.data();
  const __m512 scaled = _mm512_set1_ps(scale);
  for (int i = 0; i < H * NV; ++i) {
    _mm512_storeu_ps(qs + 16 * i, _mm512_mul_ps(_mm512_loadu_ps(q + h0 * HS + 16 * i), scaled));
    _mm512_storeu_ps(acc + 16 * i, _mm512_setzero_ps());
  }
  std::fill_n(scratch.max.begin(), H, -INFINITY);
  std::fill_n(scratch.sum.begin(), H, 0.0f);
  // Head kv0's rows of the chunk (and of the next chunk's first kAhead).
  const float* k_rows[kChunk + kAhead];
  const float* v_rows[kChunk + kAhead];
  for (int c0 = 0; c0 <= pos; c0 += kChunk) {
    const int n = std::min(kChunk, pos + 1 - c0);
    const int found = std::min(kChunk + kAhead, pos + 1 - c0);
    FindRows(k_rows, v_rows, k_cache, v_cache, table, c0, found, kv0, batch, KVH, HS);
    if (c0 == 0) {
      for (int j = 0; j < std::min(kAhead, n); ++j) PrefetchSpan(k_rows[j], kv_span);
    }
    for (int j = 0; j < n; ++j) {
      if (j + kAhead < found) PrefetchSpan(k_rows[j + kAhead], kv_span);
      PrefetchSpan(v_rows[j], kv_span);
      for (int g = 0; g < H; ++g) {
        scratch.s[g * kChunk + j] = Dot16<NV>(qs + g * HS, k_rows[j] + kv_offset[g]);
      }
    }
    for (int g = 0; g < H; ++g) {
      float* s = scratch.s.data() + g * kChunk;
      float chunk_max = -INFINITY;
      for (int j = 0; j < n; ++j) chunk_max = s[j] > chunk_max ? s[j] : chunk_max;
      const float new_max = std::fmax(scratch.max[g], chunk_max);
      const float correction = std::exp(scratch.max[g] - new_max);
      ExpShiftedInto(s, s, new_max, n);
      float chunk_sum = 0.0f;
      for (int j = 0; j < n; ++j) chunk_sum += s[j];  // in position order
      scratch.sum[g] = scratch.sum[g] * correction + chunk_sum;
      scratch.max[g] = new_max;
      const __m512 c = _mm512_set1_ps(correction);
      for (int i = 0; i < NV; ++i) {
        float* a = acc + g * HS + 16 * i;
        _mm512_storeu_ps(a, _mm512_mul_ps(_mm512_loadu_ps(a), c));
      }
    }
    for (int j = 0; j < n; ++j) {
      for (int g = 0; g < H; ++g) {
        const __m512 p = _mm512_set1_ps(scratch.s[g * kChunk + j]);
        const float* v = v_rows[j] + kv_offset[g];
        for (int i = 0; i < NV; ++i) {
          float* a = acc + g * HS + 16 * i;
          _mm512_storeu_ps(a, _mm512_fmadd_ps(p, _mm512_loadu_ps(v + 16 * i), _mm512_loadu_ps(a)));
        }
      }
    }
  }
  for (int g = 0; g < H; ++g) {
    const __m512 inv = _mm512_set1_ps(1.0f / scratch.sum[g]);
    for (int i = 0; i < NV; ++i) {
      _mm512_storeu_ps(out + (h0 + g) * HS + 16 * i,
                       _mm512_mul_ps(_mm512_loadu_ps(acc + g * HS + 16 * i), inv));
    }
  }
}

using ForwardHeads16Fn = void (*)(float*, const float*, const float*, const float*, const int32_t*,
                                  int, int, int, const PagedAttentionBatch&, int, int, float,
                                  HeadsScratch&);
constexpr ForwardHeads16Fn kForwardHeads16[9] = {
    nullptr,           ForwardHeads16<1>, ForwardHeads16<2>, ForwardHeads16<3>, ForwardHeads16<4>,
    ForwardHeads16<5>, ForwardHeads16<6>, ForwardHeads16<7>, ForwardHeads16<8>};

// The sixteen-lane body for this head size on this CPU, or null.
ForwardHeads16Fn WideHeads(int HS) {
  if (!WideVectors() || HS % 16 != 0 || HS / 16 < 1 || HS / 16 > 8) return nullptr;
  return kForwardHeads16[HS / 16];
}

}  // namespace

void PagedKvWrite(float* k_cache, float* v_cache, const float* qkv,
                  const PagedAttentionBatch& batch, int NH, int KVH, int HS) {
  const int N = batch.num_tokens;
  const int64_t C = int64_t{NH} * HS;    // the queries of a row of qkv
  const int64_t KC = int64_t{KVH} * HS;  // its keys, and its values
  const int64_t row_width = C + 2 * KC;
#pragma omp parallel for schedule(static) if (int64_t{N} * 2 * KC >= kMinParallelWork)
  for (int i = 0; i < N; ++i) {
    CheckToken(batch, i);
    const int pos = batch.positions[i];
    const int32_t block = TableRow(batch, batch.token_seq[i])[pos / batch.block_size];
    assert(block >= 0 && block < batch.num_blocks);
    const int64_t slot = SlotOffset(block, pos % batch.block_size, batch.block_size, KVH, HS);
    const float* row = qkv + int64_t{i} * row_width;
    std::copy_n(row + C, KC, k_cache + slot);
    std::copy_n(row + C + KC, KC, v_cache + slot);
  }
}

void PagedAttentionForward(float* out, const float* qkv, const float* k_cache, const float* v_cache,
                           const PagedAttentionBatch& batch, int NH, int KVH, int HS) {
  const int N = batch.num_tokens;
  const int64_t C = int64_t{NH} * HS;
  const int64_t row_width = C + 2 * int64_t{KVH} * HS;  // of qkv
  const int group = NH / KVH;
  const float scale = 1.0f / std::sqrt(static_cast<float>(HS));
  const int64_t pairs = int64_t{N} * NH;
  // Threads take whole (token, head) pairs, so the thread count changes only who computes a pair,
  // not its bits. Dynamic: the last token of a long prompt reads thousands of positions, a decode
  // of a short sequence a few.
  int64_t positions_read = 0;  // Σ (pos + 1): the work, per head and element, of the step
  for (int i = 0; i < N; ++i) positions_read += batch.positions[i] + 1;
  if (const ForwardHeads16Fn wide = WideHeads(HS); wide != nullptr) {
    // Units of a token's heads: whole tokens when there are enough to share among the threads,
    // else each token's heads in groups (a decode of one sequence still uses every thread).
    const int threads = omp_get_max_threads();
    const int groups = std::clamp((2 * threads + N - 1) / N, 1, NH);
    const int per = std::min((NH + groups - 1) / groups, kMaxHeadsPerUnit);
    const int64_t units = int64_t{N} * ((NH + per - 1) / per);
#pragma omp parallel if (units > 1 && positions_read * 2 * C >= kMinParallelWork)
    {
      HeadsScratch scratch(per, HS);
#pragma omp for schedule(dynamic, 1)
      for (int64_t unit = 0; unit < units; ++unit) {
        const int i = static_cast<int>(unit / ((NH + per - 1) / per));
        const int h0 = static_cast<int>(unit % ((NH + per - 1) / per)) * per;
        CheckToken(batch, i);
        wide(out + int64_t{i} * C, qkv + int64_t{i} * row_width, k_cache, v_cache,
             TableRow(batch, batch.token_seq[i]), batch.positions[i], h0, std::min(NH, h0 + per),
             batch, group, KVH, scale, scratch);
      }
    }
    return;
  }
#pragma omp parallel if (pairs > 1 && positions_read * 2 * C >= kMinParallelWork)
  {
    std::vector<float> scratch(2 * static_cast<size_t>(HS));  // q_scaled, acc
#pragma omp for schedule(dynamic, 1)
    for (int64_t pair = 0; pair < pairs; ++pair) {
      const int i = static_cast<int>(pair / NH);
      const int h = static_cast<int>(pair % NH);
      CheckToken(batch, i);
      ForwardPair(out + int64_t{i} * C + int64_t{h} * HS,
                  qkv + int64_t{i} * row_width + int64_t{h} * HS, k_cache, v_cache,
                  TableRow(batch, batch.token_seq[i]), batch.positions[i], h / group, batch, KVH,
                  HS, scale, scratch.data(), scratch.data() + HS);
    }
  }
}

}  // namespace shardline::kernels::cpu
