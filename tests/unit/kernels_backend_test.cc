// The backend interface (kernels/backend.h): every operation the engine calls, run through the CPU
// backend and, where a GPU is usable, through the CUDA backend on the same inputs, the CPU's
// results the reference (as ggml's test-backend-ops). Without a GPU the CUDA cases are skipped
// with cudaGetDeviceCount's reason; the CPU backend's own code (what is not a kernel of
// kernels/cpu/) is checked against values worked out here.
//
// Tolerances as tests/unit/kernels_cuda_test.cc's, which says where each comes from.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/rotary.h"
#include "tests/unit/kernels_test_util.h"
#ifdef SHARDLINE_WITH_CUDA
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_backend.h"
#endif

namespace shardline::kernels {
namespace {

using testing::ExpectClose;
using testing::ExpectScaled;
using testing::RandomVector;

struct Tolerance {
  double atol;
  double rtol;
  bool scaled = false;  // atol relative to the largest |expected| (attention's sums)
};
constexpr Tolerance kExact{0, 0};
constexpr Tolerance kPointwise{1e-6, 1e-5};
constexpr Tolerance kReduction{1e-5, 1e-5};
constexpr Tolerance kGemmF32{1e-4, 1e-4};
constexpr Tolerance kGemmBf16VsF32{5e-2, 1e-2};
constexpr Tolerance kLayerNorm{1e-4, 1e-4};
constexpr Tolerance kAttention{1e-5, 1e-4, true};

// Arrays in one backend's memory, uploaded from and read back to the host; freed with the arena.
class Arena {
 public:
  explicit Arena(Backend& backend) : backend_(backend) {}
  ~Arena() {
    for (auto [ptr, bytes] : blocks_) backend_.allocator().Deallocate(ptr, bytes);
  }
  template <typename T>
  T* Put(const std::vector<T>& host) {
    const size_t bytes = std::max<size_t>(1, host.size() * sizeof(T));
    void* ptr = backend_.allocator().Allocate(bytes).value();
    blocks_.emplace_back(ptr, bytes);
    EXPECT_TRUE(backend_.ToDevice(ptr, host.data(), host.size() * sizeof(T)).ok());
    return static_cast<T*>(ptr);
  }
  float* Zeros(size_t n) { return Put(std::vector<float>(n, 0.0f)); }
  std::vector<float> Get(const float* ptr, size_t n) {
    std::vector<float> host(n);
    EXPECT_TRUE(backend_.ToHost(host.data(), ptr, n * sizeof(float)).ok());
    return host;
  }

 private:
  Backend& backend_;
  std::vector<std::pair<void*, size_t>> blocks_;
};

// One operation on one backend: uploads its inputs, runs, and returns its outputs read back.
using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;
using Op = std::function<Outputs(Backend&, Arena&)>;

Outputs RunOp(Backend& backend, const Op& op) {
  Arena arena(backend);
  Outputs out = op(backend, arena);
  EXPECT_TRUE(backend.Synchronize().ok());
  return out;
}

void ExpectSame(const Outputs& actual, const Outputs& expected, Tolerance tol) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i) {
    if (tol.scaled) {
      ExpectScaled(actual[i].second, expected[i].second, tol.atol, tol.rtol, actual[i].first);
    } else {
      ExpectClose(actual[i].second, expected[i].second, tol.atol, tol.rtol, actual[i].first);
    }
  }
}

std::vector<int32_t> Ids(int n, int bound, uint32_t seed) {
  std::vector<int32_t> ids(n);
  uint32_t x = seed;
  for (int32_t& id : ids) {
    x = x * 1664525u + 1013904223u;
    id = static_cast<int32_t>((x >> 8) % static_cast<uint32_t>(bound));
  }
  return ids;
}

// ---- the operations, each on shapes that cross a kernel's tile and vector widths ----

constexpr int kN = 37, kC = 72, kOC = 50;

Op FillCopyOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    float* x = a.Zeros(kN);
    EXPECT_TRUE(be.Fill(x, kN, 0.375f).ok());
    const std::vector<float> src = RandomVector(kN, 1);
    float* y = a.Zeros(kN);
    EXPECT_TRUE(be.Copy(y, a.Put(src), kN).ok());
    return {{"fill", a.Get(x, kN)}, {"copy", a.Get(y, kN)}};
  };
}

Op AccumulateScaleOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    float* dst = a.Put(RandomVector(kN * kC, 2));
    EXPECT_TRUE(be.Accumulate(dst, a.Put(RandomVector(kN * kC, 3)), kN * kC).ok());
    float* x = a.Put(RandomVector(kN * kC, 4));
    EXPECT_TRUE(be.Scale(x, kN * kC, 0.3f).ok());
    return {{"accumulate", a.Get(dst, kN * kC)}, {"scale", a.Get(x, kN * kC)}};
  };
}

Op LinearOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    float* out = a.Zeros(kN * kOC);
    float* inp = a.Put(RandomVector(kN * kC, 5));
    float* w = a.Put(RandomVector(kOC * kC, 6));
    float* bias = a.Put(RandomVector(kOC, 7));
    EXPECT_TRUE(be.Linear(out, inp, w, nullptr, bias, kN, kC, kOC).ok());
    float* plain = a.Zeros(kN * kOC);
    EXPECT_TRUE(be.Linear(plain, inp, w, nullptr, nullptr, kN, kC, kOC).ok());
    EXPECT_TRUE(be.BiasAdd(plain, bias, kN, kOC).ok());
    return {{"linear", a.Get(out, kN * kOC)}, {"linear + bias add", a.Get(plain, kN * kOC)}};
  };
}

Op LinearBackwardOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    float* dinp = a.Put(std::vector<float>(kN * kC, 0.25f));  // the backward adds
    float* dw = a.Put(std::vector<float>(kOC * kC, 0.25f));
    float* db = a.Put(std::vector<float>(kOC, 0.25f));
    EXPECT_TRUE(be.LinearBackward(dinp, dw, db, a.Put(RandomVector(kN * kOC, 8)),
                                  a.Put(RandomVector(kN * kC, 9)),
                                  a.Put(RandomVector(kOC * kC, 10)), kN, kC, kOC)
                    .ok());
    return {{"dinp", a.Get(dinp, kN * kC)},
            {"dweight", a.Get(dw, kOC * kC)},
            {"dbias", a.Get(db, kOC)}};
  };
}

Op LayerNormOp(float eps) {
  return [eps](Backend& be, Arena& a) -> Outputs {
    const std::vector<float> x = RandomVector(kN * kC, 11, -2.0f, 3.0f);
    float* inp = a.Put(x);
    float* w = a.Put(RandomVector(kC, 12));
    float* b = a.Put(RandomVector(kC, 13));
    float* out = a.Zeros(kN * kC);
    float* mean = a.Zeros(kN);
    float* rstd = a.Zeros(kN);
    EXPECT_TRUE(be.LayerNorm(out, mean, rstd, inp, w, b, kN, kC, eps).ok());
    float* dinp = a.Put(std::vector<float>(kN * kC, 0.25f));
    float* dw = a.Put(std::vector<float>(kC, 0.25f));
    float* db = a.Put(std::vector<float>(kC, 0.25f));
    EXPECT_TRUE(be.LayerNormBackward(dinp, dw, db, a.Put(RandomVector(kN * kC, 14)), inp, w, mean,
                                     rstd, kN, kC)
                    .ok());
    return {{"out", a.Get(out, kN * kC)},   {"mean", a.Get(mean, kN)},  {"rstd", a.Get(rstd, kN)},
            {"dinp", a.Get(dinp, kN * kC)}, {"dweight", a.Get(dw, kC)}, {"dbias", a.Get(db, kC)}};
  };
}

// Llama's pieces: RMSNorm (eps 1e-5) and its backward, SwiGLU's gating and its backward, rotary
// positions (Llama 3 rescaled frequencies) forward and back on strided q/k heads of a qkv row.
Op LlamaPiecesOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    float* inp = a.Put(RandomVector(kN * kC, 50, -2.0f, 3.0f));
    float* w = a.Put(RandomVector(kC, 51, 0.5f, 1.5f));
    float* out = a.Zeros(kN * kC);
    float* rstd = a.Zeros(kN);
    EXPECT_TRUE(be.RmsNorm(out, rstd, inp, w, kN, kC, 1e-5f).ok());
    float* dinp = a.Put(std::vector<float>(kN * kC, 0.25f));
    float* dw = a.Put(std::vector<float>(kC, 0.25f));
    EXPECT_TRUE(
        be.RmsNormBackward(dinp, dw, a.Put(RandomVector(kN * kC, 52)), inp, w, rstd, kN, kC).ok());

    const int64_t n = int64_t{kN} * kC;
    float* gate = a.Put(RandomVector(n, 53, -6.0f, 6.0f));
    float* up = a.Put(RandomVector(n, 54));
    float* gated = a.Zeros(n);
    EXPECT_TRUE(be.SwiGlu(gated, gate, up, n).ok());
    float* dgate = a.Put(std::vector<float>(n, 0.25f));
    float* dup = a.Put(std::vector<float>(n, 0.25f));
    EXPECT_TRUE(be.SwiGluBackward(dgate, dup, gate, up, a.Put(RandomVector(n, 55)), n).ok());

    // 4 query and 2 key heads of 32 turned inside rows of 8 heads; a second buffer turned back.
    constexpr int N = 11, T = 11, HS = 32, kRow = 8 * HS;
    const std::vector<float> inv_freq = cpu::RotaryInverseFrequencies(
        HS, 500000.0, cpu::RotaryScaling{.factor = 8.0, .original_max_positions = 64.0});
    float* freq = a.Put(inv_freq);
    std::vector<int32_t> positions(N);
    for (int i = 0; i < N; ++i) positions[i] = (i * 37) % 200;
    int32_t* at = a.Put(positions);
    float* rows = a.Put(RandomVector(N * kRow, 56));
    EXPECT_TRUE(be.Rotary(rows, kRow, N, T, 6, HS, at, freq).ok());
    float* grads = a.Put(RandomVector(N * kRow, 57));
    EXPECT_TRUE(be.RotaryBackward(grads, kRow, N, T, 6, HS, nullptr, freq).ok());
    return {{"rmsnorm out", a.Get(out, kN * kC)},
            {"rmsnorm rstd", a.Get(rstd, kN)},
            {"rmsnorm dinp", a.Get(dinp, kN * kC)},
            {"rmsnorm dweight", a.Get(dw, kC)},
            {"swiglu out", a.Get(gated, n)},
            {"swiglu dgate", a.Get(dgate, n)},
            {"swiglu dup", a.Get(dup, n)},
            {"rotary", a.Get(rows, N * kRow)},
            {"rotary backward", a.Get(grads, N * kRow)}};
  };
}

Op PointwiseOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    const int64_t n = kN * kC;
    float* x = a.Put(RandomVector(n, 15, -4.0f, 4.0f));
    float* y = a.Put(RandomVector(n, 16));
    float* gelu = a.Zeros(n);
    EXPECT_TRUE(be.Gelu(gelu, x, n).ok());
    float* dgelu = a.Put(std::vector<float>(n, 0.25f));
    EXPECT_TRUE(be.GeluBackward(dgelu, x, y, n).ok());
    float* sum = a.Zeros(n);
    EXPECT_TRUE(be.Residual(sum, x, y, n).ok());
    float* d1 = a.Put(std::vector<float>(n, 0.25f));
    float* d2 = a.Put(std::vector<float>(n, -0.5f));
    EXPECT_TRUE(be.ResidualBackward(d1, d2, y, n).ok());
    return {{"gelu", a.Get(gelu, n)},
            {"gelu backward", a.Get(dgelu, n)},
            {"residual", a.Get(sum, n)},
            {"residual backward 1", a.Get(d1, n)},
            {"residual backward 2", a.Get(d2, n)}};
  };
}

// NH query heads over KVH key/value heads (KVH = NH: GPT-2's attention).
Op AttentionOp(int NH, int KVH) {
  return [NH, KVH](Backend& be, Arena& a) -> Outputs {
    constexpr int B = 2, T = 45, HS = 16;
    const int64_t A = NH * HS;
    const int64_t W = (NH + 2 * KVH) * HS;  // a token's row of qkv
    float* qkv = a.Put(RandomVector(B * T * W, 17));
    float* out = a.Zeros(B * T * A);
    float* lse = a.Zeros(B * NH * T);
    EXPECT_TRUE(be.Attention(out, lse, qkv, B, T, NH, KVH, HS).ok());
    float* dqkv = a.Put(std::vector<float>(B * T * W, 0.25f));
    EXPECT_TRUE(be.AttentionBackward(dqkv, a.Put(RandomVector(B * T * A, 18)), qkv, out, lse, B, T,
                                     NH, KVH, HS)
                    .ok());
    return {{"out", a.Get(out, B * T * A)},
            {"lse", a.Get(lse, B * NH * T)},
            {"dqkv", a.Get(dqkv, B * T * W)}};
  };
}

// A serving step over a paged cache: a prefill chunk of one sequence (positions 0..9), a decode
// of another at position 300 (past the CUDA kernel's pass of 256 positions, its earlier keys
// already cached), and a short prompt of a third, their blocks scattered through the cache.
Op PagedAttentionOp(int NH, int KVH) {
  return [NH, KVH](Backend& be, Arena& a) -> Outputs {
    constexpr int HS = 40, kBlock = 8, kBlocks = 48, kMaxBlocks = 38;
    const int A = NH * HS, KA = KVH * HS, W = A + 2 * KA;
    std::vector<int32_t> token_seq, positions;
    for (int p = 0; p < 10; ++p) token_seq.push_back(0), positions.push_back(p);
    token_seq.push_back(1), positions.push_back(300);
    for (int p = 0; p < 3; ++p) token_seq.push_back(2), positions.push_back(p);
    const int N = static_cast<int>(positions.size());
    // Block tables: a permutation of the cache's blocks, sequence 1 taking 38 of them.
    std::vector<int32_t> order(kBlocks);
    for (int b = 0; b < kBlocks; ++b) order[b] = (b * 29 + 5) % kBlocks;
    std::vector<int32_t> tables(3 * kMaxBlocks, 0);
    int next = 0;
    for (int b = 0; b < 2; ++b) tables[0 * kMaxBlocks + b] = order[next++];
    for (int b = 0; b < kMaxBlocks; ++b) tables[1 * kMaxBlocks + b] = order[next++];
    tables[2 * kMaxBlocks] = order[next++];
    const int64_t cache = int64_t{kBlocks} * kBlock * KA;
    float* k = a.Put(RandomVector(cache, 40));
    float* v = a.Put(RandomVector(cache, 41));
    float* qkv = a.Put(RandomVector(int64_t{N} * W, 42));
    float* out = a.Zeros(int64_t{N} * A);
    const PagedAttentionBatch batch{.num_tokens = N,
                                    .token_seq = a.Put(token_seq),
                                    .positions = a.Put(positions),
                                    .block_tables = a.Put(tables),
                                    .num_seqs = 3,
                                    .max_blocks_per_seq = kMaxBlocks,
                                    .block_size = kBlock,
                                    .num_blocks = kBlocks};
    EXPECT_TRUE(be.PagedKvWrite(k, v, qkv, batch, NH, KVH, HS).ok());
    EXPECT_TRUE(be.PagedAttention(out, qkv, k, v, batch, NH, KVH, HS).ok());
    return {{"k_cache", a.Get(k, cache)},
            {"v_cache", a.Get(v, cache)},
            {"out", a.Get(out, int64_t{N} * A)}};
  };
}

Op EmbeddingOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    constexpr int B = 3, T = 11, N = B * T, C = 40, V = 97, v0 = 30, v1 = 70, S = 64;
    const std::vector<int32_t> tokens = Ids(N, V, 19);
    int32_t* t = a.Put(tokens);
    float* wte = a.Put(RandomVector((v1 - v0) * C, 20));
    float* wpe = a.Put(RandomVector(S * C, 21));
    float* x = a.Zeros(N * C);
    EXPECT_TRUE(be.TokenEmbedding(x, t, wte, N, C, v0, v1).ok());
    EXPECT_TRUE(be.PositionEmbedding(x, wpe, nullptr, N, T, C).ok());
    float* at = a.Zeros(N * C);
    EXPECT_TRUE(be.PositionEmbedding(at, wpe, a.Put(Ids(N, S, 22)), N, N, C).ok());
    float* dwte = a.Put(std::vector<float>((v1 - v0) * C, 0.25f));
    const std::vector<float> dx = RandomVector(N * C, 23);
    EXPECT_TRUE(be.TokenEmbeddingBackward(dwte, a.Put(dx), t, N, C, v0, v1).ok());
    float* dwpe = a.Put(std::vector<float>(T * C, 0.25f));
    EXPECT_TRUE(be.PositionEmbeddingBackward(dwpe, a.Put(dx), B, T, C).ok());
    return {{"embedding", a.Get(x, N * C)},
            {"positions at", a.Get(at, N * C)},
            {"dwte", a.Get(dwte, (v1 - v0) * C)},
            {"dwpe", a.Get(dwpe, T * C)}};
  };
}

Op CrossEntropyOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    constexpr int N = 29, Vs = 83, v0 = 40, V = 200;
    std::vector<int32_t> targets = Ids(N, V, 24);
    targets[3] = -1;  // ignored
    int32_t* t = a.Put(targets);
    float* logits = a.Put(RandomVector(N * Vs, 25, -5.0f, 5.0f));
    float* local_max = a.Zeros(N);
    float* sumexp = a.Zeros(N);
    float* target_logit = a.Zeros(N);
    EXPECT_TRUE(
        be.CrossEntropyLocalStats(local_max, sumexp, target_logit, logits, t, N, Vs, v0).ok());
    // A peer's larger maxima, as after the group's max all-reduce.
    std::vector<float> global(N);
    const std::vector<float> local = a.Get(local_max, N);
    for (int n = 0; n < N; ++n) global[n] = local[n] + 0.5f * static_cast<float>(n % 3);
    float* global_max = a.Put(global);
    EXPECT_TRUE(be.CrossEntropyRescaleSumExp(sumexp, local_max, global_max, N).ok());
    float* losses = a.Zeros(N);
    float* lse = a.Zeros(N);
    EXPECT_TRUE(
        be.CrossEntropyLossFromStats(losses, lse, global_max, sumexp, target_logit, t, N).ok());
    float* dlogits = a.Put(std::vector<float>(N * Vs, 0.25f));
    EXPECT_TRUE(
        be.CrossEntropyBackwardShard(dlogits, logits, lse, t, a.Put(RandomVector(N, 26)), N, Vs, v0)
            .ok());
    return {{"local max", local},
            {"sumexp", a.Get(sumexp, N)},
            {"target logit", a.Get(target_logit, N)},
            {"losses", a.Get(losses, N)},
            {"lse", a.Get(lse, N)},
            {"dlogits", a.Get(dlogits, N * Vs)}};
  };
}

Op OptimizerOp() {
  return [](Backend& be, Arena& a) -> Outputs {
    const int64_t n = 1000;
    float* p = a.Put(RandomVector(n, 27));
    float* g = a.Put(RandomVector(n, 28));
    float* m = a.Put(RandomVector(n, 29, -0.1f, 0.1f));
    float* v = a.Put(RandomVector(n, 30, 0.0f, 0.01f));
    cpu::AdamWConfig config;
    config.learning_rate = 1e-2f;
    config.weight_decay = 0.1f;
    EXPECT_TRUE(be.AdamW(p, g, m, v, n, config, 3).ok());
    const std::vector<float> first = RandomVector(n, 31), second = RandomVector(77, 32);
    const std::vector<std::span<const float>> arrays = {
        std::span<const float>(a.Put(first), first.size()),
        std::span<const float>(a.Put(second), second.size())};
    const absl::StatusOr<double> sum = be.SumOfSquares(arrays);
    EXPECT_TRUE(sum.ok()) << sum.status();
    return {{"params", a.Get(p, n)},
            {"exp_avg", a.Get(m, n)},
            {"exp_avg_sq", a.Get(v, n)},
            {"sum of squares", {static_cast<float>(sum.value_or(-1.0))}}};
  };
}

struct NamedOp {
  std::string name;
  Op op;
  Tolerance f32;   // CUDA with f32 GEMMs against the CPU
  Tolerance bf16;  // CUDA with bf16 GEMMs against the CPU
};

std::vector<NamedOp> AllOps() {
  return {
      {"FillCopy", FillCopyOp(), kExact, kExact},
      {"AccumulateScale", AccumulateScaleOp(), kPointwise, kPointwise},
      {"Linear", LinearOp(), kGemmF32, kGemmBf16VsF32},
      {"LinearBackward", LinearBackwardOp(), kGemmF32, kGemmBf16VsF32},
      {"LayerNorm", LayerNormOp(1e-5f), kLayerNorm, kLayerNorm},
      {"LayerNormEps", LayerNormOp(1e-2f), kLayerNorm, kLayerNorm},
      {"Pointwise", PointwiseOp(), kPointwise, kPointwise},
      {"LlamaPieces", LlamaPiecesOp(), kLayerNorm, kLayerNorm},
      {"Attention", AttentionOp(3, 3), kAttention, kAttention},
      {"GroupedQueryAttention", AttentionOp(6, 2), kAttention, kAttention},
      {"PagedAttention", PagedAttentionOp(3, 3), kAttention, kAttention},
      {"GroupedQueryPagedAttention", PagedAttentionOp(6, 2), kAttention, kAttention},
      {"Embedding", EmbeddingOp(), kReduction, kReduction},
      {"CrossEntropy", CrossEntropyOp(), kReduction, kReduction},
      {"Optimizer", OptimizerOp(), kReduction, kReduction},
  };
}

// ---- the CPU backend's own code ----

TEST(CpuBackendTest, MemoryOperationsAndPositionsAtGiveTheValuesWorkedOutHere) {
  cpu::CpuBackend be;
  const Outputs fill = RunOp(be, FillCopyOp());
  EXPECT_EQ(fill[0].second, std::vector<float>(kN, 0.375f));
  EXPECT_EQ(fill[1].second, RandomVector(kN, 1));

  const Outputs acc = RunOp(be, AccumulateScaleOp());
  const std::vector<float> a = RandomVector(kN * kC, 2), b = RandomVector(kN * kC, 3),
                           c = RandomVector(kN * kC, 4);
  for (int i = 0; i < kN * kC; ++i) {
    ASSERT_EQ(acc[0].second[i], a[i] + b[i]) << i;
    ASSERT_EQ(acc[1].second[i], c[i] * 0.3f) << i;
  }

  // Positions given row by row equal the batch's 0..T-1 when they are those.
  constexpr int B = 2, T = 5, C = 3;
  const std::vector<float> wpe = RandomVector(T * C, 5);
  std::vector<float> batch(B * T * C, 1.0f), at(B * T * C, 1.0f);
  std::vector<int32_t> positions(B * T);
  for (int i = 0; i < B * T; ++i) positions[i] = i % T;
  ASSERT_TRUE(be.PositionEmbedding(batch.data(), wpe.data(), nullptr, B * T, T, C).ok());
  ASSERT_TRUE(be.PositionEmbedding(at.data(), wpe.data(), positions.data(), B * T, B * T, C).ok());
  EXPECT_EQ(at, batch);
  // And any others are each row's own.
  std::vector<float> one(C, 0.0f);
  const int32_t position = 3;
  ASSERT_TRUE(be.PositionEmbedding(one.data(), wpe.data(), &position, 1, 1, C).ok());
  EXPECT_EQ(one, std::vector<float>(wpe.begin() + 3 * C, wpe.begin() + 4 * C));

  EXPECT_NE(be.Describe().find("cpu"), std::string::npos) << be.Describe();
  EXPECT_EQ(be.device(), Device::kCpu);
}

TEST(CpuBackendTest, AllocatesFromTheAllocatorItIsGiven) {
  CpuAllocator allocator;
  cpu::CpuBackend be(allocator);
  {
    Arena arena(be);
    arena.Zeros(1000);
    EXPECT_GE(allocator.stats().bytes_in_use, 4000u);
  }
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  EXPECT_EQ(&be.allocator(), &allocator);
}

TEST(CpuBackendTest, EveryOperationRunsAndGivesFiniteValues) {
  cpu::CpuBackend be;
  for (const NamedOp& op : AllOps()) {
    for (const auto& [name, values] : RunOp(be, op.op)) {
      ASSERT_FALSE(values.empty()) << op.name << " " << name;
      for (float v : values) ASSERT_TRUE(std::isfinite(v)) << op.name << " " << name;
    }
  }
}

// ---- CUDA against the CPU ----

#ifdef SHARDLINE_WITH_CUDA

class CudaBackendTest : public ::testing::TestWithParam<cuda::GemmPrecision> {
 protected:
  void SetUp() override {
    const std::string reason = cuda::CudaUnavailableReason(0);
    if (!reason.empty()) GTEST_SKIP() << reason;
    auto backend = cuda::CudaBackend::Create(0, GetParam());
    ASSERT_TRUE(backend.ok()) << backend.status();
    cuda_ = std::move(*backend);
  }
  cpu::CpuBackend cpu_;
  std::unique_ptr<cuda::CudaBackend> cuda_;
};

TEST_P(CudaBackendTest, EveryOperationMatchesTheCpuBackend) {
  EXPECT_EQ(cuda_->device(), Device::kCuda);
  for (const NamedOp& op : AllOps()) {
    SCOPED_TRACE(op.name);
    const Tolerance tol = GetParam() == cuda::GemmPrecision::kFloat32 ? op.f32 : op.bf16;
    ExpectSame(RunOp(*cuda_, op.op), RunOp(cpu_, op.op), tol);
  }
}

INSTANTIATE_TEST_SUITE_P(Precisions, CudaBackendTest,
                         ::testing::Values(cuda::GemmPrecision::kFloat32,
                                           cuda::GemmPrecision::kBFloat16),
                         [](const auto& info) {
                           return info.param == cuda::GemmPrecision::kFloat32 ? "F32" : "Bf16";
                         });

TEST(CudaBackendNoGpuTest, CreateSaysWhyWhereNoGpuIsUsable) {
  const std::string reason = cuda::CudaUnavailableReason(0);
  if (reason.empty()) GTEST_SKIP() << "a GPU is visible; CudaBackendTest covers creation";
  auto backend = cuda::CudaBackend::Create(0, cuda::GemmPrecision::kFloat32);
  ASSERT_FALSE(backend.ok());
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kFailedPrecondition) << backend.status();
}

#endif  // SHARDLINE_WITH_CUDA

}  // namespace
}  // namespace shardline::kernels
