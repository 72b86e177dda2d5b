// Every CUDA kernel against its CPU twin (kernels/cpu/, the reference), forward and backward, in
// the manner of ggml's test-backend-ops; and the CUDA caching allocator.
//
// Tests that need a GPU skip, naming the reason (cudaGetDeviceCount's error), when none is usable.
// The ones named *NoGpu* need none and check the failure paths and the host-side arithmetic.
//
// Tolerances (|cuda − cpu| <= atol + rtol·|cpu|), from how far the two may legitimately differ:
//   pointwise ops (GELU, residual, bias add, embeddings, AdamW, casts)     atol 1e-6, rtol 1e-5
//     (GPU tanhf/expf are within 2 ulp of glibc's; nvcc contracts a·b + c into FMAs)
//   row/column reductions (softmax, cross-entropy, LayerNorm mean and
//     weight grads, bias and position grads, scatter-add)                  atol 1e-5, rtol 1e-5
//     (f32 sums in another order: the error grows like √n·2⁻²⁴)
//   f32 GEMM (cuBLAS Sgemm vs OpenBLAS)                                    atol 1e-4, rtol 1e-4
//   bf16 GEMM vs the CPU on the same bf16-rounded operands                 atol 1e-3, rtol 1e-3
//   bf16 GEMM vs the f32 CPU (bf16 keeps 8 bits of mantissa: the error of
//     a 256-term dot product of U(-1,1) values has σ ≈ 0.009)              atol 5e-2, rtol 1e-2
//   LayerNorm (the CPU's sequential mean of 768 values near 10 is itself
//     off by ~1e-5, which the normalised output magnifies)                 atol 1e-4, rtol 1e-4
//   attention (online softmax over 32-key tiles vs the CPU's 64), with the
//     absolute part relative to the largest |element| of the array        atol 1e-5·max, rtol 1e-4
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/layernorm.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/optimizer.h"
#include "kernels/cpu/softmax.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cublas_loader.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/ops.h"
#include "kernels/half.h"
#include "kernels/tensor.h"
#include "tests/unit/kernels_test_util.h"

namespace shardline::kernels::cuda {
namespace {

using kernels::testing::ExpectClose;
using kernels::testing::ExpectScaled;
using kernels::testing::RandomVector;
using ::testing::HasSubstr;

struct Tolerance {
  double atol;
  double rtol;
};
constexpr Tolerance kPointwise{1e-6, 1e-5};
constexpr Tolerance kReduction{1e-5, 1e-5};
constexpr Tolerance kGemmF32{1e-4, 1e-4};
constexpr Tolerance kGemmBf16SameInputs{1e-3, 1e-3};
constexpr Tolerance kGemmBf16VsF32{5e-2, 1e-2};
constexpr Tolerance kLayerNorm{1e-4, 1e-4};

constexpr float kPrefill = 0.25f;  // gradients start here, so both sides must add, not overwrite

std::vector<float> Prefilled(size_t n) { return std::vector<float>(n, kPrefill); }

void Expect(const std::vector<float>& cuda, const std::vector<float>& cpu, Tolerance tol,
            const std::string& what) {
  ExpectClose(cuda, cpu, tol.atol, tol.rtol, what);
}

constexpr double kAttentionAtolOfMax = 1e-5;
constexpr double kAttentionRtol = 1e-4;

std::vector<float> RoundedToBf16(const std::vector<float>& x) {
  std::vector<float> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = BFloat16ToFloat(FloatToBFloat16(x[i]));
  return out;
}

// ---------------------------------------------------------------------------------------------
// Without a GPU

TEST(CudaNoGpuTest, AllocatorCreationIsFailedPreconditionWithoutAGpu) {
  if (CudaUnavailableReason(0).empty()) {
    GTEST_SKIP() << "a GPU is visible; CudaAllocatorTest covers creation";
  }
  auto allocator = CudaCachingAllocator::Create(0);
  ASSERT_FALSE(allocator.ok());
  EXPECT_EQ(allocator.status().code(), absl::StatusCode::kFailedPrecondition) << allocator.status();
  EXPECT_THAT(std::string(allocator.status().message()), HasSubstr("cudaGetDeviceCount"));
}

TEST(CudaNoGpuTest, SizeClasses) {
  EXPECT_EQ(CudaCachingAllocator::RoundSize(0), 512u);  // an empty tensor still gets its own block
  EXPECT_EQ(CudaCachingAllocator::RoundSize(1), 512u);
  EXPECT_EQ(CudaCachingAllocator::RoundSize(512), 512u);
  EXPECT_EQ(CudaCachingAllocator::RoundSize(513), 1024u);
  EXPECT_EQ(CudaCachingAllocator::RoundSize((1u << 20) - 1), 1u << 20);
  EXPECT_EQ(CudaCachingAllocator::RoundSize(1u << 20), 2u << 20);
  EXPECT_EQ(CudaCachingAllocator::RoundSize((2u << 20) + 1), 4u << 20);
  EXPECT_LT(CudaCachingAllocator::RoundSize(~size_t{0}), ~size_t{0});  // wraps: Allocate refuses it
}

// cuBLAS is dlopen'ed (cublas_loader.h), which needs the library but no GPU.
TEST(CudaNoGpuTest, CublasLoadsWithoutAGpuAndNamesItsStatuses) {
  auto api = Cublas();
  ASSERT_TRUE(api.ok()) << api.status();
  EXPECT_STREQ((*api)->status_name(CUBLAS_STATUS_NOT_INITIALIZED), "CUBLAS_STATUS_NOT_INITIALIZED");
  const absl::Status status = CublasStatus(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("cublasCreate: CUBLAS_STATUS_NOT_INITIALIZED"));
  EXPECT_EQ(CublasStatus(CUBLAS_STATUS_ALLOC_FAILED, "x").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc").code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(CudaStatus(cudaErrorInsufficientDriver, "cudaSetDevice").code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CudaNoGpuTest, BlasNeedsACudaAllocator) {
  CpuAllocator cpu_allocator;
  auto blas = Blas::Create(cpu_allocator, GemmPrecision::kBFloat16);
  EXPECT_EQ(blas.status().code(), absl::StatusCode::kInvalidArgument);
}

// Argument checks run before anything touches the device.
TEST(CudaNoGpuTest, BadArgumentsAreInvalidArgumentBeforeAnyLaunch) {
  cpu::AdamWConfig config;
  EXPECT_EQ(AdamWUpdate(nullptr, nullptr, nullptr, nullptr, 0, config, 0, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  config.beta2 = 1.0f;
  EXPECT_EQ(AdamWUpdate(nullptr, nullptr, nullptr, nullptr, 0, config, 1, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AttentionForward(nullptr, nullptr, nullptr, 1, 4, 1, 1, 256, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      AttentionBackward(nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 1, 1, 0, nullptr).code(),
      absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GlobalNormClip({}, 0.0, nullptr, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---------------------------------------------------------------------------------------------
// With a GPU

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = CudaUnavailableReason(0);
    if (!reason.empty()) GTEST_SKIP() << reason;
    ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
    auto allocator = CudaCachingAllocator::Create(0);
    ASSERT_TRUE(allocator.ok()) << allocator.status();
    allocator_ = std::move(*allocator);
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }

  void TearDown() override {
    if (stream_ != nullptr) {
      EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess) << "a kernel faulted";
      cudaStreamDestroy(stream_);
    }
    for (auto [ptr, nbytes] : blocks_) allocator_->Deallocate(ptr, nbytes);
  }

  template <typename T>
  T* Device(size_t n) {
    auto block = allocator_->Allocate(n * sizeof(T));
    EXPECT_TRUE(block.ok()) << block.status();
    if (!block.ok()) return nullptr;
    blocks_.emplace_back(*block, n * sizeof(T));
    return static_cast<T*>(*block);
  }

  // A device copy of `host`, freed at TearDown.
  template <typename T>
  T* ToDevice(const std::vector<T>& host) {
    T* device = Device<T>(host.size());
    if (!host.empty()) {
      EXPECT_EQ(cudaMemcpyAsync(device, host.data(), host.size() * sizeof(T),
                                cudaMemcpyHostToDevice, stream_),
                cudaSuccess);
    }
    return device;
  }

  // Waits for the stream, then copies n elements back.
  template <typename T>
  std::vector<T> ToHost(const T* device, size_t n) {
    std::vector<T> host(n);
    if (n > 0) {
      EXPECT_EQ(
          cudaMemcpyAsync(host.data(), device, n * sizeof(T), cudaMemcpyDeviceToHost, stream_),
          cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return host;
  }

  std::unique_ptr<Blas> MakeBlas(GemmPrecision precision) {
    auto blas = Blas::Create(*allocator_, precision);
    EXPECT_TRUE(blas.ok()) << blas.status();
    return blas.ok() ? std::move(*blas) : nullptr;
  }

  std::unique_ptr<CudaCachingAllocator> allocator_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::pair<void*, size_t>> blocks_;
};

using CudaAllocatorTest = CudaTest;

TEST_F(CudaAllocatorTest, ReusesAFreedBlockAndAccountsPeak) {
  auto created = CudaCachingAllocator::Create(0);
  ASSERT_TRUE(created.ok()) << created.status();
  CudaCachingAllocator& allocator = **created;

  auto a = allocator.Allocate(1000);
  ASSERT_TRUE(a.ok()) << a.status();
  auto b = allocator.Allocate(5000);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(allocator.stats().bytes_in_use, 6000u);
  EXPECT_EQ(allocator.stats().peak_bytes, 6000u);
  EXPECT_EQ(allocator.cuda_stats().bytes_reserved, 1024u + 5120u);

  allocator.Deallocate(*a, 1000);
  EXPECT_EQ(allocator.stats().bytes_in_use, 5000u);
  EXPECT_EQ(allocator.stats().peak_bytes, 6000u);
  EXPECT_EQ(allocator.cuda_stats().bytes_cached, 1024u);

  // The same size class comes back from the cache: same pointer, no new cudaMalloc.
  const uint64_t mallocs = allocator.cuda_stats().cuda_mallocs;
  auto c = allocator.Allocate(900);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c, *a);
  EXPECT_EQ(allocator.cuda_stats().cuda_mallocs, mallocs);
  EXPECT_EQ(allocator.cuda_stats().cache_hits, 1u);
  EXPECT_EQ(allocator.stats().bytes_in_use, 5900u);
  EXPECT_EQ(allocator.stats().allocations, 3u);

  allocator.ResetPeak();
  EXPECT_EQ(allocator.stats().peak_bytes, 5900u);

  // A large block is not handed to a small request (it would be tied up), but to a similar one.
  auto big = allocator.Allocate(3u << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  allocator.Deallocate(*big, 3u << 20);
  auto small = allocator.Allocate(100);
  ASSERT_TRUE(small.ok());
  EXPECT_NE(*small, *big);
  auto similar = allocator.Allocate((3u << 20) + 12345);
  ASSERT_TRUE(similar.ok());
  EXPECT_EQ(*similar, *big);

  allocator.Deallocate(*b, 5000);
  allocator.Deallocate(*c, 900);
  allocator.Deallocate(*small, 100);
  allocator.Deallocate(*similar, (3u << 20) + 12345);
  EXPECT_EQ(allocator.stats().bytes_in_use, 0u);
  ASSERT_TRUE(allocator.EmptyCache().ok());
  EXPECT_EQ(allocator.cuda_stats().bytes_reserved, 0u);
  EXPECT_EQ(allocator.cuda_stats().bytes_cached, 0u);
}

TEST_F(CudaAllocatorTest, OutOfMemoryIsResourceExhausted) {
  auto huge = allocator_->Allocate(size_t{1} << 52);  // 4 PiB
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted) << huge.status();
  // The failure leaves the allocator usable.
  auto ok = allocator_->Allocate(64);
  ASSERT_TRUE(ok.ok()) << ok.status();
  allocator_->Deallocate(*ok, 64);
}

TEST_F(CudaAllocatorTest, BacksTensorsAndZeroFills) {
  auto tensor = Tensor::Zeros({3, 5}, DType::kFloat32, *allocator_);
  ASSERT_TRUE(tensor.ok()) << tensor.status();
  EXPECT_EQ(tensor->device(), Device::kCuda);
  EXPECT_EQ(ToHost(tensor->data<float>(), 15), std::vector<float>(15, 0.0f));
  EXPECT_GE(allocator_->stats().bytes_in_use, 60u);
}

TEST_F(CudaAllocatorTest, IsThreadSafe) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const size_t n = 256 * ((i + t) % 7 + 1);
        auto block = allocator_->Allocate(n);
        ASSERT_TRUE(block.ok()) << block.status();
        allocator_->Deallocate(*block, n);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(allocator_->stats().bytes_in_use, 0u);
}

// ---- matmul
// --------------------------------------------------------------------------------------

struct MatmulShape {
  int N, C, OC;
};
constexpr MatmulShape kMatmulShapes[] = {{37, 70, 45}, {1, 1, 1}, {128, 256, 96}};

TEST_F(CudaTest, MatmulForwardF32MatchesCpu) {
  auto blas = MakeBlas(GemmPrecision::kFloat32);
  ASSERT_NE(blas, nullptr);
  for (auto [N, C, OC] : kMatmulShapes) {
    for (bool with_bias : {true, false}) {
      const auto inp = RandomVector(size_t(N) * C, 1);
      const auto weight = RandomVector(size_t(OC) * C, 2);
      const auto bias = RandomVector(OC, 3);
      std::vector<float> expected(size_t(N) * OC);
      cpu::MatmulForward(expected.data(), inp.data(), weight.data(),
                         with_bias ? bias.data() : nullptr, N, C, OC);
      float* out = Device<float>(expected.size());
      ASSERT_TRUE(MatmulForward(*blas, out, ToDevice(inp), ToDevice(weight),
                                with_bias ? ToDevice(bias) : nullptr, N, C, OC, stream_)
                      .ok());
      Expect(ToHost(out, expected.size()), expected, kGemmF32,
             "matmul f32 N=" + std::to_string(N) + " bias=" + std::to_string(with_bias));
    }
  }
}

TEST_F(CudaTest, MatmulBackwardF32MatchesCpu) {
  auto blas = MakeBlas(GemmPrecision::kFloat32);
  ASSERT_NE(blas, nullptr);
  for (auto [N, C, OC] : kMatmulShapes) {
    const auto inp = RandomVector(size_t(N) * C, 4);
    const auto weight = RandomVector(size_t(OC) * C, 5);
    const auto dout = RandomVector(size_t(N) * OC, 6);
    auto dinp = Prefilled(inp.size());
    auto dweight = Prefilled(weight.size());
    auto dbias = Prefilled(OC);
    float* d_dinp = ToDevice(dinp);
    float* d_dweight = ToDevice(dweight);
    float* d_dbias = ToDevice(dbias);
    cpu::MatmulBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                        weight.data(), N, C, OC);
    ASSERT_TRUE(MatmulBackward(*blas, d_dinp, d_dweight, d_dbias, ToDevice(dout), ToDevice(inp),
                               ToDevice(weight), N, C, OC, stream_)
                    .ok());
    Expect(ToHost(d_dinp, dinp.size()), dinp, kGemmF32, "dinp");
    Expect(ToHost(d_dweight, dweight.size()), dweight, kGemmF32, "dweight");
    Expect(ToHost(d_dbias, dbias.size()), dbias, kReduction, "dbias");
  }
}

TEST_F(CudaTest, MatmulBf16MatchesCpuOnRoundedInputsAndApproximatesF32) {
  auto blas = MakeBlas(GemmPrecision::kBFloat16);
  ASSERT_NE(blas, nullptr);
  for (auto [N, C, OC] : kMatmulShapes) {
    const auto inp = RandomVector(size_t(N) * C, 7);
    const auto weight = RandomVector(size_t(OC) * C, 8);
    const auto bias = RandomVector(OC, 9);
    std::vector<float> exact(size_t(N) * OC), rounded(size_t(N) * OC);
    cpu::MatmulForward(exact.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    cpu::MatmulForward(rounded.data(), RoundedToBf16(inp).data(), RoundedToBf16(weight).data(),
                       bias.data(), N, C, OC);
    float* out = Device<float>(exact.size());
    ASSERT_TRUE(MatmulForward(*blas, out, ToDevice(inp), ToDevice(weight), ToDevice(bias), N, C, OC,
                              stream_)
                    .ok());
    const auto got = ToHost(out, exact.size());
    Expect(got, rounded, kGemmBf16SameInputs, "bf16 matmul vs CPU on bf16-rounded inputs");
    Expect(got, exact, kGemmBf16VsF32, "bf16 matmul vs f32 CPU");

    // The entry point for operands already in bf16 gives the same result.
    BFloat16* inp16 = Device<BFloat16>(inp.size());
    BFloat16* weight16 = Device<BFloat16>(weight.size());
    ASSERT_TRUE(CastFloatToBFloat16(inp16, ToDevice(inp), int64_t(inp.size()), stream_).ok());
    ASSERT_TRUE(
        CastFloatToBFloat16(weight16, ToDevice(weight), int64_t(weight.size()), stream_).ok());
    float* out2 = Device<float>(exact.size());
    ASSERT_TRUE(
        MatmulForwardBf16(*blas, out2, inp16, weight16, ToDevice(bias), N, C, OC, stream_).ok());
    // cuBLAS may pick another algorithm for other pointers, so not necessarily bit for bit.
    Expect(ToHost(out2, exact.size()), got, kGemmBf16SameInputs,
           "MatmulForwardBf16 vs MatmulForward");
  }
}

TEST_F(CudaTest, MatmulBackwardBf16MatchesCpuOnRoundedInputs) {
  auto blas = MakeBlas(GemmPrecision::kBFloat16);
  ASSERT_NE(blas, nullptr);
  const auto [N, C, OC] = kMatmulShapes[2];
  const auto inp = RandomVector(size_t(N) * C, 10);
  const auto weight = RandomVector(size_t(OC) * C, 11);
  const auto dout = RandomVector(size_t(N) * OC, 12);
  auto dinp = Prefilled(inp.size());
  auto dweight = Prefilled(weight.size());
  auto dbias = Prefilled(OC);
  float* d_dinp = ToDevice(dinp);
  float* d_dweight = ToDevice(dweight);
  float* d_dbias = ToDevice(dbias);
  // dbias is summed from the f32 dout; the GEMMs see bf16 operands.
  cpu::MatmulBackward(dinp.data(), dweight.data(), nullptr, RoundedToBf16(dout).data(),
                      RoundedToBf16(inp).data(), RoundedToBf16(weight).data(), N, C, OC);
  cpu::BiasAddBackward(dbias.data(), dout.data(), N, OC);
  ASSERT_TRUE(MatmulBackward(*blas, d_dinp, d_dweight, d_dbias, ToDevice(dout), ToDevice(inp),
                             ToDevice(weight), N, C, OC, stream_)
                  .ok());
  Expect(ToHost(d_dinp, dinp.size()), dinp, kGemmBf16SameInputs, "bf16 dinp");
  Expect(ToHost(d_dweight, dweight.size()), dweight, kGemmBf16SameInputs, "bf16 dweight");
  Expect(ToHost(d_dbias, dbias.size()), dbias, kReduction, "bf16 dbias");
}

TEST_F(CudaTest, BiasAddMatchesCpu) {
  const int N = 45, C = 300;
  auto out = RandomVector(size_t(N) * C, 13);
  const auto bias = RandomVector(C, 14);
  float* d_out = ToDevice(out);
  cpu::BiasAddForward(out.data(), bias.data(), N, C);
  ASSERT_TRUE(BiasAddForward(d_out, ToDevice(bias), N, C, stream_).ok());
  Expect(ToHost(d_out, out.size()), out, kPointwise, "bias add");

  auto dbias = Prefilled(C);
  float* d_dbias = ToDevice(dbias);
  cpu::BiasAddBackward(dbias.data(), out.data(), N, C);
  ASSERT_TRUE(BiasAddBackward(d_dbias, ToDevice(out), N, C, stream_).ok());
  Expect(ToHost(d_dbias, dbias.size()), dbias, kReduction, "bias add backward");
}

TEST_F(CudaTest, CastsMatchTheHostConversionBitForBit) {
  auto values = RandomVector(1000, 15, -1e3f, 1e3f);
  values.insert(values.end(), {0.0f, -0.0f, 1.0f + 1.0f / 256, 1.0f + 3.0f / 256, 3.4e38f, 1e-40f,
                               INFINITY, -INFINITY});
  BFloat16* d16 = Device<BFloat16>(values.size());
  ASSERT_TRUE(CastFloatToBFloat16(d16, ToDevice(values), int64_t(values.size()), stream_).ok());
  const auto got16 = ToHost(d16, values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_EQ(got16[i].bits, FloatToBFloat16(values[i]).bits) << "value " << values[i];
  }
  float* back = Device<float>(values.size());
  ASSERT_TRUE(CastBFloat16ToFloat(back, d16, int64_t(values.size()), stream_).ok());
  const auto got = ToHost(back, values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(got[i], BFloat16ToFloat(got16[i]));
}

// ---- layernorm
// -----------------------------------------------------------------------------------

TEST_F(CudaTest, LayerNormMatchesCpu) {
  for (auto [N, C] : {std::pair{33, 97}, std::pair{4, 768}, std::pair{1, 1}}) {
    // A large mean checks the two-pass variance.
    const auto inp = RandomVector(size_t(N) * C, 16, 8.0f, 12.0f);
    const auto weight = RandomVector(C, 17);
    const auto bias = RandomVector(C, 18);
    std::vector<float> out(inp.size()), mean(N), rstd(N);
    cpu::LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), weight.data(),
                          bias.data(), N, C);
    float* d_out = Device<float>(out.size());
    float* d_mean = Device<float>(N);
    float* d_rstd = Device<float>(N);
    float* d_inp = ToDevice(inp);
    float* d_weight = ToDevice(weight);
    ASSERT_TRUE(LayerNormForward(d_out, d_mean, d_rstd, d_inp, d_weight, ToDevice(bias), N, C,
                                 cpu::kLayerNormEps, stream_)
                    .ok());
    Expect(ToHost(d_out, out.size()), out, kLayerNorm, "layernorm out");
    Expect(ToHost(d_mean, N), mean, kReduction, "layernorm mean");
    Expect(ToHost(d_rstd, N), rstd, kLayerNorm, "layernorm rstd");

    // Backward from the CPU's saved statistics, so only the backward is compared.
    const auto dout = RandomVector(out.size(), 19);
    auto dinp = Prefilled(inp.size());
    auto dweight = Prefilled(C);
    auto dbias = Prefilled(C);
    float* d_dinp = ToDevice(dinp);
    float* d_dweight = ToDevice(dweight);
    float* d_dbias = ToDevice(dbias);
    cpu::LayerNormBackward(dinp.data(), dweight.data(), dbias.data(), dout.data(), inp.data(),
                           weight.data(), mean.data(), rstd.data(), N, C);
    ASSERT_TRUE(LayerNormBackward(d_dinp, d_dweight, d_dbias, ToDevice(dout), d_inp, d_weight,
                                  ToDevice(mean), ToDevice(rstd), N, C, stream_)
                    .ok());
    Expect(ToHost(d_dinp, dinp.size()), dinp, kLayerNorm, "layernorm dinp");
    Expect(ToHost(d_dweight, C), dweight, kReduction, "layernorm dweight");
    Expect(ToHost(d_dbias, C), dbias, kReduction, "layernorm dbias");
  }
}

// ---- elementwise
// ---------------------------------------------------------------------------------

TEST_F(CudaTest, GeluMatchesCpu) {
  const int64_t n = 100003;
  const auto inp = RandomVector(n, 20, -6.0f, 6.0f);
  std::vector<float> out(n);
  cpu::GeluForward(out.data(), inp.data(), n);
  float* d_inp = ToDevice(inp);
  float* d_out = Device<float>(n);
  ASSERT_TRUE(GeluForward(d_out, d_inp, n, stream_).ok());
  Expect(ToHost(d_out, n), out, kPointwise, "gelu");

  const auto dout = RandomVector(n, 21);
  auto dinp = Prefilled(n);
  float* d_dinp = ToDevice(dinp);
  cpu::GeluBackward(dinp.data(), inp.data(), dout.data(), n);
  ASSERT_TRUE(GeluBackward(d_dinp, d_inp, ToDevice(dout), n, stream_).ok());
  Expect(ToHost(d_dinp, n), dinp, kPointwise, "gelu backward");
}

TEST_F(CudaTest, ResidualMatchesCpuAlsoInPlace) {
  const int64_t n = 5000;
  const auto a = RandomVector(n, 22);
  const auto b = RandomVector(n, 23);
  std::vector<float> out(n);
  cpu::ResidualForward(out.data(), a.data(), b.data(), n);
  float* d_a = ToDevice(a);
  ASSERT_TRUE(ResidualForward(d_a, d_a, ToDevice(b), n, stream_).ok());  // x = x + f(x)
  Expect(ToHost(d_a, n), out, kPointwise, "residual in place");

  auto d1 = Prefilled(n);
  auto d2 = Prefilled(n);
  float* d_d1 = ToDevice(d1);
  float* d_d2 = ToDevice(d2);
  cpu::ResidualBackward(d1.data(), d2.data(), a.data(), n);
  ASSERT_TRUE(ResidualBackward(d_d1, d_d2, ToDevice(a), n, stream_).ok());
  Expect(ToHost(d_d1, n), d1, kPointwise, "residual dinp1");
  Expect(ToHost(d_d2, n), d2, kPointwise, "residual dinp2");
  ASSERT_TRUE(ResidualBackward(nullptr, d_d2, ToDevice(a), n, stream_).ok());
}

// ---- softmax
// -------------------------------------------------------------------------------------

TEST_F(CudaTest, SoftmaxMatchesCpu) {
  for (auto [N, C] : {std::pair{19, 300}, std::pair{3, 50257}, std::pair{5, 1}}) {
    const auto inp = RandomVector(size_t(N) * C, 24, -10.0f, 10.0f);
    std::vector<float> out(inp.size());
    cpu::SoftmaxForward(out.data(), inp.data(), N, C);
    float* d_out = Device<float>(out.size());
    ASSERT_TRUE(SoftmaxForward(d_out, ToDevice(inp), N, C, stream_).ok());
    Expect(ToHost(d_out, out.size()), out, kReduction, "softmax");

    const auto dout = RandomVector(out.size(), 25);
    auto dinp = Prefilled(out.size());
    float* d_dinp = ToDevice(dinp);
    cpu::SoftmaxBackward(dinp.data(), dout.data(), out.data(), N, C);
    ASSERT_TRUE(SoftmaxBackward(d_dinp, ToDevice(dout), ToDevice(out), N, C, stream_).ok());
    Expect(ToHost(d_dinp, dinp.size()), dinp, kReduction, "softmax backward");
  }
}

// ---- embedding
// -----------------------------------------------------------------------------------

TEST_F(CudaTest, TokenEmbeddingOfAShardMatchesCpu) {
  const int N = 64, C = 48, V = 50, v0 = 10, v1 = 30;  // this rank holds rows [10, 30)
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 7) % V;  // repeats, and tokens outside the shard
  const auto wte = RandomVector(size_t(v1 - v0) * C, 26);
  std::vector<float> out(size_t(N) * C, -1.0f);
  cpu::TokenEmbeddingForward(out.data(), tokens.data(), wte.data(), N, C, v0, v1);
  float* d_out = ToDevice(std::vector<float>(out.size(), -1.0f));
  int32_t* d_tokens = ToDevice(tokens);
  ASSERT_TRUE(TokenEmbeddingForward(d_out, d_tokens, ToDevice(wte), N, C, v0, v1, stream_).ok());
  Expect(ToHost(d_out, out.size()), out, Tolerance{0, 0}, "token embedding (a copy)");

  const auto dout = RandomVector(out.size(), 27);
  auto dwte = Prefilled(wte.size());
  float* d_dwte = ToDevice(dwte);
  cpu::TokenEmbeddingBackward(dwte.data(), dout.data(), tokens.data(), N, C, v0, v1);
  ASSERT_TRUE(TokenEmbeddingBackward(d_dwte, ToDevice(dout), d_tokens, N, C, v0, v1, stream_).ok());
  Expect(ToHost(d_dwte, dwte.size()), dwte, kReduction, "token embedding scatter-add");
}

TEST_F(CudaTest, PositionEmbeddingAndEncoderMatchCpu) {
  const int B = 3, T = 17, C = 40, V = 23, maxT = 20;
  std::vector<int32_t> tokens(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 5 + 1) % V;
  const auto wte = RandomVector(size_t(V) * C, 28);
  const auto wpe = RandomVector(size_t(maxT) * C, 29);
  std::vector<float> out(size_t(B) * T * C);
  cpu::EncoderForward(out.data(), tokens.data(), wte.data(), wpe.data(), B, T, C, V);
  float* d_out = Device<float>(out.size());
  int32_t* d_tokens = ToDevice(tokens);
  ASSERT_TRUE(
      EncoderForward(d_out, d_tokens, ToDevice(wte), ToDevice(wpe), B, T, C, V, stream_).ok());
  Expect(ToHost(d_out, out.size()), out, kPointwise, "encoder forward");

  const auto dout = RandomVector(out.size(), 30);
  auto dwte = Prefilled(wte.size());
  auto dwpe = Prefilled(wpe.size());
  float* d_dwte = ToDevice(dwte);
  float* d_dwpe = ToDevice(dwpe);
  cpu::EncoderBackward(dwte.data(), dwpe.data(), dout.data(), tokens.data(), B, T, C, V);
  ASSERT_TRUE(EncoderBackward(d_dwte, d_dwpe, ToDevice(dout), d_tokens, B, T, C, V, stream_).ok());
  Expect(ToHost(d_dwte, dwte.size()), dwte, kReduction, "encoder dwte");
  Expect(ToHost(d_dwpe, dwpe.size()), dwpe, kReduction, "encoder dwpe");
}

// ---- cross-entropy
// -------------------------------------------------------------------------------

TEST_F(CudaTest, CrossEntropySingleDeviceMatchesCpu) {
  const int N = 37, V = 5003;
  const auto logits = RandomVector(size_t(N) * V, 31, -8.0f, 8.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = n % 5 == 4 ? -1 : (n * 131) % V;  // some ignored rows
  std::vector<float> losses(N), lse(N);
  cpu::CrossEntropyForward(losses.data(), lse.data(), logits.data(), targets.data(), N, V);
  float* d_losses = Device<float>(N);
  float* d_lse = Device<float>(N);
  float* d_logits = ToDevice(logits);
  int32_t* d_targets = ToDevice(targets);
  ASSERT_TRUE(CrossEntropyForward(d_losses, d_lse, d_logits, d_targets, N, V, stream_).ok());
  Expect(ToHost(d_losses, N), losses, kReduction, "cross-entropy losses");
  Expect(ToHost(d_lse, N), lse, kReduction, "cross-entropy lse");

  const std::vector<float> dlosses(N, 1.0f / N);
  auto dlogits = Prefilled(logits.size());
  float* d_dlogits = ToDevice(dlogits);
  cpu::CrossEntropyBackward(dlogits.data(), logits.data(), lse.data(), targets.data(),
                            dlosses.data(), N, V);
  ASSERT_TRUE(CrossEntropyBackward(d_dlogits, d_logits, ToDevice(lse), d_targets, ToDevice(dlosses),
                                   N, V, stream_)
                  .ok());
  Expect(ToHost(d_dlogits, dlogits.size()), dlogits, kPointwise, "cross-entropy dlogits");
}

// The vocab-parallel pieces on one shard, with the statistics the "other ranks" would contribute
// combined on the host as the all-reduces would.
TEST_F(CudaTest, CrossEntropyPiecesOfAShardMatchCpu) {
  const int N = 21, Vs = 700, v0 = 700;  // this rank holds columns [700, 1400) of V = 2100
  const auto logits = RandomVector(size_t(N) * Vs, 32, -5.0f, 5.0f);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = n == 3 ? -1 : (n * 97) % 2100;
  std::vector<float> max(N), sumexp(N), target(N);
  cpu::CrossEntropyLocalStats(max.data(), sumexp.data(), target.data(), logits.data(),
                              targets.data(), N, Vs, v0);
  float* d_max = Device<float>(N);
  float* d_sumexp = Device<float>(N);
  float* d_target = Device<float>(N);
  float* d_logits = ToDevice(logits);
  int32_t* d_targets = ToDevice(targets);
  ASSERT_TRUE(
      CrossEntropyLocalStats(d_max, d_sumexp, d_target, d_logits, d_targets, N, Vs, v0, stream_)
          .ok());
  Expect(ToHost(d_max, N), max, Tolerance{0, 0}, "local max");
  Expect(ToHost(d_sumexp, N), sumexp, kReduction, "local sumexp");
  Expect(ToHost(d_target, N), target, Tolerance{0, 0}, "target logit");

  // What an all-reduce MAX over ranks would give: some rows' global max lies on another rank.
  std::vector<float> global_max = max;
  for (int n = 0; n < N; n += 2) global_max[n] += 1.5f;
  auto rescaled = sumexp;
  float* d_rescaled = ToDevice(sumexp);
  cpu::CrossEntropyRescaleSumExp(rescaled.data(), max.data(), global_max.data(), N);
  float* d_global_max = ToDevice(global_max);
  ASSERT_TRUE(CrossEntropyRescaleSumExp(d_rescaled, ToDevice(max), d_global_max, N, stream_).ok());
  Expect(ToHost(d_rescaled, N), rescaled, kPointwise, "rescaled sumexp");

  // And the all-reduce SUMs: other ranks' sums and target logits added.
  auto global_sumexp = rescaled;
  for (float& s : global_sumexp) s += 3.0f;
  std::vector<float> losses(N), lse(N);
  cpu::CrossEntropyLossFromStats(losses.data(), lse.data(), global_max.data(), global_sumexp.data(),
                                 target.data(), targets.data(), N);
  float* d_losses = Device<float>(N);
  float* d_lse = Device<float>(N);
  ASSERT_TRUE(CrossEntropyLossFromStats(d_losses, d_lse, d_global_max, ToDevice(global_sumexp),
                                        ToDevice(target), d_targets, N, stream_)
                  .ok());
  Expect(ToHost(d_losses, N), losses, kPointwise, "losses from stats");
  Expect(ToHost(d_lse, N), lse, kPointwise, "lse from stats");

  std::vector<float> dlosses = RandomVector(N, 33, 0.0f, 0.1f);
  auto dlogits = Prefilled(logits.size());
  float* d_dlogits = ToDevice(dlogits);
  cpu::CrossEntropyBackwardShard(dlogits.data(), logits.data(), lse.data(), targets.data(),
                                 dlosses.data(), N, Vs, v0);
  ASSERT_TRUE(CrossEntropyBackwardShard(d_dlogits, d_logits, ToDevice(lse), d_targets,
                                        ToDevice(dlosses), N, Vs, v0, stream_)
                  .ok());
  Expect(ToHost(d_dlogits, dlogits.size()), dlogits, kPointwise, "dlogits of the shard");
}

TEST_F(CudaTest, CrossEntropyOfAnEmptyShardContributesNothing) {
  const int N = 4;
  const std::vector<int32_t> targets = {0, 1, 2, 3};
  float* d_max = Device<float>(N);
  float* d_sumexp = Device<float>(N);
  float* d_target = Device<float>(N);
  ASSERT_TRUE(CrossEntropyLocalStats(d_max, d_sumexp, d_target, Device<float>(1), ToDevice(targets),
                                     N, 0, 0, stream_)
                  .ok());
  EXPECT_EQ(ToHost(d_sumexp, N), std::vector<float>(N, 0.0f));
  EXPECT_EQ(ToHost(d_target, N), std::vector<float>(N, 0.0f));
  for (float m : ToHost(d_max, N)) EXPECT_EQ(m, -INFINITY);
}

// ---- optimizer
// -----------------------------------------------------------------------------------

TEST_F(CudaTest, AdamWMatchesCpuOverSeveralSteps) {
  const int64_t n = 10007;
  auto params = RandomVector(n, 34);
  std::vector<float> m(n, 0.0f), v(n, 0.0f);
  float* d_params = ToDevice(params);
  float* d_m = ToDevice(m);
  float* d_v = ToDevice(v);
  cpu::AdamWConfig config;
  config.learning_rate = 1e-3f;
  config.weight_decay = 0.1f;
  for (int64_t step = 1; step <= 5; ++step) {
    const auto grads = RandomVector(n, 100 + uint32_t(step));
    ASSERT_TRUE(
        cpu::AdamWUpdate(params.data(), grads.data(), m.data(), v.data(), n, config, step).ok());
    ASSERT_TRUE(AdamWUpdate(d_params, ToDevice(grads), d_m, d_v, n, config, step, stream_).ok());
  }
  Expect(ToHost(d_params, n), params, kPointwise, "AdamW params");
  Expect(ToHost(d_m, n), m, kPointwise, "AdamW m");
  Expect(ToHost(d_v, n), v, kPointwise, "AdamW v");
}

TEST_F(CudaTest, GradientNormAndClippingMatchCpu) {
  auto g1 = RandomVector(100000, 35);
  auto g2 = RandomVector(777, 36, -3.0f, 3.0f);
  float* d_g1 = ToDevice(g1);
  float* d_g2 = ToDevice(g2);
  double* d_sum = Device<double>(1);

  const std::vector<std::span<const float>> views = {g1, g2};
  const double expected_sum = cpu::GradSumOfSquares(views);
  const std::vector<std::span<const float>> d_views = {{d_g1, g1.size()}, {d_g2, g2.size()}};
  ASSERT_TRUE(GradSumOfSquares(d_views, d_sum, stream_).ok());
  EXPECT_NEAR(ToHost(d_sum, 1)[0], expected_sum, 1e-9 * expected_sum);

  // Clipping with the norm on the device, and with it on the host (GlobalNormClip), as the CPU.
  const std::vector<std::span<float>> d_grads = {{d_g1, g1.size()}, {d_g2, g2.size()}};
  const std::vector<std::span<float>> grads = {g1, g2};
  auto clipped1 = g1;
  auto clipped2 = g2;
  const std::vector<std::span<float>> clipped = {clipped1, clipped2};
  auto norm = cpu::GlobalNormClip(clipped, 1.0);
  ASSERT_TRUE(norm.ok());
  ASSERT_TRUE(ClipGradientsBySumOfSquares(d_grads, d_sum, 1.0, stream_).ok());
  Expect(ToHost(d_g1, g1.size()), clipped1, kPointwise, "clipped by device norm g1");
  Expect(ToHost(d_g2, g2.size()), clipped2, kPointwise, "clipped by device norm g2");

  float* e_g1 = ToDevice(g1);
  float* e_g2 = ToDevice(g2);
  const std::vector<std::span<float>> e_grads = {{e_g1, g1.size()}, {e_g2, g2.size()}};
  auto d_norm = GlobalNormClip(e_grads, 1.0, d_sum, stream_);
  ASSERT_TRUE(d_norm.ok()) << d_norm.status();
  EXPECT_NEAR(*d_norm, *norm, 1e-9 * *norm);
  Expect(ToHost(e_g1, g1.size()), clipped1, kPointwise, "GlobalNormClip g1");
  Expect(ToHost(e_g2, g2.size()), clipped2, kPointwise, "GlobalNormClip g2");

  // A norm under the limit leaves the gradients alone.
  auto untouched = GlobalNormClip(e_grads, 1e9, d_sum, stream_);
  ASSERT_TRUE(untouched.ok());
  Expect(ToHost(e_g1, g1.size()), clipped1, kPointwise, "no clip under the limit");
}

// ---- attention
// -----------------------------------------------------------------------------------

struct AttentionShape {
  int B, T, NH, HS;
};

std::string Name(const AttentionShape& s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " NH=" + std::to_string(s.NH) +
         " HS=" + std::to_string(s.HS);
}

// Several key tiles, a ragged last tile, head sizes that are and are not multiples of 32 (up to the
// 128 maximum), and T = 1.
constexpr AttentionShape kAttentionShapes[] = {{2, 70, 3, 16},  {1, 33, 2, 64}, {2, 100, 2, 48},
                                               {1, 65, 1, 128}, {3, 1, 2, 8},   {1, 256, 4, 64}};

TEST_F(CudaTest, AttentionForwardMatchesCpu) {
  for (const AttentionShape& s : kAttentionShapes) {
    const size_t qkv_size = size_t(s.B) * s.T * 3 * s.NH * s.HS;
    const size_t out_size = size_t(s.B) * s.T * s.NH * s.HS;
    const size_t lse_size = size_t(s.B) * s.NH * s.T;
    const auto qkv = RandomVector(qkv_size, 37, -2.0f, 2.0f);
    std::vector<float> out(out_size), lse(lse_size);
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NH, s.HS);
    float* d_out = Device<float>(out_size);
    float* d_lse = Device<float>(lse_size);
    ASSERT_TRUE(
        AttentionForward(d_out, d_lse, ToDevice(qkv), s.B, s.T, s.NH, s.NH, s.HS, stream_).ok());
    ExpectScaled(ToHost(d_out, out_size), out, kAttentionAtolOfMax, kAttentionRtol,
                 "attention out " + Name(s));
    ExpectScaled(ToHost(d_lse, lse_size), lse, kAttentionAtolOfMax, kAttentionRtol,
                 "attention lse " + Name(s));
  }
}

TEST_F(CudaTest, AttentionBackwardMatchesCpu) {
  for (const AttentionShape& s : kAttentionShapes) {
    const size_t qkv_size = size_t(s.B) * s.T * 3 * s.NH * s.HS;
    const size_t out_size = size_t(s.B) * s.T * s.NH * s.HS;
    const size_t lse_size = size_t(s.B) * s.NH * s.T;
    const auto qkv = RandomVector(qkv_size, 38, -2.0f, 2.0f);
    std::vector<float> out(out_size), lse(lse_size);
    cpu::AttentionForward(out.data(), lse.data(), qkv.data(), s.B, s.T, s.NH, s.NH, s.HS);
    const auto dout = RandomVector(out_size, 39);
    auto dqkv = Prefilled(qkv_size);
    float* d_dqkv = ToDevice(dqkv);
    // Both backward passes start from the CPU's forward results, so only the backward is compared.
    cpu::AttentionBackward(dqkv.data(), dout.data(), qkv.data(), out.data(), lse.data(), s.B, s.T,
                           s.NH, s.NH, s.HS);
    ASSERT_TRUE(AttentionBackward(d_dqkv, ToDevice(dout), ToDevice(qkv), ToDevice(out),
                                  ToDevice(lse), s.B, s.T, s.NH, s.NH, s.HS, stream_)
                    .ok());
    ExpectScaled(ToHost(d_dqkv, qkv_size), dqkv, kAttentionAtolOfMax, kAttentionRtol,
                 "attention dqkv " + Name(s));
  }
}

}  // namespace
}  // namespace shardline::kernels::cuda
