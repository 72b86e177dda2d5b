// One training step of a GPT on one CUDA device — the one engine (ShardedGpt at tp = pp = dp = 1,
// the whole batch one micro-batch) on the CUDA backend: forward to the loss, backward, clipped
// AdamW — in tokens per second and model FLOPs utilisation; the GPU peer of train_step_bench.
// bench/train_step_compare.py --device cuda runs it and bench/train_step_torch.py --device cuda
// (PyTorch, bf16 autocast, the same model) in one run and prints the ratio.
//
//   train_step_gpu_bench [--layers 12] [--d-model 768] [--heads 12] [--seq 1024] [--batch 16]
//                      [--vocab 50304] [--steps 10] [--warmup 3] [--precision bf16|fp32]
//                      [--peak-tflops 989.4]
//
// Prints each step's loss and time, the split of the timed steps the engine reports (compute; the
// gradient norm's and optimizer's host round trips count as compute too), and one line
//   RESULT impl=shardline tokens_per_s=... step_s=... params=... mfu=... peak_bytes=...
//          peak_kind=allocator
// MFU is 6·params·tokens/s over --peak-tflops (the H100/H200 SXM dense bf16 peak by default; the
// 6·N rule counts the GEMMs of forward and backward and leaves out attention's T² work, as
// nanoGPT's and PaLM's simple form). peak_bytes is the CUDA caching allocator's peak of requested
// bytes. Without a usable GPU it says why and exits 1.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/step_bench_flags.h"
#include "kernels/backend.h"
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_allocator.h"
#include "model/model_config.h"
#include "placement/parallel_layout.h"
#include "worker/model/sharded_gpt.h"

namespace {

using Clock = std::chrono::steady_clock;
using shardline::kernels::cuda::GemmPrecision;

struct Options : shardline::bench::StepShape {
  Options() {  // GPT-2 small at its own context and a batch that keeps an H100/H200 busy
    seq = 1024;
    batch = 16;
    steps = 10;
    warmup = 3;
  }
  GemmPrecision precision = GemmPrecision::kBFloat16;
  double peak_tflops = 989.4;
};

Options Parse(int argc, char** argv) {
  Options o;
  const shardline::bench::ExtraFlag extra[] = {
      {"--precision",
       [&](const std::string& value) -> std::string {
         if (value != "bf16" && value != "fp32") return "bf16 or fp32, got " + value;
         o.precision = value == "bf16" ? GemmPrecision::kBFloat16 : GemmPrecision::kFloat32;
         return "";
       }},
      {"--peak-tflops", [&](const std::string& value) -> std::string {
         char* end = nullptr;
         o.peak_tflops = std::strtod(value.c_str(), &end);
         return value.empty() || *end != '\0' || !(o.peak_tflops > 0) ? "not a positive number"
                                                                      : "";
       }}};
  shardline::bench::ParseStepFlags(argc, argv, "train_step_gpu_bench",
                                   "[--precision bf16|fp32] [--peak-tflops X]", o, extra);
  return o;
}

void Check(const absl::Status& s, const char* what) {
  shardline::bench::CheckOrExit(s, "train_step_gpu_bench", what);
}

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

int main(int argc, char** argv) {
  using namespace shardline;
  const Options o = Parse(argc, argv);
  const std::string unavailable = kernels::cuda::CudaUnavailableReason(0);
  if (!unavailable.empty()) {
    std::fprintf(stderr, "train_step_gpu_bench: %s\n", unavailable.c_str());
    return 1;
  }
  const model::ModelConfig config = o.Config();
  const bool bf16 = o.precision == GemmPrecision::kBFloat16;
  auto backend = kernels::CreateBackend(kernels::BackendOptions{
      .device = kernels::Device::kCuda, .device_index = 0, .bf16_gemms = bf16});
  Check(backend.status(), "creating the CUDA backend");

  const int B = o.batch, T = o.seq, N = B * T;
  model::ShardedOptions options;
  options.config = config;
  options.parallel.micro_batch = B;  // the whole batch at once, as `shardline train`
  options.global_batch = B;
  options.seq_len = T;
  options.adamw.adamw.beta1 = 0.9f;
  options.adamw.adamw.beta2 = 0.999f;
  options.adamw.adamw.eps = 1e-8f;
  options.adamw.adamw.weight_decay = 0.1f;
  options.adamw.max_grad_norm = 1.0;
  auto created = model::ShardedGpt::Create(options, {}, **backend);
  Check(created.status(), "creating the model");
  model::ShardedGpt& gpt = **created;
  Check(gpt.InitGpt2(1337), "initialising the model");
  const int64_t params = gpt.layout().total();

  // Random tokens, targets the next token (the last wraps), as train_step_torch.py.
  std::mt19937 rng(42);
  std::vector<int32_t> tokens(N), targets(N);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(o.vocab));
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) targets[b * T + t] = tokens[b * T + (t + 1) % T];
  }
  const model::MicroBatchSource source = [&](int64_t, int64_t, std::vector<int32_t>& inputs,
                                             std::vector<int32_t>& out) {
    inputs = tokens;
    out = targets;
    return absl::OkStatus();
  };

  std::printf("config: %s B=%d T=%d params=%lld precision=%s backend=%s\n",
              config.DebugString().c_str(), B, T, static_cast<long long>(params),
              bf16 ? "bf16" : "fp32", (*backend)->Describe().c_str());
  double timed_s = 0, compute_s = 0;
  float first_loss = 0, last_loss = 0;
  for (int step = 1; step <= o.warmup + o.steps; ++step) {
    const bool timed = step > o.warmup;
    const auto t0 = Clock::now();
    auto stats = gpt.TrainStep(source, step, 3e-4f);  // returns with the step done on the device
    Check(stats.status(), "training step");
    const auto t1 = Clock::now();
    if (step == 1) first_loss = stats->loss;
    last_loss = stats->loss;
    std::printf("step %d%s: loss %.4f grad_norm %.4f %.4f s\n", step, timed ? "" : " (warmup)",
                stats->loss, stats->grad_norm, Seconds(t0, t1));
    if (!timed) continue;
    timed_s += Seconds(t0, t1);
    compute_s += stats->compute_seconds;
  }
  const double step_s = timed_s / o.steps;
  const double tokens_per_s = N / step_s;
  const double mfu = 6.0 * static_cast<double>(params) * tokens_per_s / (o.peak_tflops * 1e12);
  std::printf("split (mean over %d timed steps): compute %.4f s of %.4f s\n", o.steps,
              compute_s / o.steps, step_s);
  std::printf("loss: first %.4f last %.4f\n", first_loss, last_loss);
  std::printf(
      "RESULT impl=shardline tokens_per_s=%.2f step_s=%.6f params=%lld mfu=%.4f "
      "peak_bytes=%lld peak_kind=allocator\n",
      tokens_per_s, step_s, static_cast<long long>(params), mfu,
      static_cast<long long>((*backend)->allocator().stats().peak_bytes));
  return 0;
}
