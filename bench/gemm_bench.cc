// GEMM throughput of Shardline's CPU linear layer (kernels/cpu/matmul.h) against OpenBLAS's sgemm
// called directly, on GPT-2-small shapes with B·T = 2048 rows. Both sides run in the same process
// on the same buffers; the summary at the end prints ours/OpenBLAS per shape, which should stay
// near 1.0: MatmulForward is sgemm plus (with a bias) one pass over the output.
//
//   build-kernels/bench/gemm_bench [--benchmark_min_time=1]
#include <cblas.h>

#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cpu/matmul.h"

namespace {

using shardline::kernels::cpu::MatmulForward;

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

void BM_OpenBlas(benchmark::State& state, GemmShape s) {
  Buffers b(s);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kRows, s.OC, s.C, 1.0f, b.inp.data(), s.C,
                b.weight.data(), s.C, 0.0f, b.out.data(), s.OC);
    benchmark::DoNotOptimize(b.out.data());
    benchmark::ClobberMemory();
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
    std::printf("\nGEMM (%d rows) GFLOP/s: ours vs OpenBLAS sgemm\n", kRows);
    std::printf("%-9s %-16s %10s %10s %10s %8s %8s\n", "layer", "C->OC", "openblas", "ours",
                "ours+bias", "ratio", "ratio+b");
    for (const GemmShape& s : kShapes) {
      const std::string suffix = "/" + std::string(s.what);
      const double blas = Get("OpenBlasSgemm" + suffix);
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
  // Interleaved per shape (OpenBLAS, ours, ours with bias), so that both sides see the same
  // machine state.
  for (const GemmShape& s : kShapes) {
    const std::string suffix = "/" + std::string(s.what);
    benchmark::RegisterBenchmark(("OpenBlasSgemm" + suffix).c_str(), BM_OpenBlas, s)
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
