// The BLAS behind kernels::cpu::Sgemm() (kernels/cpu/blas.h): which library was loaded, and that
// its sgemm computes what CBLAS promises for every case the linear layers use and some they do not
// (all four transposes, alpha and beta, leading dimensions wider than the matrix, sizes on and off
// the libraries' blocking), at GPT-2-small widths through MatmulForward/MatmulBackward, and when it
// is called from several threads at once or from inside an OpenMP parallel region (our kernels'
// libgomp pool, which MKL's GNU threading layer shares).
//
// ctest runs these three times (tests/unit/kernels_blas.cmake): as the build loads its BLAS (on an
// AMD CPU with AVX-512 oneDNN, on another AMD CPU OpenBLAS's OpenMP build when it knows the CPU,
// else MKL when the build found it, and then the run must have loaded it), with
// SHARDLINE_BLAS=openblas (and then it must be OpenBLAS), and with SHARDLINE_BLAS=onednn.
//
// And that loading it leaves other threads' stacks alone (kernels/cpu/blas.h: a BLAS loaded at
// start-up puts its thread-local storage on every thread's stack; OpenBLAS 0.3.21's 60 KiB of it
// overflowed civetweb's 100 KiB worker stacks).
//
// Tolerance: |sgemm − double reference| <= 1e-5·max|ref| + 1e-5·|ref|; f32 sums of K products of
// numbers in [−1, 1] round to about K·2^-24 of the largest partial sum, 2e-4 for K = 3072, well
// inside 1e-5·max|ref| (max|ref| ≈ √K/3 · a few). A kernel that dropped or doubled one product of
// K would miss by ≥ 1/K of a term, far outside it.
#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/matmul.h"
#include "tests/unit/kernels_test_util.h"

namespace shardline::kernels::cpu {
namespace {

using testing::ExpectScaled;
using testing::RandomVector;

constexpr double kAtolOfMax = 1e-5;
constexpr double kRtol = 1e-5;

// Row-major C (M,N) = alpha·op(A)·op(B) + beta·C, in double.
std::vector<double> GemmReference(bool trans_a, bool trans_b, int M, int N, int K, float alpha,
                                  const std::vector<float>& A, int lda, const std::vector<float>& B,
                                  int ldb, float beta, const std::vector<float>& C, int ldc) {
  std::vector<double> out(C.begin(), C.end());
  for (int i = 0; i < M; ++i) {
    for (int j = 0; j < N; ++j) {
      double s = 0.0;
      for (int k = 0; k < K; ++k) {
        const double a =
            trans_a ? A[static_cast<size_t>(k) * lda + i] : A[static_cast<size_t>(i) * lda + k];
        const double b =
            trans_b ? B[static_cast<size_t>(j) * ldb + k] : B[static_cast<size_t>(k) * ldb + j];
        s += a * b;
      }
      const size_t at = static_cast<size_t>(i) * ldc + j;
      out[at] = alpha * s + static_cast<double>(beta) * C[at];
    }
  }
  return out;
}

struct GemmCase {
  bool trans_a, trans_b;
  int M, N, K;
  float alpha, beta;
  int pad;  // leading dimensions exceed the row width by this much
};

void CheckGemm(const GemmCase& g, uint32_t seed) {
  const int a_rows = g.trans_a ? g.K : g.M, a_cols = g.trans_a ? g.M : g.K;
  const int b_rows = g.trans_b ? g.N : g.K, b_cols = g.trans_b ? g.K : g.N;
  const int lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.N + g.pad;
  const auto A = RandomVector(static_cast<size_t>(a_rows) * lda, seed);
  const auto B = RandomVector(static_cast<size_t>(b_rows) * ldb, seed + 1);
  auto C = RandomVector(static_cast<size_t>(g.M) * ldc, seed + 2);
  const auto want =
      GemmReference(g.trans_a, g.trans_b, g.M, g.N, g.K, g.alpha, A, lda, B, ldb, g.beta, C, ldc);
  Sgemm()(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
          g.trans_b ? CblasTrans : CblasNoTrans, g.M, g.N, g.K, g.alpha, A.data(), lda, B.data(),
          ldb, g.beta, C.data(), ldc);
  ExpectScaled(C, want, kAtolOfMax, kRtol,
               std::string("sgemm ") + (g.trans_a ? "T" : "N") + (g.trans_b ? "T" : "N") + " " +
                   std::to_string(g.M) + "x" + std::to_string(g.N) + "x" + std::to_string(g.K) +
                   " alpha " + std::to_string(g.alpha) + " beta " + std::to_string(g.beta) +
                   " pad " + std::to_string(g.pad));
}

TEST(BlasTest, NamesTheLibraryItLoaded) {
  const std::string description = BlasDescription();
  ASSERT_FALSE(description.empty());
  ASSERT_NE(Sgemm(), nullptr);
  // The library this run must have loaded: the one SHARDLINE_BLAS forces; else, on an AMD CPU
  // with AVX-512, oneDNN unless the description says why not; on another AMD CPU (or that one
  // without oneDNN), OpenBLAS on GNU OpenMP threads unless the description says why not (no
  // OpenMP build, or its kernels are not for this CPU); else oneMKL where configure found it,
  // else either.
  const char* forced = std::getenv("SHARDLINE_BLAS");
#ifdef SHARDLINE_TEST_EXPECT_MKL
  std::string want = forced != nullptr ? forced : "mkl";
#else
  std::string want = forced != nullptr ? forced : "";
#endif
  if (forced == nullptr && __builtin_cpu_is("amd") && __builtin_cpu_supports("avx512f") &&
      description.find("not oneDNN") == std::string::npos) {
    want = "onednn";
    EXPECT_NE(description.find("chosen on an AMD CPU with AVX-512"), std::string::npos)
        << description;
  } else if (forced == nullptr && __builtin_cpu_is("amd") &&
             description.find("not OpenBLAS on this AMD CPU") == std::string::npos) {
    want = "openblas";
    EXPECT_NE(description.find("chosen on an AMD CPU"), std::string::npos) << description;
    EXPECT_NE(description.find("GNU OpenMP threads"), std::string::npos) << description;
  }
  if (want == "onednn") {
    EXPECT_EQ(description.rfind("oneDNN", 0), 0u) << description;
    EXPECT_NE(description.find("GNU OpenMP threads"), std::string::npos) << description;
  } else if (want == "mkl") {
    EXPECT_EQ(description.rfind("Intel oneMKL", 0), 0u) << description;
    EXPECT_NE(description.find("GNU OpenMP threads"), std::string::npos) << description;
  } else if (want == "openblas") {
    EXPECT_NE(description.find("OpenBLAS"), std::string::npos) << description;
  } else {
    EXPECT_TRUE(want.empty()) << "SHARDLINE_BLAS=" << want
                              << ": expected mkl, openblas or onednn";
  }
  std::printf("CPU BLAS: %s\n", description.c_str());
}

TEST(BlasTest, EveryTransposeAlphaBetaAndStrideMatchesTheReference) {
  uint32_t seed = 10;
  for (auto [M, N, K] : {std::tuple{1, 1, 1}, std::tuple{3, 5, 7}, std::tuple{64, 64, 64},
                         std::tuple{129, 257, 65}, std::tuple{200, 96, 513}}) {
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, 1.5f}}) {
          for (int pad : {0, 3}) {
            CheckGemm({ta, tb, M, N, K, alpha, beta, pad}, seed);
            seed += 3;
          }
        }
      }
    }
  }
}

// MKL's packed weights give MatmulForward's product (within rounding) for every row count up to
// the one packed for, with beta 0 and 1; OpenBLAS has no packed GEMM, and Pack says so with null.
TEST(BlasTest, PackedWeightsGiveTheSameProduct) {
  CpuAllocator allocator;
  const int C = 77, OC = 130, max_rows = 16;
  const std::vector<float> weight = RandomVector(OC * C, 3);
  auto packed = PackedWeight::Pack(weight.data(), C, OC, max_rows, allocator);
  ASSERT_TRUE(packed.ok()) << packed.status();
  const bool mkl = BlasDescription().rfind("Intel oneMKL", 0) == 0;
  ASSERT_EQ(*packed != nullptr, mkl) << BlasDescription();
  if (!mkl) return;  // the OpenBLAS run of this test: null is what it must give
  EXPECT_EQ((*packed)->max_rows(), max_rows);
  for (int N : {1, 2, 7, 16}) {
    const std::vector<float> inp = RandomVector(N * C, 10 + N);
    std::vector<float> want(N * OC), got(N * OC, 5.0f);
    MatmulForward(want.data(), inp.data(), weight.data(), nullptr, N, C, OC);
    (*packed)->Multiply(got.data(), inp.data(), N, 0.0f);  // overwrites the 5s
    for (int i = 0; i < N * OC; ++i)
      ASSERT_NEAR(got[i], want[i], 1e-4f) << "N " << N << " at " << i;
    std::vector<float> acc(N * OC, 1.0f);
    (*packed)->Multiply(acc.data(), inp.data(), N, 1.0f);  // adds to the 1s
    for (int i = 0; i < N * OC; ++i) ASSERT_NEAR(acc[i], want[i] + 1.0f, 1e-4f) << "beta 1";
  }
}

// The three linear layers of a GPT-2-small block (d_model 768, d_ff 3072) on 64 rows, through the
// wrappers that the model calls: forward NT, and backward NN (dinp) and TN (dweight), both +=.
TEST(BlasTest, Gpt2LayerWidthsThroughMatmulMatchTheReference) {
  constexpr int N = 64;
  uint32_t seed = 100;
  for (auto [C, OC] : {std::pair{768, 2304}, std::pair{768, 3072}, std::pair{3072, 768}}) {
    const auto inp = RandomVector(static_cast<size_t>(N) * C, seed);
    const auto weight = RandomVector(static_cast<size_t>(OC) * C, seed + 1);
    const auto bias = RandomVector(OC, seed + 2);
    const auto dout = RandomVector(static_cast<size_t>(N) * OC, seed + 3);
    seed += 4;
    const std::string what = std::to_string(C) + "->" + std::to_string(OC);

    std::vector<float> out(static_cast<size_t>(N) * OC);
    MatmulForward(out.data(), inp.data(), weight.data(), bias.data(), N, C, OC);
    std::vector<float> bias_rows(out.size());
    for (int n = 0; n < N; ++n) std::copy(bias.begin(), bias.end(), bias_rows.begin() + n * OC);
    ExpectScaled(out,
                 GemmReference(false, true, N, OC, C, 1.0f, inp, C, weight, C, 1.0f, bias_rows, OC),
                 kAtolOfMax, kRtol, "forward " + what);

    std::vector<float> dinp(static_cast<size_t>(N) * C, 0.25f);
    std::vector<float> dweight(static_cast<size_t>(OC) * C, 0.25f);
    MatmulBackward(dinp.data(), dweight.data(), nullptr, dout.data(), inp.data(), weight.data(), N,
                   C, OC);
    ExpectScaled(dinp,
                 GemmReference(false, false, N, C, OC, 1.0f, dout, OC, weight, C, 1.0f,
                               std::vector<float>(dinp.size(), 0.25f), C),
                 kAtolOfMax, kRtol, "dinp " + what);
    ExpectScaled(dweight,
                 GemmReference(true, false, OC, C, N, 1.0f, dout, OC, inp, C, 1.0f,
                               std::vector<float>(dweight.size(), 0.25f), C),
                 kAtolOfMax, kRtol, "dweight " + what);
  }
}

// Several callers at once: from plain threads, and from the threads of an OpenMP parallel region
// (where MKL's GNU layer runs each call on its caller's thread). Each must get its own product.
TEST(BlasTest, ConcurrentCallersEachGetTheirOwnProduct) {
  constexpr int M = 150, N = 170, K = 190;
  constexpr int kCallers = 4;
  std::vector<std::vector<float>> A, B, C(kCallers);
  std::vector<std::vector<double>> want;
  for (int t = 0; t < kCallers; ++t) {
    A.push_back(RandomVector(static_cast<size_t>(M) * K, 200 + t));
    B.push_back(RandomVector(static_cast<size_t>(K) * N, 300 + t));
    want.push_back(GemmReference(false, false, M, N, K, 1.0f, A[t], K, B[t], N, 0.0f,
                                 std::vector<float>(static_cast<size_t>(M) * N, 0.0f), N));
  }
  const SgemmFn sgemm = Sgemm();
  auto call = [&](int t) {
    C[t].assign(static_cast<size_t>(M) * N, -1.0f);
    for (int round = 0; round < 5; ++round) {
      sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, A[t].data(), K, B[t].data(),
            N, 0.0f, C[t].data(), N);
    }
  };

  std::vector<std::thread> threads;
  for (int t = 0; t < kCallers; ++t) threads.emplace_back(call, t);
  for (auto& th : threads) th.join();
  for (int t = 0; t < kCallers; ++t) {
    ExpectScaled(C[t], want[t], kAtolOfMax, kRtol, "std::thread caller " + std::to_string(t));
  }

#pragma omp parallel for num_threads(2) schedule(static)
  for (int t = 0; t < kCallers; ++t) call(t);
  for (int t = 0; t < kCallers; ++t) {
    ExpectScaled(C[t], want[t], kAtolOfMax, kRtol, "OpenMP caller " + std::to_string(t));
  }
}

// A thread with the 100 KiB stack that Debian's civetweb gives its workers (USE_STACK_SIZE=102400)
// must keep nearly all of it once the BLAS is loaded: dlopen'ed, the library's thread-local
// storage is allocated on first use, not carved out of every stack.
void* UsableStack(void* out) {
  char here;
  pthread_attr_t attr;
  void* low = nullptr;
  size_t size = 0;
  if (pthread_getattr_np(pthread_self(), &attr) == 0) {
    pthread_attr_getstack(&attr, &low, &size);
    pthread_attr_destroy(&attr);
  }
  *static_cast<long*>(out) = low != nullptr ? &here - static_cast<char*>(low) : -1;
  return nullptr;
}

TEST(BlasTest, LoadingItLeavesThreadStacksAlone) {
  const float a = 1.0f, b = 2.0f;
  float c = 0.0f;
  Sgemm()(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
  ASSERT_EQ(c, 2.0f);
  pthread_attr_t attr;
  ASSERT_EQ(pthread_attr_init(&attr), 0);
  ASSERT_EQ(pthread_attr_setstacksize(&attr, 102400), 0);
  long usable = 0;
  pthread_t thread;
  ASSERT_EQ(pthread_create(&thread, &attr, UsableStack, &usable), 0);
  pthread_join(thread, nullptr);
  pthread_attr_destroy(&attr);
  // About 98 KB here without OpenBLAS at start-up, 36 KB with it.
  EXPECT_GT(usable, 80 * 1024) << BlasDescription();
}

}  // namespace
}  // namespace shardline::kernels::cpu
