// GPU kernels at GPT-2-small sizes (C = 768, 12 heads, T = 1024, B = 8): one transformer layer's
// training step (forward, backward, AdamW) composed of the kernels in kernels/cuda/ops.h, with the
// GEMMs in f32 and in bf16, and its two heaviest parts alone (the MLP GEMM and fused attention).
//
// Times are GPU times (CUDA events around the queued work), reported as manual time. Without a GPU
// every benchmark reports an error naming why. scripts/gpu-check.sh runs this binary.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_allocator.h"
#include "kernels/cuda/ops.h"

namespace shardline::kernels::cuda {
namespace {

constexpr int kB = 8, kT = 1024, kC = 768, kNH = 12, kHS = kC / kNH, kN = kB * kT;

// The allocator, stream and cuBLAS handle every benchmark shares (created once per process).
struct Gpu {
  std::unique_ptr<CudaCachingAllocator> allocator;
  std::unique_ptr<Blas> blas;
  cudaStream_t stream = nullptr;
  std::string error;  // why there is no GPU to run on; empty when there is

  static Gpu& Get() {
    static Gpu gpu = Make();
    return gpu;
  }

 private:
  static Gpu Make() {
    Gpu gpu;
    gpu.error = CudaUnavailableReason(0);
    if (!gpu.error.empty()) return gpu;
    auto allocator = CudaCachingAllocator::Create(0);
    if (!allocator.ok()) {
      gpu.error = std::string(allocator.status().message());
      return gpu;
    }
    gpu.allocator = std::move(*allocator);
    cudaSetDevice(0);
    auto blas = Blas::Create(*gpu.allocator, GemmPrecision::kBFloat16);
    if (!blas.ok()) {
      gpu.error = std::string(blas.status().message());
      return gpu;
    }
    gpu.blas = std::move(*blas);
    cudaStreamCreate(&gpu.stream);
    return gpu;
  }
};

// Device floats filled with uniform noise in [-scale, scale], freed with the arena.
class Arena {
 public:
  explicit Arena(CudaCachingAllocator& allocator) : allocator_(allocator) {}
  ~Arena() {
    for (auto [ptr, n] : blocks_) allocator_.Deallocate(ptr, n);
  }
  float* Floats(size_t n, float scale = 0.0f) {
    auto block = allocator_.Allocate(n * sizeof(float));
    if (!block.ok()) return nullptr;
    blocks_.emplace_back(*block, n * sizeof(float));
    auto* p = static_cast<float*>(*block);
    std::vector<float> host(n, 0.0f);
    if (scale != 0.0f) {
      std::mt19937 rng(static_cast<uint32_t>(blocks_.size()));
      std::uniform_real_distribution<float> dist(-scale, scale);
      for (float& x : host) x = dist(rng);
    }
    cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice);
    return p;
  }

 private:
  CudaCachingAllocator& allocator_;
  std::vector<std::pair<void*, size_t>> blocks_;
};

// Runs `body` (which queues work on gpu.stream) once per iteration, timed with CUDA events.
template <typename Body>
void TimeOnGpu(benchmark::State& state, Gpu& gpu, Body body) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  if (absl::Status warmup = body(); !warmup.ok()) {
    state.SkipWithError(std::string(warmup.message()).c_str());
    return;
  }
  for (auto _ : state) {
    cudaEventRecord(start, gpu.stream);
    absl::Status status = body();
    cudaEventRecord(stop, gpu.stream);
    cudaEventSynchronize(stop);
    if (!status.ok()) {
      state.SkipWithError(std::string(status.message()).c_str());
      break;
    }
    float ms = 0.0f;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms / 1e3);
  }
  const cudaError_t error = cudaStreamSynchronize(gpu.stream);
  if (error != cudaSuccess) state.SkipWithError(cudaGetErrorString(error));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
}

GemmPrecision PrecisionArg(const benchmark::State& state) {
  return state.range(0) == 0 ? GemmPrecision::kFloat32 : GemmPrecision::kBFloat16;
}

// The MLP's up-projection forward: (N, C) × (4C, C)ᵀ.
void BM_GemmForward(benchmark::State& state) {
  Gpu& gpu = Gpu::Get();
  if (!gpu.error.empty()) return state.SkipWithError(gpu.error.c_str());
  gpu.blas->set_precision(PrecisionArg(state));
  Arena arena(*gpu.allocator);
  float* inp = arena.Floats(size_t{kN} * kC, 1.0f);
  float* weight = arena.Floats(size_t{4} * kC * kC, 0.02f);
  float* bias = arena.Floats(size_t{4} * kC, 0.02f);
  float* out = arena.Floats(size_t{kN} * 4 * kC);
  TimeOnGpu(state, gpu, [&] {
    return MatmulForward(*gpu.blas, out, inp, weight, bias, kN, kC, 4 * kC, gpu.stream);
  });
  state.counters["TFLOP/s"] = benchmark::Counter(2.0 * kN * kC * 4 * kC * state.iterations() / 1e12,
                                                 benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GemmForward)->Arg(0)->Arg(1)->ArgName("bf16")->UseManualTime();

void BM_AttentionForwardBackward(benchmark::State& state) {
  Gpu& gpu = Gpu::Get();
  if (!gpu.error.empty()) return state.SkipWithError(gpu.error.c_str());
  Arena arena(*gpu.allocator);
  float* qkv = arena.Floats(size_t{kN} * 3 * kC, 1.0f);
  float* out = arena.Floats(size_t{kN} * kC);
  float* lse = arena.Floats(size_t{kB} * kNH * kT);
  float* dout = arena.Floats(size_t{kN} * kC, 1.0f);
  float* dqkv = arena.Floats(size_t{kN} * 3 * kC);
  TimeOnGpu(state, gpu, [&]() -> absl::Status {
    absl::Status status = AttentionForward(out, lse, qkv, kB, kT, kNH, kNH, kHS, gpu.stream);
    if (!status.ok()) return status;
    return AttentionBackward(dqkv, dout, qkv, out, lse, kB, kT, kNH, kNH, kHS, gpu.stream);
  });
  // Causal: half of the 4·B·NH·T²·HS forward FLOPs, and about 2.5× that for the backward.
  const double flops = 3.5 * 2.0 * kB * kNH * double{kT} * kT * kHS;
  state.counters["TFLOP/s"] =
      benchmark::Counter(flops * state.iterations() / 1e12, benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AttentionForwardBackward)->UseManualTime();

// One GPT-2 layer: forward, backward and an AdamW step over its weights.
void BM_LayerTrainStep(benchmark::State& state) {
  Gpu& gpu = Gpu::Get();
  if (!gpu.error.empty()) return state.SkipWithError(gpu.error.c_str());
  gpu.blas->set_precision(PrecisionArg(state));
  Arena arena(*gpu.allocator);
  const size_t NC = size_t{kN} * kC;
  constexpr int C = kC, C3 = 3 * kC, C4 = 4 * kC, N = kN;
  // Weights, grads and moments as single arrays so that one AdamW call updates them all.
  const size_t n_params = 2 * size_t{C} + size_t{C3} * C + C3 + size_t{C} * C + C + 2 * size_t{C} +
                          size_t{C4} * C + C4 + size_t{C} * C4 + C;
  float* params = arena.Floats(n_params, 0.02f);
  float* grads = arena.Floats(n_params);
  float* m = arena.Floats(n_params);
  float* v = arena.Floats(n_params);
  size_t offset = 0;
  auto take = [&](size_t n, float* base) { return base + (offset += n) - n; };
  struct Weights {
    float *ln1w, *ln1b, *qkvw, *qkvb, *projw, *projb, *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
  };
  auto carve = [&](float* base) {
    offset = 0;
    Weights w;
    w.ln1w = take(C, base), w.ln1b = take(C, base), w.qkvw = take(size_t{C3} * C, base);
    w.qkvb = take(C3, base), w.projw = take(size_t{C} * C, base), w.projb = take(C, base);
    w.ln2w = take(C, base), w.ln2b = take(C, base), w.fcw = take(size_t{C4} * C, base);
    w.fcb = take(C4, base), w.fcprojw = take(size_t{C} * C4, base), w.fcprojb = take(C, base);
    return w;
  };
  const Weights w = carve(params);
  const Weights g = carve(grads);

  float* x = arena.Floats(NC, 1.0f);
  float* dout = arena.Floats(NC, 1.0f);
  float *ln1 = arena.Floats(NC), *m1 = arena.Floats(N), *r1 = arena.Floats(N);
  float* qkv = arena.Floats(size_t{N} * C3);
  float *atty = arena.Floats(NC), *lse = arena.Floats(size_t{kB} * kNH * kT);
  float *attproj = arena.Floats(NC), *res2 = arena.Floats(NC);
  float *ln2 = arena.Floats(NC), *m2 = arena.Floats(N), *r2 = arena.Floats(N);
  float *fch = arena.Floats(size_t{N} * C4), *fchg = arena.Floats(size_t{N} * C4);
  float *fcproj = arena.Floats(NC), *out = arena.Floats(NC);
  // Activation gradients, zeroed together each step (the backward kernels accumulate).
  const size_t n_act_grads = 7 * NC + 2 * size_t{N} * C4 + size_t{N} * C3;
  float* act_grads = arena.Floats(n_act_grads);
  offset = 0;
  float *dres2 = take(NC, act_grads), *dfcproj = take(NC, act_grads);
  float *dfchg = take(size_t{N} * C4, act_grads), *dfch = take(size_t{N} * C4, act_grads);
  float *dln2 = take(NC, act_grads), *dx = take(NC, act_grads), *dattproj = take(NC, act_grads);
  float *datty = take(NC, act_grads), *dqkv = take(size_t{N} * C3, act_grads);
  float* dln1 = take(NC, act_grads);
  const float eps = cpu::kLayerNormEps;
  cudaStream_t s = gpu.stream;
  Blas& blas = *gpu.blas;
  int64_t step = 0;
  cpu::AdamWConfig adamw;

  TimeOnGpu(state, gpu, [&]() -> absl::Status {
    std::vector<absl::Status> st;
    // Forward.
    st.push_back(LayerNormForward(ln1, m1, r1, x, w.ln1w, w.ln1b, N, C, eps, s));
    st.push_back(MatmulForward(blas, qkv, ln1, w.qkvw, w.qkvb, N, C, C3, s));
    st.push_back(AttentionForward(atty, lse, qkv, kB, kT, kNH, kNH, kHS, s));
    st.push_back(MatmulForward(blas, attproj, atty, w.projw, w.projb, N, C, C, s));
    st.push_back(ResidualForward(res2, x, attproj, int64_t(NC), s));
    st.push_back(LayerNormForward(ln2, m2, r2, res2, w.ln2w, w.ln2b, N, C, eps, s));
    st.push_back(MatmulForward(blas, fch, ln2, w.fcw, w.fcb, N, C, C4, s));
    st.push_back(GeluForward(fchg, fch, int64_t{N} * C4, s));
    st.push_back(MatmulForward(blas, fcproj, fchg, w.fcprojw, w.fcprojb, N, C4, C, s));
    st.push_back(ResidualForward(out, res2, fcproj, int64_t(NC), s));
    // Backward.
    cudaMemsetAsync(grads, 0, n_params * sizeof(float), s);
    cudaMemsetAsync(act_grads, 0, n_act_grads * sizeof(float), s);
    st.push_back(ResidualBackward(dres2, dfcproj, dout, int64_t(NC), s));
    st.push_back(
        MatmulBackward(blas, dfchg, g.fcprojw, g.fcprojb, dfcproj, fchg, w.fcprojw, N, C4, C, s));
    st.push_back(GeluBackward(dfch, fch, dfchg, int64_t{N} * C4, s));
    st.push_back(MatmulBackward(blas, dln2, g.fcw, g.fcb, dfch, ln2, w.fcw, N, C, C4, s));
    st.push_back(LayerNormBackward(dres2, g.ln2w, g.ln2b, dln2, res2, w.ln2w, m2, r2, N, C, s));
    st.push_back(ResidualBackward(dx, dattproj, dres2, int64_t(NC), s));
    st.push_back(
        MatmulBackward(blas, datty, g.projw, g.projb, dattproj, atty, w.projw, N, C, C, s));
    st.push_back(AttentionBackward(dqkv, datty, qkv, atty, lse, kB, kT, kNH, kNH, kHS, s));
    st.push_back(MatmulBackward(blas, dln1, g.qkvw, g.qkvb, dqkv, ln1, w.qkvw, N, C, C3, s));
    st.push_back(LayerNormBackward(dx, g.ln1w, g.ln1b, dln1, x, w.ln1w, m1, r1, N, C, s));
    // Update.
    st.push_back(AdamWUpdate(params, grads, m, v, int64_t(n_params), adamw, ++step, s));
    for (const absl::Status& status : st) {
      if (!status.ok()) return status;
    }
    return absl::OkStatus();
  });
  state.counters["tokens/s"] =
      benchmark::Counter(double{kN} * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_LayerTrainStep)->Arg(0)->Arg(1)->ArgName("bf16")->UseManualTime();

}  // namespace
}  // namespace shardline::kernels::cuda

BENCHMARK_MAIN();
