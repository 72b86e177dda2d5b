// One training step of a GPT on one CUDA device (CudaGptModel: ZeroGrad + forward to the loss +
// backward + clipped AdamW), in tokens per second and model FLOPs utilisation; the GPU peer of
// train_step_bench. bench/train_step_compare.py --device cuda runs it and bench/train_step_torch.py
// --device cuda (PyTorch, bf16 autocast, the same model) in one run and prints the ratio.
//
//   train_step_gpu_bench [--layers 12] [--d-model 768] [--heads 12] [--seq 1024] [--batch 16]
//                      [--vocab 50304] [--steps 10] [--warmup 3] [--precision bf16|fp32]
//                      [--peak-tflops 989.4]
//
// Prints per-phase times of the timed steps (each phase ends with a wait for the device, so they
// add up to the step) and one line
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
#include "kernels/cuda/blas.h"
#include "kernels/cuda/cuda_allocator.h"
#include "model/model_config.h"
#include "worker/model/cuda/gpt_model.h"

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
  auto created = model::CudaGptModel::Create(config, 0, o.precision);
  Check(created.status(), "creating the model");
  model::CudaGptModel& gpt = **created;
  gpt.InitGpt2(1337);

  // Random tokens, targets the next token (the last wraps), as train_step_torch.py.
  const int B = o.batch, T = o.seq, N = B * T;
  std::mt19937 rng(42);
  std::vector<int32_t> tokens(N), targets(N);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint32_t>(o.vocab));
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) targets[b * T + t] = tokens[b * T + (t + 1) % T];
  }
  model::AdamWOptions adamw;
  adamw.adamw.learning_rate = 3e-4f;
  adamw.adamw.beta1 = 0.9f;
  adamw.adamw.beta2 = 0.999f;
  adamw.adamw.eps = 1e-8f;
  adamw.adamw.weight_decay = 0.1f;
  adamw.max_grad_norm = 1.0;

  const bool bf16 = o.precision == GemmPrecision::kBFloat16;
  std::printf("config: %s B=%d T=%d params=%lld precision=%s\n", config.DebugString().c_str(), B, T,
              static_cast<long long>(gpt.num_params()), bf16 ? "bf16" : "fp32");
  double forward_s = 0, backward_s = 0, adamw_s = 0, timed_s = 0;
  float first_loss = 0, last_loss = 0;
  for (int step = 1; step <= o.warmup + o.steps; ++step) {
    const bool timed = step > o.warmup;
    const auto t0 = Clock::now();
    gpt.ZeroGrad();
    auto loss = gpt.Forward(tokens, targets, B, T);  // waits for the loss
    Check(loss.status(), "forward");
    const auto t1 = Clock::now();
    Check(gpt.Backward(), "backward");
    Check(gpt.Synchronize(), "backward");
    const auto t2 = Clock::now();
    auto norm = gpt.AdamWStep(adamw, step);
    Check(norm.status(), "AdamW");
    Check(gpt.Synchronize(), "AdamW");
    const auto t3 = Clock::now();
    if (step == 1) first_loss = *loss;
    last_loss = *loss;
    std::printf("step %d%s: loss %.4f grad_norm %.4f %.4f s\n", step, timed ? "" : " (warmup)",
                *loss, *norm, Seconds(t0, t3));
    if (!timed) continue;
    forward_s += Seconds(t0, t1);
    backward_s += Seconds(t1, t2);
    adamw_s += Seconds(t2, t3);
    timed_s += Seconds(t0, t3);
  }
  const double step_s = timed_s / o.steps;
  const double tokens_per_s = N / step_s;
  const double mfu =
      6.0 * static_cast<double>(gpt.num_params()) * tokens_per_s / (o.peak_tflops * 1e12);
  std::printf(
      "phases (mean over %d timed steps): forward+loss %.4f s, backward %.4f s, "
      "adamw %.4f s\n",
      o.steps, forward_s / o.steps, backward_s / o.steps, adamw_s / o.steps);
  std::printf("PHASES impl=shardline forward=%.6f backward=%.6f adamw_step=%.6f\n",
              forward_s / o.steps, backward_s / o.steps, adamw_s / o.steps);
  std::printf("loss: first %.4f last %.4f\n", first_loss, last_loss);
  std::printf(
      "RESULT impl=shardline tokens_per_s=%.2f step_s=%.6f params=%lld mfu=%.4f "
      "peak_bytes=%lld peak_kind=allocator\n",
      tokens_per_s, step_s, static_cast<long long>(gpt.num_params()), mfu,
      static_cast<long long>(gpt.PeakBytes()));
  return 0;
}
