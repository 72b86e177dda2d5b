// The products of one decode step of GPT-2 small (12 blocks of qkv, attention projection, fc and
// fc projection, then the head: 124 M weights, 498 MB of f32) at N rows, as the serving engine
// runs them (kernels::cpu::SkinnyMatmulForward), against the BLAS's sgemm (kernels/cpu/blas.h's
// choice) on the same buffers, in the same run. Every matrix is a separate buffer, as in a model,
// so each step streams the weights from memory, which is what bounds a decode step: the table
// gives milliseconds per step, the weights' GB/s and GFLOP/s, and a plain read of the same bytes
// (16 lanes, 4 accumulators, the threads splitting the buffer; AVX-512 CPUs only), the ceiling
// for the GB/s.
//
//   bench/skinny_matmul_bench [--rows 1,2,4,8,16] [--steps 10] [--avx2]
//
// --avx2 runs the kernel's eight-lane body on an AVX-512 CPU (UseAvx2AtMost), as a CPU without
// AVX-512 would.
// Threads: OMP_NUM_THREADS (the serving benchmark runs 2).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/blas.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/skinny_matmul.h"
#include "kernels/cpu/vector_width.h"

namespace {

using namespace shardline::kernels::cpu;
using Clock = std::chrono::steady_clock;

struct Product {
  int C, OC;
  std::vector<float> weight, bias;
};

// GPT-2 small: d_model 768, d_ff 3072, vocabulary 50257 (the tied head has no bias).
std::vector<Product> Gpt2SmallStep() {
  std::vector<Product> products;
  const auto add = [&](int C, int OC, bool bias) {
    Product p{C, OC, std::vector<float>(static_cast<size_t>(C) * OC), {}};
    for (size_t i = 0; i < p.weight.size(); ++i) p.weight[i] = static_cast<float>(i % 13) * 1e-3f;
    if (bias) p.bias.assign(OC, 0.5f);
    products.push_back(std::move(p));
  };
  for (int layer = 0; layer < 12; ++layer) {
    add(768, 2304, true);
    add(768, 768, true);
    add(768, 3072, true);
    add(3072, 768, true);
  }
  add(768, 50257, false);
  return products;
}

template <typename Multiply>
double SecondsPerStep(std::vector<Product>& products, const std::vector<float>& inp,
                      std::vector<float>& out, int steps, Multiply multiply) {
  for (Product& p : products) multiply(p, inp.data(), out.data());  // warm-up: page faults
  const auto start = Clock::now();
  for (int s = 0; s < steps; ++s) {
    for (Product& p : products) multiply(p, inp.data(), out.data());
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

// Reads every weight once, as fast as plain 16-lane loads go (the sum is kept so that it is done).
__attribute__((target("avx512f"))) double SecondsToRead(const std::vector<Product>& products,
                                                        int steps, float* sink) {
  const auto start = Clock::now();
  for (int s = 0; s < steps; ++s) {
    for (const Product& p : products) {
      const float* w = p.weight.data();
      const int64_t n = static_cast<int64_t>(p.weight.size()) / 64 * 64;
      float total = 0;
#pragma omp parallel reduction(+ : total)
      {
        const int threads = omp_get_num_threads(), id = omp_get_thread_num();
        const int64_t lo = n / 64 * id / threads * 64, hi = n / 64 * (id + 1) / threads * 64;
        __m512 a = _mm512_setzero_ps(), b = a, c = a, d = a;
        for (int64_t i = lo; i < hi; i += 64) {
          a = _mm512_add_ps(a, _mm512_loadu_ps(w + i));
          b = _mm512_add_ps(b, _mm512_loadu_ps(w + i + 16));
          c = _mm512_add_ps(c, _mm512_loadu_ps(w + i + 32));
          d = _mm512_add_ps(d, _mm512_loadu_ps(w + i + 48));
        }
        total += _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a, b), _mm512_add_ps(c, d)));
      }
      *sink += total;
    }
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / steps;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows_list = {1, 2, 4, 8, 16};
  int steps = 10;
  bool usage = false;
  for (int i = 1; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--avx2") {
      UseAvx2AtMost(true);
      --i;  // no value
    } else if (i + 1 >= argc) {
      usage = true;
    } else if (flag == "--rows") {
      rows_list.clear();
      for (char* p = argv[i + 1]; *p != '\0';) {
        rows_list.push_back(static_cast<int>(std::strtol(p, &p, 10)));
        if (*p == ',') ++p;
      }
    } else if (flag == "--steps") {
      steps = std::atoi(argv[i + 1]);
    } else {
      usage = true;
    }
  }
  if (usage || steps < 1 || std::any_of(rows_list.begin(), rows_list.end(), [](int n) {
        return n < 1 || n > kSkinnyMaxRows;
      })) {
    std::fprintf(stderr, "usage: %s [--rows 1..%d,...] [--steps N >= 1] [--avx2]\n", argv[0],
                 kSkinnyMaxRows);
    return 2;
  }
  std::vector<Product> products = Gpt2SmallStep();
  double weights = 0;
  for (const Product& p : products) weights += static_cast<double>(p.C) * p.OC;
  std::printf(
      "GPT-2 small decode step: %zu products, %.0f MB of f32 weights; %d threads; "
      "skinny kernel %s; BLAS %s\n",
      products.size(), weights * 4 / 1e6, omp_get_max_threads(),
      SkinnyMatmulAvailable() ? (WideVectors() ? "AVX-512" : "AVX2") : "none (it is sgemm)",
      BlasDescription().c_str());
  float sink = 0;
  if (__builtin_cpu_supports("avx512f")) {
    SecondsToRead(products, 1, &sink);
    const double read = SecondsToRead(products, steps, &sink);
    std::printf("plain read of the weights: %.2f ms, %.1f GB/s\n\n", read * 1e3,
                weights * 4 / read / 1e9);
  }
  std::printf(
      "rows | skinny ms | skinny GB/s | skinny GFLOP/s | sgemm ms | sgemm GB/s | "
      "skinny/sgemm\n");
  for (int N : rows_list) {
    std::vector<float> inp(static_cast<size_t>(N) * 3072, 0.25f),
        out(static_cast<size_t>(N) * 50257);
    const auto bias_of = [](const Product& p) { return p.bias.empty() ? nullptr : p.bias.data(); };
    const double skinny =
        SecondsPerStep(products, inp, out, steps, [&](Product& p, const float* in, float* o) {
          SkinnyMatmulForward(o, in, p.weight.data(), bias_of(p), N, p.C, p.OC);
        });
    const double sgemm =
        SecondsPerStep(products, inp, out, steps, [&](Product& p, const float* in, float* o) {
          MatmulForward(o, in, p.weight.data(), bias_of(p), N, p.C, p.OC);
        });
    std::printf("%4d | %9.2f | %11.1f | %14.1f | %8.2f | %10.1f | %11.2fx\n", N, skinny * 1e3,
                weights * 4 / skinny / 1e9, 2 * weights * N / skinny / 1e9, sgemm * 1e3,
                weights * 4 / sgemm / 1e9, sgemm / skinny);
  }
  return sink == 1.2345f ? 1 : 0;  // never: keeps the reads
}
