// Paged attention over a block KV cache: steps of a continuously batched forward (chunked prefills
// and decodes of several sequences mixed, in shuffled order) against a double-precision attention
// over each sequence's keys and values kept apart from the cache; one whole prompt against the
// training kernel; and batch invariance, bit for bit: a sequence alone, inside a batch, decoded a
// token at a time in another cache, and on 1 or 2 threads.
//
// Every cache slot no token has written is NaN, and so are the blocks no sequence owns (the unused
// entries of the block tables point at one): a read outside a token's positions 0..pos of its own
// sequence shows up as a NaN in its output.
//
// Tolerances: vs the double reference |Δ| <= 1e-5 + 1e-4·|ref| (as kernels_attention_test); vs
// the training kernel |Δ| <= 1e-6 + 1e-5·|ref|.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/vector_width.h"
#include "tests/unit/kernels_test_util.h"

namespace shardline::kernels::cpu {
namespace {

using testing::ExpectClose;
using testing::RandomVector;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Sequences in one layer's paged cache, with their block tables, and each sequence's keys and
// values by position kept apart from the cache (what the reference attends to).
class PagedWorld {
 public:
  // capacities: the most positions each sequence will hold. Its blocks are taken from a shuffled
  // list of all the cache's blocks, so a sequence's blocks are neither contiguous nor in order.
  // KVH: key/value heads (0: NH), each read by NH / KVH consecutive query heads.
  PagedWorld(const std::vector<int>& capacities, int NH, int HS, int block_size, uint32_t seed,
             int KVH = 0)
      : NH_(NH),
        KVH_(KVH > 0 ? KVH : NH),
        HS_(HS),
        C_(NH * HS),
        KC_(KVH_ * HS),
        block_size_(block_size) {
    num_seqs_ = static_cast<int>(capacities.size());
    int needed = 0;
    for (int capacity : capacities) {
      const int blocks = (capacity + block_size - 1) / block_size;
      max_blocks_ = std::max(max_blocks_, blocks);
      needed += blocks;
    }
    max_blocks_ += 1;  // a spare entry per row, pointing at an unowned block
    num_blocks_ = needed + 3;
    std::vector<int32_t> order(num_blocks_);
    std::iota(order.begin(), order.end(), 0);
    std::mt19937 rng(seed);
    std::shuffle(order.begin(), order.end(), rng);
    const int32_t unowned = order[needed];
    tables_.assign(static_cast<size_t>(num_seqs_) * max_blocks_, unowned);
    int next = 0;
    for (int s = 0; s < num_seqs_; ++s) {
      const int blocks = (capacities[s] + block_size - 1) / block_size;
      for (int b = 0; b < blocks; ++b)
        tables_[static_cast<size_t>(s) * max_blocks_ + b] = order[next++];
    }
    const size_t cache_size = static_cast<size_t>(num_blocks_) * block_size * KC_;
    k_cache_.assign(cache_size, kNaN);
    v_cache_.assign(cache_size, kNaN);
    keys_.resize(num_seqs_);
    values_.resize(num_seqs_);
    for (int s = 0; s < num_seqs_; ++s) {
      keys_[s].assign(static_cast<size_t>(capacities[s]) * KC_, kNaN);
      values_[s].assign(static_cast<size_t>(capacities[s]) * KC_, kNaN);
    }
  }

  PagedAttentionBatch Batch(const std::vector<int32_t>& seq,
                            const std::vector<int32_t>& pos) const {
    return {.num_tokens = static_cast<int>(seq.size()),
            .token_seq = seq.data(),
            .positions = pos.data(),
            .block_tables = tables_.data(),
            .num_seqs = num_seqs_,
            .max_blocks_per_seq = max_blocks_,
            .block_size = block_size_,
            .num_blocks = num_blocks_};
  }

  // One step: writes the tokens' keys and values (qkv is (N,NH+2·KVH,HS)) and returns the forward's
  // out (N,NH,HS). Records the keys and values for the reference too.
  std::vector<float> Step(const std::vector<int32_t>& seq, const std::vector<int32_t>& pos,
                          const std::vector<float>& qkv) {
    const PagedAttentionBatch batch = Batch(seq, pos);
    PagedKvWrite(k_cache_.data(), v_cache_.data(), qkv.data(), batch, NH_, KVH_, HS_);
    for (size_t i = 0; i < seq.size(); ++i) {
      const float* row = qkv.data() + i * RowWidth();
      std::copy_n(row + C_, KC_, &keys_[seq[i]][static_cast<size_t>(pos[i]) * KC_]);
      std::copy_n(row + C_ + KC_, KC_, &values_[seq[i]][static_cast<size_t>(pos[i]) * KC_]);
    }
    return Forward(seq, pos, qkv);
  }

  // The forward alone, on what the cache holds now.
  std::vector<float> Forward(const std::vector<int32_t>& seq, const std::vector<int32_t>& pos,
                             const std::vector<float>& qkv) const {
    std::vector<float> out(seq.size() * C_, kNaN);
    PagedAttentionForward(out.data(), qkv.data(), k_cache_.data(), v_cache_.data(), Batch(seq, pos),
                          NH_, KVH_, HS_);
    return out;
  }

  // softmax(q·kᵀ/√HS)·v in double over positions 0..pos of each token's sequence, from the keys
  // and values recorded by Step.
  std::vector<double> Reference(const std::vector<int32_t>& seq, const std::vector<int32_t>& pos,
                                const std::vector<float>& qkv) const {
    std::vector<double> out(seq.size() * C_, 0.0);
    const double scale = 1.0 / std::sqrt(static_cast<double>(HS_));
    for (size_t i = 0; i < seq.size(); ++i) {
      const std::vector<float>& keys = keys_[seq[i]];
      const std::vector<float>& values = values_[seq[i]];
      for (int h = 0; h < NH_; ++h) {
        const float* q = qkv.data() + i * RowWidth() + static_cast<size_t>(h) * HS_;
        const size_t kv = static_cast<size_t>(h / (NH_ / KVH_)) * HS_;
        std::vector<double> p(pos[i] + 1);
        double max = -INFINITY;
        for (int j = 0; j <= pos[i]; ++j) {
          const float* k = keys.data() + static_cast<size_t>(j) * KC_ + kv;
          double dot = 0.0;
          for (int d = 0; d < HS_; ++d) dot += static_cast<double>(q[d]) * k[d];
          p[j] = dot * scale;
          max = std::max(max, p[j]);
        }
        double sum = 0.0;
        for (int j = 0; j <= pos[i]; ++j) sum += p[j] = std::exp(p[j] - max);
        double* o = out.data() + i * C_ + static_cast<size_t>(h) * HS_;
        for (int j = 0; j <= pos[i]; ++j) {
          const float* v = values.data() + static_cast<size_t>(j) * KC_ + kv;
          for (int d = 0; d < HS_; ++d) o[d] += p[j] / sum * v[d];
        }
      }
    }
    return out;
  }

  int C() const { return C_; }
  size_t RowWidth() const { return static_cast<size_t>(C_) + 2 * KC_; }  // of qkv
  const std::vector<float>& keys(int seq) const { return keys_[seq]; }
  const std::vector<float>& values(int seq) const { return values_[seq]; }
  const std::vector<float>& k_cache() const { return k_cache_; }
  const std::vector<float>& v_cache() const { return v_cache_; }
  int32_t Block(int seq, int b) const {
    return tables_[static_cast<size_t>(seq) * max_blocks_ + b];
  }
  int num_blocks() const { return num_blocks_; }

 private:
  int NH_, KVH_, HS_, C_, KC_, block_size_;
  int num_seqs_ = 0, max_blocks_ = 0, num_blocks_ = 0;
  std::vector<int32_t> tables_;
  std::vector<float> k_cache_, v_cache_;
  std::vector<std::vector<float>> keys_, values_;  // per sequence: (capacity, KVH, HS)
};

// Rows of `out` (N,C) for the tokens `rows`, in that order.
std::vector<float> Rows(const std::vector<float>& out, const std::vector<size_t>& rows, int C) {
  std::vector<float> r;
  for (size_t i : rows) r.insert(r.end(), out.begin() + i * C, out.begin() + (i + 1) * C);
  return r;
}

// Bit for bit (NaN included), reporting the first element that differs.
void ExpectBitIdentical(const std::vector<float>& a, const std::vector<float>& b,
                        const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: " << a[i] << " vs " << b[i];
      return;
    }
  }
}

// Sets the OpenMP thread count for the kernels' next regions, and restores it.
class ThreadCount {
 public:
  explicit ThreadCount(int n) : saved_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~ThreadCount() { omp_set_num_threads(saved_); }
  ThreadCount(const ThreadCount&) = delete;
  ThreadCount& operator=(const ThreadCount&) = delete;

 private:
  int saved_;
};

TEST(PagedKvWriteTest, FillsEachTokensSlotAndNothingElse) {
  const int NH = 3, HS = 8, bs = 4;
  PagedWorld world({10, 7}, NH, HS, bs, 70);
  const int C = world.C();
  // Sequence 0's positions 0..5 and sequence 1's 2 and 6, in no particular order.
  const std::vector<int32_t> seq{0, 1, 0, 0, 0, 1, 0, 0};
  const std::vector<int32_t> pos{3, 6, 0, 5, 1, 2, 4, 2};
  const auto qkv = RandomVector(seq.size() * 3 * C, 71);
  world.Step(seq, pos, qkv);
  std::vector<bool> written(world.k_cache().size(), false);
  for (size_t i = 0; i < seq.size(); ++i) {
    const size_t slot =
        (static_cast<size_t>(world.Block(seq[i], pos[i] / bs)) * bs + pos[i] % bs) * C;
    for (int c = 0; c < C; ++c) {
      ASSERT_EQ(world.k_cache()[slot + c], qkv[i * 3 * C + C + c]) << "token " << i;
      ASSERT_EQ(world.v_cache()[slot + c], qkv[i * 3 * C + 2 * C + c]) << "token " << i;
      written[slot + c] = true;
    }
  }
  for (size_t e = 0; e < written.size(); ++e) {
    if (written[e]) continue;
    ASSERT_TRUE(std::isnan(world.k_cache()[e])) << "k_cache[" << e << "] written by no token";
    ASSERT_TRUE(std::isnan(world.v_cache()[e])) << "v_cache[" << e << "] written by no token";
  }
}

// A sequence's steps: from step `start`, one chunk of consecutive positions per step (a chunk of
// several is a chunked prefill, of one a decode); its length is their sum.
struct Schedule {
  int start;
  std::vector<int> chunks;
  int length() const { return std::accumulate(chunks.begin(), chunks.end(), 0); }
};

std::vector<int> Decodes(std::vector<int> prefill, int decodes) {
  prefill.insert(prefill.end(), decodes, 1);
  return prefill;
}

// Runs the schedules step by step, each step's tokens shuffled, and checks every step's output
// against the double reference.
void ExpectStepsMatchReference(int NH, int HS, int block_size, uint32_t seed, int KVH = 0) {
  const std::vector<Schedule> schedules{
      {0, {1}},                     // a one-token prompt, done in one step
      {0, Decodes({9, 9}, 5)},      // 23 positions
      {1, Decodes({30, 30}, 10)},   // 70: across the 64-position chunks of the kernel
      {2, Decodes({100, 40}, 10)},  // 150: two chunk boundaries, inside prefill chunks
      {4, Decodes({}, 6)},          // a prompt fed a token at a time
      {3, Decodes({63, 1, 2}, 3)},  // 69: a chunk ending at position 62, then 63, 64..65
  };
  std::vector<int> capacities;
  int steps = 0;
  for (const Schedule& s : schedules) {
    capacities.push_back(s.length());
    steps = std::max(steps, s.start + static_cast<int>(s.chunks.size()));
  }
  PagedWorld world(capacities, NH, HS, block_size, seed, KVH);
  std::vector<int> next_pos(schedules.size(), 0);
  std::mt19937 rng(seed + 1);
  bool mixed = false;  // some step has a prefill chunk and a decode together
  for (int step = 0; step < steps; ++step) {
    std::vector<std::pair<int32_t, int32_t>> tokens;
    bool prefill = false, decode = false;
    for (size_t s = 0; s < schedules.size(); ++s) {
      const int c = step - schedules[s].start;
      if (c < 0 || c >= static_cast<int>(schedules[s].chunks.size())) continue;
      const int n = schedules[s].chunks[c];
      (n > 1 ? prefill : decode) = true;
      for (int j = 0; j < n; ++j) tokens.emplace_back(static_cast<int32_t>(s), next_pos[s]++);
    }
    mixed = mixed || (prefill && decode);
    std::shuffle(tokens.begin(), tokens.end(), rng);
    std::vector<int32_t> seq, pos;
    for (auto [s, p] : tokens) {
      seq.push_back(s);
      pos.push_back(p);
    }
    const auto qkv = RandomVector(seq.size() * world.RowWidth(), seed + 10 + step, -2.0f, 2.0f);
    const auto out = world.Step(seq, pos, qkv);
    ExpectClose(out, world.Reference(seq, pos, qkv), 1e-5, 1e-4,
                "step " + std::to_string(step) + " out");
    if (::testing::Test::HasFailure()) return;
  }
  EXPECT_TRUE(mixed);
}

class PagedAttentionShapes : public ::testing::TestWithParam<std::tuple<int, int, int>> {};

TEST_P(PagedAttentionShapes, StepsMatchDoubleReference) {
  const auto [block_size, NH, HS] = GetParam();
  ExpectStepsMatchReference(NH, HS, block_size, 80 + block_size + NH + HS);
}

INSTANTIATE_TEST_SUITE_P(BlockSizesAndHeads, PagedAttentionShapes,
                         // Head sizes: the four-lane body's (8), and the sixteen-lane body's with
                         // one, three, four and eight vectors where the CPU has AVX-512.
                         ::testing::Combine(::testing::Values(1, 4, 16), ::testing::Values(1, 3),
                                            ::testing::Values(8, 16, 48, 64, 128)),
                         [](const auto& info) {
                           return "bs" + std::to_string(std::get<0>(info.param)) + "_nh" +
                                  std::to_string(std::get<1>(info.param)) + "_hs" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(PagedAttentionTest, GroupedQueryStepsMatchDoubleReference) {
  // Three query heads per cached key/value head, through the four-lane pairs (HS 8) and the
  // sixteen-lane heads (HS 16, 64) where the CPU has AVX-512; and one cached head for all.
  for (int HS : {8, 16, 64}) ExpectStepsMatchReference(6, HS, 4, 90 + HS, /*KVH=*/2);
  ExpectStepsMatchReference(4, 16, 16, 97, /*KVH=*/1);
}

TEST(PagedAttentionTest, FourLaneExpMatchesDoubleReference) {
  // The exponentials and the pairs at four lanes, as on a CPU without AVX-512 (vector_width.h).
  UseBaselineVectors(true);
  ExpectStepsMatchReference(3, 64, 4, 90);
  UseBaselineVectors(false);
}

class PagedAttentionVsTraining : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PagedAttentionVsTraining, WholePromptEqualsAttentionForward) {
  // One sequence's whole prompt in one step: qkv (N,3,NH,HS) with N = T is the training kernel's
  // (1,T,3,NH,HS), and out (N,NH,HS) its (1,T,NH,HS).
  const auto [block_size, HS] = GetParam();
  const int T = 150, NH = 3;  // T spans three of the training kernel's 64-query tiles
  PagedWorld world({T}, NH, HS, block_size, 100 + block_size);
  const auto qkv = RandomVector(static_cast<size_t>(T) * 3 * NH * HS, 101 + HS, -2.0f, 2.0f);
  std::vector<int32_t> seq(T, 0), pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  const auto out = world.Step(seq, pos, qkv);
  std::vector<float> ref(static_cast<size_t>(T) * NH * HS), lse(static_cast<size_t>(NH) * T);
  AttentionForward(ref.data(), lse.data(), qkv.data(), 1, T, NH, NH, HS);
  ExpectClose(out, ref, 1e-6, 1e-5, "paged vs training attention");
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, PagedAttentionVsTraining,
                         ::testing::Combine(::testing::Values(1, 4, 16), ::testing::Values(8, 64)),
                         [](const auto& info) {
                           return "bs" + std::to_string(std::get<0>(info.param)) + "_hs" +
                                  std::to_string(std::get<1>(info.param));
                         });

TEST(PagedAttentionTest, BatchInvariant) {
  const int NH = 3, HS = 64;
  // X: 40 positions cached, 8 more (40..47) in this step as a prefill chunk. Y: a 100-token prompt
  // in this step. Z and W: decodes at positions 70 and 5.
  const int x = 2;  // X's row of the block tables
  PagedWorld world({100, 71, 48, 6}, NH, HS, 4, 110);
  {
    std::vector<int32_t> seq, pos;
    for (int p = 0; p < 70; ++p) seq.push_back(1), pos.push_back(p);
    for (int p = 0; p < 40; ++p) seq.push_back(x), pos.push_back(p);
    for (int p = 0; p < 5; ++p) seq.push_back(3), pos.push_back(p);
    world.Step(seq, pos, RandomVector(seq.size() * 3 * world.C(), 111, -2.0f, 2.0f));
  }
  std::vector<int32_t> seq, pos;
  for (int p = 0; p < 100; ++p) seq.push_back(0), pos.push_back(p);
  for (int p = 40; p < 48; ++p) seq.push_back(x), pos.push_back(p);
  seq.push_back(1), pos.push_back(70);
  seq.push_back(3), pos.push_back(5);
  std::vector<size_t> order(seq.size());
  std::iota(order.begin(), order.end(), 0);
  std::mt19937 rng(112);
  std::shuffle(order.begin(), order.end(), rng);
  std::vector<int32_t> shuffled_seq, shuffled_pos;
  for (size_t i : order) shuffled_seq.push_back(seq[i]), shuffled_pos.push_back(pos[i]);
  seq = shuffled_seq;
  pos = shuffled_pos;
  const auto qkv = RandomVector(seq.size() * 3 * world.C(), 113, -2.0f, 2.0f);
  const int C = world.C();
  std::vector<size_t> x_rows;  // X's tokens in the batch, by position
  for (int p = 40; p < 48; ++p) {
    for (size_t i = 0; i < seq.size(); ++i)
      if (seq[i] == x && pos[i] == p) x_rows.push_back(i);
  }

  std::vector<float> batched;
  {
    ThreadCount threads(2);
    batched = world.Step(seq, pos, qkv);
  }
  ExpectClose(batched, world.Reference(seq, pos, qkv), 1e-5, 1e-4, "batched out");
  {
    ThreadCount threads(1);
    ExpectBitIdentical(world.Forward(seq, pos, qkv), batched, "1 thread vs 2");
  }
  const std::vector<float> x_batched = Rows(batched, x_rows, C);

  // X alone in the same cache: its 8 tokens, nothing else.
  std::vector<float> x_qkv;
  for (size_t i : x_rows) {
    x_qkv.insert(x_qkv.end(), qkv.begin() + i * 3 * C, qkv.begin() + (i + 1) * 3 * C);
  }
  const std::vector<int32_t> x_seq(8, x);
  std::vector<int32_t> x_pos(8);
  std::iota(x_pos.begin(), x_pos.end(), 40);
  {
    ThreadCount threads(2);
    ExpectBitIdentical(world.Forward(x_seq, x_pos, x_qkv), x_batched, "X alone vs in the batch");
  }

  // X in a cache of its own (blocks of 16, elsewhere, row 0), decoded one token at a time.
  PagedWorld own({48}, NH, HS, 16, 114);
  {
    std::vector<float> prefix_qkv(40 * 3 * static_cast<size_t>(C));
    for (int p = 0; p < 40; ++p) {
      // Query parts are not cached: zeros do for the prefix, whose outputs are not compared.
      std::copy_n(world.keys(x).begin() + static_cast<size_t>(p) * C, C,
                  prefix_qkv.begin() + (static_cast<size_t>(p) * 3 + 1) * C);
      std::copy_n(world.values(x).begin() + static_cast<size_t>(p) * C, C,
                  prefix_qkv.begin() + (static_cast<size_t>(p) * 3 + 2) * C);
    }
    std::vector<int32_t> prefix_pos(40);
    std::iota(prefix_pos.begin(), prefix_pos.end(), 0);
    own.Step(std::vector<int32_t>(40, 0), prefix_pos, prefix_qkv);
  }
  std::vector<float> x_decoded;
  for (int t = 0; t < 8; ++t) {
    const std::vector<float> token_qkv(x_qkv.begin() + static_cast<size_t>(t) * 3 * C,
                                       x_qkv.begin() + static_cast<size_t>(t + 1) * 3 * C);
    const auto out = own.Step({0}, {40 + t}, token_qkv);
    x_decoded.insert(x_decoded.end(), out.begin(), out.end());
  }
  ExpectBitIdentical(x_decoded, x_batched, "X decoded alone in its own cache vs in the batch");
}

}  // namespace
}  // namespace shardline::kernels::cpu
