// GEMM throughput of Shardline's CPU linear layer (kernels/cpu/matmul.h) against the sgemm it
// calls (kernels::cpu::Sgemm(), whichever BLAS kernels/cpu/blas.h chose), on GPT-2-small shapes
// with B·T = 2048 rows. Both sides run in the same process on the same buffers; the summary at the
// end prints ours/sgemm per shape, which should stay near 1.0: MatmulForward is sgemm plus (with a
// bias) one pass over the output.
//
//   build-blas/bench/gemm_bench [--benchmark_min_time=1]
//
// A candidate BLAS instead (bench/gemm_compare.py uses this to pick the library by measurement):
// GEMM_BENCH_LIBRARY names a shared library (a path, or a soname the loader finds), and
// GEMM_BENCH_SYMBOL its sgemm: cblas_sgemm (the default) or any symbol with CBLAS's signature
// (scipy_cblas_sgemm), or dnnl_sgemm (oneDNN's row-major signature). Only that library is loaded
// then, and only its sgemm runs (rows "Candidate/<layer>"): the build's own BLAS stays unloaded,
// so that no second library's threads share the cores.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/blas.h"
#include "kernels/cpu/matmul.h"

namespace {

using shardline::kernels::cpu::MatmulForward;
using shardline::kernels::cpu::Sgemm;
using shardline::kernels::cpu::SgemmFn;

constexpr int kRows = 2048;  // B·T: 4 sequences of 512, or 2 of 1024

struct GemmShape {
  int C;
  int OC;
  const char* what;
};

// The three linear layers of a GPT-2-small block (d_model 768, d_ff 3072).
constexpr GemmShape kShapes[] = {
    {768, 2304, "qkv"},
    {768, 3072, "fc"},
    {3072, 768, "fc_proj"},
};

struct Buffers {
  std::vector<float> inp, weight, bias, out;
  explicit Buffers(const GemmShape& s)
      : inp(static_cast<size_t>(kRows) * s.C, 0.5f),
        weight(static_cast<size_t>(s.OC) * s.C, 0.25f),
        bias(s.OC, 1.0f),
        out(static_cast<size_t>(kRows) * s.OC) {}
};

void SetFlops(benchmark::State& state, const GemmShape& s) {
  const double flops = 2.0 * kRows * s.C * s.OC;
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops / 1e9, benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Ours(benchmark::State& state, GemmShape s, bool with_bias) {
  Buffers b(s);
  for (auto _ : state) {
    MatmulForward(b.out.data(), b.inp.data(), b.weight.data(), with_bias ? b.bias.data() : nullptr,
                  kRows, s.C, s.OC);
    benchmark::DoNotOptimize(b.out.data());
    benchmark::ClobberMemory();
  }
  SetFlops(state, s);
}

void BM_Sgemm(benchmark::State& state, GemmShape s) {
  Buffers b(s);
  const SgemmFn sgemm = Sgemm();  // loads the library outside the timed loop
  for (auto _ : state) {
    sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, s.OC, s.C, 1.0f, b.inp.data(), s.C,
          b.weight.data(), s.C, 0.0f, b.out.data(), s.OC);
    benchmark::DoNotOptimize(b.out.data());
    benchmark::ClobberMemory();
  }
  SetFlops(state, s);
}

// The candidate of GEMM_BENCH_LIBRARY / GEMM_BENCH_SYMBOL (see the top of this file).
using DnnlSgemmFn = int (*)(char transa, char transb, int64_t M, int64_t N, int64_t K, float alpha,
                            const float* A, int64_t lda, const float* B, int64_t ldb, float beta,
                            float* C, int64_t ldc);
struct Candidate {
  SgemmFn cblas = nullptr;
  DnnlSgemmFn dnnl = nullptr;
};

Candidate LoadCandidate(const char* library, const char* symbol) {
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::fprintf(stderr, "gemm_bench: cannot load %s: %s\n", library, dlerror());
    std::exit(2);
  }
  void* fn = dlsym(handle, symbol);
  if (fn == nullptr) {
    std::fprintf(stderr, "gemm_bench: %s has no %s\n", library, symbol);
    std::exit(2);
  }
  Candidate c;
  if (std::strcmp(symbol, "dnnl_sgemm") == 0) {
    c.dnnl = reinterpret_cast<DnnlSgemmFn>(fn);
  } else {
    c.cblas = reinterpret_cast<SgemmFn>(fn);
  }
  return c;
}

void BM_Candidate(benchmark::State& state, GemmShape s, Candidate c) {
  Buffers b(s);
  for (auto _ : state) {
    if (c.dnnl != nullptr) {
      c.dnnl('N', 'T', kRows, s.OC, s.C, 1.0f, b.inp.data(), s.C, b.weight.data(), s.C, 0.0f,
             b.out.data(), s.OC);
    } else {
      c.cblas(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, s.OC, s.C, 1.0f, b.inp.data(), s.C,
              b.weight.data(), s.C, 0.0f, b.out.data(), s.OC);
    }
    benchmark::DoNotOptimize(b.out.data());
    benchmark::ClobberMemory();
  }
  // Every element of out is C · 0.5 · 0.25: a library that ran but computed garbage fails here.
  const float want = 0.125f * static_cast<float>(s.C);
  for (float v : b.out) {
    if (v != want) {
      state.SkipWithError("wrong result");
      break;
    }
  }
  SetFlops(state, s);
}

// Prints the usual console table and keeps each run's GFLOP/s for the ratio summary.
class RatioReporter : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& run : runs) {
      if (run.run_type != Run::RT_Iteration || run.error_occurred) continue;
      auto it = run.counters.find("GFLOP/s");
      if (it != run.counters.end()) gflops_[run.run_name.function_name] = it->second.value;
    }
  }

  void PrintSummary() const {
    std::printf("\nGEMM (%d rows) GFLOP/s: ours vs the sgemm it calls (%s)\n", kRows,
                shardline::kernels::cpu::BlasDescription().c_str());
    std::printf("%-9s %-16s %10s %10s %10s %8s %8s\n", "layer", "C->OC", "sgemm", "ours",
                "ours+bias", "ratio", "ratio+b");
    for (const GemmShape& s : kShapes) {
      const std::string suffix = "/" + std::string(s.what);
      const double blas = Get("Sgemm" + suffix);
      const double ours = Get("MatmulForward" + suffix);
      const double ours_bias = Get("MatmulForwardBias" + suffix);
      if (blas <= 0.0) continue;  // filtered out
      const std::string dims = std::to_string(s.C) + "->" + std::to_string(s.OC);
      std::printf("%-9s %-16s %10.1f %10.1f %10.1f %8.3f %8.3f\n", s.what, dims.c_str(), blas, ours,
                  ours_bias, ours / blas, ours_bias / blas);
    }
  }

 private:
  double Get(const std::string& name) const {
    auto it = gflops_.find(name);
    return it == gflops_.end() ? 0.0 : it->second;
  }
  std::map<std::string, double> gflops_;
};

}  // namespace

int main(int argc, char** argv) {
  const char* library = std::getenv("GEMM_BENCH_LIBRARY");
  if (library != nullptr && *library != '\0') {
    const char* symbol = std::getenv("GEMM_BENCH_SYMBOL");
    const Candidate c = LoadCandidate(library, symbol != nullptr && *symbol ? symbol : "cblas_sgemm");
    for (const GemmShape& s : kShapes) {
      benchmark::RegisterBenchmark(("Candidate/" + std::string(s.what)).c_str(), BM_Candidate, s, c)
          ->Unit(benchmark::kMillisecond)->UseRealTime();
    }
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
  }
  // Interleaved per shape (sgemm, ours, ours with bias), so that both sides see the same machine
  // state.
  for (const GemmShape& s : kShapes) {
    const std::string suffix = "/" + std::string(s.what);
    benchmark::RegisterBenchmark(("Sgemm" + suffix).c_str(), BM_Sgemm, s)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("MatmulForward" + suffix).c_str(), BM_Ours, s, false)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
    benchmark::RegisterBenchmark(("MatmulForwardBias" + suffix).c_str(), BM_Ours, s, true)
        ->Unit(benchmark::kMillisecond)->UseRealTime();
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  RatioReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  reporter.PrintSummary();
  benchmark::Shutdown();
  return 0;
}
